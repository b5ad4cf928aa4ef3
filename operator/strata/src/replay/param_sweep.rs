//! `strata replay --sweep`: the strata policy replayed over a grid of spill, elision, dedup and
//! per-tool knobs, every point priced with read-backs, and the Pareto front printed.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use serde::Serialize;
use strata_core::replay::param_sweep::{
    Corpus, PointResult, SweepGrid, SweepPoint, naive_units, pareto_front, run_sweep,
};
use strata_core::replay::{InputFormat, Provider, ReplayOptions};
use strata_core::retention::RetentionRule;
use strata_core::tokens::TokenCounter;

use super::inputs;

/// The JSON report of a sweep (`--report`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SweepReport<'a> {
    /// Provider pricing used.
    pub provider: Provider,
    /// The corpora, in the order given.
    pub corpora: Vec<String>,
    /// The grid swept.
    pub grid: &'a SweepGrid,
    /// The settings the policy gives, as a point.
    pub base: SweepPoint,
    /// Every point scored.
    pub points: &'a [PointResult],
    /// Indices into `points` of the Pareto front, cheapest first.
    pub front: Vec<usize>,
}

/// What the sweep runs on.
pub struct SweepInputs<'a> {
    /// Session files or directories; each is one corpus.
    pub paths: &'a [std::path::PathBuf],
    /// Their format.
    pub format: InputFormat,
    /// The grid file, or the built-in coarse grid.
    pub grid: Option<&'a Path>,
    /// Worker threads.
    pub jobs: usize,
    /// The policy's retention rules (the points' per-tool rules go before them).
    pub policy_rules: Vec<RetentionRule>,
    /// Where to write the JSON report.
    pub report: Option<&'a Path>,
}

/// Reads a grid (YAML or JSON).
fn read_grid(path: &Path) -> anyhow::Result<SweepGrid> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading the grid {}", path.display()))?;
    serde_saphyr::from_str(&text).with_context(|| {
        format!(
            "{} is not a sweep grid (maxResultChars, previewChars, elideAfterRounds, elideOverChars, \
             elideKeepChars, deduplicate, toolTreatments)",
            path.display()
        )
    })
}

/// Runs the sweep and prints the front; returns whether every input replayed.
pub fn run(sweep: &SweepInputs<'_>, options: &ReplayOptions, counter: &TokenCounter) -> anyhow::Result<bool> {
    let grid = match sweep.grid {
        Some(path) => read_grid(path)?,
        None => SweepGrid::coarse(),
    };
    let mut errors = Vec::new();
    let corpora: Vec<Corpus> = sweep
        .paths
        .iter()
        .map(|path| Corpus {
            name: path.display().to_string(),
            transcripts: inputs::load_all(std::slice::from_ref(path), sweep.format, &mut errors),
        })
        .collect();
    for error in &errors {
        eprintln!("strata replay: {error}");
    }
    if corpora.iter().all(|c| c.transcripts.is_empty()) {
        anyhow::bail!("no session could be loaded; see the errors above");
    }
    let points = grid.points();
    let base = SweepPoint::of(&options.strata);
    let naive = naive_units(&corpora, options, counter).context("replaying naive-with-cache")?;
    eprintln!(
        "strata replay --sweep: {} points over {} corpora ({} sessions) on {} threads",
        points.len(),
        corpora.len(),
        corpora.iter().map(|c| c.transcripts.len()).sum::<usize>(),
        sweep.jobs
    );
    let done = std::sync::atomic::AtomicUsize::new(0);
    let total = points.len();
    let progress = |_: usize, result: &PointResult| {
        let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        eprintln!(
            "[{n}/{total}] {} -> {:.3} x naive with {} read-backs",
            result.point.label(),
            result.total.ratio_with_read_backs(),
            result.total.read_backs
        );
    };
    let results = run_sweep(&points, &corpora, &naive, options, &sweep.policy_rules, sweep.jobs, &progress)?;
    let front = pareto_front(&results);
    print!("{}", render(&corpora, &naive, &results, &front, &base, options.provider));
    if let Some(path) = sweep.report {
        let report = SweepReport {
            provider: options.provider,
            corpora: corpora.iter().map(|c| c.name.clone()).collect(),
            grid: &grid,
            base,
            points: &results,
            front,
        };
        let json = serde_json::to_vec_pretty(&report).context("encoding the sweep report")?;
        std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))?;
        println!("report: {}", path.display());
    }
    Ok(errors.is_empty())
}

fn row(out: &mut String, mark: &str, result: &PointResult) {
    let _ = write!(
        out,
        "{mark:<2}{:<58} {:>7.3} {:>8.3} {:>6} {:>6} {:>8}",
        result.point.label(),
        result.total.ratio(),
        result.total.ratio_with_read_backs(),
        result.total.uses,
        result.total.read_backs,
        result.total.unrecoverable
    );
    for corpus in &result.corpora {
        let _ = write!(
            out,
            " | {:>7.3} {:>8.3} {:>6}",
            corpus.ratio(),
            corpus.ratio_with_read_backs(),
            corpus.read_backs
        );
    }
    out.push('\n');
}

/// The printed table: the front, cheapest first, then the policy's own point.
pub fn render(
    corpora: &[Corpus],
    naive: &[f64],
    results: &[PointResult],
    front: &[usize],
    base: &SweepPoint,
    provider: Provider,
) -> String {
    let mut out = String::new();
    let provider_name = match provider {
        Provider::Anthropic => "anthropic",
        Provider::OpenAi => "openai",
    };
    let _ = writeln!(out, "{} points swept, priced as {provider_name}, read-backs charged", results.len());
    for (index, (corpus, units)) in corpora.iter().zip(naive).enumerate() {
        let _ = writeln!(
            out,
            "corpus {}: {} ({} sessions), naive-with-cache {units:.0} units",
            index + 1,
            corpus.name,
            corpus.transcripts.len()
        );
    }
    let _ = writeln!(
        out,
        "Pareto front: cost with read-backs (x naive) against read-backs, points with 0 unrecoverable uses"
    );
    let _ = write!(
        out,
        "  {:<58} {:>7} {:>8} {:>6} {:>6} {:>8}",
        "point", "x-naive", "x+reads", "uses", "reads", "unrecov"
    );
    for index in 0..corpora.len() {
        let corpus = index + 1;
        let _ =
            write!(out, " | {:>7} {:>8} {:>6}", format!("c{corpus} x"), format!("c{corpus} x+r"), "reads");
    }
    out.push('\n');
    for &index in front {
        let mark = if results[index].point.is_base(base) { "*" } else { "" };
        row(&mut out, mark, &results[index]);
    }
    match results.iter().find(|r| r.point.is_base(base)) {
        Some(result) => {
            let _ = writeln!(out, "the policy's own point (* when on the front):");
            row(&mut out, "*", result);
        }
        None => {
            let _ = writeln!(out, "the policy's own point ({}) is not in the grid", base.label());
        }
    }
    let lossy = results.iter().filter(|r| r.total.unrecoverable > 0).count();
    let _ = writeln!(
        out,
        "point: spill maxResultChars/previewChars, elide elideAfterRounds/elideOverChars/elideKeepChars, dedup, per-tool treatment; x-naive: cost without read-backs; x+reads: with them; cN: corpus N; {lossy} point(s) with unrecoverable uses left off the front"
    );
    out
}

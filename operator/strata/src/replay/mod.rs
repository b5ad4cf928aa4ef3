//! `strata replay`: what Strata would save on recorded agent sessions, priced the way providers
//! bill prefix caching, next to the context policies people use today.

mod html;
mod inputs;
mod param_sweep;
mod plot;
mod policy_file;
mod table;

use std::path::PathBuf;

use anyhow::Context;
use serde::Serialize;
use strata_core::replay::simulate::TokenCalibration;
use strata_core::replay::synthetic::{FleetSpec, generate_fleet};
use strata_core::replay::{
    InputFormat, PolicyReport, Provider, ReplayOptions, SessionReport, replay_session,
};
use strata_core::tokens::{TokenCounter, TokenizerKind};

/// Arguments of `strata replay`.
#[derive(Debug, clap::Args)]
pub struct ReplayArgs {
    /// Session files or directories (searched recursively for .json and .jsonl).
    #[arg(required_unless_present = "synthetic_fleet")]
    pub paths: Vec<PathBuf>,
    /// Input format: auto, mini-swe-agent, pi-session or openai-messages.
    #[arg(long, default_value = "auto", value_parser = ["auto", "mini-swe-agent", "pi-session", "openai-messages"])]
    pub format: String,
    /// A ContextPolicy YAML for the strata policy; the built-in defaults (as the gateway applies
    /// them) otherwise.
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// Whose prefix-cache rules price the calls.
    #[arg(long, default_value = "anthropic", value_parser = ["anthropic", "openai"])]
    pub provider: String,
    /// The model's context window, for the budget and compaction.
    #[arg(long, default_value_t = 200_000)]
    pub context_window: u64,
    /// Write the full report as JSON.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Write an SVG of context tokens per call, one line per policy, compactions marked.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Write the Context Inspector page of the strata policy's run: one self-contained HTML file
    /// per session (FILE itself for one session, FILE's stem plus the session's name otherwise).
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// Replay generated always-on fleet sessions (seed 003's shape) instead of files.
    #[arg(long)]
    pub synthetic_fleet: bool,
    /// Agents in the synthetic fleet.
    #[arg(long, default_value_t = 8, requires = "synthetic_fleet")]
    pub agents: u32,
    /// Hours of the synthetic fleet's sessions.
    #[arg(long, default_value_t = 24, requires = "synthetic_fleet")]
    pub hours: u32,
    /// Seed of the synthetic fleet.
    #[arg(long, default_value_t = 1, requires = "synthetic_fleet")]
    pub seed: u64,
    /// Instead of pricing, measure the agent's volume: each session runs through the session
    /// engine with the artifact sweeper on the session's clock under the policy's `volume`
    /// retention, and the peak bytes are checked against `--volume-budget`.
    #[arg(long)]
    pub volume: bool,
    /// The volume size the peaks must stay under (bytes), with `--volume`: a 1Gi PVC by default.
    #[arg(long, default_value_t = 1 << 30, requires = "volume")]
    pub volume_budget: u64,
    /// Instead of comparing policies, sweep the strata policy's knobs (spill threshold and
    /// preview, elision age, size and kept characters, dedup, per-tool retention) over a grid,
    /// price every point with read-backs, and print the Pareto front of cost against read-backs.
    /// Each path is one corpus.
    #[arg(long, conflicts_with_all = ["synthetic_fleet", "volume", "plot", "html"])]
    pub sweep: bool,
    /// The grid to sweep (YAML or JSON: maxResultChars, previewChars, elideAfterRounds,
    /// elideOverChars, elideKeepChars, deduplicate, toolTreatments); a built-in coarse grid
    /// otherwise.
    #[arg(long, value_name = "FILE", requires = "sweep")]
    pub grid: Option<PathBuf>,
    /// Threads scoring sweep points (all cores by default).
    #[arg(long, requires = "sweep")]
    pub jobs: Option<usize>,
    /// Attach a synthetic tool set of about this many tokens to every call of the strata policy
    /// (recorded sessions rarely keep their tool schemas): the tools the corpus's coding sessions
    /// call plus MCP-style connector tools, written for Strata. The other policies are priced
    /// without tools.
    #[arg(long, value_name = "TOKENS")]
    pub synthetic_tools: Option<u64>,
}

/// The JSON report.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplayReport {
    /// Provider pricing used.
    pub provider: Provider,
    /// Context window.
    pub context_window: u64,
    /// Per policy, over every session.
    pub totals: Vec<table::PolicyTotals>,
    /// Our token count against the provider's, over sessions that recorded usage.
    pub calibration: TokenCalibration,
    /// Inputs that could not be replayed, with the reason.
    pub errors: Vec<String>,
    /// Every session.
    pub sessions: Vec<SessionReport>,
}

/// `strata replay --volume`: the peak volume bytes of each session with the sweeper running;
/// returns whether every session replayed and stayed under `budget`.
fn volume_run(
    transcripts: &[strata_core::replay::Transcript],
    options: &ReplayOptions,
    budget: u64,
    mut errors: Vec<String>,
) -> anyhow::Result<bool> {
    use strata_core::replay::volume::replay_volume;
    const MIB: f64 = 1024.0 * 1024.0;
    println!(
        "{:<28} {:>6} {:>6} {:>5} {:>10} {:>10} {:>7} {:>7} {:>10}",
        "session", "calls", "hours", "cmp", "peak MiB", "final MiB", "sweeps", "swept", "swept MiB"
    );
    let mut peak = 0;
    let mut over = 0;
    for transcript in transcripts {
        match replay_volume(transcript, options) {
            Ok(replay) => {
                println!(
                    "{:<28} {:>6} {:>6.1} {:>5} {:>10.2} {:>10.2} {:>7} {:>7} {:>10.2}",
                    replay.session,
                    replay.calls,
                    replay.simulated_ms as f64 / 3_600_000.0,
                    replay.compactions,
                    replay.peak_bytes as f64 / MIB,
                    replay.final_bytes as f64 / MIB,
                    replay.sweeps,
                    replay.files_swept,
                    replay.bytes_swept as f64 / MIB,
                );
                if replay.live_refs_unreadable > 0 {
                    errors.push(format!(
                        "{}: {} live data_refs no longer read back after the sweeps",
                        replay.session, replay.live_refs_unreadable
                    ));
                }
                over += u64::from(replay.peak_bytes >= budget);
                peak = peak.max(replay.peak_bytes);
            }
            Err(error) => errors.push(error.to_string()),
        }
    }
    println!(
        "peak over the fleet: {:.2} MiB of a {:.0} MiB volume; {over} session(s) reached it",
        peak as f64 / MIB,
        budget as f64 / MIB
    );
    for error in &errors {
        eprintln!("strata replay: {error}");
    }
    Ok(errors.is_empty() && over == 0)
}

/// Run `strata replay`; returns whether every input replayed.
pub fn run(args: &ReplayArgs) -> anyhow::Result<bool> {
    let provider = if args.provider == "openai" { Provider::OpenAi } else { Provider::Anthropic };
    let strata = policy_file::session_settings(args.policy.as_deref(), provider, args.context_window)?;
    let counter = TokenCounter::new(TokenizerKind::O200kBase).context("loading the o200k_base tokenizer")?;
    let tools = args
        .synthetic_tools
        .map(|tokens| strata_core::replay::tool_set::synthetic_tool_set(tokens, &counter))
        .unwrap_or_default();
    let options = ReplayOptions { provider, strata, tools, ..ReplayOptions::default() };
    let format = InputFormat::from_name(&args.format).unwrap_or(InputFormat::Auto);
    if args.sweep {
        let jobs = args.jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from));
        let sweep = param_sweep::SweepInputs {
            paths: &args.paths,
            format,
            grid: args.grid.as_deref(),
            jobs,
            policy_rules: policy_file::retention_rules(args.policy.as_deref(), args.context_window)?,
            report: args.report.as_deref(),
        };
        return param_sweep::run(&sweep, &options, &counter);
    }

    let mut errors = Vec::new();
    let transcripts = if args.synthetic_fleet {
        generate_fleet(&FleetSpec { agents: args.agents, hours: args.hours, seed: args.seed })
    } else {
        inputs::load_all(&args.paths, format, &mut errors)
    };
    if args.volume {
        return volume_run(&transcripts, &options, args.volume_budget, errors);
    }
    let mut sessions = Vec::with_capacity(transcripts.len());
    for transcript in &transcripts {
        match replay_session(transcript, &options, &counter) {
            Ok(report) => sessions.push(report),
            Err(error) => errors.push(error.to_string()),
        }
    }
    for error in &errors {
        eprintln!("strata replay: {error}");
    }
    if sessions.is_empty() {
        anyhow::bail!("no session could be replayed; see the errors above");
    }
    let totals = table::totals(&sessions);
    let calibration = sessions.iter().fold(TokenCalibration::default(), |sum, s| TokenCalibration {
        calls: sum.calls + s.calibration.calls,
        recorded_prompt_tokens: sum.recorded_prompt_tokens + s.calibration.recorded_prompt_tokens,
        counted_prompt_tokens: sum.counted_prompt_tokens + s.calibration.counted_prompt_tokens,
        recorded_cached_tokens: sum.recorded_cached_tokens + s.calibration.recorded_cached_tokens,
    });
    print!("{}", table::render(&totals, &sessions, &calibration, provider));
    if !options.tools.is_empty() {
        print!("{}", table::schema_loading(&sessions));
    }
    if let Some(path) = &args.plot {
        let series: Vec<(String, Vec<&PolicyReport>)> = policy_series(&sessions);
        let svg = plot::render(&series).map_err(|e| anyhow::anyhow!("drawing the plot: {e}"))?;
        std::fs::write(path, svg).with_context(|| format!("writing {}", path.display()))?;
        println!("plot: {}", path.display());
    }
    if let Some(path) = &args.html {
        for session in &sessions {
            let Some(view) = html::session_view(session, &args.provider) else { continue };
            let page_path = html::page_path(path, &session.name, sessions.len());
            std::fs::write(&page_path, crate::inspector::offline_page(&view))
                .with_context(|| format!("writing {}", page_path.display()))?;
            println!("inspector page: {}", page_path.display());
        }
    }
    if let Some(path) = &args.report {
        let report = ReplayReport {
            provider,
            context_window: args.context_window,
            totals,
            calibration,
            errors: errors.clone(),
            sessions,
        };
        let json = serde_json::to_vec_pretty(&report).context("encoding the report")?;
        std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))?;
        println!("report: {}", path.display());
    }
    Ok(errors.is_empty())
}

/// Each policy's reports across sessions, in session order.
fn policy_series(sessions: &[SessionReport]) -> Vec<(String, Vec<&PolicyReport>)> {
    let Some(first) = sessions.first() else { return Vec::new() };
    first
        .policies
        .iter()
        .map(|p| {
            let reports =
                sessions.iter().filter_map(|s| s.policies.iter().find(|q| q.policy == p.policy)).collect();
            (p.policy.name().to_string(), reports)
        })
        .collect()
}

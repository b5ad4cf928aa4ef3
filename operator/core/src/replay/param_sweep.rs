//! The parameter sweep behind `strata replay --sweep`: the strata policy replayed at every point of
//! a grid of engine knobs (spill, elision, deduplication, per-tool retention), each point priced
//! with read-backs charged, and the Pareto front of cost against read-backs.
//!
//! A point changes only the engine settings the replay drives; everything else (pricing, the
//! window, the read-back detector) stays the same, so points are comparable with each other and
//! with naive-with-cache, which is replayed once per corpus.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde::{Deserialize, Serialize};

use crate::entry::{RetentionClass, Role};
use crate::retention::{Classifier, RetentionMatch, RetentionRule, RetentionRuleError};
use crate::session::SessionSettings;
use crate::tokens::TokenCounter;
use crate::tool_output::{ElisionPolicy, SpillPolicy};

use super::policies::PolicyKind;
use super::simulate::{ReplayError, ReplayOptions, call_times, replay_session, replay_strata};
use super::transcript::Transcript;

/// A named set of retention rules placed before the policy's own (the first matching rule wins):
/// how the engine treats the outputs of particular tools, e.g. a directory listing as Ephemeral.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ToolTreatment {
    /// Name shown in the sweep's table.
    pub name: String,
    /// Rules in the policy API's shape (`name`, `class`, `match`, `ttlSeconds`).
    #[serde(default)]
    pub rules: Vec<RetentionRule>,
}

/// The values each knob takes; the sweep runs their cartesian product (points whose preview would
/// not fit their spill threshold are skipped).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SweepGrid {
    /// Spill threshold, characters (`toolResults.maxResultChars`).
    pub max_result_chars: Vec<usize>,
    /// Preview kept of a spilled output, characters (`toolResults.previewChars`).
    pub preview_chars: Vec<usize>,
    /// Rounds before a result may be elided (`toolResults.elideAfterRounds`).
    pub elide_after_rounds: Vec<usize>,
    /// Only outputs longer than this are elided (`toolResults.elideOverChars`).
    pub elide_over_chars: Vec<usize>,
    /// Characters kept of an elided output (`toolResults.elideKeepChars`).
    pub elide_keep_chars: Vec<usize>,
    /// Deduplication of repeated outputs on or off.
    pub deduplicate: Vec<bool>,
    /// Per-tool treatments; an empty list means the policy's rules alone.
    #[serde(default)]
    pub tool_treatments: Vec<ToolTreatment>,
}

impl SweepGrid {
    /// The built-in coarse grid (72 points): spill thresholds and previews around the defaults,
    /// two elision ages, dedup on and off, and three per-tool treatments; the defaults are one of
    /// its points. Refine with a grid file.
    pub fn coarse() -> Self {
        SweepGrid {
            max_result_chars: vec![2000, 4000, 8000],
            preview_chars: vec![250, 1000],
            elide_after_rounds: vec![2, 4],
            elide_over_chars: vec![2000],
            elide_keep_chars: vec![800],
            deduplicate: vec![true, false],
            tool_treatments: vec![
                ToolTreatment { name: "policy".into(), rules: Vec::new() },
                ToolTreatment { name: "searches-ephemeral".into(), rules: vec![searches_ephemeral()] },
                ToolTreatment { name: "test-runs-ephemeral".into(), rules: vec![test_runs_ephemeral()] },
            ],
        }
    }

    /// Every point of the grid, in a fixed order.
    pub fn points(&self) -> Vec<SweepPoint> {
        let treatments: Vec<Option<&ToolTreatment>> = if self.tool_treatments.is_empty() {
            vec![None]
        } else {
            self.tool_treatments.iter().map(Some).collect()
        };
        let mut points = Vec::new();
        for &max_result_chars in &self.max_result_chars {
            for &preview_chars in self.preview_chars.iter().filter(|&&p| p <= max_result_chars) {
                for &elide_after_rounds in &self.elide_after_rounds {
                    for &elide_over_chars in &self.elide_over_chars {
                        for &elide_keep_chars in
                            self.elide_keep_chars.iter().filter(|&&k| k < elide_over_chars)
                        {
                            for &deduplicate in &self.deduplicate {
                                for treatment in &treatments {
                                    points.push(SweepPoint {
                                        max_result_chars,
                                        preview_chars,
                                        elide_after_rounds,
                                        elide_over_chars,
                                        elide_keep_chars,
                                        deduplicate,
                                        treatment: treatment.map(|t| t.name.clone()),
                                        rules: treatment.map(|t| t.rules.clone()).unwrap_or_default(),
                                    });
                                }
                            }
                        }
                    }
                }
            }
        }
        points
    }
}

/// Search and polling outputs (grep, glob, web search, process polls) as Ephemeral for ten minutes.
fn searches_ephemeral() -> RetentionRule {
    let tools = ["Grep", "Glob", "LS", "WebSearch", "memory_search", "process"];
    RetentionRule {
        name: "searches-ephemeral".into(),
        class: RetentionClass::Ephemeral,
        matcher: RetentionMatch {
            roles: Some(vec![Role::Tool]),
            tool_names: Some(tools.iter().map(|t| (*t).to_owned()).collect()),
            content_regex: None,
        },
        ttl_seconds: Some(600),
    }
}

/// Test-run outputs (a pytest or unittest summary line), whatever the tool, as Ephemeral for ten
/// minutes: the next run supersedes them.
fn test_runs_ephemeral() -> RetentionRule {
    RetentionRule {
        name: "test-runs-ephemeral".into(),
        class: RetentionClass::Ephemeral,
        matcher: RetentionMatch {
            roles: Some(vec![Role::Tool]),
            tool_names: None,
            content_regex: Some(
                r"(?m)^(=+ .*\b(passed|failed|error)\b.* in [0-9.]+s.*=+|Ran [0-9]+ tests? in )".into(),
            ),
        },
        ttl_seconds: Some(600),
    }
}

/// One combination of knob values.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SweepPoint {
    /// Spill threshold, characters.
    pub max_result_chars: usize,
    /// Preview of a spilled output, characters.
    pub preview_chars: usize,
    /// Rounds before elision.
    pub elide_after_rounds: usize,
    /// Elision threshold, characters.
    pub elide_over_chars: usize,
    /// Characters kept when eliding.
    pub elide_keep_chars: usize,
    /// Deduplication on.
    pub deduplicate: bool,
    /// The per-tool treatment's name (none: the policy's rules alone).
    pub treatment: Option<String>,
    /// Its rules, placed before the policy's.
    #[serde(skip)]
    pub rules: Vec<RetentionRule>,
}

impl SweepPoint {
    /// The point the settings themselves describe (no extra per-tool rules).
    pub fn of(settings: &SessionSettings) -> Self {
        SweepPoint {
            max_result_chars: settings.spill.max_result_chars,
            preview_chars: settings.spill.preview_chars,
            elide_after_rounds: settings.elision.elide_after_rounds,
            elide_over_chars: settings.elision.elide_over_chars,
            elide_keep_chars: settings.elision.elide_keep_chars,
            deduplicate: settings.deduplicate,
            treatment: None,
            rules: Vec::new(),
        }
    }

    /// Whether this point runs exactly the knobs of `base` and adds no per-tool rules.
    pub fn is_base(&self, base: &SweepPoint) -> bool {
        self.rules.is_empty()
            && (self.max_result_chars, self.preview_chars, self.deduplicate)
                == (base.max_result_chars, base.preview_chars, base.deduplicate)
            && (self.elide_after_rounds, self.elide_over_chars, self.elide_keep_chars)
                == (base.elide_after_rounds, base.elide_over_chars, base.elide_keep_chars)
    }

    /// `base` with this point's knobs; `policy_rules` are the policy's retention rules, which
    /// follow the point's own.
    pub fn settings(
        &self,
        base: &SessionSettings,
        policy_rules: &[RetentionRule],
    ) -> Result<SessionSettings, RetentionRuleError> {
        let rules = self.rules.iter().chain(policy_rules).cloned().collect();
        Ok(SessionSettings {
            spill: SpillPolicy {
                max_result_chars: self.max_result_chars,
                preview_chars: self.preview_chars,
                ..base.spill
            },
            elision: ElisionPolicy {
                elide_after_rounds: self.elide_after_rounds,
                elide_over_chars: self.elide_over_chars,
                elide_keep_chars: self.elide_keep_chars,
                ..base.elision
            },
            deduplicate: self.deduplicate,
            classifier: Classifier::new(rules)?,
            ..base.clone()
        })
    }

    /// A short label: `spill 2000/250 elide 4/2000/800 dedup on policy`.
    pub fn label(&self) -> String {
        format!(
            "spill {}/{} elide {}/{}/{} dedup {} {}",
            self.max_result_chars,
            self.preview_chars,
            self.elide_after_rounds,
            self.elide_over_chars,
            self.elide_keep_chars,
            if self.deduplicate { "on" } else { "off" },
            self.treatment.as_deref().unwrap_or("policy"),
        )
    }
}

/// A corpus: sessions priced together.
#[derive(Clone, Debug)]
pub struct Corpus {
    /// Name shown in the table (the path given).
    pub name: String,
    /// Its sessions.
    pub transcripts: Vec<Transcript>,
}

/// One point (or naive) over one corpus.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CorpusScore {
    /// Cost of the calls, fresh-token units.
    pub units: f64,
    /// Cost of the read-backs charged.
    pub read_back_units: f64,
    /// Uses of removed content detected.
    pub uses: u64,
    /// Read-backs charged.
    pub read_backs: u64,
    /// Uses with no way back (the goal is zero).
    pub unrecoverable: u64,
    /// Outputs spilled, elided, expired and deduplicated.
    pub spills: u64,
    /// Outputs elided.
    pub elisions: u64,
    /// Entries expired.
    pub expirations: u64,
    /// Duplicate outputs replaced.
    pub deduplications: u64,
    /// Naive-with-cache over the same sessions, units.
    pub naive_units: f64,
}

impl CorpusScore {
    /// Cost without read-backs, as a multiple of naive-with-cache.
    pub fn ratio(&self) -> f64 {
        if self.naive_units > 0.0 { self.units / self.naive_units } else { 0.0 }
    }

    /// Cost with read-backs, as a multiple of naive-with-cache.
    pub fn ratio_with_read_backs(&self) -> f64 {
        if self.naive_units > 0.0 { (self.units + self.read_back_units) / self.naive_units } else { 0.0 }
    }

    fn add(&mut self, other: &CorpusScore) {
        self.units += other.units;
        self.read_back_units += other.read_back_units;
        self.uses += other.uses;
        self.read_backs += other.read_backs;
        self.unrecoverable += other.unrecoverable;
        self.spills += other.spills;
        self.elisions += other.elisions;
        self.expirations += other.expirations;
        self.deduplications += other.deduplications;
        self.naive_units += other.naive_units;
    }
}

/// One point over every corpus.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PointResult {
    /// The knobs.
    pub point: SweepPoint,
    /// Per corpus, in the order given.
    pub corpora: Vec<CorpusScore>,
    /// All corpora together.
    pub total: CorpusScore,
}

/// A sweep that cannot run.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    /// A point's per-tool rules do not compile.
    #[error("sweep point {point}: {source}")]
    Rules {
        /// The point's label.
        point: String,
        /// Why.
        source: RetentionRuleError,
    },
    /// A session failed to replay.
    #[error("sweep point {point}: {source}")]
    Replay {
        /// The point's label.
        point: String,
        /// Why.
        source: ReplayError,
    },
}

/// Naive-with-cache per corpus (units), the denominator of every ratio.
pub fn naive_units(
    corpora: &[Corpus],
    options: &ReplayOptions,
    counter: &TokenCounter,
) -> Result<Vec<f64>, ReplayError> {
    let naive = ReplayOptions { policies: vec![PolicyKind::Naive], ..options.clone() };
    corpora
        .iter()
        .map(|corpus| {
            corpus.transcripts.iter().try_fold(0.0, |sum, transcript| {
                let report = replay_session(transcript, &naive, counter)?;
                Ok(sum + report.policies.iter().map(|p| p.totals().units).sum::<f64>())
            })
        })
        .collect()
}

/// Replays the strata policy at `point` over every corpus.
pub fn score_point(
    point: &SweepPoint,
    corpora: &[Corpus],
    naive: &[f64],
    options: &ReplayOptions,
    policy_rules: &[RetentionRule],
) -> Result<PointResult, SweepError> {
    let strata = point
        .settings(&options.strata, policy_rules)
        .map_err(|source| SweepError::Rules { point: point.label(), source })?;
    let options = ReplayOptions { strata, ..options.clone() };
    let mut scores = Vec::with_capacity(corpora.len());
    let mut total = CorpusScore::default();
    for (corpus, &naive_units) in corpora.iter().zip(naive) {
        let mut score = CorpusScore { naive_units, ..CorpusScore::default() };
        for transcript in &corpus.transcripts {
            let times = call_times(transcript);
            let report = replay_strata(transcript, &options, &times, |_, _| {})
                .map_err(|source| SweepError::Replay { point: point.label(), source })?;
            score.units += report.totals().units;
            score.read_back_units += report.read_backs.cost_units;
            score.uses += report.read_backs.uses_detected;
            score.read_backs += report.read_backs.read_backs;
            score.unrecoverable += report.read_backs.unrecoverable;
            score.spills += report.spills;
            score.elisions += report.elisions;
            score.expirations += report.expirations;
            score.deduplications += report.deduplications;
        }
        total.add(&score);
        scores.push(score);
    }
    Ok(PointResult { point: point.clone(), corpora: scores, total })
}

/// Scores every point on `jobs` threads; results keep the order of `points`.
pub fn run_sweep(
    points: &[SweepPoint],
    corpora: &[Corpus],
    naive: &[f64],
    options: &ReplayOptions,
    policy_rules: &[RetentionRule],
    jobs: usize,
    progress: &(dyn Fn(usize, &PointResult) + Sync),
) -> Result<Vec<PointResult>, SweepError> {
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<PointResult, SweepError>>>> =
        Mutex::new((0..points.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..jobs.max(1) {
            scope.spawn(|| {
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    let Some(point) = points.get(index) else { break };
                    let result = score_point(point, corpora, naive, options, policy_rules);
                    if let Ok(scored) = &result {
                        progress(index, scored);
                    }
                    let failed = result.is_err();
                    if let Ok(mut slots) = results.lock() {
                        slots[index] = Some(result);
                    }
                    if failed {
                        next.store(points.len(), Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let slots = results.into_inner().unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut out = Vec::with_capacity(points.len());
    for slot in slots {
        match slot {
            Some(Ok(result)) => out.push(result),
            Some(Err(error)) => return Err(error),
            None => {}
        }
    }
    Ok(out)
}

/// Indices of the points on the Pareto front of (cost with read-backs, read-backs), both over all
/// corpora and both to be minimised, among points with no unrecoverable use; sorted by cost.
pub fn pareto_front(results: &[PointResult]) -> Vec<usize> {
    let eligible: Vec<usize> = (0..results.len()).filter(|&i| results[i].total.unrecoverable == 0).collect();
    let key = |i: usize| (results[i].total.ratio_with_read_backs(), results[i].total.read_backs);
    let dominates = |a: usize, b: usize| {
        let ((cost_a, reads_a), (cost_b, reads_b)) = (key(a), key(b));
        cost_a <= cost_b && reads_a <= reads_b && (cost_a < cost_b || reads_a < reads_b)
    };
    let mut front: Vec<usize> =
        eligible.iter().copied().filter(|&i| !eligible.iter().any(|&j| dominates(j, i))).collect();
    front.sort_by(|&a, &b| key(a).0.total_cmp(&key(b).0).then(key(a).1.cmp(&key(b).1)));
    // Points with identical scores: keep the first of each.
    front.dedup_by(|a, b| key(*a) == key(*b));
    front
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(cost: f64, read_backs: u64, unrecoverable: u64) -> PointResult {
        let total = CorpusScore {
            units: cost * 100.0,
            read_backs,
            unrecoverable,
            naive_units: 100.0,
            ..CorpusScore::default()
        };
        PointResult {
            point: SweepPoint::of(&SessionSettings::defaults(crate::session::Api::OpenAi, 1000)),
            corpora: vec![total.clone()],
            total,
        }
    }

    #[test]
    fn the_front_keeps_only_undominated_points_without_unrecoverable_uses() {
        let results = vec![
            result(0.9, 10, 0), // dominated by 0.8 / 5
            result(0.8, 5, 0),
            result(0.7, 9, 0),
            result(0.95, 0, 0),
            result(0.5, 0, 1), // cheapest, but loses content for good
            result(0.8, 5, 0), // a tie with the second: listed once
        ];
        assert_eq!(pareto_front(&results), vec![2, 1, 3]);
    }

    #[test]
    fn grids_skip_previews_longer_than_the_threshold_and_the_coarse_one_holds_the_defaults() {
        let grid = SweepGrid {
            max_result_chars: vec![1000, 8000],
            preview_chars: vec![500, 4000],
            elide_after_rounds: vec![4],
            elide_over_chars: vec![2000],
            elide_keep_chars: vec![800, 3000],
            deduplicate: vec![true],
            tool_treatments: Vec::new(),
        };
        let points = grid.points();
        assert_eq!(points.len(), 3, "1000/4000 and keep 3000 > over 2000 are skipped");
        assert!(points.iter().all(|p| p.preview_chars <= p.max_result_chars && p.treatment.is_none()));
        let coarse = SweepGrid::coarse().points();
        assert_eq!(coarse.len(), 72);
        assert!(coarse.iter().any(|p| {
            p.is_base(&SweepPoint::of(&SessionSettings::defaults(crate::session::Api::OpenAi, 1000)))
        }));
    }
}

//! The replay table: per-policy totals across sessions, as text for stdout.

use std::fmt::Write as _;

use serde::Serialize;
use strata_core::replay::readback::ReadBackSummary;
use strata_core::replay::simulate::TokenCalibration;
use strata_core::replay::{PolicyKind, Provider, SessionReport};

/// One policy over every session.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyTotals {
    /// Policy name.
    pub policy: String,
    /// Model calls.
    pub calls: u64,
    /// Prompt tokens sent.
    pub tokens: u64,
    /// Billed fresh.
    pub fresh: u64,
    /// Written to the cache.
    pub cache_write: u64,
    /// Read from the cache.
    pub cache_read: u64,
    /// Cost in fresh-token units.
    pub units: f64,
    /// Units relative to naive (with the same prefix caching).
    pub ratio_to_naive: f64,
    /// Largest prompt of any call.
    pub peak_context: u64,
    /// Calls whose prompt plus reservations exceeded the window.
    pub calls_over_budget: u64,
    /// Compactions.
    pub compactions: u64,
    /// Spilled outputs.
    pub spills: u64,
    /// Elided outputs.
    pub elisions: u64,
    /// Expired entries.
    pub expirations: u64,
    /// Deduplicated outputs.
    pub deduplications: u64,
    /// Spilled/elided outputs that read back byte-exact, of those stored (strata).
    pub readable: Option<(u64, u64)>,
    /// Decision/constraint/TODO lines surviving, of those in the source (strata).
    pub markers: Option<(u64, u64)>,
    /// Later uses of removed content, with the read-backs they cost.
    pub read_backs: ReadBackSummary,
    /// Cost units with the read-backs charged.
    pub units_with_read_backs: f64,
    /// That, relative to naive's (naive removes nothing, so it has no read-backs).
    pub ratio_with_read_backs: f64,
}

/// Sum every session's reports per policy.
pub fn totals(sessions: &[SessionReport]) -> Vec<PolicyTotals> {
    let mut out: Vec<PolicyTotals> = Vec::new();
    for session in sessions {
        for report in &session.policies {
            let name = report.policy.name();
            let index = match out.iter().position(|t| t.policy == name) {
                Some(index) => index,
                None => {
                    out.push(PolicyTotals { policy: name.into(), ..PolicyTotals::default() });
                    out.len() - 1
                }
            };
            let t = &mut out[index];
            let sum = report.totals();
            t.calls += report.calls.len() as u64;
            t.tokens += sum.total;
            t.fresh += sum.fresh;
            t.cache_write += sum.cache_write;
            t.cache_read += sum.cache_read;
            t.units += sum.units;
            t.peak_context = t.peak_context.max(report.peak_context);
            t.calls_over_budget += report.calls_over_budget;
            t.compactions += report.compactions;
            t.spills += report.spills;
            t.elisions += report.elisions;
            t.expirations += report.expirations;
            t.deduplications += report.deduplications;
            t.read_backs.add(&report.read_backs);
            t.units_with_read_backs += report.units_with_read_backs();
            if let Some(p) = &report.preservation {
                let (readable, stored) = t.readable.unwrap_or((0, 0));
                t.readable = Some((readable + p.readable_byte_exact, stored + p.stored_outputs));
                let (surviving, all) = t.markers.unwrap_or((0, 0));
                t.markers = Some((surviving + p.markers_surviving, all + p.markers));
            }
        }
    }
    let naive = out.iter().find(|t| t.policy == PolicyKind::Naive.name()).map(|t| t.units);
    for t in &mut out {
        t.ratio_to_naive = naive.filter(|n| *n > 0.0).map_or(f64::NAN, |n| t.units / n);
        t.ratio_with_read_backs =
            naive.filter(|n| *n > 0.0).map_or(f64::NAN, |n| t.units_with_read_backs / n);
    }
    out
}

fn percent(part: u64, whole: u64) -> String {
    if whole == 0 { "n/a".into() } else { format!("{:.1}%", 100.0 * part as f64 / whole as f64) }
}

/// The table printed on stdout.
pub fn render(
    totals: &[PolicyTotals],
    sessions: &[SessionReport],
    calibration: &TokenCalibration,
    provider: Provider,
) -> String {
    let calls: usize = sessions.iter().map(|s| s.calls).sum();
    let mut out = String::new();
    let provider_name = match provider {
        Provider::Anthropic => "anthropic (write 1.25x, read 0.1x, breakpoints, min 1024, 5-min TTL)",
        Provider::OpenAi => "openai (automatic prefixes >= 1024 in 128-token steps, read 0.1x)",
    };
    let _ = writeln!(out, "{} sessions, {calls} model calls, priced as {provider_name}", sessions.len());
    let _ = writeln!(
        out,
        "{:<20} {:>12} {:>11} {:>11} {:>12} {:>12} {:>7} {:>9} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>8} {:>7}",
        "policy",
        "tokens",
        "fresh",
        "cache-write",
        "cache-read",
        "cost-units",
        "x-naive",
        "peak",
        "over",
        "compact",
        "spill",
        "elide",
        "uses",
        "reads",
        "unrecov",
        "x+reads"
    );
    for t in totals {
        let _ = writeln!(
            out,
            "{:<20} {:>12} {:>11} {:>11} {:>12} {:>12.0} {:>7.3} {:>9} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>8} {:>7.3}",
            t.policy,
            t.tokens,
            t.fresh,
            t.cache_write,
            t.cache_read,
            t.units,
            t.ratio_to_naive,
            t.peak_context,
            t.calls_over_budget,
            t.compactions,
            t.spills,
            t.elisions,
            t.read_backs.uses_detected,
            t.read_backs.read_backs,
            t.read_backs.unrecoverable,
            t.ratio_with_read_backs
        );
    }
    let _ = writeln!(
        out,
        "uses: later outputs that quote removed content; reads: read-backs charged (one round trip each); unrecov: uses of content with no way back; x+reads: cost with read-backs, relative to naive"
    );
    if let Some(strata) = totals.iter().find(|t| t.policy == PolicyKind::Strata.name()) {
        if let Some((readable, stored)) = strata.readable {
            let _ = writeln!(
                out,
                "strata: {readable}/{stored} off-window outputs read back byte-exact ({})",
                percent(readable, stored)
            );
        }
        if let Some((surviving, all)) = strata.markers {
            let _ = writeln!(
                out,
                "strata: {surviving}/{all} decision/constraint/TODO lines still in context or reopenable ({})",
                percent(surviving, all)
            );
        }
        let _ =
            writeln!(out, "strata: {} expired, {} deduplicated", strata.expirations, strata.deduplications);
    }
    if let Some(oracle) = totals.iter().find(|t| t.policy == PolicyKind::Oracle.name()) {
        let _ = writeln!(
            out,
            "oracle: a bound, not a policy: it knows which outputs later calls use, spills the rest on arrival \
             and keeps a used one unless its read-back is cheaper ({} deduplicated)",
            oracle.deduplications
        );
    }
    for (policy, session, example) in first_examples(sessions) {
        let evidence: String = example.evidence.text.chars().take(100).collect();
        let _ = writeln!(
            out,
            "{policy}: e.g. {session} call {} used removed {} ({:?} {evidence:?}){}",
            example.call + 1,
            example.removal_id,
            example.evidence.kind,
            if example.recoverable { "" } else { ", unrecoverable" }
        );
    }
    if calibration.calls > 0 {
        let _ = writeln!(
            out,
            "calibration: o200k_base counted {} prompt tokens where the provider recorded {} over {} calls (ratio {:.3}); the provider reported {} of them cached ({})",
            calibration.counted_prompt_tokens,
            calibration.recorded_prompt_tokens,
            calibration.calls,
            calibration.counted_prompt_tokens as f64 / calibration.recorded_prompt_tokens.max(1) as f64,
            calibration.recorded_cached_tokens,
            percent(calibration.recorded_cached_tokens, calibration.recorded_prompt_tokens)
        );
    }
    out
}

/// The first detected use of removed content of each policy, with its session.
fn first_examples(
    sessions: &[SessionReport],
) -> Vec<(&'static str, &str, &strata_core::replay::readback::ReadBackUse)> {
    let mut found: Vec<(&'static str, &str, &strata_core::replay::readback::ReadBackUse)> = Vec::new();
    for session in sessions {
        for report in &session.policies {
            let name = report.policy.name();
            if let Some(example) = report.read_back_examples.first()
                && !found.iter().any(|(policy, _, _)| *policy == name)
            {
                found.push((name, session.name.as_str(), example));
            }
        }
    }
    found
}

/// The strata policy's tool-schema line: tokens sent against the full schemas, calls with lazy
/// schemas, schemas loaded on demand and retried calls, over every session.
pub fn schema_loading(sessions: &[SessionReport]) -> String {
    let mut total = strata_core::replay::simulate::SchemaLoading::default();
    let mut calls = 0;
    for report in sessions.iter().flat_map(|s| s.policies.iter()).filter(|p| p.policy == PolicyKind::Strata) {
        let schemas = &report.schemas;
        calls += report.calls.len();
        total.lazy_calls += schemas.lazy_calls;
        total.sent_tool_tokens += schemas.sent_tool_tokens;
        total.full_tool_tokens += schemas.full_tool_tokens;
        total.loaded_on_demand += schemas.loaded_on_demand;
        total.retries += schemas.retries;
    }
    let saved = total.full_tool_tokens.saturating_sub(total.sent_tool_tokens);
    let percent =
        if total.full_tool_tokens == 0 { 0.0 } else { saved as f64 * 100.0 / total.full_tool_tokens as f64 };
    format!(
        "tool schemas (strata): {} of {} tokens sent over {calls} calls ({saved} saved, {percent:.1}%); \
         lazy on {} calls; {} schemas loaded on demand; {} calls retried\n",
        total.sent_tool_tokens,
        total.full_tool_tokens,
        total.lazy_calls,
        total.loaded_on_demand,
        total.retries
    )
}

//! Real traffic never breaks an agent: every long session and seed 003's session, driven through
//! the real gateway over HTTP in Transparent mode by a client that resends its whole history on
//! each call (the fake upstream answering with the recorded assistant messages), gets an answer on
//! every call, and every upstream request keeps the provider's tool-pairing rules and fits the
//! window. With a 32k-token window the gateway must compact to get there; the compactions per
//! session are printed (BENCHMARKS.md, "Real traffic"). No client here edits its history, so no
//! request may rewind the journal: not even after a compaction that kept none of the client's turns
//! (`keepRecentEntries: 0`), whose summary the next request must extend.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod gateway_support;

use std::path::PathBuf;

use gateway_support::corpus::{files, load, reply_of, seed_003, shared};
use gateway_support::{FakeUpstream, Harness};
use serde_json::{Value, json};
use strata_api::agent::Provider;
use strata_core::replay::Transcript;
use strata_core::session::Api;
use strata_core::session::protocol::check_request;

/// What one session did through the gateway.
#[derive(Debug, Default)]
struct Driven {
    calls: usize,
    failed: Vec<String>,
    invalid: Vec<String>,
    over_window: Vec<String>,
    compactions: u64,
    rewinds: u64,
    peak_tokens: u64,
    /// Messages taken from the gateway's memo of the previous request, and how many a client that
    /// resends its history byte for byte lets it take.
    reused: (u64, u64),
}

fn counter(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .filter(|line| line.starts_with(name))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// The gateway's window and, when set, the compaction's `keepRecentEntries`.
#[derive(Debug, Clone, Copy)]
struct Setting {
    window: u32,
    keep_recent_entries: Option<u32>,
    /// Compact over HTTP between calls once the context is over half the window, as a CompactionJob
    /// the controller starts before the limit is applied between two of the client's requests.
    compact_between_calls: bool,
}

async fn drive(fake: &FakeUpstream, transcript: &Transcript, setting: Setting) -> Driven {
    let gateway = Harness::start(fake, Provider::OpenAI, |config| {
        config.upstream.context_window = setting.window;
        config.stable_prefix.system_prompt = String::new();
        if let Some(keep) = setting.keep_recent_entries {
            config.policy.compaction.keep_recent_entries = keep;
        }
    })
    .await;
    let wires: Vec<Value> = transcript.messages.iter().map(|m| m.wire.clone()).collect();
    let mut driven = Driven::default();
    let mut previous_end = None;
    for (call, &(end, _)) in transcript.calls.iter().enumerate() {
        // Both requests are prefixes of one message list, serialised the same way.
        driven.reused.1 += previous_end.map_or(0, |previous: usize| previous.min(end) as u64);
        previous_end = Some(end);
        fake.unscript();
        fake.script([reply_of(&wires[end])]);
        let seen_before = fake.seen().len();
        let (status, text) = gateway
            .post("/v1/chat/completions", &json!({"model": "m", "messages": &wires[..end]}), &[])
            .await;
        driven.calls += 1;
        if status != 200 {
            driven
                .failed
                .push(format!("call {call}: {status} {}", text.chars().take(300).collect::<String>()));
        }
        for seen in &fake.seen()[seen_before..] {
            if let Err(violation) = check_request(Api::OpenAi, &seen.body) {
                driven.invalid.push(format!("call {call}: {violation}"));
            }
        }
        let context = &gateway.get_json("/strata/v1/status").await["context"];
        let (tokens, limit) = (context["tokens"].as_u64().unwrap(), context["limit"].as_u64().unwrap());
        driven.peak_tokens = driven.peak_tokens.max(tokens);
        if tokens > limit {
            driven.over_window.push(format!("call {call}: {tokens} > {limit}"));
        }
        if setting.compact_between_calls && tokens > limit / 2 {
            let (status, record) = gateway.post_json("/strata/v1/compact", &json!({}), &[]).await;
            if status != 200 {
                driven.failed.push(format!("compaction after call {call}: {status} {record}"));
            }
        }
    }
    let metrics = gateway.metrics().await;
    driven.compactions = counter(&metrics, "strata_gateway_compactions_total");
    driven.rewinds = counter(&metrics, "strata_gateway_transparent_rewinds_total");
    driven.reused.0 = counter(&metrics, "strata_gateway_transparent_messages_total{read=\"reused\"}");
    gateway.gateway.shutdown().await;
    driven
}

/// Drives every session in `paths` through its own gateway; returns the compactions in all.
async fn drive_all(paths: Vec<PathBuf>, setting: Setting) -> u64 {
    let fake = FakeUpstream::start().await;
    let mut problems = Vec::new();
    let (mut total_calls, mut compactions) = (0, 0);
    let label = match setting.keep_recent_entries {
        Some(keep) if setting.compact_between_calls => {
            format!("window {}, keepRecentEntries {keep}, compacting between calls", setting.window)
        }
        Some(keep) => format!("window {}, keepRecentEntries {keep}", setting.window),
        None => format!("window {}", setting.window),
    };
    eprintln!(
        "{label}: session | calls | failed | invalid | over window | compactions | rewinds | peak tokens | messages reused"
    );
    for path in &paths {
        let transcript = load(path);
        let driven = drive(&fake, &transcript, setting).await;
        total_calls += driven.calls;
        compactions += driven.compactions;
        eprintln!(
            "{label}: {} | {} | {} | {} | {} | {} | {} | {} | {} of {}",
            transcript.name,
            driven.calls,
            driven.failed.len(),
            driven.invalid.len(),
            driven.over_window.len(),
            driven.compactions,
            driven.rewinds,
            driven.peak_tokens,
            driven.reused.0,
            driven.reused.1
        );
        if driven.rewinds > 0 {
            problems.push(format!(
                "{}: {} rewinds, and the client never edited its history",
                transcript.name, driven.rewinds
            ));
        }
        if driven.reused.0 != driven.reused.1 {
            problems.push(format!(
                "{}: {} resent messages were taken from the memo, {} expected: some request was read \
                 again whole, because the engine did not find turns it had journaled or summarised",
                transcript.name, driven.reused.0, driven.reused.1
            ));
        }
        for (kind, list) in [
            ("failed", &driven.failed),
            ("protocol-invalid", &driven.invalid),
            ("over the window", &driven.over_window),
        ] {
            problems
                .extend(list.iter().take(3).map(|problem| format!("{} {kind}: {problem}", transcript.name)));
        }
    }
    assert!(total_calls > 0);
    assert!(problems.is_empty(), "{} problems:\n{}", problems.len(), problems.join("\n"));
    compactions
}

fn sessions() -> Option<Vec<PathBuf>> {
    let shared = shared()?;
    let mut paths = seed_003(&shared);
    paths.extend(files(&shared.join("corpus/long-sessions/sessions"), ".json"));
    Some(paths)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_long_session_gets_every_answer_at_a_200k_window() {
    let Some(paths) = sessions() else { return };
    drive_all(paths, Setting { window: 200_000, keep_recent_entries: None, compact_between_calls: false })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_long_session_gets_every_answer_at_a_32k_window_by_compacting() {
    let Some(paths) = sessions() else { return };
    let setting = Setting { window: 32_000, keep_recent_entries: None, compact_between_calls: false };
    let compactions = drive_all(paths, setting).await;
    assert!(compactions > 0, "a 32k window makes the gateway compact");
}

/// The same at 32k with compactions between calls that keep none of the client's turns verbatim:
/// each next request resends the summarised history and must extend the summary, not journal the
/// history again (which refilled the window the compaction had just emptied, issue 20).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_long_session_extends_compactions_that_kept_none_of_its_turns() {
    let Some(paths) = sessions() else { return };
    let setting = Setting { window: 32_000, keep_recent_entries: Some(0), compact_between_calls: true };
    let compactions = drive_all(paths, setting).await;
    assert!(compactions > 0, "a 32k window makes the gateway compact");
}

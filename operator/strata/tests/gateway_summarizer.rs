//! The gateway's own compactions with the policy's summariser model, over HTTP against a fake
//! upstream that serves both the agent's model and the summariser model: Budget compactions at the
//! trigger run in the background and keep the turns sent meanwhile, the model's
//! `strata_compact_context` and `POST /strata/v1/compact` use the model too, and a failing model
//! falls back to the extractive summariser without stopping the agent.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod gateway_support;

use std::sync::Arc;
use std::time::Duration;

use gateway_support::{FakeUpstream, Harness, Reply, call};
use serde_json::{Value, json};
use strata_api::agent::Provider;
use strata_api::gateway_config::GatewayConfig;

const CHAT: &str = "/v1/chat/completions";
const SUMMARIZER: &str = "fake-summarizer";
const SESSION: [(&str, &str); 1] = [("x-strata-session", "main")];
/// Text only the model summariser writes: it shows the summary in the context came from it.
const MODEL_SUMMARY: &str = "MODEL-SUMMARY: the agent has been reading build notes";

/// A small window with small reservations, so a few turns reach the compaction trigger, and the
/// summariser model configured on the same fake upstream.
fn small_window(config: &mut GatewayConfig) {
    config.upstream.context_window = 8_000;
    config.upstream.timeout_seconds = 3;
    let budget = &mut config.policy.budget;
    budget.reserved_completion_tokens = 1_024;
    budget.protocol_overhead_tokens = 128;
    budget.safety_margin_tokens = 256;
    config.policy.compaction.summarizer.model = Some(SUMMARIZER.into());
    config.policy.compaction.summarizer.max_summary_tokens = 1_024;
}

/// The CompactedState a summariser model returns (no open questions or pending tool calls exist in
/// these sessions, so it passes the preservation check).
fn model_state() -> String {
    json!({
        "project_summary": MODEL_SUMMARY,
        "active_objective": "Read the build notes in order",
        "current_request": "Continue reading the build notes",
        "hard_constraints": [], "decisions": [], "completed_tasks": [], "current_tasks": [],
        "blockers": [], "open_questions": [], "affected_files": [],
        "tool_state": {"pending_actions": [], "approvals": [], "side_effects": []},
        "evidence_refs": {"entry_ids": [], "artifact_refs": []},
        "privacy_scope": "tenant",
        "resume_instruction": "Continue with the next build note."
    })
    .to_string()
}

fn note(index: usize) -> String {
    let filler = "the nightly build log shows steady progress across the workspace crates ".repeat(12);
    format!("Build note {index}: {filler}")
}

async fn say(gateway: &Harness, text: &str) -> Value {
    let (status, answer) =
        gateway.post_json(CHAT, &json!({"messages": [{"role": "user", "content": text}]}), &SESSION).await;
    assert_eq!(status, 200, "{answer}");
    answer
}

fn summarizer_calls(fake: &FakeUpstream) -> usize {
    fake.seen().iter().filter(|seen| seen.body["model"] == SUMMARIZER).count()
}

/// Sends build notes until the context reaches the trigger and the summariser model is called.
async fn send_notes_until_the_summariser_is_called(fake: &FakeUpstream, gateway: &Harness) {
    let mut sent = 0;
    while summarizer_calls(fake) == 0 {
        assert!(sent < 40, "the trigger was never reached after {sent} turns");
        say(gateway, &note(sent)).await;
        sent += 1;
    }
}

/// The records the gateway wrote beside the journal.
fn records(gateway: &Harness) -> Vec<Value> {
    let Ok(dir) = gateway.data_dir.join("compactions").read_dir() else { return Vec::new() };
    let mut records: Vec<Value> = dir
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .map(|path| serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap())
        .collect();
    records.sort_by_key(|record| record["sourceGeneration"].as_u64());
    records
}

async fn generation(gateway: &Harness) -> u64 {
    gateway.get_json("/strata/v1/status").await["generation"].as_u64().unwrap()
}

/// Waits until the journal leaves `from` (a background compaction committed), at most 15 s.
async fn wait_for_generation_after(gateway: &Harness, from: u64) -> u64 {
    for _ in 0..150 {
        let now = generation(gateway).await;
        if now != from {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no compaction committed within 15 s; records: {:?}", records(gateway));
}

/// The text of every message of the last call to the agent's model.
fn last_agent_prompt(fake: &FakeUpstream) -> String {
    let seen = fake.seen();
    let last = seen.iter().rev().find(|seen| seen.body["model"] != SUMMARIZER).unwrap();
    last.body["messages"].to_string()
}

/// A gateway whose summariser model answers after `delay`, driven to the trigger: the model is
/// writing the summary and nothing is committed yet.
async fn a_summary_under_way(delay: Duration) -> (FakeUpstream, Harness) {
    let fake = FakeUpstream::start().await;
    let state = model_state();
    fake.respond_to_model(
        SUMMARIZER,
        Arc::new(move |_| Reply::Delayed(delay, Box::new(Reply::Text(state.clone())))),
    );
    let gateway = Harness::start(&fake, Provider::OpenAI, small_window).await;
    send_notes_until_the_summariser_is_called(&fake, &gateway).await;
    assert_eq!(generation(&gateway).await, 1, "nothing is committed before the summary arrives");
    (fake, gateway)
}

#[tokio::test]
async fn at_the_trigger_the_model_compacts_in_the_background_and_turns_sent_meanwhile_are_kept() {
    let (fake, gateway) = a_summary_under_way(Duration::from_millis(1_500)).await;
    let during = ["Build note A, sent while the summary is written.", "Build note B, also meanwhile."];
    for text in during {
        say(&gateway, text).await;
    }
    let after = wait_for_generation_after(&gateway, 1).await;
    assert_eq!(after, 2);

    let records = records(&gateway);
    let record = records.last().unwrap();
    assert_eq!(record["mode"], "Budget", "{record}");
    assert_eq!(record["qualityCheck"], "Passed", "{record}");
    assert_eq!(record["modelOrServiceVersion"], format!("openai:{SUMMARIZER}"), "{record}");
    assert!(record["tokensAfter"].as_u64() < record["tokensBefore"].as_u64(), "{record}");

    say(&gateway, "Build note C, after the compaction.").await;
    let prompt = last_agent_prompt(&fake);
    assert!(prompt.contains(MODEL_SUMMARY), "the model's summary is in the context: {prompt}");
    for text in during {
        assert!(prompt.contains(text), "a turn journaled during the summary was carried over: {text}");
    }
    assert!(!prompt.contains("Build note 0:"), "the oldest notes were compacted away");
    let metrics = gateway.metrics().await;
    assert!(
        metrics.contains(
            r#"strata_gateway_summarized_compactions_total{outcome="committed",summarizer="model"} 1"#
        ),
        "{metrics}"
    );
    assert!(metrics.contains("strata_gateway_compactions_total 1"), "{metrics}");
}

#[tokio::test]
async fn a_failing_summariser_model_falls_back_to_the_extractive_summariser() {
    let fake = FakeUpstream::start().await;
    fake.respond_to_model(
        SUMMARIZER,
        Arc::new(|_| Reply::Error(500, r#"{"error": {"message": "down"}}"#.into())),
    );
    let gateway = Harness::start(&fake, Provider::OpenAI, small_window).await;
    send_notes_until_the_summariser_is_called(&fake, &gateway).await;
    wait_for_generation_after(&gateway, 1).await;
    let record = records(&gateway).pop().unwrap();
    assert_eq!(record["qualityCheck"], "Passed", "{record}");
    let version = record["modelOrServiceVersion"].as_str().unwrap();
    assert!(
        version.starts_with(&format!("strata-extractive/1 (fallback: openai:{SUMMARIZER} failed")),
        "{version}"
    );
    say(&gateway, "Build note after the fallback.").await;
    assert!(!last_agent_prompt(&fake).contains(MODEL_SUMMARY));
    let metrics = gateway.metrics().await;
    assert!(
        metrics.contains(
            r#"strata_gateway_summarized_compactions_total{outcome="committed",summarizer="fallback"} 1"#
        ),
        "{metrics}"
    );
}

#[tokio::test]
async fn the_models_own_compaction_request_and_post_compact_use_the_summariser_model() {
    let fake = FakeUpstream::start().await;
    let state = model_state();
    fake.respond_to_model(SUMMARIZER, Arc::new(move |_| Reply::Text(state.clone())));
    let gateway = Harness::start(&fake, Provider::OpenAI, |config| {
        config.policy.compaction.summarizer.model = Some(SUMMARIZER.into());
    })
    .await;
    for index in 0..12 {
        say(&gateway, &format!("Build note {index}: compiled crate {index} of twelve.")).await;
    }

    let instruction = "Continue with crate thirteen.";
    fake.script([
        Reply::Calls(
            String::new(),
            vec![call("call_c", "strata_compact_context", json!({"resume_instruction": instruction}))],
        ),
        Reply::Text("Carrying on.".into()),
    ]);
    let answer = say(&gateway, "Compact your context now.").await;
    assert_eq!(answer["choices"][0]["message"]["content"], "Carrying on.");
    let tool_answer = fake
        .seen()
        .iter()
        .rev()
        .filter(|seen| seen.body["model"] != SUMMARIZER)
        .find_map(|seen| {
            seen.body["messages"].as_array().unwrap().iter().rev().find(|m| m["role"] == "tool").cloned()
        })
        .unwrap();
    assert!(tool_answer["content"].as_str().unwrap().contains("] Compaction started:"), "{tool_answer}");
    wait_for_generation_after(&gateway, 1).await;
    let record = records(&gateway).pop().unwrap();
    assert_eq!(record["mode"], "TaskBoundary", "{record}");
    assert_eq!(record["modelOrServiceVersion"], format!("openai:{SUMMARIZER}"), "{record}");
    say(&gateway, "Next note.").await;
    let prompt = last_agent_prompt(&fake);
    assert!(prompt.contains(MODEL_SUMMARY) && prompt.contains(instruction), "{prompt}");

    for index in 12..24 {
        say(&gateway, &format!("Build note {index}: compiled crate {index}.")).await;
    }
    let (status, record) = gateway
        .post_json("/strata/v1/compact", &json!({"resumeInstruction": "Resume at crate 24."}), &[])
        .await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["modelOrServiceVersion"], format!("openai:{SUMMARIZER}"), "{record}");
    assert_eq!(record["resultGeneration"], 3, "{record}");
    assert_eq!(generation(&gateway).await, 3);
}

/// A stop while the summariser is still writing waits for the compaction: it commits, the data
/// directory is released, and the gateway started on it at once opens the compacted journal.
#[tokio::test]
async fn a_restart_during_a_background_compaction_waits_for_it_and_opens_its_result() {
    let (fake, gateway) = a_summary_under_way(Duration::from_millis(800)).await;

    let gateway = gateway.restart().await;
    assert_eq!(generation(&gateway).await, 2, "the compaction committed before the stop finished");
    let record = records(&gateway).pop().unwrap();
    assert_eq!(record["modelOrServiceVersion"], format!("openai:{SUMMARIZER}"), "{record}");
    say(&gateway, "Build note after the restart.").await;
    assert!(last_agent_prompt(&fake).contains(MODEL_SUMMARY), "the restarted gateway uses the summary");
}

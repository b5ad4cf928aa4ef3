//! The artifact sweeper over HTTP: spills fill the volume, a kept rollback target protects its
//! artifacts, and once the policy lets the old generation go the oldest unreferenced spills are
//! swept; a live data_ref still opens byte-exact while a swept one answers "expired by retention
//! policy" (on the artifacts endpoint, through `strata_read_output`, and after a restart).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod gateway_support;

use gateway_support::{FakeUpstream, Harness, Reply, call, write_config};
use serde_json::{Value, json};
use strata_api::agent::Provider;
use strata_core::artifacts::ArtifactRef;
use strata_core::lifecycle::KeepLimits;

const CHAT: &str = "/v1/chat/completions";
const MIB: u64 = 1024 * 1024;

/// A distinct tool output of about 290 KB (far over the 8,000-character spill threshold).
fn output(label: &str) -> String {
    (0..5_000).map(|line| format!("{label} line {line:05}: a row of a long build log, spilled\n")).collect()
}

/// A conversation whose tool results carry `outputs`.
fn conversation(task: &str, outputs: &[String]) -> Value {
    let mut messages = vec![json!({"role": "user", "content": task})];
    for (index, text) in outputs.iter().enumerate() {
        let id = format!("call_{task}_{index}");
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": id, "type": "function", "function": {"name": "read_log", "arguments": "{}"}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": text}));
    }
    json!({"messages": messages})
}

async fn get_artifact(gateway: &Harness, data_ref: &str) -> (u16, Vec<u8>) {
    let url = format!("http://{}/strata/v1/artifacts/{data_ref}", gateway.gateway.metrics_address);
    let response = gateway.client.get(url).send().await.unwrap();
    (response.status().as_u16(), response.bytes().await.unwrap().to_vec())
}

fn kind<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["kinds"].as_array().unwrap().iter().find(|k| k["kind"] == name).unwrap()
}

#[tokio::test]
async fn spills_are_swept_oldest_first_while_live_and_kept_references_stay_readable() {
    let fake = FakeUpstream::start().await;
    let gateway = Harness::start_with(
        &fake,
        Provider::OpenAI,
        |config| config.policy.volume.artifacts = KeepLimits { max_age_seconds: 86_400, max_bytes: MIB },
        |args| args.max_body_bytes = 8 * MIB as usize,
    )
    .await;
    let old: Vec<String> = (0..4).map(|i| output(&format!("old-task-{i}"))).collect();
    let live: Vec<String> = (0..2).map(|i| output(&format!("live-task-{i}"))).collect();
    let old_refs: Vec<String> =
        old.iter().map(|o| ArtifactRef::for_bytes(o.as_bytes()).to_string()).collect();
    let live_refs: Vec<String> =
        live.iter().map(|o| ArtifactRef::for_bytes(o.as_bytes()).to_string()).collect();

    let (status, answer) = gateway.post_json(CHAT, &conversation("old", &old), &[]).await;
    assert_eq!(status, 200, "{answer}");
    // A new conversation: the journal forks, the old turns stay only in the retained parent generation.
    let (status, answer) = gateway.post_json(CHAT, &conversation("live", &live), &[]).await;
    assert_eq!(status, 200, "{answer}");
    let generation = gateway.get_json("/strata/v1/status").await["generation"].as_u64().unwrap();
    assert!(generation >= 2, "the new conversation forked the journal");

    // Over the 1 MiB artifact budget, but the old spills belong to a rollback target the policy keeps.
    let (status, report) = gateway.post_json("/strata/v1/sweep", &json!({}), &[]).await;
    assert_eq!(status, 200, "{report}");
    let artifacts = kind(&report, "artifact");
    assert_eq!(artifacts["filesSwept"], 0, "nothing a kept generation references is swept: {report}");
    assert!(artifacts["overBudgetBytes"].as_u64().unwrap() > 0, "{report}");
    assert!(!report["keptGenerations"].as_array().unwrap().is_empty(), "{report}");
    for data_ref in &old_refs {
        assert_eq!(get_artifact(&gateway, data_ref).await.0, 200, "{data_ref} is still a rollback target's");
    }

    // The policy stops keeping old generations: the parent goes, then its spills, oldest first.
    let mut config: strata_api::gateway_config::GatewayConfig =
        serde_json::from_slice(&std::fs::read(&gateway.config_path).unwrap()).unwrap();
    config.policy.volume.generations = KeepLimits { max_age_seconds: 0, max_bytes: 256 * MIB };
    write_config(&gateway.config_path, &config);
    let gateway = gateway.restart().await;
    let (status, report) = gateway.post_json("/strata/v1/sweep", &json!({}), &[]).await;
    assert_eq!(status, 200, "{report}");
    assert!(kind(&report, "generation")["filesSwept"].as_u64().unwrap() >= 1, "{report}");
    let artifacts = kind(&report, "artifact");
    assert!(artifacts["filesSwept"].as_u64().unwrap() >= 2, "{report}");
    assert!(artifacts["bytesKept"].as_u64().unwrap() <= MIB, "back under maxBytes: {report}");
    assert_eq!(artifacts["overBudgetBytes"], 0, "{report}");

    for (data_ref, text) in live_refs.iter().zip(&live) {
        let (status, bytes) = get_artifact(&gateway, data_ref).await;
        assert_eq!(status, 200, "a live data_ref is never swept");
        assert_eq!(bytes, text.as_bytes(), "a live data_ref opens byte-exact");
    }
    let mut swept = Vec::new();
    for (data_ref, text) in old_refs.iter().zip(&old) {
        let (status, bytes) = get_artifact(&gateway, data_ref).await;
        match status {
            200 => assert_eq!(bytes, text.as_bytes()),
            410 => {
                let body: Value = serde_json::from_slice(&bytes).unwrap();
                assert_eq!(body["error"]["type"], "expired_by_retention_policy", "{body}");
                let message = body["error"]["message"].as_str().unwrap();
                assert!(message.contains("expired by retention policy"), "{message}");
                swept.push(data_ref.clone());
            }
            other => panic!("{data_ref}: unexpected {other}"),
        }
    }
    assert_eq!(swept.len() as u64, artifacts["filesSwept"].as_u64().unwrap(), "{report}");
    let (status, _) = get_artifact(&gateway, &ArtifactRef::for_bytes(b"never stored").to_string()).await;
    assert_eq!(status, 404, "an unknown data_ref is not called expired");

    let metrics = gateway.metrics().await;
    assert!(
        metrics.contains(&format!("strata_gateway_swept_files_total{{kind=\"artifact\"}} {}", swept.len())),
        "{metrics}"
    );
    assert!(metrics.contains("strata_gateway_swept_bytes_total{kind=\"artifact\"}"), "{metrics}");
    let status = gateway.get_json("/strata/v1/status").await;
    assert_eq!(status["sweeper"]["filesSwept"].as_u64().unwrap(), report_total(&report), "{status}");
    assert_eq!(status["volumeRetention"]["artifacts"]["maxBytes"], MIB);

    // The model asks for a swept output after a restart: it is told why it is gone.
    let gateway = gateway.restart().await;
    fake.script([
        Reply::Calls(
            String::new(),
            vec![call("call_read", "strata_read_output", json!({"data_ref": swept[0], "mode": "head"}))],
        ),
        Reply::Text("That log expired.".into()),
    ]);
    let mut follow_up = conversation("live", &live);
    let messages = follow_up["messages"].as_array_mut().unwrap();
    messages.push(json!({"role": "assistant", "content": "ok"}));
    messages.push(json!({"role": "user", "content": "Show the first old log again"}));
    let (status, answer) = gateway.post_json(CHAT, &follow_up, &[]).await;
    assert_eq!(status, 200, "{answer}");
    let last = fake.last();
    let read =
        last["messages"].as_array().unwrap().iter().rev().find(|m| m["role"] == "tool").unwrap()["content"]
            .as_str()
            .unwrap()
            .to_owned();
    assert!(read.contains("expired by retention policy"), "{read}");
}

fn report_total(report: &Value) -> u64 {
    report["kinds"].as_array().unwrap().iter().map(|k| k["filesSwept"].as_u64().unwrap()).sum()
}

/// A stateful conversation of `turns` user messages of about 1 KiB each, one request each.
async fn chat_turns(gateway: &Harness, turns: usize) {
    for turn in 0..turns {
        let text = format!("Step {turn}: {}", "tell me more about the build ".repeat(36));
        let body = json!({"messages": [{"role": "user", "content": text}]});
        let (status, answer) = gateway.post_json(CHAT, &body, &[("x-strata-session", "main")]).await;
        assert_eq!(status, 200, "{answer}");
    }
}

/// The live generation is never deleted, so a journal whose context never reaches the token
/// trigger could still outgrow the volume: over `generations.maxBytes` the sweep compacts it, the
/// superseded generation is swept at once, and the metric and the report say so.
#[tokio::test]
async fn a_live_journal_over_its_byte_budget_is_compacted_by_the_sweep() {
    let fake = FakeUpstream::start().await;
    fake.script((0..30).map(|i| Reply::Text(format!("Noted step {i}; the build is still green."))));
    let gateway = Harness::start_with(
        &fake,
        Provider::OpenAI,
        |config| {
            config.policy.volume.generations = KeepLimits { max_age_seconds: 86_400, max_bytes: 24 * 1024 }
        },
        |_| {},
    )
    .await;
    chat_turns(&gateway, 30).await;
    let before = gateway.get_json("/strata/v1/status").await["generation"].as_u64().unwrap();

    let (status, report) = gateway.post_json("/strata/v1/sweep", &json!({}), &[]).await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["liveGeneration"]["action"], "compacted", "{report}");
    assert!(report["liveGeneration"]["overBudgetBytes"].as_u64().unwrap() > 0, "{report}");
    assert_eq!(kind(&report, "generation")["overBudgetBytes"], 0, "back within budget: {report}");
    assert!(report["removedGenerations"].as_array().unwrap().contains(&json!(before)), "{report}");
    let after = gateway.get_json("/strata/v1/status").await["generation"].as_u64().unwrap();
    assert!(after > before, "a compacted generation is live ({before} -> {after})");
    let metrics = gateway.metrics().await;
    assert!(
        metrics.contains(r#"strata_gateway_live_generation_over_budget_total{action="compacted"} 1"#),
        "{metrics}"
    );

    // The agent goes on from the compacted context, and a sweep within budget does nothing more.
    chat_turns(&gateway, 1).await;
    let (_, calm) = gateway.post_json("/strata/v1/sweep", &json!({}), &[]).await;
    assert!(calm.get("liveGeneration").is_none(), "{calm}");
}

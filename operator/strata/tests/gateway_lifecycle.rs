//! The gateway's lifecycle: budget block and resume, restart on the same data dir, a locked data
//! dir, config hot reload (an API key rotation too), and bad input and upstream failures in the provider's error shape.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod gateway_support;

use std::time::Duration;

use axum::http::header;
use gateway_support::{API_KEY, FakeUpstream, Harness, Reply, args, write_config};
use serde_json::{Value, json};
use strata_api::agent::Provider;
use strata_core::entry::{Content, EntryDraft, EntryKind, RetentionClass, Role};
use strata_core::journal::{
    BaselineEntry, CompactionProposal, StdStorage, propose_compaction, read_current_generation,
};

const CHAT: &str = "/v1/chat/completions";

fn user(text: &str) -> Value {
    json!({"messages": [{"role": "user", "content": text}]})
}

/// Proposes, as another process would (a CompactionJob's `strata compact`), to replace the whole
/// current generation with one summary entry.
fn propose_summary(data_dir: &std::path::Path, text: &str) {
    let snapshot = read_current_generation(&StdStorage, data_dir).unwrap().snapshot();
    let summary = EntryDraft {
        kind: EntryKind::Summary,
        role: Role::User,
        content: Content::text(text),
        retention: RetentionClass::Working,
        created_at_ms: 1,
        tokens: 8,
        artifact_refs: vec![],
    };
    let proposal = CompactionProposal {
        generation: snapshot.generation,
        watermark: snapshot.watermark,
        baseline: vec![BaselineEntry::New(summary)],
        created_at_ms: 2,
    };
    propose_compaction(&StdStorage, data_dir, &proposal).unwrap();
}

#[tokio::test]
async fn a_blocked_request_resumes_once_a_compaction_freed_space() {
    let fake = FakeUpstream::start().await;
    let gateway = Harness::start(&fake, Provider::OpenAI, |config| {
        config.upstream.context_window = 16_000;
        config.policy.budget.reserved_completion_tokens = 1_000;
        config.policy.budget.safety_margin_tokens = 500;
        config.policy.budget.protocol_overhead_tokens = 100;
    })
    .await;
    let session = [("x-strata-session", "main")];
    let filler = "alpha beta gamma delta ".repeat(1_500);
    let (status, answer) = gateway.post_json(CHAT, &user(&filler), &session).await;
    assert_eq!(status, 200, "{answer}");
    let big = "omega sigma kappa ".repeat(3_000);
    let (status, blocked) = gateway.post_json(CHAT, &user(&big), &session).await;
    assert_eq!(status, 400, "{blocked}");
    let error = &blocked["error"];
    assert_eq!(error["type"], "context_budget_exceeded");
    assert_eq!(error["status"], "context_budget_exceeded");
    assert_eq!(error["required_action"], "purge_or_compact");
    assert!(
        error["estimated_result_tokens"].as_u64().unwrap()
            > error["available_operation_tokens"].as_u64().unwrap()
    );
    let operation = error["pending_operation_id"].as_str().unwrap().to_owned();
    assert!(operation.starts_with("op_"));
    assert_eq!(fake.seen().len(), 1, "a blocked request is not forwarded");

    let (status, _) =
        gateway.post_json(&format!("/strata/v1/operations/{operation}/resume"), &json!({}), &[]).await;
    assert_eq!(status, 400, "still blocked while nothing was freed");

    propose_summary(&gateway.data_dir, "The user pasted filler text.");

    let (status, resumed) =
        gateway.post_json(&format!("/strata/v1/operations/{operation}/resume"), &json!({}), &[]).await;
    assert_eq!(status, 200, "{resumed}");
    assert_eq!(resumed["choices"][0]["message"]["content"], "ok");
    let sent = fake.last();
    let texts: Vec<&str> =
        sent["messages"].as_array().unwrap().iter().filter_map(|m| m["content"].as_str()).collect();
    assert!(texts.iter().any(|t| t.contains("The user pasted filler text.")));
    assert!(texts.iter().any(|t| t.contains("omega sigma kappa")));
    assert!(!texts.iter().any(|t| t.contains("alpha beta gamma")));
    let (status, _) =
        gateway.post_json(&format!("/strata/v1/operations/{operation}/resume"), &json!({}), &[]).await;
    assert_eq!(status, 404, "an operation runs once");
    assert!(gateway.metrics().await.contains("strata_gateway_blocked_operations_total 2"));
}

#[tokio::test]
async fn a_compaction_proposal_is_applied_within_seconds_without_traffic() {
    let fake = FakeUpstream::start().await;
    let gateway = Harness::start(&fake, Provider::OpenAI, |_| {}).await;
    let first = json!({"messages": [{"role": "user", "content": "alpha beta gamma"}]});
    gateway.post_json(CHAT, &first, &[]).await;
    propose_summary(&gateway.data_dir, "Greek letters were mentioned.");
    let mut generation = 0;
    for _ in 0..50 {
        generation = gateway.get_json("/strata/v1/status").await["generation"].as_u64().unwrap();
        if generation == 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(generation, 2, "the proposal was applied with no chat request");
    assert_eq!(fake.seen().len(), 1, "and without any upstream call");
    let ids: Vec<String> =
        gateway.entries().await.iter().map(|e| e["id"].as_str().unwrap().to_owned()).collect();
    assert!(ids.iter().all(|id| id.starts_with("summary_")), "{ids:?}");
}

#[tokio::test]
async fn a_restarted_gateway_continues_the_journaled_context() {
    let fake = FakeUpstream::start().await;
    let gateway = Harness::start(&fake, Provider::OpenAI, |_| {}).await;
    let first = json!({"messages": [{"role": "user", "content": "Remember the number 4242."}]});
    gateway.post_json(CHAT, &first, &[]).await;

    let second = strata::gateway::start(&args(&gateway.config_path, &gateway.data_dir)).await;
    let refused = second.expect_err("a second writer must be refused").to_string();
    assert!(refused.contains("data dir") && refused.to_lowercase().contains("lock"), "{refused}");

    let gateway = gateway.restart().await;
    let transparent = json!({"messages": [
        {"role": "user", "content": "Remember the number 4242."},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "What was the number?"}
    ]});
    let (status, _) = gateway.post_json(CHAT, &transparent, &[]).await;
    assert_eq!(status, 200);
    assert_eq!(gateway.entries().await.len(), 4, "after a restart the transparent list is still recognised");
    let (status, _) = gateway.post_json(CHAT, &user("And now?"), &[("x-strata-session", "main")]).await;
    assert_eq!(status, 200);
    let texts: Vec<String> = fake.last()["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["content"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(texts.iter().filter(|t| t.ends_with("Remember the number 4242.")).count(), 1, "{texts:?}");
    assert!(texts.iter().any(|t| t.ends_with("What was the number?")));
    assert!(texts.iter().any(|t| t.ends_with("And now?")));
    assert_eq!(gateway.entries().await.len(), 6);
}

#[tokio::test]
async fn a_corrupt_data_dir_is_refused_with_the_journals_error() {
    let fake = FakeUpstream::start().await;
    let gateway = Harness::start(&fake, Provider::OpenAI, |_| {}).await;
    gateway.post_json(CHAT, &user("hello"), &[("x-strata-session", "s")]).await;
    let Harness { dir: _dir, config_path, data_dir, gateway, .. } = gateway;
    gateway.shutdown().await;
    std::fs::write(data_dir.join("CURRENT"), b"not a generation\n").unwrap();
    let error =
        strata::gateway::start(&args(&config_path, &data_dir)).await.expect_err("corrupt dir accepted");
    let message = error.to_string();
    assert!(message.contains("CURRENT"), "{message}");
}

#[tokio::test]
async fn policy_and_prefix_changes_are_hot_reloaded() {
    let fake = FakeUpstream::start().await;
    let gateway = Harness::start(&fake, Provider::OpenAI, |_| {}).await;
    let session = [("x-strata-session", "main")];
    gateway.post_json(CHAT, &user("one"), &session).await;
    let mut config: strata_api::gateway_config::GatewayConfig =
        serde_json::from_slice(&std::fs::read(&gateway.config_path).unwrap()).unwrap();
    config.stable_prefix.system_prompt = "You are builder, now reviewing pull requests.".into();
    config.upstream.context_window = 64_000;
    write_config(&gateway.config_path, &config);
    let mut reloaded = false;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if gateway.get_json("/strata/v1/status").await["context"]["limit"] == 64_000 {
            reloaded = true;
            break;
        }
    }
    assert!(reloaded, "the new context window was not picked up");
    gateway.post_json(CHAT, &user("two"), &session).await;
    let system = fake.last()["messages"][0]["content"].as_str().unwrap().to_owned();
    assert!(system.contains("reviewing pull requests"), "{system}");
    let inspect = gateway.get_json("/strata/v1/inspect?limit=1").await;
    assert_eq!(inspect["requests"][0]["rounds"][0]["churn"], "system");

    std::fs::write(&gateway.config_path, b"{ not json").unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let (status, _) = gateway.post_json(CHAT, &user("three"), &session).await;
    assert_eq!(status, 200, "a broken file keeps the previous config in force");
}

/// The `Authorization` the upstream saw last.
fn authorization(fake: &FakeUpstream) -> String {
    let last = fake.seen().pop().expect("the upstream was called");
    last.headers[header::AUTHORIZATION].to_str().unwrap().to_owned()
}

/// Swaps `key` into the harness's API key file as the kubelet updates a mounted Secret: a new file
/// renamed over the old one, with the gateway.json that names it unchanged.
fn swap_in_key(gateway: &Harness, key: &str) {
    let fresh = gateway.dir.path().join("api-key.new");
    std::fs::write(&fresh, format!("{key}\n")).unwrap();
    std::fs::rename(&fresh, gateway.dir.path().join("api-key")).unwrap();
}

/// Sends turns until the upstream is sent another key than the harness's first (for at most five
/// seconds), and returns the `Authorization` it saw last.
async fn authorization_after_rotation(gateway: &Harness, fake: &FakeUpstream) -> String {
    let mut sent = String::new();
    for turn in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (code, _) =
            gateway.post_json(CHAT, &user(&format!("turn {turn}")), &[("x-strata-session", "main")]).await;
        assert_eq!(code, 200);
        sent = authorization(fake);
        if sent != format!("Bearer {API_KEY}") {
            break;
        }
    }
    sent
}

/// The gateway's status once the config in force is `in_force` (or after ten seconds).
async fn status_once_in_force(gateway: &Harness, in_force: &str) -> Value {
    let mut status = Value::Null;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        status = gateway.get_json("/strata/v1/status").await;
        if status["config"]["inForce"] == in_force {
            break;
        }
    }
    status
}

#[tokio::test]
async fn a_rotated_api_key_is_sent_without_a_restart() {
    let fake = FakeUpstream::start().await;
    let gateway = Harness::start(&fake, Provider::OpenAI, |_| {}).await;
    gateway.post_json(CHAT, &user("one"), &[("x-strata-session", "main")]).await;
    assert_eq!(authorization(&fake), format!("Bearer {API_KEY}"));

    swap_in_key(&gateway, "sk-rotated-key");
    let sent = authorization_after_rotation(&gateway, &fake).await;
    assert_eq!(sent, "Bearer sk-rotated-key", "the rotated key was not picked up");
    let status = gateway.get_json("/strata/v1/status").await;
    assert_eq!(status["config"], json!({"inForce": "file"}));

    std::fs::remove_file(gateway.dir.path().join("api-key")).unwrap();
    let status = status_once_in_force(&gateway, "previous").await;
    assert_eq!(status["config"]["inForce"], "previous", "a vanished key file is reported: {status}");
    let problem = status["config"]["error"].as_str().unwrap_or_default();
    assert!(problem.contains("api-key"), "{problem}");
    let (code, _) = gateway.post_json(CHAT, &user("after"), &[("x-strata-session", "main")]).await;
    assert_eq!(code, 200, "the key in force keeps serving");
    assert_eq!(authorization(&fake), "Bearer sk-rotated-key");

    // The same key back: the file is usable again, so the problem clears.
    swap_in_key(&gateway, "sk-rotated-key");
    let status = status_once_in_force(&gateway, "file").await;
    assert_eq!(status["config"], json!({"inForce": "file"}), "the restored key file clears the problem");
}

/// A key rotated while gateway.json on disk is broken still reaches the upstream: the config in
/// force takes the new key, and the broken file stays reported.
#[tokio::test]
async fn a_key_rotated_while_the_config_file_is_broken_is_still_sent() {
    let fake = FakeUpstream::start().await;
    let gateway = Harness::start(&fake, Provider::OpenAI, |_| {}).await;
    std::fs::write(&gateway.config_path, b"{ not json").unwrap();
    let status = status_once_in_force(&gateway, "previous").await;
    assert_eq!(status["config"]["inForce"], "previous", "{status}");

    swap_in_key(&gateway, "sk-rotated-meanwhile");
    let sent = authorization_after_rotation(&gateway, &fake).await;
    assert_eq!(sent, "Bearer sk-rotated-meanwhile", "the rotated key was not put in force");
    let status = gateway.get_json("/strata/v1/status").await;
    assert_eq!(status["config"]["inForce"], "previous", "the broken file is still reported: {status}");
}

#[tokio::test]
async fn bad_input_and_upstream_failures_answer_in_the_providers_shape() {
    let fake = FakeUpstream::start().await;
    let gateway = Harness::start(&fake, Provider::OpenAI, |config| config.upstream.timeout_seconds = 1).await;
    let client = reqwest::Client::new();
    let response = client.post(gateway.url(CHAT)).body("{not json").send().await.unwrap();
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert!(body["error"]["message"].as_str().unwrap().contains("not valid JSON"));

    let (status, body) =
        gateway.post_json(CHAT, &json!({"messages": [{"role": "user", "content": "x"}], "n": 2}), &[]).await;
    assert_eq!((status, body["error"]["type"].as_str()), (400, Some("invalid_request_error")));

    let huge = "x".repeat(2 * 1024 * 1024);
    let (status, body) = gateway.post_json(CHAT, &user(&huge), &[]).await;
    assert_eq!(status, 413);
    assert_eq!(body["error"]["type"], "request_too_large");

    let upstream_error = r#"{"error":{"message":"Rate limit reached","type":"rate_limit_error"}}"#;
    fake.script([Reply::Error(429, upstream_error.into())]);
    let (status, text) = gateway.post(CHAT, &user("rate limited"), &[]).await;
    assert_eq!((status, text.as_str()), (429, upstream_error), "upstream errors pass through unchanged");

    fake.script([Reply::Delayed(Duration::from_secs(3), Box::new(Reply::Text("late".into())))]);
    let (status, body) = gateway.post_json(CHAT, &user("slow"), &[]).await;
    assert_eq!(status, 504, "{body}");
    assert_eq!(body["error"]["type"], "upstream_timeout");
    assert!(body["error"]["message"].as_str().unwrap().contains("did not answer within 1s"));

    let (status, body) = gateway.post_json("/v1/messages", &json!({"messages": []}), &[]).await;
    assert_eq!(status, 400);
    assert_eq!(body["type"], "error", "Anthropic shape on the Anthropic route");

    let models = gateway.get_json("/v1/models").await;
    assert_eq!(models["data"][0]["id"], "fake-model");
    let health = client.get(gateway.url("/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    let ready = client.get(gateway.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 200);

    // Chat requests are served before the router; other methods and near paths still reach it.
    for path in [CHAT, "/v1/messages"] {
        let wrong_method = client.get(gateway.url(path)).send().await.unwrap();
        assert_eq!(wrong_method.status(), 405, "GET {path}");
        assert_eq!(wrong_method.headers()["allow"], "POST", "GET {path}");
    }
    let near_path = client.post(gateway.url("/v1/chat/completions/")).json(&user("x")).send().await.unwrap();
    assert_eq!(near_path.status(), 404);
}

#[tokio::test]
async fn the_prompt_prefix_is_byte_stable_across_turns_and_restarts() {
    let fake = FakeUpstream::start().await;
    fake.script([
        Reply::Text("first".into()),
        Reply::Calls(String::new(), vec![gateway_support::call("call_1", "lookup", json!({"q": "x"}))]),
    ]);
    let mut gateway = Harness::start(&fake, Provider::OpenAI, |_| {}).await;
    let session = [("x-strata-session", "main")];
    let tools =
        json!([{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]);
    let turns = [
        json!([{"role": "user", "content": "one"}]),
        json!([{"role": "user", "content": "two"}]),
        json!([{"role": "tool", "tool_call_id": "call_1", "content": "result"}]),
        json!([{"role": "user", "content": "three"}]),
        json!([{"role": "user", "content": "four"}]),
    ];
    for (index, messages) in turns.iter().enumerate() {
        if index == 3 {
            gateway = gateway.restart().await;
        }
        let (status, _) =
            gateway.post_json(CHAT, &json!({"messages": messages, "tools": tools}), &session).await;
        assert_eq!(status, 200);
    }
    let seen = fake.seen();
    for pair in seen.windows(2) {
        let before = &pair[0].raw;
        let telemetry = before.rfind("Status: Context:").unwrap();
        let cut = before[..telemetry].rfind('{').unwrap();
        assert!(
            pair[1].raw.starts_with(&before[..cut]),
            "the cached prefix changed:\n{before}\n{}",
            pair[1].raw
        );
    }
}

#[tokio::test]
async fn old_large_tool_results_are_elided_and_stay_elided_after_a_restart() {
    let fake = FakeUpstream::start().await;
    fake.script([Reply::Calls(
        String::new(),
        vec![gateway_support::call("call_big", "read_file", json!({}))],
    )]);
    // The 5.4k-character output must stay under the spill threshold to reach elision.
    let mut gateway =
        Harness::start(&fake, Provider::OpenAI, |config| config.policy.tool_results.max_result_chars = 8_000)
            .await;
    let session = [("x-strata-session", "main")];
    gateway.post_json(CHAT, &user("Read the file."), &session).await;
    let output: String =
        (0..120).map(|line| format!("{line:>4}: fn handler() {{ retry(3); log(\"ok\"); }}\n")).collect();
    let result = json!({"messages": [{"role": "tool", "tool_call_id": "call_big", "content": output}]});
    let (status, _) = gateway.post_json(CHAT, &result, &session).await;
    assert_eq!(status, 200);
    for round in 0..6 {
        gateway.post_json(CHAT, &user(&format!("Next step {round}.")), &session).await;
    }
    let elided = |body: &Value| {
        body["messages"].as_array().unwrap().iter().any(|m| {
            m["role"] == "tool"
                && m["content"].as_str().unwrap().contains("[strata: output elided: kept first 800")
        })
    };
    assert!(elided(&fake.last()), "the old result was not elided");
    let listing = gateway.entries().await;
    assert!(listing.iter().any(|e| e["reason"] == "elided"), "{listing:?}");
    assert!(!gateway.metrics().await.contains("strata_gateway_elided_tokens_total 0"));
    gateway = gateway.restart().await;
    gateway.post_json(CHAT, &user("After the restart."), &session).await;
    assert!(elided(&fake.last()), "the elision was lost in the restart");
}

#[tokio::test]
async fn expired_heartbeats_leave_the_window_and_stay_out_after_a_restart() {
    use strata_api::policy::{RetentionClass as Class, RetentionMatch, RetentionRule};
    let fake = FakeUpstream::start().await;
    let gateway = Harness::start(&fake, Provider::OpenAI, |config| {
        config.policy.retention.rules = vec![RetentionRule {
            name: "heartbeats".into(),
            class: Class::Ephemeral,
            matcher: RetentionMatch { content_regex: Some("^HEARTBEAT".into()), ..RetentionMatch::default() },
            ttl_seconds: Some(1),
        }];
    })
    .await;
    let mut history = vec![json!({"role": "user", "content": "HEARTBEAT: check in."})];
    let (_, answer) = gateway.post_json(CHAT, &json!({"messages": history}), &[]).await;
    history.push(answer["choices"][0]["message"].clone());
    // Past twice the TTL, the next turn's expiry batch is forced.
    tokio::time::sleep(Duration::from_millis(2_300)).await;
    history.push(json!({"role": "user", "content": "Now fix auth.py."}));
    let (_, answer) = gateway.post_json(CHAT, &json!({"messages": history}), &[]).await;
    history.push(answer["choices"][0]["message"].clone());
    history.push(json!({"role": "user", "content": "And run the tests."}));
    let (status, _) = gateway.post_json(CHAT, &json!({"messages": history.clone()}), &[]).await;
    assert_eq!(status, 200);
    let sent = fake.last().to_string();
    assert!(!sent.contains("HEARTBEAT: check in."), "the expired heartbeat was sent: {sent}");
    assert!(sent.contains("Now fix auth.py.") && sent.contains("And run the tests."), "{sent}");
    let journaled = gateway.entries().await;
    assert!(
        journaled.iter().any(|e| e["retention"] == "ephemeral" || e["retention"] == "Ephemeral"),
        "{journaled:?}"
    );

    let gateway = gateway.restart().await;
    history.push(json!({"role": "assistant", "content": "ok"}));
    history.push(json!({"role": "user", "content": "Status?"}));
    let (status, _) = gateway.post_json(CHAT, &json!({"messages": history}), &[]).await;
    assert_eq!(status, 200);
    assert!(!fake.last().to_string().contains("HEARTBEAT: check in."), "expiry survives a restart");
}

#[tokio::test]
async fn the_user_can_trigger_a_compaction_over_http() {
    let fake = FakeUpstream::start().await;
    let gateway = Harness::start(&fake, Provider::OpenAI, |_| {}).await;
    let mut history = Vec::new();
    for turn in 0..7 {
        history.push(json!({"role": "user", "content": format!("Step {turn}: decided to keep the API stable; TODO check step {turn}.")}));
        let (_, answer) = gateway.post_json(CHAT, &json!({"messages": history}), &[]).await;
        history.push(answer["choices"][0]["message"].clone());
    }
    let before = gateway.get_json("/strata/v1/status").await;
    let (status, record) = gateway
        .post_json("/strata/v1/compact", &json!({"resumeInstruction": "Continue with step 7."}), &[])
        .await;
    assert_eq!(status, 200, "{record}");
    assert!(record["compactionId"].as_str().unwrap().starts_with("cmp:"), "{record}");
    assert_eq!(record["qualityCheck"], "Passed");
    assert!(record["resultGeneration"].as_u64() > record["sourceGeneration"].as_u64(), "{record}");
    let after = gateway.get_json("/strata/v1/status").await;
    assert!(after["generation"].as_u64() > before["generation"].as_u64());
    let entries = gateway.entries().await;
    assert!(entries.iter().any(|e| e["id"].as_str().unwrap().starts_with("summary_")), "{entries:?}");

    let (status, error) = gateway.post_json("/strata/v1/compact", &json!({"mode": "Rollback"}), &[]).await;
    assert_eq!(status, 400, "{error}");
    assert!(error.to_string().contains("run as CompactionJobs"), "{error}");
}

#[tokio::test]
async fn a_journal_created_by_another_agent_is_refused_until_adopted_on_purpose() {
    let fake = FakeUpstream::start().await;
    fake.script([Reply::Text("noted".into())]);
    let first = Harness::start(&fake, Provider::OpenAI, |config| {
        config.agent.uid = Some("uid-of-the-first-builder".into());
    })
    .await;
    let (status, _) = first.post_json(CHAT, &user("the first agent's secret plan"), &[]).await;
    assert_eq!(status, 200);
    let Harness { dir, config_path, data_dir, gateway, .. } = first;
    gateway.shutdown().await;
    let owner = strata_core::journal::read_owner(&StdStorage, &data_dir).unwrap().unwrap();
    assert_eq!(owner.agent_uid, "uid-of-the-first-builder");
    assert_eq!(owner.agent, "rateright/builder");

    // A new Agent with the same name (another UID) gets the retained volume.
    let mut config: strata_api::gateway_config::GatewayConfig =
        serde_json::from_slice(&std::fs::read(&config_path).unwrap()).unwrap();
    config.agent.uid = Some("uid-of-the-second-builder".into());
    write_config(&config_path, &config);
    let error = strata::gateway::start(&args(&config_path, &data_dir)).await.unwrap_err().to_string();
    assert!(error.contains("belongs to Agent rateright/builder (uid uid-of-the-first-builder)"), "{error}");
    assert!(error.contains("refusing to serve another agent's history"), "{error}");
    assert!(error.contains("strata.dev/adopt-journal-from-uid=uid-of-the-first-builder"), "{error}");

    // Adopting it on purpose, by the previous owner's UID, serves the old history.
    config.agent.adopt_journal_from_uid = Some("uid-of-the-first-builder".into());
    write_config(&config_path, &config);
    let adopted = strata::gateway::start(&args(&config_path, &data_dir)).await.unwrap();
    let owner = strata_core::journal::read_owner(&StdStorage, &data_dir).unwrap().unwrap();
    assert_eq!(owner.agent_uid, "uid-of-the-second-builder");
    assert_eq!(owner.adopted_from_uid.as_deref(), Some("uid-of-the-first-builder"));
    adopted.shutdown().await;
    drop(dir);
}

/// A client that closes its connection while its request is with the upstream cancels the request:
/// the upstream call is dropped, so its late answer is never journaled (the client's turn is), and
/// the gateway goes on serving. The gateway's server does not read from a connection while it
/// serves a request on it (`http_serve`), so this is its own watch on the client, not hyper's.
#[tokio::test]
async fn a_client_that_leaves_cancels_its_upstream_call() {
    use tokio::io::AsyncWriteExt;
    let fake = FakeUpstream::start().await;
    let upstream_delay = Duration::from_millis(1500);
    fake.script([Reply::Delayed(upstream_delay, Box::new(Reply::Text("the late answer".into())))]);
    let gateway = Harness::start(&fake, Provider::OpenAI, |_| {}).await;
    let body = user("asked and left").to_string();
    let request = format!(
        "POST {CHAT} HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut client = tokio::net::TcpStream::connect(gateway.gateway.address).await.unwrap();
    client.write_all(request.as_bytes()).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while fake.seen().is_empty() {
        assert!(std::time::Instant::now() < deadline, "the upstream never got the call");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let called = std::time::Instant::now();
    drop(client);

    // Past the moment the upstream answers, with a margin.
    tokio::time::sleep_until((called + upstream_delay + Duration::from_millis(700)).into()).await;
    let roles: Vec<String> =
        gateway.entries().await.iter().map(|entry| entry["role"].as_str().unwrap().to_owned()).collect();
    assert_eq!(roles, ["user"], "the client's turn is journaled, the cancelled call's answer is not");

    fake.script([Reply::Text("served".into())]);
    let (status, answer) = gateway.post_json(CHAT, &user("still here"), &[]).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["choices"][0]["message"]["content"], "served");
}

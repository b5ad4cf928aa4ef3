//! Seed 001 §17.24, one test per acceptance criterion (`criterion_NN_…`), on the real gateway over
//! HTTP in front of the in-process fake upstream where the criterion is about the sidecar.
//! Criteria 6 and 8 are in `operator/core/tests/conformance_17_24.rs`; criterion 14's evaluation
//! suite belongs to the agent runtime (README, "Conformance to §17.24").
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod gateway_support;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use gateway_support::{FakeUpstream, Harness, args, write_config};
use serde_json::{Value, json};
use strata_api::agent::Provider;
use strata_api::gateway_config::GatewayConfig;
use strata_core::artifacts::ArtifactRef;
use strata_core::cache_key::{
    CacheKeyInputs, MasterKey, RuntimeBinding, authorization_fingerprint, bind_runtime, compute_cache_key,
    derive_tenant_key,
};
use strata_core::prefix::{
    CANONICALIZATION_VERSION, PrefixError, StablePrefix, StablePrefixSources, ToolRegistry,
};
use strata_core::tokens::{TokenCounter, TokenizerKind};

const CHAT: &str = "/v1/chat/completions";

/// An edit of gateway.json.
type ConfigEdit = Box<dyn FnOnce(&mut GatewayConfig)>;

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

fn tool(name: &str) -> Value {
    json!({"type": "function", "function": {"name": name, "description": format!("The {name} tool"), "parameters": {"type": "object"}}})
}

/// The upstream body's Tier 1: the system message and the tool list.
fn tier1(body: &Value) -> (Value, Value) {
    (body["messages"][0].clone(), body["tools"].clone())
}

fn config_of(gateway: &Harness) -> GatewayConfig {
    serde_json::from_slice(&std::fs::read(&gateway.config_path).unwrap()).unwrap()
}

/// Rewrites gateway.json with `edit` and waits until the gateway serves under another upstream
/// cache key (the reload is polled once a second).
async fn reload(gateway: &Harness, edit: impl FnOnce(&mut GatewayConfig)) -> String {
    let before = gateway.get_json("/strata/v1/status").await["upstreamCacheKeyShort"].clone();
    let mut config = config_of(gateway);
    edit(&mut config);
    write_config(&gateway.config_path, &config);
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = gateway.get_json("/strata/v1/status").await["upstreamCacheKeyShort"].clone();
        if now != before {
            return now.as_str().unwrap().to_owned();
        }
    }
    panic!("the gateway did not pick up the new config");
}

async fn metrics_get(gateway: &Harness, path: &str) -> (u16, String) {
    let url = format!("http://{}{path}", gateway.gateway.metrics_address);
    let response = gateway.client.get(url).send().await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

fn counter() -> TokenCounter {
    TokenCounter::new(TokenizerKind::Approximate).unwrap()
}

fn sources() -> StablePrefixSources {
    StablePrefixSources {
        system_prompt: "You are builder.\r\nKeep the API stable.  \n\n\n".into(),
        tools: vec![tool("read_file"), tool("run_tests")],
        constants: [("repo".to_owned(), "rateright".to_owned())].into(),
    }
}

#[tokio::test]
async fn criterion_01_identical_stable_inputs_give_an_identical_prefix_and_hash() {
    let first = StablePrefix::build(&sources(), &mut ToolRegistry::new(), &counter()).unwrap();
    let second = StablePrefix::build(&sources(), &mut ToolRegistry::new(), &counter()).unwrap();
    assert_eq!(first.text().as_bytes(), second.text().as_bytes());
    assert_eq!(first.manifest(), second.manifest());
    let master = MasterKey::new(vec![3; 32]).unwrap();
    let key = |prefix: &StablePrefix| {
        let inputs = CacheKeyInputs::for_prefix(
            "ns-uid",
            "tenant",
            "openai",
            "gpt-5",
            TokenizerKind::O200kBase,
            prefix.manifest(),
        )
        .unwrap();
        compute_cache_key(&derive_tenant_key(&master, "ns-uid", 0).unwrap(), &inputs).unwrap()
    };
    assert_eq!(key(&first), key(&second));

    // Two gateways with the same config and the same request send the same Tier 1 and cache key.
    let fake = FakeUpstream::start().await;
    let request = json!({"messages": [{"role": "system", "content": "Answer briefly."}, user("Hello")], "tools": [tool("read_file")]});
    let mut bodies = Vec::new();
    for _ in 0..2 {
        let gateway = Harness::start(&fake, Provider::OpenAI, |_| {}).await;
        let (status, answer) = gateway.post_json(CHAT, &request, &[]).await;
        assert_eq!(status, 200, "{answer}");
        bodies.push(fake.last());
    }
    assert_eq!(tier1(&bodies[0]), tier1(&bodies[1]));
    assert_eq!(bodies[0]["prompt_cache_key"], bodies[1]["prompt_cache_key"]);
}

#[tokio::test]
async fn criterion_02_changing_only_the_request_keeps_the_stable_prefix_hash() {
    let fake = FakeUpstream::start().await;
    let gateway = Harness::start(&fake, Provider::OpenAI, |_| {}).await;
    let system = json!({"role": "system", "content": "Answer briefly."});
    let mut history = vec![system, user("What is in src/main.rs?")];
    let (_, answer) =
        gateway.post_json(CHAT, &json!({"messages": history, "tools": [tool("read_file")]}), &[]).await;
    let first = fake.last();
    history.push(answer["choices"][0]["message"].clone());
    history.push(user("And in src/lib.rs? Something else entirely."));
    gateway.post_json(CHAT, &json!({"messages": history, "tools": [tool("read_file")]}), &[]).await;
    let second = fake.last();
    assert_eq!(tier1(&first), tier1(&second));
    assert_eq!(first["prompt_cache_key"], second["prompt_cache_key"]);
    let inspect = gateway.get_json("/strata/v1/inspect?limit=2").await;
    let rounds: Vec<&Value> =
        inspect["requests"].as_array().unwrap().iter().map(|r| &r["rounds"][0]).collect();
    let tier1_hashes = |round: &Value| -> Vec<Value> {
        round["sections"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["id"].as_str().unwrap().starts_with("tier1."))
            .map(|s| s["hash"].clone())
            .collect()
    };
    assert_eq!(tier1_hashes(rounds[0]), tier1_hashes(rounds[1]));
    assert_eq!(rounds[0]["churn"], "none", "the newer request did not change the prefix: {inspect}");
}

#[tokio::test]
async fn criterion_03_material_changes_prevent_incompatible_reuse() {
    // The controller's key: model, tokenizer, tenant, privacy scope, capability contract (tools),
    // system policy and canonicalisation version.
    let master = MasterKey::new(vec![3; 32]).unwrap();
    let prefix = StablePrefix::build(&sources(), &mut ToolRegistry::new(), &counter()).unwrap();
    let base = CacheKeyInputs::for_prefix(
        "ns",
        "tenant",
        "openai",
        "gpt-5",
        TokenizerKind::O200kBase,
        prefix.manifest(),
    )
    .unwrap();
    let key = |inputs: &CacheKeyInputs| {
        compute_cache_key(&derive_tenant_key(&master, &inputs.tenant, 0).unwrap(), inputs).unwrap()
    };
    let mut more_tools = sources();
    more_tools.tools.push(tool("deploy"));
    let other_tools = StablePrefix::build(&more_tools, &mut ToolRegistry::new(), &counter()).unwrap();
    let changes: Vec<(&str, CacheKeyInputs)> = vec![
        ("model", CacheKeyInputs { model: "gpt-5-mini".into(), ..base.clone() }),
        (
            "tokenizer",
            CacheKeyInputs { tokenizer: TokenizerKind::Cl100kBase.as_str().into(), ..base.clone() },
        ),
        ("tenant", CacheKeyInputs { tenant: "other-ns".into(), ..base.clone() }),
        ("privacy scope", CacheKeyInputs { privacy_scope: "user:ana".into(), ..base.clone() }),
        (
            "capability contract",
            CacheKeyInputs::for_prefix(
                "ns",
                "tenant",
                "openai",
                "gpt-5",
                TokenizerKind::O200kBase,
                other_tools.manifest(),
            )
            .unwrap(),
        ),
        ("system policy", CacheKeyInputs { system_policy_hash: "00".repeat(32), ..base.clone() }),
        (
            "canonicalization version",
            CacheKeyInputs { canonicalization_version: "strata.canon/v0".into(), ..base.clone() },
        ),
    ];
    assert_eq!(base.canonicalization_version, CANONICALIZATION_VERSION);
    for (dimension, changed) in &changes {
        assert_ne!(key(changed), key(&base), "a {dimension} change keeps the controller's key");
    }
    // The serving side's binding: adapter, runtime, policy version and authorization.
    let binding = RuntimeBinding {
        tenant: "ns".into(),
        privacy_scope: "tenant".into(),
        model: "gpt-5".into(),
        tokenizer: TokenizerKind::O200kBase.as_str().into(),
        policy_version: "11".repeat(32),
        adapter: strata::gateway::config::adapter_id(Provider::OpenAI).into(),
        runtime: strata::gateway::config::RUNTIME_IDENTITY.into(),
        authorization: authorization_fingerprint(Some("sk-a")),
        epoch: 0,
    };
    let bound = bind_runtime(key(&base).as_hex(), &binding);
    for (dimension, changed) in [
        (
            "adapter",
            RuntimeBinding {
                adapter: strata::gateway::config::adapter_id(Provider::OpenAICompatible).into(),
                ..binding.clone()
            },
        ),
        ("runtime", RuntimeBinding { runtime: "strata-gateway/99.0.0".into(), ..binding.clone() }),
        ("policy", RuntimeBinding { policy_version: "22".repeat(32), ..binding.clone() }),
        (
            "authorization",
            RuntimeBinding { authorization: authorization_fingerprint(Some("sk-b")), ..binding.clone() },
        ),
    ] {
        assert_ne!(
            bind_runtime(key(&base).as_hex(), &changed),
            bound,
            "a {dimension} change keeps the bound key"
        );
    }

    // Live: a policy edit, a model change and a new credential each give another upstream key,
    // and the response cache does not answer across them.
    let fake = FakeUpstream::start().await;
    let gateway = Harness::start(&fake, Provider::OpenAI, |config| {
        config.policy.cache.response_cache_ttl_seconds = 600;
    })
    .await;
    let question = json!({"messages": [user("What is 2 + 2?")]});
    gateway.post_json(CHAT, &question, &[]).await;
    gateway.post_json(CHAT, &question, &[]).await;
    assert_eq!(fake.seen().len(), 1, "the identical request is answered from the response cache");
    let mut keys = BTreeSet::from([fake.last()["prompt_cache_key"].as_str().unwrap().to_owned()]);
    let key_file = gateway.dir.path().join("api-key-2");
    std::fs::write(&key_file, "sk-another-upstream-key\n").unwrap();
    let edits: Vec<(&str, ConfigEdit)> = vec![
        ("policy", Box::new(|c: &mut GatewayConfig| c.policy.budget.warning_percent -= 1)),
        ("model", Box::new(|c: &mut GatewayConfig| c.upstream.model = "fake-model-2".into())),
        (
            "authorization",
            Box::new(move |c: &mut GatewayConfig| {
                c.upstream.api_key_file = Some(key_file.display().to_string())
            }),
        ),
    ];
    for (dimension, edit) in edits {
        let calls = fake.seen().len();
        let short = reload(&gateway, edit).await;
        gateway.post_json(CHAT, &question, &[]).await;
        assert_eq!(
            fake.seen().len(),
            calls + 1,
            "after a {dimension} change the cached answer is not reused"
        );
        let sent = fake.last()["prompt_cache_key"].as_str().unwrap().to_owned();
        assert!(sent.starts_with(&short), "{sent} is the key in force ({short})");
        assert!(keys.insert(sent), "a {dimension} change reused an upstream cache key");
    }
}

/// An Anthropic body's content blocks in prompt order: system, then each message's.
fn prompt_blocks(body: &Value) -> Vec<Value> {
    let mut blocks: Vec<Value> = body["system"].as_array().cloned().unwrap_or_default();
    for message in body["messages"].as_array().unwrap() {
        match &message["content"] {
            Value::Array(content) => blocks.extend(content.iter().cloned()),
            text => blocks.push(json!({"type": "text", "text": text})),
        }
    }
    blocks
}

#[tokio::test]
async fn criterion_04_no_volatile_material_before_the_cache_boundary() {
    // The operator's stable prefix refuses volatile material outright.
    let mut dated = sources();
    dated.system_prompt = "You are builder. Today is 2026-12-01 03:00:00 UTC.".into();
    let refused = StablePrefix::build(&dated, &mut ToolRegistry::new(), &counter()).unwrap_err();
    assert!(matches!(refused, PrefixError::VolatileMaterial { .. }), "{refused}");

    // A client's dated system prompt and reordered tools: Tier 1 stays byte-stable, the volatile
    // lines and the telemetry (usage counters) go below the boundary.
    let fake = FakeUpstream::start().await;
    let gateway = Harness::start(&fake, Provider::Anthropic, |_| {}).await;
    let mut bodies = Vec::new();
    for (date, request_id, tools) in [
        ("2026-12-01", "4f1c2a9e-8b7d-4c1e-9f3a-1b2c3d4e5f60", vec!["read_file", "run_tests"]),
        ("2026-12-02", "0a9b8c7d-6e5f-4a3b-9c2d-1e0f9a8b7c6d", vec!["run_tests", "read_file"]),
    ] {
        let system = format!("You are a coding agent.\nToday's date: {date}\nRequest id: {request_id}");
        let tools: Vec<Value> = tools
            .iter()
            .map(|name| json!({"name": name, "description": format!("The {name} tool"), "input_schema": {"type": "object"}}))
            .collect();
        let body = json!({"model": "m", "max_tokens": 256, "system": system, "tools": tools,
                          "messages": [user("Run the tests")]});
        let (status, answer) = gateway.post_json("/v1/messages", &body, &[]).await;
        assert_eq!(status, 200, "{answer}");
        bodies.push((fake.last(), date, request_id));
    }
    let stable = |body: &Value| (body["system"][0].clone(), body["tools"].clone());
    assert_eq!(stable(&bodies[0].0), stable(&bodies[1].0), "Tier 1 changed with the date or the tool order");
    for (body, date, request_id) in &bodies {
        let tier1 = serde_json::to_string(&stable(body)).unwrap();
        for volatile in [*date, *request_id, "Status: Context"] {
            assert!(!tier1.contains(volatile), "{volatile} before the cache boundary: {tier1}");
        }
        let whole = body.to_string();
        assert!(
            whole.contains(date) && whole.contains(request_id),
            "the volatile lines still reach the model"
        );
        // The boundary: every volatile block comes after the last cache breakpoint.
        let blocks = prompt_blocks(body);
        let last_breakpoint = blocks.iter().rposition(|b| b.get("cache_control").is_some()).unwrap();
        let first_volatile =
            blocks.iter().position(|b| b["text"].as_str().is_some_and(|t| t.contains(date))).unwrap();
        assert!(first_volatile > last_breakpoint, "{date} is inside the cached prefix: {body}");
        let first_telemetry = blocks
            .iter()
            .position(|b| b["text"].as_str().is_some_and(|t| t.contains("Status: Context")))
            .unwrap();
        assert!(first_telemetry > last_breakpoint, "the usage counters are inside the cached prefix");
    }
}

#[tokio::test]
async fn criterion_05_every_injected_item_has_reason_source_privacy_scope_trust_class_and_tokens() {
    let fake = FakeUpstream::start().await;
    let gateway = Harness::start(&fake, Provider::OpenAI, |_| {}).await;
    let messages = json!([
        {"role": "system", "content": "Answer briefly."},
        user("Check the log"),
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_log", "type": "function", "function": {"name": "read_log", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_log", "content": "all green"}
    ]);
    gateway.post_json(CHAT, &json!({"messages": messages, "tools": [tool("read_log")]}), &[]).await;
    let inspect = gateway.get_json("/strata/v1/inspect").await;
    let decisions = inspect["decisions"].as_array().unwrap();
    assert!(decisions.len() >= 7, "{inspect}");
    for decision in decisions {
        for field in ["reason", "source", "privacyScope", "trustClass"] {
            assert!(decision[field].as_str().is_some_and(|v| !v.is_empty()), "{field} missing: {decision}");
        }
        assert!(decision["tokens"].is_u64(), "{decision}");
        assert_eq!(decision["privacyScope"], "tenant");
    }
    let trust: BTreeSet<(&str, &str)> = decisions
        .iter()
        .map(|d| (d["source"].as_str().unwrap(), d["trustClass"].as_str().unwrap()))
        .collect();
    for wanted in [
        ("stable_prefix.system", "instruction"),
        ("stable_prefix.tools", "contract"),
        ("client.user", "user"),
        ("model", "model"),
        ("tool", "tool_output"),
        ("strata.telemetry", "gateway"),
    ] {
        assert!(trust.contains(&wanted), "no {wanted:?} in {trust:?}");
    }
    let entries = gateway.entries().await;
    assert!(
        entries.iter().all(|e| e["trustClass"].is_string() && e["privacyScope"] == "tenant"),
        "{entries:?}"
    );
}

#[tokio::test]
async fn criterion_07_large_logs_and_documents_remain_external_artifacts() {
    let fake = FakeUpstream::start().await;
    let gateway = Harness::start(&fake, Provider::OpenAI, |_| {}).await;
    let log: String =
        (0..3_000).map(|line| format!("build line {line:04}: compiling crate {line}\n")).collect();
    let data_ref = ArtifactRef::for_bytes(log.as_bytes()).to_string();
    let messages = json!([
        user("Why did the build fail?"),
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_build", "type": "function", "function": {"name": "build", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_build", "content": log}
    ]);
    gateway.post_json(CHAT, &json!({"messages": messages}), &[]).await;
    let sent = fake.last().to_string();
    assert!(sent.contains(&data_ref), "the window names the artifact");
    assert!(
        sent.len() < log.len() / 4,
        "the log itself stayed out of the prompt ({} bytes sent)",
        sent.len()
    );
    let (status, stored) = metrics_get(&gateway, &format!("/strata/v1/artifacts/{data_ref}")).await;
    assert_eq!(status, 200);
    assert_eq!(stored, log, "the artifact holds the log byte-exact");
}

/// A session whose opening turns hold every kind of state compaction must keep; returns the
/// client's history.
async fn stateful_session(gateway: &Harness) -> Vec<Value> {
    let mut history = vec![
        user("Objective: migrate the billing service to the v2 pricing API."),
        user("Constraint: never change the public invoice format."),
    ];
    let (_, answer) = gateway.post_json(CHAT, &json!({"messages": history}), &[]).await;
    history.push(answer["choices"][0]["message"].clone());
    history.push(user("Decision: we decided to keep the v1 endpoints behind a flag."));
    history.push(user("Open question: do refunds need the v2 rounding rules?"));
    history.push(json!({"role": "assistant", "content": null, "tool_calls": [
        {"id": "call_edit", "type": "function", "function": {"name": "edit_file", "arguments": "{\"path\":\"src/billing/invoice.rs\"}"}}]}));
    history.push(json!({"role": "tool", "tool_call_id": "call_edit", "content": "src/billing/invoice.rs: 3 lines changed in render_invoice"}));
    for turn in 0..6 {
        let (_, answer) = gateway.post_json(CHAT, &json!({"messages": history}), &[]).await;
        history.push(answer["choices"][0]["message"].clone());
        history.push(user(&format!("Step {turn}: keep going with the migration of src/billing/rates.rs.")));
    }
    let (_, answer) = gateway.post_json(CHAT, &json!({"messages": history}), &[]).await;
    history.push(answer["choices"][0]["message"].clone());
    history
}

#[tokio::test]
async fn criterion_09_compaction_preserves_objectives_constraints_decisions_questions_evidence_tool_state_and_privacy_scope()
 {
    let fake = FakeUpstream::start().await;
    let gateway = Harness::start(&fake, Provider::OpenAI, |_| {}).await;
    stateful_session(&gateway).await;
    let (status, record) = gateway
        .post_json(
            "/strata/v1/compact",
            &json!({"mode": "TaskBoundary", "resumeInstruction": "Continue the migration."}),
            &[],
        )
        .await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["qualityCheck"], "Passed", "{record}");
    assert_eq!(record["privacyScope"], "tenant");
    assert!(record["resultGeneration"].as_u64() > record["sourceGeneration"].as_u64(), "{record}");
    let summary_id = record["summaryAssetId"].as_str().unwrap();
    let (_, detail) = metrics_get(&gateway, &format!("/strata/v1/entries/{summary_id}")).await;
    let summary: Value = serde_json::from_str(&detail).unwrap();
    let text = summary["text"].as_str().unwrap();
    for kept in [
        "migrate the billing service to the v2 pricing API",
        "never change the public invoice format",
        "keep the v1 endpoints behind a flag",
        "do refunds need the v2 rounding rules",
    ] {
        assert!(text.contains(kept), "the summary lost {kept:?}:\n{text}");
    }
    let state: Value = serde_json::from_str(&text[text.find('{').unwrap()..]).unwrap();
    assert_eq!(state["privacy_scope"], "tenant");
    // Tool state: the file edit is a side effect not to repeat.
    let side_effects = state["tool_state"]["side_effects"].to_string();
    assert!(side_effects.contains("edit_file") && side_effects.contains("invoice.rs"), "{state}");
    // Evidence: the compacted entries stay reachable through the archive the state references,
    // the tool result byte-exact.
    let archive = record["rawArchive"].as_str().unwrap();
    assert!(state["evidence_refs"]["artifact_refs"].as_array().unwrap().contains(&json!(archive)), "{state}");
    assert!(!state["evidence_refs"]["entry_ids"].as_array().unwrap().is_empty());
    let (_, archived) = metrics_get(&gateway, &format!("/strata/v1/artifacts/{archive}")).await;
    assert!(archived.contains("3 lines changed in render_invoice"), "{archived}");
    let preserved: Vec<&str> =
        record["preservedFields"].as_array().unwrap().iter().map(|f| f.as_str().unwrap()).collect();
    for field in ["activeObjective", "hardConstraints", "decisions", "openQuestions"] {
        assert!(
            preserved
                .iter()
                .any(|p| p.eq_ignore_ascii_case(field) || p.replace('_', "").eq_ignore_ascii_case(field)),
            "{field} not in {preserved:?}"
        );
    }
}

#[tokio::test]
async fn criterion_10_a_failed_compaction_can_restore_or_reopen_the_prior_generation() {
    let fake = FakeUpstream::start().await;
    let gateway = Harness::start(&fake, Provider::OpenAI, |_| {}).await;
    stateful_session(&gateway).await;
    let before = gateway.entries().await;
    let (status, record) =
        gateway.post_json("/strata/v1/compact", &json!({"mode": "TaskBoundary"}), &[]).await;
    assert_eq!(status, 200, "{record}");
    let source = record["sourceGeneration"].as_u64().unwrap();

    // Reopen: the removed entries are readable byte-exact from the summary's raw archive.
    let archive = record["rawArchive"].as_str().unwrap();
    let (status, stored) = metrics_get(&gateway, &format!("/strata/v1/artifacts/{archive}")).await;
    assert_eq!(status, 200);
    let archived: Vec<Value> = serde_json::from_str(&stored).unwrap();
    let removed: BTreeSet<&str> =
        record["assetsRemoved"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert!(!removed.is_empty());
    assert!(archived.iter().all(|e| removed.contains(e["id"].as_str().unwrap())), "{stored}");

    // Restore: a Rollback to the prior generation brings back exactly the entries it had.
    let Harness { dir, config_path, data_dir, gateway: running, client } = gateway;
    running.shutdown().await;
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["compact", "--data-dir"])
        .arg(&data_dir)
        .arg("--termination-log")
        .arg(dir.path().join("termination-log"))
        .args(["--mode", "Rollback", "--to-generation", &source.to_string()])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let restarted = strata::gateway::start(&args(&config_path, &data_dir)).await.unwrap();
    let gateway = Harness { dir, config_path, data_dir, gateway: restarted, client };
    let ids = |entries: &[Value]| -> Vec<String> {
        entries.iter().map(|e| e["id"].as_str().unwrap().to_owned()).collect()
    };
    assert_eq!(ids(&gateway.entries().await), ids(&before), "the prior generation is current again");
}

#[tokio::test]
async fn criterion_11_cache_entries_never_cross_tenant_or_privacy_scope_on_equal_content() {
    // Equal content in two tenants or two privacy scopes never yields one key.
    let master = MasterKey::new(vec![9; 32]).unwrap();
    let prefix = StablePrefix::build(&sources(), &mut ToolRegistry::new(), &counter()).unwrap();
    let key = |tenant: &str, scope: &str| {
        let inputs = CacheKeyInputs::for_prefix(
            tenant,
            scope,
            "anthropic",
            "claude",
            TokenizerKind::Approximate,
            prefix.manifest(),
        )
        .unwrap();
        compute_cache_key(&derive_tenant_key(&master, tenant, 0).unwrap(), &inputs).unwrap()
    };
    assert_ne!(key("team-a", "tenant"), key("team-b", "tenant"));
    assert_ne!(key("team-a", "tenant"), key("team-a", "user:ana"));

    // Live: the same hand-written key text, content and request in two tenants: distinct upstream
    // keys, and a response cached for one is not served to the other.
    let fake = FakeUpstream::start().await;
    let question = json!({"messages": [user("What is our refund policy?")]});
    let mut sent = Vec::new();
    for (namespace, scope) in [("team-a", "tenant"), ("team-b", "tenant"), ("team-a", "user:ana")] {
        let gateway = Harness::start(&fake, Provider::OpenAI, |config| {
            config.agent.namespace = namespace.into();
            config.agent.privacy_scope = scope.into();
            config.policy.cache.response_cache_ttl_seconds = 600;
        })
        .await;
        let calls = fake.seen().len();
        gateway.post_json(CHAT, &question, &[]).await;
        assert_eq!(fake.seen().len(), calls + 1, "{namespace}/{scope} was answered from another's cache");
        sent.push(fake.last()["prompt_cache_key"].as_str().unwrap().to_owned());
    }
    let distinct: BTreeSet<&String> = sent.iter().collect();
    assert_eq!(distinct.len(), 3, "{sent:?}");
}

#[tokio::test]
async fn criterion_12_revocation_invalidates_and_purges_affected_cache_and_derived_context() {
    let fake = FakeUpstream::start().await;
    let gateway = Harness::start(&fake, Provider::OpenAI, |_| {}).await;
    let mut history = stateful_session(&gateway).await;
    let (status, record) =
        gateway.post_json("/strata/v1/compact", &json!({"mode": "TaskBoundary"}), &[]).await;
    assert_eq!(status, 200, "{record}");
    let summary_id = record["summaryAssetId"].as_str().unwrap().to_owned();
    let archive = record["rawArchive"].as_str().unwrap().to_owned();
    assert_eq!(metrics_get(&gateway, &format!("/strata/v1/artifacts/{archive}")).await.0, 200);
    let records = gateway.data_dir.join("compactions");
    assert!(std::fs::read_dir(&records).unwrap().count() > 0);
    let key_before = fake.last()["prompt_cache_key"].clone();

    // The tenant's epoch is bumped: the key changes, and what was derived under the old epoch
    // leaves the prompt and the volume, with a record of the purge.
    reload(&gateway, |config| config.cache_epoch = 1).await;
    let status = gateway.get_json("/strata/v1/status").await;
    let purge = &status["derived"]["revocationPurges"][0];
    assert_eq!(purge["from"]["epoch"], 0, "{status}");
    assert_eq!(purge["to"]["epoch"], 1);
    assert_eq!(purge["revoked"]["summary"], json!([summary_id]));
    assert!(purge["purged"]["compaction_record"]["files"].as_u64().unwrap() > 0, "{purge}");
    assert!(purge["purged"]["generation"]["files"].as_u64().unwrap() > 0, "{purge}");
    assert_eq!(std::fs::read_dir(&records).unwrap().count(), 0, "compaction records purged");
    assert_eq!(
        metrics_get(&gateway, &format!("/strata/v1/artifacts/{archive}")).await.0,
        410,
        "archive purged"
    );

    let (_, detail) = metrics_get(&gateway, &format!("/strata/v1/entries/{summary_id}")).await;
    let stub: Value = serde_json::from_str(&detail).unwrap();
    let stub = stub["text"].as_str().unwrap();
    assert!(stub.contains(&format!("{summary_id} revoked")) && stub.contains("cache epoch 1"), "{stub}");
    assert!(!stub.contains("keep the v1 endpoints behind a flag"), "the revoked summary's content is gone");
    history.push(user("Where were we?"));
    gateway.post_json(CHAT, &json!({"messages": history}), &[]).await;
    let sent = fake.last();
    assert_ne!(sent["prompt_cache_key"], key_before, "the upstream cache key was revoked");
    assert!(sent.to_string().contains(&format!("{summary_id} revoked")), "the prompt carries the stub");
    // A restart under the new epoch has nothing left to purge.
    let gateway = gateway.restart().await;
    let status = gateway.get_json("/strata/v1/status").await;
    assert_eq!(status["derived"]["revocationPurges"].as_array().unwrap().len(), 1, "{status}");
}

#[tokio::test]
async fn criterion_13_the_inspector_attributes_weight_and_cache_without_exposing_unauthorized_content() {
    let fake = FakeUpstream::start().await;
    let gateway = Harness::start(&fake, Provider::OpenAI, |_| {}).await;
    let secret = "sk-proj-abcdefghijklmnopqrstuvwxyz0123456789";
    let request = json!({"messages": [user(&format!("Deploy with key {secret} to the staging cluster"))]});
    gateway.post_json(CHAT, &request, &[]).await;
    gateway.post_json(CHAT, &request, &[]).await;
    let inspect = gateway.get_json("/strata/v1/inspect").await;
    let round = &inspect["requests"][0]["rounds"][0];
    assert!(round["cacheOutcome"].is_string() && round["churn"].is_string(), "{round}");
    let weights: u64 =
        round["sections"].as_array().unwrap().iter().map(|s| s["tokens"].as_u64().unwrap()).sum();
    assert!(weights > 0, "context weight is attributed to sections: {round}");
    let text = inspect.to_string();
    assert!(!text.contains("staging cluster"), "the inspect view carries no message content");
    assert!(!text.contains(secret) && !text.contains(gateway_support::API_KEY));
    // Content is only on the metrics listener, redacted as journaled; the API listener has no page.
    let entries = gateway.entries().await;
    let (_, detail) =
        metrics_get(&gateway, &format!("/strata/v1/entries/{}", entries[0]["id"].as_str().unwrap())).await;
    assert!(detail.contains("[REDACTED:") && !detail.contains(secret), "{detail}");
    let page = gateway.client.get(gateway.url("/strata/v1/ui")).send().await.unwrap();
    assert_eq!(page.status().as_u16(), 404, "the API listener does not serve the Inspector");
    let (status, html) = metrics_get(&gateway, "/strata/v1/ui").await;
    assert_eq!(status, 200);
    assert!(
        html.contains("trust class") && html.contains("privacy scope"),
        "the page shows both per section"
    );
}

#[tokio::test]
async fn criterion_14_efficiency_changes_pass_the_preservation_check_and_keep_outputs_reopenable() {
    // The quality, safety, privacy and task-completion evaluation suite is the agent runtime's (see
    // README). What Strata checks itself: every content-reducing change is either checked by the
    // preservation check (compaction) or keeps the full output reopenable byte-exact (spill,
    // elision, deduplication).
    let fake = FakeUpstream::start().await;
    let gateway = Harness::start(&fake, Provider::OpenAI, |config| {
        config.policy.tool_results.elide_after_rounds = 1;
    })
    .await;
    // Under the spill threshold, so the window holds it until it is deduplicated or elided.
    let output: String = (0..250).map(|line| format!("test {line:03} passed in 0.{line:03}s\n")).collect();
    let stored_copy = ArtifactRef::for_bytes(output.as_bytes()).to_string();
    let mut history = vec![user("Run the tests twice")];
    for round in 0..2 {
        let id = format!("call_{round}");
        history.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": id, "type": "function", "function": {"name": "run_tests", "arguments": "{}"}}]}));
        history.push(json!({"role": "tool", "tool_call_id": id, "content": output}));
        let (_, answer) = gateway.post_json(CHAT, &json!({"messages": history}), &[]).await;
        history.push(answer["choices"][0]["message"].clone());
        history.push(user(&format!("Round {round} done.")));
    }
    for _ in 0..3 {
        let (_, answer) = gateway.post_json(CHAT, &json!({"messages": history}), &[]).await;
        history.push(answer["choices"][0]["message"].clone());
        history.push(user("Next."));
    }
    let entries = gateway.entries().await;
    let reduced: Vec<&Value> =
        entries.iter().filter(|e| e["reason"] == "duplicate" || e["reason"] == "elided").collect();
    assert!(!reduced.is_empty(), "a repeated or old output was reduced: {entries:?}");
    for entry in reduced {
        let refs = entry["dataRefs"].as_array().unwrap();
        assert!(refs.contains(&json!(stored_copy)), "{entry}");
        let (status, stored) = metrics_get(&gateway, &format!("/strata/v1/artifacts/{stored_copy}")).await;
        assert_eq!(
            (status, stored.as_str()),
            (200, output.as_str()),
            "{} is reopenable byte-exact",
            entry["id"]
        );
    }
    let (status, record) =
        gateway.post_json("/strata/v1/compact", &json!({"mode": "TaskBoundary"}), &[]).await;
    assert!(status == 200 || status == 422, "{record}");
    assert!(
        record["qualityCheck"].is_string(),
        "every compaction carries its preservation verdict: {record}"
    );
    let metrics = gateway.metrics().await;
    assert!(metrics.contains("strata_gateway_compaction_outcomes_total{outcome="), "{metrics}");
}

#[tokio::test]
async fn criterion_15_cache_and_context_regressions_produce_actionable_alerts_with_a_cause() {
    // A regression: the system prompt changes every call (prefix churn) and requests are blocked.
    let fake = FakeUpstream::start().await;
    let gateway = Harness::start(&fake, Provider::OpenAI, |config| {
        config.upstream.context_window = 16_000;
        config.policy.compaction.automatic = false;
    })
    .await;
    for version in 0..3 {
        let system = format!("You follow style guide revision {}.", ["alpha", "beta", "gamma"][version]);
        gateway
            .post_json(CHAT, &json!({"messages": [{"role": "system", "content": system}, user("hi")]}), &[])
            .await;
    }
    let huge = "word ".repeat(24_000);
    let (status, _) = gateway.post_json(CHAT, &json!({"messages": [user(&huge)]}), &[]).await;
    assert_eq!(status, 400, "the request is blocked by the budget");
    let metrics = gateway.metrics().await;
    assert!(metrics.contains("strata_gateway_prefix_churn_total{cause=\"system\"} 2"), "{metrics}");
    assert!(metrics.contains("strata_gateway_blocked_operations_total 1"), "{metrics}");

    // The chart's alerts watch exactly these series, classify the cause and say what to do.
    let rule = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../charts/strata/templates/prometheusrule.yaml"),
    )
    .unwrap();
    let exported: BTreeSet<String> = strata::gateway::metric_names().unwrap().into_iter().collect();
    let named: BTreeSet<&str> = rule
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|word| word.starts_with("strata_gateway_") && word.len() > "strata_gateway_".len())
        .collect();
    for metric in &named {
        assert!(exported.contains(*metric), "the alerts name {metric}, which the gateway does not export");
    }
    for watched in ["strata_gateway_prefix_churn_total", "strata_gateway_blocked_operations_total"] {
        assert!(named.contains(watched), "no alert watches {watched}");
    }
    assert!(rule.contains("sum by (tenant, agent, cause)"), "churn alerts carry their cause");
    assert!(rule.matches("description:").count() >= 6 && rule.contains("kubectl strata compact"));
}

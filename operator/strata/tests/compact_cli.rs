//! `strata compact` as a process: a fake LLM upstream (valid, invalid, truncated, empty, slow,
//! fenced JSON; OpenAI and Anthropic), delta chunking, the failed check, exit codes, rollback and
//! purge offline, and a compaction beside a live writer through the proposal mechanism.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{HashSet, VecDeque};
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use strata_api::agent::{Provider, SessionMode, Tokenizer};
use strata_api::compaction_job::{CompactionRecord as ApiRecord, QualityCheck as ApiQuality};
use strata_api::effective::EffectivePolicy;
use strata_api::gateway_config::{
    AgentIdentity, GATEWAY_CONFIG_VERSION, GatewayConfig, StablePrefixConfig, UpstreamConfig,
};
use strata_core::compaction::{
    CompactedState, CompactionMode, CompactionRequest, CompactionSettings, ExtractiveSummarizer,
    PreparedCompaction,
};
use strata_core::entry::{
    Content, EntryDraft, EntryId, EntryKind, RetentionClass, Role, ToolCall, ToolResult,
};
use strata_core::journal::{Journal, JournalOptions, StdStorage, SyncPolicy, read_current_generation};

/// What the fake upstream answers to one request.
#[derive(Clone, Debug)]
enum Reply {
    /// A complete answer with this content.
    Content(String),
    /// An answer cut off at the token limit.
    Truncated(String),
    /// No answer within the client's timeout.
    Slow,
}

#[derive(Default)]
struct Upstream {
    replies: Mutex<VecDeque<Reply>>,
    fallback: Mutex<String>,
    requests: Mutex<Vec<String>>,
}

async fn openai(State(upstream): State<Arc<Upstream>>, body: String) -> String {
    let (content, finish) = answer(&upstream, body).await;
    serde_json::json!({"choices": [{"message": {"role": "assistant", "content": content}, "finish_reason": finish}]})
        .to_string()
}

async fn anthropic(State(upstream): State<Arc<Upstream>>, body: String) -> String {
    let (content, finish) = answer(&upstream, body).await;
    let stop = if finish == "length" { "max_tokens" } else { "end_turn" };
    serde_json::json!({"content": [{"type": "text", "text": content}], "stop_reason": stop}).to_string()
}

async fn answer(upstream: &Upstream, body: String) -> (String, &'static str) {
    upstream.requests.lock().unwrap().push(body);
    let reply = upstream.replies.lock().unwrap().pop_front();
    match reply {
        Some(Reply::Content(text)) => (text, "stop"),
        Some(Reply::Truncated(text)) => (text, "length"),
        Some(Reply::Slow) => {
            tokio::time::sleep(Duration::from_secs(5)).await;
            (String::new(), "stop")
        }
        None => (upstream.fallback.lock().unwrap().clone(), "stop"),
    }
}

/// Starts the fake upstream on 127.0.0.1:0 in a background runtime; returns its base URL.
fn serve(upstream: Arc<Upstream>) -> String {
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        runtime.block_on(async move {
            let app = Router::new()
                .route("/v1/chat/completions", post(openai))
                .route("/v1/messages", post(anthropic))
                .with_state(upstream);
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            sender.send(listener.local_addr().unwrap()).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    format!("http://{}/v1", receiver.recv().unwrap())
}

struct Agent {
    _dir: tempfile::TempDir,
    data: PathBuf,
    root: PathBuf,
}

fn draft(kind: EntryKind, role: Role, text: &str) -> EntryDraft {
    EntryDraft {
        kind,
        role,
        content: Content::text(text),
        retention: RetentionClass::Working,
        created_at_ms: 1,
        tokens: (text.len() as u64).div_ceil(4) + 3,
        artifact_refs: vec![],
    }
}

fn agent() -> Agent {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (mut journal, _) =
        Journal::open(Arc::new(StdStorage), &data, JournalOptions::new("test", 1)).unwrap();
    journal
        .append(draft(EntryKind::Message, Role::User, "Objective: fix the auth timeouts in services/auth.py"))
        .unwrap();
    journal
        .append(draft(EntryKind::Message, Role::User, "You must not restart the production Redis."))
        .unwrap();
    journal.append(draft(EntryKind::Message, Role::Assistant, "Decision: use exponential backoff.")).unwrap();
    journal.append(draft(EntryKind::Message, Role::User, "Open question: cap at 30s or 60s?")).unwrap();
    let mut call = draft(EntryKind::ToolCall, Role::Assistant, "");
    call.content.tool_calls.push(ToolCall {
        call_id: "c1".into(),
        name: "bash".into(),
        arguments_json: "{}".into(),
    });
    journal.append(call).unwrap();
    let mut result = draft(EntryKind::ToolResult, Role::Tool, "");
    result.content.tool_results.push(ToolResult { call_id: "c1".into(), name: None, output: "ok".into() });
    journal.append(result).unwrap();
    for n in 0..12 {
        let text = format!("Reading logs part {n}. {}", "log line ".repeat(200));
        journal.append(draft(EntryKind::Message, Role::Assistant, &text)).unwrap();
    }
    let mut pending = draft(EntryKind::ToolCall, Role::Assistant, "");
    pending.content.tool_calls.push(ToolCall {
        call_id: "c9".into(),
        name: "deploy".into(),
        arguments_json: r#"{"env":"staging"}"#.into(),
    });
    journal.append(pending).unwrap();
    Agent { root: dir.path().to_path_buf(), _dir: dir, data }
}

fn config(agent: &Agent, provider: Provider, endpoint: &str, context_window: u32, timeout: u32) -> PathBuf {
    let mut policy = EffectivePolicy::default();
    policy.compaction.summarizer.model = Some("fake-summarizer".into());
    policy.compaction.summarizer.max_summary_tokens = 2048;
    let config = GatewayConfig {
        version: GATEWAY_CONFIG_VERSION,
        agent: AgentIdentity {
            name: "builder".into(),
            namespace: "rateright".into(),
            privacy_scope: "tenant".into(),
            uid: None,
            adopt_journal_from_uid: None,
        },
        upstream: UpstreamConfig {
            provider,
            model: "agent-model".into(),
            endpoint: endpoint.into(),
            context_window,
            tokenizer: Tokenizer::O200kBase,
            api_key_file: None,
            timeout_seconds: timeout,
        },
        policy,
        stable_prefix: StablePrefixConfig::default(),
        cache_key: "ab".repeat(32),
        cache_key_short: "ab".repeat(8),
        cache_epoch: 0,
        session_mode: SessionMode::Transparent,
    };
    let path = agent.root.join("gateway.json");
    std::fs::write(&path, serde_json::to_vec(&config).unwrap()).unwrap();
    path
}

/// The state a competent model would return: the extractive one for the same settings.
fn good_state(agent: &Agent) -> CompactedState {
    let view = read_current_generation(&StdStorage, &agent.data).unwrap();
    let request = CompactionRequest {
        mode: CompactionMode::Budget,
        reason: None,
        resume_instruction: None,
        settings: CompactionSettings::default(),
        now_ms: 0,
    };
    let prepared = PreparedCompaction::new(view.snapshot(), request);
    ExtractiveSummarizer::default().summarize_now(prepared.summary_input())
}

fn compact(agent: &Agent, args: &[&str]) -> Output {
    let log = agent.root.join("termination-log");
    Command::new(env!("CARGO_BIN_EXE_strata"))
        .arg("compact")
        .arg("--data-dir")
        .arg(&agent.data)
        .arg("--termination-log")
        .arg(&log)
        .args(args)
        .output()
        .unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Parses stdout and the termination log into the operator's record type.
fn records(agent: &Agent, output: &Output) -> ApiRecord {
    let printed: ApiRecord =
        serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}: {}", stderr(output)));
    let message = std::fs::read(agent.root.join("termination-log")).unwrap();
    assert!(message.len() <= 4096);
    let reported: ApiRecord = serde_json::from_slice(&message).unwrap();
    assert_eq!(reported.compaction_id, printed.compaction_id);
    printed
}

fn current(agent: &Agent) -> Vec<u8> {
    std::fs::read(agent.data.join("CURRENT")).unwrap()
}

fn with_upstream(replies: Vec<Reply>, fallback: String) -> (Arc<Upstream>, String) {
    let upstream = Arc::new(Upstream::default());
    upstream.replies.lock().unwrap().extend(replies);
    *upstream.fallback.lock().unwrap() = fallback;
    let url = serve(Arc::clone(&upstream));
    (upstream, url)
}

#[test]
fn valid_llm_output_is_validated_committed_and_recorded() {
    let agent = agent();
    let good = serde_json::to_string(&good_state(&agent)).unwrap();
    let (upstream, url) = with_upstream(vec![Reply::Content(good)], String::new());
    let config = config(&agent, Provider::OpenAI, &url, 200_000, 10);
    let output = compact(&agent, &["--mode", "Budget", "--config", config.to_str().unwrap()]);
    assert!(output.status.success(), "{}", stderr(&output));
    let record = records(&agent, &output);
    assert_eq!(record.quality_check, ApiQuality::Passed);
    assert_eq!(record.model_or_service_version.as_deref(), Some("openai:fake-summarizer"));
    assert_eq!((record.source_generation, record.result_generation), (1, 2));
    let requests = upstream.requests.lock().unwrap();
    assert_eq!(requests.len(), 1);
    let body: serde_json::Value = serde_json::from_str(&requests[0]).unwrap();
    assert_eq!(body["response_format"]["type"], "json_schema");
    assert!(requests[0].contains("cap at 30s or 60s?"), "the prompt names what the check requires");
    let view = read_current_generation(&StdStorage, &agent.data).unwrap();
    let summary = view.entries.iter().find(|e| Some(e.id.to_string()) == record.summary_asset_id).unwrap();
    let state: CompactedState = serde_json::from_str(&summary.content.text).unwrap();
    assert!(state.open_questions.iter().any(|q| q.text.contains("30s or 60s")));
    assert!(
        agent.data.join("compactions").read_dir().unwrap().count() >= 1,
        "the record is kept beside the journal"
    );
}

#[test]
fn invalid_output_is_repaired_once() {
    let agent = agent();
    let good = serde_json::to_string(&good_state(&agent)).unwrap();
    let (upstream, url) = with_upstream(
        vec![Reply::Content("Sure! Here is the state: {oops".into()), Reply::Content(good)],
        String::new(),
    );
    let config = config(&agent, Provider::OpenAI, &url, 200_000, 10);
    let output = compact(&agent, &["--mode", "TaskBoundary", "--config", config.to_str().unwrap()]);
    assert!(output.status.success(), "{}", stderr(&output));
    let requests = upstream.requests.lock().unwrap();
    assert_eq!(requests.len(), 2);
    assert!(requests[1].contains("not usable"), "the retry explains the problem");
}

#[test]
fn invalid_and_empty_output_fails_without_changing_anything() {
    let agent = agent();
    let before = current(&agent);
    let (upstream, url) = with_upstream(
        vec![Reply::Content(r#"{"project_summary": 1}"#.into()), Reply::Content(String::new())],
        String::new(),
    );
    let config = config(&agent, Provider::OpenAI, &url, 200_000, 10);
    let output = compact(&agent, &["--mode", "Budget", "--config", config.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(69), "{}", stderr(&output));
    assert!(stderr(&output).contains("--summarizer extractive"), "{}", stderr(&output));
    assert_eq!(upstream.requests.lock().unwrap().len(), 2);
    assert_eq!(current(&agent), before);
    assert!(!agent.data.join("gen-000002").exists());
}

#[test]
fn emergency_falls_back_to_extractive_on_truncated_output_and_on_timeout() {
    for replies in [vec![Reply::Truncated("{\"project_summary\": \"half".into()); 2], vec![Reply::Slow]] {
        let agent = agent();
        let (_upstream, url) = with_upstream(replies, String::new());
        let config = config(&agent, Provider::OpenAI, &url, 200_000, 1);
        let output = compact(&agent, &["--mode", "Emergency", "--config", config.to_str().unwrap()]);
        assert!(output.status.success(), "{}", stderr(&output));
        let record = records(&agent, &output);
        let version = record.model_or_service_version.unwrap();
        assert!(
            version.starts_with("strata-extractive/1 (fallback: openai:fake-summarizer failed"),
            "{version}"
        );
        assert_eq!(record.result_generation, 2);
    }
}

#[test]
fn a_state_that_drops_an_open_question_fails_the_check_and_changes_nothing() {
    let agent = agent();
    let mut lossy = good_state(&agent);
    lossy.open_questions.clear();
    let (_upstream, url) = with_upstream(vec![], serde_json::to_string(&lossy).unwrap());
    let config = config(&agent, Provider::OpenAI, &url, 200_000, 10);
    let before = current(&agent);
    let output = compact(&agent, &["--mode", "Budget", "--config", config.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    let record = records(&agent, &output);
    assert_eq!(record.quality_check, ApiQuality::Failed);
    assert_eq!(record.result_generation, record.source_generation);
    assert!(
        record.missing_items.iter().any(|item| item.contains("30s or 60s")),
        "{:?}",
        record.missing_items
    );
    assert_eq!(current(&agent), before);
    assert!(!agent.data.join("gen-000002").exists());
}

#[test]
fn anthropic_fenced_json_is_accepted() {
    let agent = agent();
    let fenced = format!("```json\n{}\n```", serde_json::to_string(&good_state(&agent)).unwrap());
    let (upstream, url) = with_upstream(vec![Reply::Content(fenced)], String::new());
    let config = config(&agent, Provider::Anthropic, url.trim_end_matches("/v1"), 200_000, 10);
    let output = compact(&agent, &["--mode", "Budget", "--config", config.to_str().unwrap()]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(
        records(&agent, &output).model_or_service_version.as_deref(),
        Some("anthropic:fake-summarizer")
    );
    let body: serde_json::Value = serde_json::from_str(&upstream.requests.lock().unwrap()[0]).unwrap();
    assert!(body["system"].as_str().unwrap().contains("JSON Schema"));
}

#[test]
fn an_oversized_delta_is_summarised_in_chunks_folding_the_state() {
    let agent = agent();
    let good = serde_json::to_string(&good_state(&agent)).unwrap();
    let (upstream, url) = with_upstream(vec![], good);
    let config = config(&agent, Provider::OpenAICompatible, &url, 4096, 10);
    let output = compact(&agent, &["--mode", "Budget", "--config", config.to_str().unwrap()]);
    assert!(output.status.success(), "{}", stderr(&output));
    let requests = upstream.requests.lock().unwrap();
    assert!(requests.len() > 2, "{} requests", requests.len());
    assert!(requests[0].contains("none (this is the first compaction)"));
    assert!(requests[1].contains("project_summary"), "later chunks start from the state so far");
    assert!(requests.iter().all(|r| r.len() < 3072 * 2 + 20_000), "every request is bounded");
}

#[test]
fn bad_input_exits_64_and_says_what_to_do() {
    let agent = agent();
    let cases: [(&[&str], &str); 5] = [
        (&["--mode", "Rollback"], "--to-generation"),
        (&["--mode", "Budget", "--ids", "msg_1"], "only allowed with --mode Purge"),
        (&["--mode", "Purge", "--ids", "message-1"], "msg_104"),
        (&["--mode", "Budget", "--summarizer", "llm"], "--summarizer extractive"),
        (&["--mode", "Rollback", "--to-generation", "9"], "retained"),
    ];
    for (args, hint) in cases {
        let output = compact(&agent, args);
        assert_eq!(output.status.code(), Some(64), "{args:?}: {}", stderr(&output));
        assert!(stderr(&output).contains(hint), "{args:?}: {}", stderr(&output));
    }
    let missing = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["compact", "--mode", "Budget", "--data-dir"])
        .arg(agent.root.join("nowhere"))
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(64));
    assert!(stderr(&missing).contains("pass the agent's data directory"));
}

#[test]
fn offline_compaction_purge_and_rollback_round_trip() {
    let agent = agent();
    let original = read_current_generation(&StdStorage, &agent.data).unwrap().entries;
    let output = compact(&agent, &["--mode", "TaskBoundary", "--keep-recent", "2"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let record = records(&agent, &output);
    assert_eq!(record.model_or_service_version.as_deref(), Some("strata-extractive/1"));
    assert!(record.tokens_after < record.tokens_before);

    let view = read_current_generation(&StdStorage, &agent.data).unwrap();
    let last = view.entries.last().unwrap().id.to_string();
    let output = compact(&agent, &["--mode", "Purge", "--ids", &last, "--summary", "resume note dropped"]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(records(&agent, &output).result_generation, 3);

    let output = compact(&agent, &["--mode", "Rollback", "--to-generation", "1"]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(records(&agent, &output).result_generation, 4);
    assert_eq!(read_current_generation(&StdStorage, &agent.data).unwrap().entries, original);
}

#[test]
fn beside_a_live_writer_the_compaction_is_proposed_and_nothing_is_lost_or_duplicated() {
    let agent = agent();
    let data = agent.data.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let writer = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut options = JournalOptions::new("gateway", 1);
            options.sync_policy = SyncPolicy::Batched { max_pending: 4 };
            let (mut journal, _) = Journal::open(Arc::new(StdStorage), &data, options).unwrap();
            ready_tx.send(()).unwrap();
            let mut appended: Vec<EntryId> = Vec::new();
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                appended.push(
                    journal.append(draft(EntryKind::Message, Role::User, &format!("live {n}"))).unwrap().id,
                );
                journal.sync().unwrap();
                journal.refresh().unwrap();
                n += 1;
                std::thread::sleep(Duration::from_millis(2));
            }
            (appended, journal.entries().to_vec())
        })
    };
    ready_rx.recv().unwrap();
    let before: HashSet<EntryId> =
        read_current_generation(&StdStorage, &agent.data).unwrap().entries.iter().map(|e| e.id).collect();
    let output = compact(&agent, &["--mode", "Budget", "--wait-seconds", "30"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let record = records(&agent, &output);
    let rollback = compact(&agent, &["--mode", "Rollback", "--to-generation", "1"]);
    stop.store(true, Ordering::SeqCst);
    let (appended, entries) = writer.join().unwrap();

    assert_eq!(rollback.status.code(), Some(75), "{}", stderr(&rollback));
    assert!(stderr(&rollback).contains("Suspend the agent"), "{}", stderr(&rollback));
    let ids: Vec<EntryId> = entries.iter().map(|e| e.id).collect();
    let present: HashSet<EntryId> = ids.iter().copied().collect();
    assert_eq!(present.len(), ids.len(), "duplicated entries");
    assert_eq!(record.source_generation, 1);
    let printed: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let removed: HashSet<EntryId> = printed["assetsRemoved"]
        .as_array()
        .unwrap()
        .iter()
        .map(|id| id.as_str().unwrap().parse().unwrap())
        .collect();
    for id in before.iter().chain(&appended) {
        assert!(present.contains(id) != removed.contains(id), "{id} lost or duplicated");
    }
}

#[test]
fn the_summariser_gets_its_own_provider_endpoint_and_key() {
    let agent = agent();
    let good = serde_json::to_string(&good_state(&agent)).unwrap();
    let (upstream, url) = with_upstream(vec![Reply::Content(good)], String::new());
    // The agent talks to OpenAI (here: nowhere); its summariser is an Anthropic model with its own key.
    let path = config(&agent, Provider::OpenAI, "http://127.0.0.1:9/v1", 200_000, 10);
    let mut config: GatewayConfig = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let summarizer = &mut config.policy.compaction.summarizer;
    summarizer.provider = Some(Provider::Anthropic);
    summarizer.endpoint = Some(url.trim_end_matches("/v1").to_string());
    std::fs::write(&path, serde_json::to_vec(&config).unwrap()).unwrap();
    let config_arg = path.to_str().unwrap();

    let refused = compact(&agent, &["--mode", "Budget", "--config", config_arg]);
    assert_eq!(refused.status.code(), Some(64), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("refusing to send the agent's API key to another provider"),
        "{}",
        stderr(&refused)
    );
    assert!(upstream.requests.lock().unwrap().is_empty());

    config.policy.compaction.summarizer.credentials_secret_ref =
        Some(strata_api::refs::LocalKeyRef { name: "anthropic-api".into(), key: "api-key".into() });
    std::fs::write(&path, serde_json::to_vec(&config).unwrap()).unwrap();
    let key = agent.root.join("summarizer-key");
    std::fs::write(&key, "sk-ant-summarizer\n").unwrap();
    let output = compact(
        &agent,
        &["--mode", "Budget", "--config", config_arg, "--summarizer-api-key-file", key.to_str().unwrap()],
    );
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(
        records(&agent, &output).model_or_service_version.as_deref(),
        Some("anthropic:fake-summarizer")
    );
    assert_eq!(upstream.requests.lock().unwrap().len(), 1, "the summariser's own endpoint was called");
}

#[test]
fn another_agents_journal_is_not_compacted() {
    use strata_core::journal::{Claimant, bind_owner};
    let agent = agent();
    let claimant = Claimant {
        agent_uid: "uid-of-the-old-builder",
        agent: "rateright/builder",
        adopt_from_uid: None,
        now_ms: 1,
    };
    bind_owner(&StdStorage, &agent.data, claimant).unwrap();
    let path = config(&agent, Provider::OpenAI, "http://127.0.0.1:9/v1", 200_000, 10);
    let mut config: GatewayConfig = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    config.agent.uid = Some("uid-of-the-new-builder".into());
    std::fs::write(&path, serde_json::to_vec(&config).unwrap()).unwrap();
    let before = current(&agent);
    let args = ["--mode", "TaskBoundary", "--summarizer", "extractive", "--config", path.to_str().unwrap()];
    let refused = compact(&agent, &args);
    assert_eq!(refused.status.code(), Some(64), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("belongs to Agent rateright/builder (uid uid-of-the-old-builder)"),
        "{}",
        stderr(&refused)
    );
    assert_eq!(current(&agent), before, "nothing changed");

    config.agent.adopt_journal_from_uid = Some("uid-of-the-old-builder".into());
    std::fs::write(&path, serde_json::to_vec(&config).unwrap()).unwrap();
    let adopted = compact(&agent, &args);
    assert!(adopted.status.success(), "an adopting Agent may compact it: {}", stderr(&adopted));
}

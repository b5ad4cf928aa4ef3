//! The session engine end to end, in memory: turns in, upstream bodies out, and automatic
//! compaction instead of a blocked turn when the context fills.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::Map;
use strata_core::budget::OperationId;
use strata_core::compaction::{CompactionMode, EXTRACTIVE_VERSION, ExtractiveSummarizer};
use strata_core::entry::{Content, Role, ToolCall, ToolResult};
use strata_core::session::protocol::check_request;
use strata_core::session::{
    Api, AssistantOutput, ChatRequest, CompactionAsk, SessionEngine, SessionSettings, Turn, TurnOutcome,
    TurnRequest,
};

fn request(turns: Vec<Turn>) -> ChatRequest {
    ChatRequest {
        api: Api::OpenAi,
        stream: false,
        system_text: "You are a test agent.".into(),
        turns,
        tools: Vec::new(),
        params: Map::new(),
        wants_usage: false,
    }
}

fn user(text: String) -> Turn {
    Turn { role: Role::User, content: Content::text(text) }
}

/// Drives `calls` turns of about 2k tokens each through a stateful session; returns how many were
/// blocked and how many compactions ran.
fn drive(settings: &SessionSettings, calls: usize) -> (usize, u64) {
    let mut engine = SessionEngine::in_memory(settings, 0).unwrap();
    let (mut blocked, mut compactions) = (0, 0);
    for call in 0..calls {
        let text = format!("step {call}: {}", "lorem ipsum dolor sit amet ".repeat(400));
        let chat = request(vec![user(text)]);
        let turn = TurnRequest {
            request: &chat,
            transparent: false,
            operation_id: OperationId::from_request("test", &call.to_le_bytes()),
            head: Map::new(),
            now_ms: 1_000 * call as u64,
        };
        match engine.begin_turn(settings, turn).unwrap() {
            TurnOutcome::Blocked(_) => blocked += 1,
            TurnOutcome::Admitted(admitted) => {
                compactions += admitted.compactions;
                let body: serde_json::Value =
                    serde_json::from_slice(&admitted.first_call.body.to_vec()).unwrap();
                assert!(body["messages"].as_array().unwrap().len() >= 2, "{body}");
                let answer = AssistantOutput { text: format!("done {call}"), ..AssistantOutput::default() };
                engine.record_answer(settings, &admitted.first_call, &answer, 1_000 * call as u64).unwrap();
            }
        }
    }
    (blocked, compactions)
}

#[test]
fn a_full_context_is_compacted_instead_of_blocking() {
    let mut settings = SessionSettings::defaults(Api::OpenAi, 40_000);
    settings.budget.reserved_completion_tokens = 2_000;
    settings.compaction.keep_recent_entries = 4;
    let (blocked, compactions) = drive(&settings, 40);
    assert_eq!(blocked, 0, "no turn is blocked while compaction can free space");
    assert!(compactions > 0, "the engine compacted at the trigger");
}

#[test]
fn without_automatic_compaction_the_budget_blocks() {
    let mut settings = SessionSettings::defaults(Api::OpenAi, 40_000);
    settings.budget.reserved_completion_tokens = 2_000;
    settings.automatic_compaction = false;
    let (blocked, compactions) = drive(&settings, 40);
    assert!(blocked > 0, "turns past the window are blocked");
    assert_eq!(compactions, 0);
}

/// Journals `turns` as one stateful request and returns its first upstream call.
fn send(
    engine: &mut SessionEngine,
    settings: &SessionSettings,
    turns: Vec<Turn>,
    at: u64,
) -> strata_core::session::UpstreamCall {
    let chat = request(turns);
    let turn = TurnRequest {
        request: &chat,
        transparent: false,
        operation_id: OperationId::from_request("test", &at.to_le_bytes()),
        head: Map::new(),
        now_ms: at,
    };
    match engine.begin_turn(settings, turn).unwrap() {
        TurnOutcome::Admitted(admitted) => admitted.first_call,
        TurnOutcome::Blocked(notice) => panic!("blocked: {notice:?}"),
    }
}

#[test]
fn a_compaction_committed_while_a_tool_call_waits_keeps_the_call_next_to_its_result() {
    let mut settings = SessionSettings::defaults(Api::OpenAi, 40_000);
    settings.model_summarizer = true;
    settings.compaction.keep_recent_entries = 2;
    let mut engine = SessionEngine::in_memory(&settings, 0).unwrap();
    for step in 0..10u64 {
        let call = send(&mut engine, &settings, vec![user(format!("step {step}: read the next log"))], step);
        let answer = AssistantOutput { text: format!("read log {step}"), ..AssistantOutput::default() };
        engine.record_answer(&settings, &call, &answer, step).unwrap();
    }
    let call = send(&mut engine, &settings, vec![user("Deploy the auth service.".into())], 20);
    let deploy =
        ToolCall { call_id: "call_deploy".into(), name: "deploy".into(), arguments_json: "{}".into() };
    let answer = AssistantOutput { tool_calls: vec![deploy], ..AssistantOutput::default() };
    engine.record_answer(&settings, &call, &answer, 20).unwrap();

    // The host snapshots now, and the client's tool result arrives while the summary is written.
    let ask = CompactionAsk::new(CompactionMode::Budget, "test: the trigger was reached");
    let prepared = engine.prepare_compaction(&settings, &ask, 21).unwrap();
    let result =
        ToolResult { call_id: "call_deploy".into(), name: Some("deploy".into()), output: "deployed".into() };
    send(
        &mut engine,
        &settings,
        vec![Turn {
            role: Role::Tool,
            content: Content { tool_results: vec![result], ..Content::default() },
        }],
        22,
    );
    let state = ExtractiveSummarizer::default().summarize_now(prepared.summary_input());
    let record =
        engine.finish_compaction(&settings, prepared, state, EXTRACTIVE_VERSION, 23).unwrap().unwrap();
    assert_eq!((record.source_generation, record.result_generation), (1, 2), "{record:?}");

    let body: serde_json::Value =
        serde_json::from_slice(&engine.next_call(&settings, Map::new()).unwrap().body.to_vec()).unwrap();
    check_request(Api::OpenAi, &body).unwrap();
    let messages = body["messages"].as_array().unwrap();
    let at = messages
        .iter()
        .position(|m| m["tool_calls"][0]["id"] == "call_deploy")
        .unwrap_or_else(|| panic!("the pending call was kept: {body}"));
    assert_eq!(messages[at + 1]["role"], "tool", "the result follows its call: {body}");
    assert_eq!(messages[at + 1]["tool_call_id"], "call_deploy");
    assert!(
        !messages
            .iter()
            .any(|m| m["content"].as_str().is_some_and(|t| t.ends_with("step 3: read the next log"))),
        "old turns were compacted into the summary: {body}"
    );
}

#[test]
fn a_snapshot_overtaken_by_another_rewrite_is_refused_as_superseded() {
    let mut settings = SessionSettings::defaults(Api::OpenAi, 40_000);
    settings.compaction.keep_recent_entries = 2;
    let mut engine = SessionEngine::in_memory(&settings, 0).unwrap();
    for step in 0..10u64 {
        let call = send(&mut engine, &settings, vec![user(format!("step {step}: read the next log"))], step);
        let answer = AssistantOutput { text: format!("read log {step}"), ..AssistantOutput::default() };
        engine.record_answer(&settings, &call, &answer, step).unwrap();
    }
    let ask = CompactionAsk::new(CompactionMode::Budget, "test");
    let slow = engine.prepare_compaction(&settings, &ask, 30).unwrap();
    let fast = engine
        .compact(&settings, &CompactionAsk::new(CompactionMode::Emergency, "test"), 31)
        .unwrap()
        .unwrap();
    assert_eq!(fast.result_generation, 2);
    let state = ExtractiveSummarizer::default().summarize_now(slow.summary_input());
    let error =
        engine.finish_compaction(&settings, slow, state, EXTRACTIVE_VERSION, 32).unwrap().unwrap_err();
    assert!(strata_core::session::is_superseded(&error), "{error}");
    assert_eq!(engine.journal().generation(), 2, "the overtaken compaction changed nothing");
}

#[test]
fn with_a_model_summariser_the_trigger_asks_the_host_and_emergencies_stay_in_process() {
    let mut settings = SessionSettings::defaults(Api::OpenAi, 40_000);
    settings.budget.reserved_completion_tokens = 2_000;
    settings.compaction.keep_recent_entries = 4;
    settings.model_summarizer = true;
    let mut engine = SessionEngine::in_memory(&settings, 0).unwrap();
    let mut asks = Vec::new();
    for step in 0..40u64 {
        let text = format!("step {step}: {}", "lorem ipsum dolor sit amet ".repeat(400));
        let call = send(&mut engine, &settings, vec![user(text)], step);
        let answer = AssistantOutput { text: format!("done {step}"), ..AssistantOutput::default() };
        engine.record_answer(&settings, &call, &answer, step).unwrap();
        asks.extend(engine.take_compaction_ask());
    }
    assert!(!asks.is_empty(), "the trigger asked the host");
    assert!(asks.iter().all(|ask| ask.mode == CompactionMode::Budget), "{asks:?}");
    assert!(
        engine.journal().generation() > 1,
        "unanswered asks end in in-process Emergency compactions, never a block"
    );
}

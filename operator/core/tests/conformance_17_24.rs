//! GCS §17.24 acceptance criteria that the session engine alone decides, one test per criterion,
//! named after it: 6 (the output reserve) and 8 (specialists return bounded digests).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Map, Value, json};
use strata_core::budget::{OperationId, RequiredAction, Stage};
use strata_core::delegation::DigestSource;
use strata_core::entry::{Content, Role, ToolCall, ToolResult};
use strata_core::session::{
    Api, AssistantOutput, ChatRequest, SessionEngine, SessionSettings, Turn, TurnOutcome, TurnRequest,
    UpstreamCall,
};

fn request(turns: Vec<Turn>, head_max_tokens: Option<u64>) -> (ChatRequest, Map<String, Value>) {
    let mut head = Map::new();
    if let Some(max) = head_max_tokens {
        head.insert("max_tokens".into(), json!(max));
    }
    let chat = ChatRequest::plain(Api::OpenAi, "You are a test agent.", turns);
    (chat, head)
}

fn user(text: &str) -> Turn {
    Turn { role: Role::User, content: Content::text(text) }
}

fn call_turn(call_id: &str, tool: &str, arguments: &str) -> Turn {
    Turn {
        role: Role::Assistant,
        content: Content {
            tool_calls: vec![ToolCall {
                call_id: call_id.into(),
                name: tool.into(),
                arguments_json: arguments.into(),
            }],
            ..Content::default()
        },
    }
}

fn result_turn(call_id: &str, tool: &str, output: String) -> Turn {
    Turn {
        role: Role::Tool,
        content: Content {
            tool_results: vec![ToolResult { call_id: call_id.into(), name: Some(tool.into()), output }],
            ..Content::default()
        },
    }
}

fn begin(
    engine: &mut SessionEngine,
    settings: &SessionSettings,
    turns: Vec<Turn>,
    max_tokens: Option<u64>,
    step: u64,
) -> TurnOutcome {
    let (chat, head) = request(turns, max_tokens);
    let turn = TurnRequest {
        request: &chat,
        transparent: false,
        request_key: None,
        operation_id: OperationId::from_request("conformance", &step.to_le_bytes()),
        head,
        now_ms: 1_000 * step,
    };
    engine.begin_turn(settings, turn).unwrap()
}

fn body_of(call: &UpstreamCall) -> Value {
    serde_json::from_slice(&call.body.to_vec()).unwrap()
}

/// Text the parent model sees in a call.
fn prompt_text(call: &UpstreamCall) -> String {
    body_of(call)["messages"].to_string()
}

/// Asserts that an admitted call leaves the output reserve whole and sends at most the reserve as
/// `max_tokens`.
fn assert_reserve_kept(call: &UpstreamCall, settings: &SessionSettings) {
    let reserve = settings.budget.reserved_completion_tokens;
    assert!(
        call.status.tokens + reserve <= settings.limit,
        "prompt {} + reserve {reserve} > limit {}",
        call.status.tokens,
        settings.limit
    );
    let stage = call.stages.iter().find(|usage| usage.stage == Stage::OutputReserve).unwrap();
    assert!(!stage.over);
    assert_eq!(stage.ceiling, reserve);
    if let Some(sent) = body_of(call).get("max_tokens") {
        assert!(sent.as_u64().unwrap() <= reserve, "max_tokens {sent} above the reserve {reserve}");
    }
}

/// Criterion 6: required output tokens cannot be consumed by retrieval or expert expansion without
/// an explicit fallback decision. Retrieval (tool results) and expert expansion (delegation
/// results) are pushed at a small window until it is full: every call the engine admits leaves the
/// output reserve free and clamps `max_tokens` to it; when there is no room, the fallback is
/// explicit: a `context_budget_exceeded` block naming `purge_or_compact` (automatic compaction
/// off), or a compaction the call records (on).
#[test]
fn criterion_06_output_reserve_not_consumed() {
    for automatic in [false, true] {
        let mut settings = SessionSettings::defaults(Api::OpenAi, 24_000);
        settings.budget.reserved_completion_tokens = 4_000;
        settings.automatic_compaction = automatic;
        settings.compaction.keep_recent_entries = 4;
        settings.delegation.return_tokens = 600;
        // Elision off, so retrieval fills the window instead of ageing out of it.
        settings.elision.elide_over_chars = usize::MAX;
        // Retrieval results (7.4k characters) stay under the spill threshold, so they fill the window.
        settings.spill.max_result_chars = 8_000;
        let mut engine = SessionEngine::in_memory(&settings, 0).unwrap();
        let (mut blocked, mut compactions, mut clamped, mut admitted_calls) = (0, 0, 0, 0);
        for step in 0..40u64 {
            let call_id = format!("call_{step}");
            let (tool, output) = if step % 3 == 2 {
                // Expert expansion: a sub-agent's long report.
                (
                    "task",
                    format!("Report {step}.\n{}", "- finding about the module and its tests\n".repeat(2_000)),
                )
            } else {
                // Retrieval: a large search result, under the spill threshold.
                ("search", format!("result {step}: {}", "matching line of retrieved text ".repeat(230)))
            };
            let turns = vec![
                user(&format!("step {step}: look it up")),
                call_turn(&call_id, tool, r#"{"q":"x"}"#),
                result_turn(&call_id, tool, output),
            ];
            match begin(&mut engine, &settings, turns, Some(64_000), step) {
                TurnOutcome::NeedsWholeHistory => panic!("asked for whole turns, and every turn was whole"),
                TurnOutcome::Blocked(notice) => {
                    assert_eq!(notice.required_action, RequiredAction::PurgeOrCompact);
                    assert!(!automatic || notice.current_context_tokens > 0);
                    blocked += 1;
                }
                TurnOutcome::Admitted(admitted) => {
                    admitted_calls += 1;
                    compactions += admitted.compactions;
                    let call = &admitted.first_call;
                    assert_reserve_kept(call, &settings);
                    let clamp = call.max_tokens_clamp.expect("64,000 is above the reserve");
                    assert_eq!((clamp.requested, clamp.applied), (64_000, 4_000));
                    clamped += 1;
                    for digest in &admitted.digests {
                        assert!(digest.return_tokens <= settings.delegation.return_tokens);
                    }
                    let answer =
                        AssistantOutput { text: format!("noted {step}"), ..AssistantOutput::default() };
                    engine.record_answer(&settings, call, &answer, 1_000 * step).unwrap();
                }
            }
        }
        assert!(admitted_calls > 0 && clamped == admitted_calls);
        if automatic {
            assert!(compactions > 0, "a full window was compacted, not eaten into the reserve");
        } else {
            assert!(blocked > 0, "a full window blocked the request explicitly");
        }
    }
}

/// Criterion 8: every specialist returns a bounded ExpertDigest; raw working material is not
/// automatically copied into the parent context. A structured result is checked against the digest
/// schema, a free-text one is digested extractively and marked so, both within the parent-return
/// budget; the raw result stays reopenable by its `data_ref` through `strata_read_output`.
#[test]
fn criterion_08_specialist_returns_bounded_digest() {
    let mut settings = SessionSettings::defaults(Api::OpenAi, 200_000);
    settings.delegation.return_tokens = 500;
    let mut engine = SessionEngine::in_memory(&settings, 0).unwrap();
    let findings: Vec<Value> = (0..400)
        .map(|i| json!({"finding": format!("raw working note {i} on the cache layer"), "evidence": format!("src/cache{i}.rs")}))
        .collect();
    let structured = serde_json::to_string_pretty(&json!({
        "status": "completed",
        "summary": "Audited the cache layer",
        "findings": findings,
        "actions_taken": ["pinned the eviction order"],
        "open_questions": ["should the TTL be per tenant?"],
        "artifacts": ["docs/cache-audit.md"]
    }))
    .unwrap();
    let free_text = format!(
        "I looked at the flaky integration test.\n{}\nI decided to pin the port.\nShould CI run it serially?\n",
        "trace: intermediate working line of the specialist's transcript\n".repeat(1_500)
    );
    let turns = vec![
        user("delegate the audits"),
        call_turn("d1", "delegate_task", r#"{"task":"audit the cache"}"#),
        result_turn("d1", "delegate_task", structured.clone()),
        call_turn("d2", "task", r#"{"task":"the flaky test"}"#),
        result_turn("d2", "task", free_text.clone()),
    ];
    let TurnOutcome::Admitted(admitted) = begin(&mut engine, &settings, turns, None, 1) else {
        panic!("blocked")
    };
    assert_eq!(admitted.digests.len(), 2);
    let (first, second) = (&admitted.digests[0], &admitted.digests[1]);
    assert_eq!(first.source, DigestSource::Structured);
    assert_eq!(second.source, DigestSource::Extractive);
    for digest in &admitted.digests {
        assert!(digest.return_tokens <= 500, "{digest:?}");
        assert!(digest.full_tokens > 5 * digest.return_tokens, "{digest:?}");
    }
    assert!(first.omitted_items > 0, "the 400 findings do not fit 500 tokens");
    let prompt = prompt_text(&admitted.first_call);
    assert!(prompt.contains("Audited the cache layer"));
    assert!(prompt.contains("should the TTL be per tenant?"), "open questions kept apart: {prompt}");
    assert!(prompt.contains("extractive (free-text result)"));
    assert!(prompt.contains("I decided to pin the port."));
    assert!(!prompt.contains("raw working note 399"), "raw findings past the budget stay out");
    assert_eq!(prompt.matches("intermediate working line").count(), 0, "the transcript stays out");
    assert!(prompt.contains(&first.data_ref) && prompt.contains(&second.data_ref));

    // The full result is reopenable through the model's own tool.
    let read = AssistantOutput {
        tool_calls: vec![ToolCall {
            call_id: "r1".into(),
            name: "strata_read_output".into(),
            arguments_json:
                json!({"data_ref": first.data_ref, "mode": "search", "pattern": "raw working note 399 "})
                    .to_string(),
        }],
        ..AssistantOutput::default()
    };
    let effects = engine.record_answer(&settings, &admitted.first_call, &read, 2_000).unwrap();
    assert!(effects.internal);
    let next = engine.next_call(&settings, Map::new()).unwrap();
    let reread = prompt_text(&next);
    assert!(
        reread.contains("raw working note 399 on the cache layer"),
        "{}",
        &reread[reread.len().saturating_sub(2_000)..]
    );
}

//! The session engine end to end, in memory: turns in, upstream bodies out, and automatic
//! compaction instead of a blocked turn when the context fills.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::Map;
use strata_core::budget::OperationId;
use strata_core::entry::{Content, Role};
use strata_core::session::{
    Api, AssistantOutput, ChatRequest, SessionEngine, SessionSettings, Turn, TurnOutcome, TurnRequest,
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

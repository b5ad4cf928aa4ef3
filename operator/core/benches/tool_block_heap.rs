//! The live heap a coding agent's tool block costs a sidecar, measured with dhat's counting
//! allocator: the block parsed once (the gateway's `ToolBlocks` keeps it), and what the session
//! engine keeps beyond an engine that saw no tools, after a few Stateful requests that carry the
//! shared block, for each provider API. Run: `cargo bench -p strata-core --bench tool_block_heap`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;

use serde_json::{Map, Value};
use strata_core::budget::OperationId;
use strata_core::entry::{Content, Role};
use strata_core::replay::tool_set::synthetic_tool_set;
use strata_core::session::tool_block::Tools;
use strata_core::session::{
    Api, AssistantOutput, ChatRequest, SessionEngine, SessionSettings, Turn, TurnOutcome, TurnRequest,
};
use strata_core::tokens::{TokenCounter, TokenizerKind};

#[global_allocator]
static ALLOCATOR: dhat::Alloc = dhat::Alloc;

/// The heap's live bytes now, in KiB.
fn live_kib() -> f64 {
    dhat::HeapStats::get().curr_bytes as f64 / 1024.0
}

/// The live heap an engine on `api` holds after five requests that carry `tools`, in KiB.
fn engine_heap_kib(api: Api, tools: &Tools) -> f64 {
    let mut settings = SessionSettings::defaults(api, 1_000_000);
    settings.automatic_compaction = false;
    let dir = tempfile::tempdir().unwrap();
    let before = live_kib();
    let mut engine = SessionEngine::open(dir.path(), &settings, 0).unwrap();
    for number in 1..=5u64 {
        let user =
            Turn { role: Role::User, content: Content::text(format!("What changed in step {number}?")) };
        let mut chat = ChatRequest::plain(api, "You are a careful assistant.", vec![user]);
        chat.tools = Arc::clone(tools);
        let request = TurnRequest {
            request: &chat,
            transparent: false,
            request_key: None,
            operation_id: OperationId::from_request("heap", &number.to_le_bytes()),
            head: Map::new(),
            now_ms: number,
        };
        let TurnOutcome::Admitted(admitted) = engine.begin_turn(&settings, request).unwrap() else {
            panic!("request {number} was blocked");
        };
        let answer = AssistantOutput { text: format!("Noted, step {number}."), ..AssistantOutput::default() };
        engine.record_answer(&settings, &admitted.first_call, &answer, number).unwrap();
    }
    let held = live_kib() - before;
    drop(engine);
    held
}

fn main() {
    let _profiler = dhat::Profiler::builder().testing().build();
    let counter = TokenCounter::new(TokenizerKind::O200kBase).unwrap();
    let text = serde_json::to_string(&synthetic_tool_set(20_000, &counter)).unwrap();
    let before = live_kib();
    let parsed: Vec<Value> = serde_json::from_str(&text).unwrap();
    let parsed_kib = live_kib() - before;
    let tools: Tools = parsed.into();
    println!(
        "tool block of 20k tokens: {:.0} KiB of JSON, {parsed_kib:.0} KiB parsed",
        text.len() as f64 / 1024.0
    );
    let none = Tools::default();
    // The tokenizer's tables and the rules' regexes are built once per process, before measuring.
    engine_heap_kib(Api::OpenAi, &none);
    for api in [Api::OpenAi, Api::Anthropic] {
        let without = engine_heap_kib(api, &none);
        let with = engine_heap_kib(api, &tools);
        println!(
            "{api:?} engine after 5 requests: {without:.0} KiB without tools, {with:.0} KiB with the block"
        );
    }
}

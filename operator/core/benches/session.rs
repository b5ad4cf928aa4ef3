//! The session engine's own cost of one Stateful request, on disk: `begin_turn` (journal the new
//! user message, admit it, compile the upstream body) plus `record_answer` (journal the answer and
//! learn from its usage), at 1k-, 50k- and 200k-token journals. This is the work the gateway hands
//! to the blocking pool twice per request; the gateway bench adds the HTTP hops around it.
//!
//! Each sample seeds a new journal through the same engine (outside the timing, so its rendered
//! history is warm, as in a running gateway) and then times a fixed number of turns, so the journal grows by a few thousand tokens at most, as in the gateway bench.
//! The journal's fsyncs are not part of it: the gateway makes a request durable with one group
//! commit after the engine call.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, SamplingMode, criterion_group, criterion_main};
use serde_json::Map;
use strata_core::budget::OperationId;
use strata_core::entry::{Content, Role};
use strata_core::replay::tool_set::synthetic_tool_set;
use strata_core::session::message_memo::MessageMemo;
use strata_core::session::tool_block::{ToolBlocks, Tools};
use strata_core::session::{
    Api, AssistantOutput, ChatRequest, SessionEngine, SessionSettings, Turn, TurnOutcome, TurnRequest,
};
use strata_core::tokens::{TokenCounter, TokenizerKind};

/// Turns per sample: enough to time, few enough that the journal stays near its size.
const TURNS_PER_SAMPLE: u64 = 100;

fn settings(api: Api) -> SessionSettings {
    let mut settings = SessionSettings::defaults(api, 1_000_000);
    settings.automatic_compaction = false;
    settings
}

/// A request of one user message under the bench's system prompt, with `tools` (shared, as the
/// gateway hands over a tool block whose bytes did not change).
fn request(api: Api, text: String, tools: &Tools) -> ChatRequest {
    let user = Turn { role: Role::User, content: Content::text(text) };
    let mut chat = ChatRequest::plain(api, "You are a careful assistant.", vec![user]);
    chat.tools = Arc::clone(tools);
    chat
}

/// One request and its answer; returns nothing, panics if the turn is not admitted.
fn turn(engine: &mut SessionEngine, settings: &SessionSettings, number: u64, chat: &ChatRequest) {
    let request = TurnRequest {
        request: chat,
        transparent: false,
        request_key: None,
        operation_id: OperationId::from_request("bench", &number.to_le_bytes()),
        head: Map::new(),
        now_ms: number,
    };
    let TurnOutcome::Admitted(admitted) = engine.begin_turn(settings, request).unwrap() else {
        panic!("turn {number} was blocked");
    };
    let answer = AssistantOutput { text: format!("Noted, step {number}."), ..AssistantOutput::default() };
    engine.record_answer(settings, &admitted.first_call, &answer, number).unwrap();
}

/// An engine on a new data directory whose journal holds about `tokens` tokens of notes, and the
/// next turn number. The engine that wrote the notes is the one measured, so its rendered history
/// is as warm as a running gateway's.
fn seed(dir: &Path, settings: &SessionSettings, tokens: u64, tools: &Tools) -> (SessionEngine, u64) {
    let mut engine = SessionEngine::open(dir, settings, 0).unwrap();
    let mut number = 1;
    while engine.status(settings).unwrap().tokens < tokens {
        let note =
            format!("Note {number}: {}", "the deploy of service-a finished; logs are clean. ".repeat(40));
        turn(&mut engine, settings, number, &request(settings.api, note, tools));
        number += 1;
    }
    (engine, number)
}

/// Times `begin_turn` + `record_answer` at each journal size in `sizes`, every request carrying
/// `tools` (the requests are built before the timing: the engine's work is measured).
fn measure(c: &mut Criterion, name: &str, settings: &SessionSettings, sizes: &[u64], tools: &Tools) {
    let root = tempfile::tempdir().unwrap();
    let mut group = c.benchmark_group(name);
    group.sampling_mode(SamplingMode::Flat).sample_size(20).measurement_time(Duration::from_secs(4));
    for &size in sizes {
        let mut samples = 0u64;
        group.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, _| {
            b.iter_custom(|iterations| {
                let mut total = Duration::ZERO;
                let mut done = 0;
                while done < iterations {
                    samples += 1;
                    let dir = root.path().join(format!("run-{size}-{samples}"));
                    let (mut engine, next) = seed(&dir, settings, size, tools);
                    let batch = TURNS_PER_SAMPLE.min(iterations - done);
                    let requests: Vec<ChatRequest> = (next..next + batch)
                        .map(|number| {
                            request(settings.api, format!("What changed since step {number}?"), tools)
                        })
                        .collect();
                    let started = Instant::now();
                    for (number, chat) in (next..).zip(&requests) {
                        turn(&mut engine, settings, number, chat);
                    }
                    total += started.elapsed();
                    done += batch;
                    drop(engine);
                    std::fs::remove_dir_all(&dir).unwrap();
                }
                total
            });
        });
    }
    group.finish();
}

/// Times what the gateway does to a Stateful body before the engine, apart from parsing its new
/// message: the top-level split and taking the tool block (the same bytes as the last request's,
/// so the kept value). `tools_first` puts the block before `messages`, as some clients do.
fn measure_body_read(c: &mut Criterion, tools: &[serde_json::Value]) {
    let block = serde_json::to_string(tools).unwrap();
    let mut group = c.benchmark_group("stateful_body_read_20k_tool_tokens");
    group.sample_size(30).measurement_time(Duration::from_secs(4));
    for tools_first in [false, true] {
        let message = r#"{"role":"user","content":"What changed since the last step?"}"#;
        let body = if tools_first {
            format!(r#"{{"model":"m","tools":{block},"messages":[{message}],"stream":false}}"#)
        } else {
            format!(r#"{{"model":"m","messages":[{message}],"tools":{block},"stream":false}}"#)
        };
        let blocks = ToolBlocks::default();
        let mut memo = MessageMemo::default();
        let mut read = |body: &[u8]| {
            let split = memo.split(Api::OpenAi, body, blocks.last_bytes().as_deref()).unwrap();
            let tools = blocks.read(body, split.tools.clone()).unwrap();
            (split.messages.len(), tools.len())
        };
        read(body.as_bytes());
        let name = if tools_first { "tools_before_messages" } else { "tools_after_messages" };
        group.bench_function(name, |b| b.iter(|| read(std::hint::black_box(body.as_bytes()))));
    }
    group.finish();
}

fn bench_session(c: &mut Criterion) {
    let no_tools = Tools::default();
    measure(c, "stateful_request_engine_work", &settings(Api::OpenAi), &[1_000, 50_000, 200_000], &no_tools);
    // A coding agent's client sends its whole tool block with every request (about 20k tokens for
    // Claude Code with a few connectors); the engine must notice it is unchanged cheaply.
    let counter = TokenCounter::new(TokenizerKind::O200kBase).unwrap();
    let tool_set = synthetic_tool_set(20_000, &counter);
    measure_body_read(c, &tool_set);
    let tools: Tools = tool_set.into();
    measure(c, "stateful_request_engine_work_20k_tool_tokens", &settings(Api::Anthropic), &[1_000], &tools);
}

criterion_group!(benches, bench_session);
criterion_main!(benches);

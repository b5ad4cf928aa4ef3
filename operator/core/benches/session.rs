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
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, SamplingMode, criterion_group, criterion_main};
use serde_json::Map;
use strata_core::budget::OperationId;
use strata_core::entry::{Content, Role};
use strata_core::session::{
    Api, AssistantOutput, ChatRequest, SessionEngine, SessionSettings, Turn, TurnOutcome, TurnRequest,
};

/// Turns per sample: enough to time, few enough that the journal stays near its size.
const TURNS_PER_SAMPLE: u64 = 100;

fn settings() -> SessionSettings {
    let mut settings = SessionSettings::defaults(Api::OpenAi, 1_000_000);
    settings.automatic_compaction = false;
    settings
}

/// One request and its answer; returns nothing, panics if the turn is not admitted.
fn turn(engine: &mut SessionEngine, settings: &SessionSettings, number: u64, text: String) {
    let user = Turn { role: Role::User, content: Content::text(text) };
    let chat = ChatRequest::plain(Api::OpenAi, "You are a careful assistant.", vec![user]);
    let request = TurnRequest {
        request: &chat,
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
fn seed(dir: &Path, settings: &SessionSettings, tokens: u64) -> (SessionEngine, u64) {
    let mut engine = SessionEngine::open(dir, settings, 0).unwrap();
    let mut number = 1;
    while engine.status(settings).unwrap().tokens < tokens {
        let note =
            format!("Note {number}: {}", "the deploy of service-a finished; logs are clean. ".repeat(40));
        turn(&mut engine, settings, number, note);
        number += 1;
    }
    (engine, number)
}

fn bench_session(c: &mut Criterion) {
    let settings = settings();
    let root = tempfile::tempdir().unwrap();
    let mut group = c.benchmark_group("stateful_request_engine_work");
    group.sampling_mode(SamplingMode::Flat).sample_size(20).measurement_time(Duration::from_secs(4));
    for size in [1_000u64, 50_000, 200_000] {
        let mut samples = 0u64;
        group.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, _| {
            b.iter_custom(|iterations| {
                let mut total = Duration::ZERO;
                let mut done = 0;
                while done < iterations {
                    samples += 1;
                    let dir = root.path().join(format!("run-{size}-{samples}"));
                    let (mut engine, next) = seed(&dir, &settings, size);
                    let batch = TURNS_PER_SAMPLE.min(iterations - done);
                    let started = Instant::now();
                    for offset in 0..batch {
                        let number = next + offset;
                        turn(&mut engine, &settings, number, format!("What changed since step {number}?"));
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

criterion_group!(benches, bench_session);
criterion_main!(benches);

//! Two invariants on every compiled request, under random traffic: it keeps the provider's
//! tool-pairing rules, and every `data_ref` Strata put in it opens byte-exact from the artifact
//! store. A property test drives random sequences of user turns, parallel tool calls answered in
//! any order (some left unanswered, some results orphaned, some huge, some repeated), dated system
//! prompts, time passing (expiry), elision, deduplication, purges, compactions, rollbacks, gateway restarts
//! and client divergence (truncated and edited histories) through a session engine on disk, and
//! checks both invariants after every step, for both provider APIs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use proptest::prelude::*;
use regex::Regex;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use strata_core::artifacts::ArtifactRef;
use strata_core::budget::OperationId;
use strata_core::compaction::{CompactionMode, rollback};
use strata_core::entry::{Content, Role, ToolCall, ToolResult};
use strata_core::journal::{Journal, JournalOptions, StdStorage};
use strata_core::session::protocol::check_request;
use strata_core::session::{
    Api, AssistantOutput, ChatRequest, CompactionAsk, SessionEngine, SessionSettings, Turn, TurnOutcome,
    TurnRequest,
};

/// What the model answers to a request.
#[derive(Debug, Clone)]
enum Answer {
    Text,
    Calls(usize),
    Purge,
}

/// One step of the traffic.
#[derive(Debug, Clone)]
enum Step {
    /// The user says something (short, a repeated 300-char block, or huge).
    User(u8, Answer),
    /// The client answers the pending tool calls: in a rotated order, maybe leaving one out,
    /// maybe adding an orphan, with outputs small, repeated or huge.
    Results { rotate: usize, drop_one: bool, orphan: bool, size: u8, answer: Answer },
    /// The client rewinds its history to a fraction of its length, maybe editing a user turn.
    Diverge { keep_percent: u8, edit: bool, answer: Answer },
    /// An explicit compaction.
    Compact,
    /// Hours pass (retention expiry).
    Advance(u8),
    /// The gateway restarts on the same volume.
    Restart,
    /// The gateway is stopped, the journal rolled back to the oldest retained generation (as
    /// `strata compact --mode Rollback` does on a suspended agent), and the gateway restarted.
    Rollback,
    /// The system prompt's date changes.
    NewDay,
}

fn answer() -> impl Strategy<Value = Answer> {
    prop_oneof![3 => Just(Answer::Text), 3 => (1usize..4).prop_map(Answer::Calls), 1 => Just(Answer::Purge)]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0u8..3, answer()).prop_map(|(size, answer)| Step::User(size, answer)),
        5 => (0usize..4, any::<bool>(), any::<bool>(), 0u8..3, answer()).prop_map(
            |(rotate, drop_one, orphan, size, answer)| Step::Results { rotate, drop_one, orphan, size, answer }
        ),
        1 => (0u8..100, any::<bool>(), answer()).prop_map(|(keep_percent, edit, answer)| Step::Diverge { keep_percent, edit, answer }),
        1 => Just(Step::Compact),
        1 => (1u8..30).prop_map(Step::Advance),
        1 => Just(Step::Restart),
        1 => Just(Step::Rollback),
        1 => Just(Step::NewDay),
    ]
}

fn text_of_size(size: u8, seed: usize) -> String {
    match size {
        0 => format!("note {seed}"),
        1 => "the same long output line, repeated so that it is worth deduplicating\n".repeat(5),
        _ => format!("{seed}: {}", "a huge tool output line with many words in it\n".repeat(1_500)),
    }
}

struct Client {
    api: Api,
    history: Vec<Turn>,
    pending: Vec<ToolCall>,
    day: u32,
    now_ms: u64,
    calls: usize,
}

fn data_ref_pattern() -> Regex {
    Regex::new(r"art:sha256:[0-9a-f]{64}").unwrap()
}

/// Both invariants on one upstream body.
fn check(engine: &SessionEngine, settings: &SessionSettings, api: Api, body: &[u8], context: &str) {
    let value: Value = serde_json::from_slice(body).unwrap_or_else(|e| panic!("{context}: not JSON: {e}"));
    if let Err(violation) = check_request(api, &value) {
        let journal: Vec<String> = engine
            .journal()
            .entries()
            .iter()
            .map(|entry| {
                let calls: Vec<&str> = entry.content.tool_calls.iter().map(|c| c.call_id.as_str()).collect();
                let results: Vec<&str> =
                    entry.content.tool_results.iter().map(|r| r.call_id.as_str()).collect();
                format!("{} {:?} calls {calls:?} results {results:?}", entry.id, entry.role)
            })
            .collect();
        panic!(
            "{context}: protocol violation: {violation}\njournal generation {}: {journal:#?}\n{}",
            engine.journal().generation(),
            value["messages"]
        );
    }
    let text = String::from_utf8_lossy(body);
    for found in data_ref_pattern().find_iter(&text) {
        let data_ref: ArtifactRef = found.as_str().parse().unwrap();
        let bytes = engine
            .store()
            .get(&settings.tenant, &data_ref)
            .unwrap_or_else(|e| panic!("{context}: {data_ref} does not open: {e}"));
        assert_eq!(
            hex::encode(Sha256::digest(&bytes)),
            data_ref.digest_hex(),
            "{context}: {data_ref} is not byte-exact"
        );
    }
}

fn model_output(client: &mut Client, answer: &Answer, engine: &SessionEngine) -> AssistantOutput {
    client.calls += 1;
    let call = client.calls;
    match answer {
        Answer::Text => AssistantOutput { text: format!("answer {call}"), ..AssistantOutput::default() },
        Answer::Calls(count) => AssistantOutput {
            text: format!("calling {count} tools"),
            tool_calls: (0..*count)
                .map(|index| ToolCall {
                    call_id: format!("call_{call}_{index}"),
                    name: "run".into(),
                    arguments_json: format!("{{\"step\":{call}}}"),
                })
                .collect(),
            ..AssistantOutput::default()
        },
        Answer::Purge => {
            let ids: Vec<String> =
                engine.journal().entries().iter().take(2).map(|entry| entry.id.to_string()).collect();
            AssistantOutput {
                text: String::new(),
                tool_calls: vec![ToolCall {
                    call_id: format!("call_{call}_purge"),
                    name: "strata_purge".into(),
                    arguments_json: serde_json::json!({"ids": ids, "summary": "purged early turns"})
                        .to_string(),
                }],
                ..AssistantOutput::default()
            }
        }
    }
}

/// Sends the client's whole history, answers with `answer`, and checks every compiled call.
fn send(engine: &mut SessionEngine, settings: &SessionSettings, client: &mut Client, answer: &Answer) {
    let system =
        format!("You are a careful agent.\nToday's date is 2026-12-{:02}.\nWork step by step.", client.day);
    let request = ChatRequest::plain(client.api, system, client.history.clone());
    let turn = TurnRequest {
        request: &request,
        transparent: true,
        request_key: None,
        operation_id: OperationId::from_request("test", &client.calls.to_le_bytes()),
        head: Map::new(),
        now_ms: client.now_ms,
    };
    let admitted = match engine.begin_turn(settings, turn).unwrap() {
        TurnOutcome::Blocked(_) => return,
        TurnOutcome::Admitted(admitted) => admitted,
        TurnOutcome::NeedsWholeHistory => panic!("asked for whole turns, and every turn was whole"),
    };
    check(engine, settings, client.api, &admitted.first_call.body.to_vec(), "first call");
    let mut call = admitted.first_call;
    let mut output = model_output(client, answer, engine);
    loop {
        let effects = engine.record_answer(settings, &call, &output, client.now_ms).unwrap();
        if !effects.internal {
            break;
        }
        call = engine.next_call(settings, Map::new()).unwrap();
        check(engine, settings, client.api, &call.body.to_vec(), "after a memory tool");
        output = model_output(client, &Answer::Text, engine);
    }
    let visible = output.visible_turn(|name| name.starts_with("strata_"));
    engine.remember_answer(admitted.chain_tail, &visible).unwrap();
    client.pending = visible.content.tool_calls.clone();
    client.history.push(visible);
}

fn run(api: Api, steps: &[Step], dir: &Path) {
    let mut settings = SessionSettings::defaults(api, 24_000);
    settings.budget.reserved_completion_tokens = 1_000;
    settings.compaction.keep_recent_entries = 4;
    let mut engine = SessionEngine::open(dir, &settings, 0).unwrap();
    let mut client = Client { api, history: Vec::new(), pending: Vec::new(), day: 1, now_ms: 0, calls: 0 };
    for (index, step) in steps.iter().enumerate() {
        client.now_ms += 60_000;
        match step {
            Step::User(size, answer) => {
                let text = text_of_size(*size, index);
                client.history.push(Turn { role: Role::User, content: Content::text(text) });
                send(&mut engine, &settings, &mut client, answer);
            }
            Step::Results { rotate, drop_one, orphan, size, answer } => {
                let mut calls = std::mem::take(&mut client.pending);
                if calls.is_empty() {
                    client
                        .history
                        .push(Turn { role: Role::User, content: Content::text(format!("go on {index}")) });
                } else {
                    let shift = rotate % calls.len();
                    calls.rotate_left(shift);
                    if *drop_one && calls.len() > 1 {
                        calls.pop();
                    }
                    let mut ids: Vec<String> = calls.iter().map(|call| call.call_id.clone()).collect();
                    if *orphan {
                        ids.push(format!("call_orphan_{index}"));
                    }
                    for id in ids {
                        let result =
                            ToolResult { call_id: id, name: None, output: text_of_size(*size, index) };
                        client.history.push(Turn {
                            role: Role::Tool,
                            content: Content { tool_results: vec![result], ..Content::default() },
                        });
                    }
                }
                send(&mut engine, &settings, &mut client, answer);
            }
            Step::Diverge { keep_percent, edit, answer } => {
                let keep = client.history.len() * usize::from(*keep_percent) / 100;
                client.history.truncate(keep);
                if *edit
                    && let Some(turn) = client.history.iter_mut().rev().find(|turn| turn.role == Role::User)
                {
                    turn.content.text.push_str(" (edited)");
                }
                client.pending.clear();
                client.history.push(Turn {
                    role: Role::User,
                    content: Content::text(format!("new direction {index}")),
                });
                send(&mut engine, &settings, &mut client, answer);
            }
            Step::Compact => {
                let _ = engine
                    .compact(&settings, &CompactionAsk::new(CompactionMode::Budget, "test"), client.now_ms)
                    .unwrap();
            }
            Step::Advance(hours) => client.now_ms += u64::from(*hours) * 3_600_000,
            Step::Restart => {
                drop(engine);
                engine = SessionEngine::open(dir, &settings, client.now_ms).unwrap();
            }
            Step::Rollback => {
                drop(engine);
                let storage = std::sync::Arc::new(StdStorage);
                let (mut journal, _) =
                    Journal::open(storage, dir, JournalOptions::new("strata compact", client.now_ms))
                        .unwrap();
                if let Some(&target) = journal.retained_generations().unwrap().first() {
                    rollback(&mut journal, target, Some("test".into()), "tenant", client.now_ms).unwrap();
                }
                drop(journal);
                engine = SessionEngine::open(dir, &settings, client.now_ms).unwrap();
            }
            Step::NewDay => client.day = client.day % 28 + 1,
        }
        let call = engine.next_call(&settings, Map::new()).unwrap();
        check(&engine, &settings, api, &call.body.to_vec(), &format!("after step {index} ({step:?})"));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn every_compiled_request_is_protocol_valid_and_its_references_open(
        anthropic in any::<bool>(),
        steps in prop::collection::vec(step(), 1..36),
    ) {
        let dir = tempfile::tempdir().unwrap();
        run(if anthropic { Api::Anthropic } else { Api::OpenAi }, &steps, dir.path());
    }
}

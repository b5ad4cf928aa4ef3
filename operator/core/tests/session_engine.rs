//! The session engine end to end, in memory: turns in, upstream bodies out, and automatic
//! compaction instead of a blocked turn when the context fills.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::Map;
use strata_core::budget::OperationId;
use strata_core::compaction::{CompactionMode, EXTRACTIVE_VERSION, ExtractiveSummarizer};
use strata_core::entry::{Content, EntryDraft, EntryKind, RetentionClass, Role, ToolCall, ToolResult};
use strata_core::journal::{
    AppendHandle, BaselineEntry, CompactionProposal, LockOutcome, StdStorage, Storage, propose_compaction,
    read_current_generation,
};
use strata_core::retention::Classifier;
use strata_core::session::protocol::check_request;
use strata_core::session::{
    Api, AssistantOutput, ChatRequest, CompactionAsk, SessionEngine, SessionSettings, Turn, TurnOutcome,
    TurnRequest, transparent,
};

fn request(turns: Vec<Turn>) -> ChatRequest {
    ChatRequest::plain(Api::OpenAi, "You are a test agent.", turns)
}

fn user(text: String) -> Turn {
    Turn { role: Role::User, content: Content::text(text) }
}

/// Call `call` of a stateful session (no request key), at `call` seconds.
fn stateful_turn<'a>(chat: &'a ChatRequest, label: &str, call: usize) -> TurnRequest<'a> {
    TurnRequest {
        request: chat,
        transparent: false,
        request_key: None,
        operation_id: OperationId::from_request(label, &call.to_le_bytes()),
        head: Map::new(),
        now_ms: 1_000 * call as u64,
    }
}

/// Drives `calls` turns of about 2k tokens each through a stateful session; returns how many were
/// blocked and how many compactions ran.
fn drive(settings: &SessionSettings, calls: usize) -> (usize, u64) {
    let mut engine = SessionEngine::in_memory(settings, 0).unwrap();
    let (mut blocked, mut compactions) = (0, 0);
    for call in 0..calls {
        let text = format!("step {call}: {}", "lorem ipsum dolor sit amet ".repeat(400));
        let chat = request(vec![user(text)]);
        match engine.begin_turn(settings, stateful_turn(&chat, "test", call)).unwrap() {
            TurnOutcome::Blocked(_) => blocked += 1,
            TurnOutcome::NeedsWholeHistory => panic!("asked for whole turns, and every turn was whole"),
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
        request_key: None,
        operation_id: OperationId::from_request("test", &at.to_le_bytes()),
        head: Map::new(),
        now_ms: at,
    };
    match engine.begin_turn(settings, turn).unwrap() {
        TurnOutcome::Admitted(admitted) => admitted.first_call,
        TurnOutcome::Blocked(notice) => panic!("blocked: {notice:?}"),
        TurnOutcome::NeedsWholeHistory => panic!("asked for whole turns, and every turn was whole"),
    }
}

/// Ten answered turns of small talk about log files.
fn read_ten_logs(engine: &mut SessionEngine, settings: &SessionSettings) {
    for step in 0..10u64 {
        let call = send(engine, settings, vec![user(format!("step {step}: read the next log"))], step);
        let answer = AssistantOutput { text: format!("read log {step}"), ..AssistantOutput::default() };
        engine.record_answer(settings, &call, &answer, step).unwrap();
    }
}

#[test]
fn a_compaction_committed_while_a_tool_call_waits_keeps_the_call_next_to_its_result() {
    let mut settings = SessionSettings::defaults(Api::OpenAi, 40_000);
    settings.model_summarizer = true;
    settings.compaction.keep_recent_entries = 2;
    let mut engine = SessionEngine::in_memory(&settings, 0).unwrap();
    read_ten_logs(&mut engine, &settings);
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
    read_ten_logs(&mut engine, &settings);
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

/// [`StdStorage`] with two faults to arm: journal appends that reach the file and then fail (the
/// process "dies" right after a record was written, before anything else happened), and removals
/// of compaction proposals that fail.
#[derive(Default)]
struct FaultyStorage {
    armed: Arc<AtomicBool>,
    proposal_removal_fails: Arc<AtomicBool>,
}

struct DyingHandle {
    inner: Box<dyn AppendHandle>,
    armed: Arc<AtomicBool>,
}

impl AppendHandle for DyingHandle {
    fn append(&mut self, data: &[u8]) -> io::Result<()> {
        self.inner.append(data)?;
        if self.armed.load(Ordering::SeqCst) {
            return Err(io::Error::other("killed right after the append"));
        }
        Ok(())
    }

    fn sync(&mut self) -> io::Result<()> {
        self.inner.sync()
    }
}

impl Storage for FaultyStorage {
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        StdStorage.read(path)
    }
    fn exists(&self, path: &Path) -> io::Result<bool> {
        StdStorage.exists(path)
    }
    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        StdStorage.list_dir(path)
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        StdStorage.create_dir_all(path)
    }
    fn write_file(&self, path: &Path, data: &[u8]) -> io::Result<()> {
        StdStorage.write_file(path, data)
    }
    fn open_append(&self, path: &Path) -> io::Result<Box<dyn AppendHandle>> {
        let inner = StdStorage.open_append(path)?;
        if path.file_name().is_some_and(|name| name == "journal.log") {
            return Ok(Box::new(DyingHandle { inner, armed: Arc::clone(&self.armed) }));
        }
        Ok(inner)
    }
    fn truncate(&self, path: &Path, len: u64) -> io::Result<()> {
        StdStorage.truncate(path, len)
    }
    fn sync_file(&self, path: &Path) -> io::Result<()> {
        StdStorage.sync_file(path)
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        StdStorage.sync_dir(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        StdStorage.rename(from, to)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let proposal = path.parent().and_then(Path::file_name).is_some_and(|dir| dir == "proposals");
        if proposal && self.proposal_removal_fails.load(Ordering::SeqCst) {
            return Err(io::Error::other("the proposal could not be removed"));
        }
        StdStorage.remove_file(path)
    }
    fn remove_dir(&self, path: &Path) -> io::Result<()> {
        StdStorage.remove_dir(path)
    }
    fn try_lock(&self, path: &Path, holder: &str) -> io::Result<LockOutcome> {
        StdStorage.try_lock(path, holder)
    }
}

/// One transparent call: the whole history in, the answer recorded and remembered as seen.
fn transparent_call(
    engine: &mut SessionEngine,
    settings: &SessionSettings,
    history: &[Turn],
    answer: &str,
) -> Result<(), strata_core::session::EngineError> {
    let chat = request(history.to_vec());
    let turn = TurnRequest {
        request: &chat,
        transparent: true,
        request_key: None,
        operation_id: OperationId::from_request("test", answer.as_bytes()),
        head: Map::new(),
        now_ms: 1_000,
    };
    let TurnOutcome::Admitted(admitted) = engine.begin_turn(settings, turn)? else {
        panic!("blocked");
    };
    let output = AssistantOutput { text: answer.into(), ..AssistantOutput::default() };
    engine.record_answer(settings, &admitted.first_call, &output, 1_000)?;
    let seen = Turn { role: Role::Assistant, content: Content::text(answer.to_owned()) };
    engine.remember_answer(admitted.chain_tail, &seen)
}

/// `chat` as a transparent client's turn, its operation named by `label`.
fn transparent_turn<'a>(chat: &'a ChatRequest, label: &[u8]) -> TurnRequest<'a> {
    TurnRequest {
        request: chat,
        transparent: true,
        request_key: None,
        operation_id: OperationId::from_request("test", label),
        head: Map::new(),
        now_ms: 2_000,
    }
}

/// A transparent request's chain values are built in the vector an earlier request handed back
/// (the gateway recycles each request's known values), with the same values a fresh vector gets:
/// a long history's values are not allocated and freed again on every request.
#[test]
fn a_transparent_request_builds_its_chain_values_in_the_recycled_vector() {
    let settings = SessionSettings::defaults(Api::OpenAi, 100_000);
    let answer = |text: &str| Turn { role: Role::Assistant, content: Content::text(text.to_owned()) };
    let history = [user("List the files".into()), answer("a.txt"), user("Read a.txt".into())];
    let expected = transparent::TransparentIndex::in_memory().split(&history, &[]).0;
    let admit = |engine: &mut SessionEngine, chat: &ChatRequest| {
        let turn = transparent_turn(chat, b"recycled");
        let TurnOutcome::Admitted(admitted) = engine.begin_turn(&settings, turn).unwrap() else {
            panic!("not admitted")
        };
        admitted
    };

    let mut engine = SessionEngine::in_memory(&settings, 0).unwrap();
    transparent_call(&mut engine, &settings, &history[..1], "a.txt").unwrap();
    let mut recycled: Vec<[u8; 32]> = Vec::with_capacity(64);
    recycled.push([7; 32]);
    let address = recycled.as_ptr();
    engine.recycle_chains(recycled);
    let chat = ChatRequest { known_chains: expected[..2].to_vec(), ..request(history.to_vec()) };
    let admitted = admit(&mut engine, &chat);
    assert_eq!(admitted.chains, expected, "the values are the request's, the old ones cleared");
    assert_eq!(admitted.chains.as_ptr(), address, "built in the recycled vector");
    assert!(admitted.chains.capacity() >= 64, "with its room");
    assert_eq!(admitted.new_entries, 1);

    // A smaller vector is not kept over a larger one; without any, a fresh one serves.
    let mut engine = SessionEngine::in_memory(&settings, 0).unwrap();
    transparent_call(&mut engine, &settings, &history[..1], "a.txt").unwrap();
    let larger: Vec<[u8; 32]> = Vec::with_capacity(64);
    let address = larger.as_ptr();
    engine.recycle_chains(larger);
    engine.recycle_chains(Vec::with_capacity(8));
    assert_eq!(admit(&mut engine, &chat).chains.as_ptr(), address, "the larger vector is kept");
    let mut engine = SessionEngine::in_memory(&settings, 0).unwrap();
    transparent_call(&mut engine, &settings, &history[..1], "a.txt").unwrap();
    assert_eq!(admit(&mut engine, &chat).chains, expected);

    // Room for many times what the request used (a history that shrank) is let go.
    let mut engine = SessionEngine::in_memory(&settings, 0).unwrap();
    transparent_call(&mut engine, &settings, &history[..1], "a.txt").unwrap();
    engine.recycle_chains(Vec::with_capacity(10_000));
    assert!(admit(&mut engine, &chat).chains.capacity() < 10_000, "an oversized vector is not kept");
}

/// Found by the crash suite (`benches/gateway_crash.rs`): a gateway killed right after a client
/// turn was journaled, before the transparent index remembered it, took the client's retry of the
/// same history for a new turn and journaled the message twice. The index is now written ahead of
/// the journal.
#[test]
fn a_transparent_turn_journaled_just_before_a_crash_is_not_journaled_again_on_retry() {
    let dir = tempfile::tempdir().unwrap();
    let settings = SessionSettings::defaults(Api::OpenAi, 100_000);
    let armed = Arc::new(AtomicBool::new(false));
    let storage: Arc<dyn Storage> =
        Arc::new(FaultyStorage { armed: Arc::clone(&armed), ..FaultyStorage::default() });
    let u1 = user("List the files".into());
    let a1 = Turn { role: Role::Assistant, content: Content::text("a.txt and b.txt".to_owned()) };
    let u2 = user("Now read a.txt".into());
    {
        let mut engine = SessionEngine::open_on(Arc::clone(&storage), dir.path(), &settings, 0).unwrap();
        transparent_call(&mut engine, &settings, std::slice::from_ref(&u1), "a.txt and b.txt").unwrap();
        armed.store(true, Ordering::SeqCst);
        let cut = transparent_call(&mut engine, &settings, &[u1.clone(), a1.clone(), u2.clone()], "hello");
        assert!(cut.is_err(), "the append 'crashed'");
    }
    armed.store(false, Ordering::SeqCst);
    let mut engine = SessionEngine::open(dir.path(), &settings, 0).unwrap();
    transparent_call(&mut engine, &settings, &[u1, a1, u2], "hello").unwrap();
    let texts: Vec<&str> =
        engine.journal().entries().iter().map(|entry| entry.content.text.as_str()).collect();
    assert_eq!(texts, ["List the files", "a.txt and b.txt", "Now read a.txt", "hello"], "u2 once");
    assert_eq!(engine.journal().generation(), 1, "nothing to rewind");
}

/// Found in review: a refresh that committed another process's compaction and then failed to
/// remove its proposal left Tier 2 on the old generation, so the next request would have been
/// rendered from entries the journal no longer had.
#[test]
fn a_compaction_committed_by_a_refresh_that_then_failed_is_what_the_next_call_sends() {
    let dir = tempfile::tempdir().unwrap();
    let settings = SessionSettings::defaults(Api::OpenAi, 100_000);
    let removal_fails = Arc::new(AtomicBool::new(false));
    let storage: Arc<dyn Storage> = Arc::new(FaultyStorage {
        proposal_removal_fails: Arc::clone(&removal_fails),
        ..FaultyStorage::default()
    });
    let mut engine = SessionEngine::open_on(Arc::clone(&storage), dir.path(), &settings, 0).unwrap();
    transparent_call(&mut engine, &settings, &[user("List the files".into())], "a.txt and b.txt").unwrap();
    let snapshot = read_current_generation(storage.as_ref(), dir.path()).unwrap().snapshot();
    let summary = EntryDraft {
        kind: EntryKind::Summary,
        role: Role::System,
        content: Content::text("Summary: the files are a.txt and b.txt."),
        retention: RetentionClass::Working,
        created_at_ms: 9,
        tokens: 12,
        artifact_refs: Vec::new(),
    };
    let proposal = CompactionProposal {
        generation: snapshot.generation,
        watermark: snapshot.watermark,
        baseline: vec![BaselineEntry::New(summary)],
        created_at_ms: 9,
    };
    propose_compaction(storage.as_ref(), dir.path(), &proposal).unwrap();
    removal_fails.store(true, Ordering::SeqCst);
    assert!(engine.refresh(&settings, true).is_err(), "the proposal's removal failed");
    removal_fails.store(false, Ordering::SeqCst);
    assert_eq!(engine.journal().generation(), 2, "the switch was committed");
    let body = engine.next_call(&settings, Map::new()).unwrap().body.to_vec();
    let body = String::from_utf8(body).unwrap();
    assert!(body.contains("Summary: the files are a.txt and b.txt."), "{body}");
    assert!(!body.contains("List the files"), "{body}");
}

/// A turn remembered ahead of an append that never happened keeps no ID the journal may issue to
/// another entry.
#[test]
fn a_turn_remembered_but_never_journaled_is_journaled_by_the_retry() {
    let dir = tempfile::tempdir().unwrap();
    let settings = SessionSettings::defaults(Api::OpenAi, 100_000);
    let u1 = user("List the files".into());
    let a1 = Turn { role: Role::Assistant, content: Content::text("a.txt".to_owned()) };
    let u2 = user("Now read a.txt".into());
    let next = {
        let mut engine = SessionEngine::open(dir.path(), &settings, 0).unwrap();
        transparent_call(&mut engine, &settings, std::slice::from_ref(&u1), "a.txt").unwrap();
        engine.journal().next_entry_number()
    };
    // The crash came after the index line for u2 and before its record.
    let chain = [&u1, &a1, &u2].iter().fold([0u8; 32], |previous, turn| transparent::chain(&previous, turn));
    let index = dir.path().join("gateway").join("transparent-prefixes");
    let mut text = std::fs::read_to_string(&index).unwrap();
    text.push_str(&format!("{} msg_{next}\n", hex::encode(chain)));
    std::fs::write(&index, text).unwrap();
    let mut engine = SessionEngine::open(dir.path(), &settings, 0).unwrap();
    assert!(
        !std::fs::read_to_string(&index).unwrap().contains(&format!("msg_{next}")),
        "the unissued ID is forgotten"
    );
    transparent_call(&mut engine, &settings, &[u1, a1, u2], "hello").unwrap();
    let texts: Vec<&str> =
        engine.journal().entries().iter().map(|entry| entry.content.text.as_str()).collect();
    assert_eq!(texts, ["List the files", "a.txt", "Now read a.txt", "hello"]);
}

/// An always-on agent whose client starts new conversations keeps only the live conversation's
/// chain values: the old one's are forgotten (in memory and in the file) when the new one replaces
/// it, and the live one is still recognised after a restart.
#[test]
fn a_new_conversation_prunes_the_old_ones_chain_values() {
    let dir = tempfile::tempdir().unwrap();
    let settings = SessionSettings::defaults(Api::OpenAi, 100_000);
    let index = dir.path().join("gateway").join("transparent-prefixes");
    let lines = || std::fs::read_to_string(&index).unwrap().lines().count();
    let first = user("Summarise yesterday's alerts".into());
    let first_answer = Turn { role: Role::Assistant, content: Content::text("Two disk alerts.".to_owned()) };
    let follow_up = user("Which hosts?".into());
    {
        let mut engine = SessionEngine::open(dir.path(), &settings, 0).unwrap();
        transparent_call(&mut engine, &settings, std::slice::from_ref(&first), "Two disk alerts.").unwrap();
        transparent_call(
            &mut engine,
            &settings,
            &[first.clone(), first_answer.clone(), follow_up.clone()],
            "db-1",
        )
        .unwrap();
    }
    assert_eq!(lines(), 4, "two client turns and two answers");
    let fresh = user("Plan today's deploy".into());
    let fresh_answer = Turn { role: Role::Assistant, content: Content::text("Step one: freeze.".to_owned()) };
    let next = user("And step two?".into());
    {
        let mut engine = SessionEngine::open(dir.path(), &settings, 0).unwrap();
        transparent_call(&mut engine, &settings, std::slice::from_ref(&fresh), "Step one: freeze.").unwrap();
        assert!(engine.journal().generation() > 1, "the new conversation rewound the journal");
    }
    assert_eq!(lines(), 2, "only the new conversation's turn and answer are left");
    let mut engine = SessionEngine::open(dir.path(), &settings, 0).unwrap();
    let generation = engine.journal().generation();
    transparent_call(&mut engine, &settings, &[fresh, fresh_answer, next], "Step two: deploy.").unwrap();
    assert_eq!(engine.journal().generation(), generation, "the live conversation still extends the journal");
    let texts: Vec<&str> =
        engine.journal().entries().iter().map(|entry| entry.content.text.as_str()).collect();
    assert_eq!(texts, ["Plan today's deploy", "Step one: freeze.", "And step two?", "Step two: deploy."]);
}

/// A request whose reused turns came hollow (a memo keeps only the roles and chain values of the
/// answers it reuses): journaled as usual when only the turns after them are new; when the journal
/// no longer holds them, the engine asks for the whole history and changes nothing, and the whole
/// history is then journaled.
#[test]
fn hollow_turns_are_never_journaled_and_a_journal_without_them_asks_for_the_whole_history() {
    let settings = SessionSettings::defaults(Api::OpenAi, 100_000);
    let answer = |text: &str| Turn { role: Role::Assistant, content: Content::text(text.to_owned()) };
    let history =
        [user("List the files".into()), answer("a.txt"), user("Read a.txt".into()), answer("hello")];
    let mut next = history.to_vec();
    next.push(user("Thanks".into()));
    let chains = transparent::TransparentIndex::in_memory().split(&next, &[]).0;
    let hollow = |turns: &[Turn]| -> Vec<Turn> {
        turns
            .iter()
            .map(|turn| match turn.role {
                Role::User => turn.clone(),
                role => Turn { role, content: Content::default() },
            })
            .collect()
    };
    let mut with_hollows = hollow(&history);
    with_hollows.push(user("Thanks".into()));
    let call = |engine: &mut SessionEngine, chat: &ChatRequest| {
        engine.begin_turn(&settings, transparent_turn(chat, b"hollow")).unwrap()
    };
    let hollow_request =
        ChatRequest { known_chains: chains[..4].to_vec(), hollow_turns: 4, ..request(with_hollows) };

    let mut engine = SessionEngine::in_memory(&settings, 0).unwrap();
    transparent_call(&mut engine, &settings, &history[..1], "a.txt").unwrap();
    transparent_call(&mut engine, &settings, &history[..3], "hello").unwrap();
    let TurnOutcome::Admitted(admitted) = call(&mut engine, &hollow_request) else { panic!("not admitted") };
    assert_eq!(admitted.new_entries, 1, "only the turn after the hollow ones is new");
    assert_eq!(journal_texts(&engine), ["List the files", "a.txt", "Read a.txt", "hello", "Thanks"]);

    // Another engine, whose journal never saw those turns (as after a rollback).
    let mut engine = SessionEngine::in_memory(&settings, 0).unwrap();
    transparent_call(&mut engine, &settings, &history[..1], "a.txt").unwrap();
    let (generation, entries) = (engine.journal().generation(), engine.journal().entries().len());
    let outcome = call(&mut engine, &hollow_request);
    assert!(matches!(outcome, TurnOutcome::NeedsWholeHistory), "{outcome:?}");
    assert_eq!(
        (engine.journal().generation(), engine.journal().entries().len()),
        (generation, entries),
        "nothing was journaled or rewound"
    );
    let TurnOutcome::Admitted(_) = call(&mut engine, &request(next)) else { panic!("not admitted") };
    assert_eq!(journal_texts(&engine), ["List the files", "a.txt", "Read a.txt", "hello", "Thanks"]);
}

/// A tool-results stage ceiling is enforced: once the results in the window exceed it, the oldest
/// are elided to their head and a data_ref, and the stage fits again.
#[test]
fn tool_results_over_their_stage_ceiling_are_elided_oldest_first() {
    let mut settings = SessionSettings::defaults(Api::OpenAi, 200_000);
    settings.stages.tool_results_tokens = 3_000;
    // Economics-driven elision off: only the stage ceiling elides.
    settings.elision.elide_after_rounds = 10_000;
    // The results stay under the spill threshold, so they enter the window whole.
    settings.spill.max_result_chars = 8_000;
    let mut engine = SessionEngine::in_memory(&settings, 0).unwrap();
    let mut last = None;
    for step in 0..6u64 {
        let id = format!("c{step}");
        let turns = vec![
            user(format!("step {step}")),
            Turn {
                role: Role::Assistant,
                content: Content {
                    tool_calls: vec![ToolCall {
                        call_id: id.clone(),
                        name: "grep".into(),
                        arguments_json: "{}".into(),
                    }],
                    ..Content::default()
                },
            },
            Turn {
                role: Role::Tool,
                content: Content {
                    tool_results: vec![ToolResult {
                        call_id: id,
                        name: Some("grep".into()),
                        output: format!("result {step}: {}", "matched line of output ".repeat(300)),
                    }],
                    ..Content::default()
                },
            },
        ];
        let chat = request(turns);
        let turn = TurnRequest {
            request: &chat,
            transparent: false,
            request_key: None,
            operation_id: OperationId::from_request("stages", &step.to_le_bytes()),
            head: Map::new(),
            now_ms: step,
        };
        let TurnOutcome::Admitted(admitted) = engine.begin_turn(&settings, turn).unwrap() else {
            panic!("blocked")
        };
        let answer = AssistantOutput { text: format!("noted {step}"), ..AssistantOutput::default() };
        let effects = engine.record_answer(&settings, &admitted.first_call, &answer, step).unwrap();
        if step >= 2 {
            assert!(effects.elided_entries > 0, "step {step}: the ceiling elided the oldest results");
        }
        last = Some(engine.next_call(&settings, Map::new()).unwrap());
    }
    let call = last.unwrap();
    let stage = call.stages.iter().find(|s| s.stage == strata_core::budget::Stage::ToolResults).unwrap();
    assert!(!stage.over && stage.used <= 3_000, "{stage:?}");
    let body: serde_json::Value = serde_json::from_slice(&call.body.to_vec()).unwrap();
    let text = body["messages"].to_string();
    assert!(text.contains("result 5: matched"), "the newest result stays whole");
    assert!(text.contains("data_ref"), "elided results name their data_ref");
}

/// Ten logs read, then the model purges `purges` pairs of early entries, each with its own summary.
fn with_purge_summaries(settings: &SessionSettings, purges: u64) -> (tempfile::TempDir, SessionEngine) {
    let dir = tempfile::tempdir().unwrap();
    let mut engine = SessionEngine::open(dir.path(), settings, 0).unwrap();
    read_ten_logs(&mut engine, settings);
    let call = send(&mut engine, settings, vec![user("tidy up the early logs".into())], 20);
    let tool_calls = (0..purges)
        .map(|purge| ToolCall {
            call_id: format!("call_purge_{purge}"),
            name: "strata_purge".into(),
            arguments_json: serde_json::json!({
                "ids": [format!("msg_{}", 2 * purge + 1), format!("msg_{}", 2 * purge + 2)],
                "summary": format!("Logs {purge} were read; nothing in them matters any more."),
            })
            .to_string(),
        })
        .collect();
    let answer = AssistantOutput { tool_calls, ..AssistantOutput::default() };
    engine.record_answer(settings, &call, &answer, 21).unwrap();
    (dir, engine)
}

fn summaries(engine: &SessionEngine) -> usize {
    engine.journal().entries().iter().filter(|entry| entry.id.kind() == EntryKind::Summary).count()
}

#[test]
fn summaries_over_the_memory_stage_are_merged_by_a_compaction() {
    let mut settings = SessionSettings::defaults(Api::OpenAi, 40_000);
    settings.stages.memory_tokens = 10;
    let (_dir, mut engine) = with_purge_summaries(&settings, 2);
    assert_eq!(summaries(&engine), 2, "each purge left its summary");

    let chat = request(vec![user("what next?".into())]);
    let turn = TurnRequest {
        request: &chat,
        transparent: false,
        request_key: None,
        operation_id: OperationId::from_request("test", b"next"),
        head: Map::new(),
        now_ms: 30,
    };
    let TurnOutcome::Admitted(admitted) = engine.begin_turn(&settings, turn).unwrap() else {
        panic!("blocked")
    };
    assert_eq!(admitted.compactions, 1, "the memory stage over its ceiling compacted");
    assert_eq!(summaries(&engine), 1, "the two summaries were folded into one state");
}

#[test]
fn one_summary_over_the_memory_stage_is_reported_not_compacted_again() {
    let mut settings = SessionSettings::defaults(Api::OpenAi, 40_000);
    settings.stages.memory_tokens = 10;
    let (_dir, mut engine) = with_purge_summaries(&settings, 1);
    assert_eq!(summaries(&engine), 1);
    let call = send(&mut engine, &settings, vec![user("what next?".into())], 30);
    let memory = call.stages.iter().find(|stage| stage.stage == strata_core::budget::Stage::Memory).unwrap();
    assert!(memory.over, "{memory:?}");
    assert_eq!(summaries(&engine), 1, "nothing to merge: no compaction");
}

/// Sends `turns` as one stateful request with an idempotency key and, when `answer` is given,
/// records it as the model's answer.
fn keyed_call(
    engine: &mut SessionEngine,
    settings: &SessionSettings,
    turns: Vec<Turn>,
    key: Option<&str>,
    answer: Option<&str>,
) -> Result<Option<strata_core::session::Rewind>, strata_core::session::EngineError> {
    let chat = request(turns);
    let turn = TurnRequest {
        request: &chat,
        transparent: false,
        request_key: key,
        operation_id: OperationId::from_request("test", key.unwrap_or_default().as_bytes()),
        head: Map::new(),
        now_ms: 7,
    };
    let TurnOutcome::Admitted(admitted) = engine.begin_turn(settings, turn)? else { panic!("blocked") };
    if let Some(text) = answer {
        let output = AssistantOutput { text: text.to_owned(), ..AssistantOutput::default() };
        engine.record_answer(settings, &admitted.first_call, &output, 7)?;
    }
    Ok(admitted.rewind)
}

/// A stateful request for `chat` with the key "last" (`label` names its operation).
fn keyed_turn<'a>(chat: &'a ChatRequest, label: &str, now_ms: u64) -> TurnRequest<'a> {
    TurnRequest {
        request: chat,
        transparent: false,
        request_key: Some("last"),
        operation_id: OperationId::from_request("test", label.as_bytes()),
        head: Map::new(),
        now_ms,
    }
}

fn journal_texts(engine: &SessionEngine) -> Vec<String> {
    engine.journal().entries().iter().map(|entry| entry.content.text.clone()).collect()
}

/// A stateful turn journaled just before a crash, and sent again with its key, is journaled once;
/// without a key the same resend is journaled twice (the case the key exists for).
#[test]
fn a_stateful_turn_journaled_before_a_crash_is_journaled_once_when_retried_with_its_key() {
    for keyed in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let settings = SessionSettings::defaults(Api::OpenAi, 100_000);
        let armed = Arc::new(AtomicBool::new(false));
        let storage: Arc<dyn Storage> =
            Arc::new(FaultyStorage { armed: Arc::clone(&armed), ..FaultyStorage::default() });
        let key = |name| keyed.then_some(name);
        {
            let mut engine = SessionEngine::open_on(Arc::clone(&storage), dir.path(), &settings, 0).unwrap();
            keyed_call(&mut engine, &settings, vec![user("List the files".into())], key("k1"), Some("a.txt"))
                .unwrap();
            armed.store(true, Ordering::SeqCst);
            let cut =
                keyed_call(&mut engine, &settings, vec![user("Now read a.txt".into())], key("k2"), None);
            assert!(cut.is_err(), "the append 'crashed'");
        }
        armed.store(false, Ordering::SeqCst);
        let mut engine = SessionEngine::open(dir.path(), &settings, 0).unwrap();
        keyed_call(&mut engine, &settings, vec![user("Now read a.txt".into())], key("k2"), Some("hello"))
            .unwrap();
        let expected: &[&str] = if keyed {
            &["List the files", "a.txt", "Now read a.txt", "hello"]
        } else {
            &["List the files", "a.txt", "Now read a.txt", "Now read a.txt", "hello"]
        };
        assert_eq!(journal_texts(&engine), expected, "keyed: {keyed}");
        assert_eq!(engine.journal().generation(), 1, "nothing to rewind");
    }
}

/// An answer the client never got (the stream was cut) is replaced by the retry's: the journal is
/// rewound to just before the turn and the turn journaled again, once.
#[test]
fn a_keyed_retry_after_an_answer_the_client_never_saw_replaces_that_answer() {
    let dir = tempfile::tempdir().unwrap();
    let settings = SessionSettings::defaults(Api::OpenAi, 100_000);
    let mut engine = SessionEngine::open(dir.path(), &settings, 0).unwrap();
    keyed_call(&mut engine, &settings, vec![user("List the files".into())], Some("k1"), Some("a.txt"))
        .unwrap();
    keyed_call(&mut engine, &settings, vec![user("Now read a.txt".into())], Some("k2"), Some("lost"))
        .unwrap();
    drop(engine);
    let mut engine = SessionEngine::open(dir.path(), &settings, 0).unwrap();
    let rewind =
        keyed_call(&mut engine, &settings, vec![user("Now read a.txt".into())], Some("k2"), Some("hello"))
            .unwrap()
            .expect("the earlier attempt is rewound");
    assert_eq!((rewind.kept_entries, rewind.dropped_entries), (3, 1), "the turn stays, its lost answer goes");
    assert_eq!(journal_texts(&engine), ["List the files", "a.txt", "Now read a.txt", "hello"]);
}

/// A key is for one turn: reused for other messages, or for a turn later turns followed, it is
/// refused with a message that says what to send instead, and nothing is journaled.
#[test]
fn a_key_reused_for_other_messages_or_an_earlier_turn_is_refused() {
    use strata_core::session::EngineError;
    use strata_core::session::request_keys::KeyRefusal;
    let settings = SessionSettings::defaults(Api::OpenAi, 100_000);
    let mut engine = SessionEngine::in_memory(&settings, 0).unwrap();
    keyed_call(&mut engine, &settings, vec![user("List the files".into())], Some("k1"), Some("a.txt"))
        .unwrap();
    let other =
        keyed_call(&mut engine, &settings, vec![user("Delete the files".into())], Some("k1"), Some("x"));
    let Err(EngineError::RequestKey(refusal @ KeyRefusal::Reused { .. })) = other else {
        panic!("{other:?}")
    };
    assert!(refusal.to_string().contains("send a fresh key for each new turn"), "{refusal}");
    keyed_call(&mut engine, &settings, vec![user("Now read a.txt".into())], Some("k2"), Some("hello"))
        .unwrap();
    let stale =
        keyed_call(&mut engine, &settings, vec![user("List the files".into())], Some("k1"), Some("x"));
    assert!(matches!(stale, Err(EngineError::RequestKey(KeyRefusal::NotLatest { .. }))), "{stale:?}");
    let malformed = keyed_call(&mut engine, &settings, vec![user("Hi".into())], Some("two words"), Some("x"));
    assert!(matches!(malformed, Err(EngineError::RequestKey(KeyRefusal::Malformed))), "{malformed:?}");
    assert_eq!(journal_texts(&engine), ["List the files", "a.txt", "Now read a.txt", "hello"]);
}

/// A key written ahead of an append that never became durable names an entry number the journal
/// may issue again: it is forgotten at open, and the retry journals the turn as new.
#[test]
fn a_key_remembered_but_never_journaled_is_forgotten_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let settings = SessionSettings::defaults(Api::OpenAi, 100_000);
    let keys = dir.path().join("gateway").join("request-keys");
    {
        let mut engine = SessionEngine::open(dir.path(), &settings, 0).unwrap();
        keyed_call(&mut engine, &settings, vec![user("List the files".into())], Some("k1"), Some("a.txt"))
            .unwrap();
    }
    let mut text = std::fs::read_to_string(&keys).unwrap();
    assert_eq!(text.lines().count(), 1);
    // The crash came after the key line of a second turn and before its record.
    text.push_str(&format!("{} msg_999 {}\n", "ab".repeat(32), "cd".repeat(32)));
    std::fs::write(&keys, text).unwrap();
    let _engine = SessionEngine::open(dir.path(), &settings, 0).unwrap();
    assert_eq!(std::fs::read_to_string(&keys).unwrap().lines().count(), 1, "the unissued key is forgotten");
}

/// A compaction that ran between a keyed attempt and its retry (the answer the client never got
/// left a tool call open, and the trigger compacted) is kept: the retry does not rewind across it,
/// so nothing the summary covers is lost, and the turn is in the journal once.
#[test]
fn a_keyed_retry_after_a_compaction_keeps_the_summary_and_the_turn_once() {
    let settings = SessionSettings::defaults(Api::OpenAi, 100_000);
    let mut engine = SessionEngine::in_memory(&settings, 0).unwrap();
    for step in 0..12 {
        let text = format!("step {step}: {}", "lorem ipsum dolor sit amet ".repeat(150));
        let key = format!("k{step}");
        keyed_call(&mut engine, &settings, vec![user(text)], Some(&key), Some(&format!("done {step}")))
            .unwrap();
    }
    let chat = request(vec![user("Now read a.txt".into())]);
    let attempt = keyed_turn(&chat, "last", 20);
    let TurnOutcome::Admitted(admitted) = engine.begin_turn(&settings, attempt).unwrap() else {
        panic!("blocked")
    };
    let call = ToolCall { call_id: "call_1".into(), name: "read_file".into(), arguments_json: "{}".into() };
    let output = AssistantOutput { tool_calls: vec![call], ..AssistantOutput::default() };
    engine.record_answer(&settings, &admitted.first_call, &output, 21).unwrap();
    let record =
        engine.compact(&settings, &CompactionAsk::new(CompactionMode::Budget, "test"), 22).unwrap().unwrap();
    assert_ne!(record.result_generation, record.source_generation, "the compaction committed");
    let summaries = |engine: &SessionEngine| {
        engine.journal().entries().iter().filter(|entry| entry.id.kind() == EntryKind::Summary).count()
    };
    assert_eq!(summaries(&engine), 1);

    let chat = request(vec![user("Now read a.txt".into())]);
    let retry = keyed_turn(&chat, "retry", 23);
    let TurnOutcome::Admitted(admitted) = engine.begin_turn(&settings, retry).unwrap() else {
        panic!("blocked")
    };
    let rewind = admitted.rewind.expect("the unseen tool call is dropped");
    assert_eq!(rewind.dropped_entries, 1, "only the call the client never got: {rewind:?}");
    let body: serde_json::Value = serde_json::from_slice(&admitted.first_call.body.to_vec()).unwrap();
    check_request(Api::OpenAi, &body).unwrap();
    assert_eq!(summaries(&engine), 1, "the retry kept the compaction: {:?}", journal_texts(&engine));
    let turns = journal_texts(&engine).iter().filter(|text| text.as_str() == "Now read a.txt").count();
    assert_eq!(turns, 1, "{:?}", journal_texts(&engine));
    assert!(
        engine.journal().entries().iter().all(|entry| entry.id.kind() != EntryKind::ToolCall),
        "the tool call the client never got is gone"
    );
    let output = AssistantOutput { text: "a.txt says hello".into(), ..AssistantOutput::default() };
    engine.record_answer(&settings, &admitted.first_call, &output, 24).unwrap();
    let kinds: Vec<EntryKind> =
        engine.journal().entries().iter().rev().take(4).map(|e| e.id.kind()).collect();
    assert_eq!(kinds, [EntryKind::Message, EntryKind::Message, EntryKind::Summary, EntryKind::Message]);
    assert_eq!(journal_texts(&engine).last().map(String::as_str), Some("a.txt says hello"));
}

/// Found in review (issue 20): a compaction that keeps none of the client's turns
/// (`keepRecentEntries: 0`) leaves a generation of Strata's own entries only. The client's next
/// request resends the history the summary covers; it extends the journal after the summary. Before,
/// it was taken for a new conversation: the summary was dropped and the whole history journaled
/// again, which refilled the window the compaction had just emptied.
#[test]
fn a_transparent_request_after_a_compaction_that_kept_none_of_its_turns_extends_the_summary() {
    let mut settings = SessionSettings::defaults(Api::OpenAi, 100_000);
    settings.compaction.keep_recent_entries = 0;
    let mut engine = SessionEngine::in_memory(&settings, 0).unwrap();
    let mut history = Vec::new();
    for step in 0..6 {
        history.push(user(format!("step {step}: {}", "lorem ipsum dolor sit amet ".repeat(100))));
        let answer = format!("done {step}");
        transparent_call(&mut engine, &settings, &history, &answer).unwrap();
        history.push(Turn { role: Role::Assistant, content: Content::text(answer) });
    }
    let record = engine
        .compact(&settings, &CompactionAsk::new(CompactionMode::Budget, "test"), 2_000)
        .unwrap()
        .unwrap();
    let generation = engine.journal().generation();
    assert_eq!(record.result_generation, generation, "the compaction committed");
    let entries_after_compaction = engine.journal().entries().len();
    let openings = |engine: &SessionEngine| -> Vec<String> {
        journal_texts(engine).iter().map(|text| text.chars().take(12).collect()).collect()
    };
    assert!(
        engine.journal().entries().iter().any(|entry| entry.id.kind() == EntryKind::Summary),
        "{:?}",
        openings(&engine)
    );
    assert!(
        !journal_texts(&engine).iter().any(|text| text.starts_with("step ")),
        "no client turn was kept: {:?}",
        openings(&engine)
    );

    history.push(user("And now?".into()));
    transparent_call(&mut engine, &settings, &history, "all done").unwrap();
    assert_eq!(engine.journal().generation(), generation, "no rewind: {:?}", openings(&engine));
    let texts = openings(&engine);
    assert_eq!(texts.len(), entries_after_compaction + 2, "only the new turn and its answer: {texts:?}");
    assert_eq!(&texts[entries_after_compaction..], ["And now?", "all done"]);

    // The turn after that is recognised as usual.
    history.push(Turn { role: Role::Assistant, content: Content::text("all done".to_owned()) });
    history.push(user("Thanks".into()));
    transparent_call(&mut engine, &settings, &history, "welcome").unwrap();
    assert_eq!(engine.journal().generation(), generation);
    assert_eq!(journal_texts(&engine).len(), entries_after_compaction + 4);
}

/// An engine whose history of four exchanges was compacted with `keepRecentEntries: 0` and the
/// third user turn Critical: that turn is kept verbatim and the rest (the older turns, and that
/// turn's answer and what followed it) folded into one summary placed after it. Returns the
/// settings, the engine and the client's history.
fn compacted_around_a_critical_turn() -> (SessionSettings, SessionEngine, Vec<Turn>) {
    let mut settings = SessionSettings::defaults(Api::OpenAi, 100_000);
    settings.compaction.keep_recent_entries = 0;
    let pinned = r#"[{"name": "pinned", "class": "Critical", "match": {"contentRegex": "^PINNED"}}]"#;
    settings.classifier = Classifier::new(serde_json::from_str(pinned).unwrap()).unwrap();
    let mut engine = SessionEngine::in_memory(&settings, 0).unwrap();
    let mut history = Vec::new();
    for step in 0..4 {
        let prefix = if step == 2 { "PINNED " } else { "" };
        history.push(user(format!("{prefix}step {step}: {}", "lorem ipsum dolor sit amet ".repeat(100))));
        let answer = format!("done {step}");
        transparent_call(&mut engine, &settings, &history, &answer).unwrap();
        history.push(Turn { role: Role::Assistant, content: Content::text(answer) });
    }
    engine.compact(&settings, &CompactionAsk::new(CompactionMode::Budget, "test"), 2_000).unwrap().unwrap();
    let compacted = openings(&engine);
    let kinds: Vec<EntryKind> = engine.journal().entries().iter().map(|entry| entry.id.kind()).collect();
    assert!(compacted[0].starts_with("PINNED step 2"), "the Critical turn is kept first: {compacted:?}");
    assert_eq!(kinds[1], EntryKind::Summary, "the summary stands after it: {compacted:?}");
    assert!(
        !compacted.iter().any(|text| text.starts_with("step ") || text.starts_with("done ")),
        "every other client turn was folded: {compacted:?}"
    );
    (settings, engine, history)
}

/// The first 14 characters of each journal entry's text.
fn openings(engine: &SessionEngine) -> Vec<String> {
    journal_texts(engine).iter().map(|text| text.chars().take(14).collect()).collect()
}

/// After the client regenerated the answer to the Critical turn (it sent `sent`, its history up
/// to that turn): every turn it sent is in the journal, none it abandoned is, and the new answer
/// is last.
fn assert_regenerated(engine: &SessionEngine, sent: &[Turn]) {
    let texts = openings(engine);
    for turn in sent {
        let opening: String = turn.content.text.chars().take(14).collect();
        assert!(texts.contains(&opening), "{opening:?} is in the journal: {texts:?}");
    }
    assert_eq!(texts.last().map(String::as_str), Some("done 2, again"));
    let abandoned =
        |text: &String| text.starts_with("step 3") || text.starts_with("step 4") || text == "done 3";
    assert!(!texts.iter().any(abandoned), "no abandoned turn, nor a summary of them: {texts:?}");
    assert!(
        !engine.journal().entries().iter().any(|entry| entry.id.kind() == EntryKind::Summary),
        "the summary of abandoned turns is not kept: {texts:?}"
    );
}

/// A regenerate of the Critical turn's answer right after the compaction. The summary after the
/// kept turn was extended, and with it the abandoned turns it holds: the journal now starts again
/// from the request.
#[test]
fn a_regenerate_after_a_compaction_that_kept_only_a_critical_turn_does_not_extend_the_summary() {
    let (settings, mut engine, history) = compacted_around_a_critical_turn();
    transparent_call(&mut engine, &settings, &history[..5], "done 2, again").unwrap();
    assert_regenerated(&engine, &history[..5]);
}

/// The same regenerate after one more exchange. The rewind to the kept turn dropped the summary,
/// and the older turns with it: the client sends them as journaled, so they were never journaled
/// again. The whole request is journaled again instead.
#[test]
fn a_regenerate_after_a_compaction_that_kept_only_a_critical_turn_loses_none_of_the_older_turns() {
    let (settings, mut engine, mut history) = compacted_around_a_critical_turn();
    history.push(user("step 4: and then?".into()));
    transparent_call(&mut engine, &settings, &history, "done 4").unwrap();
    transparent_call(&mut engine, &settings, &history[..5], "done 2, again").unwrap();
    assert_regenerated(&engine, &history[..5]);
}

/// One stateful turn with a short message and a short answer; returns the upstream body.
fn short_turn(engine: &mut SessionEngine, settings: &SessionSettings, call: usize) -> Vec<u8> {
    let chat = request(vec![user(format!("short step {call}"))]);
    let TurnOutcome::Admitted(admitted) =
        engine.begin_turn(settings, stateful_turn(&chat, "room", call)).unwrap()
    else {
        panic!("a short turn is admitted");
    };
    let answer = AssistantOutput { text: format!("ok {call}"), ..AssistantOutput::default() };
    engine.record_answer(settings, &admitted.first_call, &answer, 1_000 * call as u64).unwrap();
    admitted.first_call.body.to_vec()
}

#[test]
fn room_made_between_turns_keeps_the_lists_ahead_and_changes_no_body() {
    let settings = SessionSettings::defaults(Api::OpenAi, 1_000_000);
    let mut kept_ahead = SessionEngine::in_memory(&settings, 0).unwrap();
    let mut left_alone = SessionEngine::in_memory(&settings, 0).unwrap();
    let mut made = 0;
    for call in 0..400 {
        let body = short_turn(&mut kept_ahead, &settings, call);
        assert_eq!(body, short_turn(&mut left_alone, &settings, call), "turn {call}: room changes no output");
        if kept_ahead.room_low() {
            assert!(kept_ahead.make_room(), "turn {call}: low room is grown");
            made += 1;
            assert!(!kept_ahead.room_low(), "turn {call}: room was made");
        }
    }
    // 800 entries from empty: the lists double a handful of times, each once ahead of need.
    assert!((3..=12).contains(&made), "room was made {made} times");
}

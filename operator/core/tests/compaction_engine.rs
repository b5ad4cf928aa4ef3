//! Compaction end to end on a real journal: extractive summary and baseline, delta summarisation,
//! a failed preservation check that changes nothing, rollback, purge, and a compaction proposed by
//! another thread while the writer keeps appending.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use strata_core::artifacts::{ArtifactRef, ArtifactStore};
use strata_core::compaction::{
    CompactedState, CompactionMode, CompactionRecord, CompactionRequest, CompactionSettings, Conclusion,
    ExtractiveSummarizer, PreparedCompaction, PurgeJob, QualityCheck, compact_extractive, prepare_purge,
    rollback,
};
use strata_core::entry::{
    Content, Entry, EntryDraft, EntryId, EntryKind, RetentionClass, Role, ToolCall, ToolResult,
};
use strata_core::journal::{Journal, JournalOptions, StdStorage, SyncPolicy, read_current_generation};
use strata_core::purge::PurgeRequest;
use strata_core::tokens::{TokenCounter, TokenizerKind};

const TENANT: &str = "rateright";

fn counter() -> TokenCounter {
    TokenCounter::new(TokenizerKind::O200kBase).unwrap()
}

fn draft(kind: EntryKind, role: Role, text: &str, retention: RetentionClass) -> EntryDraft {
    EntryDraft {
        kind,
        role,
        content: Content::text(text),
        retention,
        created_at_ms: 1,
        tokens: (text.len() as u64).div_ceil(4) + 3,
        artifact_refs: vec![],
    }
}

fn user(text: &str) -> EntryDraft {
    draft(EntryKind::Message, Role::User, text, RetentionClass::Working)
}

fn assistant(text: &str) -> EntryDraft {
    draft(EntryKind::Message, Role::Assistant, text, RetentionClass::Working)
}

fn tool_call(call_id: &str, name: &str, arguments: &str) -> EntryDraft {
    let mut call = draft(EntryKind::ToolCall, Role::Assistant, "", RetentionClass::Working);
    call.content.tool_calls.push(ToolCall {
        call_id: call_id.into(),
        name: name.into(),
        arguments_json: arguments.into(),
    });
    call
}

fn tool_result(call_id: &str, output: &str) -> EntryDraft {
    let mut result = draft(EntryKind::ToolResult, Role::Tool, "", RetentionClass::Working);
    result.content.tool_results.push(ToolResult {
        call_id: call_id.into(),
        name: None,
        output: output.into(),
    });
    result.tokens = (output.len() as u64).div_ceil(4) + 3;
    result
}

struct Fixture {
    _dir: tempfile::TempDir,
    data: PathBuf,
    store: ArtifactStore,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let store = ArtifactStore::new(Arc::new(StdStorage), data.join("artifacts"));
    Fixture { _dir: dir, data, store }
}

fn open(data: &Path) -> Journal {
    let mut options = JournalOptions::new("compaction-test", 1_000);
    options.retain_generations = 5;
    Journal::open(Arc::new(StdStorage), data, options).unwrap().0
}

fn request(keep_recent: usize) -> CompactionRequest {
    CompactionRequest {
        mode: CompactionMode::TaskBoundary,
        reason: Some("task finished".into()),
        resume_instruction: Some("Continue with the Redis retry fix in auth.py.".into()),
        settings: CompactionSettings { keep_recent_entries: keep_recent, ..CompactionSettings::default() },
        now_ms: 1_767_225_600_000,
    }
}

/// A history with every kind of signal; returns the IDs by label.
fn write_history(journal: &mut Journal) -> HashMap<&'static str, EntryId> {
    let mut ids = HashMap::new();
    let mut add = |label: &'static str, draft: EntryDraft| {
        let entry = journal.append(draft).unwrap();
        ids.insert(label, entry.id);
    };
    add(
        "task",
        user(
            "Objective: fix the auth timeouts in services/auth.py\nYou must not restart the production Redis.",
        ),
    );
    add(
        "policy",
        draft(
            EntryKind::Message,
            Role::System,
            "Tenant data never leaves eu-west-1.",
            RetentionClass::Critical,
        ),
    );
    add(
        "plan",
        assistant("Decision: use exponential backoff in the retry loop.\nTODO: add a regression test"),
    );
    add("grep_call", tool_call("c1", "bash", r#"{"cmd":"grep -n retry services/auth.py"}"#));
    add("grep_res", tool_result("c1", "42: def retry(self):\n43:     for attempt in range(3):"));
    add("heartbeat", draft(EntryKind::Message, Role::User, "HEARTBEAT_OK", RetentionClass::Ephemeral));
    add("question", user("Open question: should the backoff cap be 30s or 60s?"));
    add("edit_call", tool_call("c2", "edit_file", r#"{"path":"services/auth.py","patch":"backoff"}"#));
    add("edit_res", tool_result("c2", "ok"));
    for n in 0..6 {
        add(
            ["filler0", "filler1", "filler2", "filler3", "filler4", "filler5"][n],
            assistant(&format!("Reading the logs, part {n}: nothing new. {}", "log line ".repeat(300))),
        );
    }
    add("deploy_call", tool_call("c3", "deploy", r#"{"service":"auth","env":"staging"}"#));
    add("last", assistant("Waiting for the staging deploy to finish."));
    ids
}

fn state_of(entry: &Entry) -> CompactedState {
    assert_eq!(entry.id.kind(), EntryKind::Summary);
    serde_json::from_str(&entry.content.text).unwrap()
}

fn archived(store: &ArtifactStore, record: &CompactionRecord) -> Vec<Entry> {
    let reference: ArtifactRef = record.raw_archive.as_ref().unwrap().parse().unwrap();
    serde_json::from_slice(&store.get(TENANT, &reference).unwrap()).unwrap()
}

#[test]
fn extractive_compaction_keeps_what_matters_and_archives_the_rest() {
    let fx = fixture();
    let mut journal = open(&fx.data);
    let ids = write_history(&mut journal);
    let before: Vec<Entry> = journal.entries().to_vec();

    let record = compact_extractive(&mut journal, &fx.store, TENANT, request(2), &counter()).unwrap();

    assert_eq!(record.quality_check, QualityCheck::Passed, "{:?}", record.missing_items);
    assert_eq!((record.source_generation, record.result_generation), (1, 2));
    assert!(record.tokens_after < record.tokens_before, "{record:?}");
    assert!(record.compaction_id.starts_with("cmp:"));
    assert_eq!(record.created_at.as_deref(), Some("2026-01-01T00:00:00Z"));
    let entries = journal.entries();
    let summary_at = entries.iter().position(|e| e.id.kind() == EntryKind::Summary).unwrap();
    // The Critical policy, then the summary and the resume instruction, then the deploy call still
    // waiting for its result (so the result journaled later follows it) and the entry after it.
    assert_eq!(summary_at, 1);
    let kept: Vec<EntryId> = entries
        .iter()
        .enumerate()
        .filter(|(at, _)| *at != summary_at && *at != summary_at + 1)
        .map(|(_, e)| e.id)
        .collect();
    assert_eq!(kept, vec![ids["policy"], ids["deploy_call"], ids["last"]]);
    for id in &kept {
        assert_eq!(
            entries.iter().find(|e| e.id == *id),
            before.iter().find(|e| e.id == *id),
            "{id} not verbatim"
        );
    }
    let summary = &entries[summary_at];
    assert_eq!(record.summary_asset_id, Some(summary.id.to_string()));
    assert_eq!(summary.retention, RetentionClass::Critical);
    let state = state_of(summary);
    assert_eq!(state.active_objective, "Objective: fix the auth timeouts in services/auth.py");
    assert!(state.hard_constraints.iter().any(|c| c.text.contains("must not restart the production Redis")));
    let decision = state.decisions.iter().find(|d| d.text.contains("exponential backoff")).unwrap();
    assert_eq!(decision.source_ids, vec![ids["plan"].to_string()]);
    assert!(state.current_tasks.iter().any(|t| t.text.contains("regression test")));
    assert!(state.open_questions.iter().any(|q| q.text.contains("30s or 60s")));
    assert_eq!(state.tool_state.pending_actions.len(), 1);
    assert_eq!(state.tool_state.pending_actions[0].call_id, "c3");
    assert!(state.tool_state.side_effects.iter().any(|s| s.text.contains("edit_file")));
    assert!(state.affected_files.contains(&"services/auth.py".to_owned()));
    assert!(!state.project_summary.contains("HEARTBEAT"));
    assert!(state.evidence_refs.artifact_refs.contains(record.raw_archive.as_ref().unwrap()));
    let resume = &entries[summary_at + 1];
    assert_eq!(resume.content.text, "Continue with the Redis retry fix in auth.py.");
    assert_eq!(entries.len(), kept.len() + 2);

    // Every removed entry reopens byte-exact from the archive; nothing else was removed.
    let removed = archived(&fx.store, &record);
    let removed_ids: HashSet<EntryId> = removed.iter().map(|e| e.id).collect();
    for entry in &before {
        assert!(
            removed_ids.contains(&entry.id) != kept.contains(&entry.id),
            "{} lost or duplicated",
            entry.id
        );
    }
    for entry in &removed {
        assert_eq!(Some(entry), before.iter().find(|e| e.id == entry.id));
    }
    assert_eq!(record.assets_removed.len(), removed.len());
}

#[test]
fn second_compaction_summarises_only_the_delta_and_carries_the_state() {
    let fx = fixture();
    let mut journal = open(&fx.data);
    write_history(&mut journal);
    compact_extractive(&mut journal, &fx.store, TENANT, request(2), &counter()).unwrap();
    journal.append(tool_result("c3", "deployed to staging")).unwrap();
    journal.append(user("Resolved: the backoff cap should be 30s or 60s? Use 30s.")).unwrap();
    journal.append(assistant("Decision: cap the backoff at 30s.\nI have fixed the retry loop.")).unwrap();
    journal.append(assistant("Running the regression suite now.")).unwrap();

    let prepared = PreparedCompaction::new(journal.begin_compaction().unwrap(), request(1));
    let input = prepared.summary_input();
    assert!(input.previous.is_some(), "the previous state is the input, not the history");
    assert_eq!(
        input.delta.len(),
        7,
        "the resume instruction, the deploy call kept after it with the entry that followed, and 4 new entries"
    );
    let state = ExtractiveSummarizer::default().summarize_now(input);
    assert!(
        state.decisions.iter().any(|d| d.text.contains("exponential backoff")),
        "carried from the old state"
    );
    assert!(state.decisions.iter().any(|d| d.text.contains("30s")));
    assert!(state.open_questions.is_empty(), "the question was resolved: {:?}", state.open_questions);
    assert!(state.tool_state.pending_actions.is_empty(), "the deploy call was answered");
    assert!(state.completed_tasks.iter().any(|t| t.text.contains("fixed the retry loop")));

    let record = compact_extractive(&mut journal, &fx.store, TENANT, request(1), &counter()).unwrap();
    assert_eq!(record.quality_check, QualityCheck::Passed, "{:?}", record.missing_items);
    let summaries: Vec<&Entry> =
        journal.entries().iter().filter(|e| e.id.kind() == EntryKind::Summary).collect();
    assert_eq!(summaries.len(), 1, "the old summary is replaced, not stacked");
}

#[test]
fn failed_preservation_check_changes_nothing() {
    let fx = fixture();
    let mut journal = open(&fx.data);
    write_history(&mut journal);
    let current_before = std::fs::read(fx.data.join("CURRENT")).unwrap();
    let log_before = std::fs::read(fx.data.join("gen-000001/journal.log")).unwrap();

    let prepared = PreparedCompaction::new(journal.begin_compaction().unwrap(), request(2));
    let mut state = ExtractiveSummarizer::default().summarize_now(prepared.summary_input());
    state.open_questions.clear();
    state.tool_state.pending_actions.clear();
    state.decisions.clear();
    let conclusion = prepared.conclude(state, "test-model", &fx.store, TENANT, &counter()).unwrap();

    let Conclusion::Rejected(record) = conclusion else { panic!("expected a rejection, got {conclusion:?}") };
    assert_eq!(record.quality_check, QualityCheck::Failed);
    assert_eq!(record.result_generation, record.source_generation);
    assert_eq!(record.tokens_after, record.tokens_before);
    let missing = record.missing_items.join("\n");
    assert!(missing.contains("30s or 60s"), "{missing}");
    assert!(missing.contains("pending tool action c3"), "{missing}");
    assert!(missing.contains("required field decisions"), "{missing}");
    assert_eq!(journal.generation(), 1);
    assert_eq!(std::fs::read(fx.data.join("CURRENT")).unwrap(), current_before);
    assert_eq!(std::fs::read(fx.data.join("gen-000001/journal.log")).unwrap(), log_before);
    assert!(!fx.data.join("gen-000002").exists());
    assert!(!fx.data.join("artifacts").exists(), "nothing is archived when the check fails");
}

#[test]
fn rollback_restores_the_prior_generation_byte_identical_plus_later_entries() {
    let fx = fixture();
    let mut journal = open(&fx.data);
    write_history(&mut journal);
    let original = journal.entries().to_vec();
    compact_extractive(&mut journal, &fx.store, TENANT, request(2), &counter()).unwrap();
    let later = journal.append(user("One more thing: also log the retry count.")).unwrap();

    let record = rollback(&mut journal, 1, Some("bad summary".into()), "tenant", 5_000).unwrap();

    assert_eq!(record.mode, Some(CompactionMode::Rollback));
    assert_eq!((record.source_generation, record.result_generation), (2, 3));
    let mut expected = original.clone();
    expected.push(later);
    assert_eq!(journal.entries(), expected.as_slice());
    let old_log = std::fs::read(fx.data.join("gen-000001/journal.log")).unwrap();
    let new_log = std::fs::read(fx.data.join("gen-000003/journal.log")).unwrap();
    assert_eq!(&new_log[24..old_log.len()], &old_log[24..], "records after the header are byte-identical");
    // And the compaction can be redone afterwards.
    let again = compact_extractive(&mut journal, &fx.store, TENANT, request(2), &counter()).unwrap();
    assert_eq!(again.quality_check, QualityCheck::Passed);
    assert_eq!(again.result_generation, 4);
}

#[test]
fn purge_mode_puts_the_summary_where_the_first_entry_stood_and_archives_the_entries() {
    let fx = fixture();
    let mut journal = open(&fx.data);
    let ids = write_history(&mut journal);
    let before = journal.entries().to_vec();
    let snapshot = journal.begin_compaction().unwrap();
    let purge = PurgeRequest {
        ids: vec![ids["grep_call"], ids["grep_res"]],
        summary: "grep found the retry loop at services/auth.py:42".into(),
    };
    let job = PurgeJob {
        request: &purge,
        reason: Some("dead end"),
        privacy_scope: "tenant",
        tenant: TENANT,
        now_ms: 9,
    };
    let ready = prepare_purge(&snapshot, &job, &fx.store, &counter()).unwrap();
    let record = ready.commit(&mut journal, 9).unwrap();

    assert_eq!(record.mode, Some(CompactionMode::Purge));
    assert_eq!(record.assets_removed, vec![ids["grep_call"].to_string(), ids["grep_res"].to_string()]);
    let position = before.iter().position(|e| e.id == ids["grep_call"]).unwrap();
    let summary = &journal.entries()[position];
    assert_eq!(record.summary_asset_id, Some(summary.id.to_string()));
    assert!(summary.content.text.contains("grep found the retry loop"));
    assert_eq!(journal.entries().len(), before.len() - 1);
    assert_eq!(archived(&fx.store, &record), before[position..position + 2].to_vec());
    // Unknown IDs are refused before anything is archived or switched.
    let bad = PurgeRequest { ids: vec![EntryId::new(EntryKind::Message, 999)], summary: String::new() };
    let job = PurgeJob { request: &bad, ..job };
    assert!(prepare_purge(&journal.begin_compaction().unwrap(), &job, &fx.store, &counter()).is_err());
}

#[test]
fn compaction_proposed_while_the_writer_appends_loses_and_duplicates_nothing() {
    let fx = fixture();
    let data = fx.data.clone();
    let mut journal = open(&data);
    write_history(&mut journal);
    drop(journal);
    let started = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (data, started, stop) = (data.clone(), Arc::clone(&started), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut options = JournalOptions::new("gateway", 1_000);
            options.sync_policy = SyncPolicy::Batched { max_pending: 8 };
            let (mut journal, _) = Journal::open(Arc::new(StdStorage), &data, options).unwrap();
            let mut appended = Vec::new();
            let mut switches = 0;
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) || n < 200 {
                let entry = journal.append(assistant(&format!("live turn {n}"))).unwrap();
                appended.push(entry.id);
                journal.sync().unwrap();
                switches += usize::from(journal.refresh().unwrap().is_some());
                started.store(true, Ordering::SeqCst);
                n += 1;
                std::thread::sleep(Duration::from_micros(300));
            }
            (appended, switches, journal.entries().to_vec())
        })
    };
    while !started.load(Ordering::SeqCst) {
        std::thread::yield_now();
    }

    let view = read_current_generation(&StdStorage, &data).unwrap();
    let snapshot_ids: Vec<EntryId> = view.entries.iter().map(|e| e.id).collect();
    let prepared = PreparedCompaction::new(view.snapshot(), request(3));
    let state = ExtractiveSummarizer::default().summarize_now(prepared.summary_input());
    let Conclusion::Ready(ready) =
        prepared.conclude(state, "extractive", &fx.store, TENANT, &counter()).unwrap()
    else {
        panic!("check failed")
    };
    ready.publish(&StdStorage, &data, 7).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let record = loop {
        if let Some(record) = ready.confirm(&StdStorage, &data).unwrap() {
            break record;
        }
        assert!(Instant::now() < deadline, "the writer did not apply the proposal");
        std::thread::sleep(Duration::from_millis(5));
    };
    stop.store(true, Ordering::SeqCst);
    let (appended, switches, final_entries) = writer.join().unwrap();

    assert_eq!(switches, 1);
    assert_eq!(record.source_generation, 1);
    let final_ids: Vec<EntryId> = final_entries.iter().map(|e| e.id).collect();
    let unique: HashSet<EntryId> = final_ids.iter().copied().collect();
    assert_eq!(unique.len(), final_ids.len(), "an entry is duplicated");
    let removed: HashSet<EntryId> = record.assets_removed.iter().map(|id| id.parse().unwrap()).collect();
    for id in snapshot_ids.iter().chain(&appended) {
        assert!(unique.contains(id) != removed.contains(id), "{id} lost or duplicated");
    }
    let live: Vec<EntryId> = appended.iter().copied().filter(|id| !snapshot_ids.contains(id)).collect();
    let tail: Vec<EntryId> = final_ids.iter().copied().filter(|id| live.contains(id)).collect();
    assert_eq!(tail, live, "entries appended during the compaction are carried over in order");
    assert!(appended.len() >= 200);
}

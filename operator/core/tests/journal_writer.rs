//! Writer behaviour: the exclusive lock, fsync poisoning, IDs and token totals.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use strata_core::entry::{Content, EntryDraft, EntryKind, RetentionClass, Role};
use strata_core::journal::sim::{Fault, OpKind, SimStorage};
use strata_core::journal::{Journal, JournalError, JournalOptions, StdStorage, SyncPolicy};

fn draft(text: &str, tokens: u64) -> EntryDraft {
    EntryDraft {
        kind: EntryKind::Message,
        role: Role::User,
        content: Content::text(text),
        retention: RetentionClass::Working,
        created_at_ms: 10,
        tokens,
        artifact_refs: vec![],
    }
}

#[test]
fn second_writer_is_refused_naming_the_holder() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Arc::new(StdStorage);
    let (first, _) =
        Journal::open(storage.clone(), dir.path(), JournalOptions::new("gateway-sidecar", 1)).unwrap();
    let error = Journal::open(storage.clone(), dir.path(), JournalOptions::new("compactor", 1)).unwrap_err();
    match &error {
        JournalError::Locked { holder, .. } => {
            assert!(holder.contains("writer=gateway-sidecar"), "{holder}");
            assert!(holder.contains(&format!("pid={}", std::process::id())), "{holder}");
            assert!(holder.contains("host="), "{holder}");
        }
        other => panic!("expected Locked, got {other}"),
    }
    assert!(error.to_string().contains("gateway-sidecar"));
    drop(first);
    Journal::open(storage, dir.path(), JournalOptions::new("compactor", 1)).unwrap();
}

#[test]
fn failed_fsync_poisons_the_writer_for_good() {
    let sim = SimStorage::new();
    let mut options = JournalOptions::new("poison", 1);
    options.sync_policy = SyncPolicy::Batched { max_pending: 0 };
    let (mut journal, _) = Journal::open(Arc::new(sim.clone()), "/data", options.clone()).unwrap();
    journal.append(draft("a", 1)).unwrap();
    sim.set_fault(Some(Fault { kind: Some(OpKind::Fsync), nth: 1, then_crash: false }));
    assert!(matches!(journal.sync(), Err(JournalError::Io { .. })));
    assert!(journal.is_poisoned());
    assert!(matches!(journal.append(draft("b", 1)), Err(JournalError::Poisoned { .. })));
    assert!(matches!(journal.sync(), Err(JournalError::Poisoned { .. })));
    assert!(matches!(journal.begin_compaction(), Err(JournalError::Poisoned { .. })));
    drop(journal);
    let (reopened, _) = Journal::open(Arc::new(sim), "/data", options).unwrap();
    assert!(!reopened.is_poisoned());
}

#[test]
fn ids_tokens_and_entries_survive_reopen_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Arc::new(StdStorage);
    let (mut journal, report) =
        Journal::open(storage.clone(), dir.path(), JournalOptions::new("t", 1)).unwrap();
    assert!(report.created);
    let first = journal.append(draft("one", 5)).unwrap();
    let second = journal.append(draft("two", 7)).unwrap();
    assert_eq!(first.id.to_string(), "msg_1");
    assert_eq!(second.id.to_string(), "msg_2");
    assert!(second.hash_is_valid());
    assert_eq!(journal.total_tokens(), 12);
    drop(journal);
    let (journal, report) = Journal::open(storage, dir.path(), JournalOptions::new("t", 1)).unwrap();
    assert!(!report.created);
    assert_eq!(report.truncated, None);
    assert_eq!(journal.entries(), &[first, second]);
    assert_eq!(journal.total_tokens(), 12);
    assert_eq!(journal.next_entry_number(), 3);
}

#[test]
fn torn_tail_on_disk_is_truncated_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Arc::new(StdStorage);
    let (mut journal, _) = Journal::open(storage.clone(), dir.path(), JournalOptions::new("t", 1)).unwrap();
    journal.append(draft("kept", 1)).unwrap();
    journal.append(draft("torn", 1)).unwrap();
    drop(journal);
    let log = dir.path().join("gen-000001/journal.log");
    let bytes = std::fs::read(&log).unwrap();
    std::fs::write(&log, &bytes[..bytes.len() - 3]).unwrap();
    let (journal, report) = Journal::open(storage, dir.path(), JournalOptions::new("t", 1)).unwrap();
    let truncated = report.truncated.unwrap();
    assert_eq!(truncated.path, log);
    assert_eq!(journal.entries().len(), 1);
    assert_eq!(std::fs::read(&log).unwrap().len() as u64, truncated.offset);
    assert_eq!(truncated.bytes + truncated.offset, bytes.len() as u64 - 3);
    assert_eq!(journal.next_entry_number(), 2);
}

#[test]
fn an_entry_appended_in_place_is_the_one_kept_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let options = JournalOptions {
        sync_policy: SyncPolicy::Batched { max_pending: 0 },
        ..JournalOptions::new("kept", 1)
    };
    let (mut journal, _) = Journal::open(Arc::new(StdStorage), dir.path(), options.clone()).unwrap();
    let copied = journal.append(draft("first", 3)).unwrap();
    let kept = journal.append_kept(draft("second", 4)).unwrap().clone();
    assert_eq!(kept.id.number(), copied.id.number() + 1);
    assert_eq!(kept.content.text, "second");
    assert_eq!(journal.entries(), [copied, kept]);
    journal.sync().unwrap();
    let entries = journal.entries().to_vec();
    drop(journal);
    let (reopened, _) = Journal::open(Arc::new(StdStorage), dir.path(), options).unwrap();
    assert_eq!(reopened.entries(), entries, "both appends are read back the same");
}

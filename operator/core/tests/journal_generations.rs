//! Generation switches: compaction with carry-over (in and out of process), rollback, retention.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::Arc;

use strata_core::entry::{Content, EntryDraft, EntryId, EntryKind, RetentionClass, Role};
use strata_core::journal::sim::{Fault, OpKind, SimStorage};
use strata_core::journal::{
    BaselineEntry, CompactionProposal, GenerationOrigin, Journal, JournalError, JournalOptions, Storage,
    propose_compaction, read_current_generation, read_generation,
};

const DIR: &str = "/data";

fn draft(kind: EntryKind, text: &str, tokens: u64) -> EntryDraft {
    EntryDraft {
        kind,
        role: if kind == EntryKind::Summary { Role::System } else { Role::User },
        content: Content::text(text),
        retention: RetentionClass::Working,
        created_at_ms: 1,
        tokens,
        artifact_refs: vec![],
    }
}

fn open(sim: &SimStorage, retain: usize) -> Journal {
    let mut options = JournalOptions::new("gen-test", 100);
    options.retain_generations = retain;
    Journal::open(Arc::new(sim.clone()), DIR, options).unwrap().0
}

fn id(text: &str) -> EntryId {
    text.parse().unwrap()
}

#[test]
fn compaction_carries_post_watermark_entries_exactly_once() {
    let sim = SimStorage::new();
    let mut journal = open(&sim, 2);
    for text in ["a", "b", "c"] {
        journal.append(draft(EntryKind::Message, text, 10)).unwrap();
    }
    let snapshot = journal.begin_compaction().unwrap();
    assert_eq!(snapshot.watermark.entries, 3);
    journal.append(draft(EntryKind::Message, "d", 10)).unwrap();
    journal.append(draft(EntryKind::Message, "e", 10)).unwrap();
    let switch = journal
        .commit_generation(
            &snapshot,
            vec![
                BaselineEntry::New(draft(EntryKind::Summary, "a and b", 4)),
                BaselineEntry::Keep(id("msg_3")),
            ],
            200,
        )
        .unwrap();
    assert_eq!((switch.from_generation, switch.to_generation), (1, 2));
    assert_eq!((switch.baseline_entries, switch.carried_entries), (2, 2));
    let ids: Vec<String> = journal.entries().iter().map(|e| e.id.to_string()).collect();
    assert_eq!(ids, ["summary_6", "msg_3", "msg_4", "msg_5"]);
    assert_eq!(journal.total_tokens(), 34);
    assert_eq!(journal.append(draft(EntryKind::Message, "f", 1)).unwrap().id, id("msg_7"));
    assert!(matches!(journal.manifest().origin, GenerationOrigin::Compaction { carried_entries: 2, .. }));
    assert!(matches!(
        journal.commit_generation(&snapshot, vec![], 300),
        Err(JournalError::StaleSnapshot { .. })
    ));
    let before = journal.entries().to_vec();
    drop(journal);
    let journal = open(&sim, 2);
    assert_eq!(journal.entries(), before.as_slice());
    assert_eq!(journal.retained_generations().unwrap(), vec![1]);
    assert_eq!(sim.read(Path::new("/data/CURRENT")).unwrap(), b"gen-000002\n");
}

#[test]
fn baseline_may_only_refer_to_entries_below_the_watermark() {
    let sim = SimStorage::new();
    let mut journal = open(&sim, 2);
    journal.append(draft(EntryKind::Message, "a", 1)).unwrap();
    let snapshot = journal.begin_compaction().unwrap();
    journal.append(draft(EntryKind::Message, "b", 1)).unwrap();
    for baseline in [
        vec![BaselineEntry::Keep(id("msg_2"))],
        vec![BaselineEntry::Keep(id("msg_1")), BaselineEntry::Keep(id("msg_1"))],
        vec![BaselineEntry::Rewrite { id: id("msg_1"), draft: draft(EntryKind::ToolResult, "x", 1) }],
    ] {
        assert!(matches!(
            journal.commit_generation(&snapshot, baseline, 1),
            Err(JournalError::BadBaseline { .. })
        ));
    }
    assert_eq!(journal.generation(), 1);
    let switch = journal
        .commit_generation(
            &snapshot,
            vec![BaselineEntry::Rewrite { id: id("msg_1"), draft: draft(EntryKind::Message, "short", 1) }],
            1,
        )
        .unwrap();
    assert_eq!(switch.to_generation, 2);
    assert_eq!(journal.entries()[0].content.text, "short");
    assert!(journal.entries()[0].hash_is_valid());
    assert_eq!(journal.entries()[1].id, id("msg_2"));
}

#[test]
fn out_of_process_proposal_is_committed_once_by_the_writer() {
    let sim = SimStorage::new();
    let mut journal = open(&sim, 2);
    journal.append(draft(EntryKind::Message, "a", 1)).unwrap();
    journal.append(draft(EntryKind::Message, "b", 1)).unwrap();
    let view = read_current_generation(&sim, Path::new(DIR)).unwrap();
    let snapshot = view.snapshot();
    propose_compaction(
        &sim,
        Path::new(DIR),
        &CompactionProposal {
            generation: snapshot.generation,
            watermark: snapshot.watermark,
            baseline: vec![BaselineEntry::New(draft(EntryKind::Summary, "a+b", 1))],
            created_at_ms: 9,
        },
    )
    .unwrap();
    journal.append(draft(EntryKind::Message, "c", 1)).unwrap();
    let switch = journal.refresh().unwrap().unwrap();
    assert_eq!((switch.baseline_entries, switch.carried_entries), (1, 1));
    let ids: Vec<String> = journal.entries().iter().map(|e| e.id.to_string()).collect();
    assert_eq!(ids, ["summary_4", "msg_3"]);
    assert_eq!(journal.refresh().unwrap(), None);
    assert!(sim.list_dir(Path::new("/data/proposals")).unwrap().is_empty());
}

/// A gateway refreshes every second, under the engine's lock: with no proposal waiting, a refresh
/// only looks.
#[test]
fn a_refresh_with_no_proposal_waiting_fsyncs_nothing() {
    let sim = SimStorage::new();
    let mut journal = open(&sim, 2);
    journal.append(draft(EntryKind::Message, "a", 1)).unwrap();
    let snapshot = read_current_generation(&sim, Path::new(DIR)).unwrap().snapshot();
    let proposal = CompactionProposal {
        generation: snapshot.generation,
        watermark: snapshot.watermark,
        baseline: vec![BaselineEntry::New(draft(EntryKind::Summary, "a", 1))],
        created_at_ms: 9,
    };
    propose_compaction(&sim, Path::new(DIR), &proposal).unwrap();

    let count_directory_fsyncs = Fault { kind: Some(OpKind::DirFsync), nth: u64::MAX, then_crash: false };
    sim.set_fault(Some(count_directory_fsyncs));
    assert!(journal.refresh().unwrap().is_some());
    assert!(sim.counted_ops() > 0, "the commit and the proposal's removal are made durable");
    assert!(sim.list_dir(Path::new("/data/proposals")).unwrap().is_empty(), "the directory is left, empty");

    sim.set_fault(Some(count_directory_fsyncs));
    for _ in 0..3 {
        assert_eq!(journal.refresh().unwrap(), None);
    }
    assert_eq!(sim.counted_ops(), 0, "nothing waited, so nothing was fsynced");

    sim.write_file(&Path::new(DIR).join("proposals/compaction-x.json.tmp"), b"{").unwrap();
    assert_eq!(journal.refresh().unwrap(), None);
    assert_eq!(sim.counted_ops(), 0, "one still being written is not waiting");
    assert!(sim.exists(&Path::new(DIR).join("proposals/compaction-x.json.tmp")).unwrap(), "left alone");
}

#[test]
fn stale_proposal_is_discarded() {
    let sim = SimStorage::new();
    let mut journal = open(&sim, 2);
    journal.append(draft(EntryKind::Message, "a", 1)).unwrap();
    let view = read_current_generation(&sim, Path::new(DIR)).unwrap();
    let mut stale = view.snapshot();
    stale.watermark.entries = 5;
    propose_compaction(
        &sim,
        Path::new(DIR),
        &CompactionProposal {
            generation: stale.generation,
            watermark: stale.watermark,
            baseline: vec![],
            created_at_ms: 9,
        },
    )
    .unwrap();
    assert_eq!(journal.refresh().unwrap(), None);
    assert_eq!(journal.generation(), 1);
    assert_eq!(journal.entries().len(), 1);
    assert!(sim.list_dir(Path::new("/data/proposals")).unwrap().is_empty());
}

#[test]
fn rollback_restores_target_byte_identically_and_carries_live_entries() {
    let sim = SimStorage::new();
    let mut journal = open(&sim, 3);
    for text in ["a", "b", "c"] {
        journal.append(draft(EntryKind::Message, text, 1)).unwrap();
    }
    let snapshot = journal.begin_compaction().unwrap();
    journal
        .commit_generation(&snapshot, vec![BaselineEntry::New(draft(EntryKind::Summary, "abc", 1))], 1)
        .unwrap();
    journal.append(draft(EntryKind::Message, "d", 1)).unwrap();
    let snapshot = journal.begin_compaction().unwrap();
    journal
        .commit_generation(&snapshot, vec![BaselineEntry::New(draft(EntryKind::Summary, "abcd", 1))], 1)
        .unwrap();
    journal.append(draft(EntryKind::Message, "e", 1)).unwrap();
    assert_eq!(journal.retained_generations().unwrap(), vec![1, 2]);
    let switch = journal.rollback(1, 7).unwrap();
    assert_eq!(switch.to_generation, 4);
    let ids: Vec<String> = journal.entries().iter().map(|e| e.id.to_string()).collect();
    assert_eq!(ids, ["msg_1", "msg_2", "msg_3", "msg_5", "msg_7"]);
    let target = sim.read(Path::new("/data/gen-000001/journal.log")).unwrap();
    let restored = sim.read(Path::new("/data/gen-000004/journal.log")).unwrap();
    assert_eq!(&restored[24..target.len()], &target[24..], "records not byte-identical");
    assert_eq!(journal.append(draft(EntryKind::Message, "f", 1)).unwrap().id, id("msg_8"));
    assert!(matches!(journal.rollback(4, 8), Err(JournalError::GenerationNotRetained { .. })));
    assert_eq!(read_generation(&sim, Path::new(DIR), 4).unwrap().entries.len(), 6);
}

#[test]
fn retention_deletes_only_generations_beyond_the_limit() {
    let sim = SimStorage::new();
    let mut journal = open(&sim, 1);
    for round in 0..4 {
        journal.append(draft(EntryKind::Message, "x", 1)).unwrap();
        let snapshot = journal.begin_compaction().unwrap();
        let switch = journal.commit_generation(&snapshot, vec![], round).unwrap();
        if round >= 1 {
            assert_eq!(switch.removed_generations, vec![switch.to_generation - 2]);
        }
    }
    assert_eq!(journal.retained_generations().unwrap(), vec![4]);
    let mut dirs = sim.list_dir(Path::new(DIR)).unwrap();
    dirs.sort();
    assert_eq!(dirs, ["CURRENT", "LOCK", "gen-000004", "gen-000005"]);
}

//! Randomized crash-point testing of the journal on the simulated storage.
//!
//! For each seeded workload a fault-free reference run records the journal state after every step.
//! Then the same workload is replayed many times, each time crashing at a different storage
//! operation; after the simulated power loss the journal is reopened and must match the state
//! before or after the interrupted step, keep every acknowledged entry, and never reuse an ID.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use strata_core::entry::{Content, Entry, EntryDraft, EntryKind, RetentionClass, Role};
use strata_core::journal::sim::{Fault, OpKind, SimRng, SimStorage};
use strata_core::journal::{
    BaselineEntry, CompactionProposal, Journal, JournalError, JournalOptions, Snapshot, SyncPolicy,
    propose_compaction, read_current_generation, read_generation,
};

const DIR: &str = "/data";
const WORKLOADS: u64 = 250;
const CRASHES_PER_WORKLOAD: u64 = 44;
const STEPS: usize = 28;

#[derive(Debug, Clone, PartialEq)]
struct State {
    generation: u64,
    entries: Vec<Entry>,
    durable: usize,
}

#[derive(Debug, Clone, Copy)]
enum Step {
    Append,
    Sync,
    BeginCompaction,
    CommitCompaction,
    ProposeCompaction,
    Refresh,
    Rollback,
    Reopen,
}

fn plan(seed: u64) -> Vec<Step> {
    let mut rng = SimRng::new(seed);
    (0..STEPS)
        .map(|_| match rng.below(100) {
            0..=54 => Step::Append,
            55..=64 => Step::Sync,
            65..=71 => Step::BeginCompaction,
            72..=79 => Step::CommitCompaction,
            80..=84 => Step::ProposeCompaction,
            85..=89 => Step::Refresh,
            90..=95 => Step::Rollback,
            _ => Step::Reopen,
        })
        .collect()
}

fn options(seed: u64) -> JournalOptions {
    let mut options = JournalOptions::new("crash-test", 1_000);
    options.retain_generations = 1 + (seed % 2) as usize;
    options.sync_policy = if seed.is_multiple_of(3) {
        SyncPolicy::EveryAppend
    } else {
        SyncPolicy::Batched { max_pending: seed % 4 }
    };
    options
}

fn draft(rng: &mut SimRng) -> EntryDraft {
    let (kind, role) = match rng.below(4) {
        0 => (EntryKind::Message, Role::User),
        1 => (EntryKind::Message, Role::Assistant),
        2 => (EntryKind::ToolCall, Role::Assistant),
        _ => (EntryKind::ToolResult, Role::Tool),
    };
    let text = format!("text {}", rng.below(1_000_000));
    EntryDraft {
        kind,
        role,
        content: Content::text(text),
        retention: RetentionClass::Working,
        created_at_ms: 2_000 + rng.below(1_000),
        tokens: 1 + rng.below(50),
        artifact_refs: vec![],
    }
}

fn baseline(rng: &mut SimRng, entries: &[Entry]) -> Vec<BaselineEntry> {
    let mut baseline: Vec<BaselineEntry> =
        entries.iter().filter(|_| rng.below(2) == 0).map(|entry| BaselineEntry::Keep(entry.id)).collect();
    baseline.insert(
        0,
        BaselineEntry::New(EntryDraft {
            kind: EntryKind::Summary,
            role: Role::System,
            content: Content::text(format!("summary of {} entries", entries.len())),
            retention: RetentionClass::Critical,
            created_at_ms: 3_000,
            tokens: 7,
            artifact_refs: vec![],
        }),
    );
    baseline
}

fn open(sim: &SimStorage, seed: u64) -> Result<Journal, JournalError> {
    Journal::open(Arc::new(sim.clone()), DIR, options(seed)).map(|(journal, _)| journal)
}

fn state(journal: &Journal, durable: usize) -> State {
    State { generation: journal.generation(), entries: journal.entries().to_vec(), durable }
}

/// Runs the workload; `states[0]` is the state after opening and `states[i]` after step `i`.
/// On the first error returns the index of the step that failed (0 = the initial open).
fn run(sim: &SimStorage, seed: u64, states: &mut Vec<State>) -> Result<(), (usize, String)> {
    let mut rng = SimRng::new(seed ^ 0xA5A5);
    let mut journal = open(sim, seed).map_err(|e| (0usize, e.to_string()))?;
    let mut durable = 0;
    states.push(state(&journal, durable));
    let mut snapshot: Option<Snapshot> = None;
    for (index, step) in plan(seed).into_iter().enumerate() {
        let failed = index + 1;
        match step {
            Step::Append => {
                journal.append(draft(&mut rng)).map_err(|e| (failed, e.to_string()))?;
                let synced_now = match options(seed).sync_policy {
                    SyncPolicy::EveryAppend => true,
                    SyncPolicy::Batched { max_pending } => {
                        max_pending > 0 && (journal.entries().len() - durable) as u64 >= max_pending
                    }
                };
                if synced_now {
                    durable = journal.entries().len();
                }
            }
            Step::Sync => {
                journal.sync().map_err(|e| (failed, e.to_string()))?;
                durable = journal.entries().len();
            }
            Step::BeginCompaction => {
                snapshot = Some(journal.begin_compaction().map_err(|e| (failed, e.to_string()))?)
            }
            Step::CommitCompaction => {
                if let Some(taken) = snapshot.take() {
                    let baseline = baseline(&mut rng, &taken.entries);
                    match journal.commit_generation(&taken, baseline, 4_000) {
                        Ok(_) => durable = journal.entries().len(),
                        Err(JournalError::StaleSnapshot { .. }) => {}
                        Err(error) => return Err((failed, error.to_string())),
                    }
                }
            }
            Step::ProposeCompaction => {
                let view =
                    read_current_generation(sim, Path::new(DIR)).map_err(|e| (failed, e.to_string()))?;
                let taken = view.snapshot();
                let proposal = CompactionProposal {
                    generation: taken.generation,
                    watermark: taken.watermark,
                    baseline: baseline(&mut rng, &taken.entries),
                    created_at_ms: 5_000,
                };
                propose_compaction(sim, Path::new(DIR), &proposal).map_err(|e| (failed, e.to_string()))?;
            }
            Step::Refresh => {
                if journal.refresh().map_err(|e| (failed, e.to_string()))?.is_some() {
                    durable = journal.entries().len();
                }
            }
            Step::Rollback => {
                let retained = journal.retained_generations().map_err(|e| (failed, e.to_string()))?;
                if !retained.is_empty() {
                    let target = retained[rng.below(retained.len() as u64) as usize];
                    journal.rollback(target, 6_000).map_err(|e| (failed, e.to_string()))?;
                    durable = journal.entries().len();
                }
            }
            Step::Reopen => {
                journal.sync().map_err(|e| (failed, e.to_string()))?;
                durable = journal.entries().len();
                drop(journal);
                journal = open(sim, seed).map_err(|e| (failed, e.to_string()))?;
            }
        }
        states.push(state(&journal, durable));
    }
    Ok(())
}

fn is_prefix(short: &[Entry], long: &[Entry]) -> bool {
    short.len() <= long.len() && short == &long[..short.len()]
}

fn check_recovery(sim: &SimStorage, seed: u64, reference: &[State], failed_step: usize, context: &str) {
    let (mut journal, report) = Journal::open(Arc::new(sim.clone()), DIR, options(seed))
        .unwrap_or_else(|error| panic!("{context}: recovery refused: {error}"));
    let before = &reference[failed_step.saturating_sub(1)];
    let after = &reference[failed_step.min(reference.len() - 1)];
    let recovered = journal.entries().to_vec();
    let matches_state = |candidate: &State| {
        let minimum =
            if candidate.generation == before.generation { before.durable } else { candidate.durable };
        journal.generation() == candidate.generation
            && is_prefix(&recovered, &candidate.entries)
            && recovered.len() >= minimum
    };
    assert!(
        matches_state(before) || matches_state(after),
        "{context}: recovered generation {} with {} entries ({report:?}) matches neither the state \
         before step {failed_step} (generation {}, {} entries, {} durable) nor after it \
         (generation {}, {} entries)",
        journal.generation(),
        recovered.len(),
        before.generation,
        before.entries.len(),
        before.durable,
        after.generation,
        after.entries.len(),
    );
    assert_eq!(
        journal.total_tokens(),
        recovered.iter().map(|entry| entry.tokens).sum::<u64>(),
        "{context}: token total"
    );
    let unique: HashSet<u64> = recovered.iter().map(|entry| entry.id.number()).collect();
    assert_eq!(unique.len(), recovered.len(), "{context}: duplicated entry IDs");
    let baseline = journal.manifest().baseline_entries as usize;
    let appended: Vec<u64> =
        recovered[baseline.min(recovered.len())..].iter().map(|entry| entry.id.number()).collect();
    assert!(
        appended.windows(2).all(|pair| pair[0] < pair[1]),
        "{context}: appended IDs not monotonic: {appended:?}"
    );
    let mut highest = recovered.iter().map(|e| e.id.number()).max().unwrap_or(0);
    for state in &reference[..failed_step.min(reference.len())] {
        for entry in &state.entries[..state.durable] {
            highest = highest.max(entry.id.number());
        }
    }
    for retained in journal.retained_generations().unwrap() {
        let view = read_generation(sim, Path::new(DIR), retained)
            .unwrap_or_else(|error| panic!("{context}: retained generation {retained}: {error}"));
        for entry in &view.entries {
            highest = highest.max(entry.id.number());
        }
    }
    assert!(
        journal.next_entry_number() > highest,
        "{context}: next ID {} does not exceed {highest}",
        journal.next_entry_number()
    );
    let mut rng = SimRng::new(seed);
    let added = journal.append(draft(&mut rng)).unwrap();
    journal.sync().unwrap();
    assert!(added.id.number() > highest, "{context}: reused ID {}", added.id);
    drop(journal);
    sim.crash(seed.wrapping_add(1));
    let (journal, _) = Journal::open(Arc::new(sim.clone()), DIR, options(seed)).unwrap();
    assert_eq!(journal.entries().last(), Some(&added), "{context}: entry synced after recovery was lost");
}

#[test]
fn randomized_crash_points_preserve_journal_invariants() {
    let kinds = [
        None,
        Some(OpKind::Write),
        Some(OpKind::Fsync),
        Some(OpKind::DirFsync),
        Some(OpKind::Rename),
        Some(OpKind::Remove),
    ];
    let mut cases = 0u64;
    let mut crashed_mid_workload = 0u64;
    for workload in 0..WORKLOADS {
        let sim = SimStorage::new();
        sim.set_fault(Some(Fault { kind: None, nth: u64::MAX, then_crash: true }));
        let mut reference = Vec::new();
        run(&sim, workload, &mut reference).expect("reference run must not fail");
        let mut ops_per_kind = Vec::new();
        for kind in kinds {
            let counter = SimStorage::new();
            counter.set_fault(Some(Fault { kind, nth: u64::MAX, then_crash: true }));
            run(&counter, workload, &mut Vec::new()).expect("counting run must not fail");
            ops_per_kind.push(counter.counted_ops());
        }
        let mut rng = SimRng::new(workload.wrapping_mul(7919));
        for case in 0..CRASHES_PER_WORKLOAD {
            let sim = SimStorage::new();
            let which = (case % kinds.len() as u64) as usize;
            let kind = kinds[which];
            let nth = 1 + rng.below(ops_per_kind[which].max(1));
            sim.set_fault(Some(Fault { kind, nth, then_crash: true }));
            let mut ignored = Vec::new();
            let failed_step = match run(&sim, workload, &mut ignored) {
                Ok(()) => reference.len(),
                Err((step, _)) => {
                    crashed_mid_workload += 1;
                    step
                }
            };
            let crash_seed = workload * 1_000 + case;
            sim.crash(crash_seed);
            let context =
                format!("workload {workload} case {case} (fault {kind:?} #{nth}, step {failed_step})");
            check_recovery(&sim, workload, &reference, failed_step, &context);
            cases += 1;
        }
    }
    assert!(cases >= 10_000, "only {cases} crash cases ran");
    assert!(
        crashed_mid_workload * 2 > cases,
        "too few cases crashed inside the workload: {crashed_mid_workload} of {cases}"
    );
}

//! Journal and artifact store benchmarks on a real temporary directory.
//!
//! Goals: recovery (open) of a 64 MB journal within 100 ms; append and artifact throughput are
//! reported for capacity planning.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use strata_core::artifacts::ArtifactStore;
use strata_core::entry::{Content, EntryDraft, EntryKind, RetentionClass, Role};
use strata_core::journal::{Journal, JournalOptions, StdStorage, SyncPolicy};

fn draft(index: u64, text_len: usize) -> EntryDraft {
    let mut text = format!("entry {index}: ");
    while text.len() < text_len {
        text.push_str("the quick brown fox jumps over the lazy dog. ");
    }
    text.truncate(text_len);
    EntryDraft {
        kind: EntryKind::Message,
        role: if index.is_multiple_of(2) { Role::User } else { Role::Assistant },
        content: Content::text(text),
        retention: RetentionClass::Working,
        created_at_ms: 1_700_000_000_000 + index,
        tokens: (text_len / 4) as u64,
        artifact_refs: vec![],
    }
}

fn options(policy: SyncPolicy) -> JournalOptions {
    let mut options = JournalOptions::new("bench", 1);
    options.sync_policy = policy;
    options
}

fn append(c: &mut Criterion) {
    let mut group = c.benchmark_group("journal_append_512B");
    group.throughput(Throughput::Elements(1));
    for (name, policy) in [
        ("no_fsync", SyncPolicy::Batched { max_pending: 0 }),
        ("fsync_every_append", SyncPolicy::EveryAppend),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (mut journal, _) = Journal::open(Arc::new(StdStorage), dir.path(), options(policy)).unwrap();
        let mut index = 0;
        group.bench_function(name, |b| {
            b.iter(|| {
                index += 1;
                black_box(journal.append(draft(index, 512)).unwrap());
            })
        });
    }
    group.finish();
}

fn recovery(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let storage = Arc::new(StdStorage);
    let (mut journal, _) =
        Journal::open(storage.clone(), dir.path(), options(SyncPolicy::Batched { max_pending: 0 })).unwrap();
    let mut index = 0;
    while std::fs::metadata(dir.path().join("gen-000001/journal.log")).unwrap().len() < 64 << 20 {
        for _ in 0..1_000 {
            index += 1;
            journal.append(draft(index, 2_000)).unwrap();
        }
    }
    journal.sync().unwrap();
    drop(journal);
    let mut group = c.benchmark_group("journal_recovery");
    group.throughput(Throughput::Bytes(64 << 20));
    group.sample_size(10);
    group.bench_function("open_64MB", |b| {
        b.iter(|| {
            let (journal, report) =
                Journal::open(storage.clone(), dir.path(), options(SyncPolicy::EveryAppend)).unwrap();
            assert_eq!(report.entries as u64, index);
            black_box(journal.total_tokens());
        })
    });
    group.finish();
}

fn artifacts(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let store = ArtifactStore::new(Arc::new(StdStorage), dir.path().join("artifacts"));
    let mut group = c.benchmark_group("artifacts");
    for (name, size) in [("64KiB", 64usize << 10), ("1MiB", 1 << 20)] {
        group.throughput(Throughput::Bytes(size as u64));
        let mut bytes: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        let mut serial = 0u64;
        group.bench_function(format!("put_{name}"), |b| {
            b.iter(|| {
                serial += 1;
                bytes[..8].copy_from_slice(&serial.to_le_bytes());
                black_box(store.put("bench", &bytes).unwrap());
            })
        });
        let stored = store.put("bench", &bytes).unwrap();
        group.bench_function(format!("get_{name}"), |b| {
            b.iter(|| black_box(store.get("bench", &stored).unwrap()))
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = append, recovery, artifacts
}
criterion_main!(benches);

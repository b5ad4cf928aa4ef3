//! purge, spill and elision planning on realistic sizes.
#![allow(clippy::unwrap_used, missing_docs)]

use std::collections::HashSet;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use strata_core::artifacts::ArtifactStore;
use strata_core::economics::CachePricing;
use strata_core::entry::{Content, EntryDraft, EntryKind, RetentionClass, Role, ToolResult};
use strata_core::journal::{Journal, JournalOptions, StdStorage, SyncPolicy};
use strata_core::purge::{PurgeRequest, purge};
use strata_core::tokens::{TokenCounter, TokenizerKind};
use strata_core::tool_output::{ElisionPolicy, SpillPolicy, plan_elision, spill};

fn tool_output(i: usize) -> String {
    (0..120)
        .map(|line| format!("src/auth/session.py:{line}: def check_{i}_{line}(user): return user.id\n"))
        .collect()
}

fn draft(i: usize, counter: &TokenCounter) -> EntryDraft {
    if i.is_multiple_of(2) {
        let text = format!("Step {i}: running the next check.");
        EntryDraft {
            kind: EntryKind::Message,
            role: Role::Assistant,
            tokens: u64::from(counter.count(&text)),
            content: Content::text(text),
            retention: RetentionClass::Working,
            created_at_ms: i as u64,
            artifact_refs: Vec::new(),
        }
    } else {
        let output = tool_output(i);
        EntryDraft {
            kind: EntryKind::ToolResult,
            role: Role::Tool,
            tokens: u64::from(counter.count(&output)),
            content: Content {
                text: String::new(),
                tool_calls: Vec::new(),
                tool_results: vec![ToolResult {
                    call_id: format!("call_{i}"),
                    name: Some("bash".into()),
                    output,
                }],
            },
            retention: RetentionClass::Working,
            created_at_ms: i as u64,
            artifact_refs: Vec::new(),
        }
    }
}

fn bench_operations(c: &mut Criterion) {
    let counter = TokenCounter::new(TokenizerKind::O200kBase).unwrap();
    let storage = Arc::new(StdStorage);

    let spill_dir = tempfile::tempdir().unwrap();
    let store = ArtifactStore::new(storage.clone(), spill_dir.path().join("artifacts"));
    let big = tool_output(7).repeat(8); // ~60 KB
    c.bench_function("spill_60kb_output", |b| {
        b.iter(|| spill(&big, &SpillPolicy::default(), &store, "bench").unwrap().spilled())
    });

    // ~200 rounds of history: 100 tool results of ~2.3k tokens each.
    let drafts: Vec<EntryDraft> = (0..200).map(|i| draft(i, &counter)).collect();
    let entries: Vec<_> =
        drafts.iter().cloned().enumerate().map(|(i, d)| d.into_entry(i as u64 + 1)).collect();
    c.bench_function("plan_elision_200_rounds", |b| {
        b.iter(|| {
            plan_elision(
                &entries,
                &HashSet::new(),
                &ElisionPolicy::default(),
                |text| u64::from(counter.count(text)),
                50,
                CachePricing::ANTHROPIC,
            )
            .map(|batch| batch.saved_tokens)
        })
    });

    c.bench_function("purge_2_entries_from_200_entry_journal", |b| {
        b.iter_batched(
            || {
                let dir = tempfile::tempdir().unwrap();
                let data = dir.path().join("data");
                std::fs::create_dir_all(&data).unwrap();
                let mut options = JournalOptions::new("bench", 1);
                options.sync_policy = SyncPolicy::Batched { max_pending: 1024 };
                let (mut journal, _) = Journal::open(storage.clone(), &data, options).unwrap();
                for d in &drafts {
                    journal.append(d.clone()).unwrap();
                }
                journal.sync().unwrap();
                let store = ArtifactStore::new(storage.clone(), data.join("artifacts"));
                let ids = vec![journal.entries()[101].id, journal.entries()[102].id];
                (dir, journal, store, ids)
            },
            |(dir, mut journal, store, ids)| {
                let request = PurgeRequest { ids, summary: "Checked session.py; nothing relevant.".into() };
                let outcome =
                    purge(&mut journal, &store, "bench", &request, &counter, 2, 20, CachePricing::ANTHROPIC)
                        .unwrap();
                drop(dir);
                outcome.saved_tokens
            },
            criterion::BatchSize::PerIteration,
        )
    });
}

criterion_group!(benches, bench_operations);
criterion_main!(benches);

//! Extractive compaction of a 1M-token journal built from the real trajectories in
//! ../shared/corpus/swe-gemini3 (concatenated and renumbered until the stored token counts reach
//! one million).
//!
//! Goal: the whole extractive compaction — prepare (previous state, delta, kept entries, pattern
//! pass), summarise, preservation check, archive of the removed entries and baseline — within 1 s.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use strata_core::artifacts::ArtifactStore;
use strata_core::compaction::{
    CompactionMode, CompactionRequest, CompactionSettings, Conclusion, ExtractiveSummarizer,
    PreparedCompaction, check_preservation,
};
use strata_core::entry::{Content, Entry, EntryDraft, EntryKind, RetentionClass, Role, ToolResult};
use strata_core::journal::{Snapshot, StdStorage, Watermark};
use strata_core::tokens::{TokenCounter, TokenizerKind};

const TARGET_TOKENS: u64 = 1_000_000;

fn corpus_messages() -> Vec<(String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus/swe-gemini3");
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    let mut messages = Vec::new();
    for file in files {
        let json: serde_json::Value = serde_json::from_slice(&std::fs::read(file).unwrap()).unwrap();
        for message in json["messages"].as_array().unwrap() {
            let role = message["role"].as_str().unwrap_or("user").to_owned();
            messages.push((role, message["content"].as_str().unwrap_or_default().to_owned()));
        }
    }
    messages
}

fn million_token_snapshot() -> Snapshot {
    let messages = corpus_messages();
    let mut entries: Vec<Entry> = Vec::new();
    let mut total = 0;
    let mut number = 1;
    while total < TARGET_TOKENS {
        for (role, text) in &messages {
            let tokens = (text.len() as u64).div_ceil(4) + 4;
            let (kind, role, content) = match role.as_str() {
                "assistant" => (EntryKind::Message, Role::Assistant, Content::text(text.clone())),
                "system" => (EntryKind::Message, Role::System, Content::text(text.clone())),
                _ if text.starts_with("<returncode>") => (
                    EntryKind::ToolResult,
                    Role::Tool,
                    Content {
                        text: String::new(),
                        tool_calls: vec![],
                        tool_results: vec![ToolResult {
                            call_id: format!("c{number}"),
                            name: None,
                            output: text.clone(),
                        }],
                    },
                ),
                _ => (EntryKind::Message, Role::User, Content::text(text.clone())),
            };
            let draft = EntryDraft {
                kind,
                role,
                content,
                retention: RetentionClass::Working,
                created_at_ms: number,
                tokens,
                artifact_refs: vec![],
            };
            entries.push(draft.into_entry(number));
            number += 1;
            total += tokens;
            if total >= TARGET_TOKENS {
                break;
            }
        }
    }
    Snapshot {
        generation: 1,
        watermark: Watermark { entries: entries.len() as u64, last_id: entries.last().map(|e| e.id) },
        entries,
    }
}

fn request() -> CompactionRequest {
    CompactionRequest {
        mode: CompactionMode::Budget,
        reason: None,
        resume_instruction: None,
        settings: CompactionSettings::default(),
        now_ms: 1,
    }
}

fn extractive_compaction(c: &mut Criterion) {
    let snapshot = million_token_snapshot();
    let tokens: u64 = snapshot.entries.iter().map(|e| e.tokens).sum();
    eprintln!("journal: {} entries, {tokens} tokens", snapshot.entries.len());
    let counter = TokenCounter::new(TokenizerKind::O200kBase).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = ArtifactStore::new(Arc::new(StdStorage), dir.path().join("artifacts"));
    let summarizer = ExtractiveSummarizer::default();
    let mut group = c.benchmark_group("compaction_extractive_1M_tokens");
    group.sample_size(10).measurement_time(Duration::from_secs(20)).throughput(Throughput::Elements(tokens));
    group.bench_function("prepare_summarize_check", |b| {
        b.iter(|| {
            let prepared = PreparedCompaction::new(snapshot.clone(), request());
            let state = summarizer.summarize_now(prepared.summary_input());
            let report = check_preservation(&prepared, &state);
            assert!(report.passed(), "{:?}", report.missing_items);
            black_box(state)
        })
    });
    group.bench_function("end_to_end_with_archive_and_baseline", |b| {
        b.iter(|| {
            let prepared = PreparedCompaction::new(snapshot.clone(), request());
            let state = summarizer.summarize_now(prepared.summary_input());
            let conclusion = prepared.conclude(state, "extractive", &store, "bench", &counter).unwrap();
            assert!(matches!(conclusion, Conclusion::Ready(_)));
            black_box(conclusion)
        })
    });
    group.finish();
}

criterion_group!(benches, extractive_compaction);
criterion_main!(benches);

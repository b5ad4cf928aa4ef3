//! Compile cost per request at 1k-, 50k- and 200k-token journals: one new entry appended, then compiled.
//! The goal is a flat cost (±20%): the work must grow with the new entries, not with the history.
#![allow(clippy::unwrap_used, missing_docs)]

use std::collections::BTreeMap;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use strata_core::budget::BudgetPolicy;
use strata_core::compiler::{BreakpointPlacement, ContextCompiler};
use strata_core::entry::{Content, Entry, EntryDraft, EntryKind, RetentionClass, Role};
use strata_core::prefix::{StablePrefix, StablePrefixSources, ToolRegistry};
use strata_core::tokens::{TokenCounter, TokenizerKind};

fn entry(number: u64, counter: &TokenCounter) -> Entry {
    let text =
        format!("Step {number}: ran the test suite; 3 failures remain in auth/session.py lines 40-88.");
    EntryDraft {
        kind: EntryKind::Message,
        role: if number.is_multiple_of(2) { Role::Assistant } else { Role::User },
        tokens: u64::from(counter.count(&text)),
        content: Content::text(text),
        retention: RetentionClass::Working,
        created_at_ms: number,
        artifact_refs: Vec::new(),
    }
    .into_entry(number)
}

/// A journal of about `tokens` tokens.
fn journal(tokens: u64, counter: &TokenCounter) -> Vec<Entry> {
    let mut entries = Vec::new();
    let mut total = 0;
    let mut number = 1;
    while total < tokens {
        let e = entry(number, counter);
        total += e.tokens;
        entries.push(e);
        number += 1;
    }
    entries
}

fn bench_compile(c: &mut Criterion) {
    let counter = TokenCounter::new(TokenizerKind::O200kBase).unwrap();
    let sources = StablePrefixSources {
        system_prompt: "You are builder, the fleet's implementation agent.".into(),
        tools: vec![serde_json::json!({"name": "bash", "parameters": {"type": "object"}})],
        constants: BTreeMap::new(),
    };
    let prefix = StablePrefix::build(&sources, &mut ToolRegistry::new(), &counter).unwrap();
    let mut group = c.benchmark_group("compile_one_new_entry");
    // A live compiler at the given journal size takes one new entry and compiles, APPENDS times in a
    // row (the gateway's steady state); a fresh compiler is built, untimed, for every run of appends.
    const APPENDS: u64 = 64;
    for size in [1_000u64, 50_000, 200_000] {
        let mut entries = journal(size, &counter);
        let base = entries.len();
        let first_new = base as u64 + 1;
        entries.extend((first_new..first_new + APPENDS).map(|n| entry(n, &counter)));
        group.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, _| {
            b.iter_custom(|iters| {
                let mut total = std::time::Duration::ZERO;
                let mut done = 0;
                while done < iters {
                    let mut compiler = ContextCompiler::new(prefix.clone(), BreakpointPlacement::Auto);
                    compiler.sync(1, &entries[..base], &counter);
                    let run = APPENDS.min(iters - done);
                    let start = std::time::Instant::now();
                    for k in 1..=run as usize {
                        compiler.sync(1, &entries[..base + k], &counter);
                        let packet = compiler
                            .compile(&entries[..base + k], 1_000_000, BudgetPolicy::default())
                            .unwrap();
                        std::hint::black_box(packet.status.tokens);
                    }
                    total += start.elapsed();
                    done += run;
                }
                total
            });
        });
    }
    group.finish();
}

criterion_group!(benches, bench_compile);
criterion_main!(benches);

//! Spill, read-back, elision batching and dedup on real mini-swe-agent trajectories.
//!
//! Reads `/work/shared/corpus/swe-gemini3/*.json` (relative to the crate: `../../../shared/corpus/
//! swe-gemini3`). Tool outputs are the `user` messages that start with `<returncode>`.
#![allow(clippy::unwrap_used)]

mod support;

use support::{corpus_files, load, tokens_of};

use std::collections::{HashMap, HashSet};

use std::sync::Arc;

use strata_core::artifacts::{ArtifactRef, ArtifactStore};
use strata_core::dedup::{MIN_DEDUP_CHARS, find_duplicates};
use strata_core::economics::CachePricing;
use strata_core::entry::{Entry, EntryId, Role};
use strata_core::journal::sim::SimStorage;
use strata_core::tool_output::{
    ElisionPolicy, ReadRequest, SpillPolicy, plan_elision, read_output, render_elided, spill,
};

fn outputs(entries: &[Entry]) -> impl Iterator<Item = &str> {
    entries.iter().flat_map(|e| e.content.tool_results.iter().map(|r| r.output.as_str()))
}

#[test]
fn spilled_corpus_outputs_read_back_byte_exact() {
    let Some(files) = corpus_files("spilled_corpus_outputs_read_back_byte_exact") else { return };
    let store = ArtifactStore::new(Arc::new(SimStorage::new()), "/artifacts");
    let policy = SpillPolicy::default();
    let mut spilled = 0;
    for path in files {
        for output in outputs(&load(&path)) {
            let outcome = spill(output, &policy, &store, "corpus").unwrap();
            let Some(data_ref) = outcome.data_ref else {
                assert_eq!(outcome.window_text, output);
                continue;
            };
            spilled += 1;
            assert!(outcome.window_text.chars().count() < policy.preview_chars + 400);
            let mut rebuilt = String::new();
            loop {
                let request = ReadRequest::Slice {
                    data_ref: data_ref.clone(),
                    offset: rebuilt.chars().count(),
                    length: None,
                };
                let answer = read_output(&store, "corpus", &request, policy.max_result_chars).unwrap();
                let chunk = &answer[..answer.rfind("\n[strata: ").unwrap()];
                if chunk.is_empty() {
                    break;
                }
                rebuilt.push_str(chunk);
            }
            assert_eq!(rebuilt.as_bytes(), output.as_bytes(), "{}", path.display());
        }
    }
    assert!(spilled > 0, "the corpus has outputs over {} chars", policy.max_result_chars);
}

#[test]
fn corpus_elision_fires_few_batches_and_saves_tokens() {
    let Some(files) = corpus_files("corpus_elision_fires_few_batches_and_saves_tokens") else { return };
    let policy = ElisionPolicy::default();
    let (mut total_rounds, mut total_batches, mut total_saved) = (0usize, 0usize, 0u64);
    for path in files {
        let full = load(&path);
        let rounds = full.iter().filter(|e| e.role == Role::Assistant).count();
        let mut window: Vec<Entry> = Vec::new();
        let mut elided: HashSet<EntryId> = HashSet::new();
        let mut calls_made = 0;
        for entry in full {
            // A model call happens before each assistant entry: plan, apply, then call.
            if entry.role == Role::Assistant {
                let remaining = (rounds - calls_made) as u64;
                if let Some(batch) =
                    plan_elision(&window, &elided, &policy, tokens_of, remaining, CachePricing::ANTHROPIC)
                {
                    total_batches += 1;
                    total_saved += batch.saved_tokens;
                    assert!(batch.economics.pays());
                    for e in window.iter_mut().filter(|e| batch.ids.contains(&e.id)) {
                        let result = &mut e.content.tool_results[0];
                        let data_ref = ArtifactRef::for_bytes(result.output.as_bytes());
                        result.output = render_elided(&result.output, policy.elide_keep_chars, &data_ref);
                        e.tokens = tokens_of(&result.output) + 4;
                        elided.insert(e.id);
                    }
                }
                calls_made += 1;
            }
            window.push(entry);
        }
        total_rounds += rounds;
    }
    assert!(total_batches > 0, "some corpus sessions are long enough to elide");
    assert!(
        total_batches <= total_rounds / policy.elide_after_rounds,
        "{total_batches} batches over {total_rounds} rounds"
    );
    assert!(total_saved > 10_000, "saved {total_saved} tokens");
    println!(
        "corpus: {total_rounds} rounds, {total_batches} elision batches, {total_saved} tokens saved per later call"
    );
}

#[test]
fn corpus_dedup_finds_the_repeated_outputs() {
    let Some(files) = corpus_files("corpus_dedup_finds_the_repeated_outputs") else { return };
    let (mut found, mut expected) = (0usize, 0usize);
    for path in files {
        let entries = load(&path);
        let duplicates = find_duplicates(&entries);
        let by_id: HashMap<EntryId, &Entry> = entries.iter().map(|e| (e.id, e)).collect();
        for duplicate in &duplicates {
            let later = &by_id[&duplicate.later].content.tool_results[0].output;
            let original = &by_id[&duplicate.original].content.tool_results[0].output;
            assert_eq!(later, original);
            assert!(duplicate.original.number() < duplicate.later.number());
        }
        let mut seen = HashSet::new();
        expected +=
            outputs(&entries).filter(|o| o.chars().count() >= MIN_DEDUP_CHARS && !seen.insert(*o)).count();
        found += duplicates.len();
    }
    assert_eq!(found, expected);
    assert!(found > 0, "the corpus contains repeated outputs");
}

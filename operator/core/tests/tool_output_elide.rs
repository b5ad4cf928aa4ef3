//! Elision planning: eligibility by rounds, rendering, storage, and batching against cache economics.
#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::sync::Arc;

use strata_core::artifacts::{ArtifactRef, ArtifactStore};
use strata_core::economics::CachePricing;
use strata_core::entry::{Content, Entry, EntryDraft, EntryId, EntryKind, RetentionClass, Role, ToolResult};
use strata_core::history_index::EntryIndex;
use strata_core::journal::sim::SimStorage;
use strata_core::tool_output::elide::ELISION_MARKER_PREFIX;
use strata_core::tool_output::{
    ElisionCandidates, ElisionPolicy, elide_entry, has_elidable_output, plan_elision, plan_elision_among,
    render_elided, rounds_after,
};

fn tokens_of(text: &str) -> u64 {
    (text.chars().count() as u64).div_ceil(4)
}

fn assistant(number: u64, tokens: u64) -> Entry {
    EntryDraft {
        kind: EntryKind::ToolCall,
        role: Role::Assistant,
        content: Content::text("x".repeat(tokens as usize * 4)),
        retention: RetentionClass::Working,
        created_at_ms: number,
        tokens,
        artifact_refs: vec![],
    }
    .into_entry(number)
}

fn tool_result(number: u64, output: String) -> Entry {
    let tokens = tokens_of(&output) + 4;
    EntryDraft {
        kind: EntryKind::ToolResult,
        role: Role::Tool,
        content: Content {
            text: String::new(),
            tool_calls: vec![],
            tool_results: vec![ToolResult {
                call_id: format!("c{number}"),
                name: Some("bash".into()),
                output,
            }],
        },
        retention: RetentionClass::Working,
        created_at_ms: number,
        tokens,
        artifact_refs: vec![],
    }
    .into_entry(number)
}

fn output_of_size(round: usize, chars: usize) -> String {
    let line = format!("round {round} output line with some text\n");
    line.repeat(chars / line.len() + 1)[..chars].to_owned()
}

#[test]
fn rounds_count_assistant_entries_after() {
    let entries = vec![
        tool_result(0, "a".into()),
        assistant(1, 10),
        tool_result(2, "b".into()),
        assistant(3, 10),
        assistant(4, 10),
        tool_result(5, "c".into()),
    ];
    assert_eq!(rounds_after(&entries), vec![3, 2, 2, 1, 0, 0]);
}

#[test]
fn render_elided_keeps_prefix_and_ref() {
    let text = "é".repeat(3000);
    let data_ref = ArtifactRef::for_bytes(text.as_bytes());
    let elided = render_elided(&text, 800, &data_ref);
    assert!(
        elided.starts_with(&format!(
            "{}\n{ELISION_MARKER_PREFIX}kept first 800 of 3,000 chars",
            "é".repeat(800)
        ))
    );
    assert!(elided.contains(&data_ref.to_string()));
    assert_eq!(elided, render_elided(&text, 800, &data_ref));
}

#[test]
fn only_old_large_results_are_planned() {
    let policy = ElisionPolicy::default();
    let mut entries =
        vec![tool_result(0, output_of_size(0, 20_000)), tool_result(1, output_of_size(1, 1_000))];
    for n in 2..5 {
        entries.push(assistant(n, 10));
    }
    let plan = |entries: &[Entry]| {
        plan_elision(entries, &HashSet::new(), &policy, tokens_of, 10, CachePricing::ANTHROPIC)
    };
    assert!(plan(&entries).is_none(), "only 3 rounds old");
    entries.push(assistant(5, 10));
    let batch = plan(&entries).unwrap();
    assert_eq!(batch.ids, vec![EntryId::new(EntryKind::ToolResult, 0)]);
    assert_eq!(batch.first_changed_index, 0);
    assert!(batch.saved_tokens > 4_000 && batch.economics.pays());
    let done: HashSet<EntryId> = batch.ids.iter().copied().collect();
    assert!(plan_elision(&entries, &done, &policy, tokens_of, 10, CachePricing::ANTHROPIC).is_none());
}

#[test]
fn small_saving_before_a_long_tail_waits() {
    let policy = ElisionPolicy::default();
    let mut entries = vec![tool_result(0, output_of_size(0, 2_500))];
    for n in 1..6 {
        entries.push(assistant(n, 20_000));
    }
    assert!(
        plan_elision(&entries, &HashSet::new(), &policy, tokens_of, 5, CachePricing::ANTHROPIC).is_none()
    );
    assert!(
        plan_elision(&entries, &HashSet::new(), &policy, tokens_of, 1_000_000, CachePricing::ANTHROPIC)
            .is_some()
    );
}

#[test]
fn elide_entry_stores_the_full_output() {
    let store = ArtifactStore::new(Arc::new(SimStorage::new()), "/artifacts");
    let output = output_of_size(7, 5_000);
    let entry = tool_result(3, output.clone());
    let (content, refs) = elide_entry(&entry, &ElisionPolicy::default(), &store, "t1").unwrap();
    assert_eq!(refs.len(), 1);
    assert_eq!(store.get("t1", &refs[0]).unwrap(), output.as_bytes());
    assert_eq!(content.tool_results[0].output, render_elided(&output, 800, &refs[0]));
    let short = tool_result(4, "short".into());
    let (content, refs) = elide_entry(&short, &ElisionPolicy::default(), &store, "t1").unwrap();
    assert!(refs.is_empty());
    assert_eq!(content, short.content);
}

/// Which elision policy the simulated session runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Strategy {
    Never,
    EveryRound,
    Batched,
}

/// What a simulated session cost and how often it changed the cached prompt.
struct SessionReport {
    cost: f64,
    rewrites: usize,
    first_changed: Vec<usize>,
}

/// A session of `rounds` calls: each call sends every entry so far; the provider caches the whole
/// prompt, so a call pays `read` for the prefix unchanged since the previous call and `write` for
/// the rest.
fn simulate(strategy: Strategy, rounds: usize) -> SessionReport {
    let pricing = CachePricing::ANTHROPIC;
    let policy = ElisionPolicy::default();
    let sizes = [12_000, 9_000, 3_000, 15_000, 5_000, 2_600];
    let mut entries = vec![assistant(0, 3_000)];
    let mut elided: HashSet<EntryId> = HashSet::new();
    let mut previous: Vec<(EntryId, bool)> = Vec::new();
    let mut report = SessionReport { cost: 0.0, rewrites: 0, first_changed: Vec::new() };
    let mut number = 1;
    for round in 0..rounds {
        let remaining = (rounds - round) as u64;
        let batch = match strategy {
            Strategy::Never => None,
            Strategy::EveryRound => {
                plan_elision(&entries, &elided, &policy, tokens_of, u64::MAX / 2, pricing)
            }
            Strategy::Batched => plan_elision(&entries, &elided, &policy, tokens_of, remaining, pricing),
        };
        if let Some(batch) = batch {
            report.rewrites += 1;
            report.first_changed.push(batch.first_changed_index);
            for entry in entries.iter_mut().filter(|e| batch.ids.contains(&e.id)) {
                let output = &entry.content.tool_results[0].output;
                let data_ref = ArtifactRef::for_bytes(output.as_bytes());
                let new_output = render_elided(output, policy.elide_keep_chars, &data_ref);
                entry.tokens = tokens_of(&new_output) + 4;
                entry.content.tool_results[0].output = new_output;
                elided.insert(entry.id);
            }
        }
        let prompt: Vec<(EntryId, bool)> = entries.iter().map(|e| (e.id, elided.contains(&e.id))).collect();
        let common = prompt.iter().zip(&previous).take_while(|(a, b)| a == b).count();
        for (index, entry) in entries.iter().enumerate() {
            let price = if index < common { pricing.read } else { pricing.write };
            report.cost += entry.tokens as f64 * price;
        }
        previous = prompt;
        entries.push(assistant(number, 150));
        entries.push(tool_result(number + 1, output_of_size(round, sizes[round % sizes.len()])));
        number += 2;
    }
    report
}

#[test]
fn batched_elision_rewrites_rarely_and_costs_least() {
    let rounds = 40;
    let never = simulate(Strategy::Never, rounds);
    let naive = simulate(Strategy::EveryRound, rounds);
    let batched = simulate(Strategy::Batched, rounds);

    // Naive: the first changed position moves forward every single round once elision starts.
    assert!(naive.rewrites >= rounds - ElisionPolicy::default().elide_after_rounds - 1, "{}", naive.rewrites);
    assert!(naive.first_changed.windows(2).all(|w| w[1] > w[0]), "{:?}", naive.first_changed);

    assert_eq!(never.rewrites, 0);
    assert!(batched.rewrites >= 1);
    assert!(batched.rewrites <= rounds / ElisionPolicy::default().elide_after_rounds, "{}", batched.rewrites);
    assert!(
        batched.cost < never.cost && batched.cost < naive.cost,
        "batched {:.0}, never {:.0}, every round {:.0}",
        batched.cost,
        never.cost,
        naive.cost
    );
    println!(
        "cost: batched {:.0} ({} rewrites), never {:.0}, every round {:.0} ({} rewrites)",
        batched.cost, batched.rewrites, never.cost, naive.cost, naive.rewrites
    );
}

#[test]
fn planning_among_indexed_outputs_as_the_history_grows_plans_what_a_full_walk_plans() {
    let policy = ElisionPolicy::default();
    let mut entries = Vec::new();
    let mut index = EntryIndex::default();
    let mut elided = HashSet::new();
    let mut batches = 0;
    for round in 0..60u64 {
        let size = if round % 3 == 0 { 20_000 } else { 400 };
        entries.push(tool_result(2 * round, output_of_size(round as usize, size)));
        entries.push(assistant(2 * round + 1, 10));
        let full = plan_elision(&entries, &elided, &policy, tokens_of, 10, CachePricing::ANTHROPIC);
        index.refresh(1, &entries, |entry| has_elidable_output(entry, &policy), &elided);
        let candidates =
            index.matches().iter().map(|indexed| (indexed.position, index.rounds_after(indexed)));
        let among = plan_elision_among(
            ElisionCandidates { entries: &entries, candidates },
            &elided,
            &policy,
            tokens_of,
            10,
            CachePricing::ANTHROPIC,
        );
        assert_eq!(
            among.as_ref().map(|batch| &batch.ids),
            full.as_ref().map(|batch| &batch.ids),
            "round {round}"
        );
        assert!(index.matches().len() <= entries.len() / 4 + 1, "only large outputs are indexed");
        if let Some(batch) = full {
            assert_eq!(among.unwrap().saved_tokens, batch.saved_tokens);
            elided.extend(batch.ids);
            batches += 1;
        }
    }
    assert!(batches > 0, "some batch was planned");
}

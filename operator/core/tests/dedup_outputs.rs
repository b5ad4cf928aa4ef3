//! Deduplication of repeated tool outputs, batch and incremental.
#![allow(clippy::unwrap_used)]

use strata_core::dedup::{DedupIndex, Duplicate, MIN_DEDUP_CHARS, find_duplicates, render_duplicate};
use strata_core::entry::{Content, Entry, EntryDraft, EntryId, EntryKind, RetentionClass, Role, ToolResult};

fn entry(number: u64, role: Role, outputs: &[&str]) -> Entry {
    EntryDraft {
        kind: if outputs.is_empty() { EntryKind::Message } else { EntryKind::ToolResult },
        role,
        content: Content {
            text: if outputs.is_empty() { "x".repeat(500) } else { String::new() },
            tool_calls: vec![],
            tool_results: outputs
                .iter()
                .enumerate()
                .map(|(i, o)| ToolResult {
                    call_id: format!("c{number}_{i}"),
                    name: None,
                    output: (*o).to_owned(),
                })
                .collect(),
        },
        retention: RetentionClass::Working,
        created_at_ms: 0,
        tokens: 1,
        artifact_refs: vec![],
    }
    .into_entry(number)
}

fn id(number: u64) -> EntryId {
    EntryId::new(EntryKind::ToolResult, number)
}

#[test]
fn later_identical_outputs_point_at_the_earliest() {
    let big = "a".repeat(MIN_DEDUP_CHARS);
    let other = "b".repeat(1000);
    let entries = vec![
        entry(1, Role::Tool, &[&big]),
        entry(2, Role::Assistant, &[]),
        entry(3, Role::Tool, &[&other]),
        entry(4, Role::Tool, &[&big]),
        entry(5, Role::Tool, &[&big]),
        entry(6, Role::Tool, &["ok"]),
        entry(7, Role::Tool, &["ok"]),
        entry(8, Role::Tool, &[&big, &other]),
        entry(9, Role::Tool, &[&other, &big]),
    ];
    assert_eq!(
        find_duplicates(&entries),
        vec![Duplicate { later: id(4), original: id(1) }, Duplicate { later: id(5), original: id(1) }]
    );
    assert_eq!(render_duplicate(id(1), &[]), "[identical to the output of tool_res_1]");
    let data_ref = strata_core::artifacts::ArtifactRef::for_bytes(b"out");
    assert_eq!(
        render_duplicate(id(1), std::slice::from_ref(&data_ref)),
        format!("[identical to the output of tool_res_1; data_ref {data_ref}]")
    );
}

#[test]
fn short_outputs_are_left_alone() {
    let short = "z".repeat(MIN_DEDUP_CHARS - 1);
    let entries = vec![entry(1, Role::Tool, &[&short]), entry(2, Role::Tool, &[&short])];
    assert!(find_duplicates(&entries).is_empty());
}

#[test]
fn incremental_index_matches_batch_result() {
    let outputs: Vec<String> = (0..30).map(|i| format!("{}{}", i % 7, "q".repeat(300))).collect();
    let entries: Vec<Entry> =
        outputs.iter().enumerate().map(|(n, o)| entry(n as u64, Role::Tool, &[o.as_str()])).collect();
    let mut index = DedupIndex::new();
    let mut incremental = Vec::new();
    for e in &entries {
        if let Some(original) = index.observe(e) {
            incremental.push(Duplicate { later: e.id, original });
        }
    }
    assert_eq!(incremental, find_duplicates(&entries));
    assert_eq!(index.duplicate_count(), 23);
    assert_eq!(index.original_of(&id(29)), Some(id(1)));
    assert_eq!(index.original_of(&id(1)), None);
    // Observing the same entry twice does not make it a duplicate of itself.
    assert_eq!(index.observe(&entries[0]), None);
}

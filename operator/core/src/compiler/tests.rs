#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use super::*;
use crate::entry::{Content, EntryDraft, RetentionClass, ToolResult};
use crate::prefix::{StablePrefixSources, ToolRegistry};
use crate::tokens::TokenizerKind;

fn counter() -> TokenCounter {
    TokenCounter::new(TokenizerKind::O200kBase).unwrap()
}

fn prefix(counter: &TokenCounter) -> StablePrefix {
    let sources = StablePrefixSources {
        system_prompt: "You are builder, the fleet's implementation agent.".into(),
        tools: vec![
            serde_json::json!({"name": "read_file", "description": "Read a file", "parameters": {"type": "object"}}),
        ],
        constants: BTreeMap::from([("project".to_string(), "rateright-growth".to_string())]),
    };
    StablePrefix::build(&sources, &mut ToolRegistry::new(), counter).unwrap()
}

fn entry(number: u64, kind: EntryKind, role: Role, text: &str, counter: &TokenCounter) -> Entry {
    let content = if kind == EntryKind::ToolResult {
        Content {
            text: String::new(),
            tool_calls: Vec::new(),
            tool_results: vec![ToolResult {
                call_id: format!("call_{number}"),
                name: Some("read_file".into()),
                output: text.into(),
            }],
        }
    } else {
        Content::text(text)
    };
    EntryDraft {
        kind,
        role,
        content,
        retention: RetentionClass::Working,
        created_at_ms: 1_000 + number,
        tokens: u64::from(counter.count(text)),
        artifact_refs: Vec::new(),
    }
    .into_entry(number)
}

/// A compiler with automatic breakpoints, synced with `entries` as generation 1.
fn synced(entries: &[Entry], counter: &TokenCounter) -> ContextCompiler {
    let mut compiler = ContextCompiler::new(prefix(counter), BreakpointPlacement::Auto);
    compiler.sync(1, entries, counter);
    compiler
}

fn history(counter: &TokenCounter, n: u64) -> Vec<Entry> {
    (1..=n)
        .map(|i| match i % 3 {
            1 => {
                entry(i, EntryKind::Message, Role::User, &format!("Please fix issue {i} in auth.py"), counter)
            }
            2 => entry(i, EntryKind::Message, Role::Assistant, &format!("Looking at step {i}."), counter),
            _ => entry(
                i,
                EntryKind::ToolResult,
                Role::Tool,
                &"def login(user):\n    return check(user)\n".repeat(i as usize),
                counter,
            ),
        })
        .collect()
}

#[test]
fn packet_has_tiers_in_order_with_visible_ids() {
    let counter = counter();
    let entries = history(&counter, 6);
    let mut compiler = ContextCompiler::new(prefix(&counter), BreakpointPlacement::Auto);
    assert_eq!(compiler.sync(1, &entries, &counter), SyncOutcome::Rebuilt(6));
    let packet = compiler.compile(&entries, 128_000, BudgetPolicy::default()).unwrap();
    assert_eq!(packet.entries.len(), 6);
    assert!(packet.text(0).starts_with("[msg_1] Please fix issue 1"));
    assert!(packet.text(2).starts_with("[tool_res_3] def login"));
    // An untreated entry holds no copy of its text: it is written from the journal entry.
    assert!(packet.entries.iter().all(|entry| entry.replaced_text.is_none()));
    assert!(packet.telemetry.starts_with("Status: Context: "), "{}", packet.telemetry);
    assert!(packet.telemetry.ends_with("| Level: Normal"), "{}", packet.telemetry);
    let expected = compiler.context_tokens() + render::TELEMETRY_TOKENS;
    assert_eq!(packet.status.tokens, expected);
    assert_eq!(packet.breakpoints, vec![Breakpoint::Tier1, Breakpoint::Entry { id: entries[5].id }]);
    // The status alone, as admission reads it, is the packet's.
    assert_eq!(compiler.status(128_000, BudgetPolicy::default()).unwrap(), packet.status);
}

#[test]
fn an_entry_text_is_found_by_its_id_when_the_journal_slice_is_not_aligned() {
    let counter = counter();
    let entries = history(&counter, 6);
    let compiler = synced(&entries, &counter);
    let shifted = &entries[2..];
    let packet = compiler.compile(shifted, 128_000, BudgetPolicy::default()).unwrap();
    assert_eq!(packet.text(4), journaled_text(&entries[4]));
    // An entry the slice lacks is sent as its tag alone, never as another entry's text.
    assert_eq!(packet.text(0), id_tag(entries[0].id));
    assert_eq!(packet.text(99), "");
}

#[test]
fn an_included_assistant_entry_sends_its_journaled_tool_calls_and_an_omitted_one_none() {
    let counter = counter();
    let mut entries = history(&counter, 3);
    let call = ToolCall { call_id: "call_3".into(), name: "read_file".into(), arguments_json: "{}".into() };
    entries[1].content.tool_calls.push(call.clone());
    let mut compiler = synced(&entries, &counter);
    let packet = compiler.compile(&entries, 128_000, BudgetPolicy::default()).unwrap();
    assert_eq!(packet.tool_calls(1), [call]);
    assert!(packet.tool_calls(0).is_empty() && packet.tool_calls(2).is_empty());
    compiler
        .apply_treatments(BTreeMap::from([(entries[1].id, Treatment::Omit)]), &entries, &counter)
        .unwrap();
    let packet = compiler.compile(&entries, 128_000, BudgetPolicy::default()).unwrap();
    assert!(packet.tool_calls(1).is_empty());
}

#[test]
fn appending_renders_only_new_entries_and_matches_a_rebuild() {
    let counter = counter();
    let entries = history(&counter, 30);
    let mut incremental = ContextCompiler::new(prefix(&counter), BreakpointPlacement::Auto);
    incremental.sync(1, &entries[..10], &counter);
    assert_eq!(incremental.sync(1, &entries[..25], &counter), SyncOutcome::Appended(15));
    assert_eq!(incremental.sync(1, &entries, &counter), SyncOutcome::Appended(5));
    assert_eq!(incremental.sync(1, &entries, &counter), SyncOutcome::Appended(0));

    let mut scratch = ContextCompiler::new(prefix(&counter), BreakpointPlacement::Auto);
    scratch.sync(1, &entries, &counter);
    assert_eq!(incremental.context_tokens(), scratch.context_tokens());
    let a = incremental.compile(&entries, 128_000, BudgetPolicy::default()).unwrap();
    let b = scratch.compile(&entries, 128_000, BudgetPolicy::default()).unwrap();
    assert_eq!(a.entries, b.entries);
    assert!((0..entries.len()).all(|index| a.text(index) == b.text(index)));
    assert_eq!(a.telemetry, b.telemetry);
}

#[test]
fn a_new_generation_rebuilds() {
    let counter = counter();
    let entries = history(&counter, 9);
    let mut compiler = synced(&entries, &counter);
    let mut compacted =
        vec![entry(10, EntryKind::Summary, Role::User, "Summary: issues 1-9 fixed.", &counter)];
    compacted.extend_from_slice(&entries[7..]);
    assert_eq!(compiler.sync(2, &compacted, &counter), SyncOutcome::Rebuilt(3));
    let packet = compiler.compile(&compacted, 128_000, BudgetPolicy::default()).unwrap();
    assert_eq!(packet.text(0), "[summary_10] Summary: issues 1-9 fixed.");
    assert_eq!(
        packet.breakpoints,
        vec![
            Breakpoint::Tier1,
            Breakpoint::Entry { id: compacted[0].id },
            Breakpoint::Entry { id: compacted[2].id }
        ]
    );
    // Same generation, but the history no longer extends what was rendered: rebuild too.
    let rewritten = history(&counter, 2);
    assert_eq!(compiler.sync(2, &rewritten, &counter), SyncOutcome::Rebuilt(2));
}

#[test]
fn treatments_change_only_their_entries() {
    let counter = counter();
    let entries = history(&counter, 9);
    let mut compiler = synced(&entries, &counter);
    let before = compiler.context_tokens();
    let big = entries[8].id; // tool_res_9, the largest
    let batch = BTreeMap::from([
        (
            big,
            Treatment::Replace {
                text: "def login(user): … [elided]".into(),
                reason: InclusionReason::Elided,
            },
        ),
        (entries[0].id, Treatment::Omit),
    ]);
    compiler.apply_treatments(batch, &entries, &counter).unwrap();
    let packet = compiler.compile(&entries, 128_000, BudgetPolicy::default()).unwrap();
    assert!(compiler.context_tokens() < before);
    assert!(!packet.entries[0].included);
    assert_eq!(packet.entries[8].reason, InclusionReason::Elided);
    assert_eq!(packet.text(8), "[tool_res_9] def login(user): … [elided]");
    assert_eq!(packet.text(0), "[msg_1]");
    assert_eq!(packet.text(1), journaled_text(&entries[1]));
    assert_eq!(
        packet.entries[1],
        ContextCompiler::new(prefix(&counter), BreakpointPlacement::Auto).tap_sync(&entries, &counter)[1]
    );
    // Treatments survive later appends and rebuilds of the same generation.
    let more = history(&counter, 12);
    compiler.sync(1, &more, &counter);
    assert_eq!(
        compiler.compile(&more, 128_000, BudgetPolicy::default()).unwrap().entries[8].reason,
        InclusionReason::Elided
    );
    let unknown = BTreeMap::from([(EntryId::new(EntryKind::Message, 999), Treatment::Omit)]);
    assert!(matches!(
        compiler.apply_treatments(unknown, &more, &counter),
        Err(CompileError::UnknownEntry(_))
    ));
}

/// The section totals a walk over the packet's included entries gives.
fn walked_totals(packet: &Packet<'_>) -> Tier2Tokens {
    let mut totals = Tier2Tokens::default();
    for entry in packet.entries.iter().filter(|entry| entry.included) {
        match entry.id.kind() {
            EntryKind::Summary => totals.memory += entry.tokens,
            EntryKind::ToolResult => totals.tool_results += entry.tokens,
            _ => totals.history += entry.tokens,
        }
    }
    totals
}

#[test]
fn section_totals_follow_appends_treatments_and_rebuilds() {
    let counter = counter();
    let entries = history(&counter, 9);
    let mut compiler = synced(&entries, &counter);
    let packet = compiler.compile(&entries, 128_000, BudgetPolicy::default()).unwrap();
    assert!(packet.tier2.tool_results > 0 && packet.tier2.history > 0);
    assert_eq!(packet.tier2, walked_totals(&packet));
    let batch = BTreeMap::from([
        (entries[8].id, Treatment::Replace { text: "[elided]".into(), reason: InclusionReason::Elided }),
        (entries[0].id, Treatment::Omit),
    ]);
    compiler.apply_treatments(batch, &entries, &counter).unwrap();
    let packet = compiler.compile(&entries, 128_000, BudgetPolicy::default()).unwrap();
    assert_eq!(packet.tier2, walked_totals(&packet));
    let more = history(&counter, 14);
    compiler.sync(1, &more, &counter);
    let packet = compiler.compile(&more, 128_000, BudgetPolicy::default()).unwrap();
    assert_eq!(packet.tier2, walked_totals(&packet));
    compiler.sync(2, &entries[..4], &counter);
    let packet = compiler.compile(&entries[..4], 128_000, BudgetPolicy::default()).unwrap();
    assert_eq!(packet.tier2, walked_totals(&packet));
    assert_eq!(packet.tier2.total() + compiler.prefix_tokens, compiler.context_tokens());
}

impl ContextCompiler {
    fn tap_sync(mut self, entries: &[Entry], counter: &TokenCounter) -> Vec<RenderedEntry> {
        self.sync(1, entries, counter);
        self.rendered
    }
}

#[test]
fn decisions_cover_every_section_and_entry() {
    let counter = counter();
    let entries = history(&counter, 4);
    let mut compiler = ContextCompiler::new(prefix(&counter), BreakpointPlacement::Off);
    compiler.sync(1, &entries, &counter);
    let decisions = compiler.decisions(&entries, "workspace:alpha");
    assert!(decisions.iter().all(|d| d.privacy_scope == "workspace:alpha" && !d.source.is_empty()));
    let tier1 = decisions.iter().filter(|d| d.tier == 1).count();
    assert_eq!(tier1, compiler.prefix().manifest().sections.len());
    assert_eq!(decisions.iter().filter(|d| d.tier == 2).count(), 4);
    assert_eq!(decisions.last().unwrap().reason, InclusionReason::Telemetry);
    assert!(decisions.iter().filter(|d| d.tier < 3).all(|d| d.source_hash.len() == 64));
    assert!(compiler.compile(&entries, 128_000, BudgetPolicy::default()).unwrap().breakpoints.is_empty());
}

#[test]
fn levels_follow_the_budget() {
    let counter = counter();
    let entries = history(&counter, 30);
    let compiler = synced(&entries, &counter);
    let used = compiler.context_tokens() + render::TELEMETRY_TOKENS;
    let policy = BudgetPolicy {
        reserved_completion_tokens: 0,
        protocol_overhead_tokens: 0,
        safety_margin_tokens: 0,
        ..BudgetPolicy::default()
    };
    let limit = used * 100 / 91; // about 91% used: HighRisk
    let packet = compiler.compile(&entries, limit, policy).unwrap();
    assert!(packet.telemetry.ends_with("| Level: HighRisk"), "{}", packet.telemetry);
}

#[test]
fn a_lower_budget_removes_ephemeral_then_working_entries_and_never_critical() {
    let counter = counter();
    let mut entries = history(&counter, 12);
    entries[0].retention = crate::entry::RetentionClass::Critical;
    entries[4].retention = crate::entry::RetentionClass::Ephemeral;
    let compiler = synced(&entries, &counter);
    let policy = BudgetPolicy {
        reserved_completion_tokens: 0,
        protocol_overhead_tokens: 0,
        safety_margin_tokens: 0,
        ..BudgetPolicy::default()
    };
    let used = compiler.context_tokens() + render::TELEMETRY_TOKENS;
    let outcomes = compiler.simulate_lower_budgets(used, policy, &[100, 80, 1]);
    assert_eq!(outcomes[0].tokens_over, 0);
    assert!(outcomes[0].removed.is_empty() && outcomes[0].fits);
    let eighty = &outcomes[1];
    assert_eq!(eighty.removed[0].id, entries[4].id, "Ephemeral entries go first");
    assert_eq!(eighty.removed[0].action, "expire");
    assert!(eighty.removed[1..].iter().all(|r| r.action == "compact"));
    assert!(eighty.fits);
    assert!(eighty.removed.iter().map(|r| r.tokens).sum::<u64>() >= eighty.tokens_over);
    let tiny = &outcomes[2];
    assert!(!tiny.fits, "Tier 1 and the Critical entry cannot leave");
    assert!(tiny.removed.iter().all(|r| r.id != entries[0].id));
}

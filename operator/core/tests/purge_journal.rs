//! purge(ids, summary) through a real journal: the summary takes the first purged entry's place,
//! the raw entries reopen byte-exact from the archive, IDs stay unique, and bad requests change nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use strata_core::artifacts::ArtifactStore;
use strata_core::economics::CachePricing;
use strata_core::entry::{Content, Entry, EntryDraft, EntryId, EntryKind, RetentionClass, Role};
use strata_core::journal::{Journal, JournalOptions, StdStorage};
use strata_core::purge::{PurgeError, PurgeRequest, purge};
use strata_core::tokens::{TokenCounter, TokenizerKind};

fn draft(kind: EntryKind, role: Role, text: &str, counter: &TokenCounter) -> EntryDraft {
    EntryDraft {
        kind,
        role,
        tokens: u64::from(counter.count(text)),
        content: Content::text(text),
        retention: RetentionClass::Working,
        created_at_ms: 1,
        artifact_refs: Vec::new(),
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    journal: Journal,
    store: ArtifactStore,
    counter: TokenCounter,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let storage = Arc::new(StdStorage);
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let (mut journal, _) = Journal::open(storage.clone(), &data, JournalOptions::new("test", 1)).unwrap();
    let store = ArtifactStore::new(storage, data.join("artifacts"));
    let counter = TokenCounter::new(TokenizerKind::O200kBase).unwrap();
    journal
        .append(draft(EntryKind::Message, Role::User, "Find the auth errors in the logs.", &counter))
        .unwrap();
    let noisy = "2026-11-29 ERROR redis timeout in auth.retry\n".repeat(200);
    journal.append(draft(EntryKind::ToolResult, Role::Tool, &noisy, &counter)).unwrap();
    journal.append(draft(EntryKind::Message, Role::Assistant, "Three Redis timeouts.", &counter)).unwrap();
    journal.append(draft(EntryKind::Message, Role::User, "Now fix auth.py.", &counter)).unwrap();
    Fixture { _dir: dir, journal, store, counter }
}

fn ids(entries: &[Entry]) -> Vec<String> {
    entries.iter().map(|e| e.id.to_string()).collect()
}

#[test]
fn purge_replaces_entries_with_a_summary_in_place() {
    let mut f = fixture();
    let before: Vec<Entry> = f.journal.entries().to_vec();
    let tokens_before = f.journal.total_tokens();
    let request = PurgeRequest {
        ids: vec![before[1].id, before[2].id],
        summary: "Sub-agent found 3 timeout errors related to Redis.".into(),
    };
    let outcome =
        purge(&mut f.journal, &f.store, "rateright", &request, &f.counter, 5, 20, CachePricing::ANTHROPIC)
            .unwrap();

    let after = f.journal.entries();
    assert_eq!(after.len(), 3);
    assert_eq!(after[0].id, before[0].id);
    assert_eq!(after[1].id, outcome.summary_id);
    assert_eq!(after[1].id.kind(), EntryKind::Summary);
    assert_eq!(after[2].id, before[3].id);
    assert!(after[1].content.text.contains("Sub-agent found 3 timeout errors"));
    assert!(after[1].content.text.contains(&outcome.archive.to_string()));
    assert!(
        outcome.summary_id.number() > before.iter().map(|e| e.id.number()).max().unwrap(),
        "IDs are never reused"
    );
    assert_eq!(outcome.removed, vec![before[1].id, before[2].id]);
    assert!(f.journal.total_tokens() < tokens_before);
    assert_eq!(outcome.switch.to_generation, outcome.switch.from_generation + 1);

    // The raw entries reopen byte-exact.
    let archived: Vec<Entry> =
        serde_json::from_slice(&f.store.get("rateright", &outcome.archive).unwrap()).unwrap();
    assert_eq!(archived, before[1..3].to_vec());

    // The economics: a large saving close to the tail pays at once.
    assert_eq!(outcome.saved_tokens, outcome.economics.saved_tokens_per_call);
    assert!(outcome.economics.pays(), "{:?}", outcome.economics);
}

#[test]
fn bad_requests_change_nothing() {
    let mut f = fixture();
    let before = ids(f.journal.entries());
    let generation = f.journal.generation();
    let cases = [
        (PurgeRequest { ids: vec![], summary: String::new() }, "at least one entry ID"),
        (
            PurgeRequest { ids: vec![EntryId::new(EntryKind::Message, 99)], summary: String::new() },
            "msg_99 is not in the current context",
        ),
        (
            PurgeRequest {
                ids: vec![f.journal.entries()[0].id, f.journal.entries()[0].id],
                summary: String::new(),
            },
            "listed twice",
        ),
    ];
    for (request, message) in cases {
        let err = purge(
            &mut f.journal,
            &f.store,
            "rateright",
            &request,
            &f.counter,
            5,
            20,
            CachePricing::ANTHROPIC,
        )
        .unwrap_err();
        assert!(err.to_string().contains(message), "{err}");
        assert!(!matches!(err, PurgeError::Journal(_)));
        assert_eq!(ids(f.journal.entries()), before);
        assert_eq!(f.journal.generation(), generation);
    }
}

#[test]
fn purging_a_small_entry_deep_in_history_reports_that_it_does_not_pay() {
    let mut f = fixture();
    let counter = TokenCounter::new(TokenizerKind::O200kBase).unwrap();
    for i in 0..40 {
        let text = format!("Working on step {i}: {}", "details of the change. ".repeat(40));
        f.journal.append(draft(EntryKind::Message, Role::Assistant, &text, &counter)).unwrap();
    }
    let first = f.journal.entries()[0].id;
    let request = PurgeRequest { ids: vec![first], summary: "The task was to find auth errors.".into() };
    let outcome =
        purge(&mut f.journal, &f.store, "rateright", &request, &f.counter, 5, 3, CachePricing::ANTHROPIC)
            .unwrap();
    assert!(!outcome.economics.pays(), "{:?}", outcome.economics);
    assert!(outcome.economics.rewritten_tokens > 10_000);
}

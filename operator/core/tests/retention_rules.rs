//! Retention rules: policy-JSON compatibility, first-match classification, and batched expiry.
#![allow(clippy::unwrap_used)]

use std::collections::HashSet;

use strata_core::economics::CachePricing;
use strata_core::entry::{Content, Entry, EntryDraft, EntryId, EntryKind, RetentionClass, Role};
use strata_core::history_index::EntryIndex;
use strata_core::retention::{
    Classifier, ExpiryCandidates, ExpiryPolicy, RetentionRule, RetentionRuleError, plan_expiry,
};

const POLICY_JSON: &str = r#"[
  {"name": "heartbeats", "class": "Ephemeral", "ttlSeconds": 3600,
   "match": {"contentRegex": "(?i)^\\s*(heartbeat|HEARTBEAT_OK|status check|ping)\\b"}},
  {"name": "deploy-results", "class": "Critical", "match": {"roles": ["tool"], "toolNames": ["deploy"]}},
  {"name": "docs", "class": "Reference", "match": {"toolNames": ["read_file", "fetch"]}}
]"#;

fn classifier() -> Classifier {
    Classifier::new(serde_json::from_str(POLICY_JSON).unwrap()).unwrap()
}

#[test]
fn policy_json_deserializes_and_round_trips() {
    let rules: Vec<RetentionRule> = serde_json::from_str(POLICY_JSON).unwrap();
    assert_eq!(rules[0].class, RetentionClass::Ephemeral);
    assert_eq!(rules[0].ttl_seconds, Some(3600));
    assert_eq!(rules[1].matcher.roles, Some(vec![Role::Tool]));
    let again: Vec<RetentionRule> = serde_json::from_str(&serde_json::to_string(&rules).unwrap()).unwrap();
    assert_eq!(again, rules);
    let json = serde_json::to_value(&rules[0]).unwrap();
    assert_eq!(json["class"], "Ephemeral");
    assert!(json["match"]["contentRegex"].is_string());
    let bad = r#"{"name": "x", "class": "ephemeral", "match": {}}"#;
    assert!(
        serde_json::from_str::<RetentionRule>(bad)
            .unwrap_err()
            .to_string()
            .contains("unknown retention class")
    );
}

#[test]
fn first_matching_rule_wins_and_default_is_working() {
    let c = classifier();
    assert_eq!(c.classify(Role::User, "HEARTBEAT_OK", None), (RetentionClass::Ephemeral, Some(3600)));
    assert_eq!(
        c.classify(Role::Tool, "  ping from cron", Some("deploy")),
        (RetentionClass::Ephemeral, Some(3600))
    );
    assert_eq!(c.classify(Role::Tool, "rolled out v2", Some("deploy")), (RetentionClass::Critical, None));
    assert_eq!(c.classify(Role::Assistant, "rolled out v2", Some("deploy")), (RetentionClass::Working, None));
    assert_eq!(c.classify(Role::Tool, "fn main() {}", Some("read_file")), (RetentionClass::Reference, None));
    assert_eq!(c.classify(Role::Tool, "fn main() {}", None), (RetentionClass::Working, None));
    assert_eq!(c.classify(Role::User, "please ping me later", None), (RetentionClass::Working, None));
}

#[test]
fn bad_rules_are_rejected_naming_the_rule() {
    let rule = |name: &str, class, ttl, regex: Option<&str>| RetentionRule {
        name: name.into(),
        class,
        matcher: strata_core::retention::RetentionMatch {
            content_regex: regex.map(Into::into),
            ..Default::default()
        },
        ttl_seconds: ttl,
    };
    let error = Classifier::new(vec![
        rule("ok", RetentionClass::Working, None, None),
        rule("broken", RetentionClass::Working, None, Some("(unclosed")),
    ])
    .unwrap_err();
    assert!(matches!(error, RetentionRuleError::BadRegex { index: 1, .. }));
    assert!(error.to_string().contains("\"broken\"") && error.to_string().contains("(unclosed"), "{error}");
    for (bad, needle) in [
        (vec![rule("e", RetentionClass::Ephemeral, None, None)], "needs ttlSeconds"),
        (vec![rule("c", RetentionClass::Critical, Some(5), None)], "never expire"),
        (vec![rule("z", RetentionClass::Ephemeral, Some(0), None)], "at least 1"),
        (
            vec![
                rule("d", RetentionClass::Working, None, None),
                rule("d", RetentionClass::Reference, None, None),
            ],
            "duplicate",
        ),
    ] {
        let error = Classifier::new(bad).unwrap_err().to_string();
        assert!(error.contains(needle), "{error}");
    }
}

fn entry(number: u64, class: RetentionClass, created_at_ms: u64, tokens: u64) -> Entry {
    EntryDraft {
        kind: EntryKind::Message,
        role: Role::User,
        content: Content::text(format!("entry {number}")),
        retention: class,
        created_at_ms,
        tokens,
        artifact_refs: vec![],
    }
    .into_entry(number)
}

const HOUR_MS: u64 = 3_600_000;

/// A heartbeat at t=0 followed by a long working history.
fn session(heartbeat_tokens: u64) -> Vec<Entry> {
    let mut entries = vec![entry(0, RetentionClass::Ephemeral, 0, heartbeat_tokens)];
    entries.extend((1..=20).map(|n| entry(n, RetentionClass::Working, n * 1000, 5_000)));
    entries
}

fn ttl_of(entry: &Entry) -> Option<u32> {
    classifier()
        .classify(entry.role, "heartbeat", None)
        .1
        .filter(|_| entry.retention != RetentionClass::Working)
}

#[test]
fn expiry_waits_for_economics_until_overdue() {
    let entries = session(50);
    let plan = |now| {
        plan_expiry(
            ExpiryCandidates::all(&entries),
            now,
            &HashSet::new(),
            ttl_of,
            &ExpiryPolicy::default(),
            20,
            CachePricing::ANTHROPIC,
        )
    };
    assert!(plan(HOUR_MS - 1).is_none(), "not expired yet");
    assert!(plan(HOUR_MS).is_none(), "50 tokens do not pay for rewriting 100k");
    let forced = plan(2 * HOUR_MS).unwrap();
    assert!(forced.forced_by_overdue && !forced.economics.pays());
    assert_eq!(forced.ids, vec![EntryId::new(EntryKind::Message, 0)]);
}

#[test]
fn expiry_batch_fires_when_it_pays_and_skips_removed_and_critical() {
    let mut entries = session(50);
    entries.push(entry(21, RetentionClass::Ephemeral, 0, 40_000));
    entries.push(entry(22, RetentionClass::Critical, 0, 40_000));
    let always = |_: &Entry| Some(60);
    let batch = plan_expiry(
        ExpiryCandidates::all(&entries),
        HOUR_MS,
        &HashSet::new(),
        always,
        &ExpiryPolicy { overdue_factor: 1000, ..Default::default() },
        40,
        CachePricing::ANTHROPIC,
    )
    .unwrap();
    assert!(!batch.forced_by_overdue && batch.economics.pays());
    assert_eq!(batch.ids, vec![EntryId::new(EntryKind::Message, 0), EntryId::new(EntryKind::Message, 21)]);
    assert_eq!(batch.saved_tokens, 40_050);
    assert_eq!(batch.first_changed_index, 0);
    let removed: HashSet<EntryId> = batch.ids.iter().copied().collect();
    assert!(
        plan_expiry(
            ExpiryCandidates::all(&entries),
            HOUR_MS,
            &removed,
            always,
            &ExpiryPolicy::default(),
            20,
            CachePricing::ANTHROPIC
        )
        .is_none(),
        "critical entries never expire and removed ones are not planned again"
    );
}

#[test]
fn planning_among_the_indexed_entries_plans_what_a_full_walk_plans() {
    let mut entries = session(50);
    entries.push(entry(21, RetentionClass::Ephemeral, 0, 40_000));
    entries.push(entry(22, RetentionClass::Critical, 0, 40_000));
    entries.extend((23..200).map(|n| entry(n, RetentionClass::Working, n * 1000, 500)));
    let always = |_: &Entry| Some(60);
    let policy = ExpiryPolicy::default();
    let full = plan_expiry(
        ExpiryCandidates::all(&entries),
        HOUR_MS,
        &HashSet::new(),
        always,
        &policy,
        40,
        CachePricing::ANTHROPIC,
    )
    .unwrap();
    let mut index = EntryIndex::default();
    let ephemeral = |entry: &Entry| entry.retention == RetentionClass::Ephemeral;
    index.refresh(7, &entries, ephemeral, &HashSet::new());
    let positions: Vec<usize> = index.matches().iter().map(|indexed| indexed.position).collect();
    assert_eq!(positions, [0, 21]);
    let candidates = ExpiryCandidates { entries: &entries, positions };
    let among =
        plan_expiry(candidates, HOUR_MS, &HashSet::new(), always, &policy, 40, CachePricing::ANTHROPIC)
            .unwrap();
    assert_eq!(among.ids, full.ids);
    assert_eq!(among.saved_tokens, full.saved_tokens);
    assert_eq!(among.first_changed_index, full.first_changed_index);
    assert_eq!(among.forced_by_overdue, full.forced_by_overdue);
}

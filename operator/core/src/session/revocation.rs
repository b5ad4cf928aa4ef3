//! Derived context under the cache scope (spec §17.10), inside the engine: summaries are stamped
//! with the scope they were made under; before the window is compiled each one is validated
//! against the current scope; when the scope changed (a cache-epoch bump) or a summary fails
//! validation, the revocation purge takes it out of the live context and deletes from the volume
//! everything derived under the old scope (superseded generations, archives, compaction records),
//! and records what it did in the `derived.json` state file (decisions in [`crate::derived`]).

use std::collections::{BTreeMap, HashSet};

use super::engine::{EngineError, SessionEngine};
use super::settings::SessionSettings;
use crate::derived::{DerivationScope, DerivedKind, DerivedLedger, PurgedKind, RevocationPurge};
use crate::entry::{Content, Entry, EntryDraft, EntryKind, ToolResult};
use crate::journal::BaselineEntry;
use crate::lifecycle::{KeepLimits, VolumeRetention};

/// The state file holding the derived-artifact stamps and the revocation purges.
pub(super) const DERIVED_FILE: &str = "derived.json";

/// Nothing is kept: the retention a revocation purge sweeps under.
const KEEP_NOTHING: KeepLimits = KeepLimits { max_age_seconds: 0, max_bytes: 0 };

/// The engine's view of derived context: the ledger, and the generation last validated.
#[derive(Debug, Default)]
pub(super) struct DerivedState {
    pub(super) ledger: DerivedLedger,
    checked: Option<(u64, DerivationScope)>,
}

impl DerivedState {
    pub(super) fn new(ledger: DerivedLedger) -> Self {
        Self { ledger, checked: None }
    }
}

/// The derived kind of a journal entry, if it is derived context: a summary, or a delegation's
/// result, which the parent only ever sees as a digest.
fn derived_kind(entry: &Entry, settings: &SessionSettings) -> Option<DerivedKind> {
    match entry.id.kind() {
        EntryKind::Summary => Some(DerivedKind::Summary),
        EntryKind::ToolResult
            if entry.content.tool_results.iter().any(|result| {
                result.name.as_deref().is_some_and(|name| settings.delegation.is_delegation(name))
            }) =>
        {
            Some(DerivedKind::Digest)
        }
        EntryKind::Message | EntryKind::ToolCall | EntryKind::ToolResult => None,
    }
}

/// What a revoked summary says in its place.
fn revoked_text(id: &str, made_under: Option<&DerivationScope>, current: &DerivationScope) -> String {
    let under = made_under.map_or_else(|| "an earlier cache scope".to_owned(), ToString::to_string);
    format!(
        "[{id} revoked: it was derived under {under}, and the agent now runs under {current} \
         (cache revocation); the derived text and what it was derived from were purged and are not reused]"
    )
}

impl SessionSettings {
    /// The cache scope derived context is made under.
    pub fn derivation_scope(&self) -> DerivationScope {
        DerivationScope {
            tenant: self.tenant.clone(),
            privacy_scope: self.compaction.privacy_scope.clone(),
            epoch: self.cache_epoch,
        }
    }
}

impl SessionEngine {
    /// The derived-artifact stamps and the last revocation purges.
    pub fn derived_ledger(&self) -> &DerivedLedger {
        &self.derived.ledger
    }

    /// Validates the derived entries of the live window against the current scope before they
    /// enter a prompt: stamps the ones made since the last check (under the current scope), and
    /// runs the revocation purge when the scope changed or a stamped entry was made under another
    /// scope. Cheap when neither the generation nor the scope changed since the last check.
    pub(super) fn validate_derived(
        &mut self,
        settings: &SessionSettings,
        now_ms: u64,
    ) -> Result<Option<RevocationPurge>, EngineError> {
        let current = settings.derivation_scope();
        let generation = self.journal.generation();
        if self
            .derived
            .checked
            .as_ref()
            .is_some_and(|(checked, scope)| *checked == generation && *scope == current)
        {
            return Ok(None);
        }
        let scope_changed = self.derived.ledger.scope_changed(&current);
        let previous = self.derived.ledger.scope.clone();
        let mut stale: Vec<(String, Option<DerivationScope>)> = Vec::new();
        let mut changed = self.derived.ledger.scope.is_none();
        for entry in self.journal.entries() {
            let id = entry.id.to_string();
            // Derived: a summary, or any entry stamped in the ledger (another derived kind).
            let stamp = self.derived.ledger.items.get(&id);
            if stamp.is_some_and(|item| item.revoked) {
                continue;
            }
            let stamped = stamp.map(|item| item.kind);
            let Some(kind) = stamped.or_else(|| derived_kind(entry, settings)) else { continue };
            if stamped.is_none() {
                // Made since the last check: under the scope the volume was last served under.
                if scope_changed {
                    stale.push((id, previous.clone()));
                } else {
                    changed |= self.derived.ledger.record(kind, &id, &current, entry.created_at_ms);
                }
            } else if let Err(refused) = self.derived.ledger.validate(&id, kind, &current) {
                stale.push((id, refused.made_under));
            }
        }
        let purge = if scope_changed || !stale.is_empty() {
            Some(self.revoke(settings, &current, previous.filter(|_| scope_changed), stale, now_ms)?)
        } else {
            if changed {
                self.derived.ledger.scope = Some(current.clone());
                self.forget_gone_stamps();
                self.state.write(DERIVED_FILE, &self.derived.ledger)?;
            }
            None
        };
        self.derived.checked = Some((self.journal.generation(), current));
        Ok(purge)
    }

    /// Drops stamps of entries no longer in the live generation.
    fn forget_gone_stamps(&mut self) {
        let live: HashSet<String> = self.journal.entries().iter().map(|entry| entry.id.to_string()).collect();
        self.derived.ledger.retain(|id| live.contains(id));
    }

    /// The revocation purge: rewrites each stale derived entry as a stub without its archive (a
    /// generation switch), then sweeps the volume keeping nothing that the new live generation does
    /// not reference, and records the purge.
    fn revoke(
        &mut self,
        settings: &SessionSettings,
        current: &DerivationScope,
        from: Option<DerivationScope>,
        stale: Vec<(String, Option<DerivationScope>)>,
        now_ms: u64,
    ) -> Result<RevocationPurge, EngineError> {
        let mut revoked: BTreeMap<String, Vec<String>> = BTreeMap::new();
        if !stale.is_empty() {
            let made_under: BTreeMap<&str, Option<&DerivationScope>> =
                stale.iter().map(|(id, scope)| (id.as_str(), scope.as_ref())).collect();
            let snapshot = self.journal.begin_compaction()?;
            let mut baseline = Vec::with_capacity(snapshot.entries.len());
            for entry in &snapshot.entries {
                let id = entry.id.to_string();
                let Some(under) = made_under.get(id.as_str()) else {
                    baseline.push(BaselineEntry::Keep(entry.id));
                    continue;
                };
                let text = revoked_text(&id, *under, current);
                // A tool result keeps answering its calls, with the stub as its output.
                let content = if entry.content.tool_results.is_empty() {
                    Content::text(text.clone())
                } else {
                    Content {
                        tool_results: entry
                            .content
                            .tool_results
                            .iter()
                            .map(|result| ToolResult { output: text.clone(), ..result.clone() })
                            .collect(),
                        ..Content::default()
                    }
                };
                let draft = EntryDraft {
                    kind: entry.id.kind(),
                    role: entry.role,
                    tokens: u64::from(self.counter().count(&text)),
                    content,
                    retention: entry.retention,
                    created_at_ms: entry.created_at_ms,
                    artifact_refs: Vec::new(),
                };
                baseline.push(BaselineEntry::Rewrite { id: entry.id, draft });
                let kind = self
                    .derived
                    .ledger
                    .items
                    .get(&id)
                    .map(|item| item.kind)
                    .or_else(|| derived_kind(entry, settings));
                revoked.entry(kind.map_or("derived", DerivedKind::label).to_owned()).or_default().push(id);
            }
            self.journal.commit_generation(&snapshot, baseline, now_ms)?;
            self.after_rewrite()?;
        }
        let keep_nothing = VolumeRetention {
            artifacts: KEEP_NOTHING,
            generations: KEEP_NOTHING,
            compaction_records: KEEP_NOTHING,
            sweep_interval_seconds: settings.volume.sweep_interval_seconds,
        };
        let report = self.sweep_volume(&keep_nothing, now_ms)?;
        let purged = report
            .kinds
            .iter()
            .map(|kind| {
                (
                    kind.kind.label().to_owned(),
                    PurgedKind { files: kind.files_swept, bytes: kind.bytes_swept },
                )
            })
            .collect();
        // The stubs are derived from nothing: they are never validated or revoked again.
        for ids in revoked.values() {
            for id in ids {
                let kind = self.derived.ledger.items.get(id).map_or(DerivedKind::Summary, |item| item.kind);
                self.derived.ledger.record_revoked(kind, id, current, now_ms);
            }
        }
        self.forget_gone_stamps();
        let purge = RevocationPurge { at_ms: now_ms, from, to: current.clone(), revoked, purged };
        self.derived.ledger.push_purge(purge.clone());
        self.state.write(DERIVED_FILE, &self.derived.ledger)?;
        let files: u64 = purge.purged.values().map(|kind| kind.files).sum();
        let entries: usize = purge.revoked.values().map(Vec::len).sum();
        self.warn(format!(
            "revocation purge: derived context of another cache scope is not reused (now {current}); \
             {entries} derived entries replaced by stubs, {files} files deleted from the volume"
        ));
        Ok(purge)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use serde_json::Map;

    use super::*;
    use crate::budget::OperationId;
    use crate::entry::{Role, ToolCall};
    use crate::session::{Api, ChatRequest, Turn, TurnOutcome, TurnRequest};

    /// A user's ask, the delegating call and the delegate's result.
    fn delegation(ask: &str, call: ToolCall, result: ToolResult) -> Vec<Turn> {
        vec![
            Turn { role: Role::User, content: Content::text(ask) },
            Turn { role: Role::Assistant, content: Content { tool_calls: vec![call], ..Content::default() } },
            Turn { role: Role::Tool, content: Content { tool_results: vec![result], ..Content::default() } },
        ]
    }

    fn turn(engine: &mut SessionEngine, settings: &SessionSettings, turns: Vec<Turn>, now_ms: u64) {
        let chat = ChatRequest::plain(Api::OpenAi, "", turns);
        let request = TurnRequest {
            request: &chat,
            transparent: false,
            request_key: None,
            operation_id: OperationId::from_request("test", &now_ms.to_le_bytes()),
            head: Map::new(),
            now_ms,
        };
        assert!(matches!(engine.begin_turn(settings, request).unwrap(), TurnOutcome::Admitted(_)));
    }

    #[test]
    fn a_stamped_entry_of_another_scope_is_revoked_and_a_tool_result_keeps_answering_its_call() {
        let settings = SessionSettings::defaults(Api::OpenAi, 128_000);
        let mut engine = SessionEngine::in_memory(&settings, 0).unwrap();
        let call =
            ToolCall { call_id: "call_1".into(), name: "delegate".into(), arguments_json: "{}".into() };
        let result =
            ToolResult { call_id: "call_1".into(), name: None, output: "the delegate's digest".into() };
        turn(&mut engine, &settings, delegation("delegate the review", call, result), 1);
        assert_eq!(engine.derived_ledger().scope, Some(settings.derivation_scope()));
        let digest =
            engine.journal().entries().iter().find(|e| e.id.kind() == EntryKind::ToolResult).unwrap().id;
        let old = DerivationScope { epoch: 7, ..settings.derivation_scope() };
        engine.derived.ledger.record(DerivedKind::Summary, &digest.to_string(), &old, 1);
        engine.derived.checked = None;

        let purge = engine.validate_derived(&settings, 2).unwrap().expect("the stale entry is revoked");
        assert_eq!(purge.from, None, "the scope itself did not change");
        assert_eq!(purge.revoked["summary"], vec![digest.to_string()]);
        let rewritten = engine.journal().entries().iter().find(|e| e.id == digest).unwrap();
        let results = &rewritten.content.tool_results;
        assert_eq!(results.len(), 1);
        assert_eq!(results[0].call_id, "call_1", "the call stays answered");
        assert!(
            results[0].output.contains("revoked") && !results[0].output.contains("digest"),
            "{results:?}"
        );
        assert!(engine.validate_derived(&settings, 3).unwrap().is_none(), "the stub validates");

        let next_epoch = SessionSettings { cache_epoch: 1, ..settings.clone() };
        let purge = engine.validate_derived(&next_epoch, 4).unwrap().expect("an epoch change purges");
        assert_eq!(purge.from.map(|scope| scope.epoch), Some(0));
        assert!(purge.revoked.is_empty(), "the stub is not derived from anything");
        assert_eq!(engine.derived_ledger().purges.len(), 2);
    }

    #[test]
    fn a_delegation_digest_is_stamped_and_revoked_when_the_epoch_changes() {
        let mut settings = SessionSettings::defaults(Api::OpenAi, 128_000);
        settings.delegation.tools = vec!["task".into()];
        let mut engine = SessionEngine::in_memory(&settings, 0).unwrap();
        let call = ToolCall { call_id: "call_1".into(), name: "task".into(), arguments_json: "{}".into() };
        let output = "Findings: the flaky test races on the shared port 8125. Decision: give each worker its own port.";
        let result =
            ToolResult { call_id: "call_1".into(), name: Some("task".into()), output: output.into() };
        turn(&mut engine, &settings, delegation("find why the test is flaky", call, result), 1);
        engine.derived.checked = None;
        assert!(engine.validate_derived(&settings, 2).unwrap().is_none(), "made under the current scope");
        let digest =
            engine.journal().entries().iter().find(|e| e.id.kind() == EntryKind::ToolResult).unwrap().id;
        let stamp = &engine.derived_ledger().items[&digest.to_string()];
        assert_eq!(stamp.kind, DerivedKind::Digest, "the digest is stamped as derived context");

        let next_epoch = SessionSettings { cache_epoch: 1, ..settings.clone() };
        let purge = engine.validate_derived(&next_epoch, 3).unwrap().expect("an epoch change purges");
        assert_eq!(purge.revoked["digest"], vec![digest.to_string()]);
        let rewritten = engine.journal().entries().iter().find(|e| e.id == digest).unwrap();
        assert_eq!(rewritten.content.tool_results[0].call_id, "call_1", "the call stays answered");
        assert!(rewritten.content.tool_results[0].output.contains("revoked"));
        assert!(!rewritten.content.tool_results[0].output.contains("8125"), "the digest is not reused");
    }
}

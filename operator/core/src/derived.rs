//! Derived context and its cache scope (spec §17.10): every artifact derived from an agent's
//! context (a compaction or purge summary, a digest) is stamped with the [`DerivationScope`] it was
//! made under (tenant, privacy scope, cache epoch) in a [`DerivedLedger`]. Before a derived item is
//! reused in a prompt it is validated against the current scope ([`DerivedLedger::validate`]); the
//! ones that no longer match are listed by [`DerivedLedger::stale`] for the revocation purge, which
//! the engine records as a [`RevocationPurge`]. Pure: `session::revocation` does the IO.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Revocation purges remembered in the ledger; the oldest are forgotten past this.
pub const MAX_PURGES_REMEMBERED: usize = 32;

/// The cache scope a derived artifact was made under. Bumping the tenant's cache epoch (the
/// namespace annotation `strata.dev/cache-epoch`) revokes everything derived under the old one.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DerivationScope {
    /// Tenant (the agent's namespace).
    pub tenant: String,
    /// Privacy scope of the agent.
    pub privacy_scope: String,
    /// The tenant's cache epoch.
    pub epoch: u64,
}

impl std::fmt::Display for DerivationScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "tenant {:?}, privacy scope {:?}, cache epoch {}",
            self.tenant, self.privacy_scope, self.epoch
        )
    }
}

/// What kind of derived artifact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DerivedKind {
    /// A journal entry written by a compaction or a purge in place of the entries it replaced.
    Summary,
    /// A delegation's result entry, which holds the digest the parent sees.
    Digest,
}

impl DerivedKind {
    /// Label value for metrics, logs and status.
    pub fn label(self) -> &'static str {
        match self {
            DerivedKind::Summary => "summary",
            DerivedKind::Digest => "digest",
        }
    }
}

/// One stamped derived artifact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DerivedItem {
    /// Its kind.
    pub kind: DerivedKind,
    /// The scope it was made under.
    pub scope: DerivationScope,
    /// When it was stamped (unix ms, the caller's clock).
    pub stamped_at_ms: u64,
    /// Revoked: the entry now holds only a stub saying so, derived from nothing, never revoked again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub revoked: bool,
}

/// A derived artifact not stamped under the current scope: it must not enter a prompt.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct StaleDerivation {
    /// The artifact (e.g. an entry ID).
    pub id: String,
    /// Its kind.
    pub kind: DerivedKind,
    /// The scope it was made under (`None`: it carries no stamp).
    pub made_under: Option<DerivationScope>,
    /// The scope in force.
    pub current: DerivationScope,
}

impl std::fmt::Display for StaleDerivation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} was ", self.kind.label(), self.id)?;
        match &self.made_under {
            Some(scope) => write!(f, "derived under {scope}")?,
            None => f.write_str("never stamped")?,
        }
        write!(f, ", but the agent now runs under {}; it is not reused", self.current)
    }
}

/// Files one revocation purge deleted, by kind.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PurgedKind {
    /// Files (generations: generation directories) deleted.
    pub files: u64,
    /// Bytes deleted.
    pub bytes: u64,
}

/// One revocation purge: the scope changed, and what was derived under the old one left the
/// prompt and the volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RevocationPurge {
    /// When it ran (unix ms, the caller's clock).
    pub at_ms: u64,
    /// The scope revoked (absent when only individual items were stale).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<DerivationScope>,
    /// The scope in force after it.
    pub to: DerivationScope,
    /// Derived items taken out of the live context (entry IDs), by kind label.
    pub revoked: BTreeMap<String, Vec<String>>,
    /// Files deleted from the volume, by sweep kind label (`generation`, `artifact`,
    /// `compaction_record`).
    pub purged: BTreeMap<String, PurgedKind>,
}

/// The stamps of every derived artifact still in use, the scope the volume was last served
/// under, and the last revocation purges. Persisted by the engine as a state file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DerivedLedger {
    /// The scope the volume was last served under (`None` before the first stamp).
    #[serde(default)]
    pub scope: Option<DerivationScope>,
    /// Artifact ID → stamp.
    #[serde(default)]
    pub items: BTreeMap<String, DerivedItem>,
    /// The last [`MAX_PURGES_REMEMBERED`] revocation purges, oldest first.
    #[serde(default)]
    pub purges: Vec<RevocationPurge>,
}

impl DerivedLedger {
    /// Stamps `id` as made under `scope` now. Returns whether the ledger changed.
    pub fn record(&mut self, kind: DerivedKind, id: &str, scope: &DerivationScope, now_ms: u64) -> bool {
        if self.items.get(id).is_some_and(|item| item.kind == kind && &item.scope == scope) {
            return false;
        }
        self.items.insert(
            id.to_owned(),
            DerivedItem { kind, scope: scope.clone(), stamped_at_ms: now_ms, revoked: false },
        );
        true
    }

    /// Marks `id` as revoked under `scope`: its entry holds only the revocation stub from now on.
    pub fn record_revoked(&mut self, kind: DerivedKind, id: &str, scope: &DerivationScope, now_ms: u64) {
        self.items.insert(
            id.to_owned(),
            DerivedItem { kind, scope: scope.clone(), stamped_at_ms: now_ms, revoked: true },
        );
    }

    /// Whether `id` may enter a prompt under `current`: stamped, and stamped under `current`.
    pub fn validate(
        &self,
        id: &str,
        kind: DerivedKind,
        current: &DerivationScope,
    ) -> Result<(), Box<StaleDerivation>> {
        match self.items.get(id) {
            Some(item) if item.revoked || &item.scope == current => Ok(()),
            Some(item) => Err(Box::new(StaleDerivation {
                id: id.to_owned(),
                kind: item.kind,
                made_under: Some(item.scope.clone()),
                current: current.clone(),
            })),
            None => Err(Box::new(StaleDerivation {
                id: id.to_owned(),
                kind,
                made_under: None,
                current: current.clone(),
            })),
        }
    }

    /// Whether the volume was last served under another scope than `current` (a revocation is due).
    pub fn scope_changed(&self, current: &DerivationScope) -> bool {
        self.scope.as_ref().is_some_and(|scope| scope != current)
    }

    /// The stamped items not made under `current`, by ID.
    pub fn stale(&self, current: &DerivationScope) -> Vec<(String, DerivedItem)> {
        self.items
            .iter()
            .filter(|(_, item)| !item.revoked && &item.scope != current)
            .map(|(id, item)| (id.clone(), item.clone()))
            .collect()
    }

    /// Forgets the stamps of items no longer in use (`keep` says which are).
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.items.retain(|id, _| keep(id));
    }

    /// Records a purge, forgetting the oldest past [`MAX_PURGES_REMEMBERED`], and moves the
    /// ledger to the purge's scope.
    pub fn push_purge(&mut self, purge: RevocationPurge) {
        self.scope = Some(purge.to.clone());
        self.purges.push(purge);
        if self.purges.len() > MAX_PURGES_REMEMBERED {
            let excess = self.purges.len() - MAX_PURGES_REMEMBERED;
            self.purges.drain(..excess);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn scope(epoch: u64) -> DerivationScope {
        DerivationScope { tenant: "rateright".into(), privacy_scope: "tenant".into(), epoch }
    }

    #[test]
    fn only_items_stamped_under_the_current_scope_validate() {
        let mut ledger = DerivedLedger::default();
        assert!(ledger.record(DerivedKind::Summary, "summary_7", &scope(1), 10));
        assert!(!ledger.record(DerivedKind::Summary, "summary_7", &scope(1), 11), "same stamp: no change");
        assert!(ledger.validate("summary_7", DerivedKind::Summary, &scope(1)).is_ok());
        let stale = ledger.validate("summary_7", DerivedKind::Summary, &scope(2)).unwrap_err();
        assert_eq!(stale.made_under, Some(scope(1)));
        assert!(stale.to_string().contains("cache epoch 1") && stale.to_string().contains("cache epoch 2"));
        let other_scope = DerivationScope { privacy_scope: "user:ana".into(), ..scope(1) };
        assert!(ledger.validate("summary_7", DerivedKind::Summary, &other_scope).is_err());
        let unstamped = ledger.validate("summary_9", DerivedKind::Summary, &scope(1)).unwrap_err();
        assert!(unstamped.made_under.is_none() && unstamped.to_string().contains("never stamped"));
        assert_eq!(ledger.stale(&scope(2)).len(), 1);
        assert!(ledger.stale(&scope(1)).is_empty());
    }

    #[test]
    fn a_purge_moves_the_scope_and_only_the_last_purges_are_kept() {
        let mut ledger = DerivedLedger { scope: Some(scope(1)), ..DerivedLedger::default() };
        assert!(ledger.scope_changed(&scope(2)));
        assert!(!DerivedLedger::default().scope_changed(&scope(2)), "a fresh ledger has nothing to revoke");
        for at_ms in 0..(MAX_PURGES_REMEMBERED as u64 + 3) {
            ledger.push_purge(RevocationPurge {
                at_ms,
                from: Some(scope(1)),
                to: scope(2),
                revoked: BTreeMap::new(),
                purged: BTreeMap::new(),
            });
        }
        assert!(!ledger.scope_changed(&scope(2)));
        assert_eq!(ledger.purges.len(), MAX_PURGES_REMEMBERED);
        assert_eq!(ledger.purges[0].at_ms, 3);
    }
}

//! purge(ids, summary): remove chosen Tier-2 entries, put a summary where the first one stood, keep
//! the removed raw entries reopenable as an artifact, and report the cache economics of the trade.
//!
//! A purge is a generation switch of the journal (seed 000: a deliberate physical deletion that breaks
//! the cache once). The removed entries are archived as one JSON artifact whose reference the summary
//! entry carries, so `strata_read_output` can reopen them byte-exact after the purge.

use std::collections::HashSet;

use crate::artifacts::{ArtifactError, ArtifactRef, ArtifactStore};
use crate::economics::{CachePricing, RemovalEconomics};
use crate::entry::{Content, Entry, EntryDraft, EntryId, EntryKind, RetentionClass, Role};
use crate::journal::{BaselineEntry, GenerationSwitch, Journal, JournalError, Snapshot};
use crate::tokens::TokenCounter;

/// What the model (or a CompactionJob) asked to purge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PurgeRequest {
    /// Entries to remove, e.g. `msg_104`, `tool_call_105`, `tool_res_106`.
    pub ids: Vec<EntryId>,
    /// Dense summary that replaces them; may be empty.
    pub summary: String,
}

/// A purge that cannot run. Nothing is changed.
#[derive(Debug, thiserror::Error)]
pub enum PurgeError {
    /// No IDs were given.
    #[error("purge needs at least one entry ID, e.g. [\"msg_104\", \"tool_res_106\"]")]
    NoIds,
    /// An ID was given twice.
    #[error("{0} is listed twice; list every entry once")]
    DuplicateId(EntryId),
    /// An ID is not in the current context window.
    #[error(
        "{id} is not in the current context (generation {generation}); use the IDs shown in the context, e.g. {example}"
    )]
    NotInWindow {
        /// The ID.
        id: EntryId,
        /// Current generation.
        generation: u64,
        /// An ID that does exist, to show the shape.
        example: String,
    },
    /// Archiving the removed entries failed.
    #[error("archiving the purged entries: {0}")]
    Archive(#[from] ArtifactError),
    /// Encoding the archive failed.
    #[error("encoding the purged entries: {0}")]
    Encode(#[from] serde_json::Error),
    /// After the switch the summary was not where the baseline put it (a journal invariant broke).
    #[error(
        "after the purge, entry {index} of the new generation is not the summary; inspect the journal with the offline reader"
    )]
    SummaryMisplaced {
        /// Where the summary should be.
        index: usize,
    },
    /// The journal refused the switch.
    #[error(transparent)]
    Journal(#[from] JournalError),
}

/// A purge worked out against a snapshot, before it is committed.
#[derive(Clone, Debug, PartialEq)]
pub struct PurgePlan {
    /// The new generation's baseline.
    pub baseline: Vec<BaselineEntry>,
    /// The entries removed, in journal order.
    pub removed: Vec<Entry>,
    /// Position of the summary in the new baseline (where the first purged entry stood).
    pub summary_index: usize,
    /// What the trade costs and saves.
    pub economics: RemovalEconomics,
}

/// A committed purge.
#[derive(Clone, Debug, PartialEq)]
pub struct PurgeOutcome {
    /// The generation switch.
    pub switch: GenerationSwitch,
    /// The summary entry's ID.
    pub summary_id: EntryId,
    /// IDs removed.
    pub removed: Vec<EntryId>,
    /// Tokens removed net of the summary, per later call.
    pub saved_tokens: u64,
    /// Cache economics: savings per later call against the cost of rebuilding the cache from the purge point.
    pub economics: RemovalEconomics,
    /// Artifact holding the removed entries as JSON.
    pub archive: ArtifactRef,
}

/// The text of the summary entry that replaces purged entries.
pub fn summary_text(removed: &[EntryId], summary: &str, archive: &ArtifactRef) -> String {
    let ids: Vec<String> = removed.iter().map(ToString::to_string).collect();
    let mut text = format!("Purged {}.", ids.join(", "));
    if !summary.trim().is_empty() {
        text.push_str(" Summary: ");
        text.push_str(summary.trim());
    }
    text.push_str(&format!(" [raw entries: data_ref={archive}]"));
    text
}

/// Work out a purge against `snapshot` (pure). `summary` is the draft of the replacing entry.
pub fn plan_purge(
    snapshot: &Snapshot,
    request: &PurgeRequest,
    summary: EntryDraft,
    remaining_calls: u64,
    pricing: CachePricing,
) -> Result<PurgePlan, PurgeError> {
    let wanted = validate_ids(snapshot, request)?;
    let mut baseline = Vec::with_capacity(snapshot.entries.len());
    let mut removed = Vec::with_capacity(wanted.len());
    let mut summary_index = None;
    let mut rewritten: u64 = 0;
    let summary_tokens = summary.tokens;
    let mut summary = Some(summary);
    for entry in &snapshot.entries {
        if wanted.contains(&entry.id) {
            if let Some(draft) = summary.take() {
                summary_index = Some(baseline.len());
                baseline.push(BaselineEntry::New(draft));
            }
            removed.push(entry.clone());
        } else {
            if summary_index.is_some() {
                rewritten += entry.tokens;
            }
            baseline.push(BaselineEntry::Keep(entry.id));
        }
    }
    let removed_tokens: u64 = removed.iter().map(|e| e.tokens).sum();
    let saved = removed_tokens.saturating_sub(summary_tokens);
    let economics = RemovalEconomics::evaluate(saved, rewritten + summary_tokens, remaining_calls, pricing);
    Ok(PurgePlan { baseline, removed, summary_index: summary_index.unwrap_or(0), economics })
}

fn validate_ids(snapshot: &Snapshot, request: &PurgeRequest) -> Result<HashSet<EntryId>, PurgeError> {
    if request.ids.is_empty() {
        return Err(PurgeError::NoIds);
    }
    let present: HashSet<EntryId> = snapshot.entries.iter().map(|e| e.id).collect();
    let mut wanted = HashSet::with_capacity(request.ids.len());
    for id in &request.ids {
        if !present.contains(id) {
            return Err(PurgeError::NotInWindow {
                id: *id,
                generation: snapshot.generation,
                example: snapshot.entries.last().map(|e| e.id.to_string()).unwrap_or_else(|| "msg_1".into()),
            });
        }
        if !wanted.insert(*id) {
            return Err(PurgeError::DuplicateId(*id));
        }
    }
    Ok(wanted)
}

/// Purge through the journal: archive the removed entries, then switch to the new generation.
#[allow(clippy::too_many_arguments)]
pub fn purge(
    journal: &mut Journal,
    store: &ArtifactStore,
    tenant: &str,
    request: &PurgeRequest,
    counter: &TokenCounter,
    now_ms: u64,
    remaining_calls: u64,
    pricing: CachePricing,
) -> Result<PurgeOutcome, PurgeError> {
    let snapshot = journal.begin_compaction()?;
    validate_ids(&snapshot, request)?;
    let removed_ids: Vec<EntryId> =
        snapshot.entries.iter().map(|e| e.id).filter(|id| request.ids.contains(id)).collect();
    let removed_entries: Vec<&Entry> =
        snapshot.entries.iter().filter(|e| request.ids.contains(&e.id)).collect();
    let archive = store.put(tenant, &serde_json::to_vec(&removed_entries)?)?;
    let text = summary_text(&removed_ids, &request.summary, &archive);
    let draft = EntryDraft {
        kind: EntryKind::Summary,
        role: Role::User,
        tokens: u64::from(counter.count(&text)),
        content: Content::text(text),
        retention: RetentionClass::Working,
        created_at_ms: now_ms,
        artifact_refs: vec![archive.clone()],
    };
    let plan = plan_purge(&snapshot, request, draft, remaining_calls, pricing)?;
    let switch = journal.commit_generation(&snapshot, plan.baseline, now_ms)?;
    let summary_id = journal
        .entries()
        .get(plan.summary_index)
        .map(|e| e.id)
        .filter(|id| id.kind() == EntryKind::Summary)
        .ok_or(PurgeError::SummaryMisplaced { index: plan.summary_index })?;
    Ok(PurgeOutcome {
        switch,
        summary_id,
        removed: removed_ids,
        saved_tokens: plan.economics.saved_tokens_per_call,
        economics: plan.economics,
        archive,
    })
}

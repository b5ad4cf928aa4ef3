//! From a summary to a generation switch: check, archive the removed entries, build the baseline
//! (kept entries, `summary_N`, resume instruction), commit in-process or by proposal, and record.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use crate::artifacts::{ArtifactRef, ArtifactStore};
use crate::economics::CachePricing;
use crate::entry::{Content, Entry, EntryDraft, EntryId, EntryKind, RetentionClass, Role};
use crate::journal::{
    BaselineEntry, CompactionProposal, GenerationOrigin, Journal, JournalView, Snapshot, Storage, Watermark,
    generation_dir_name, read_current_generation, read_generation,
};
use crate::purge::{PurgeRequest, plan_purge, summary_text};
use crate::tokens::TokenCounter;

use super::check::{QualityReport, check_preservation};
use super::error::CompactionError;
use super::extractive::ExtractiveSummarizer;
use super::plan::{CompactionMode, CompactionRequest, PreparedCompaction};
use super::record::{CompactionRecord, QualityCheck, compaction_id, rfc3339};
use super::state::CompactedState;

/// Directory (inside the data directory) holding compaction records, one JSON file each.
pub const RECORDS_DIR: &str = "compactions";
/// Directory (inside the data directory) the writer reads compaction proposals from (FORMAT.md).
pub const PROPOSALS_DIR: &str = "proposals";

/// What became of a summarised compaction.
#[derive(Debug, Clone)]
pub enum Conclusion {
    /// The check passed; commit it.
    Ready(ReadyCompaction),
    /// The check failed; nothing changes. The record says Failed and lists what is missing.
    Rejected(CompactionRecord),
    /// Nothing would be removed (everything is Critical or recent); nothing changes.
    NothingToCompact(CompactionRecord),
}

/// A checked compaction (or purge) ready to switch generations.
#[derive(Debug, Clone)]
pub struct ReadyCompaction {
    generation: u64,
    watermark: Watermark,
    baseline: Vec<BaselineEntry>,
    summary_position: usize,
    summary_hash: String,
    record: CompactionRecord,
}

impl PreparedCompaction {
    /// Checks `state`, and if it passes archives the removed entries and builds the new baseline.
    /// `version` is the summariser's model or service version.
    pub fn conclude(
        self,
        mut state: CompactedState,
        version: &str,
        store: &ArtifactStore,
        tenant: &str,
        counter: &TokenCounter,
    ) -> Result<Conclusion, CompactionError> {
        let mut record = self.base_record(version);
        if self.removed.is_empty() {
            record.reason = Some(format!(
                "{}nothing to compact: every entry is Critical, recent or an unanswered tool call",
                record.reason.as_deref().map(|r| format!("{r}; ")).unwrap_or_default()
            ));
            record.tokens_after = record.tokens_before;
            return Ok(Conclusion::NothingToCompact(record));
        }
        let report = check_preservation(&self, &state);
        record.preserved_fields = report.preserved_fields.clone();
        if !report.passed() {
            return Ok(Conclusion::Rejected(failed(record, report)));
        }
        let removed: Vec<&Entry> =
            self.snapshot.entries.iter().filter(|entry| !self.retained.contains(&entry.id)).collect();
        let archive = store.put(tenant, &serde_json::to_vec(&removed)?)?;
        state.evidence_refs.artifact_refs.push(archive.to_string());
        let summary_text = serde_json::to_string(&state)?;
        let now = self.request.now_ms;
        let summary = EntryDraft {
            kind: EntryKind::Summary,
            role: Role::User,
            tokens: u64::from(counter.count(&summary_text)),
            content: Content::text(summary_text),
            retention: RetentionClass::Critical,
            created_at_ms: now,
            artifact_refs: vec![archive.clone()],
        };
        let resume = EntryDraft {
            kind: EntryKind::Message,
            role: Role::User,
            tokens: u64::from(counter.count(&state.resume_instruction)),
            content: Content::text(state.resume_instruction.clone()),
            retention: RetentionClass::Working,
            created_at_ms: now,
            artifact_refs: Vec::new(),
        };
        let kept_tokens: u64 = self
            .snapshot
            .entries
            .iter()
            .filter(|entry| self.retained.contains(&entry.id))
            .map(|entry| entry.tokens)
            .sum();
        record.tokens_after = kept_tokens + summary.tokens + resume.tokens;
        record.raw_archive = Some(archive.to_string());
        let summary_hash = crate::entry::content_hash(summary.role, &summary.content);
        record.compaction_id = compaction_id(&[
            &self.snapshot.generation.to_string(),
            &self.snapshot.watermark.entries.to_string(),
            &self.snapshot.watermark.last_id.map(|id| id.to_string()).unwrap_or_default(),
            self.request.mode.as_str(),
            &summary_hash,
            &now.to_string(),
        ]);
        // The summary and resume instruction go after the kept entries, except that a tool call
        // still waiting for its result stays last: its result, journaled after the switch, must
        // follow it directly.
        let summary_position = self.first_open_call().unwrap_or(self.input.retained.len());
        let (before, after) = self.input.retained.split_at(summary_position);
        let mut baseline: Vec<BaselineEntry> = before.iter().copied().map(BaselineEntry::Keep).collect();
        baseline.push(BaselineEntry::New(summary));
        baseline.push(BaselineEntry::New(resume));
        baseline.extend(after.iter().copied().map(BaselineEntry::Keep));
        Ok(Conclusion::Ready(ReadyCompaction {
            generation: self.snapshot.generation,
            watermark: self.snapshot.watermark,
            baseline,
            summary_position,
            summary_hash,
            record,
        }))
    }

    /// Position, among the kept entries, of the first one holding a tool call the snapshot has no
    /// result for.
    fn first_open_call(&self) -> Option<usize> {
        let answered: HashSet<&str> = self
            .snapshot
            .entries
            .iter()
            .flat_map(|entry| entry.content.tool_results.iter().map(|result| result.call_id.as_str()))
            .collect();
        let open: HashSet<EntryId> = self
            .snapshot
            .entries
            .iter()
            .filter(|entry| {
                entry.content.tool_calls.iter().any(|call| !answered.contains(call.call_id.as_str()))
            })
            .map(|entry| entry.id)
            .collect();
        self.input.retained.iter().position(|id| open.contains(id))
    }

    /// The record fields known before the summary: ID, mode, span, assets, tokens before.
    fn base_record(&self, version: &str) -> CompactionRecord {
        let snapshot = &self.snapshot;
        let request = &self.request;
        let span: Vec<String> = match (snapshot.entries.first(), snapshot.entries.last()) {
            (Some(first), Some(last)) => vec![first.id.to_string(), last.id.to_string()],
            _ => Vec::new(),
        };
        CompactionRecord {
            compaction_id: compaction_id(&[
                &snapshot.generation.to_string(),
                &snapshot.watermark.entries.to_string(),
                request.mode.as_str(),
                &request.now_ms.to_string(),
            ]),
            mode: Some(request.mode),
            reason: request.reason.clone(),
            source_generation: snapshot.generation,
            result_generation: snapshot.generation,
            tokens_before: snapshot.entries.iter().map(|entry| entry.tokens).sum(),
            tokens_after: 0,
            preserved_fields: Vec::new(),
            missing_items: Vec::new(),
            quality_check: QualityCheck::Passed,
            summary_asset_id: None,
            privacy_scope: Some(request.settings.privacy_scope.clone()),
            model_or_service_version: Some(version.to_owned()),
            created_at: Some(rfc3339(request.now_ms)),
            source_span_ids: span,
            assets_retained: self.input.retained.iter().map(ToString::to_string).collect(),
            assets_removed: self.removed.iter().map(ToString::to_string).collect(),
            assets_retained_count: self.input.retained.len() as u64,
            assets_removed_count: self.removed.len() as u64,
            raw_archive: None,
            truncated: false,
        }
    }
}

fn failed(mut record: CompactionRecord, report: QualityReport) -> CompactionRecord {
    record.quality_check = QualityCheck::Failed;
    record.missing_items = report.missing_items;
    record.tokens_after = record.tokens_before;
    record
}

impl ReadyCompaction {
    /// The record as it stands before the commit (result generation still the source's).
    pub fn record(&self) -> &CompactionRecord {
        &self.record
    }

    /// The new baseline.
    pub fn baseline(&self) -> &[BaselineEntry] {
        &self.baseline
    }

    /// Commits through the writer; entries appended since the snapshot are carried over.
    pub fn commit(self, journal: &mut Journal, now_ms: u64) -> Result<CompactionRecord, CompactionError> {
        let snapshot =
            Snapshot { generation: self.generation, watermark: self.watermark, entries: Vec::new() };
        let switch = journal.commit_generation(&snapshot, self.baseline, now_ms)?;
        let summary_id = journal.entries().get(self.summary_position).map(|entry| entry.id);
        let mut record = self.record;
        record.result_generation = switch.to_generation;
        record.summary_asset_id = summary_id.map(|id| id.to_string());
        Ok(record)
    }

    /// The proposal a process without the writer lock publishes (see `journal::propose_compaction`).
    pub fn proposal(&self, now_ms: u64) -> CompactionProposal {
        CompactionProposal {
            generation: self.generation,
            watermark: self.watermark,
            baseline: self.baseline.clone(),
            created_at_ms: now_ms,
        }
    }

    /// Publishes the proposal for the writer of another process, durably: the file is written and
    /// fsynced under `compactions/`, then renamed into `proposals/` (the writer's `refresh` deletes
    /// anything else it finds in `proposals/`, including a half-written temporary file there).
    pub fn publish(
        &self,
        storage: &dyn Storage,
        dir: &Path,
        now_ms: u64,
    ) -> Result<PathBuf, CompactionError> {
        let staging = dir.join(RECORDS_DIR);
        let proposals = dir.join(PROPOSALS_DIR);
        let name = format!("compaction-{}.json", generation_dir_name(self.generation));
        let tmp = staging.join(format!("{name}.proposal.tmp"));
        let path = proposals.join(&name);
        let fail = |path: &Path| {
            let path = path.to_path_buf();
            move |source| CompactionError::Record { path, source }
        };
        let bytes = serde_json::to_vec(&self.proposal(now_ms))?;
        storage.create_dir_all(&staging).map_err(fail(&staging))?;
        storage.create_dir_all(&proposals).map_err(fail(&proposals))?;
        storage.sync_dir(dir).map_err(fail(dir))?;
        storage.write_file(&tmp, &bytes).map_err(fail(&tmp))?;
        storage.sync_file(&tmp).map_err(fail(&tmp))?;
        storage.rename(&tmp, &path).map_err(fail(&path))?;
        storage.sync_dir(&proposals).map_err(fail(&proposals))?;
        storage.sync_dir(&staging).map_err(fail(&staging))?;
        Ok(path)
    }

    /// The source generation of the proposal.
    pub fn source_generation(&self) -> u64 {
        self.generation
    }

    /// After the writer applied the proposal: finds the generation it produced (parent = source,
    /// same watermark, the summary at its position) and completes the record. `Ok(None)` while the
    /// source generation is still CURRENT.
    pub fn confirm(
        &self,
        storage: &dyn Storage,
        dir: &Path,
    ) -> Result<Option<CompactionRecord>, CompactionError> {
        let current = read_current_generation(storage, dir)?;
        if current.generation == self.generation {
            return Ok(None);
        }
        for generation in self.generation + 1..=current.generation {
            let view = if generation == current.generation {
                current.clone()
            } else {
                match read_generation(storage, dir, generation) {
                    Ok(view) => view,
                    Err(_) => continue,
                }
            };
            if let Some(record) = self.match_view(&view) {
                return Ok(Some(record));
            }
        }
        Err(CompactionError::NotOurs {
            path: dir.to_path_buf(),
            generation: current.generation,
            reason: format!(
                "no generation after {} was built from watermark {} with this summary",
                self.generation, self.watermark.entries
            ),
        })
    }

    fn match_view(&self, view: &JournalView) -> Option<CompactionRecord> {
        let from_us = view.manifest.parent_generation == Some(self.generation)
            && matches!(view.manifest.origin, GenerationOrigin::Compaction { watermark, .. } if watermark == self.watermark);
        let summary = view.entries.get(self.summary_position)?;
        if !from_us || summary.content_hash != self.summary_hash {
            return None;
        }
        let mut record = self.record.clone();
        record.result_generation = view.generation;
        record.summary_asset_id = Some(summary.id.to_string());
        Some(record)
    }
}

/// Prepares, summarises extractively, checks and commits in one writer: the in-process path for
/// the gateway's `strata_compact_context` tool and for tests.
pub fn compact_extractive(
    journal: &mut Journal,
    store: &ArtifactStore,
    tenant: &str,
    request: CompactionRequest,
    counter: &TokenCounter,
) -> Result<CompactionRecord, CompactionError> {
    let now = request.now_ms;
    let summarizer = ExtractiveSummarizer { max_summary_tokens: request.settings.max_summary_tokens };
    let prepared = PreparedCompaction::new(journal.begin_compaction()?, request);
    let state = summarizer.summarize_now(prepared.summary_input());
    match prepared.conclude(state, super::extractive::EXTRACTIVE_VERSION, store, tenant, counter)? {
        Conclusion::Ready(ready) => ready.commit(journal, now),
        Conclusion::Rejected(record) | Conclusion::NothingToCompact(record) => Ok(record),
    }
}

/// The inputs of a purge compaction.
#[derive(Debug, Clone, Copy)]
pub struct PurgeJob<'a> {
    /// IDs and summary.
    pub request: &'a PurgeRequest,
    /// Why (recorded).
    pub reason: Option<&'a str>,
    /// Privacy scope (recorded).
    pub privacy_scope: &'a str,
    /// Artifact-store tenant for the archive of the removed entries.
    pub tenant: &'a str,
    /// The clock, unix milliseconds.
    pub now_ms: u64,
}

/// A purge (mode Purge) worked out against a snapshot: the lead's `purge` plan (summary where the
/// first purged entry stood, raw entries archived), wrapped with a compaction record.
pub fn prepare_purge(
    snapshot: &Snapshot,
    purge: &PurgeJob<'_>,
    store: &ArtifactStore,
    counter: &TokenCounter,
) -> Result<ReadyCompaction, CompactionError> {
    let PurgeJob { request, reason, privacy_scope, tenant, now_ms } = *purge;
    let reason = reason.map(str::to_owned);
    let placeholder = purge_draft(String::new(), None, 0, now_ms);
    plan_purge(snapshot, request, placeholder, 0, CachePricing::OPENAI)?;
    let removed: Vec<&Entry> =
        snapshot.entries.iter().filter(|entry| request.ids.contains(&entry.id)).collect();
    let removed_ids: Vec<EntryId> = removed.iter().map(|entry| entry.id).collect();
    let archive = store.put(tenant, &serde_json::to_vec(&removed)?)?;
    let text = summary_text(&removed_ids, &request.summary, &archive);
    let tokens = u64::from(counter.count(&text));
    let draft = purge_draft(text, Some(archive.clone()), tokens, now_ms);
    let summary_hash = crate::entry::content_hash(draft.role, &draft.content);
    let plan = plan_purge(snapshot, request, draft, 0, CachePricing::OPENAI)?;
    let removed_tokens: u64 = removed.iter().map(|entry| entry.tokens).sum();
    let tokens_before: u64 = snapshot.entries.iter().map(|entry| entry.tokens).sum();
    let retained: Vec<String> = snapshot
        .entries
        .iter()
        .filter(|entry| !request.ids.contains(&entry.id))
        .map(|entry| entry.id.to_string())
        .collect();
    let span = match (removed.first(), removed.last()) {
        (Some(first), Some(last)) => vec![first.id.to_string(), last.id.to_string()],
        _ => Vec::new(),
    };
    let removed_text: Vec<String> = removed_ids.iter().map(ToString::to_string).collect();
    let record = CompactionRecord {
        compaction_id: compaction_id(&[
            &snapshot.generation.to_string(),
            &snapshot.watermark.entries.to_string(),
            CompactionMode::Purge.as_str(),
            &removed_text.join(","),
            &summary_hash,
            &now_ms.to_string(),
        ]),
        mode: Some(CompactionMode::Purge),
        reason,
        source_generation: snapshot.generation,
        result_generation: snapshot.generation,
        tokens_before,
        tokens_after: tokens_before - removed_tokens + tokens,
        preserved_fields: Vec::new(),
        missing_items: Vec::new(),
        quality_check: QualityCheck::Passed,
        summary_asset_id: None,
        privacy_scope: Some(privacy_scope.to_owned()),
        model_or_service_version: Some("strata-purge/1".into()),
        created_at: Some(rfc3339(now_ms)),
        source_span_ids: span,
        assets_retained_count: retained.len() as u64,
        assets_retained: retained,
        assets_removed_count: removed_text.len() as u64,
        assets_removed: removed_text,
        raw_archive: Some(archive.to_string()),
        truncated: false,
    };
    Ok(ReadyCompaction {
        generation: snapshot.generation,
        watermark: snapshot.watermark,
        baseline: plan.baseline,
        summary_position: plan.summary_index,
        summary_hash,
        record,
    })
}

fn purge_draft(text: String, archive: Option<ArtifactRef>, tokens: u64, now_ms: u64) -> EntryDraft {
    EntryDraft {
        kind: EntryKind::Summary,
        role: Role::User,
        tokens,
        content: Content::text(text),
        retention: RetentionClass::Working,
        created_at_ms: now_ms,
        artifact_refs: archive.into_iter().collect(),
    }
}

/// Rolls the journal back to a retained generation (byte-identical, plus later entries) and
/// records it.
pub fn rollback(
    journal: &mut Journal,
    to_generation: u64,
    reason: Option<String>,
    privacy_scope: &str,
    now_ms: u64,
) -> Result<CompactionRecord, CompactionError> {
    let source_generation = journal.generation();
    let tokens_before = journal.total_tokens();
    let switch = journal.rollback(to_generation, now_ms)?;
    Ok(CompactionRecord {
        compaction_id: compaction_id(&[
            &source_generation.to_string(),
            CompactionMode::Rollback.as_str(),
            &to_generation.to_string(),
            &now_ms.to_string(),
        ]),
        mode: Some(CompactionMode::Rollback),
        reason,
        source_generation,
        result_generation: switch.to_generation,
        tokens_before,
        tokens_after: journal.total_tokens(),
        preserved_fields: Vec::new(),
        missing_items: Vec::new(),
        quality_check: QualityCheck::Passed,
        summary_asset_id: None,
        privacy_scope: Some(privacy_scope.to_owned()),
        model_or_service_version: Some(format!("strata-rollback/1 (to generation {to_generation})")),
        created_at: Some(rfc3339(now_ms)),
        source_span_ids: Vec::new(),
        assets_retained: Vec::new(),
        assets_removed: Vec::new(),
        assets_retained_count: switch.baseline_entries + switch.carried_entries,
        assets_removed_count: 0,
        raw_archive: None,
        truncated: false,
    })
}

/// Writes `record` durably to `<dir>/compactions/<id>.json` (temp file, fsync, rename, directory
/// fsync), beside the journal; failed checks are recorded too.
pub fn write_record(
    storage: &dyn Storage,
    dir: &Path,
    record: &CompactionRecord,
) -> Result<PathBuf, CompactionError> {
    let records = dir.join(RECORDS_DIR);
    let name = format!("{}.json", record.compaction_id.replace(':', "-"));
    let path = records.join(&name);
    let tmp = records.join(format!("{name}.tmp"));
    let fail = |path: &Path| {
        let path = path.to_path_buf();
        move |source| CompactionError::Record { path, source }
    };
    storage.create_dir_all(&records).map_err(fail(&records))?;
    storage.write_file(&tmp, record.to_json_pretty().as_bytes()).map_err(fail(&tmp))?;
    storage.sync_file(&tmp).map_err(fail(&tmp))?;
    storage.rename(&tmp, &path).map_err(fail(&path))?;
    storage.sync_dir(&records).map_err(fail(&records))?;
    storage.sync_dir(dir).map_err(fail(dir))?;
    Ok(path)
}

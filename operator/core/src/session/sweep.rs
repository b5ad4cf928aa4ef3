//! The volume sweep: deletes the superseded generations, artifacts and compaction records that
//! the [`VolumeRetention`] policy lets go, never anything the live generation, a kept rollback
//! target or a pending compaction proposal references (decisions in [`crate::lifecycle`]).
//!
//! It runs inside the engine, so no request can reference an artifact between the moment the
//! references are collected and the moment it is deleted. Ages are kept in the `lifecycle.json`
//! state file (an artifact's age starts when it stops being referenced; a record's when the sweeper
//! first sees it), all on the caller's clock, so replay drives it with simulated time.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::engine::{EngineError, SessionEngine};
use super::settings::SessionSettings;
use crate::artifacts::ArtifactError;
use crate::compaction::CompactionMode;
use crate::compaction::{PROPOSALS_DIR, RECORDS_DIR};
use crate::journal::{Storage, generation_dir_name, read_generation};
use crate::lifecycle::{
    SweepCandidate, SweepKind, SweepPlan, SweepReason, VolumeRetention, archive_refs, plan_sweep,
    referenced_artifacts, scan_refs,
};

/// The state file holding the sweeper's clocks.
pub(super) const LIFECYCLE_FILE: &str = "lifecycle.json";
/// Swept digests remembered for a clear "expired" answer; the oldest are forgotten past this.
const MAX_SWEPT_REMEMBERED: usize = 100_000;

/// The sweeper's persisted clocks.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LifecycleLedger {
    /// Artifact (`tenant/aa/name`) → when it stopped being referenced; compaction record
    /// (`compactions/name`) → when it was first seen. Unix ms.
    #[serde(default)]
    pub since: BTreeMap<String, u64>,
    /// Digest → when the sweeper deleted that artifact. Unix ms.
    #[serde(default)]
    pub swept: BTreeMap<String, u64>,
}

/// What one superseded generation references, and its size (generations never change once
/// superseded, so this is read once).
#[derive(Debug, Clone)]
pub(super) struct GenerationFacts {
    bytes: u64,
    created_at_ms: u64,
    refs: BTreeSet<String>,
    archives: BTreeSet<String>,
}

/// The sweeper's state inside the engine.
#[derive(Debug, Default)]
pub(super) struct Lifecycle {
    pub(super) ledger: LifecycleLedger,
    generations: HashMap<u64, GenerationFacts>,
    /// Artifact digest → the references written inside it (artifacts never change).
    inner_refs: HashMap<String, Vec<String>>,
}

impl Lifecycle {
    pub(super) fn new(ledger: LifecycleLedger) -> Self {
        Self { ledger, generations: HashMap::new(), inner_refs: HashMap::new() }
    }
}

/// What a sweep did to one kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KindSweep {
    /// The kind.
    pub kind: SweepKind,
    /// Files (generations: generation directories) deleted.
    pub files_swept: u64,
    /// Bytes deleted.
    pub bytes_swept: u64,
    /// Of which deleted for age.
    pub swept_for_age: u64,
    /// Of which deleted for bytes.
    pub swept_for_bytes: u64,
    /// Files of the kind left.
    pub files_kept: u64,
    /// Bytes of the kind left.
    pub bytes_kept: u64,
    /// Of the files left, those still referenced or needed (never deleted).
    pub files_protected: u64,
    /// How far the protected files alone keep the kind over its `maxBytes`.
    pub over_budget_bytes: u64,
}

/// What one sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SweepReport {
    /// When it ran (unix ms, the caller's clock).
    pub at_ms: u64,
    /// Per kind: superseded generations, artifacts, compaction records.
    pub kinds: Vec<KindSweep>,
    /// Generations deleted.
    pub removed_generations: Vec<u64>,
    /// Generations kept for rollback.
    pub kept_generations: Vec<u64>,
    /// What was done about a live generation that alone exceeded `generations.maxBytes` (absent
    /// when it was within it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub live_generation: Option<LiveGenerationBound>,
}

/// What [`SessionEngine::maintain_volume`] did about a live generation over its byte budget. The
/// live generation is never deleted; only a compaction makes it smaller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LiveGenerationBound {
    /// How far the live generation alone was over `generations.maxBytes`.
    pub over_budget_bytes: u64,
    /// What was done.
    pub action: LiveGenerationAction,
}

/// The remedy for a live generation over its byte budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LiveGenerationAction {
    /// Compacted in-process; the superseded generation was swept by bytes at once.
    Compacted,
    /// A Budget compaction was asked of the host's summariser model
    /// ([`SessionEngine::take_compaction_ask`]); the next sweep deletes what it supersedes.
    CompactionAsked,
    /// The compaction could not make it smaller (nothing to compact, or the summary was
    /// rejected): the volume policy's `generations.maxBytes` is too small for this agent.
    NotCompacted,
}

impl SweepReport {
    /// Files deleted, all kinds.
    pub fn files_swept(&self) -> u64 {
        self.kinds.iter().map(|k| k.files_swept).sum()
    }

    /// Bytes deleted, all kinds.
    pub fn bytes_swept(&self) -> u64 {
        self.kinds.iter().map(|k| k.bytes_swept).sum()
    }
}

fn io_error(operation: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> EngineError + use<> {
    let path = path.to_path_buf();
    move |source| EngineError::Artifact(ArtifactError::Io { operation, path, source })
}

/// A temporary file another writer (e.g. `strata compact` storing an archive) may still be
/// renaming into place is left alone for this long.
const TEMP_FILE_GRACE_MS: u64 = 3_600_000;

fn vanished(error: &std::io::Error) -> bool {
    error.kind() == std::io::ErrorKind::NotFound
}

/// Lists a directory, empty when it does not exist (or vanished meanwhile).
fn list(storage: &dyn Storage, dir: &Path) -> Result<Vec<String>, EngineError> {
    let mut names = match storage.list_dir(dir) {
        Ok(names) => names,
        Err(error) if vanished(&error) => return Ok(Vec::new()),
        Err(error) => return Err(io_error("list", dir)(error)),
    };
    names.sort();
    Ok(names)
}

/// A file's size; `None` for a directory or a file that vanished since it was listed.
fn file_len(storage: &dyn Storage, path: &Path) -> Result<Option<u64>, EngineError> {
    match storage.file_len(path) {
        Ok(len) => Ok(len),
        Err(error) if vanished(&error) => Ok(None),
        Err(error) => Err(io_error("stat", path)(error)),
    }
}

/// Removes a file; one already gone is fine.
fn remove(storage: &dyn Storage, path: &Path) -> Result<(), EngineError> {
    match storage.remove_file(path) {
        Err(error) if !vanished(&error) => Err(io_error("remove", path)(error)),
        _ => Ok(()),
    }
}

/// Bytes of the files directly in `dir`.
fn dir_bytes(storage: &dyn Storage, dir: &Path) -> Result<u64, EngineError> {
    let mut total = 0;
    for name in list(storage, dir)? {
        total += file_len(storage, &dir.join(name))?.unwrap_or(0);
    }
    Ok(total)
}

/// Bytes of every file under `dir`, recursively (0 when it does not exist).
pub fn volume_bytes(storage: &dyn Storage, dir: &Path) -> Result<u64, EngineError> {
    let mut total = 0;
    for name in list(storage, dir)? {
        let path = dir.join(name);
        match storage.file_len(&path) {
            Ok(Some(len)) => total += len,
            Ok(None) => total += volume_bytes(storage, &path)?,
            Err(error) if vanished(&error) => {}
            Err(error) => return Err(io_error("stat", &path)(error)),
        }
    }
    Ok(total)
}

/// One file the sweep may delete.
struct FileCandidate {
    path: PathBuf,
    digest: Option<String>,
}

fn tally(kind: SweepKind, candidates: &[SweepCandidate], plan: &SweepPlan) -> KindSweep {
    let mut summary = KindSweep {
        kind,
        files_swept: 0,
        bytes_swept: 0,
        swept_for_age: 0,
        swept_for_bytes: 0,
        files_kept: 0,
        bytes_kept: 0,
        files_protected: 0,
        over_budget_bytes: plan.over_budget_bytes,
    };
    let doomed: BTreeSet<usize> = plan.doomed.iter().map(|(index, _)| *index).collect();
    for (index, reason) in &plan.doomed {
        summary.files_swept += 1;
        summary.bytes_swept += candidates[*index].bytes;
        match reason {
            SweepReason::Age => summary.swept_for_age += 1,
            SweepReason::Bytes => summary.swept_for_bytes += 1,
        }
    }
    for (_, candidate) in candidates.iter().enumerate().filter(|(i, _)| !doomed.contains(i)) {
        summary.files_kept += 1;
        summary.bytes_kept += candidate.bytes;
        summary.files_protected += u64::from(candidate.protected);
    }
    summary
}

impl SessionEngine {
    /// Bytes of every file under the data directory (journal, artifacts, records, state), through
    /// the engine's storage.
    pub fn volume_bytes(&self) -> Result<u64, EngineError> {
        volume_bytes(self.storage.as_ref(), self.journal.dir())
    }

    /// The sweeper's clocks (for tests and the inspector).
    pub fn lifecycle_ledger(&self) -> &LifecycleLedger {
        &self.lifecycle.ledger
    }

    /// Deletes what the volume retention policy lets go: superseded generations first (past
    /// their age, then oldest first over their bytes; at most `retainGenerations` are on disk in
    /// any case), then unreferenced artifacts, then compaction records, each by age and then by
    /// bytes. Deletions are durable (directory fsync) when it returns. `now_ms` is the caller's
    /// clock.
    pub fn sweep_volume(
        &mut self,
        retention: &VolumeRetention,
        now_ms: u64,
    ) -> Result<SweepReport, EngineError> {
        let mut report = SweepReport { at_ms: now_ms, ..SweepReport::default() };
        let mut protected = referenced_artifacts(self.journal.entries());
        let mut archives = archive_refs(self.journal.entries());
        let (generations, kept) = self.sweep_generations(retention, now_ms, &mut report)?;
        report.kinds.push(generations);
        for generation in &kept {
            if let Some(facts) = self.lifecycle.generations.get(generation) {
                protected.extend(facts.refs.iter().cloned());
                archives.extend(facts.archives.iter().cloned());
            }
        }
        report.kept_generations = kept;
        self.proposal_refs(&mut protected)?;
        self.refs_inside_archives(archives, &mut protected)?;
        let artifacts = self.sweep_artifacts(retention, now_ms, &protected)?;
        report.kinds.push(artifacts);
        let records = self.sweep_records(retention, now_ms)?;
        report.kinds.push(records);
        let swept = &mut self.lifecycle.ledger.swept;
        if swept.len() > MAX_SWEPT_REMEMBERED {
            let mut by_time: Vec<(u64, String)> = swept.iter().map(|(d, at)| (*at, d.clone())).collect();
            by_time.sort();
            for (_, digest) in by_time.into_iter().take(swept.len() - MAX_SWEPT_REMEMBERED) {
                swept.remove(&digest);
            }
        }
        self.state.write(LIFECYCLE_FILE, &self.lifecycle.ledger)?;
        Ok(report)
    }

    /// The sweeper's run under the policy in force: [`SessionEngine::sweep_volume`] with
    /// `settings.volume`, then, when the live generation alone exceeds `generations.maxBytes`
    /// (a journal whose context stays small through elision and expiry, so the token trigger never
    /// fires, still grows on disk), a Budget compaction: in-process and swept at once, or asked of
    /// the host when it has a summariser model.
    pub fn maintain_volume(
        &mut self,
        settings: &SessionSettings,
        now_ms: u64,
    ) -> Result<SweepReport, EngineError> {
        let report = self.sweep_volume(&settings.volume, now_ms)?;
        let over_budget_bytes = report
            .kinds
            .iter()
            .find(|kind| kind.kind == SweepKind::Generation)
            .map_or(0, |kind| kind.over_budget_bytes);
        if over_budget_bytes == 0 {
            return Ok(report);
        }
        let reason = format!(
            "the live journal generation is {over_budget_bytes} bytes over the volume policy's generations.maxBytes ({} bytes)",
            settings.volume.generations.max_bytes
        );
        let compacted = self.compact_in_process(settings, CompactionMode::Budget, &reason, now_ms)?;
        let (mut report, action) = if compacted {
            (self.sweep_volume(&settings.volume, now_ms)?, LiveGenerationAction::Compacted)
        } else if settings.model_summarizer {
            (report, LiveGenerationAction::CompactionAsked)
        } else {
            (report, LiveGenerationAction::NotCompacted)
        };
        report.live_generation = Some(LiveGenerationBound { over_budget_bytes, action });
        Ok(report)
    }

    /// Superseded generations: returns the kind's summary and the generations kept.
    fn sweep_generations(
        &mut self,
        retention: &VolumeRetention,
        now_ms: u64,
        report: &mut SweepReport,
    ) -> Result<(KindSweep, Vec<u64>), EngineError> {
        let storage = self.storage.clone();
        let root = self.journal.dir().to_path_buf();
        let current = self.journal.generation();
        let retained = self.journal.retained_generations()?;
        self.lifecycle.generations.retain(|generation, _| retained.contains(generation));
        for generation in &retained {
            if self.lifecycle.generations.contains_key(generation) {
                continue;
            }
            let view = read_generation(storage.as_ref(), &root, *generation)?;
            let bytes = dir_bytes(storage.as_ref(), &root.join(generation_dir_name(*generation)))?;
            self.lifecycle.generations.insert(
                *generation,
                GenerationFacts {
                    bytes,
                    created_at_ms: view.manifest.created_at_ms,
                    refs: referenced_artifacts(&view.entries),
                    archives: archive_refs(&view.entries),
                },
            );
        }
        // A generation's age starts when the next one replaced it.
        let mut candidates = Vec::with_capacity(retained.len() + 1);
        for (position, generation) in retained.iter().enumerate() {
            let facts = &self.lifecycle.generations[generation];
            let superseded_at = retained
                .get(position + 1)
                .and_then(|next| self.lifecycle.generations.get(next))
                .map_or(self.journal.manifest().created_at_ms, |next| next.created_at_ms);
            candidates.push(SweepCandidate {
                key: generation.to_string(),
                bytes: facts.bytes,
                since_ms: superseded_at,
                protected: false,
            });
        }
        candidates.push(SweepCandidate {
            key: current.to_string(),
            bytes: dir_bytes(storage.as_ref(), &root.join(generation_dir_name(current)))?,
            since_ms: now_ms,
            protected: true,
        });
        let plan = plan_sweep(&candidates, &retention.generations, now_ms);
        let doomed: BTreeSet<usize> = plan.doomed.iter().map(|(index, _)| *index).collect();
        for index in &doomed {
            let generation = retained[*index];
            self.journal.remove_superseded_generation(generation)?;
            self.lifecycle.generations.remove(&generation);
            report.removed_generations.push(generation);
        }
        let kept = retained
            .iter()
            .enumerate()
            .filter(|(index, _)| !doomed.contains(index))
            .map(|(_, generation)| *generation)
            .collect();
        Ok((tally(SweepKind::Generation, &candidates, &plan), kept))
    }

    /// Adds, transitively, what `archives` name inside them: a compaction or purge archive holds
    /// the removed entries, whose spill markers and own archives name further artifacts, still
    /// reachable through the summary's `data_ref`. Artifacts never change, so each is read once.
    fn refs_inside_archives(
        &mut self,
        archives: BTreeSet<String>,
        protected: &mut BTreeSet<String>,
    ) -> Result<(), EngineError> {
        let mut pending: Vec<String> = archives.into_iter().collect();
        let mut scanned = BTreeSet::new();
        while let Some(digest) = pending.pop() {
            if !scanned.insert(digest.clone()) {
                continue;
            }
            if !self.lifecycle.inner_refs.contains_key(&digest) {
                let inner = self.read_inner_refs(&digest)?;
                self.lifecycle.inner_refs.insert(digest.clone(), inner);
            }
            for inner in self.lifecycle.inner_refs.get(&digest).into_iter().flatten() {
                protected.insert(inner.clone());
                pending.push(inner.clone());
            }
        }
        Ok(())
    }

    /// The references written inside one artifact (none when it is not on the volume).
    fn read_inner_refs(&self, digest: &str) -> Result<Vec<String>, EngineError> {
        let Ok(artifact) = format!("art:sha256:{digest}").parse::<crate::artifacts::ArtifactRef>() else {
            return Ok(Vec::new());
        };
        let path = self.store.path_of(&self.tenant, &artifact)?;
        if !self.storage.exists(&path).map_err(io_error("stat", &path))? {
            return Ok(Vec::new());
        }
        let bytes = self.storage.read(&path).map_err(io_error("read", &path))?;
        let mut found = BTreeSet::new();
        scan_refs(&String::from_utf8_lossy(&bytes), &mut found);
        found.remove(digest);
        Ok(found.into_iter().collect())
    }

    /// Adds what pending compaction proposals (from `strata compact`) reference.
    fn proposal_refs(&self, protected: &mut BTreeSet<String>) -> Result<(), EngineError> {
        let dir = self.journal.dir().join(PROPOSALS_DIR);
        for name in list(self.storage.as_ref(), &dir)? {
            let path = dir.join(name);
            match self.storage.read(&path) {
                Ok(bytes) => scan_refs(&String::from_utf8_lossy(&bytes), protected),
                // The writer may apply and delete a proposal while we list.
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => return Err(io_error("read", &path)(error)),
            }
        }
        Ok(())
    }

    /// Unreferenced artifacts of every tenant directory.
    fn sweep_artifacts(
        &mut self,
        retention: &VolumeRetention,
        now_ms: u64,
        protected: &BTreeSet<String>,
    ) -> Result<KindSweep, EngineError> {
        let storage = self.storage.clone();
        let root = self.store.root().to_path_buf();
        let mut files = Vec::new();
        let mut candidates = Vec::new();
        let mut seen = BTreeSet::new();
        for tenant in list(storage.as_ref(), &root)? {
            let tenant_dir = root.join(&tenant);
            for shard in list(storage.as_ref(), &tenant_dir)? {
                let shard_dir = tenant_dir.join(&shard);
                for name in list(storage.as_ref(), &shard_dir)? {
                    let path = shard_dir.join(&name);
                    let Some(bytes) = file_len(storage.as_ref(), &path)? else { continue };
                    let key = format!("{tenant}/{shard}/{name}");
                    let digest = (name.len() == 64 && !name.starts_with('.')).then(|| name.clone());
                    let referenced = digest.as_ref().is_some_and(|d| protected.contains(d));
                    let since = if referenced {
                        self.lifecycle.ledger.since.remove(&key);
                        now_ms
                    } else {
                        *self.lifecycle.ledger.since.entry(key.clone()).or_insert(now_ms)
                    };
                    let fresh_temp =
                        name.starts_with('.') && now_ms.saturating_sub(since) < TEMP_FILE_GRACE_MS;
                    let is_protected = referenced || fresh_temp;
                    seen.insert(key.clone());
                    candidates.push(SweepCandidate { key, bytes, since_ms: since, protected: is_protected });
                    files.push(FileCandidate { path, digest });
                }
            }
        }
        self.lifecycle.ledger.since.retain(|key, _| key.starts_with("compactions/") || seen.contains(key));
        let plan = plan_sweep(&candidates, &retention.artifacts, now_ms);
        let mut touched_dirs = BTreeSet::new();
        for (index, _) in &plan.doomed {
            let file = &files[*index];
            remove(storage.as_ref(), &file.path)?;
            self.lifecycle.ledger.since.remove(&candidates[*index].key);
            if let Some(digest) = &file.digest {
                self.lifecycle.inner_refs.remove(digest);
                self.store.mark_swept(digest, now_ms);
                self.lifecycle.ledger.swept.insert(digest.clone(), now_ms);
            }
            if let Some(shard) = file.path.parent() {
                touched_dirs.insert(shard.to_path_buf());
            }
        }
        for shard in &touched_dirs {
            storage.sync_dir(shard).map_err(io_error("fsync directory", shard))?;
            if list(storage.as_ref(), shard)?.is_empty() {
                // A writer may have put a file there meanwhile: then the directory stays.
                if storage.remove_dir(shard).is_err() {
                    continue;
                }
                if let Some(tenant_dir) = shard.parent() {
                    storage.sync_dir(tenant_dir).map_err(io_error("fsync directory", tenant_dir))?;
                }
            }
        }
        Ok(tally(SweepKind::Artifact, &candidates, &plan))
    }

    /// Compaction records (`compactions/*.json`), by age since first seen and by bytes.
    fn sweep_records(&mut self, retention: &VolumeRetention, now_ms: u64) -> Result<KindSweep, EngineError> {
        let storage = self.storage.clone();
        let dir = self.journal.dir().join(RECORDS_DIR);
        let mut paths = Vec::new();
        let mut candidates = Vec::new();
        let mut seen = BTreeSet::new();
        for name in list(storage.as_ref(), &dir)? {
            if !name.ends_with(".json") {
                continue;
            }
            let path = dir.join(&name);
            let Some(bytes) = file_len(storage.as_ref(), &path)? else { continue };
            let key = format!("{RECORDS_DIR}/{name}");
            let since = *self.lifecycle.ledger.since.entry(key.clone()).or_insert(now_ms);
            seen.insert(key.clone());
            candidates.push(SweepCandidate { key, bytes, since_ms: since, protected: false });
            paths.push(path);
        }
        self.lifecycle.ledger.since.retain(|key, _| !key.starts_with("compactions/") || seen.contains(key));
        let plan = plan_sweep(&candidates, &retention.compaction_records, now_ms);
        for (index, _) in &plan.doomed {
            remove(storage.as_ref(), &paths[*index])?;
            self.lifecycle.ledger.since.remove(&candidates[*index].key);
        }
        if !plan.doomed.is_empty() {
            storage.sync_dir(&dir).map_err(io_error("fsync directory", &dir))?;
        }
        Ok(tally(SweepKind::CompactionRecord, &candidates, &plan))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::artifacts::ArtifactRef;
    use crate::entry::{Content, Role, ToolResult};
    use crate::lifecycle::KeepLimits;
    use crate::session::{Api, SessionSettings};

    const HOUR_MS: u64 = 3_600_000;

    fn tool_result(text: String) -> Content {
        Content {
            tool_results: vec![ToolResult { call_id: "c".into(), name: None, output: text }],
            ..Content::default()
        }
    }

    fn artifact_kind(report: &SweepReport) -> &KindSweep {
        report.kinds.iter().find(|k| k.kind == SweepKind::Artifact).unwrap()
    }

    #[test]
    fn the_sweep_deletes_expired_orphans_and_never_a_live_reference() {
        let settings = SessionSettings::defaults(Api::OpenAi, 32_000);
        let mut engine = SessionEngine::in_memory(&settings, 0).unwrap();
        let tenant = settings.tenant.clone();
        let live = engine.store().put(&tenant, b"a spilled output the journal still names").unwrap();
        let orphan = engine.store().put(&tenant, b"an output nothing names any more").unwrap();
        engine
            .append_own(&settings, Role::Tool, tool_result(format!("preview\ndata_ref={live}")), 0)
            .unwrap();
        let retention = VolumeRetention {
            artifacts: KeepLimits { max_age_seconds: 3_600, max_bytes: u64::MAX },
            ..VolumeRetention::default()
        };

        let first = engine.sweep_volume(&retention, 0).unwrap();
        assert_eq!(artifact_kind(&first).files_swept, 0, "the orphan's age starts now");
        assert_eq!(engine.lifecycle_ledger().since.len(), 1, "only the orphan is on the clock");
        let later = engine.sweep_volume(&retention, 2 * HOUR_MS).unwrap();
        assert_eq!((artifact_kind(&later).files_swept, artifact_kind(&later).swept_for_age), (1, 1));
        assert_eq!(artifact_kind(&later).files_protected, 1);

        let kept = engine.store().get(&tenant, &live).unwrap();
        assert_eq!(kept, b"a spilled output the journal still names");
        let gone = engine.store().get(&tenant, &orphan).unwrap_err();
        assert!(gone.to_string().contains("expired by retention policy"), "{gone}");
        let never = engine.store().get(&tenant, &ArtifactRef::for_bytes(b"never stored")).unwrap_err();
        assert!(matches!(never, ArtifactError::NotFound { .. }), "{never}");
        assert!(engine.lifecycle_ledger().swept.contains_key(orphan.digest_hex()));

        // Stored again (the same output spilled anew), it reads back and is no longer "expired".
        engine.store().put(&tenant, b"an output nothing names any more").unwrap();
        assert!(engine.store().get(&tenant, &orphan).is_ok());
    }

    /// An engine whose live generation holds `turns` user/assistant pairs of about 1 KiB each.
    fn engine_with_turns(settings: &SessionSettings, turns: usize) -> SessionEngine {
        let mut engine = SessionEngine::in_memory(settings, 0).unwrap();
        for turn in 0..turns {
            let ask =
                Content { text: format!("Question {turn}: {}", "why ".repeat(250)), ..Content::default() };
            engine.append_own(settings, Role::User, ask, turn as u64).unwrap();
            let answer =
                Content { text: format!("Answer {turn}: {}", "because ".repeat(120)), ..Content::default() };
            engine.append_own(settings, Role::Assistant, answer, turn as u64).unwrap();
        }
        engine
    }

    fn live_bytes(engine: &SessionEngine) -> u64 {
        let dir = engine.journal.dir().join(generation_dir_name(engine.journal.generation()));
        dir_bytes(engine.storage.as_ref(), &dir).unwrap()
    }

    /// A live generation over `generations.maxBytes` is never deleted, but it is compacted: the
    /// journal the token trigger never compacts (its context stays small) cannot fill the volume.
    #[test]
    fn a_live_generation_over_its_byte_budget_is_compacted_and_the_old_one_swept() {
        let mut settings = SessionSettings::defaults(Api::OpenAi, 200_000);
        let mut engine = engine_with_turns(&settings, 40);
        let before = live_bytes(&engine);
        settings.volume.generations.max_bytes = before / 2;
        let report = engine.maintain_volume(&settings, HOUR_MS).unwrap();
        let bound = report.live_generation.expect("the live generation was over its budget");
        assert_eq!(bound.action, LiveGenerationAction::Compacted, "{report:?}");
        assert_eq!(bound.over_budget_bytes, before - before / 2);
        assert_eq!(engine.journal.generation(), 2, "a compacted generation is live");
        assert_eq!(report.removed_generations, [1], "the superseded one went at once, by bytes");
        assert!(live_bytes(&engine) < before / 2, "{} of {before} bytes", live_bytes(&engine));

        let calm = engine.maintain_volume(&settings, 2 * HOUR_MS).unwrap();
        assert_eq!(calm.live_generation, None, "within budget now: nothing more to do");
        assert_eq!(engine.journal.generation(), 2);
    }

    /// With a summariser model in the host, the compaction is asked of the host; with nothing the
    /// compaction can remove, the sweep says the budget is too small instead of looping.
    #[test]
    fn an_oversized_live_generation_is_asked_of_the_model_or_reported_when_it_cannot_shrink() {
        let mut settings = SessionSettings::defaults(Api::OpenAi, 200_000);
        settings.model_summarizer = true;
        let mut engine = engine_with_turns(&settings, 40);
        settings.volume.generations.max_bytes = 1;
        let report = engine.maintain_volume(&settings, HOUR_MS).unwrap();
        assert_eq!(report.live_generation.map(|b| b.action), Some(LiveGenerationAction::CompactionAsked));
        let ask = engine.take_compaction_ask().expect("asked of the host");
        assert_eq!(ask.mode, CompactionMode::Budget);
        assert!(ask.reason.contains("generations.maxBytes"), "{}", ask.reason);
        assert_eq!(engine.journal.generation(), 1, "the host compacts, not the sweep");

        settings.model_summarizer = false;
        let mut single = engine_with_turns(&settings, 1);
        let report = single.maintain_volume(&settings, HOUR_MS).unwrap();
        assert_eq!(report.live_generation.map(|b| b.action), Some(LiveGenerationAction::NotCompacted));
        assert_eq!(single.journal.generation(), 1);
    }

    #[test]
    fn a_kept_rollback_target_protects_its_artifacts_until_the_policy_lets_it_go() {
        let settings = SessionSettings::defaults(Api::OpenAi, 32_000);
        let mut engine = SessionEngine::in_memory(&settings, 0).unwrap();
        let tenant = settings.tenant.clone();
        let old = engine.store().put(&tenant, b"an output only the old generation names").unwrap();
        engine.append_own(&settings, Role::Tool, tool_result(format!("data_ref={old}")), 0).unwrap();
        engine.journal.fork(0, "a new conversation", HOUR_MS).unwrap();
        let keep_generations = VolumeRetention {
            artifacts: KeepLimits { max_age_seconds: 60, max_bytes: 0 },
            generations: KeepLimits { max_age_seconds: 24 * 3_600, max_bytes: u64::MAX },
            ..VolumeRetention::default()
        };
        let report = engine.sweep_volume(&keep_generations, 10 * HOUR_MS).unwrap();
        assert_eq!(report.kept_generations, [1]);
        assert_eq!(artifact_kind(&report).files_swept, 0, "a kept rollback target's artifact stays");
        assert!(artifact_kind(&report).over_budget_bytes > 0, "and the report says it holds the budget");
        assert!(engine.store().get(&tenant, &old).is_ok());

        let drop_generations = VolumeRetention {
            generations: KeepLimits { max_age_seconds: 3_600, max_bytes: u64::MAX },
            ..keep_generations
        };
        let report = engine.sweep_volume(&drop_generations, 10 * HOUR_MS).unwrap();
        assert_eq!(report.removed_generations, [1], "superseded 9 hours ago, past its 1 hour");
        assert_eq!(
            artifact_kind(&report).swept_for_bytes,
            1,
            "then its artifact goes over the 0-byte budget"
        );
        assert!(engine.journal().retained_generations().unwrap().is_empty());
        assert!(matches!(engine.store().get(&tenant, &old), Err(ArtifactError::Expired { .. })));
    }
}

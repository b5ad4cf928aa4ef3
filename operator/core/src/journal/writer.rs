//! The single journal writer: open with recovery, append, sync, compaction commits and rollback.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::error::JournalError;
use super::layout::{GenerationOrigin, Layout, Manifest, Watermark};
use super::reader;
use super::record::{self, HEADER_LEN, MAX_PAYLOAD_LEN};
use super::storage::{AppendHandle, LockGuard, LockOutcome, SharedSync, Storage};
use crate::entry::{Entry, EntryDraft, EntryId};

/// A record buffer up to this capacity is kept for the next append: jemalloc's small size classes
/// end at 14 KiB, and a larger buffer comes from fresh pages whichever way it is kept.
const KEPT_FRAME_BYTES: usize = 14 * 1024;

/// When appended entries become durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncPolicy {
    /// Every `append` fsyncs before returning: a returned entry survives any crash.
    EveryAppend,
    /// `append` only writes; entries become durable when `sync` returns, or automatically once
    /// `max_pending` unsynced entries have accumulated (0 disables the automatic sync). Unsynced
    /// entries may be lost at a crash, always as a suffix of the log.
    Batched {
        /// Unsynced entries that trigger an automatic sync (0 = only explicit `sync`).
        max_pending: u64,
    },
}

/// Options for [`Journal::open`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalOptions {
    /// Durability of appends.
    pub sync_policy: SyncPolicy,
    /// Superseded generations to keep for rollback.
    pub retain_generations: usize,
    /// Written into `LOCK` so a refused writer can name the holder.
    pub holder: String,
    /// Time used for a newly created first generation (unix milliseconds).
    pub now_ms: u64,
}

impl JournalOptions {
    /// Options with fsync on every append, two retained generations and a holder description
    /// naming this process.
    pub fn new(description: &str, now_ms: u64) -> Self {
        Self {
            sync_policy: SyncPolicy::EveryAppend,
            retain_generations: 2,
            holder: describe_holder(description),
            now_ms,
        }
    }
}

/// `pid=<pid> host=<hostname> writer=<description>`, the text a writer puts into `LOCK`.
pub fn describe_holder(description: &str) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "unknown".to_owned());
    format!("pid={} host={host} writer={description}", std::process::id())
}

/// A torn final record that recovery cut off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TruncatedTail {
    /// The log file.
    pub path: PathBuf,
    /// The offset the log was truncated to.
    pub offset: u64,
    /// How many bytes were removed.
    pub bytes: u64,
}

/// What [`Journal::open`] found and repaired.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OpenReport {
    /// The current generation.
    pub generation: u64,
    /// Entries in it.
    pub entries: usize,
    /// Their total token count.
    pub total_tokens: u64,
    /// Whether the journal was created by this open.
    pub created: bool,
    /// A torn final record that was truncated.
    pub truncated: Option<TruncatedTail>,
    /// Generations removed: uncommitted ones newer than `CURRENT`, and superseded ones beyond the
    /// retention count.
    pub removed_generations: Vec<u64>,
}

/// What a compaction saw: the generation and how many of its entries (the watermark).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// The generation read.
    pub generation: u64,
    /// How far it was read.
    pub watermark: Watermark,
    /// The entries up to the watermark.
    pub entries: Vec<Entry>,
}

/// One entry of a compaction's new baseline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BaselineEntry {
    /// Keep an entry at or below the watermark verbatim.
    Keep(EntryId),
    /// Keep an entry's ID (and kind) but replace its content, e.g. a tool result moved to an
    /// artifact.
    Rewrite {
        /// The entry replaced.
        id: EntryId,
        /// The new content; its kind must equal the ID's kind.
        draft: EntryDraft,
    },
    /// A new entry, typically a summary, given a fresh ID at commit.
    New(EntryDraft),
}

/// The result of a generation switch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenerationSwitch {
    /// The generation that was current.
    pub from_generation: u64,
    /// The new current generation.
    pub to_generation: u64,
    /// Baseline entries written.
    pub baseline_entries: u64,
    /// Entries carried over.
    pub carried_entries: u64,
    /// Superseded generations deleted by retention.
    pub removed_generations: Vec<u64>,
}

/// The single writer of a journal data directory.
pub struct Journal {
    storage: Arc<dyn Storage>,
    layout: Layout,
    options: JournalOptions,
    _lock: LockGuard,
    manifest: Manifest,
    log: Box<dyn AppendHandle>,
    /// The current generation's log file, the one `log` appends to.
    log_path: PathBuf,
    entries: Vec<Entry>,
    total_tokens: u64,
    next_number: u64,
    unsynced: u64,
    poisoned: Option<String>,
    /// The last appended record's buffer, kept for the next one while it is small (see
    /// [`KEPT_FRAME_BYTES`]).
    frame: Vec<u8>,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("dir", &self.layout.root())
            .field("generation", &self.manifest.generation)
            .field("entries", &self.entries.len())
            .field("next_number", &self.next_number)
            .field("poisoned", &self.poisoned)
            .finish_non_exhaustive()
    }
}

impl Journal {
    /// Opens (creating if needed) the journal in `dir`: takes the writer lock, truncates a torn
    /// final record (reported), refuses any other damage, and removes uncommitted and expired
    /// generations.
    pub fn open(
        storage: Arc<dyn Storage>,
        dir: impl Into<PathBuf>,
        options: JournalOptions,
    ) -> Result<(Self, OpenReport), JournalError> {
        let layout = Layout::new(dir);
        let root = layout.root().to_path_buf();
        let io = JournalError::io;
        storage.create_dir_all(&root).map_err(io("create directory", &root))?;
        if let Some(parent) = root.parent().filter(|p| !p.as_os_str().is_empty()) {
            storage.sync_dir(parent).map_err(io("fsync directory", parent))?;
        }
        let lock_path = layout.lock();
        let lock = match storage.try_lock(&lock_path, &options.holder).map_err(io("lock", &lock_path))? {
            LockOutcome::Acquired(guard) => guard,
            LockOutcome::HeldBy(holder) => {
                return Err(JournalError::Locked { path: lock_path, holder });
            }
        };
        let mut report = OpenReport::default();
        let tmp = layout.current_tmp();
        if storage.exists(&tmp).map_err(io("stat", &tmp))? {
            storage.remove_file(&tmp).map_err(io("remove", &tmp))?;
        }
        let generation = match reader::read_current(storage.as_ref(), &layout)? {
            Some(generation) => generation,
            None => {
                report.created = true;
                initialize(storage.as_ref(), &layout, options.now_ms)?
            }
        };
        let loaded = reader::load_generation(storage.as_ref(), &layout, generation)?;
        let log_path = layout.log(generation);
        if let Some(torn) = loaded.torn {
            storage.truncate(&log_path, torn.offset).map_err(io("truncate", &log_path))?;
            storage.sync_file(&log_path).map_err(io("fsync", &log_path))?;
            report.truncated =
                Some(TruncatedTail { path: log_path.clone(), offset: torn.offset, bytes: torn.bytes });
        }
        let mut next_number = loaded.manifest.next_entry_number;
        for entry in &loaded.entries {
            next_number = next_number.max(entry.id.number() + 1);
        }
        for other in reader::list_generations(storage.as_ref(), &layout)? {
            if other != generation
                && let Ok(manifest) = reader::read_manifest(storage.as_ref(), &layout, other)
            {
                next_number = next_number.max(manifest.next_entry_number);
            }
        }
        let log = storage.open_append(&log_path).map_err(io("open", &log_path))?;
        let total_tokens = loaded.entries.iter().map(|entry| entry.tokens).sum();
        let mut journal = Journal {
            storage,
            layout,
            options,
            _lock: lock,
            manifest: loaded.manifest,
            log,
            log_path,
            entries: loaded.entries,
            total_tokens,
            next_number,
            unsynced: 0,
            poisoned: None,
            frame: Vec::new(),
        };
        report.removed_generations = journal.collect_garbage()?;
        report.generation = generation;
        report.entries = journal.entries.len();
        report.total_tokens = journal.total_tokens;
        Ok((journal, report))
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        self.layout.root()
    }

    /// The storage this journal runs on.
    pub(crate) fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }

    /// The log file of the current generation. A process that appended with
    /// [`SyncPolicy::Batched`] may fsync this path itself to make its appends durable without
    /// holding the writer (group commit); [`Journal::log_sync`] does so without opening it.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// A handle that fsyncs the current log from any thread (group commit), when the storage
    /// offers one.
    pub fn log_sync(&self) -> Option<Arc<dyn SharedSync>> {
        self.log.shared_sync()
    }

    /// The current generation number.
    pub fn generation(&self) -> u64 {
        self.manifest.generation
    }

    /// The current generation's manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The entries of the current generation, including appended-but-unsynced ones.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Whether the in-memory list of entries is close to reallocating (see [`crate::room_ahead`]).
    pub fn room_low(&self) -> bool {
        crate::room_ahead::is_low(&self.entries)
    }

    /// Grows the in-memory list of entries ahead of need when its room is low; returns whether it grew.
    pub fn make_room(&mut self) -> bool {
        crate::room_ahead::make(&mut self.entries)
    }

    /// Sum of the stored token counts of [`Journal::entries`].
    pub fn total_tokens(&self) -> u64 {
        self.total_tokens
    }

    /// The counter value the next appended entry will get.
    pub fn next_entry_number(&self) -> u64 {
        self.next_number
    }

    /// Whether an earlier failure poisoned the writer.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned.is_some()
    }

    fn check_poison(&self) -> Result<(), JournalError> {
        match &self.poisoned {
            Some(cause) => Err(JournalError::Poisoned { cause: cause.clone() }),
            None => Ok(()),
        }
    }

    /// Poisons the writer when `result` is an error; I/O state after a failed write or fsync is
    /// unknown, so the only safe continuation is to reopen.
    fn poison_on_error<T>(&mut self, result: Result<T, JournalError>) -> Result<T, JournalError> {
        if let Err(error) = &result {
            self.poisoned = Some(error.to_string());
        }
        result
    }

    fn encode(&self, entry: &Entry) -> Result<Vec<u8>, JournalError> {
        let mut payload = Vec::new();
        self.encode_after(entry, &mut payload)?;
        Ok(payload)
    }

    /// Appends `entry`'s payload to `out`, refusing one over the record limit (then `out` holds
    /// only what it held before).
    fn encode_after(&self, entry: &Entry, out: &mut Vec<u8>) -> Result<(), JournalError> {
        let encode_error =
            |reason: String| JournalError::Encode { path: self.log_path.clone(), id: entry.id, reason };
        let start = out.len();
        serde_json::to_writer(&mut *out, entry).map_err(|error| encode_error(error.to_string()))?;
        let payload_len = out.len() - start;
        if payload_len > MAX_PAYLOAD_LEN {
            out.truncate(start);
            return Err(encode_error(format!(
                "{payload_len} bytes exceed the record limit of {MAX_PAYLOAD_LEN}"
            )));
        }
        Ok(())
    }

    /// `entry` framed as a record in `frame` (its earlier bytes replaced): the payload is written
    /// once, after room for the prefix, instead of being encoded and then copied into a frame.
    fn encode_frame_into(&self, entry: &Entry, frame: &mut Vec<u8>) -> Result<(), JournalError> {
        record::start_frame(frame);
        self.encode_after(entry, frame)?;
        record::seal_frame(frame);
        Ok(())
    }

    /// Assigns the next ID, appends the entry, and syncs according to the policy. The entry is
    /// durable when this returns under [`SyncPolicy::EveryAppend`], otherwise after `sync`.
    pub fn append(&mut self, draft: EntryDraft) -> Result<Entry, JournalError> {
        self.append_kept(draft).cloned()
    }

    /// [`Journal::append`] without a copy: the entry is moved into the journal's list and
    /// returned by reference.
    pub fn append_kept(&mut self, draft: EntryDraft) -> Result<&Entry, JournalError> {
        self.check_poison()?;
        let entry = draft.into_entry(self.next_number);
        let mut frame = std::mem::take(&mut self.frame);
        self.encode_frame_into(&entry, &mut frame)?;
        let written = self.log.append(&frame).map_err(JournalError::io("append", &self.log_path));
        if frame.capacity() <= KEPT_FRAME_BYTES {
            self.frame = frame;
        }
        self.poison_on_error(written)?;
        self.next_number += 1;
        self.total_tokens += entry.tokens;
        let kept_at = self.entries.len();
        self.entries.push(entry);
        self.unsynced += 1;
        let sync_now = match self.options.sync_policy {
            SyncPolicy::EveryAppend => true,
            SyncPolicy::Batched { max_pending } => max_pending > 0 && self.unsynced >= max_pending,
        };
        if sync_now {
            self.sync()?;
        }
        Ok(&self.entries[kept_at])
    }

    /// Makes every appended entry durable. A failure poisons the writer (fsync is never retried).
    pub fn sync(&mut self) -> Result<(), JournalError> {
        self.check_poison()?;
        if self.unsynced == 0 {
            return Ok(());
        }
        let synced = self.log.sync().map_err(JournalError::io("fsync", &self.log_path));
        self.poison_on_error(synced)?;
        self.unsynced = 0;
        Ok(())
    }

    /// Captures the current generation and watermark for a compaction.
    pub fn begin_compaction(&self) -> Result<Snapshot, JournalError> {
        self.check_poison()?;
        Ok(Snapshot {
            generation: self.manifest.generation,
            watermark: Watermark {
                entries: self.entries.len() as u64,
                last_id: self.entries.last().map(|entry| entry.id),
            },
            entries: self.entries.clone(),
        })
    }

    /// Commits a compaction: a new generation holding `baseline` followed by every entry appended
    /// after the snapshot's watermark, switched to atomically via `CURRENT`.
    pub fn commit_generation(
        &mut self,
        snapshot: &Snapshot,
        baseline: Vec<BaselineEntry>,
        now_ms: u64,
    ) -> Result<GenerationSwitch, JournalError> {
        self.check_poison()?;
        self.commit_compaction(snapshot.generation, snapshot.watermark, baseline, now_ms)
    }

    pub(crate) fn commit_compaction(
        &mut self,
        generation: u64,
        watermark: Watermark,
        baseline: Vec<BaselineEntry>,
        now_ms: u64,
    ) -> Result<GenerationSwitch, JournalError> {
        let stale = || JournalError::StaleSnapshot {
            path: self.layout.root().to_path_buf(),
            snapshot: generation,
            watermark: watermark.entries,
            current: self.manifest.generation,
            entries: self.entries.len() as u64,
        };
        let seen = usize::try_from(watermark.entries).map_err(|_| stale())?;
        if generation != self.manifest.generation
            || seen > self.entries.len()
            || self.entries[..seen].last().map(|entry| entry.id) != watermark.last_id
        {
            return Err(stale());
        }
        let bad = |id: EntryId, reason| JournalError::BadBaseline {
            path: self.layout.root().to_path_buf(),
            id,
            reason,
        };
        let visible: HashMap<EntryId, &Entry> =
            self.entries[..seen].iter().map(|entry| (entry.id, entry)).collect();
        let mut used = HashSet::new();
        let mut next_number = self.next_number;
        let mut new_entries = Vec::with_capacity(baseline.len() + self.entries.len() - seen);
        for item in baseline {
            let entry = match item {
                BaselineEntry::Keep(id) => {
                    let kept = visible.get(&id).ok_or_else(|| bad(id, "not at or below the watermark"))?;
                    (*kept).clone()
                }
                BaselineEntry::Rewrite { id, draft } => {
                    if !visible.contains_key(&id) {
                        return Err(bad(id, "not at or below the watermark"));
                    }
                    if draft.kind != id.kind() {
                        return Err(bad(id, "rewrite changes the entry kind"));
                    }
                    draft.into_entry(id.number())
                }
                BaselineEntry::New(draft) => {
                    next_number += 1;
                    draft.into_entry(next_number - 1)
                }
            };
            if !used.insert(entry.id) {
                return Err(bad(entry.id, "appears twice in the baseline"));
            }
            new_entries.push(entry);
        }
        let baseline_count = new_entries.len() as u64;
        new_entries.extend_from_slice(&self.entries[seen..]);
        let mut payloads = Vec::with_capacity(new_entries.len());
        for entry in &new_entries {
            payloads.push(self.encode(entry)?);
        }
        let carried = (self.entries.len() - seen) as u64;
        let origin = GenerationOrigin::Compaction { watermark, carried_entries: carried };
        let result =
            self.switch_generation(origin, now_ms, baseline_count, next_number, payloads, new_entries);
        self.poison_on_error(result)
    }

    /// Restores a retained generation as a new generation: its entries byte-identical, followed by
    /// every entry appended since (from the current and intermediate generations) whose ID is
    /// newer than all of the target's. IDs are never reused.
    pub fn rollback(&mut self, to_generation: u64, now_ms: u64) -> Result<GenerationSwitch, JournalError> {
        self.check_poison()?;
        if !self.retained_generations()?.contains(&to_generation) {
            return Err(JournalError::GenerationNotRetained {
                path: self.layout.root().to_path_buf(),
                generation: to_generation,
            });
        }
        let target = reader::load_generation(self.storage.as_ref(), &self.layout, to_generation)?;
        let newest_in_target = target.entries.iter().map(|entry| entry.id.number()).max();
        let is_newer = |entry: &Entry| newest_in_target.is_none_or(|newest| entry.id.number() > newest);
        let mut carried: BTreeMap<u64, Entry> = BTreeMap::new();
        for generation in self.retained_generations()? {
            if generation <= to_generation {
                continue;
            }
            let loaded = reader::load_generation(self.storage.as_ref(), &self.layout, generation)?;
            collect_live(&loaded.manifest, &loaded.entries, &is_newer, &mut carried);
        }
        collect_live(&self.manifest, &self.entries, &is_newer, &mut carried);
        let mut payloads: Vec<Vec<u8>> =
            (0..target.entries.len()).map(|index| target.payload(index).to_vec()).collect();
        let carried_count = carried.len() as u64;
        let baseline_count = target.entries.len() as u64;
        let mut new_entries = target.entries;
        for entry in carried.into_values() {
            payloads.push(self.encode(&entry)?);
            new_entries.push(entry);
        }
        let origin =
            GenerationOrigin::Rollback { target_generation: to_generation, carried_entries: carried_count };
        let next_number = self.next_number;
        let result =
            self.switch_generation(origin, now_ms, baseline_count, next_number, payloads, new_entries);
        self.poison_on_error(result)
    }

    /// Rewinds to the first `keep` entries of the current generation as a new generation (their
    /// records byte-identical), dropping the entries after them; see `FORMAT.md`, "Fork".
    pub fn fork(&mut self, keep: usize, reason: &str, now_ms: u64) -> Result<GenerationSwitch, JournalError> {
        self.check_poison()?;
        let keep = keep.min(self.entries.len());
        let mut payloads = Vec::with_capacity(keep);
        for entry in &self.entries[..keep] {
            payloads.push(self.encode(entry)?);
        }
        let origin = GenerationOrigin::Fork {
            kept_entries: keep as u64,
            dropped_entries: (self.entries.len() - keep) as u64,
            reason: reason.to_owned(),
        };
        let entries = self.entries[..keep].to_vec();
        let next_number = self.next_number;
        let result = self.switch_generation(origin, now_ms, keep as u64, next_number, payloads, entries);
        self.poison_on_error(result)
    }

    /// Deletes the superseded generation `generation` (the artifact sweeper's age and byte limits);
    /// the current generation is refused. Durable when it returns.
    pub fn remove_superseded_generation(&mut self, generation: u64) -> Result<(), JournalError> {
        self.check_poison()?;
        if generation >= self.manifest.generation || !self.retained_generations()?.contains(&generation) {
            return Err(JournalError::GenerationNotRetained {
                path: self.layout.root().to_path_buf(),
                generation,
            });
        }
        let result = remove_generation(self.storage.as_ref(), &self.layout, generation)
            .and_then(|()| sync_dir(self.storage.as_ref(), self.layout.root()));
        self.poison_on_error(result)
    }

    /// Superseded generations still on disk (with a manifest), ascending.
    pub fn retained_generations(&self) -> Result<Vec<u64>, JournalError> {
        let mut retained = Vec::new();
        for generation in reader::list_generations(self.storage.as_ref(), &self.layout)? {
            let manifest = self.layout.manifest(generation);
            if generation < self.manifest.generation
                && self.storage.exists(&manifest).map_err(JournalError::io("stat", &manifest))?
            {
                retained.push(generation);
            }
        }
        Ok(retained)
    }

    /// Writes a complete new generation, makes it durable, then atomically points `CURRENT` at it
    /// and applies retention.
    fn switch_generation(
        &mut self,
        origin: GenerationOrigin,
        now_ms: u64,
        baseline_entries: u64,
        next_number: u64,
        payloads: Vec<Vec<u8>>,
        entries: Vec<Entry>,
    ) -> Result<GenerationSwitch, JournalError> {
        self.sync()?;
        let from_generation = self.manifest.generation;
        let existing = reader::list_generations(self.storage.as_ref(), &self.layout)?;
        let generation = existing.last().copied().unwrap_or(0).max(from_generation) + 1;
        let carried_entries = entries.len() as u64 - baseline_entries;
        let manifest = Manifest {
            format_version: record::FORMAT_VERSION,
            generation,
            parent_generation: Some(from_generation),
            created_at_ms: now_ms,
            next_entry_number: next_number,
            baseline_entries,
            origin,
        };
        write_generation(self.storage.as_ref(), &self.layout, &manifest, &payloads)?;
        write_current(self.storage.as_ref(), &self.layout, generation)?;
        let log_path = self.layout.log(generation);
        self.log = self.storage.open_append(&log_path).map_err(JournalError::io("open", &log_path))?;
        self.log_path = log_path;
        self.manifest = manifest;
        self.total_tokens = entries.iter().map(|entry| entry.tokens).sum();
        self.entries = entries;
        self.next_number = next_number;
        self.unsynced = 0;
        let removed_generations = self.collect_garbage()?;
        Ok(GenerationSwitch {
            from_generation,
            to_generation: generation,
            baseline_entries,
            carried_entries,
            removed_generations,
        })
    }

    /// Removes generations newer than the current one (never committed) and superseded ones
    /// beyond `retain_generations`.
    fn collect_garbage(&mut self) -> Result<Vec<u64>, JournalError> {
        let current = self.manifest.generation;
        let generations = reader::list_generations(self.storage.as_ref(), &self.layout)?;
        let older: Vec<u64> = generations.iter().copied().filter(|g| *g < current).collect();
        let expired = older.len().saturating_sub(self.options.retain_generations);
        let doomed: Vec<u64> = older[..expired]
            .iter()
            .copied()
            .chain(generations.iter().copied().filter(|g| *g > current))
            .collect();
        if doomed.is_empty() {
            return Ok(doomed);
        }
        let result = doomed
            .iter()
            .try_for_each(|generation| remove_generation(self.storage.as_ref(), &self.layout, *generation))
            .and_then(|()| sync_dir(self.storage.as_ref(), self.layout.root()));
        self.poison_on_error(result)?;
        Ok(doomed)
    }
}

fn collect_live(
    manifest: &Manifest,
    entries: &[Entry],
    is_newer: &impl Fn(&Entry) -> bool,
    carried: &mut BTreeMap<u64, Entry>,
) {
    let baseline = usize::try_from(manifest.baseline_entries).unwrap_or(usize::MAX);
    for entry in entries.iter().skip(baseline).filter(|entry| is_newer(entry)) {
        carried.entry(entry.id.number()).or_insert_with(|| entry.clone());
    }
}

fn sync_dir(storage: &dyn Storage, dir: &Path) -> Result<(), JournalError> {
    storage.sync_dir(dir).map_err(JournalError::io("fsync directory", dir))
}

/// Creates the first generation, discarding an initialisation that crashed before `CURRENT`.
fn initialize(storage: &dyn Storage, layout: &Layout, now_ms: u64) -> Result<u64, JournalError> {
    let existing = reader::list_generations(storage, layout)?;
    match existing.as_slice() {
        [] => {}
        [1] => {
            let log = layout.log(1);
            let has_records = storage.exists(&log).map_err(JournalError::io("stat", &log))?
                && storage.read(&log).map_err(JournalError::io("read", &log))?.len() > HEADER_LEN;
            if has_records {
                return Err(JournalError::BadCurrent {
                    path: layout.current(),
                    reason: "missing while generation 1 holds records".into(),
                });
            }
            remove_generation(storage, layout, 1)?;
        }
        _ => {
            return Err(JournalError::BadCurrent {
                path: layout.current(),
                reason: format!("missing while generations {existing:?} exist"),
            });
        }
    }
    let manifest = Manifest {
        format_version: record::FORMAT_VERSION,
        generation: 1,
        parent_generation: None,
        created_at_ms: now_ms,
        next_entry_number: 1,
        baseline_entries: 0,
        origin: GenerationOrigin::Initial,
    };
    write_generation(storage, layout, &manifest, &[])?;
    write_current(storage, layout, 1)?;
    Ok(1)
}

/// Writes and fsyncs a generation's log and manifest, then its directory and the data directory.
fn write_generation(
    storage: &dyn Storage,
    layout: &Layout,
    manifest: &Manifest,
    payloads: &[Vec<u8>],
) -> Result<(), JournalError> {
    let io = JournalError::io;
    let generation = manifest.generation;
    let dir = layout.generation_dir(generation);
    storage.create_dir_all(&dir).map_err(io("create directory", &dir))?;
    let total: usize = payloads.iter().map(|p| p.len() + record::FRAME_PREFIX_LEN).sum();
    let mut log = Vec::with_capacity(HEADER_LEN + total);
    log.extend_from_slice(&record::encode_header(generation));
    for payload in payloads {
        record::encode_frame(payload, &mut log);
    }
    let log_path = layout.log(generation);
    storage.write_file(&log_path, &log).map_err(io("write", &log_path))?;
    storage.sync_file(&log_path).map_err(io("fsync", &log_path))?;
    let manifest_path = layout.manifest(generation);
    let manifest_bytes = serde_json::to_vec_pretty(manifest).map_err(|error| JournalError::BadManifest {
        path: manifest_path.clone(),
        reason: error.to_string(),
    })?;
    storage.write_file(&manifest_path, &manifest_bytes).map_err(io("write", &manifest_path))?;
    storage.sync_file(&manifest_path).map_err(io("fsync", &manifest_path))?;
    sync_dir(storage, &dir)?;
    sync_dir(storage, layout.root())
}

/// Atomically points `CURRENT` at `generation`: write and fsync `CURRENT.tmp`, rename, fsync the
/// data directory.
fn write_current(storage: &dyn Storage, layout: &Layout, generation: u64) -> Result<(), JournalError> {
    let io = JournalError::io;
    let tmp = layout.current_tmp();
    let current = layout.current();
    storage.write_file(&tmp, &reader::current_contents(generation)).map_err(io("write", &tmp))?;
    storage.sync_file(&tmp).map_err(io("fsync", &tmp))?;
    storage.rename(&tmp, &current).map_err(io("rename", &current))?;
    sync_dir(storage, layout.root())
}

/// Deletes a generation directory: the manifest first (made durable, so a half-deleted generation
/// is never mistaken for a retained one), then everything else.
fn remove_generation(storage: &dyn Storage, layout: &Layout, generation: u64) -> Result<(), JournalError> {
    let io = JournalError::io;
    let dir = layout.generation_dir(generation);
    let manifest = layout.manifest(generation);
    if storage.exists(&manifest).map_err(io("stat", &manifest))? {
        storage.remove_file(&manifest).map_err(io("remove", &manifest))?;
        sync_dir(storage, &dir)?;
    }
    for name in storage.list_dir(&dir).map_err(io("list", &dir))? {
        let path = dir.join(name);
        storage.remove_file(&path).map_err(io("remove", &path))?;
    }
    storage.remove_dir(&dir).map_err(io("remove directory", &dir))
}

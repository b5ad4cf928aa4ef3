//! Read-only access to a journal: loading generations for the writer, and the offline reader.

use std::ops::Range;
use std::path::Path;

use super::error::JournalError;
use super::layout::{Layout, Manifest, generation_dir_name, parse_generation_dir_name};
use super::record::{self, ScanError, TornTail};
use super::storage::Storage;
use crate::entry::Entry;

/// A generation as read from disk.
#[derive(Debug, Clone)]
pub(crate) struct LoadedGeneration {
    pub manifest: Manifest,
    pub entries: Vec<Entry>,
    pub raw: Vec<u8>,
    pub payloads: Vec<Range<usize>>,
    pub torn: Option<TornTail>,
}

impl LoadedGeneration {
    pub(crate) fn payload(&self, index: usize) -> &[u8] {
        self.payloads.get(index).and_then(|range| self.raw.get(range.clone())).unwrap_or_default()
    }
}

/// Reads `CURRENT`; `None` when it does not exist.
pub(crate) fn read_current(storage: &dyn Storage, layout: &Layout) -> Result<Option<u64>, JournalError> {
    let path = layout.current();
    if !storage.exists(&path).map_err(JournalError::io("stat", &path))? {
        return Ok(None);
    }
    let bytes = storage.read(&path).map_err(JournalError::io("read", &path))?;
    let text = std::str::from_utf8(&bytes)
        .map_err(|_| JournalError::BadCurrent { path: path.clone(), reason: "not UTF-8".into() })?;
    let name = text.strip_suffix('\n').unwrap_or(text);
    parse_generation_dir_name(name).map(Some).ok_or_else(|| JournalError::BadCurrent {
        path,
        reason: format!("{name:?} is not a generation directory name"),
    })
}

/// The bytes written into `CURRENT` for a generation.
pub(crate) fn current_contents(generation: u64) -> Vec<u8> {
    format!("{}\n", generation_dir_name(generation)).into_bytes()
}

/// Generation numbers of every generation directory, ascending.
pub(crate) fn list_generations(storage: &dyn Storage, layout: &Layout) -> Result<Vec<u64>, JournalError> {
    let root = layout.root();
    let mut generations: Vec<u64> = storage
        .list_dir(root)
        .map_err(JournalError::io("list", root))?
        .iter()
        .filter_map(|name| parse_generation_dir_name(name))
        .collect();
    generations.sort_unstable();
    Ok(generations)
}

/// Reads and validates a generation's manifest.
pub(crate) fn read_manifest(
    storage: &dyn Storage,
    layout: &Layout,
    generation: u64,
) -> Result<Manifest, JournalError> {
    let path = layout.manifest(generation);
    let bytes = storage.read(&path).map_err(JournalError::io("read", &path))?;
    let manifest: Manifest = serde_json::from_slice(&bytes)
        .map_err(|error| JournalError::BadManifest { path: path.clone(), reason: error.to_string() })?;
    if manifest.generation != generation {
        return Err(JournalError::BadManifest {
            path,
            reason: format!("names generation {}", manifest.generation),
        });
    }
    if manifest.format_version != record::FORMAT_VERSION {
        return Err(JournalError::BadManifest {
            path,
            reason: format!("unsupported format version {}", manifest.format_version),
        });
    }
    Ok(manifest)
}

/// Reads a generation's manifest and log, decoding every intact record. A torn tail is returned,
/// not repaired.
pub(crate) fn load_generation(
    storage: &dyn Storage,
    layout: &Layout,
    generation: u64,
) -> Result<LoadedGeneration, JournalError> {
    let manifest = read_manifest(storage, layout, generation)?;
    let path = layout.log(generation);
    let raw = storage.read(&path).map_err(JournalError::io("read", &path))?;
    let scanned = record::scan(&raw, generation).map_err(|error| match error {
        ScanError::BadHeader(reason) => JournalError::BadHeader { path: path.clone(), reason },
        ScanError::Corrupt { offset, reason } => {
            JournalError::CorruptRecord { path: path.clone(), offset, reason }
        }
    })?;
    let mut entries = Vec::with_capacity(scanned.payloads.len());
    for (range, offset) in scanned.payloads.iter().zip(&scanned.offsets) {
        let entry: Entry =
            serde_json::from_slice(&raw[range.clone()]).map_err(|error| JournalError::CorruptRecord {
                path: path.clone(),
                offset: *offset,
                reason: format!("checksum-valid record is not an entry: {error}"),
            })?;
        entries.push(entry);
    }
    Ok(LoadedGeneration { manifest, entries, raw, payloads: scanned.payloads, torn: scanned.torn })
}

/// A read-only view of one generation, for tools and out-of-process compaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalView {
    /// The generation read.
    pub generation: u64,
    /// Its manifest.
    pub manifest: Manifest,
    /// Its intact entries.
    pub entries: Vec<Entry>,
    /// Sum of the entries' stored token counts.
    pub total_tokens: u64,
    /// A torn final record, left in place (the reader never modifies the journal).
    pub torn_tail: Option<TornTail>,
}

/// Reads the current generation without taking the writer lock and without repairing anything.
pub fn read_current_generation(storage: &dyn Storage, dir: &Path) -> Result<JournalView, JournalError> {
    let layout = Layout::new(dir);
    let generation = read_current(storage, &layout)?
        .ok_or_else(|| JournalError::BadCurrent { path: layout.current(), reason: "missing".into() })?;
    read_generation(storage, dir, generation)
}

/// Reads one generation (current or retained) without taking the writer lock.
pub fn read_generation(
    storage: &dyn Storage,
    dir: &Path,
    generation: u64,
) -> Result<JournalView, JournalError> {
    let layout = Layout::new(dir);
    let loaded = load_generation(storage, &layout, generation)?;
    let total_tokens = loaded.entries.iter().map(|entry| entry.tokens).sum();
    Ok(JournalView {
        generation,
        manifest: loaded.manifest,
        entries: loaded.entries,
        total_tokens,
        torn_tail: loaded.torn,
    })
}

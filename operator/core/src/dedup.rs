//! Deduplication of repeated tool outputs: a later identical output becomes a reference to the first.
//!
//! Two tool-result entries are identical when the SHA-256 of their outputs is equal. The digest
//! covers every output of the entry in order, each prefixed by its byte length (u64 LE), so an
//! entry with parallel results matches only an entry with the same results. Only entries whose
//! outputs total at least [`MIN_DEDUP_CHARS`] characters are considered: replacing a short output
//! such as `ok` with a reference saves nothing and loses clarity. The duplicate's window text
//! becomes [`render_duplicate`] of the earliest entry with that output.
//!
//! [`DedupIndex`] is the incremental form: [`DedupIndex::observe`] is called once per appended
//! entry and costs one hash of that entry's outputs, independent of history length.

use std::collections::HashMap;

use sha2::{Digest, Sha256};

use crate::entry::{Entry, EntryId};

/// Outputs shorter than this many characters (all outputs of the entry together) are never
/// deduplicated.
pub const MIN_DEDUP_CHARS: usize = 200;

/// A later entry whose tool output repeats an earlier one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Duplicate {
    /// The repeating entry.
    pub later: EntryId,
    /// The earliest entry with the same output.
    pub original: EntryId,
}

/// First occurrences of tool outputs seen so far, by output digest.
#[derive(Debug, Clone)]
pub struct DedupIndex {
    first_by_digest: HashMap<[u8; 32], EntryId>,
    original_of: HashMap<EntryId, EntryId>,
    /// Off, the index finds no duplicates (`strata replay --sweep` prices deduplication off).
    enabled: bool,
}

impl Default for DedupIndex {
    fn default() -> Self {
        Self::new()
    }
}

impl DedupIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::with_enabled(true)
    }

    /// An empty index that finds duplicates only when `enabled`.
    pub fn with_enabled(enabled: bool) -> Self {
        Self { first_by_digest: HashMap::new(), original_of: HashMap::new(), enabled }
    }

    /// Forgets every output observed, keeping whether the index is enabled.
    pub fn clear(&mut self) {
        self.first_by_digest.clear();
        self.original_of.clear();
    }

    /// Records `entry` (appended after every entry observed before) and returns the earliest
    /// entry it duplicates, if any. Entries without tool results or with short outputs are ignored.
    pub fn observe(&mut self, entry: &Entry) -> Option<EntryId> {
        if !self.enabled {
            return None;
        }
        let digest = output_digest(entry)?;
        match self.first_by_digest.get(&digest) {
            Some(&original) if original != entry.id => {
                self.original_of.insert(entry.id, original);
                Some(original)
            }
            Some(_) => None,
            None => {
                self.first_by_digest.insert(digest, entry.id);
                None
            }
        }
    }

    /// The earliest entry that `later` duplicates, if it was observed as a duplicate.
    pub fn original_of(&self, later: &EntryId) -> Option<EntryId> {
        self.original_of.get(later).copied()
    }

    /// Number of duplicates found so far.
    pub fn duplicate_count(&self) -> usize {
        self.original_of.len()
    }
}

/// The digest of `entry`'s outputs, or `None` when it has none or they are below the threshold.
fn output_digest(entry: &Entry) -> Option<[u8; 32]> {
    let results = &entry.content.tool_results;
    let chars: usize = results.iter().map(|result| result.output.chars().count()).sum();
    if results.is_empty() || chars < MIN_DEDUP_CHARS {
        return None;
    }
    let mut hasher = Sha256::new();
    for result in results {
        hasher.update((result.output.len() as u64).to_le_bytes());
        hasher.update(result.output.as_bytes());
    }
    Some(hasher.finalize().into())
}

/// Every duplicate in `entries`, in sequence order, each pointing at the earliest original.
pub fn find_duplicates(entries: &[Entry]) -> Vec<Duplicate> {
    let mut index = DedupIndex::new();
    entries
        .iter()
        .filter_map(|entry| index.observe(entry).map(|original| Duplicate { later: entry.id, original }))
        .collect()
}

/// The window text that replaces a duplicated output: the earlier entry, and the artifacts that
/// hold the output byte-exact, so the reference still opens once that entry left the window
/// (expired, purged or compacted).
pub fn render_duplicate(original: EntryId, data_refs: &[crate::artifacts::ArtifactRef]) -> String {
    if data_refs.is_empty() {
        return format!("[identical to the output of {original}]");
    }
    let refs: Vec<String> = data_refs.iter().map(ToString::to_string).collect();
    format!("[identical to the output of {original}; data_ref {}]", refs.join(", "))
}

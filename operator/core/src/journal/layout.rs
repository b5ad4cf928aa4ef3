//! Names and paths inside a journal data directory, and the per-generation manifest.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::entry::EntryId;

/// The pointer file naming the current generation.
pub const CURRENT: &str = "CURRENT";
/// The temporary pointer written before the atomic rename over `CURRENT`.
pub const CURRENT_TMP: &str = "CURRENT.tmp";
/// The writer lock file.
pub const LOCK: &str = "LOCK";
/// A generation's append-only log.
pub const LOG: &str = "journal.log";
/// A generation's manifest.
pub const MANIFEST: &str = "manifest.json";

/// Directory name of a generation, e.g. `gen-000003`.
pub fn generation_dir_name(generation: u64) -> String {
    format!("gen-{generation:06}")
}

/// Parses a generation directory name (inverse of [`generation_dir_name`]).
pub fn parse_generation_dir_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("gen-")?;
    if digits.len() < 6 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let generation: u64 = digits.parse().ok()?;
    (generation_dir_name(generation) == name).then_some(generation)
}

/// Paths of one data directory.
#[derive(Debug, Clone)]
pub struct Layout {
    root: PathBuf,
}

impl Layout {
    /// Layout rooted at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The data directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `CURRENT`.
    pub fn current(&self) -> PathBuf {
        self.root.join(CURRENT)
    }

    /// `CURRENT.tmp`.
    pub fn current_tmp(&self) -> PathBuf {
        self.root.join(CURRENT_TMP)
    }

    /// `LOCK`.
    pub fn lock(&self) -> PathBuf {
        self.root.join(LOCK)
    }

    /// A generation directory.
    pub fn generation_dir(&self, generation: u64) -> PathBuf {
        self.root.join(generation_dir_name(generation))
    }

    /// A generation's log.
    pub fn log(&self, generation: u64) -> PathBuf {
        self.generation_dir(generation).join(LOG)
    }

    /// A generation's manifest.
    pub fn manifest(&self, generation: u64) -> PathBuf {
        self.generation_dir(generation).join(MANIFEST)
    }
}

/// How far a compaction read: the number of entries of the generation it saw, and the last ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Watermark {
    /// Entries of the source generation at or below the watermark.
    pub entries: u64,
    /// ID of the last of those entries.
    pub last_id: Option<EntryId>,
}

/// How a generation came to be.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum GenerationOrigin {
    /// The first generation of a new journal.
    Initial,
    /// A compaction of the parent generation up to `watermark`; the parent's entries after the
    /// watermark (`carried_entries` of them) follow the baseline in this generation's log.
    Compaction {
        /// What the compaction read.
        watermark: Watermark,
        /// Entries carried over from after the watermark.
        carried_entries: u64,
    },
    /// A rollback to `target_generation`: its entries, byte-identical, then `carried_entries`
    /// entries appended since.
    Rollback {
        /// The generation restored.
        target_generation: u64,
        /// Entries carried over.
        carried_entries: u64,
    },
    /// A rewind of the parent generation to its first `kept_entries` entries (byte-identical),
    /// dropping the `dropped_entries` after them: a transparent-mode client's conversation
    /// diverged from the journal (an edited or retried turn, a new conversation, a client-side
    /// compaction).
    Fork {
        /// Entries of the parent kept.
        kept_entries: u64,
        /// Entries of the parent dropped.
        dropped_entries: u64,
        /// Why the journal was rewound.
        reason: String,
    },
}

/// `manifest.json` of a generation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Format version of the log (see `record::FORMAT_VERSION`).
    pub format_version: u32,
    /// This generation's number.
    pub generation: u64,
    /// The generation that was current when this one was created.
    pub parent_generation: Option<u64>,
    /// Creation time in unix milliseconds, supplied by the caller.
    pub created_at_ms: u64,
    /// The entry counter when this generation was created: every ID allocated before is below it.
    pub next_entry_number: u64,
    /// How many leading entries of the log are baseline (written at creation); entries after them
    /// were appended by the agent, directly or carried over.
    pub baseline_entries: u64,
    /// How this generation was created.
    pub origin: GenerationOrigin,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_names_round_trip_and_reject_noise() {
        assert_eq!(generation_dir_name(3), "gen-000003");
        assert_eq!(parse_generation_dir_name("gen-000003"), Some(3));
        assert_eq!(parse_generation_dir_name("gen-1234567"), Some(1_234_567));
        for bad in ["gen-3", "gen-0000003", "gen-00000x", "CURRENT", "gen-"] {
            assert_eq!(parse_generation_dir_name(bad), None, "{bad}");
        }
    }
}

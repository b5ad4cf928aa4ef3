//! Why a compaction could not run or commit; in every case the journal is unchanged.

use std::path::PathBuf;

use crate::artifacts::ArtifactError;
use crate::journal::JournalError;
use crate::purge::PurgeError;

/// A compaction, purge or rollback that did not happen.
#[derive(Debug, thiserror::Error)]
pub enum CompactionError {
    /// The journal refused (locked, stale snapshot, I/O, generation not retained …).
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// Archiving the removed entries failed.
    #[error("archiving the removed entries: {0}")]
    Archive(#[from] ArtifactError),
    /// The purge request is invalid or failed.
    #[error(transparent)]
    Purge(#[from] PurgeError),
    /// The state could not be encoded.
    #[error("encoding the compacted state: {0}")]
    Encode(#[from] serde_json::Error),
    /// The generation that became CURRENT is not the one this compaction proposed.
    #[error(
        "{path}: generation {generation} is CURRENT but was not produced by this compaction ({reason}); the proposal was discarded as stale — run the compaction again"
    )]
    NotOurs {
        /// The data directory.
        path: PathBuf,
        /// The generation found.
        generation: u64,
        /// What does not match.
        reason: String,
    },
    /// Writing the record beside the journal failed.
    #[error("writing the compaction record {path}: {source}")]
    Record {
        /// The record file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

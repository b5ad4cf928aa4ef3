//! The journal's error type: every variant names the file (and byte offset) involved.

use std::io;
use std::path::{Path, PathBuf};

use crate::entry::EntryId;

/// Everything that can go wrong in the journal.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// An I/O operation failed.
    #[error("{operation} {path}: {source}")]
    Io {
        /// The operation, e.g. "read" or "fsync".
        operation: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// A log's header is missing or invalid.
    #[error("{path}: bad journal header at byte offset 0: {reason}")]
    BadHeader {
        /// The log file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A record other than a torn final one is damaged; the journal refuses to open.
    #[error("{path}: corrupt record at byte offset {offset}: {reason}")]
    CorruptRecord {
        /// The log file.
        path: PathBuf,
        /// Byte offset of the record's frame.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// A manifest is missing fields, unparsable or inconsistent.
    #[error("{path}: invalid manifest: {reason}")]
    BadManifest {
        /// The manifest file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// `CURRENT` is unparsable, or missing while generations exist.
    #[error("{path}: invalid CURRENT pointer: {reason}")]
    BadCurrent {
        /// The pointer file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// Another writer holds the lock.
    #[error("{path}: journal is locked by another writer ({holder})")]
    Locked {
        /// The lock file.
        path: PathBuf,
        /// What the holder wrote into the lock file.
        holder: String,
    },
    /// An earlier write or fsync failed; nothing written since can be trusted.
    #[error("journal writer is poisoned by an earlier failure ({cause}); reopen the journal")]
    Poisoned {
        /// The original failure.
        cause: String,
    },
    /// The requested generation is not retained.
    #[error("{path}: generation {generation} is not a retained generation")]
    GenerationNotRetained {
        /// The data directory.
        path: PathBuf,
        /// The requested generation.
        generation: u64,
    },
    /// A compaction snapshot no longer matches the journal.
    #[error(
        "{path}: stale compaction snapshot of generation {snapshot} (watermark {watermark} entries); current generation is {current} with {entries} entries"
    )]
    StaleSnapshot {
        /// The data directory.
        path: PathBuf,
        /// Generation the snapshot was taken from.
        snapshot: u64,
        /// Snapshot watermark (entry count).
        watermark: u64,
        /// Current generation.
        current: u64,
        /// Entries in the current generation.
        entries: u64,
    },
    /// A baseline refers to an entry that is not below the snapshot watermark, repeats an ID, or
    /// rewrites an entry as a different kind.
    #[error("{path}: invalid compaction baseline entry {id}: {reason}")]
    BadBaseline {
        /// The data directory.
        path: PathBuf,
        /// The offending ID.
        id: EntryId,
        /// What is wrong.
        reason: &'static str,
    },
    /// An entry could not be encoded, or is larger than a record may be.
    #[error("{path}: cannot encode entry {id}: {reason}")]
    Encode {
        /// The log file.
        path: PathBuf,
        /// The entry.
        id: EntryId,
        /// What is wrong.
        reason: String,
    },
}

impl JournalError {
    /// Wraps an I/O error with the operation and path it came from; the path is copied only when
    /// there is an error (appends and fsyncs on every request pass through here).
    pub(crate) fn io<'a>(operation: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> Self + 'a {
        move |source| JournalError::Io { operation, path: path.to_path_buf(), source }
    }
}

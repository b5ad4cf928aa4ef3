//! Failures of `strata compact` and their exit codes (sysexits-style), each saying what to do.

use std::path::PathBuf;
use std::process::ExitCode;

use strata_core::compaction::{CompactionError, SummarizeError};
use strata_core::journal::JournalError;
use strata_core::purge::PurgeError;

/// Exit code: the preservation check failed; nothing changed.
pub const EXIT_CHECK_FAILED: u8 = 2;
/// Exit code: bad command line, configuration or request (EX_USAGE).
pub const EXIT_USAGE: u8 = 64;
/// Exit code: the journal on disk is damaged (EX_DATAERR).
pub const EXIT_DATA: u8 = 65;
/// Exit code: the summariser model failed (EX_UNAVAILABLE).
pub const EXIT_UNAVAILABLE: u8 = 69;
/// Exit code: reading or writing the data directory failed (EX_IOERR).
pub const EXIT_IO: u8 = 74;
/// Exit code: try again later: the journal changed meanwhile or the writer did not apply the
/// proposal in time (EX_TEMPFAIL).
pub const EXIT_RETRY: u8 = 75;

/// Why `strata compact` stopped without a new generation.
#[derive(Debug, thiserror::Error)]
pub enum CompactFailure {
    /// A bad argument or configuration.
    #[error("{0}")]
    Usage(String),
    /// The summariser failed (and the mode has no fallback).
    #[error(
        "{0}; nothing changed. Retry, use --summarizer extractive, or --mode Emergency to fall back to the extractive summariser automatically"
    )]
    Summarizer(#[from] SummarizeError),
    /// The journal or artifact store failed.
    #[error("{source}{hint}")]
    Compaction {
        /// The failure.
        source: CompactionError,
        /// What to do about it.
        hint: String,
    },
    /// Reading the configuration or writing an output file failed.
    #[error("{operation} {path}: {source}; check the path and its permissions")]
    Io {
        /// What was attempted.
        operation: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The writer did not apply the proposal in time.
    #[error("{0}")]
    Retry(String),
}

impl From<CompactionError> for CompactFailure {
    fn from(source: CompactionError) -> Self {
        let hint = match &source {
            CompactionError::Journal(JournalError::StaleSnapshot { .. })
            | CompactionError::NotOurs { .. } => "; nothing changed — run the compaction again",
            CompactionError::Journal(JournalError::GenerationNotRetained { .. }) => {
                "; list the retained generations (gen-NNNNNN directories with a manifest.json) and pass one of them to --to-generation"
            }
            CompactionError::Journal(
                JournalError::CorruptRecord { .. }
                | JournalError::BadHeader { .. }
                | JournalError::BadManifest { .. },
            ) => {
                "; the journal is damaged — open it with the gateway (which repairs torn tails) or restore the volume from a backup"
            }
            CompactionError::Purge(
                PurgeError::NotInWindow { .. } | PurgeError::DuplicateId(_) | PurgeError::NoIds,
            ) => "",
            _ => "; check that the data directory is mounted read-write and has free space",
        };
        CompactFailure::Compaction { source, hint: hint.to_owned() }
    }
}

impl CompactFailure {
    /// The process exit code.
    pub fn exit_code(&self) -> ExitCode {
        ExitCode::from(self.code())
    }

    /// The numeric exit code.
    pub fn code(&self) -> u8 {
        match self {
            CompactFailure::Usage(_) => EXIT_USAGE,
            CompactFailure::Summarizer(_) => EXIT_UNAVAILABLE,
            CompactFailure::Io { .. } => EXIT_IO,
            CompactFailure::Retry(_) => EXIT_RETRY,
            CompactFailure::Compaction { source, .. } => match source {
                CompactionError::Purge(
                    PurgeError::NotInWindow { .. } | PurgeError::DuplicateId(_) | PurgeError::NoIds,
                )
                | CompactionError::Journal(JournalError::GenerationNotRetained { .. }) => EXIT_USAGE,
                CompactionError::Journal(
                    JournalError::CorruptRecord { .. }
                    | JournalError::BadHeader { .. }
                    | JournalError::BadManifest { .. }
                    | JournalError::BadCurrent { .. },
                ) => EXIT_DATA,
                CompactionError::Journal(
                    JournalError::StaleSnapshot { .. } | JournalError::Locked { .. },
                )
                | CompactionError::NotOurs { .. } => EXIT_RETRY,
                _ => EXIT_IO,
            },
        }
    }
}

//! Compaction: the CompactedState, extractive summarisation, the preservation check, the
//! generation switch and the compaction record (seed 000's compaction flow, seed 001 §17.15).
//!
//! The flow, for a snapshot of the journal (taken by the writer, or read offline by a Job):
//! 1. [`PreparedCompaction::new`] finds the previous state (the latest `summary_N` holding a
//!    CompactedState), the delta since it, and the entries kept verbatim: Critical ones, the last
//!    `keep_recent_entries`, unanswered tool calls and the partners of kept tool calls/results.
//! 2. A [`Summarizer`] turns the [`SummaryInput`] into a [`CompactedState`]:
//!    [`ExtractiveSummarizer`] here (deterministic), an LLM one in the `strata` crate.
//! 3. [`PreparedCompaction::conclude`] runs the preservation check ([`check_preservation`]). On
//!    failure nothing changes and the record says Failed. On success the removed entries are
//!    archived (reopenable by `data_ref`) and the baseline is built: kept entries in journal
//!    order, then `summary_N` (the state as JSON, Critical), then the resume instruction (a kept tool
//!    call still waiting for its result, and what follows it, stay after them). The next
//!    compaction's delta is exactly what follows the summary.
//! 4. [`ReadyCompaction::commit`] switches generations in the writer, or
//!    [`ReadyCompaction::proposal`] hands the baseline to the writer of another process; either
//!    way entries appended meanwhile are carried over exactly once.
//!
//! Purge ([`prepare_purge`], built on [`crate::purge`]) and [`rollback`] produce the same record.

mod check;
mod engine;
mod error;
mod extractive;
mod findings;
mod plan;
mod record;
pub mod signals;
mod state;
mod summarizer;

pub use check::{QualityReport, check_preservation};
pub use engine::{
    Conclusion, PROPOSALS_DIR, PurgeJob, RECORDS_DIR, ReadyCompaction, compact_extractive, prepare_purge,
    rollback, write_record,
};
pub use error::CompactionError;
pub use extractive::{EXTRACTIVE_VERSION, ExtractiveSummarizer};
pub use findings::{Findings, clip};
pub use plan::{CompactionMode, CompactionRequest, CompactionSettings, PreparedCompaction, is_state_entry};
pub use record::{CompactionRecord, QualityCheck, TERMINATION_MESSAGE_LIMIT, compaction_id, rfc3339};
pub use state::{
    CompactedState, EvidenceRefs, PendingAction, SourcedItem, StateField, StateValidationError, ToolState,
};
pub use summarizer::{
    SummarizeError, Summarizer, SummaryFuture, SummaryInput, chunk_delta, render_entry_for_prompt,
};

//! Compactions of the agent's context: the in-process extractive one, and the two halves a host
//! uses to run its model summariser off the engine (snapshot now, commit by watermark later).
//!
//! The engine never waits for a model. When the host has a model summariser
//! ([`SessionSettings::model_summarizer`]), a Budget compaction at the trigger and the model's own
//! `strata_compact_context` request become a [`CompactionAsk`] that the host takes
//! ([`SessionEngine::take_compaction_ask`]) and runs: [`SessionEngine::prepare_compaction`] takes a
//! snapshot, the host summarises it without holding the engine, and
//! [`SessionEngine::finish_compaction`] checks and commits it. Turns journaled in between are
//! carried over into the new generation exactly once; a snapshot that another rewrite overtook
//! (an Emergency compaction, a purge, a rewind) is refused as superseded and changes nothing.
//! Emergency compactions, which must free room before the current request, stay extractive and
//! in-process.

use crate::compaction::{
    CompactedState, CompactionError, CompactionMode, CompactionRecord, CompactionRequest, Conclusion,
    EXTRACTIVE_VERSION, ExtractiveSummarizer, PreparedCompaction, QualityCheck, write_record,
};
use crate::journal::JournalError;

use super::engine::{EngineError, SessionEngine};
use super::settings::SessionSettings;

/// A compaction the engine asks its host to run with the host's model summariser.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompactionAsk {
    /// TaskBoundary (asked by the model or a user) or Budget (the context reached the trigger).
    pub mode: CompactionMode,
    /// Why, for the record.
    pub reason: String,
    /// The instruction the agent resumes from; generated from the state when absent.
    pub resume_instruction: Option<String>,
}

impl CompactionAsk {
    /// An ask of `mode` for `reason`, without a resume instruction.
    pub fn new(mode: CompactionMode, reason: impl Into<String>) -> Self {
        Self { mode, reason: reason.into(), resume_instruction: None }
    }
}

/// How one compaction concluded, for the host's metrics (spec §17.20: compaction savings and the
/// preservation failure rate).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompactionOutcome {
    /// The journal switched to the compacted generation.
    Committed {
        /// Tokens of the compacted span before.
        tokens_before: u64,
        /// Tokens of the baseline that replaced it.
        tokens_after: u64,
    },
    /// The preservation check failed: the old generation stays current.
    PreservationFailed,
    /// There was nothing to compact.
    NothingToCompact,
    /// The journal moved on under the snapshot; dropped.
    Superseded,
    /// It could not run (archive, record or proposal failure).
    Failed,
}

impl CompactionOutcome {
    /// Label value for metrics.
    pub fn label(self) -> &'static str {
        match self {
            CompactionOutcome::Committed { .. } => "committed",
            CompactionOutcome::PreservationFailed => "preservation_failed",
            CompactionOutcome::NothingToCompact => "nothing_to_compact",
            CompactionOutcome::Superseded => "superseded",
            CompactionOutcome::Failed => "failed",
        }
    }

    fn of(result: &Result<CompactionRecord, CompactionError>) -> Self {
        match result {
            Ok(record) if record.quality_check == QualityCheck::Failed => {
                CompactionOutcome::PreservationFailed
            }
            Ok(record) if record.result_generation != record.source_generation => {
                CompactionOutcome::Committed {
                    tokens_before: record.tokens_before,
                    tokens_after: record.tokens_after,
                }
            }
            Ok(_) => CompactionOutcome::NothingToCompact,
            Err(error) if is_superseded(error) => CompactionOutcome::Superseded,
            Err(_) => CompactionOutcome::Failed,
        }
    }
}

/// Whether a commit failed only because the journal moved on under the snapshot.
pub fn is_superseded(error: &CompactionError) -> bool {
    matches!(error, CompactionError::Journal(JournalError::StaleSnapshot { .. }))
}

impl SessionEngine {
    /// Snapshots the journal for `ask`: the summary input is fixed now, the engine stays free.
    pub fn prepare_compaction(
        &mut self,
        settings: &SessionSettings,
        ask: &CompactionAsk,
        now_ms: u64,
    ) -> Result<PreparedCompaction, EngineError> {
        let request = CompactionRequest {
            mode: ask.mode,
            reason: Some(ask.reason.clone()),
            resume_instruction: ask.resume_instruction.clone().filter(|text| !text.trim().is_empty()),
            settings: settings.compaction.clone(),
            now_ms,
        };
        let snapshot = self.journal_mut().begin_compaction().map_err(EngineError::Journal)?;
        Ok(PreparedCompaction::new(snapshot, request))
    }

    /// Checks `state` (made by the summariser `version`) against the snapshot and, when it passes,
    /// switches generations carrying over what was journaled since. The record is written beside
    /// the journal. A compaction that cannot commit (rejected, nothing to compact, superseded,
    /// archive failure) is `Ok(Err(..))` or a Failed record and leaves the context unchanged;
    /// journal faults are engine errors.
    pub fn finish_compaction(
        &mut self,
        settings: &SessionSettings,
        prepared: PreparedCompaction,
        state: CompactedState,
        version: &str,
        now_ms: u64,
    ) -> Result<Result<CompactionRecord, CompactionError>, EngineError> {
        let result = self.conclude_compaction(settings, prepared, state, version, now_ms)?;
        self.compaction_outcomes_mut().push(CompactionOutcome::of(&result));
        Ok(result)
    }

    /// [`SessionEngine::finish_compaction`] without the tally.
    fn conclude_compaction(
        &mut self,
        settings: &SessionSettings,
        prepared: PreparedCompaction,
        state: CompactedState,
        version: &str,
        now_ms: u64,
    ) -> Result<Result<CompactionRecord, CompactionError>, EngineError> {
        let conclusion = {
            let (_, store, counter) = self.parts_mut();
            prepared.conclude(state, version, store, &settings.tenant, counter)
        };
        let record = match conclusion {
            Ok(Conclusion::Ready(ready)) => match ready.commit(self.journal_mut(), now_ms) {
                Ok(record) => record,
                Err(error) if is_superseded(&error) => return Ok(Err(error)),
                Err(CompactionError::Journal(error)) => return Err(EngineError::Journal(error)),
                Err(error) => return Ok(Err(error)),
            },
            Ok(Conclusion::Rejected(record) | Conclusion::NothingToCompact(record)) => record,
            Err(CompactionError::Journal(error)) => return Err(EngineError::Journal(error)),
            Err(error) => return Ok(Err(error)),
        };
        if let Err(error) = write_record(self.storage().as_ref(), self.journal().dir(), &record) {
            self.warn(format!("writing the compaction record {}: {error}", record.compaction_id));
        }
        if record.result_generation != record.source_generation {
            self.after_rewrite()?;
        }
        Ok(Ok(record))
    }

    /// Compacts in-process with the extractive summariser, under the same preservation check and
    /// record as `strata compact`.
    pub fn compact(
        &mut self,
        settings: &SessionSettings,
        ask: &CompactionAsk,
        now_ms: u64,
    ) -> Result<Result<CompactionRecord, CompactionError>, EngineError> {
        let prepared = self.prepare_compaction(settings, ask, now_ms)?;
        let summarizer = ExtractiveSummarizer { max_summary_tokens: settings.compaction.max_summary_tokens };
        let state = summarizer.summarize_now(prepared.summary_input());
        self.finish_compaction(settings, prepared, state, EXTRACTIVE_VERSION, now_ms)
    }

    /// The compactions concluded since the last call, oldest first (taken once).
    pub fn take_compaction_outcomes(&mut self) -> Vec<CompactionOutcome> {
        std::mem::take(self.compaction_outcomes_mut())
    }

    /// The compaction the engine asked its host to run, if any (asked once; taken once).
    pub fn take_compaction_ask(&mut self) -> Option<CompactionAsk> {
        self.asked_mut().take()
    }

    /// Records `ask` for the host unless one is already waiting (the first ask's reason stands,
    /// except that the model's own request replaces a Budget one, keeping its resume instruction).
    pub(super) fn ask_compaction(&mut self, ask: CompactionAsk) {
        let waiting = self.asked_mut();
        match waiting {
            Some(current) if current.mode == CompactionMode::Budget && ask.mode != CompactionMode::Budget => {
                *current = ask;
            }
            Some(_) => {}
            None => *waiting = Some(ask),
        }
    }
}

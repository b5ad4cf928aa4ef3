//! Compactions with the policy's summariser model, run off the engine: snapshot, summarise with a
//! deadline (the extractive summariser when the model fails), commit by watermark.
//!
//! Budget compactions at the trigger and the model's `strata_compact_context` requests run in the
//! background, one at a time, while turns go on; `POST /strata/v1/compact` waits for its own.
//! Without a summariser model every compaction is extractive and in-process in the engine.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use strata_core::compaction::{
    CompactedState, CompactionError, CompactionMode, CompactionRecord, EXTRACTIVE_VERSION,
    ExtractiveSummarizer, QualityCheck, Summarizer,
};
use strata_core::session::{CompactionAsk, is_superseded, now_ms};

use super::config::{LiveSettings, Settings};
use super::engine_host::{EngineHost, Placement};
use super::errors::GatewayError;
use super::metrics::Metrics;
use crate::compact::llm::LlmSummarizer;
use crate::compact::llm_config::llm_settings;

/// A summary may take this many request timeouts (chunked deltas make several requests).
const DEADLINE_IN_REQUEST_TIMEOUTS: u32 = 4;

/// What a compaction run came to.
pub type CompactionOutcome = Result<CompactionRecord, CompactionError>;

/// Runs compactions with the summariser model for one gateway.
#[derive(Debug)]
pub struct Compactor {
    engine: Arc<EngineHost>,
    live: LiveSettings,
    metrics: Metrics,
    /// The summariser's own API key (mounted when the policy names `credentialsSecretRef`).
    key_file: PathBuf,
    /// Held by the compaction in progress: at most one at a time.
    running: tokio::sync::Mutex<()>,
}

/// The summariser a compaction uses.
enum Choice {
    /// Extractive, in the engine (no model configured, or an Emergency compaction).
    InProcess,
    /// The model, or why it cannot be used (then the extractive summariser runs off the engine).
    Model(Result<Box<LlmSummarizer>, String>),
}

impl Compactor {
    /// A compactor over `engine`, reading the summariser from the live settings.
    pub fn new(engine: Arc<EngineHost>, live: LiveSettings, metrics: Metrics, key_file: PathBuf) -> Self {
        Self { engine, live, metrics, key_file, running: tokio::sync::Mutex::new(()) }
    }

    /// Starts `ask` in the background unless a compaction is already running (the engine asks
    /// again at a later turn if the context still needs it). Shutdown waits for it.
    pub fn start(self: &Arc<Self>, ask: CompactionAsk) {
        let compactor = Arc::clone(self);
        self.engine.spawn_beside(async move {
            let Ok(_running) = compactor.running.try_lock() else {
                tracing::debug!(
                    mode = ask.mode.as_str(),
                    "a compaction is already running; this ask is dropped"
                );
                return;
            };
            match compactor.run_unlocked(&ask).await {
                Ok(Ok(record)) => tracing::info!(
                    mode = ask.mode.as_str(),
                    id = %record.compaction_id,
                    from = record.source_generation,
                    to = record.result_generation,
                    tokens_before = record.tokens_before,
                    tokens_after = record.tokens_after,
                    summarizer = record.model_or_service_version.as_deref().unwrap_or_default(),
                    "background compaction finished"
                ),
                Ok(Err(error)) => {
                    tracing::warn!(mode = ask.mode.as_str(), %error, "background compaction did not commit")
                }
                Err(error) => {
                    tracing::error!(mode = ask.mode.as_str(), %error, "background compaction failed")
                }
            }
        });
    }

    /// Runs `ask` now, after any compaction in progress.
    pub async fn run(&self, ask: &CompactionAsk) -> Result<CompactionOutcome, GatewayError> {
        let _running = self.running.lock().await;
        self.run_unlocked(ask).await
    }

    async fn run_unlocked(&self, ask: &CompactionAsk) -> Result<CompactionOutcome, GatewayError> {
        let settings = self.live.get();
        let llm = match self.choice(&settings, ask.mode) {
            Choice::InProcess => {
                let ask = ask.clone();
                let work = Arc::clone(&settings);
                let outcome = self
                    .engine
                    .run(Placement::Blocking, Arc::clone(&settings), move |engine| {
                        engine.compact(&work.session, &ask, now_ms())
                    })
                    .await?;
                self.count_committed(&outcome);
                return Ok(outcome);
            }
            Choice::Model(llm) => llm,
        };
        let work = Arc::clone(&settings);
        let work_ask = ask.clone();
        let prepared = self
            .engine
            .run(Placement::Blocking, Arc::clone(&settings), move |engine| {
                engine.prepare_compaction(&work.session, &work_ask, now_ms())
            })
            .await?;
        let extractive =
            ExtractiveSummarizer { max_summary_tokens: settings.session.compaction.max_summary_tokens };
        let (state, version, label) = match summarize(llm, &settings, prepared.summary_input()).await {
            Ok((state, version)) => (state, version, "model"),
            Err(failure) => {
                tracing::warn!(%failure, "summariser model failed; compacting with the extractive summariser");
                let state = extractive.summarize_now(prepared.summary_input());
                (state, format!("{EXTRACTIVE_VERSION} (fallback: {failure})"), "fallback")
            }
        };
        let work = Arc::clone(&settings);
        let outcome = self
            .engine
            .run(Placement::Blocking, Arc::clone(&settings), move |engine| {
                engine.finish_compaction(&work.session, prepared, state, &version, now_ms())
            })
            .await?;
        let result = match &outcome {
            Ok(record) if record.result_generation != record.source_generation => "committed",
            Ok(record) if record.quality_check == QualityCheck::Failed => "rejected",
            Ok(_) => "nothing_to_compact",
            Err(error) if is_superseded(error) => "superseded",
            Err(_) => "failed",
        };
        self.metrics.summarized_compactions.with_label_values(&[label, result]).inc();
        self.count_committed(&outcome);
        Ok(outcome)
    }

    fn count_committed(&self, outcome: &CompactionOutcome) {
        if matches!(outcome, Ok(record) if record.result_generation != record.source_generation) {
            self.metrics.compactions.inc();
        }
    }

    /// The summariser for a compaction of `mode` under `settings`.
    fn choice(&self, settings: &Settings, mode: CompactionMode) -> Choice {
        let Some(model) = settings.config.policy.compaction.summarizer.model.clone() else {
            return Choice::InProcess;
        };
        if mode == CompactionMode::Emergency {
            return Choice::InProcess;
        }
        let llm = llm_settings(&settings.config, model, &self.key_file)
            .map_err(|error| format!("the summariser cannot be reached: {error}"))
            .and_then(|llm| {
                LlmSummarizer::new(llm)
                    .map(Box::new)
                    .map_err(|error| format!("building the summariser's HTTP client: {error}"))
            });
        Choice::Model(llm)
    }
}

/// Summarises with the model within the deadline; the error says which model failed and why.
async fn summarize(
    llm: Result<Box<LlmSummarizer>, String>,
    settings: &Settings,
    input: &strata_core::compaction::SummaryInput,
) -> Result<(CompactedState, String), String> {
    let llm = llm?;
    let version = llm.version();
    let request_timeout = u64::from(settings.config.upstream.timeout_seconds.max(1));
    let deadline = Duration::from_secs(request_timeout * u64::from(DEADLINE_IN_REQUEST_TIMEOUTS));
    match tokio::time::timeout(deadline, llm.summarize(input)).await {
        Ok(Ok(state)) => Ok((state, version)),
        Ok(Err(error)) => Err(format!("{version} failed: {error}")),
        Err(_) => Err(format!("{version} did not finish within {} s", deadline.as_secs())),
    }
}

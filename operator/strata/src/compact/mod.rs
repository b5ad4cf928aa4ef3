//! `strata compact`: compact, purge or roll back an agent's journal, offline or beside a live
//! gateway, print the compaction record, and report it as the Kubernetes termination message.
//!
//! When no process holds the journal's writer lock the command opens the journal itself. When the
//! gateway holds it, the command reads the journal offline, publishes its result as a compaction
//! proposal and waits (bounded by `--wait-seconds`) for the gateway to commit it; entries the
//! gateway appends meanwhile are carried over exactly once.

pub mod exit;
pub(crate) mod llm;
pub(crate) mod llm_config;
mod run;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

pub use exit::{
    CompactFailure, EXIT_CHECK_FAILED, EXIT_DATA, EXIT_IO, EXIT_RETRY, EXIT_UNAVAILABLE, EXIT_USAGE,
};
pub use llm::{LlmSettings, LlmSummarizer};
use strata_core::compaction::{CompactionMode, QualityCheck, TERMINATION_MESSAGE_LIMIT};

/// Where a compaction Job mounts the summariser's own API key (`compaction.summarizer.credentialsSecretRef`).
pub const SUMMARIZER_KEY_FILE: &str = "/var/run/strata/summarizer/api-key";

/// Which summariser writes the CompactedState.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SummarizerChoice {
    /// The model named by the policy's `compaction.summarizer.model` (needs `--config`).
    Llm,
    /// Deterministic pattern extraction, no network.
    Extractive,
}

/// Arguments of `strata compact`.
#[derive(Debug, Clone, clap::Args)]
pub struct CompactArgs {
    /// The agent's journal data directory (the volume mount).
    #[arg(long, value_name = "DIR")]
    pub data_dir: PathBuf,
    /// TaskBoundary, Budget, Emergency, Rollback or Purge.
    #[arg(long, value_name = "MODE", value_parser = parse_mode)]
    pub mode: CompactionMode,
    /// Why (recorded).
    #[arg(long, value_name = "TEXT")]
    pub reason: Option<String>,
    /// The instruction injected after the compacted state; generated from the state if absent.
    #[arg(long, value_name = "TEXT")]
    pub resume_instruction: Option<String>,
    /// Summariser; default: llm when the config names a summariser model, else extractive.
    #[arg(long, value_enum)]
    pub summarizer: Option<SummarizerChoice>,
    /// The agent's gateway.json (policy, upstream, tenant).
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// The summariser's API key, used when the policy gives the summariser its own
    /// `credentialsSecretRef` (compaction Jobs mount that Secret key here).
    #[arg(long, value_name = "PATH", default_value = SUMMARIZER_KEY_FILE)]
    pub summarizer_api_key_file: PathBuf,
    /// Rollback: the retained generation to restore.
    #[arg(long, value_name = "N")]
    pub to_generation: Option<u64>,
    /// Purge: the entry IDs to remove, comma separated.
    #[arg(long, value_name = "IDS", value_delimiter = ',')]
    pub ids: Vec<String>,
    /// Purge: the summary that replaces the removed entries.
    #[arg(long, value_name = "TEXT")]
    pub summary: Option<String>,
    /// Also write the record here, compact and at most 4096 bytes (the termination message).
    #[arg(long, value_name = "PATH")]
    pub termination_log: Option<PathBuf>,
    /// Artifact-store tenant; default: the config's namespace, else `default`.
    #[arg(long, value_name = "T")]
    pub tenant: Option<String>,
    /// Recent entries kept verbatim; default: the policy's keepRecentEntries (8).
    #[arg(long, value_name = "N")]
    pub keep_recent: Option<usize>,
    /// How long to wait for a live gateway to apply the compaction.
    #[arg(long, value_name = "SECONDS", default_value_t = 120)]
    pub wait_seconds: u64,
}

fn parse_mode(text: &str) -> Result<CompactionMode, String> {
    text.parse()
}

/// Runs the command and maps the outcome to the exit code.
pub fn main(args: &CompactArgs) -> ExitCode {
    let outcome = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|source| CompactFailure::Io {
            operation: "start the async runtime",
            path: PathBuf::new(),
            source,
        })
        .and_then(|runtime| runtime.block_on(run::run(args)));
    match outcome {
        Ok(record) => {
            println!("{}", record.to_json_pretty());
            if let Err(error) = write_termination_log(
                args.termination_log.as_deref(),
                &record.to_termination_message(TERMINATION_MESSAGE_LIMIT),
            ) {
                eprintln!("strata compact: {error}");
                return error.exit_code();
            }
            if record.quality_check == QualityCheck::Failed {
                eprintln!(
                    "strata compact: the preservation check failed, nothing changed (generation {} stays CURRENT); missing: {}. Use a summariser that keeps these items (e.g. --summarizer extractive) and run again",
                    record.source_generation,
                    record.missing_items.join("; ")
                );
                return ExitCode::from(EXIT_CHECK_FAILED);
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("strata compact: {error}");
            let message: String = format!("strata compact: {error}").chars().take(1000).collect();
            if let Err(log_error) = write_termination_log(args.termination_log.as_deref(), &message) {
                eprintln!("strata compact: {log_error}");
            }
            error.exit_code()
        }
    }
}

fn write_termination_log(path: Option<&Path>, message: &str) -> Result<(), CompactFailure> {
    let Some(path) = path else { return Ok(()) };
    std::fs::write(path, message).map_err(|source| CompactFailure::Io {
        operation: "write the termination log",
        path: path.to_path_buf(),
        source,
    })
}

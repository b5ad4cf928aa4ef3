//! One `strata compact` run: configuration, opening the journal (as writer, or offline beside a
//! live gateway), summarising with fallback, committing or proposing, and recording.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use strata_api::gateway_config::GatewayConfig;
use strata_core::artifacts::{ArtifactStore, validate_tenant};
use strata_core::compaction::{
    CompactedState, CompactionError, CompactionMode, CompactionRecord, CompactionRequest, CompactionSettings,
    Conclusion, EXTRACTIVE_VERSION, ExtractiveSummarizer, PreparedCompaction, PurgeJob, ReadyCompaction,
    Summarizer, prepare_purge, rollback, write_record,
};
use strata_core::entry::EntryId;
use strata_core::journal::{
    Journal, JournalError, JournalOptions, Snapshot, StdStorage, describe_holder, read_current_generation,
    read_owner,
};
use strata_core::purge::PurgeRequest;
use strata_core::tokens::{TokenCounter, TokenizerKind};

use super::exit::CompactFailure;
use super::llm::{LlmSettings, LlmSummarizer};
use super::llm_config::{LlmConfigError, llm_settings};
use super::{CompactArgs, SummarizerChoice};

/// Everything resolved from the arguments and gateway.json.
struct Plan {
    settings: CompactionSettings,
    tenant: String,
    retain_generations: usize,
    counter: TokenCounter,
    llm: Option<LlmSettings>,
    now_ms: u64,
    /// The Agent of `--config` (its UID, and a UID it adopts the journal from), if it names one.
    agent: Option<(String, Option<String>)>,
}

/// Who commits: this process (it holds the writer lock) or the gateway (via a proposal).
enum Access {
    Writer(Box<Journal>),
    Gateway { holder: String },
}

/// Runs `strata compact` and returns the record (Passed or Failed).
pub async fn run(args: &CompactArgs) -> Result<CompactionRecord, CompactFailure> {
    let plan = resolve(args)?;
    let dir = args.data_dir.as_path();
    if !dir.join("CURRENT").exists() {
        return Err(CompactFailure::Usage(format!(
            "no journal in {} (CURRENT is missing); pass the agent's data directory, where the gateway keeps CURRENT and gen-NNNNNN/",
            dir.display()
        )));
    }
    check_owner(dir, &plan)?;
    let storage = Arc::new(StdStorage);
    let store = ArtifactStore::new(storage.clone(), dir.join("artifacts"));
    let mut options = JournalOptions::new("strata compact", plan.now_ms);
    options.retain_generations = plan.retain_generations;
    options.holder = describe_holder("strata compact");
    let access = match Journal::open(storage.clone(), dir, options) {
        Ok((journal, _)) => Access::Writer(Box::new(journal)),
        Err(JournalError::Locked { holder, .. }) => Access::Gateway { holder },
        Err(error) => return Err(CompactionError::from(error).into()),
    };
    let record = match args.mode {
        CompactionMode::Rollback => {
            let Access::Writer(mut journal) = access else {
                return Err(CompactFailure::Retry(format!(
                    "{} is held by a live writer ({}); a rollback must be committed by the writer. Suspend the agent (spec.suspend: true) so the gateway releases the journal, then run the rollback again",
                    dir.display(),
                    holder_of(&access)
                )));
            };
            let target =
                args.to_generation.ok_or_else(|| usage("--mode Rollback needs --to-generation N"))?;
            rollback(&mut journal, target, args.reason.clone(), &plan.settings.privacy_scope, plan.now_ms)?
        }
        CompactionMode::Purge => {
            let request = purge_request(args)?;
            let snapshot = snapshot_of(&access, dir)?;
            let job = PurgeJob {
                request: &request,
                reason: args.reason.as_deref(),
                privacy_scope: &plan.settings.privacy_scope,
                tenant: &plan.tenant,
                now_ms: plan.now_ms,
            };
            let ready = prepare_purge(&snapshot, &job, &store, &plan.counter)?;
            commit(access, ready, dir, plan.now_ms, args.wait_seconds).await?
        }
        CompactionMode::TaskBoundary | CompactionMode::Budget | CompactionMode::Emergency => {
            let snapshot = snapshot_of(&access, dir)?;
            let request = CompactionRequest {
                mode: args.mode,
                reason: args.reason.clone(),
                resume_instruction: args.resume_instruction.clone(),
                settings: plan.settings.clone(),
                now_ms: plan.now_ms,
            };
            let prepared = PreparedCompaction::new(snapshot, request);
            let (state, version) = summarize(args, &plan, &prepared).await?;
            match prepared.conclude(state, &version, &store, &plan.tenant, &plan.counter)? {
                Conclusion::Ready(ready) => {
                    commit(access, ready, dir, plan.now_ms, args.wait_seconds).await?
                }
                Conclusion::Rejected(record) | Conclusion::NothingToCompact(record) => record,
            }
        }
    };
    write_record(storage.as_ref(), dir, &record)?;
    Ok(record)
}

/// Refuse a journal whose `OWNER` names another Agent than the one of `--config` (unless that
/// Agent adopts it): a compaction never rewrites another agent's history.
fn check_owner(dir: &Path, plan: &Plan) -> Result<(), CompactFailure> {
    let Some((uid, adopt_from)) = &plan.agent else { return Ok(()) };
    let owner = read_owner(&StdStorage, dir).map_err(|error| CompactFailure::Usage(error.to_string()))?;
    match owner {
        Some(owner) if &owner.agent_uid != uid && adopt_from.as_deref() != Some(owner.agent_uid.as_str()) => {
            Err(CompactFailure::Usage(format!(
                "the journal in {} belongs to Agent {} (uid {}), not to the Agent of --config (uid {uid}); refusing to compact another agent's history",
                dir.display(),
                owner.agent,
                owner.agent_uid
            )))
        }
        _ => Ok(()),
    }
}

fn usage(message: &str) -> CompactFailure {
    CompactFailure::Usage(message.to_owned())
}

fn holder_of(access: &Access) -> &str {
    match access {
        Access::Gateway { holder } => holder,
        Access::Writer(_) => "this process",
    }
}

fn snapshot_of(access: &Access, dir: &Path) -> Result<Snapshot, CompactFailure> {
    match access {
        Access::Writer(journal) => Ok(journal.begin_compaction().map_err(CompactionError::from)?),
        Access::Gateway { .. } => {
            let view = read_current_generation(&StdStorage, dir).map_err(CompactionError::from)?;
            Ok(view.snapshot())
        }
    }
}

async fn commit(
    access: Access,
    ready: ReadyCompaction,
    dir: &Path,
    now_ms: u64,
    wait_seconds: u64,
) -> Result<CompactionRecord, CompactFailure> {
    match access {
        Access::Writer(mut journal) => Ok(ready.commit(&mut journal, now_ms)?),
        Access::Gateway { holder } => {
            let proposal = ready.publish(&StdStorage, dir, now_ms)?;
            let deadline = Instant::now() + Duration::from_secs(wait_seconds);
            loop {
                if let Some(record) = ready.confirm(&StdStorage, dir)? {
                    return Ok(record);
                }
                if !proposal.exists() {
                    if let Some(record) = ready.confirm(&StdStorage, dir)? {
                        return Ok(record);
                    }
                    return Err(CompactFailure::Retry(format!(
                        "the writer ({holder}) discarded the proposal because the journal changed underneath it; nothing changed — run the compaction again"
                    )));
                }
                if Instant::now() >= deadline {
                    return Err(CompactFailure::Retry(format!(
                        "the writer ({holder}) did not apply the compaction proposal {} within {wait_seconds} s; the gateway applies proposals on refresh, so check that it is running. The proposal stays valid until the journal switches generation; run again with a larger --wait-seconds to wait longer",
                        proposal.display()
                    )));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

fn purge_request(args: &CompactArgs) -> Result<PurgeRequest, CompactFailure> {
    if args.ids.is_empty() {
        return Err(usage("--mode Purge needs --ids, e.g. --ids msg_104,tool_call_105,tool_res_106"));
    }
    let ids = args
        .ids
        .iter()
        .map(|id| {
            id.trim().parse::<EntryId>().map_err(|error| {
                CompactFailure::Usage(format!("--ids: {error}; use IDs shown in the context such as msg_104"))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(PurgeRequest { ids, summary: args.summary.clone().unwrap_or_default() })
}

/// Summarises with the chosen summariser; in Emergency mode an LLM failure falls back to the
/// extractive summariser (recorded in the version).
async fn summarize(
    args: &CompactArgs,
    plan: &Plan,
    prepared: &PreparedCompaction,
) -> Result<(CompactedState, String), CompactFailure> {
    let extractive = ExtractiveSummarizer { max_summary_tokens: plan.settings.max_summary_tokens };
    let Some(llm_settings) = plan.llm.clone() else {
        return Ok((extractive.summarize_now(prepared.summary_input()), EXTRACTIVE_VERSION.to_owned()));
    };
    let llm = LlmSummarizer::new(llm_settings).map_err(|error| {
        CompactFailure::Usage(format!("cannot build the HTTP client for the summariser: {error}"))
    })?;
    match llm.summarize(prepared.summary_input()).await {
        Ok(state) => Ok((state, llm.version())),
        Err(error) if args.mode == CompactionMode::Emergency => {
            let state = extractive.summarize_now(prepared.summary_input());
            Ok((state, format!("{EXTRACTIVE_VERSION} (fallback: {} failed: {error})", llm.version())))
        }
        Err(error) => Err(error.into()),
    }
}

/// Resolves the arguments and the optional gateway.json into a plan.
fn resolve(args: &CompactArgs) -> Result<Plan, CompactFailure> {
    check_mode_arguments(args)?;
    let config =
        match &args.config {
            Some(path) => {
                let bytes = std::fs::read(path).map_err(|source| CompactFailure::Io {
                    operation: "read the gateway config",
                    path: path.clone(),
                    source,
                })?;
                Some(GatewayConfig::from_json(&bytes).map_err(|error| {
                    CompactFailure::Usage(format!("--config {}: {error}", path.display()))
                })?)
            }
            None => None,
        };
    let mut settings = CompactionSettings::default();
    let mut retain_generations = 3;
    let mut tenant = "default".to_owned();
    let mut tokenizer = TokenizerKind::O200kBase;
    let mut model = None;
    if let Some(config) = &config {
        let compaction = &config.policy.compaction;
        settings = crate::engine_policy::compaction_settings(compaction, &config.agent.privacy_scope);
        retain_generations = compaction.retain_generations as usize;
        tenant = config.agent.namespace.clone();
        tokenizer = crate::engine_policy::tokenizer_kind(config.upstream.tokenizer);
        model = compaction.summarizer.model.clone();
    }
    if let Some(keep) = args.keep_recent {
        settings.keep_recent_entries = keep;
    }
    if let Some(explicit) = &args.tenant {
        tenant = explicit.clone();
    }
    validate_tenant(&tenant).map_err(|error| CompactFailure::Usage(format!("tenant: {error}")))?;
    let choice = args.summarizer.unwrap_or(if model.is_some() {
        SummarizerChoice::Llm
    } else {
        SummarizerChoice::Extractive
    });
    let llm = match (choice, &config, model) {
        (SummarizerChoice::Extractive, _, _) => None,
        (SummarizerChoice::Llm, Some(config), Some(model)) => {
            Some(llm_settings(config, model, &args.summarizer_api_key_file).map_err(|error| match error {
                LlmConfigError::Usage(message) => CompactFailure::Usage(format!("--config: {message}")),
                LlmConfigError::Key { path, source } => {
                    CompactFailure::Io { operation: "read the API key", path, source }
                }
            })?)
        }
        (SummarizerChoice::Llm, _, _) => {
            return Err(usage(
                "--summarizer llm needs --config gateway.json whose policy sets compaction.summarizer.model; set the model in the ContextPolicy or use --summarizer extractive",
            ));
        }
    };
    let counter = TokenCounter::new(tokenizer)
        .map_err(|error| CompactFailure::Usage(format!("tokenizer {tokenizer}: {error}")))?;
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    let agent = config.as_ref().and_then(|c| {
        let uid = c.agent.uid.clone()?;
        Some((uid, c.agent.adopt_journal_from_uid.clone()))
    });
    Ok(Plan { settings, tenant, retain_generations: retain_generations.max(1), counter, llm, now_ms, agent })
}

fn check_mode_arguments(args: &CompactArgs) -> Result<(), CompactFailure> {
    let mode = args.mode;
    if args.to_generation.is_some() && mode != CompactionMode::Rollback {
        return Err(usage("--to-generation is only allowed with --mode Rollback"));
    }
    if (!args.ids.is_empty() || args.summary.is_some()) && mode != CompactionMode::Purge {
        return Err(usage("--ids and --summary are only allowed with --mode Purge"));
    }
    if mode == CompactionMode::Rollback && args.to_generation.is_none() {
        return Err(usage(
            "--mode Rollback needs --to-generation N: a retained generation (a gen-NNNNNN directory)",
        ));
    }
    if !mode.summarizes() && (args.summarizer.is_some() || args.resume_instruction.is_some()) {
        return Err(usage(
            "--summarizer and --resume-instruction apply to TaskBoundary, Budget and Emergency only",
        ));
    }
    Ok(())
}

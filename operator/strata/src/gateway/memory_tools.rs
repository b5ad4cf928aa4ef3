//! Execution of the memory tools the model calls through the gateway: `strata_purge`,
//! `strata_compact_context` and `strata_read_output`. Failures are answered to the model as tool
//! output, never to the client.

use serde_json::Value;
use strata_api::agent::Provider;
use strata_core::compaction::{
    CompactionError, CompactionMode, CompactionRecord, CompactionRequest, CompactionSettings, QualityCheck,
    compact_extractive, write_record,
};
use strata_core::economics::CachePricing;
use strata_core::entry::{EntryId, ToolCall};
use strata_core::journal::StdStorage;
use strata_core::purge::{PurgeRequest, purge};
use strata_core::tool_output::{READ_OUTPUT_TOOL_NAME, ReadRequest, read_output};

use super::config::Settings;
use super::engine::{Engine, EngineError, now_ms};
use super::tool_schema::{COMPACT_TOOL_NAME, PURGE_TOOL_NAME};

/// Model calls expected before the prompt changes anyway, for purge economics.
const REMAINING_CALLS_ESTIMATE: u64 = 20;

/// What one memory-tool call did.
#[derive(Debug)]
pub struct MemoryOutcome {
    /// The tool output the model sees.
    pub output: String,
    /// Whether a purge rewrote the journal.
    pub purged: bool,
    /// Whether a compaction rewrote the journal.
    pub compacted: bool,
}

fn parse_purge(arguments: &str) -> Result<PurgeRequest, String> {
    let value: Value =
        serde_json::from_str(arguments).map_err(|error| format!("arguments are not JSON: {error}"))?;
    let ids = value
        .get("ids")
        .and_then(Value::as_array)
        .ok_or("`ids` must be an array of entry IDs such as \"msg_12\"")?;
    let ids = ids
        .iter()
        .map(|id| {
            let text = id.as_str().ok_or_else(|| format!("entry ID {id} is not a string"))?;
            text.parse::<EntryId>().map_err(|error| error.to_string())
        })
        .collect::<Result<Vec<_>, _>>()?;
    let summary = value.get("summary").and_then(Value::as_str).unwrap_or_default().to_owned();
    Ok(PurgeRequest { ids, summary })
}

/// Runs `call` (whose name is a memory tool) against the agent's context.
pub fn execute(
    engine: &mut Engine,
    settings: &Settings,
    call: &ToolCall,
) -> Result<MemoryOutcome, EngineError> {
    if call.name == READ_OUTPUT_TOOL_NAME {
        let output = match ReadRequest::from_arguments_json(&call.arguments_json) {
            Ok(request) => {
                read_output(engine.store(), &settings.tenant, &request, settings.spill.max_result_chars)
                    .unwrap_or_else(|error| format!("strata_read_output failed: {error}"))
            }
            Err(error) => format!("strata_read_output: invalid arguments: {error}"),
        };
        return Ok(MemoryOutcome { output, purged: false, compacted: false });
    }
    if call.name == COMPACT_TOOL_NAME {
        return compact(engine, settings, &call.arguments_json);
    }
    if call.name != PURGE_TOOL_NAME {
        return Ok(MemoryOutcome {
            output: format!("unknown memory tool {}", call.name),
            purged: false,
            compacted: false,
        });
    }
    let request = match parse_purge(&call.arguments_json) {
        Ok(request) => request,
        Err(problem) => {
            return Ok(MemoryOutcome {
                output: format!("strata_purge: invalid arguments: {problem}"),
                purged: false,
                compacted: false,
            });
        }
    };
    let pricing = match settings.provider() {
        Provider::Anthropic => CachePricing::ANTHROPIC,
        Provider::OpenAI | Provider::OpenAICompatible => CachePricing::OPENAI,
    };
    let (journal, store, counter) = engine.parts_mut();
    let result = purge(
        journal,
        store,
        &settings.tenant,
        &request,
        counter,
        now_ms(),
        REMAINING_CALLS_ESTIMATE,
        pricing,
    );
    match result {
        Ok(outcome) => {
            engine.after_rewrite()?;
            let removed: Vec<String> = outcome.removed.iter().map(ToString::to_string).collect();
            Ok(MemoryOutcome {
                output: format!(
                    "Purged {} ({} entries); they are replaced by {}. About {} tokens are saved on every later call; \
                     the prompt cache is rebuilt once (break-even after {} calls). The raw entries stay readable \
                     with strata_read_output data_ref={}.",
                    removed.join(", "),
                    removed.len(),
                    outcome.summary_id,
                    outcome.saved_tokens,
                    outcome
                        .economics
                        .break_even_calls
                        .map_or_else(|| "no".to_owned(), |calls| calls.to_string()),
                    outcome.archive,
                ),
                purged: true,
                compacted: false,
            })
        }
        Err(strata_core::purge::PurgeError::Journal(error)) => Err(EngineError::Journal(error)),
        Err(error) => Ok(MemoryOutcome {
            output: format!("strata_purge failed: {error}"),
            purged: false,
            compacted: false,
        }),
    }
}

fn compaction_settings(settings: &Settings) -> CompactionSettings {
    let policy = &settings.config.policy.compaction;
    let privacy_scope = &settings.config.agent.privacy_scope;
    crate::engine_policy::compaction_settings(policy, privacy_scope).unwrap_or_else(|_| CompactionSettings {
        privacy_scope: privacy_scope.clone(),
        ..CompactionSettings::default()
    })
}

/// Compacts the agent's context in-process, under the same preservation check and record as
/// `strata compact`; the record is written beside the journal. A compaction that cannot run
/// (e.g. an empty journal) is returned as `Ok(Err(..))`; journal failures are engine errors.
pub fn compact_in_process(
    engine: &mut Engine,
    settings: &Settings,
    mode: CompactionMode,
    reason: String,
    resume_instruction: Option<String>,
) -> Result<Result<CompactionRecord, CompactionError>, EngineError> {
    let request = CompactionRequest {
        mode,
        reason: Some(reason),
        resume_instruction: resume_instruction.filter(|text| !text.trim().is_empty()),
        settings: compaction_settings(settings),
        now_ms: now_ms(),
    };
    let (journal, store, counter) = engine.parts_mut();
    let record = match compact_extractive(journal, store, &settings.tenant, request, counter) {
        Ok(record) => record,
        Err(CompactionError::Journal(error)) => return Err(EngineError::Journal(error)),
        Err(error) => return Ok(Err(error)),
    };
    if let Err(error) = write_record(&StdStorage, journal.dir(), &record) {
        tracing::warn!(%error, "writing the compaction record");
    }
    if record.result_generation != record.source_generation {
        engine.after_rewrite()?;
    }
    Ok(Ok(record))
}

fn compact(engine: &mut Engine, settings: &Settings, arguments: &str) -> Result<MemoryOutcome, EngineError> {
    let instruction = serde_json::from_str::<Value>(arguments)
        .ok()
        .and_then(|value| value.get("resume_instruction").and_then(Value::as_str).map(str::to_owned));
    let reason = "requested by the model through strata_compact_context".to_owned();
    let record =
        match compact_in_process(engine, settings, CompactionMode::TaskBoundary, reason, instruction)? {
            Ok(record) => record,
            Err(error) => {
                return Ok(MemoryOutcome {
                    output: format!("strata_compact_context failed: {error}"),
                    purged: false,
                    compacted: false,
                });
            }
        };
    let compacted = record.result_generation != record.source_generation;
    let output = match (record.quality_check, compacted) {
        (QualityCheck::Passed, true) => format!(
            "Compacted generation {} into {}: {} tokens before, {} after. Your history is now the compacted \
             state and the resume instruction; continue from there.",
            record.source_generation, record.result_generation, record.tokens_before, record.tokens_after
        ),
        (QualityCheck::Passed, false) => {
            "Nothing to compact: every entry is Critical or among the most recent ones.".to_owned()
        }
        (QualityCheck::Failed, _) => format!(
            "Compaction was rejected because the summary missed: {}. Nothing changed; purge specific entries \
             with strata_purge instead.",
            record.missing_items.join("; ")
        ),
    };
    Ok(MemoryOutcome { output, purged: false, compacted })
}

//! Execution of the memory tools the model calls through the gateway: `strata_purge`,
//! `strata_compact_context` and `strata_read_output`. Failures are answered to the model as tool
//! output, never to the client.

use serde_json::Value;

use crate::compaction::{CompactionMode, QualityCheck};
use crate::economics::expected_remaining_calls;
use crate::entry::{EntryId, ToolCall};
use crate::purge::{PurgeRequest, purge};
use crate::tool_output::{READ_OUTPUT_TOOL_NAME, ReadRequest, read_output};

use super::capabilities::{LOAD_TOOLS_NAME, requested_names};
use super::compacting::CompactionAsk;
use super::engine::{EngineError, SessionEngine};
use super::settings::SessionSettings;
use super::tool_schema::{COMPACT_TOOL_NAME, PURGE_TOOL_NAME};

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
    engine: &mut SessionEngine,
    settings: &SessionSettings,
    call: &ToolCall,
    now_ms: u64,
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
    if call.name == LOAD_TOOLS_NAME {
        let output = match requested_names(&call.arguments_json) {
            Ok(names) => engine.load_tools(&names)?.0,
            Err(problem) => format!("strata_load_tools: invalid arguments: {problem}"),
        };
        return Ok(MemoryOutcome { output, purged: false, compacted: false });
    }
    if call.name == COMPACT_TOOL_NAME {
        return compact(engine, settings, &call.arguments_json, now_ms);
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
    let remaining_calls = expected_remaining_calls(engine.calls());
    let (journal, store, counter) = engine.parts_mut();
    let result = purge(
        journal,
        store,
        &settings.tenant,
        &request,
        counter,
        now_ms,
        remaining_calls,
        settings.pricing(),
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
        Err(crate::purge::PurgeError::Journal(error)) => Err(EngineError::Journal(error)),
        Err(error) => Ok(MemoryOutcome {
            output: format!("strata_purge failed: {error}"),
            purged: false,
            compacted: false,
        }),
    }
}

fn compact(
    engine: &mut SessionEngine,
    settings: &SessionSettings,
    arguments: &str,
    now_ms: u64,
) -> Result<MemoryOutcome, EngineError> {
    let instruction = serde_json::from_str::<Value>(arguments)
        .ok()
        .and_then(|value| value.get("resume_instruction").and_then(Value::as_str).map(str::to_owned));
    let ask = CompactionAsk {
        mode: CompactionMode::TaskBoundary,
        reason: "requested by the model through strata_compact_context".to_owned(),
        resume_instruction: instruction,
    };
    if settings.model_summarizer {
        engine.ask_compaction(ask);
        return Ok(MemoryOutcome {
            output: "Compaction started: the configured summariser model is compacting your history in the \
                     background (the extractive summariser takes over if it fails). A later turn shows the \
                     compacted state and your resume instruction; continue with your task meanwhile."
                .to_owned(),
            purged: false,
            compacted: false,
        });
    }
    let record = match engine.compact(settings, &ask, now_ms)? {
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

//! The Context Inspector's record of recent requests: sections, cache outcome and churn per upstream call.

use std::collections::VecDeque;
use std::sync::Mutex;

use serde::Serialize;
use strata_core::budget::{ContextStatus, MaxTokensClamp, StageUsage};
use strata_core::session::ContextEvent;
use strata_core::session::capabilities::ToolBlockStats;

use strata_core::session::turn::Usage;
use strata_core::session::{ChurnCause, SectionSummary};

/// Requests kept for `GET /strata/v1/inspect`.
pub const KEPT_REQUESTS: usize = 32;

/// One upstream call of a request.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RoundRecord {
    /// Sections sent, with tokens and hashes.
    pub sections: Vec<SectionSummary>,
    /// Cache breakpoints placed.
    pub breakpoints: usize,
    /// The first stable section that changed since the previous call, or why the cache broke.
    pub churn: ChurnCause,
    /// Context status at compile time.
    pub status: ContextStatus,
    /// Usage as reported by the provider.
    pub usage: Option<Usage>,
    /// `hit`, `partial`, `miss` or `not_reported`, from the reported cached tokens.
    pub cache_outcome: &'static str,
    /// Memory tools the model called in this round.
    pub memory_calls: Vec<String>,
    /// What Strata did to the context at this call: admitting the turn (spill, dedup, compaction)
    /// and recording its answer (elision, expiry, purge, compaction).
    pub events: Vec<ContextEvent>,
    /// Time waiting for the upstream, microseconds.
    pub upstream_micros: u64,
    /// Each prompt section's budget and use, the output reserve first.
    pub stages: Vec<StageUsage>,
    /// The client's tools as sent: full schemas and summaries.
    pub tools: ToolBlockStats,
    /// The client's max_tokens, when it was lowered to the output reserve.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens_clamp: Option<MaxTokensClamp>,
    /// Tools whose schemas were loaded because the model called them seeing only their summary:
    /// this round's answer was dropped and the call repeated (the client never saw it).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub schema_retry: Vec<String>,
}

/// The cache outcome as the provider reported it.
pub fn cache_outcome(usage: Option<&Usage>) -> &'static str {
    match usage {
        None => "not_reported",
        Some(usage) if usage.cached_tokens == 0 => "miss",
        Some(usage) if usage.cached_tokens + usage.cache_write_tokens >= usage.prompt_tokens => "hit",
        Some(_) => "partial",
    }
}

/// One client request.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestRecord {
    /// The stable operation id of the request.
    pub operation_id: String,
    /// When it arrived, unix ms.
    pub at_ms: u64,
    /// `openai` or `anthropic`.
    pub api: &'static str,
    /// Whether the client streamed.
    pub stream: bool,
    /// `transparent` or `stateful`.
    pub session: &'static str,
    /// Entries journaled from the client's messages.
    pub new_entries: usize,
    /// Upstream calls made.
    pub rounds: Vec<RoundRecord>,
    /// Time the gateway itself spent, microseconds.
    pub overhead_micros: u64,
    /// `ok`, `blocked` or the error.
    pub outcome: String,
}

/// The last [`KEPT_REQUESTS`] requests.
#[derive(Debug, Default)]
pub struct InspectLog {
    records: Mutex<VecDeque<RequestRecord>>,
}

impl InspectLog {
    /// Adds a finished request.
    pub fn push(&self, record: RequestRecord) {
        let mut records = match self.records.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        if records.len() == KEPT_REQUESTS {
            records.pop_front();
        }
        records.push_back(record);
    }

    /// The last `limit` requests, newest first.
    pub fn last(&self, limit: usize) -> Vec<RequestRecord> {
        let records = match self.records.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        records.iter().rev().take(limit).cloned().collect()
    }
}

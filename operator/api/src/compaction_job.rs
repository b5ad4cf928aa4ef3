//! The CompactionJob kind: compact, purge or roll back one agent's history, run as a Job against its volume.
// Each `printcolumn(...)` repeats `type_ = ...`; clippy mistakes that for a duplicated attribute.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

pub use strata_core::compaction::{CompactionMode, CompactionRecord, QualityCheck};

use crate::refs::LocalRef;

/// A request to compact, purge or roll back an agent's journal.
#[derive(CustomResource, KubeSchema, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "strata.dev",
    version = "v1alpha1",
    kind = "CompactionJob",
    doc = "Compact, purge or roll back one agent's journal, run as a Job against its volume.",
    namespaced,
    status = "CompactionJobStatus",
    shortname = "cmpj",
    category = "strata",
    cel,
    printcolumn(name = "Agent", type_ = "string", json_path = ".spec.agentRef.name"),
    printcolumn(name = "Mode", type_ = "string", json_path = ".spec.mode"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Before", type_ = "integer", json_path = ".status.record.tokensBefore"),
    printcolumn(name = "After", type_ = "integer", json_path = ".status.record.tokensAfter"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("self.mode != 'Rollback' || (has(self.rollback) && has(self.rollback.toGeneration))")
        .message("mode Rollback needs rollback.toGeneration: the journal generation to restore (see the Agent's status.journal.generation)"),
    validation = Rule::new("self.mode != 'Purge' || (has(self.purge) && size(self.purge.ids) > 0)")
        .message("mode Purge needs purge.ids: the entry IDs to remove, e.g. [msg_104, tool_res_106]"),
    validation = Rule::new("!has(self.purge) || self.mode == 'Purge'")
        .message("purge is only allowed with mode Purge: remove it or set mode: Purge"),
    validation = Rule::new("!has(self.rollback) || self.mode == 'Rollback'")
        .message("rollback is only allowed with mode Rollback: remove it or set mode: Rollback"),
    validation = Rule::new("self.mode == oldSelf.mode")
        .message("spec.mode is immutable: create a new CompactionJob instead"),
)]
pub struct CompactionJobSpec {
    /// The Agent, in this namespace, whose journal is compacted. Immutable.
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.agentRef is immutable: create a new CompactionJob for another agent"))]
    pub agent_ref: LocalRef,
    /// What to do.
    pub mode: CompactionMode,
    /// Why, recorded in the compaction record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub reason: Option<String>,
    /// Instruction injected after the compacted state, telling the agent how to resume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 8192))]
    pub resume_instruction: Option<String>,
    /// Rollback target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback: Option<RollbackSpec>,
    /// Entries to purge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub purge: Option<PurgeSpec>,
    /// Delete this CompactionJob and its Job this long after it finishes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 31_536_000))]
    pub ttl_seconds_after_finished: Option<u32>,
}

/// Rollback target.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RollbackSpec {
    /// The retained journal generation to restore.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub to_generation: Option<u64>,
}

/// Entries to purge.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct PurgeSpec {
    /// Entry IDs, e.g. msg_104, tool_call_105, tool_res_106, summary_7.
    #[schemars(length(max = 1000), inner(regex(pattern = r"^(msg|tool_call|tool_res|summary)_[0-9]+$")))]
    pub ids: Vec<String>,
    /// Summary that replaces the purged entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 65536))]
    pub summary: Option<String>,
}

/// Observed state of a CompactionJob.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CompactionJobStatus {
    /// Pending, Running, Succeeded or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<CompactionPhase>,
    /// Why the job is in its phase, e.g. AgentNotFound or WaitingForActiveJob.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The batch/v1 Job running `strata compact`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_name: Option<String>,
    /// When the Job started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When it finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// The compaction record the Job reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record: Option<CompactionRecord>,
    /// Standard conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The generation last reconciled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// CompactionJob phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum CompactionPhase {
    /// Waiting for the agent or for another job on it.
    Pending,
    /// The Job is running.
    Running,
    /// The new generation is CURRENT.
    Succeeded,
    /// Nothing changed; see reason and record.
    Failed,
}

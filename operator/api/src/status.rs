//! Status building blocks shared by every kind: conditions and their well-known types.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// Condition type: the object is fully reconciled and serving.
pub const CONDITION_READY: &str = "Ready";
/// Condition type: every reference resolved (policies, ConfigMaps, Secrets).
pub const CONDITION_REFERENCES_RESOLVED: &str = "ReferencesResolved";
/// Condition type: the effective policy was computed without conflicts.
pub const CONDITION_POLICY_RESOLVED: &str = "PolicyResolved";
/// Agent condition: the journal on the agent's volume is this Agent's (False, reason
/// `ForeignJournal`, when the gateway refused a journal another Agent created).
pub const CONDITION_JOURNAL_BOUND: &str = "JournalBound";
/// Agent condition: the compaction summariser can reach its model (False, reason
/// `SummarizerUnavailable`, when it cannot work with the provider it would be sent to).
pub const CONDITION_SUMMARIZER_READY: &str = "SummarizerReady";

/// Find a condition by type.
pub fn find_condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

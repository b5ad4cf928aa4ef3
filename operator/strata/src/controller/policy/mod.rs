//! The ContextPolicy and ClusterContextPolicy controllers: each policy's status counts the Agents
//! that use it and lists problems (locks a tenant's values run into, locks on unset fields, bounds
//! the policy itself violates, invalid selectors). Agents react to policy changes through the
//! Agent controller's watch mappers; counts refresh on a timer so Agent churn cannot flood them.

pub mod cluster_policy;
pub mod context_policy;
pub mod problems;

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use strata_api::context_policy::PolicyStatus;
use strata_api::status::CONDITION_READY;

use crate::controller::conditions::{carry_transition_times, condition, equivalent};

/// How often agent counts are refreshed.
pub const RECOUNT_INTERVAL: Duration = Duration::from_secs(60);

/// The desired status of a policy object.
pub fn desired_status(
    current: Option<&PolicyStatus>,
    agent_count: u32,
    problems: Vec<String>,
    generation: Option<i64>,
    now: Timestamp,
) -> PolicyStatus {
    let (reason, message) = if problems.is_empty() {
        ("Applied", String::new())
    } else {
        ("AppliedWithProblems", format!("{} problem(s); see status.problems", problems.len()))
    };
    let existing = current.map(|s| s.conditions.clone()).unwrap_or_default();
    PolicyStatus {
        agent_count,
        problems,
        conditions: carry_transition_times(
            &existing,
            vec![condition(CONDITION_READY, true, reason, &message, generation, now)],
        ),
        observed_generation: generation,
    }
}

/// Whether `desired` says something `current` does not.
pub fn status_changed(current: Option<&PolicyStatus>, desired: &PolicyStatus) -> bool {
    let current = current.cloned().unwrap_or_default();
    current.agent_count != desired.agent_count
        || current.problems != desired.problems
        || current.observed_generation != desired.observed_generation
        || !equivalent(&current.conditions, &desired.conditions)
}

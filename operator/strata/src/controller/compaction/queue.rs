//! One compaction at a time per agent: the oldest unfinished CompactionJob runs, the rest wait.

use std::sync::Arc;

use strata_api::CompactionJob;

use crate::controller::agent::budget::is_active;

/// The unfinished CompactionJob that may run for the agent now: the oldest one, by creation time
/// and then name.
pub fn runnable(jobs_for_agent: &[Arc<CompactionJob>]) -> Option<Arc<CompactionJob>> {
    jobs_for_agent
        .iter()
        .filter(|job| is_active(job) && job.metadata.deletion_timestamp.is_none())
        .min_by(|a, b| {
            let key =
                |job: &CompactionJob| (job.metadata.creation_timestamp.clone(), job.metadata.name.clone());
            key(a).cmp(&key(b))
        })
        .cloned()
}

//! One compaction per agent at a time, enforced: the decision to create a Job is taken under a
//! per-agent lock and on live reads (never the cache, which can lag behind a CompactionJob or Job
//! created the same second), so two CompactionJobs reconciled at once cannot both start a Job.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::batch::v1::Job;
use kube::Api;
use kube::api::ListParams;
use strata_api::CompactionJob;

use crate::controller::context::Context;
use crate::controller::error::{Error, Result};
use crate::controller::labels::{LABEL_AGENT, LABEL_MANAGED_BY, MANAGED_BY};

type AgentLock = Arc<tokio::sync::Mutex<()>>;

/// Per-agent locks of the CompactionJob controller (this process is the only writer: it leads).
#[derive(Default)]
pub struct AgentLocks {
    locks: Mutex<HashMap<(String, String), AgentLock>>,
}

impl AgentLocks {
    /// Wait for the agent's turn; the guard holds it.
    pub async fn lock(&self, namespace: &str, agent: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = {
            let mut locks = self.locks.lock().unwrap_or_else(PoisonError::into_inner);
            locks.retain(|_, lock| Arc::strong_count(lock) > 1);
            locks.entry((namespace.to_string(), agent.to_string())).or_default().clone()
        };
        lock.lock_owned().await
    }
}

/// Whether a batch Job has finished (its terminal condition is set only once its pods are gone).
pub fn job_finished(job: &Job) -> bool {
    job.status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
}

/// The unfinished compaction Jobs of `agent`, read live from the apiserver.
pub async fn unfinished_jobs(ctx: &Context, namespace: &str, agent: &str) -> Result<Vec<String>> {
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), namespace);
    let selector = format!("{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_AGENT}={agent}");
    let list = jobs
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| Error::kube(format!("listing the compaction Jobs of Agent {namespace}/{agent}"), e))?;
    Ok(list
        .items
        .iter()
        .filter(|job| !job_finished(job))
        .filter_map(|job| job.metadata.name.clone())
        .collect())
}

/// The CompactionJobs of `agent`, read live from the apiserver.
pub async fn compaction_jobs_of(
    ctx: &Context,
    namespace: &str,
    agent: &str,
) -> Result<Vec<Arc<CompactionJob>>> {
    let api: Api<CompactionJob> = Api::namespaced(ctx.client.clone(), namespace);
    let list = api
        .list(&ListParams::default())
        .await
        .map_err(|e| Error::kube(format!("listing the CompactionJobs in {namespace}"), e))?;
    Ok(list.items.into_iter().filter(|job| job.spec.agent_ref.name == agent).map(Arc::new).collect())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::batch::v1::{JobCondition, JobStatus};

    use super::*;

    fn job_with(condition: &str, status: &str) -> Job {
        Job {
            status: Some(JobStatus {
                conditions: Some(vec![JobCondition {
                    type_: condition.into(),
                    status: status.into(),
                    ..JobCondition::default()
                }]),
                ..JobStatus::default()
            }),
            ..Job::default()
        }
    }

    #[test]
    fn only_a_terminal_condition_finishes_a_job() {
        assert!(job_finished(&job_with("Complete", "True")));
        assert!(job_finished(&job_with("Failed", "True")));
        assert!(!job_finished(&job_with("SuccessCriteriaMet", "True")), "pods may still be running");
        assert!(!job_finished(&job_with("Complete", "False")));
        assert!(!job_finished(&Job::default()));
    }

    #[tokio::test]
    async fn one_agent_waits_for_its_turn_and_others_do_not() {
        let locks = AgentLocks::default();
        let first = locks.lock("ns", "a").await;
        let other = tokio::time::timeout(std::time::Duration::from_millis(50), locks.lock("ns", "b")).await;
        assert!(other.is_ok(), "another agent is not blocked");
        let same = tokio::time::timeout(std::time::Duration::from_millis(50), locks.lock("ns", "a")).await;
        assert!(same.is_err(), "the same agent waits");
        drop(first);
        let again = tokio::time::timeout(std::time::Duration::from_millis(50), locks.lock("ns", "a")).await;
        assert!(again.is_ok());
    }
}

//! The Agent controller. One reconcile runs the pipeline top to bottom, each step its own module:
//! [`dereference`] (IO) → [`validate`] (pure) → [`build`] (pure) → [`apply`] (IO) →
//! [`status`] → [`orphans`] (IO), plus the [`budget`] trigger for automatic compaction.

pub mod apply;
pub mod budget;
pub mod build;
pub mod dereference;
pub mod orphans;
pub mod status;
pub mod validate;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use strata_api::Agent;

use crate::controller::context::Context;
use crate::controller::error::{Error, Result, name_of, namespace_of};
use validate::Validation;

/// How soon an Agent with a problem is looked at again (its references are not all watched).
pub const RETRY_INVALID_AFTER: Duration = Duration::from_secs(60);

/// What one reconcile did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReconcileReport {
    /// Children applied.
    pub applied: usize,
    /// Orphans deleted.
    pub deleted: usize,
    /// Whether a Budget CompactionJob was created.
    pub compaction_created: bool,
    /// Whether the status was written.
    pub status_written: bool,
}

impl ReconcileReport {
    /// Writes made to the apiserver.
    pub fn writes(&self) -> usize {
        self.applied + self.deleted + usize::from(self.compaction_created) + usize::from(self.status_written)
    }
}

/// Reconcile one Agent, for the kube-runtime Controller.
pub async fn reconcile(agent: Arc<Agent>, ctx: Arc<Context>) -> Result<Action> {
    let (report, valid) = reconcile_agent(&agent, &ctx).await?;
    tracing::debug!(agent = ?agent.metadata.name, ?report, "reconciled Agent");
    Ok(Action::requeue(if valid { ctx.settings.resync_interval } else { RETRY_INVALID_AFTER }))
}

/// Run the pipeline; returns what was written and whether the Agent was valid.
pub async fn reconcile_agent(agent: &Agent, ctx: &Context) -> Result<(ReconcileReport, bool)> {
    let namespace = namespace_of(&agent.metadata, "Agent")?;
    let name = name_of(&agent.metadata, "Agent")?;
    let mut report = ReconcileReport::default();
    if agent.metadata.deletion_timestamp.is_some() {
        return Ok((report, true));
    }
    ctx.caches.ensure_synced().await?;
    let namespace_ref = ObjectRef::<PartialObjectMeta<Namespace>>::new(&namespace);
    if ctx.caches.namespaces.get(&namespace_ref).is_some_and(|ns| ns.metadata.deletion_timestamp.is_some()) {
        // The namespace is being deleted with everything in it: nothing may be created there.
        return Ok((report, true));
    }

    let inputs = dereference::dereference(agent, ctx).await?;
    let validation = validate::validate(agent, &inputs, &ctx.prefixes, &ctx.master_key)?;
    if let Validation::Valid(valid) = &validation {
        let children = build::build(agent, valid, &ctx.settings)?;
        report.applied = apply::apply_children(ctx, &namespace, &name, &children).await?;
        let uid = agent
            .metadata
            .uid
            .as_deref()
            .ok_or(Error::MissingField { kind: "Agent", field: "metadata.uid" })?;
        report.deleted = orphans::delete_orphans(ctx, &namespace, &name, uid, &children.desired()).await?;
        report.compaction_created =
            budget::trigger_budget_compaction(ctx, agent, &valid.resolution.policy).await?;
    }
    let desired = status::desired_status(agent, &validation, inputs.pod.as_ref(), ctx.now());
    if status::status_changed(agent, &desired) {
        let warnings = status::warnings_to_publish(agent, &desired);
        status::write_status(ctx, agent, &desired).await?;
        report.status_written = true;
        status::publish_warnings(ctx, agent, warnings).await;
    }
    Ok((report, matches!(validation, Validation::Valid(_))))
}

//! Reports context use to the Agent's `status.context` by server-side apply (field manager
//! `strata.dev/gateway`) when `STRATA_AGENT_NAME` and `STRATA_NAMESPACE` are set: at most every
//! `reporting.intervalSeconds`, and within a second of a level change. A failed report is logged and
//! retried at the next interval; it never blocks traffic.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};
use strata_api::Agent;
use strata_core::budget::{BudgetLevel, ContextStatus};
use strata_core::compaction::rfc3339;

use super::pipeline::Gateway;
use strata_core::session::now_ms;

/// The field manager of the gateway's status writes.
pub const FIELD_MANAGER: &str = "strata.dev/gateway";

/// How often the reporter checks whether a report is due.
const CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// The Agent to report to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportTarget {
    /// Agent name.
    pub name: String,
    /// Its namespace.
    pub namespace: String,
}

impl ReportTarget {
    /// From `STRATA_AGENT_NAME` and `STRATA_NAMESPACE`, when both are set and non-empty.
    pub fn from_env() -> Option<Self> {
        let name = std::env::var("STRATA_AGENT_NAME").ok().filter(|v| !v.is_empty())?;
        let namespace = std::env::var("STRATA_NAMESPACE").ok().filter(|v| !v.is_empty())?;
        Some(Self { name, namespace })
    }
}

/// The counters a report carries beside the context status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReportedUsage {
    /// Prompt tokens served from the provider cache, cumulative.
    pub cached_tokens: u64,
    /// Prompt tokens billed fresh, cumulative.
    pub fresh_tokens: u64,
    /// Bytes used on the data volume at the last measurement.
    pub volume_bytes: u64,
}

/// The server-side apply body for `status.context`.
pub fn status_patch(agent: &str, status: &ContextStatus, usage: ReportedUsage, now_ms: u64) -> Value {
    let ReportedUsage { cached_tokens, fresh_tokens, volume_bytes } = usage;
    json!({
        "apiVersion": "strata.dev/v1alpha1",
        "kind": "Agent",
        "metadata": {"name": agent},
        "status": {"context": {
            "tokens": status.tokens,
            "limit": status.limit,
            "available": status.available,
            "percent": status.percent.min(u64::from(u8::MAX)),
            "level": status.level.to_string(),
            "cachedTokens": cached_tokens,
            "freshTokens": fresh_tokens,
            "volumeBytes": volume_bytes,
            "updatedAt": rfc3339(now_ms),
        }}
    })
}

/// When the next report is due.
#[derive(Debug, Default)]
pub struct ReportSchedule {
    last_at: Option<Instant>,
    last_level: Option<BudgetLevel>,
}

impl ReportSchedule {
    /// Whether a report is due at `now` for `level`.
    pub fn due(&self, now: Instant, level: BudgetLevel, interval: Duration) -> bool {
        match (self.last_at, self.last_level) {
            (Some(at), Some(last)) => last != level || now.duration_since(at) >= interval,
            _ => true,
        }
    }

    /// Records an attempt (successful or not) at `now` for `level`.
    pub fn attempted(&mut self, now: Instant, level: BudgetLevel) {
        self.last_at = Some(now);
        self.last_level = Some(level);
    }
}

/// Reports until the task is aborted.
pub async fn run(gateway: Arc<Gateway>, target: ReportTarget) {
    let client = match kube::Client::try_default().await {
        Ok(client) => client,
        Err(error) => {
            tracing::warn!(%error, "no Kubernetes client; status.context is not reported");
            return;
        }
    };
    let agents: Api<Agent> = Api::namespaced(client, &target.namespace);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mut schedule = ReportSchedule::default();
    let mut ticker = tokio::time::interval(CHECK_INTERVAL);
    loop {
        ticker.tick().await;
        let settings = gateway.live.get();
        let for_engine = Arc::clone(&settings);
        let status = match gateway.with_engine(move |engine| engine.status(&for_engine.session)).await {
            Ok(status) => status,
            Err(error) => {
                tracing::warn!(%error, "computing the context status for the Agent report");
                continue;
            }
        };
        let now = Instant::now();
        let interval =
            Duration::from_secs(u64::from(settings.config.policy.reporting.interval_seconds.max(1)));
        if !schedule.due(now, status.level, interval) {
            continue;
        }
        schedule.attempted(now, status.level);
        let usage = ReportedUsage {
            cached_tokens: gateway.metrics.prompt_tokens.with_label_values(&["cached"]).get(),
            fresh_tokens: gateway.metrics.prompt_tokens.with_label_values(&["fresh"]).get(),
            volume_bytes: gateway.volume.bytes(),
        };
        let patch = status_patch(&target.name, &status, usage, now_ms());
        if let Err(error) = agents.patch_status(&target.name, &params, &Patch::Apply(&patch)).await {
            tracing::warn!(%error, agent = %target.name, "reporting status.context failed; retrying at the next interval");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn status(level: BudgetLevel, percent: u64) -> ContextStatus {
        ContextStatus { tokens: 112_000, limit: 128_000, available: 5_000, percent, level }
    }

    #[test]
    fn the_patch_matches_the_agent_status_schema() {
        let usage = ReportedUsage { cached_tokens: 900, fresh_tokens: 100, volume_bytes: 7 << 20 };
        let patch = status_patch("builder", &status(BudgetLevel::Warning, 87), usage, 0);
        let context: strata_api::agent::ContextStatus =
            serde_json::from_value(patch["status"]["context"].clone()).unwrap();
        assert_eq!(context.tokens, 112_000);
        assert_eq!(context.percent, 87);
        assert_eq!(context.level, Some(strata_api::agent::ContextLevel::Warning));
        assert_eq!((context.cached_tokens, context.fresh_tokens), (900, 100));
        assert_eq!(context.volume_bytes, Some(7 << 20), "the volume's bytes reach status.context");
        assert!(context.updated_at.is_some());
        assert_eq!(patch["metadata"]["name"], "builder");
        let over = status_patch("builder", &status(BudgetLevel::Critical, 400), ReportedUsage::default(), 0);
        assert_eq!(over["status"]["context"]["percent"], 255);
    }

    #[test]
    fn reports_on_the_interval_and_at_once_on_a_level_change() {
        let mut schedule = ReportSchedule::default();
        let start = Instant::now();
        let interval = Duration::from_secs(30);
        assert!(schedule.due(start, BudgetLevel::Normal, interval));
        schedule.attempted(start, BudgetLevel::Normal);
        assert!(!schedule.due(start + Duration::from_secs(5), BudgetLevel::Normal, interval));
        assert!(schedule.due(start + Duration::from_secs(5), BudgetLevel::Warning, interval));
        assert!(schedule.due(start + Duration::from_secs(30), BudgetLevel::Normal, interval));
    }
}

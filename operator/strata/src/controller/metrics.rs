//! Prometheus metrics of the controller: reconciles, errors by reason, durations, leadership, and
//! the apiserver requests it made (by HTTP method, refused writes counted apart).

use std::time::{Duration, Instant};

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};

use crate::controller::error::Error;

/// The controller's metrics and their registry.
pub struct Metrics {
    registry: Registry,
    reconciles: IntCounterVec,
    errors: IntCounterVec,
    duration: HistogramVec,
    leader: IntGauge,
    requests: IntCounterVec,
    refused_writes: prometheus::IntCounter,
}

impl Metrics {
    /// Register every metric in a fresh registry.
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let reconciles = IntCounterVec::new(
            Opts::new("strata_controller_reconciles_total", "Reconciles run, by controller"),
            &["controller"],
        )?;
        let errors = IntCounterVec::new(
            Opts::new(
                "strata_controller_reconcile_errors_total",
                "Reconciles that failed, by controller and reason",
            ),
            &["controller", "reason"],
        )?;
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "strata_controller_reconcile_duration_seconds",
                "Reconcile duration, by controller",
            )
            .buckets(vec![0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]),
            &["controller"],
        )?;
        let leader =
            IntGauge::new("strata_controller_leader", "1 while this replica holds the leader Lease")?;
        registry.register(Box::new(reconciles.clone()))?;
        registry.register(Box::new(errors.clone()))?;
        registry.register(Box::new(duration.clone()))?;
        let requests = IntCounterVec::new(
            Opts::new(
                "strata_controller_apiserver_requests_total",
                "Requests sent to the apiserver, by client (reconcilers or leader-election) and HTTP method; a watch counts once, when opened",
            ),
            &["client", "method"],
        )?;
        let refused_writes = prometheus::IntCounter::new(
            "strata_controller_refused_writes_total",
            "Writes refused before they were sent because this replica was not (or no longer) the leader",
        )?;
        registry.register(Box::new(leader.clone()))?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(refused_writes.clone()))?;
        Ok(Metrics { registry, reconciles, errors, duration, leader, requests, refused_writes })
    }

    /// Record one reconcile of `controller`.
    pub fn observe(&self, controller: &str, elapsed: Duration, error: Option<&Error>) {
        self.reconciles.with_label_values(&[controller]).inc();
        self.duration.with_label_values(&[controller]).observe(elapsed.as_secs_f64());
        if let Some(error) = error {
            self.errors.with_label_values(&[controller, error.metric_label()]).inc();
        }
    }

    /// Run `reconcile` and record it.
    pub async fn track<T>(
        &self,
        controller: &str,
        reconcile: impl std::future::Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        let started = Instant::now();
        let result = reconcile.await;
        self.observe(controller, started.elapsed(), result.as_ref().err());
        result
    }

    /// Count one request `client` sent to the apiserver.
    pub fn count_request(&self, client: &str, method: &str) {
        self.requests.with_label_values(&[client, method]).inc();
    }

    /// Count one write refused because this replica does not lead.
    pub fn count_refused_write(&self) {
        self.refused_writes.inc();
    }

    /// Set whether this replica leads.
    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// The name of every metric family registered.
    pub fn names(&self) -> Vec<String> {
        use prometheus::core::Collector;
        let collectors: [&dyn Collector; 6] = [
            &self.reconciles,
            &self.errors,
            &self.duration,
            &self.leader,
            &self.requests,
            &self.refused_writes,
        ];
        collectors.iter().flat_map(|c| c.desc()).map(|desc| desc.fq_name.clone()).collect()
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buffer = Vec::new();
        if let Err(error) = TextEncoder::new().encode(&self.registry.gather(), &mut buffer) {
            return format!("# encoding metrics failed: {error}\n");
        }
        String::from_utf8_lossy(&buffer).into_owned()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn errors_are_counted_by_reason() {
        let metrics = Metrics::new().unwrap();
        metrics.observe("agent", Duration::from_millis(3), None);
        metrics.observe("agent", Duration::from_millis(3), Some(&Error::CacheNotReady("Agent")));
        let text = metrics.render();
        assert!(text.contains("strata_controller_reconciles_total{controller=\"agent\"} 2"), "{text}");
        assert!(
            text.contains(
                "strata_controller_reconcile_errors_total{controller=\"agent\",reason=\"cache_not_ready\"} 1"
            ),
            "{text}"
        );
        assert!(text.contains("strata_controller_reconcile_duration_seconds_bucket"), "{text}");
    }
}

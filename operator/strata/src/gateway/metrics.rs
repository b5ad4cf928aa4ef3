//! Prometheus metrics of the gateway, served on the metrics listener.

use strata_core::budget::Stage;
use strata_core::session::ChurnCause;

use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

/// A metric could not be registered.
#[derive(Debug, thiserror::Error)]
#[error("registering gateway metrics: {reason}")]
pub struct MetricsError {
    reason: String,
}

impl From<prometheus::Error> for MetricsError {
    fn from(error: prometheus::Error) -> Self {
        Self { reason: error.to_string() }
    }
}

/// Every gateway metric.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    /// The name of every metric family registered, in registration order.
    names: Vec<String>,
    /// Tokens in the compiled context.
    pub context_tokens: IntGauge,
    /// The context limit.
    pub context_limit: IntGauge,
    /// Budget level: 0 Normal, 1 Warning, 2 HighRisk, 3 Critical.
    pub context_level: IntGauge,
    /// Prompt tokens by kind (fresh, cached, cache_write) as the provider reported them.
    pub prompt_tokens: IntCounterVec,
    /// Completion tokens.
    pub completion_tokens: IntCounter,
    /// Stable-prefix churn by cause.
    pub churn: IntCounterVec,
    /// Source material over injected context at the last call (spec §17.20 compression ratio).
    pub compression_ratio: Gauge,
    /// Compactions concluded, by outcome (committed, preservation_failed, nothing_to_compact,
    /// superseded, failed).
    pub compaction_outcomes: IntCounterVec,
    /// Tokens of committed compactions' spans before and of their baselines after (`stage`).
    pub compaction_tokens: IntCounterVec,
    /// Transparent-session journal rewinds (the client's history diverged), by cause.
    pub transparent_rewinds: IntCounterVec,
    /// Requests whose system prompt carried volatile material moved below the cache boundary, by kind.
    pub volatile_system: IntCounterVec,
    /// Bytes of tool output spilled to the artifact store.
    pub spilled_bytes: IntCounter,
    /// Tokens per later call saved by eliding old large tool results.
    pub elided_tokens: IntCounter,
    /// Tokens saved by deduplicating repeated tool outputs.
    pub deduplicated_tokens: IntCounter,
    /// Purges run through the memory tool.
    pub purges: IntCounter,
    /// Compactions that rewrote the journal.
    pub compactions: IntCounter,
    /// Compactions run off the engine (the model summariser, or its extractive fallback), by
    /// summariser and outcome.
    pub summarized_compactions: IntCounterVec,
    /// Memory-tool calls executed, by tool.
    pub memory_tool_calls: IntCounterVec,
    /// Requests blocked by the budget.
    pub blocked_operations: IntCounter,
    /// Requests answered from the response cache.
    pub response_cache_hits: IntCounter,
    /// Upstream calls by outcome.
    pub upstream_calls: IntCounterVec,
    /// Bytes of blocked requests held for resume.
    pub held_request_bytes: IntGauge,
    /// Files deleted by the artifact sweeper, by kind.
    pub swept_files: IntCounterVec,
    /// Bytes deleted by the artifact sweeper, by kind.
    pub swept_bytes: IntCounterVec,
    /// Sweeps that found the live generation alone over `generations.maxBytes`, by what was done.
    pub live_generation_over_budget: IntCounterVec,
    /// Sweeps that failed.
    pub sweep_failures: IntCounter,
    /// Bytes used under the data directory.
    pub volume_bytes: IntGauge,
    /// Size of the filesystem holding the data directory.
    pub volume_capacity_bytes: IntGauge,
    /// Bytes still available to the gateway on that filesystem.
    pub volume_available_bytes: IntGauge,
    /// State files found corrupt (and started afresh) when the data directory was opened.
    pub corrupt_state_files: IntCounter,
    /// 1 while gateway.json on disk cannot be used (an older config, or none, is in force).
    pub config_rejected: IntGauge,
    /// 1 while the last good config saved on the volume is in force (gateway.json was unusable at start).
    pub config_from_last_good: IntGauge,
    /// 1 while the egress files (proxy URL, trusted authorities) changed into something unusable
    /// and the client built from the earlier ones is in force.
    pub egress_rejected: IntGauge,
    /// Time the gateway adds to a request (excluding upstream time), seconds.
    pub added_overhead: Histogram,
    /// Time spent waiting for the upstream, seconds.
    pub upstream_duration: Histogram,
    /// Upstream calls repeated after the model called a tool it saw only summarised.
    pub tool_schema_retries: IntCounter,
    /// Times the engine's history lists were grown ahead of need, beside a request.
    pub room_made: IntCounter,
    /// Delegation results entered as digests, by source (structured, extractive).
    pub delegation_digests: IntCounterVec,
    /// Tokens of delegation results, full (artifact store) and returned (parent context).
    pub delegation_tokens: IntCounterVec,
    /// Requests whose max_tokens was lowered to the output reserve.
    pub max_tokens_clamped: IntCounter,
    /// Each prompt section's tokens at the last call, used and allocated.
    pub stage_tokens: IntGaugeVec,
    /// The labelled series every request updates, looked up once.
    pub per_request: RequestSeries,
}

/// The labelled series every request updates, looked up once at start-up: a lookup by label values
/// hashes them and takes the family's lock, and a request would make about two dozen. Each series
/// is therefore exported from the start, at zero until it counts something.
#[derive(Debug, Clone)]
pub struct RequestSeries {
    /// `prompt_tokens{kind}`: fresh, cached, cache_write.
    pub prompt_fresh: IntCounter,
    pub prompt_cached: IntCounter,
    pub prompt_cache_write: IntCounter,
    /// `prefix_cache_requests{outcome}`: hit, miss.
    pub prefix_hit: IntCounter,
    pub prefix_miss: IntCounter,
    /// `transparent_messages{how}`: reused, parsed.
    pub messages_reused: IntCounter,
    pub messages_parsed: IntCounter,
    /// `upstream_calls{outcome="ok"}`.
    pub upstream_ok: IntCounter,
    /// `tool_schemas{form}`: full, summarised.
    pub tool_schemas_full: IntGauge,
    pub tool_schemas_summarised: IntGauge,
    /// `tool_schema_tokens{kind}`: sent, full.
    pub tool_tokens_sent: IntGauge,
    pub tool_tokens_full: IntGauge,
    /// `tool_schemas_loaded{trigger}`: summarised_call, load_tool.
    pub loaded_by_summarised_call: IntCounter,
    pub loaded_by_load_tool: IntCounter,
    /// `churn{cause}`, in the order of [`ChurnCause::ALL`].
    churn: [IntCounter; ChurnCause::ALL.len()],
    /// `stage_tokens{stage, kind}`: used and allocated, in the order of [`Stage::ALL`].
    stages: [(IntGauge, IntGauge); Stage::ALL.len()],
}

impl RequestSeries {
    #[allow(clippy::too_many_arguments)]
    fn resolve(
        prompt_tokens: &IntCounterVec,
        churn: &IntCounterVec,
        prefix_cache_requests: &IntCounterVec,
        transparent_messages: &IntCounterVec,
        upstream_calls: &IntCounterVec,
        [tool_schemas, tool_schema_tokens]: [&IntGaugeVec; 2],
        tool_schemas_loaded: &IntCounterVec,
        stage_tokens: &IntGaugeVec,
    ) -> Self {
        Self {
            prompt_fresh: prompt_tokens.with_label_values(&["fresh"]),
            prompt_cached: prompt_tokens.with_label_values(&["cached"]),
            prompt_cache_write: prompt_tokens.with_label_values(&["cache_write"]),
            prefix_hit: prefix_cache_requests.with_label_values(&["hit"]),
            prefix_miss: prefix_cache_requests.with_label_values(&["miss"]),
            messages_reused: transparent_messages.with_label_values(&["reused"]),
            messages_parsed: transparent_messages.with_label_values(&["parsed"]),
            upstream_ok: upstream_calls.with_label_values(&["ok"]),
            tool_schemas_full: tool_schemas.with_label_values(&["full"]),
            tool_schemas_summarised: tool_schemas.with_label_values(&["summarised"]),
            tool_tokens_sent: tool_schema_tokens.with_label_values(&["sent"]),
            tool_tokens_full: tool_schema_tokens.with_label_values(&["full"]),
            loaded_by_summarised_call: tool_schemas_loaded.with_label_values(&["summarised_call"]),
            loaded_by_load_tool: tool_schemas_loaded.with_label_values(&["load_tool"]),
            churn: ChurnCause::ALL.map(|cause| churn.with_label_values(&[cause.label()])),
            stages: Stage::ALL.map(|stage| {
                (
                    stage_tokens.with_label_values(&[stage.label(), "used"]),
                    stage_tokens.with_label_values(&[stage.label(), "allocated"]),
                )
            }),
        }
    }
}

fn gauge_vec(
    registry: &Registrar,
    name: &str,
    help: &str,
    labels: &[&str],
) -> Result<IntGaugeVec, MetricsError> {
    let metric = IntGaugeVec::new(Opts::new(name, help), labels)?;
    registry.register(metric)
}

/// A registry that remembers the names it registered (a family with no samples yet, such as a
/// labelled counter never incremented, is absent from `Registry::gather`).
#[derive(Default)]
struct Registrar {
    registry: Registry,
    names: std::cell::RefCell<Vec<String>>,
}

impl Registrar {
    fn register<C: prometheus::core::Collector + Clone + 'static>(
        &self,
        metric: C,
    ) -> Result<C, MetricsError> {
        self.names.borrow_mut().extend(metric.desc().iter().map(|desc| desc.fq_name.clone()));
        self.registry.register(Box::new(metric.clone()))?;
        Ok(metric)
    }
}

fn counter_vec(
    registry: &Registrar,
    name: &str,
    help: &str,
    labels: &[&str],
) -> Result<IntCounterVec, MetricsError> {
    let metric = IntCounterVec::new(Opts::new(name, help), labels)?;
    registry.register(metric)
}

fn counter(registry: &Registrar, name: &str, help: &str) -> Result<IntCounter, MetricsError> {
    let metric = IntCounter::new(name, help)?;
    registry.register(metric)
}

fn gauge(registry: &Registrar, name: &str, help: &str) -> Result<IntGauge, MetricsError> {
    let metric = IntGauge::new(name, help)?;
    registry.register(metric)
}

fn float_gauge(registry: &Registrar, name: &str, help: &str) -> Result<Gauge, MetricsError> {
    let metric = Gauge::new(name, help)?;
    registry.register(metric)
}

fn histogram(
    registry: &Registrar,
    name: &str,
    help: &str,
    buckets: Vec<f64>,
) -> Result<Histogram, MetricsError> {
    let metric = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))?;
    registry.register(metric)
}

impl Metrics {
    /// Registers every metric in a fresh registry.
    pub fn new() -> Result<Self, MetricsError> {
        let registry = Registrar::default();
        let overhead_buckets =
            vec![25e-6, 50e-6, 100e-6, 150e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 50e-3];
        let upstream_buckets = vec![1e-3, 10e-3, 100e-3, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0];
        let prompt_tokens = counter_vec(
            &registry,
            "strata_gateway_prompt_tokens_total",
            "Prompt tokens reported by the provider, by kind",
            &["kind"],
        )?;
        let churn = counter_vec(
            &registry,
            "strata_gateway_prefix_churn_total",
            "Requests whose cached prefix changed, by cause",
            &["cause"],
        )?;
        let prefix_cache_requests = counter_vec(
            &registry,
            "strata_gateway_prefix_cache_requests_total",
            "Upstream calls by prefix-cache outcome as the provider's usage reports it: hit (some prompt tokens were cached) or miss (none were)",
            &["outcome"],
        )?;
        let transparent_messages = counter_vec(
            &registry,
            "strata_gateway_transparent_messages_total",
            "Messages of transparent requests: reused (byte-identical to the last request's, not parsed or hashed again) or parsed",
            &["read"],
        )?;
        let upstream_calls = counter_vec(
            &registry,
            "strata_gateway_upstream_calls_total",
            "Upstream calls by outcome",
            &["outcome"],
        )?;
        let tool_schemas = gauge_vec(
            &registry,
            "strata_gateway_tool_schemas",
            "Client tools at the last upstream call, by form: full (whole schema) or summarised (name and one line, lazy schemas)",
            &["form"],
        )?;
        let tool_schema_tokens = gauge_vec(
            &registry,
            "strata_gateway_tool_schema_tokens",
            "Tokens of the client's tool schemas at the last upstream call: sent (summaries included) and full (had every schema been sent)",
            &["kind"],
        )?;
        let tool_schemas_loaded = counter_vec(
            &registry,
            "strata_gateway_tool_schemas_loaded_total",
            "Full tool schemas delivered on demand in the history (the tool block is left alone), by trigger: load_tool (the model called strata_load_tools) or summarised_call (the model called a summarised tool; the call was retried)",
            &["trigger"],
        )?;
        let stage_tokens = gauge_vec(
            &registry,
            "strata_gateway_stage_tokens",
            "Each prompt section's tokens at the last upstream call (output_reserve, system, tools, memory, tool_results, history): used, and allocated by the stage budgets",
            &["stage", "kind"],
        )?;
        let per_request = RequestSeries::resolve(
            &prompt_tokens,
            &churn,
            &prefix_cache_requests,
            &transparent_messages,
            &upstream_calls,
            [&tool_schemas, &tool_schema_tokens],
            &tool_schemas_loaded,
            &stage_tokens,
        );
        Ok(Self {
            context_tokens: gauge(
                &registry,
                "strata_gateway_context_tokens",
                "Tokens in the compiled context",
            )?,
            context_limit: gauge(
                &registry,
                "strata_gateway_context_limit_tokens",
                "Context limit in tokens",
            )?,
            context_level: gauge(
                &registry,
                "strata_gateway_context_level",
                "Budget level: 0 Normal, 1 Warning, 2 HighRisk, 3 Critical",
            )?,
            prompt_tokens,
            completion_tokens: counter(
                &registry,
                "strata_gateway_completion_tokens_total",
                "Completion tokens reported by the provider",
            )?,
            churn,
            compression_ratio: float_gauge(
                &registry,
                "strata_gateway_context_compression_ratio",
                "Source material over injected context at the last call: the context with its entries counted as journaled, over the tokens sent",
            )?,
            compaction_outcomes: counter_vec(
                &registry,
                "strata_gateway_compaction_outcomes_total",
                "Compactions concluded, by outcome (committed, preservation_failed: the preservation check failed and the old generation stays, nothing_to_compact, superseded, failed)",
                &["outcome"],
            )?,
            compaction_tokens: counter_vec(
                &registry,
                "strata_gateway_compaction_tokens_total",
                "Tokens of committed compactions: the compacted spans before and their baselines after (stage)",
                &["stage"],
            )?,
            transparent_rewinds: counter_vec(
                &registry,
                "strata_gateway_transparent_rewinds_total",
                "Journal rewinds because a transparent client's history diverged (retry, edit, new_conversation)",
                &["cause"],
            )?,
            volatile_system: counter_vec(
                &registry,
                "strata_gateway_volatile_system_requests_total",
                "Requests whose system prompt carried volatile material (dates, times, ids) moved below the cache boundary, by kind",
                &["kind"],
            )?,
            spilled_bytes: counter(
                &registry,
                "strata_gateway_spilled_bytes_total",
                "Tool output bytes spilled",
            )?,
            elided_tokens: counter(
                &registry,
                "strata_gateway_elided_tokens_total",
                "Tokens per later call saved by eliding old large tool results",
            )?,
            deduplicated_tokens: counter(
                &registry,
                "strata_gateway_deduplicated_tokens_total",
                "Tokens saved by replacing repeated tool outputs with references",
            )?,
            purges: counter(&registry, "strata_gateway_purges_total", "Purges run by the model")?,
            compactions: counter(
                &registry,
                "strata_gateway_compactions_total",
                "Compactions that rewrote the journal (automatic, model-requested, or through POST /strata/v1/compact)",
            )?,
            summarized_compactions: counter_vec(
                &registry,
                "strata_gateway_summarized_compactions_total",
                "Compactions run with the policy's summariser model off the engine, by summariser (model, fallback: extractive after the model failed) and outcome (committed, rejected, nothing_to_compact, superseded, failed)",
                &["summarizer", "outcome"],
            )?,
            memory_tool_calls: counter_vec(
                &registry,
                "strata_gateway_memory_tool_calls_total",
                "Memory tool calls executed, by tool",
                &["tool"],
            )?,
            blocked_operations: counter(
                &registry,
                "strata_gateway_blocked_operations_total",
                "Requests blocked by the context budget",
            )?,
            response_cache_hits: counter(
                &registry,
                "strata_gateway_response_cache_hits_total",
                "Requests answered from the response cache",
            )?,
            upstream_calls,
            held_request_bytes: gauge(
                &registry,
                "strata_gateway_held_request_bytes",
                "Bytes of blocked requests held for resume (bounded by --max-held-bytes)",
            )?,
            swept_files: counter_vec(
                &registry,
                "strata_gateway_swept_files_total",
                "Files deleted by the artifact sweeper under the volume retention policy, by kind (artifact, generation, compaction_record)",
                &["kind"],
            )?,
            swept_bytes: counter_vec(
                &registry,
                "strata_gateway_swept_bytes_total",
                "Bytes deleted by the artifact sweeper under the volume retention policy, by kind",
                &["kind"],
            )?,
            live_generation_over_budget: counter_vec(
                &registry,
                "strata_gateway_live_generation_over_budget_total",
                "Sweeps that found the live journal generation alone over volume.generations.maxBytes, by action (compacted, compaction_asked, not_compacted)",
                &["action"],
            )?,
            sweep_failures: counter(
                &registry,
                "strata_gateway_sweep_failures_total",
                "Volume sweeps that failed (the next one retries)",
            )?,
            config_rejected: gauge(
                &registry,
                "strata_gateway_config_rejected",
                "1 while gateway.json on disk cannot be used and an older config (or none) is in force",
            )?,
            egress_rejected: gauge(
                &registry,
                "strata_gateway_egress_rejected",
                "1 while the egress proxy or trusted-authorities file changed into something unusable and the upstream client built from the earlier files is in force",
            )?,
            config_from_last_good: gauge(
                &registry,
                "strata_gateway_config_from_last_good",
                "1 while the last good config saved on the volume is in force because gateway.json was unusable at start",
            )?,
            volume_bytes: gauge(
                &registry,
                "strata_gateway_volume_bytes",
                "Bytes used under the data directory (journal, artifacts, state), measured every 30 s",
            )?,
            volume_capacity_bytes: gauge(
                &registry,
                "strata_gateway_volume_capacity_bytes",
                "Size of the filesystem holding the data directory, measured every 30 s",
            )?,
            volume_available_bytes: gauge(
                &registry,
                "strata_gateway_volume_available_bytes",
                "Bytes still available to the gateway on the filesystem holding the data directory, measured every 30 s",
            )?,
            corrupt_state_files: counter(
                &registry,
                "strata_gateway_corrupt_state_files_total",
                "State files found corrupt at startup; each started afresh and was rebuilt",
            )?,
            added_overhead: histogram(
                &registry,
                "strata_gateway_added_overhead_seconds",
                "Time the gateway adds to a request, upstream time excluded",
                overhead_buckets,
            )?,
            upstream_duration: histogram(
                &registry,
                "strata_gateway_upstream_seconds",
                "Time waiting for the upstream",
                upstream_buckets,
            )?,
            tool_schema_retries: counter(
                &registry,
                "strata_gateway_tool_schema_retries_total",
                "Upstream calls repeated, invisibly to the client, because the model called a tool it saw only summarised",
            )?,
            room_made: counter(
                &registry,
                "strata_gateway_history_room_made_total",
                "Times the lists that grow with the history were doubled ahead of need, beside a request instead of inside one",
            )?,
            delegation_digests: counter_vec(
                &registry,
                "strata_gateway_delegation_digests_total",
                "Delegation (sub-agent) results entered into the parent's context as bounded digests, by source: structured (the result matched the digest schema) or extractive (free text)",
                &["source"],
            )?,
            delegation_tokens: counter_vec(
                &registry,
                "strata_gateway_delegation_tokens_total",
                "Tokens of delegation results: full (kept in the artifact store) and returned (the digest in the parent's context)",
                &["kind"],
            )?,
            max_tokens_clamped: counter(
                &registry,
                "strata_gateway_max_tokens_clamped_total",
                "Requests whose max_tokens was above budget.reservedCompletionTokens and was lowered to it",
            )?,
            stage_tokens,
            per_request,
            names: registry.names.into_inner(),
            registry: registry.registry,
        })
    }

    /// Counts a call's prefix churn by its cause.
    pub fn count_churn(&self, cause: ChurnCause) {
        match self.per_request.churn.get(cause as usize) {
            Some(series) => series.inc(),
            None => self.churn.with_label_values(&[cause.label()]).inc(),
        }
    }

    /// Sets a prompt section's gauges: its tokens used and allocated at the last call.
    pub fn set_stage_tokens(&self, stage: Stage, used: i64, allocated: i64) {
        match self.per_request.stages.get(stage as usize) {
            Some((used_series, allocated_series)) => {
                used_series.set(used);
                allocated_series.set(allocated);
            }
            None => {
                self.stage_tokens.with_label_values(&[stage.label(), "used"]).set(used);
                self.stage_tokens.with_label_values(&[stage.label(), "allocated"]).set(allocated);
            }
        }
    }

    /// The name of every metric family registered (for checks that alerts and dashboards query
    /// only exported metrics).
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The text exposition.
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::new();
        if let Err(error) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            tracing::error!(%error, "encoding metrics");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_series_looked_up_once_are_the_labelled_series_they_stand_for() {
        let metrics = Metrics::new().unwrap();
        let series = &metrics.per_request;
        series.prompt_cache_write.inc_by(3);
        series.prefix_miss.inc();
        series.messages_parsed.inc_by(2);
        series.loaded_by_load_tool.inc();
        series.tool_tokens_sent.set(40);
        assert_eq!(metrics.prompt_tokens.with_label_values(&["cache_write"]).get(), 3);
        assert_eq!(metrics.prompt_tokens.with_label_values(&["fresh"]).get(), 0);
        let text = String::from_utf8(metrics.render()).unwrap();
        for sample in [
            "strata_gateway_prefix_cache_requests_total{outcome=\"miss\"} 1",
            "strata_gateway_prefix_cache_requests_total{outcome=\"hit\"} 0",
            "strata_gateway_transparent_messages_total{read=\"parsed\"} 2",
            "strata_gateway_tool_schemas_loaded_total{trigger=\"load_tool\"} 1",
            "strata_gateway_tool_schema_tokens{kind=\"sent\"} 40",
            "strata_gateway_tool_schemas{form=\"full\"} 0",
        ] {
            assert!(text.contains(sample), "{sample} in {text}");
        }
        for (step, cause) in ChurnCause::ALL.into_iter().enumerate() {
            for _ in 0..=step {
                metrics.count_churn(cause);
            }
        }
        for (step, stage) in Stage::ALL.into_iter().enumerate() {
            let step = i64::try_from(step).unwrap();
            metrics.set_stage_tokens(stage, step, 100 + step);
        }
        for (step, cause) in ChurnCause::ALL.into_iter().enumerate() {
            assert_eq!(metrics.churn.with_label_values(&[cause.label()]).get(), step as u64 + 1, "{cause:?}");
        }
        for (step, stage) in Stage::ALL.into_iter().enumerate() {
            let step = i64::try_from(step).unwrap();
            assert_eq!(metrics.stage_tokens.with_label_values(&[stage.label(), "used"]).get(), step);
            assert_eq!(
                metrics.stage_tokens.with_label_values(&[stage.label(), "allocated"]).get(),
                100 + step
            );
        }
        let text = String::from_utf8(metrics.render()).unwrap();
        assert!(text.contains("strata_gateway_prefix_churn_total{cause=\"history_rewrite\"} 6"), "{text}");
        assert!(text.contains("strata_gateway_upstream_calls_total{outcome=\"ok\"} 0"), "{text}");
    }
}

//! The artifact sweeper: every `volume.sweepIntervalSeconds` (and on `POST /strata/v1/sweep`) it
//! runs the engine's volume sweep, counts what was deleted by kind, logs it and keeps the last
//! report for `/strata/v1/status`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use strata_core::lifecycle::SweepKind;
use strata_core::session::{LiveGenerationAction, SweepReport, now_ms};

use super::errors::GatewayError;
use super::pipeline::Gateway;

/// Totals since start and the last sweep, as `/strata/v1/status` shows them.
#[derive(Debug, Default, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SweepStatus {
    /// Sweeps run since start.
    pub sweeps: u64,
    /// Files deleted since start.
    pub files_swept: u64,
    /// Bytes deleted since start.
    pub bytes_swept: u64,
    /// The last sweep's report.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last: Option<SweepReport>,
    /// Why the last sweep failed, when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// The sweeper's shared record.
#[derive(Debug, Default)]
pub struct SweepLog {
    status: Mutex<SweepStatus>,
}

impl SweepLog {
    /// A copy of the current record.
    pub fn status(&self) -> SweepStatus {
        self.status.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    fn update(&self, change: impl FnOnce(&mut SweepStatus)) {
        change(&mut self.status.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
    }
}

/// Sweeps the volume now under the policy in force.
pub async fn sweep_now(gateway: &Gateway) -> Result<SweepReport, GatewayError> {
    let live = gateway.live.get();
    let outcome = gateway
        .with_engine(move |engine| {
            let report = engine.maintain_volume(&live.session, now_ms())?;
            Ok((report, engine.take_compaction_ask()))
        })
        .await;
    match outcome {
        Ok((report, ask)) => {
            if let Some(ask) = ask {
                gateway.compactor.start(ask);
            }
            record(gateway, &report);
            Ok(report)
        }
        Err(error) => {
            gateway.metrics.sweep_failures.inc();
            tracing::warn!(%error, "volume sweep failed; the next sweep retries");
            gateway.sweeps.update(|status| status.last_error = Some(error.to_string()));
            Err(error)
        }
    }
}

fn record(gateway: &Gateway, report: &SweepReport) {
    for kind in &report.kinds {
        let label = kind.kind.label();
        gateway.metrics.swept_files.with_label_values(&[label]).inc_by(kind.files_swept);
        gateway.metrics.swept_bytes.with_label_values(&[label]).inc_by(kind.bytes_swept);
        if kind.files_swept > 0 {
            tracing::info!(
                kind = label,
                files = kind.files_swept,
                bytes = kind.bytes_swept,
                for_age = kind.swept_for_age,
                for_bytes = kind.swept_for_bytes,
                kept_bytes = kind.bytes_kept,
                "volume sweep deleted expired files"
            );
        }
        if kind.over_budget_bytes > 0 && kind.kind != SweepKind::Generation {
            let what = match kind.kind {
                SweepKind::Generation => "the live generation",
                SweepKind::Artifact => "artifacts the live journal or a kept generation references",
                SweepKind::CompactionRecord => "compaction records",
            };
            tracing::warn!(
                kind = label,
                over_budget_bytes = kind.over_budget_bytes,
                "{what} alone exceed the volume policy's maxBytes; they are never deleted (compact the context or raise maxBytes)"
            );
        }
    }
    if let Some(bound) = report.live_generation {
        let outcome = match bound.action {
            LiveGenerationAction::Compacted => "it was compacted and the superseded generation swept",
            LiveGenerationAction::CompactionAsked => {
                "a compaction with the summariser model was started; the next sweep deletes the superseded generation"
            }
            LiveGenerationAction::NotCompacted => {
                "a compaction could not make it smaller: raise volume.generations.maxBytes for this agent"
            }
        };
        gateway.metrics.live_generation_over_budget.with_label_values(&[action_label(bound.action)]).inc();
        tracing::warn!(
            over_budget_bytes = bound.over_budget_bytes,
            action = action_label(bound.action),
            "the live journal generation alone exceeds the volume policy's generations.maxBytes; {outcome}"
        );
    }
    if !report.removed_generations.is_empty() {
        tracing::info!(generations = ?report.removed_generations, "volume sweep removed superseded generations");
    }
    gateway.sweeps.update(|status| {
        status.sweeps += 1;
        status.files_swept += report.files_swept();
        status.bytes_swept += report.bytes_swept();
        status.last = Some(report.clone());
        status.last_error = None;
    });
}

/// Label value of `action` for metrics and logs.
fn action_label(action: LiveGenerationAction) -> &'static str {
    match action {
        LiveGenerationAction::Compacted => "compacted",
        LiveGenerationAction::CompactionAsked => "compaction_asked",
        LiveGenerationAction::NotCompacted => "not_compacted",
    }
}

/// Sweeps every `volume.sweepIntervalSeconds` of the policy in force (re-read before each wait).
pub async fn run(gateway: Arc<Gateway>) {
    loop {
        let interval = gateway.live.get().session.volume.sweep_interval_seconds.max(1);
        tokio::time::sleep(Duration::from_secs(u64::from(interval))).await;
        // Failures are counted and logged in sweep_now; the next interval retries.
        let _ = sweep_now(&gateway).await;
    }
}

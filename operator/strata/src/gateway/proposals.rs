//! Applies compaction proposals written beside the journal by another process (a CompactionJob's
//! `strata compact`) within a second, whether or not chat traffic arrives.

use std::sync::Arc;
use std::time::Duration;

use super::pipeline::Gateway;

/// How often the journal directory is checked for a proposal.
pub const PROPOSAL_POLL: Duration = Duration::from_secs(1);

/// Checks for proposals every [`PROPOSAL_POLL`] until the task is aborted.
pub async fn watch(gateway: Arc<Gateway>) {
    let mut ticks = tokio::time::interval(PROPOSAL_POLL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_error = String::new();
    loop {
        ticks.tick().await;
        let settings = gateway.live.get();
        let applied = gateway
            .with_engine(move |engine| {
                let generation = engine.journal().generation();
                engine.refresh(&settings.session, true)?;
                Ok(engine.journal().generation() != generation)
            })
            .await;
        match applied {
            Ok(applied) => {
                if applied {
                    tracing::info!("applied a compaction proposal from another process");
                }
                last_error.clear();
            }
            // Said once per distinct error: while the engine is unloaded this repeats every tick.
            Err(error) => {
                let error = error.to_string();
                if error != last_error {
                    tracing::warn!(%error, "checking for compaction proposals");
                    last_error = error;
                }
            }
        }
    }
}

//! Group commit: journal appends are written under the engine lock but fsynced outside it, one
//! fsync covering every append made before it started, so concurrent turns share an fsync and no
//! request holds the engine while the disk flushes.

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use strata_core::session::{EngineError, SessionEngine};

/// Tracks which writes are durable.
#[derive(Debug, Default)]
pub struct Durability {
    synced: AtomicU64,
    flushing: tokio::sync::Mutex<()>,
    failure: Mutex<Option<String>>,
}

fn fsync(paths: &[PathBuf]) -> Result<(), String> {
    for path in paths {
        let file =
            std::fs::File::open(path).map_err(|error| format!("opening {}: {error}", path.display()))?;
        file.sync_all().map_err(|error| format!("fsync {}: {error}", path.display()))?;
    }
    Ok(())
}

impl Durability {
    fn failed(&self) -> Option<String> {
        match self.failure.lock() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Whether an fsync failed (the gateway then refuses turns until restarted).
    pub fn is_failed(&self) -> bool {
        self.failed().is_some()
    }

    /// Returns once every write counted up to `seq` is durable, fsyncing if no one else did.
    pub async fn wait(&self, engine: &Mutex<SessionEngine>, seq: u64) -> Result<(), EngineError> {
        if let Some(cause) = self.failed() {
            return Err(EngineError::Durability(cause));
        }
        if self.synced.load(Ordering::Acquire) >= seq {
            return Ok(());
        }
        let _flushing = self.flushing.lock().await;
        if self.synced.load(Ordering::Acquire) >= seq {
            return Ok(());
        }
        let target = match engine.lock() {
            Ok(mut guard) => guard.durable_target(),
            Err(poisoned) => poisoned.into_inner().durable_target(),
        };
        // The fsync runs on this worker: only one flush runs at a time (the `flushing` lock), so at
        // most one worker waits for the disk while the others keep serving; handing it to another
        // thread costs more than the flush itself on fast storage.
        match fsync(&target.paths) {
            Ok(()) => {
                self.synced.fetch_max(target.seq, Ordering::AcqRel);
                Ok(())
            }
            Err(cause) => {
                tracing::error!(%cause, "journal fsync failed; the gateway stops accepting turns");
                match self.failure.lock() {
                    Ok(mut guard) => *guard = Some(cause.clone()),
                    Err(poisoned) => *poisoned.into_inner() = Some(cause.clone()),
                }
                Err(EngineError::Durability(cause))
            }
        }
    }
}

//! The session engine beside the async runtime: a request's engine calls run in place on the
//! serving thread, one at a time in arrival order; other engine work and slow fsyncs run on tokio's
//! blocking pool; appends are made durable by group commit; and an engine that panicked or whose
//! storage failed is dropped and reloaded from the journal once a probe write succeeds, never taken
//! over.
//!
//! In place: a request's engine calls (admitting its turn, compiling a call, journaling an answer)
//! are usually short CPU work, tens to a few hundred microseconds (a memory tool's compaction in
//! `record_answer` takes longer: the other serving threads serve meanwhile, while the connections
//! of its own thread wait). Handing each to the blocking pool cost two thread wake-ups, which on a
//! virtual machine is more than the work itself (BENCHMARKS.md, issue 20). They wait for their turn
//! on an async queue (no thread is parked on the lock), then run on the serving thread that polled
//! them. When other work holds the engine (an admin call, a sweep, a reload), the call goes to the
//! blocking pool instead of blocking the serving thread. An fsync runs in place too while the
//! volume's fsyncs are fast (a moving average under [`INLINE_FSYNC_BELOW_MICROS`]), and on the
//! blocking pool otherwise, so a slow disk never stalls a serving thread for long.
//!
//! Group commit: journal appends are written under the engine lock but fsynced outside it, one
//! fsync covering every append made before it started, so concurrent turns share an fsync and no
//! request holds the engine while the disk flushes. When no flush is in progress, the thread that
//! did the work fsyncs right after releasing the engine (when fsyncs are fast or it is a blocking
//! task); while one is, later requests wait for the next shared flush. A request's turn is
//! journaled without waiting ([`EngineHost::run_in_place_unsynced`]) and made durable before the
//! client is answered: by the answer's own fsync, which covers it, or, for a stream, while the
//! upstream call is under way.

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};
use std::time::Instant;

use strata_core::journal::{JournalError, Storage};
use strata_core::session::{CompactionOutcome, DurableTarget, EngineError, SessionEngine, now_ms};
use tokio_util::task::TaskTracker;

use super::config::Settings;
use super::errors::GatewayError;
use super::metrics::Metrics;

/// The file written and fsynced to check that storage works again before a reload.
const PROBE_FILE: &str = "gateway/.write-probe";

/// What a client is told after a storage fault.
const RELOAD_REASON: &str =
    "the engine is reloaded from the journal once writes succeed again; send the request again";

/// An fsync runs on the worker that asked for it while the moving average of recent fsyncs is
/// below this; above it (a real disk), fsyncs run on the blocking pool.
pub const INLINE_FSYNC_BELOW_MICROS: u64 = 100;

/// The weight of the newest fsync in the moving average, as a shift: 1/8.
const FSYNC_AVERAGE_SHIFT: u32 = 3;

/// What engine work returns: its value, the engine's epoch and the engine's write sequence number.
type Worked<T> = Result<(T, u64, u64), GatewayError>;

/// Where an engine call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// On the worker that polled it, when the engine is free (a request's short calls).
    InPlace,
    /// On the blocking pool (admin calls, sweeps and other work that may take long).
    Blocking,
}

/// Why the engine is not loaded.
#[derive(Debug, Clone)]
struct Unloaded {
    cause: String,
}

#[derive(Debug, Default)]
struct Slot {
    engine: Option<SessionEngine>,
    /// Why the engine was dropped; cleared by a successful reload.
    fault: Option<Unloaded>,
}

/// Writes an engine call made that may not be durable yet: [`EngineHost::make_durable`] waits for
/// them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "writes must be made durable before the client is answered"]
pub struct PendingWrites {
    epoch: u64,
    seq: u64,
}

/// How far the current engine's writes are durable. The epoch and the count change together, so a
/// commit of an engine that was reloaded meanwhile cannot mark the new engine's writes, whose
/// sequence numbers restart, durable.
#[derive(Debug, Default)]
struct Synced {
    epoch: u64,
    seq: u64,
}

/// Owns the session engine of one data directory.
pub struct EngineHost {
    data_dir: PathBuf,
    storage: Arc<dyn Storage>,
    slot: Mutex<Slot>,
    /// Bumped whenever the engine is (re)loaded: sequence numbers restart with each engine.
    epoch: AtomicU64,
    synced: Mutex<Synced>,
    flushing: tokio::sync::Mutex<()>,
    /// The queue of in-place engine calls: they take turns here, in arrival order, without
    /// parking a thread on the engine's lock.
    turns: tokio::sync::Mutex<()>,
    /// Moving average of fsync durations, in nanoseconds.
    fsync_average_nanos: AtomicU64,
    reloads: AtomicU64,
    /// Where the compactions the engine concluded are counted.
    metrics: Metrics,
    /// Where its work on the blocking pool and the work requests start beside themselves run:
    /// shutdown waits for the work in flight, which holds the journal's lock even when the task that
    /// started it was aborted.
    aside: TaskTracker,
}

impl std::fmt::Debug for EngineHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineHost").field("data_dir", &self.data_dir).finish_non_exhaustive()
    }
}

/// Why engine work failed, from its panic's payload.
fn panic_cause(payload: &(dyn std::any::Any + Send)) -> String {
    let text = payload
        .downcast_ref::<&str>()
        .map(|text| (*text).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned());
    format!("the session engine panicked: {text}")
}

/// Whether an engine error leaves the in-memory engine untrustworthy (its storage failed).
fn is_storage_fault(error: &EngineError) -> bool {
    match error {
        EngineError::Durability(_) | EngineError::State { .. } => true,
        EngineError::Journal(error) => {
            matches!(error, JournalError::Io { .. } | JournalError::Poisoned { .. })
        }
        EngineError::Artifact(_) => true,
        // An index line that was not written is still in the engine's memory: reloading from the
        // files puts the two back in step.
        EngineError::Index(_) => true,
        _ => false,
    }
}

impl EngineHost {
    /// Hosts `engine`, opened on `storage` at `data_dir`.
    pub fn new(
        engine: SessionEngine,
        storage: Arc<dyn Storage>,
        data_dir: &Path,
        metrics: Metrics,
        aside: TaskTracker,
    ) -> Self {
        Self {
            data_dir: data_dir.to_owned(),
            storage,
            slot: Mutex::new(Slot { engine: Some(engine), fault: None }),
            epoch: AtomicU64::new(0),
            synced: Mutex::new(Synced::default()),
            flushing: tokio::sync::Mutex::new(()),
            turns: tokio::sync::Mutex::new(()),
            fsync_average_nanos: AtomicU64::new(0),
            reloads: AtomicU64::new(0),
            metrics,
            aside,
        }
    }

    /// Runs `work`, which holds the engine, as a task of its own that shutdown waits for
    /// ([`super::RunningGateway::shutdown`]): work a request starts beside itself.
    pub fn spawn_beside(&self, work: impl Future<Output = ()> + Send + 'static) {
        self.aside.spawn(work);
    }

    /// Counts concluded compactions: by outcome, and the tokens of committed ones before and after.
    fn count_compactions(&self, outcomes: Vec<CompactionOutcome>) {
        for outcome in outcomes {
            self.metrics.compaction_outcomes.with_label_values(&[outcome.label()]).inc();
            if let CompactionOutcome::Committed { tokens_before, tokens_after } = outcome {
                self.metrics.compaction_tokens.with_label_values(&["before"]).inc_by(tokens_before);
                self.metrics.compaction_tokens.with_label_values(&["after"]).inc_by(tokens_after);
            }
        }
    }

    /// Locks the slot. A poisoned lock means the engine panicked mid-operation: its in-memory state
    /// cannot be trusted, so it is dropped (releasing the journal) and reloaded on next use.
    fn lock(&self) -> MutexGuard<'_, Slot> {
        match self.slot.lock() {
            Ok(guard) => guard,
            Err(poisoned) => self.recover(poisoned),
        }
    }

    /// The slot of a poisoned lock, with its engine dropped.
    fn recover<'a>(&'a self, poisoned: PoisonError<MutexGuard<'a, Slot>>) -> MutexGuard<'a, Slot> {
        let mut guard = poisoned.into_inner();
        self.slot.clear_poison();
        guard.engine = None;
        if guard.fault.is_none() {
            guard.fault = Some(Unloaded { cause: "the session engine panicked".into() });
        }
        guard
    }

    fn unload(&self, slot: &mut Slot, cause: String) {
        tracing::error!(%cause, "session engine unloaded; it is reloaded from the journal once storage works");
        slot.engine = None;
        slot.fault = Some(Unloaded { cause });
    }

    /// Writes, fsyncs and removes a probe file: storage accepts writes again.
    fn probe(&self) -> Result<(), String> {
        let probe = self.data_dir.join(PROBE_FILE);
        self.storage
            .write_file(&probe, b"probe")
            .map_err(|error| format!("write {}: {error}", probe.display()))?;
        self.storage.sync_file(&probe).map_err(|error| format!("fsync {}: {error}", probe.display()))?;
        self.storage.remove_file(&probe).map_err(|error| format!("remove {}: {error}", probe.display()))
    }

    /// Reloads the engine from the journal when it is not loaded.
    fn ensure_loaded<'a>(
        &self,
        slot: &'a mut Slot,
        settings: &Settings,
    ) -> Result<&'a mut SessionEngine, GatewayError> {
        if slot.engine.is_none() {
            let cause = slot.fault.as_ref().map(|fault| fault.cause.clone()).unwrap_or_default();
            let unavailable =
                |reason: String| GatewayError::EngineUnavailable { cause: cause.clone(), reason };
            self.probe().map_err(unavailable)?;
            let engine = SessionEngine::open_on(
                Arc::clone(&self.storage),
                &self.data_dir,
                &settings.session,
                now_ms(),
            )
            .map_err(|error| unavailable(format!("reopening the journal: {error}")))?;
            let epoch = self.epoch.fetch_add(1, Ordering::AcqRel) + 1;
            *self.synced() = Synced { epoch, seq: 0 };
            self.reloads.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%cause, "session engine reloaded from the journal");
            slot.fault = None;
            slot.engine = Some(engine);
        }
        slot.engine.as_mut().ok_or_else(|| GatewayError::EngineUnavailable {
            cause: String::new(),
            reason: "the engine is not loaded".into(),
        })
    }

    /// Why the engine is not serving, if it is not.
    #[cfg(test)]
    fn fault(&self) -> Option<String> {
        self.lock().fault.as_ref().map(|fault| fault.cause.clone())
    }

    fn synced(&self) -> MutexGuard<'_, Synced> {
        self.synced.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the writes of engine `epoch` up to `seq` are durable.
    fn is_synced(&self, epoch: u64, seq: u64) -> bool {
        let synced = self.synced();
        synced.epoch == epoch && synced.seq >= seq
    }

    /// Records that an fsync made the writes of engine `epoch` up to `seq` durable; nothing when
    /// the engine was reloaded since.
    fn mark_synced(&self, epoch: u64, seq: u64) {
        let mut synced = self.synced();
        if synced.epoch == epoch {
            synced.seq = synced.seq.max(seq);
        }
    }

    /// Fsyncs the files of `target` and folds the time taken into the moving average; the error
    /// names the file.
    fn fsync(&self, target: &DurableTarget) -> Result<(), String> {
        let started = Instant::now();
        target.sync(self.storage.as_ref())?;
        let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        // Races between two updates lose one sample at worst; the average stays an average.
        let average = self.fsync_average_nanos.load(Ordering::Relaxed);
        let updated = average - (average >> FSYNC_AVERAGE_SHIFT) + (nanos >> FSYNC_AVERAGE_SHIFT);
        self.fsync_average_nanos.store(updated, Ordering::Relaxed);
        Ok(())
    }

    /// Whether fsyncs are fast enough to run on a worker.
    fn fsyncs_are_fast(&self) -> bool {
        self.fsync_average_nanos.load(Ordering::Relaxed) < INLINE_FSYNC_BELOW_MICROS * 1_000
    }

    /// After a failed fsync: unloads the engine of `epoch` (unless it was already reloaded) and
    /// says why, for the client.
    fn fsync_failed(&self, epoch: u64, cause: &str) -> GatewayError {
        let cause = format!("journal fsync failed: {cause}");
        let mut slot = self.lock();
        if self.epoch.load(Ordering::Acquire) == epoch {
            self.unload(&mut slot, cause.clone());
        }
        GatewayError::EngineUnavailable { cause, reason: RELOAD_REASON.into() }
    }

    /// Times the engine was reloaded from the journal.
    pub fn reloads(&self) -> u64 {
        self.reloads.load(Ordering::Relaxed)
    }

    /// Runs `work` on the engine where `placement` says (in place: see the module's comment) and
    /// returns once its writes are durable.
    pub async fn run<T: Send + 'static>(
        self: &Arc<Self>,
        placement: Placement,
        settings: Arc<Settings>,
        work: impl FnOnce(&mut SessionEngine) -> Result<T, EngineError> + Send + 'static,
    ) -> Result<T, GatewayError> {
        let (value, pending) = match placement {
            Placement::InPlace => self.take_turn(settings, work, true).await?,
            Placement::Blocking => self.hand_off(settings, work, true).await?,
        };
        self.make_durable(pending).await?;
        Ok(value)
    }

    /// Returns once the writes of `pending` are durable (at once when a later fsync covered them).
    pub async fn make_durable(self: &Arc<Self>, pending: PendingWrites) -> Result<(), GatewayError> {
        self.wait_durable(pending.epoch, pending.seq).await
    }

    /// [`Self::run`] in place without waiting for the writes to be durable: the caller makes them
    /// durable with [`Self::make_durable`] (or a later [`Self::run`], whose fsync covers every
    /// earlier write) before it acknowledges anything to its client. A request uses this to journal
    /// its turn and go upstream at once, so the turn's fsync overlaps the upstream call or is shared
    /// with the answer's.
    pub async fn run_in_place_unsynced<T: Send + 'static>(
        self: &Arc<Self>,
        settings: Arc<Settings>,
        work: impl FnOnce(&mut SessionEngine) -> Result<T, EngineError> + Send + 'static,
    ) -> Result<(T, PendingWrites), GatewayError> {
        self.take_turn(settings, work, false).await
    }

    /// Waits for this call's turn, then runs it on this worker if the engine is free, or on the
    /// blocking pool if other work holds it.
    async fn take_turn<T: Send + 'static>(
        self: &Arc<Self>,
        settings: Arc<Settings>,
        work: impl FnOnce(&mut SessionEngine) -> Result<T, EngineError> + Send + 'static,
        sync_now: bool,
    ) -> Result<(T, PendingWrites), GatewayError> {
        let _turn = self.turns.lock().await;
        let outcome = match self.try_in_place(&settings, work, sync_now) {
            Ok(outcome) => outcome,
            Err(work) => return self.hand_off(settings, work, sync_now).await,
        };
        let (value, epoch, seq) = match outcome {
            Ok(result) => result?,
            Err(payload) => return Err(self.panicked(panic_cause(payload.as_ref()))),
        };
        Ok((value, PendingWrites { epoch, seq }))
    }

    /// Runs `work` on this thread if the engine is free (a panic is caught and returned), or gives
    /// `work` back if other work holds the engine.
    fn try_in_place<T, W: FnOnce(&mut SessionEngine) -> Result<T, EngineError>>(
        &self,
        settings: &Settings,
        work: W,
        sync_now: bool,
    ) -> Result<std::thread::Result<Worked<T>>, W> {
        let slot = match self.slot.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::Poisoned(poisoned)) => self.recover(poisoned),
            Err(TryLockError::WouldBlock) => return Err(work),
        };
        Ok(std::panic::catch_unwind(AssertUnwindSafe(|| {
            self.work_locked(slot, settings, work, sync_now, Placement::InPlace)
        })))
    }

    /// Runs `work` on the locked engine; with `sync_now`, fsyncs afterwards (outside the lock)
    /// when no flush is in progress and, in place, when fsyncs are fast. Returns the value, the
    /// engine's epoch and its write sequence number.
    fn work_locked<T>(
        &self,
        mut slot: MutexGuard<'_, Slot>,
        settings: &Settings,
        work: impl FnOnce(&mut SessionEngine) -> Result<T, EngineError>,
        sync_now: bool,
        placement: Placement,
    ) -> Worked<T> {
        let engine = self.ensure_loaded(&mut slot, settings)?;
        // Read under the engine's lock, after any reload: the epoch these writes belong to.
        let epoch = self.epoch.load(Ordering::Acquire);
        let value = work(engine);
        for warning in engine.take_warnings() {
            tracing::warn!(%warning, "session engine");
        }
        self.count_compactions(engine.take_compaction_outcomes());
        let seq = engine.appended_seq();
        let poisoned = engine.journal().is_poisoned();
        let value = match value {
            Err(error) if is_storage_fault(&error) || poisoned => {
                let cause = error.to_string();
                self.unload(&mut slot, cause.clone());
                return Err(GatewayError::EngineUnavailable { cause, reason: RELOAD_REASON.into() });
            }
            Err(error) => return Err(GatewayError::Engine(error)),
            Ok(value) => value,
        };
        // The common case: no flush in progress, so this thread fsyncs at once (after letting go
        // of the engine) instead of handing the flush to another task. Writes of other requests
        // made before the target was taken are covered too. In place, only a fast fsync is run
        // here; a slow one is left to `make_durable`, on the blocking pool.
        if sync_now
            && (placement == Placement::Blocking || self.fsyncs_are_fast())
            && !self.is_synced(epoch, seq)
            && let Ok(_flushing) = self.flushing.try_lock()
        {
            let target = engine.durable_target();
            drop(slot);
            if let Err(cause) = self.fsync(&target) {
                return Err(self.fsync_failed(epoch, &cause));
            }
            self.mark_synced(epoch, target.seq);
        }
        Ok((value, epoch, seq))
    }

    /// After engine work panicked: unloads the engine (it is reloaded from the journal on the
    /// next call) and says so.
    fn panicked(&self, cause: String) -> GatewayError {
        let mut slot = self.lock();
        self.unload(&mut slot, cause.clone());
        GatewayError::EngineUnavailable {
            cause,
            reason: "it is reloaded from the journal on the next request".into(),
        }
    }

    /// One hand-off of `work` to the blocking pool; with `sync_now`, the same blocking task fsyncs
    /// afterwards when no flush is in progress.
    async fn hand_off<T: Send + 'static>(
        self: &Arc<Self>,
        settings: Arc<Settings>,
        work: impl FnOnce(&mut SessionEngine) -> Result<T, EngineError> + Send + 'static,
        sync_now: bool,
    ) -> Result<(T, PendingWrites), GatewayError> {
        let host = Arc::clone(self);
        let outcome = self
            .aside
            .spawn_blocking(move || {
                host.work_locked(host.lock(), &settings, work, sync_now, Placement::Blocking)
            })
            .await;
        let (value, epoch, seq) = match outcome {
            Ok(result) => result?,
            Err(join) => {
                let cause = match join.try_into_panic() {
                    Ok(payload) => panic_cause(payload.as_ref()),
                    Err(join) => format!("the session engine task failed: {join}"),
                };
                return Err(self.panicked(cause));
            }
        };
        Ok((value, PendingWrites { epoch, seq }))
    }

    /// Returns once every write counted up to `seq` (of engine `epoch`) is durable, fsyncing on the
    /// blocking pool if no one else did.
    async fn wait_durable(self: &Arc<Self>, epoch: u64, seq: u64) -> Result<(), GatewayError> {
        if self.is_synced(epoch, seq) {
            return Ok(());
        }
        let reloaded = || GatewayError::EngineUnavailable {
            cause: "the engine was reloaded before this request's writes were made durable".into(),
            reason: "send the request again".into(),
        };
        let _flushing = self.flushing.lock().await;
        if self.epoch.load(Ordering::Acquire) != epoch {
            return Err(reloaded());
        }
        if self.is_synced(epoch, seq) {
            return Ok(());
        }
        let host = Arc::clone(self);
        let flushed = self
            .aside
            .spawn_blocking(move || {
                let (target, target_epoch) = {
                    let mut slot = host.lock();
                    match slot.engine.as_mut() {
                        // The epoch read under the engine's lock is the one the target's writes are of.
                        Some(engine) => (engine.durable_target(), host.epoch.load(Ordering::Acquire)),
                        None => {
                            return Err(
                                "the engine was unloaded before its writes were made durable".to_owned()
                            );
                        }
                    }
                };
                host.fsync(&target)?;
                Ok((target_epoch, target.seq))
            })
            .await
            .map_err(|join| format!("the fsync task failed: {join}"))
            .and_then(|result| result);
        match flushed {
            Ok((target_epoch, _)) if target_epoch != epoch => Err(reloaded()),
            Ok((_, target)) => {
                self.mark_synced(epoch, target);
                Ok(())
            }
            Err(cause) => Err(self.fsync_failed(epoch, &cause)),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use strata_api::gateway_config::GatewayConfig;
    use strata_core::journal::StdStorage;

    /// A host of a fresh engine in a temporary directory (kept alive by the returned guard), and
    /// its settings.
    fn hosted() -> (tempfile::TempDir, Arc<Settings>, Arc<EngineHost>) {
        let dir = tempfile::tempdir().unwrap();
        let settings = settings(dir.path());
        let engine = SessionEngine::open(dir.path(), &settings.session, now_ms()).unwrap();
        let host = EngineHost::new(
            engine,
            Arc::new(StdStorage),
            dir.path(),
            Metrics::new().unwrap(),
            TaskTracker::new(),
        );
        (dir, settings, Arc::new(host))
    }

    fn settings(dir: &Path) -> Arc<Settings> {
        let config = GatewayConfig::from_json(
            br#"{"version": 1, "agent": {"name": "a", "namespace": "n"},
                "upstream": {"provider": "OpenAICompatible", "model": "m", "endpoint": "http://127.0.0.1:9/v1",
                             "contextWindow": 32768, "tokenizer": "Approximate"},
                "cacheKey": "k", "cacheKeyShort": "k", "sessionMode": "Transparent"}"#,
        )
        .unwrap();
        Arc::new(Settings::from_config(config, &dir.join("gateway.json")).unwrap())
    }

    /// Engine work that journals a user note and returns the write sequence number.
    fn append_note(
        settings: &Arc<Settings>,
    ) -> impl FnOnce(&mut SessionEngine) -> Result<u64, EngineError> + Send + use<> {
        let settings = Arc::clone(settings);
        move |engine| {
            let content = strata_core::entry::Content::text("a note");
            engine.append_own(&settings.session, strata_core::entry::Role::User, content, now_ms())?;
            Ok(engine.appended_seq())
        }
    }

    /// Aborting the task that handed work to the blocking pool does not stop the work, which holds
    /// the engine (and its journal's lock): the host's tracker lets shutdown wait for it.
    #[tokio::test]
    async fn work_on_the_blocking_pool_is_waited_for_even_when_its_task_was_aborted() {
        let (_dir, settings, host) = hosted();
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let finished = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let caller = {
            let (host, settings, finished) =
                (Arc::clone(&host), Arc::clone(&settings), Arc::clone(&finished));
            tokio::spawn(async move {
                host.run(Placement::Blocking, settings, move |_| {
                    let _ = started_tx.send(());
                    std::thread::sleep(std::time::Duration::from_millis(300));
                    finished.store(true, Ordering::Release);
                    Ok(())
                })
                .await
            })
        };
        started_rx.await.unwrap();
        caller.abort();
        assert!(caller.await.unwrap_err().is_cancelled());
        host.aside.close();
        host.aside.wait().await;
        assert!(finished.load(Ordering::Acquire), "the wait ended before the work did");
        assert_eq!(Arc::strong_count(&host), 1, "the work let go of the engine");
    }

    /// On a current-thread runtime, a call that blocked its worker on the engine's lock would stop
    /// every other task; the ticker shows the worker kept running while other work held the engine.
    #[tokio::test]
    async fn a_call_meeting_a_busy_engine_waits_on_the_blocking_pool_not_on_the_worker() {
        let (_dir, settings, host) = hosted();
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let busy = {
            let host = Arc::clone(&host);
            let settings = Arc::clone(&settings);
            tokio::spawn(async move {
                host.run(Placement::Blocking, settings, move |_| {
                    let _ = started_tx.send(());
                    std::thread::sleep(std::time::Duration::from_millis(300));
                    Ok(())
                })
                .await
            })
        };
        started_rx.await.unwrap();
        let ticks = Arc::new(AtomicU64::new(0));
        let ticker = {
            let ticks = Arc::clone(&ticks);
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    ticks.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        let seq = host.run(Placement::InPlace, Arc::clone(&settings), append_note(&settings)).await.unwrap();
        ticker.abort();
        busy.await.unwrap().unwrap();
        assert!(seq > 0, "the call ran once the engine was free");
        assert!(ticks.load(Ordering::Relaxed) >= 5, "the worker was blocked: {ticks:?}");
    }

    #[tokio::test]
    async fn fast_fsyncs_run_in_place_and_slow_ones_are_left_to_the_blocking_pool() {
        let (_dir, settings, host) = hosted();

        let (seq, pending) =
            host.take_turn(Arc::clone(&settings), append_note(&settings), true).await.unwrap();
        assert!(host.is_synced(pending.epoch, seq), "a fast volume: fsynced in place");
        host.make_durable(pending).await.unwrap();

        host.fsync_average_nanos.store(5_000_000, Ordering::Relaxed);
        let (seq, pending) =
            host.take_turn(Arc::clone(&settings), append_note(&settings), true).await.unwrap();
        assert!(!host.is_synced(pending.epoch, seq), "a slow volume: not fsynced on the worker");
        host.make_durable(pending).await.unwrap();
        assert!(host.is_synced(pending.epoch, seq), "made durable on the blocking pool");
    }

    /// Sequence numbers restart with each engine: a commit that finishes after a reload must not
    /// mark the new engine's writes durable, and writes of the old engine cannot be waited for.
    #[tokio::test]
    async fn a_commit_of_a_reloaded_engine_does_not_mark_the_new_engines_writes_durable() {
        let (_dir, settings, host) = hosted();
        let (old_seq, old_pending) =
            host.take_turn(Arc::clone(&settings), append_note(&settings), false).await.unwrap();
        host.unload(&mut host.lock(), "a storage fault, for the test".into());

        let (seq, pending) =
            host.take_turn(Arc::clone(&settings), append_note(&settings), false).await.unwrap();
        assert_eq!(host.reloads(), 1);
        assert_ne!(pending.epoch, old_pending.epoch, "the reload started a new epoch");
        assert!(seq <= old_seq + 1, "sequence numbers restarted ({seq} after {old_seq})");
        host.mark_synced(old_pending.epoch, old_seq + 100);
        assert!(!host.is_synced(pending.epoch, seq), "the late commit of the old engine marked nothing");

        host.make_durable(pending).await.unwrap();
        assert!(host.is_synced(pending.epoch, seq));
        let stale = host.make_durable(old_pending).await;
        assert!(
            matches!(&stale, Err(GatewayError::EngineUnavailable { cause, .. }) if cause.contains("reloaded")),
            "{stale:?}"
        );
    }

    #[tokio::test]
    async fn a_panic_unloads_the_engine_and_the_next_call_reloads_it_from_the_journal() {
        for placement in [Placement::Blocking, Placement::InPlace] {
            let (_dir, settings, host) = hosted();
            let generation = host
                .run(placement, Arc::clone(&settings), |engine| Ok(engine.journal().generation()))
                .await
                .unwrap();

            let failed = host
                .run(placement, Arc::clone(&settings), |_| -> Result<(), EngineError> { panic!("boom") })
                .await;
            let Err(GatewayError::EngineUnavailable { cause, .. }) = failed else { panic!("{failed:?}") };
            assert!(cause.contains("panicked: boom"), "{placement:?}: {cause}");
            assert!(host.fault().unwrap().contains("boom"), "{placement:?}: not ready until reloaded");
            assert_eq!(host.reloads(), 0);

            let after = host
                .run(placement, Arc::clone(&settings), |engine| Ok(engine.journal().generation()))
                .await
                .unwrap();
            assert_eq!(after, generation, "{placement:?}: reloaded from the same journal");
            assert_eq!((host.reloads(), host.fault()), (1, None), "{placement:?}");
        }
    }
}

//! The controller's token counting, on a thread of its own that holds the BPE tables only while
//! there is counting to do: it exits after a quiet spell, freeing the tables and its piece cache.
//!
//! The controller counts a stable prefix once per distinct (sources, tokenizer) pair and then
//! serves the memo, so for all but the first seconds after a policy or prompt change it counts
//! nothing. Keeping o200k_base loaded for the life of the process would cost about 11 MiB of
//! tables plus 1.2 MiB of piece cache on every thread that ever counted (BENCHMARKS.md, "Third run
//! at 10,000 Agents"); here it costs nothing while quiet and one table build after each quiet spell.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use strata_core::tokens::{TokenCounter, TokenizerKind};

/// How long the thread and its tables outlive the last count.
pub const DEFAULT_IDLE: Duration = Duration::from_secs(60);

/// The thread's name, as `top -H` and a profiler show it.
const THREAD_NAME: &str = "strata-count";

/// A piece of counting work, run on the counting thread with its tokenizers.
type Job = Box<dyn FnOnce(&mut Tokenizers) + Send>;

/// The sender of the running thread's queue; `None` while no thread runs.
type Slot = Arc<Mutex<Option<Sender<Job>>>>;

/// The counting thread could not run the work.
#[derive(Debug, thiserror::Error)]
pub enum CountingError {
    /// The operating system refused a new thread.
    #[error("could not start the token-counting thread: {0}")]
    Spawn(#[source] std::io::Error),
    /// The work panicked, so it has no answer (the thread lives on for the next call).
    #[error("the token-counting work panicked before it answered")]
    Stopped,
}

/// A handle on the counting thread; clones share it.
#[derive(Clone)]
pub struct CountingThread {
    slot: Slot,
    idle: Duration,
}

impl Default for CountingThread {
    fn default() -> Self {
        Self::new(DEFAULT_IDLE)
    }
}

impl CountingThread {
    /// A handle whose thread starts with the first work and exits `idle` after the last.
    pub fn new(idle: Duration) -> Self {
        Self { slot: Arc::default(), idle }
    }

    /// Runs `work` with a counter for `kind` on the counting thread, starting the thread if none
    /// runs, and waits for its answer. Calls are served one at a time, in order.
    pub fn run<T, F>(&self, kind: TokenizerKind, work: F) -> Result<T, CountingError>
    where
        T: Send + 'static,
        F: FnOnce(&TokenCounter) -> T + Send + 'static,
    {
        let (reply, answer) = mpsc::sync_channel(1);
        self.submit(Box::new(move |tokenizers: &mut Tokenizers| {
            // The caller waits on `answer` until this sends or the thread unwinds.
            let _ = reply.send(work(tokenizers.counter(kind)));
        }))?;
        answer.recv().map_err(|_| CountingError::Stopped)
    }

    /// Whether a counting thread is running now (and so holds tables).
    pub fn is_running(&self) -> bool {
        lock(&self.slot).is_some()
    }

    fn submit(&self, job: Job) -> Result<(), CountingError> {
        let mut slot = lock(&self.slot);
        let job = match slot.as_ref() {
            Some(sender) => match sender.send(job) {
                Ok(()) => return Ok(()),
                // Its thread has gone (only if it could not catch a panic): start another.
                Err(mpsc::SendError(job)) => job,
            },
            None => job,
        };
        let (sender, receiver) = mpsc::channel();
        let thread_slot = self.slot.clone();
        let idle = self.idle;
        std::thread::Builder::new()
            .name(THREAD_NAME.into())
            .spawn(move || serve(&receiver, &thread_slot, idle))
            .map_err(CountingError::Spawn)?;
        sender.send(job).map_err(|_| CountingError::Stopped)?;
        *slot = Some(sender);
        Ok(())
    }
}

/// The thread's loop: run jobs until none comes for `idle`, then leave, dropping the tables.
fn serve(queue: &Receiver<Job>, slot: &Slot, idle: Duration) {
    let mut tokenizers = Tokenizers::default();
    loop {
        match queue.recv_timeout(idle) {
            Ok(job) => run_job(job, &mut tokenizers),
            Err(RecvTimeoutError::Timeout) => {
                // Senders enqueue under this lock, so once it is held nothing new can arrive
                // unseen: run what raced in, or clear the slot and leave.
                let mut guard = lock(slot);
                match queue.try_recv() {
                    Ok(job) => {
                        drop(guard);
                        run_job(job, &mut tokenizers);
                    }
                    Err(_) => {
                        *guard = None;
                        return;
                    }
                }
            }
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// Runs one job; a panic in it drops its reply (its caller gets [`CountingError::Stopped`]) and
/// leaves the thread serving. The counters are read-only while counting, so none is left broken.
fn run_job(job: Job, tokenizers: &mut Tokenizers) {
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(tokenizers)));
    if outcome.is_err() {
        tracing::error!("token counting panicked; the reconcile that asked will retry");
    }
}

fn lock(slot: &Slot) -> MutexGuard<'_, Option<Sender<Job>>> {
    slot.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The counters this thread has built, one per tokenizer kind, each with private tables.
#[derive(Default)]
struct Tokenizers {
    loaded: Vec<TokenCounter>,
}

impl Tokenizers {
    fn counter(&mut self, kind: TokenizerKind) -> &TokenCounter {
        let index = match self.loaded.iter().position(|counter| counter.kind() == kind) {
            Some(index) => index,
            None => {
                self.loaded.push(TokenCounter::with_private_tables(kind));
                self.loaded.len() - 1
            }
        };
        &self.loaded[index]
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::time::Instant;

    use super::*;

    fn wait_until_stopped(thread: &CountingThread) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while thread.is_running() {
            assert!(Instant::now() < deadline, "the counting thread never left after its idle time");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn counts_like_the_shared_tables_and_leaves_when_idle_then_starts_again() {
        let thread = CountingThread::new(Duration::from_millis(50));
        assert!(!thread.is_running());
        let text = "The quick brown fox, 12345 times, in /var/lib/strata.".repeat(10);
        let expected = TokenCounter::new(TokenizerKind::O200kBase).unwrap().count(&text);

        let owned = text.clone();
        let counted = thread.run(TokenizerKind::O200kBase, move |counter| counter.count(&owned)).unwrap();
        assert_eq!(counted, expected);
        wait_until_stopped(&thread);

        let counted = thread.run(TokenizerKind::O200kBase, move |counter| counter.count(&text)).unwrap();
        assert_eq!(counted, expected, "a restarted thread counts the same");
    }

    #[test]
    fn serves_each_kind_with_its_own_counter() {
        let thread = CountingThread::new(Duration::from_secs(5));
        for kind in [TokenizerKind::Cl100kBase, TokenizerKind::O200kBase, TokenizerKind::Cl100kBase] {
            assert_eq!(thread.run(kind, TokenCounter::kind).unwrap(), kind);
        }
    }

    #[test]
    fn a_panicking_job_is_an_error_and_the_thread_serves_the_next_call() {
        let thread = CountingThread::new(Duration::from_secs(5));
        let failed = thread.run(TokenizerKind::O200kBase, |_| -> u32 { panic!("a bug in counting") });
        assert!(matches!(failed, Err(CountingError::Stopped)), "{failed:?}");
        assert!(thread.is_running(), "the thread outlives a panicking job");
        let counted = thread.run(TokenizerKind::O200kBase, |counter| counter.count("hello world")).unwrap();
        assert_eq!(counted, 2);
    }

    #[test]
    fn concurrent_callers_each_get_their_own_answer() {
        let thread = CountingThread::new(Duration::from_secs(5));
        let answers: Vec<usize> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..8)
                .map(|n| {
                    let thread = thread.clone();
                    scope.spawn(move || thread.run(TokenizerKind::O200kBase, move |_| n).unwrap())
                })
                .collect();
            handles.into_iter().map(|handle| handle.join().unwrap()).collect()
        });
        assert_eq!(answers, (0..8).collect::<Vec<_>>());
    }
}

//! The one thread that owns the agent's context. Requests queue closures; the thread runs every
//! queued closure, makes all their appends durable with one fsync (group commit) and only then
//! answers them. Async workers never block on the journal, and concurrent turns share an fsync.

use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;

use super::engine::{Engine, EngineError};

/// Closures run between two fsyncs at most.
const MAX_BATCH: usize = 512;

type Delivery = Box<dyn FnOnce(Option<&str>) + Send>;
type Job = Box<dyn FnOnce(&mut Engine) -> Delivery + Send>;

/// The handle requests use to reach the engine thread.
#[derive(Debug)]
pub struct EngineWorker {
    sender: Sender<Job>,
}

impl EngineWorker {
    /// Moves `engine` to its own thread. The thread ends, dropping the engine and releasing the
    /// journal lock, when the last handle is dropped.
    pub fn spawn(engine: Engine) -> std::io::Result<(Self, JoinHandle<()>)> {
        let (sender, receiver) = channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("strata-journal".into())
            .spawn(move || serve(engine, receiver))?;
        Ok((Self { sender }, thread))
    }

    /// Runs `work` on the engine and answers once its appends are durable.
    pub async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Engine) -> Result<T, EngineError> + Send + 'static,
    ) -> Result<T, EngineError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |engine| {
            let result = work(engine);
            Box::new(move |failure: Option<&str>| {
                let result = match failure {
                    Some(cause) => result.and(Err(EngineError::Durability(cause.to_owned()))),
                    None => result,
                };
                let _ = reply.send(result);
            })
        });
        self.sender.send(job).map_err(|_| EngineError::Stopped)?;
        answer.await.map_err(|_| EngineError::Stopped)?
    }
}

fn serve(mut engine: Engine, receiver: Receiver<Job>) {
    while let Ok(first) = receiver.recv() {
        let mut deliveries = vec![first(&mut engine)];
        while deliveries.len() < MAX_BATCH {
            match receiver.try_recv() {
                Ok(job) => deliveries.push(job(&mut engine)),
                Err(_) => break,
            }
        }
        let failure = engine.make_durable().err().map(|error| error.to_string());
        if let Some(cause) = &failure {
            tracing::error!(%cause, "journal fsync failed; the gateway stops accepting turns");
        }
        for delivery in deliveries {
            delivery(failure.as_deref());
        }
    }
}

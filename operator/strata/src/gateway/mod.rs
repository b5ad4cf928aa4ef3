//! `strata gateway`: the context gateway sidecar, an OpenAI- and Anthropic-compatible proxy that
//! journals every turn, compiles a cache-stable prompt, enforces the context budget and gives the
//! model its memory tools.

mod answer_wire;
mod anthropic;
mod body_buffer;
mod compactor;
pub mod config;
pub(crate) mod connector;
mod egress;
mod engine_host;
mod errors;
mod http_serve;
mod inspect;
mod metrics;
mod openai;
mod pending;
mod pipeline;
mod plain_http;
mod proposals;
pub(crate) mod provider;
mod reporter;
mod response_cache;
mod routes;
mod schema_retry;
mod server;
mod serving_threads;
mod sse;
#[cfg(test)]
mod stream_props;
mod sweeper;
mod unconfigured;
pub(crate) mod upstream;
mod volume;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::serve::ListenerExt;
use routes::{Routes, Switch};
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::task::TaskTracker;

pub use metrics::MetricsError;
pub use pending::DEFAULT_MAX_HELD_BYTES;
pub use pipeline::SESSION_HEADER;
pub use upstream::DEFAULT_MAX_RESPONSE_BYTES;

/// The name of every metric family the gateway exports (alerts and dashboards are checked
/// against it).
pub fn metric_names() -> Result<Vec<String>, MetricsError> {
    Ok(metrics::Metrics::new()?.names().to_vec())
}

/// Largest request body accepted by default (32 MiB).
pub const DEFAULT_MAX_BODY_BYTES: usize = 32 * 1024 * 1024;

/// Threads that serve the API by default (see [`GatewayArgs::worker_threads`]).
pub const DEFAULT_WORKER_THREADS: u8 = 2;

/// Arguments of `strata gateway`.
#[derive(Debug, Clone, clap::Args)]
pub struct GatewayArgs {
    /// gateway.json: upstream, model, effective policy, stable-prefix sources and cache key.
    /// Changes to the file are applied without a restart. An unusable file never stops the
    /// gateway: it serves with the last good config saved on the volume, or waits, not ready.
    #[arg(long)]
    pub config: PathBuf,
    /// The agent's data directory: journal, artifacts and gateway state.
    #[arg(long)]
    pub data_dir: PathBuf,
    /// Address of the OpenAI/Anthropic-compatible API.
    #[arg(long, default_value = "127.0.0.1:4100")]
    pub listen: SocketAddr,
    /// Address of the Prometheus metrics endpoint (`/metrics`).
    #[arg(long, default_value = "0.0.0.0:9464")]
    pub metrics_listen: SocketAddr,
    /// Largest accepted request body in bytes; larger bodies get 413.
    #[arg(long, default_value_t = DEFAULT_MAX_BODY_BYTES)]
    pub max_body_bytes: usize,
    /// Largest upstream answer read in bytes (a whole JSON answer, or one round of a stream);
    /// a larger one is cut off and the client gets a 502 in its provider's shape.
    #[arg(long, default_value_t = upstream::DEFAULT_MAX_RESPONSE_BYTES)]
    pub max_upstream_response_bytes: usize,
    /// Bytes of blocked requests held for `resume` (at most 64 requests); past it the oldest is
    /// forgotten, and its resume says so.
    #[arg(long, default_value_t = pending::DEFAULT_MAX_HELD_BYTES)]
    pub max_held_bytes: usize,
    /// The summariser's API key, used when the policy gives the summariser its own
    /// `credentialsSecretRef` (the operator mounts that Secret key here).
    #[arg(long, value_name = "PATH", default_value = crate::compact::SUMMARIZER_KEY_FILE)]
    pub summarizer_api_key_file: PathBuf,
    /// Threads that serve the API and run the engine's calls in place (1 to 64). Each runs a
    /// single-threaded runtime of its own and serves the connections handed to it, so a request
    /// never wakes another serving thread. A fixed number, not one per CPU of the node: a sidecar
    /// serves one agent, and every thread that runs engine work keeps its own tokenizer cache
    /// (about 1.2 MB), so one per core would let the sidecar's memory grow with the node instead of
    /// with the agent.
    #[arg(long, default_value_t = DEFAULT_WORKER_THREADS, value_parser = clap::value_parser!(u8).range(1..=64))]
    pub worker_threads: u8,
    /// Log format.
    #[command(flatten)]
    pub log: crate::logging::LogArgs,
}

/// Why the gateway cannot start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// gateway.json is unusable.
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    /// The data directory cannot be opened (locked by another writer, corrupt, unreadable).
    #[error("data dir {path}: {cause}")]
    DataDir {
        /// The data directory.
        path: PathBuf,
        /// The journal's (or state file's) error.
        cause: strata_core::session::EngineError,
    },
    /// The journal belongs to another Agent (or its owner record cannot be read or written).
    #[error("data dir {path}: {cause}")]
    JournalOwner {
        /// The data directory.
        path: PathBuf,
        /// Why the journal may not be used.
        cause: strata_core::journal::OwnerError,
    },
    /// The HTTP client cannot be built.
    #[error(transparent)]
    Client(#[from] upstream::ClientError),
    /// Metrics cannot be registered.
    #[error(transparent)]
    Metrics(#[from] metrics::MetricsError),
    /// A thread that serves the API cannot be started.
    #[error(transparent)]
    ServingThread(#[from] serving_threads::SpawnError),
    /// A listener cannot be bound.
    #[error("binding {address}: {cause}")]
    Bind {
        /// The address.
        address: SocketAddr,
        /// The I/O error.
        cause: std::io::Error,
    },
}

/// A running gateway: its bound addresses and the handle to stop it.
#[derive(Debug)]
pub struct RunningGateway {
    /// Where the API listens.
    pub address: SocketAddr,
    /// Where metrics are served.
    pub metrics_address: SocketAddr,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    /// The threads that serve the API besides the one that started the gateway.
    serving_threads: serving_threads::ServingThreads,
    background: Background,
    /// The engine's work on the blocking pool and beside requests ([`engine_host::EngineHost::spawn_beside`]).
    aside: TaskTracker,
    failed: tokio::sync::mpsc::Receiver<StartError>,
}

/// Background tasks, some started only once a usable config appears.
type Background = Arc<Mutex<Vec<JoinHandle<()>>>>;

impl RunningGateway {
    /// Stops accepting requests, waits for the servers and for the work requests started beside
    /// themselves (streamed answers, room for the history, a background compaction, which ends by
    /// its deadline), and releases the data directory.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        let background: Vec<JoinHandle<()>> =
            std::mem::take(&mut *self.background.lock().unwrap_or_else(PoisonError::into_inner));
        for task in &background {
            task.abort();
        }
        for task in self.tasks.into_iter().chain(background) {
            let _ = task.await;
        }
        self.serving_threads.stopped_serving().await;
        self.aside.close();
        if !self.aside.is_empty() {
            tracing::info!(tasks = self.aside.len(), "stopping: waiting for work started beside requests");
        }
        self.aside.wait().await;
        self.serving_threads.end().await;
    }

    /// Resolves when a gateway that started without a usable config cannot start once the file is
    /// fixed (its data directory is refused): the process should exit with this error.
    pub async fn failed(&mut self) -> StartError {
        match self.failed.recv().await {
            Some(error) => error,
            None => std::future::pending().await,
        }
    }
}

/// Connections the kernel may queue for the gateway before it accepts them (the kernel caps it at
/// `net.core.somaxconn`). With tokio's default of 1024, some of 2,048 streams connecting at once
/// got connection resets; with this backlog none did (BENCHMARKS.md).
pub const LISTEN_BACKLOG: u32 = 4096;

async fn bind(address: SocketAddr) -> Result<TcpListener, StartError> {
    let refused = |cause| StartError::Bind { address, cause };
    let socket =
        if address.is_ipv4() { TcpSocket::new_v4() } else { TcpSocket::new_v6() }.map_err(refused)?;
    // What `TcpListener::bind` does too: a restarted gateway can bind while old connections linger.
    socket.set_reuseaddr(true).map_err(refused)?;
    socket.bind(address).map_err(refused)?;
    socket.listen(LISTEN_BACKLOG).map_err(refused)
}

/// Serves `routes` on `listener` until `stop`. Accepted connections send without Nagle's delay
/// (`TCP_NODELAY`, which hyper leaves off): a streamed answer is many small writes, and with Nagle
/// each waits for the client's acknowledgement of the last, which a client may delay by 40 ms.
fn serve(listener: TcpListener, routes: Switch, stop: watch::Receiver<bool>) -> JoinHandle<()> {
    let listener = listener.tap_io(|connection| send_without_delay(connection));
    tokio::spawn(http_serve::serve_until(listener, routes, stop))
}

/// Turns Nagle's delay off on an accepted connection (see [`serve`]); a failure only costs latency.
fn send_without_delay(connection: &tokio::net::TcpStream) {
    if let Err(error) = connection.set_nodelay(true) {
        tracing::debug!(%error, "cannot set TCP_NODELAY on an accepted connection");
    }
}

/// Loads the config (falling back to the last good copy on the volume, or waiting not ready for a
/// usable file), binds the journal to the config's Agent UID (refusing another Agent's journal),
/// opens the data directory (refusing a locked or corrupt one with the journal's error), binds both
/// listeners and starts serving.
pub async fn start(args: &GatewayArgs) -> Result<RunningGateway, StartError> {
    start_on(args, Arc::new(strata_core::journal::StdStorage)).await
}

/// [`start`] with the data directory on `storage` (tests inject storage faults through it).
pub async fn start_on(
    args: &GatewayArgs,
    storage: Arc<dyn strata_core::journal::Storage>,
) -> Result<RunningGateway, StartError> {
    let metrics = metrics::Metrics::new()?;
    let last_good = config::LastGood::new(Arc::clone(&storage), &args.data_dir);
    let startup = config::Startup::load(&args.config, &last_good);
    let (shutdown, stop) = watch::channel(false);
    let background: Background = Arc::default();
    let aside = TaskTracker::new();
    let (report_failure, failed) = tokio::sync::mpsc::channel(1);
    let (api_switch, metrics_switch) = match startup {
        config::Startup::Usable { settings, bytes } => {
            let gateway =
                assemble(args, &storage, settings, metrics, None, &aside).map_err(|error| *error)?;
            last_good.save(&bytes);
            let switches = (
                Switch::new(Routes::api(&gateway)),
                Switch::new(Routes::only(server::metrics_router(Arc::clone(&gateway)))),
            );
            spawn_background(args, &gateway, (last_good, Some(bytes)), &background);
            switches
        }
        config::Startup::LastGood { settings, error } => {
            metrics.config_rejected.set(1);
            metrics.config_from_last_good.set(1);
            let problem =
                config::ConfigProblem { error: error.to_string(), in_force: config::InForce::LastGood };
            let gateway =
                assemble(args, &storage, settings, metrics, Some(problem), &aside).map_err(|error| *error)?;
            let switches = (
                Switch::new(Routes::api(&gateway)),
                Switch::new(Routes::only(server::metrics_router(Arc::clone(&gateway)))),
            );
            spawn_background(args, &gateway, (last_good, None), &background);
            switches
        }
        config::Startup::Unusable(error) => {
            let waiting = unconfigured::Waiting::new(&args.config, &error, metrics.clone());
            let switches = (
                Switch::new(Routes::only(unconfigured::api_router(waiting.clone()))),
                Switch::new(Routes::only(unconfigured::metrics_router(waiting.clone()))),
            );
            let (api, metrics_port) = (switches.0.clone(), switches.1.clone());
            let (args, storage, tasks) = (args.clone(), Arc::clone(&storage), Arc::clone(&background));
            let aside = aside.clone();
            let wait = tokio::spawn(async move {
                let (settings, bytes) = waiting.until_usable().await;
                match assemble(&args, &storage, settings, metrics, None, &aside) {
                    Ok(gateway) => {
                        last_good.save(&bytes);
                        api.replace(Routes::api(&gateway));
                        metrics_port.replace(Routes::only(server::metrics_router(Arc::clone(&gateway))));
                        spawn_background(&args, &gateway, (last_good, Some(bytes)), &tasks);
                        tracing::info!("strata gateway ready");
                    }
                    Err(error) => {
                        tracing::error!(%error, "the gateway config is usable now, but the gateway cannot start");
                        let _ = report_failure.send(*error).await;
                    }
                }
            });
            background.lock().unwrap_or_else(PoisonError::into_inner).push(wait);
            switches
        }
    };
    let api = bind(args.listen).await?;
    let metrics_listener = bind(args.metrics_listen).await?;
    let address = api.local_addr().map_err(|cause| StartError::Bind { address: args.listen, cause })?;
    let metrics_address = metrics_listener
        .local_addr()
        .map_err(|cause| StartError::Bind { address: args.metrics_listen, cause })?;
    let (mut tasks, serving_threads) = serving_threads::start(
        api,
        &api_switch,
        &stop,
        usize::from(args.worker_threads),
        blocking_threads_per_runtime(args.worker_threads),
    )?;
    tasks.push(serve(metrics_listener, metrics_switch, stop));
    tracing::info!(%address, %metrics_address, serving_threads = args.worker_threads, "strata gateway listening");
    Ok(RunningGateway {
        address,
        metrics_address,
        shutdown,
        tasks,
        serving_threads,
        background,
        aside,
        failed,
    })
}

/// Bind the journal, open the data directory and build the gateway around `settings` (the error
/// is boxed: it is large and this is not a hot path).
fn assemble(
    args: &GatewayArgs,
    storage: &Arc<dyn strata_core::journal::Storage>,
    settings: config::Settings,
    metrics: metrics::Metrics,
    problem: Option<config::ConfigProblem>,
    aside: &TaskTracker,
) -> Result<Arc<pipeline::Gateway>, Box<StartError>> {
    bind_journal(&settings.config.agent, &args.data_dir)
        .map_err(|cause| Box::new(StartError::JournalOwner { path: args.data_dir.clone(), cause }))?;
    let engine = strata_core::session::SessionEngine::open_on(
        Arc::clone(storage),
        &args.data_dir,
        &settings.session,
        strata_core::session::now_ms(),
    )
    .map_err(|cause| Box::new(StartError::DataDir { path: args.data_dir.clone(), cause }))?;
    if let Some((path, bytes)) = engine.torn_record() {
        tracing::warn!(path = %path.display(), bytes, "journal: truncated a torn final record");
    }
    let held_state =
        strata_core::session::StateDir::on_disk(Arc::clone(storage), args.data_dir.join("gateway"))
            .map_err(|cause| Box::new(StartError::DataDir { path: args.data_dir.clone(), cause }))?;
    for corrupt in engine.corrupt_state() {
        tracing::warn!(path = %corrupt.path.display(), reason = %corrupt.reason, "{corrupt}");
        metrics.corrupt_state_files.inc();
    }
    let upstream = upstream::Upstream::new(
        Duration::from_secs(u64::from(settings.config.upstream.timeout_seconds)),
        args.max_upstream_response_bytes,
    )
    .map_err(|error| Box::new(StartError::from(error)))?;
    let live = config::LiveSettings::new(settings);
    live.set_problem(problem);
    let engine = Arc::new(engine_host::EngineHost::new(
        engine,
        Arc::clone(storage),
        &args.data_dir,
        metrics.clone(),
        aside.clone(),
    ));
    let compactor = Arc::new(compactor::Compactor::new(
        Arc::clone(&engine),
        live.clone(),
        metrics.clone(),
        args.summarizer_api_key_file.clone(),
    ));
    Ok(Arc::new(pipeline::Gateway {
        live,
        engine,
        compactor,
        sweeps: sweeper::SweepLog::default(),
        room_pending: Default::default(),
        upstream,
        metrics,
        pending: pending::PendingOperations::new(args.max_held_bytes, held_state),
        inspect: inspect::InspectLog::default(),
        max_body_bytes: args.max_body_bytes,
        body_buffers: body_buffer::BodyBuffers::default(),
        responses: response_cache::ResponseCache::default(),
        messages: Default::default(),
        tool_blocks: Default::default(),
        volume: Arc::new(volume::VolumeUsage::default()),
    }))
}

/// Start the config watch, the proposal watch, the egress watch, the artifact sweeper, volume
/// measurement and the status reporter. `loaded` is the gateway.json the settings in force were
/// loaded from (none for the last good copy).
fn spawn_background(
    args: &GatewayArgs,
    gateway: &Arc<pipeline::Gateway>,
    (last_good, loaded): (config::LastGood, Option<Vec<u8>>),
    background: &Background,
) {
    let targets = config::ReloadTargets {
        live: gateway.live.clone(),
        last_good,
        rejected: gateway.metrics.config_rejected.clone(),
        from_last_good: gateway.metrics.config_from_last_good.clone(),
    };
    let mut tasks = vec![
        tokio::spawn(config::watch(args.config.clone(), targets, loaded)),
        tokio::spawn(proposals::watch(Arc::clone(gateway))),
        tokio::spawn(egress::watch(Arc::clone(gateway))),
        tokio::spawn(sweeper::run(Arc::clone(gateway))),
        tokio::spawn(volume::measure(
            args.data_dir.clone(),
            Arc::clone(&gateway.volume),
            gateway.metrics.clone(),
        )),
    ];
    if let Some(target) = reporter::ReportTarget::from_env() {
        tracing::info!(agent = %target.name, namespace = %target.namespace, "reporting status.context to the Agent");
        tasks.push(tokio::spawn(reporter::run(Arc::clone(gateway), target)));
    }
    background.lock().unwrap_or_else(PoisonError::into_inner).extend(tasks);
}

/// Bind the journal in `data_dir` to the Agent of `gateway.json` (when the operator named its UID).
fn bind_journal(
    agent: &strata_api::gateway_config::AgentIdentity,
    data_dir: &std::path::Path,
) -> Result<(), strata_core::journal::OwnerError> {
    use strata_core::journal::{Binding, Claimant, StdStorage, bind_owner};
    let Some(uid) = agent.uid.as_deref() else { return Ok(()) };
    let name = format!("{}/{}", agent.namespace, agent.name);
    let claimant = Claimant {
        agent_uid: uid,
        agent: &name,
        adopt_from_uid: agent.adopt_journal_from_uid.as_deref(),
        now_ms: strata_core::session::now_ms(),
    };
    let binding = bind_owner(&StdStorage, data_dir, claimant)?;
    match binding {
        Binding::Owned => {}
        Binding::Created => tracing::info!(agent = %name, %uid, "journal: bound a new journal to this Agent"),
        Binding::Claimed => {
            tracing::info!(agent = %name, %uid, "journal: recorded this Agent as the owner of an unowned journal")
        }
        Binding::Adopted { from } => {
            tracing::warn!(agent = %name, %uid, previous = %from, "journal: adopted an earlier Agent's journal as annotated")
        }
    }
    Ok(())
}

/// Threads of tokio's blocking pools, all serving threads' together (tokio's default is 512 a
/// runtime). Engine work runs there one call at a time (the engine is behind one lock) and the
/// group commit runs one fsync at a time, so under many concurrent requests further threads only
/// wait on the lock, each with its own stack and BPE cache: at 256 concurrent streams this bound
/// took the gateway's RSS from 72 to 63 MiB (BENCHMARKS.md).
const MAX_BLOCKING_THREADS: usize = 8;

/// Each serving thread's share of [`MAX_BLOCKING_THREADS`], at least 2 (a slow fsync and an
/// engine call waiting for the lock).
fn blocking_threads_per_runtime(serving_threads: u8) -> usize {
    (MAX_BLOCKING_THREADS / usize::from(serving_threads.max(1))).max(2)
}

/// Runs `strata gateway` until SIGINT or SIGTERM.
pub fn run(args: &GatewayArgs) -> anyhow::Result<()> {
    crate::logging::init(args.log);
    let runtime = build_runtime(args)?;
    // This thread is the first serving thread: opening the engine counts tokens here, and the
    // tokenizer's per-thread cache (about 1.2 MB) is the one its requests use later.
    runtime.block_on(run_until_stopped(args.clone()))
}

/// The first serving thread's runtime: single-threaded, with its share of the blocking pool. The
/// other serving threads are started with the API's listener ([`serving_threads::spawn`]).
fn build_runtime(args: &GatewayArgs) -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .max_blocking_threads(blocking_threads_per_runtime(args.worker_threads))
        .enable_all()
        .build()
}

/// Starts the gateway and serves until SIGINT, SIGTERM or a failure.
async fn run_until_stopped(args: GatewayArgs) -> anyhow::Result<()> {
    let mut running = start(&args).await?;
    tokio::select! {
        () = wait_for_signal() => {}
        error = running.failed() => {
            running.shutdown().await;
            return Err(error.into());
        }
    }
    tracing::info!("stopping: finishing open requests");
    running.shutdown().await;
    Ok(())
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        let mut terminate = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(error) => {
                tracing::error!(%error, "cannot watch SIGTERM; stopping on Ctrl-C only");
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    /// `strata gateway`'s flags alone.
    #[derive(Debug, Parser)]
    struct Flags {
        #[command(flatten)]
        args: GatewayArgs,
    }

    fn parse(extra: &[&str]) -> Result<GatewayArgs, clap::Error> {
        let required = ["gateway", "--config", "/etc/strata/gateway.json", "--data-dir", "/data"];
        Flags::try_parse_from(required.iter().chain(extra)).map(|flags| flags.args)
    }

    #[test]
    fn the_serving_thread_count_is_fixed_by_default_whatever_the_node_has() {
        let args = parse(&[]).expect("the defaults parse");
        assert_eq!(args.worker_threads, 2);
        assert_eq!(parse(&["--worker-threads", "3"]).expect("3 parses").worker_threads, 3);
        // The first serving thread's runtime is single-threaded; `serving_threads::start` starts
        // the others beside it.
        let runtime = build_runtime(&args).expect("the runtime starts");
        assert_eq!(runtime.metrics().num_workers(), 1);
        // The blocking pool is shared out: 8 threads in all, and at least 2 a serving thread.
        assert_eq!(blocking_threads_per_runtime(1), 8);
        assert_eq!(blocking_threads_per_runtime(2), 4);
        assert_eq!(blocking_threads_per_runtime(3), 2);
        assert_eq!(blocking_threads_per_runtime(64), 2);
    }

    #[test]
    fn a_worker_count_out_of_range_is_refused_with_the_range() {
        for bad in ["0", "65", "many"] {
            let error = parse(&["--worker-threads", bad]).expect_err(bad).to_string();
            assert!(error.contains("--worker-threads"), "{bad}: {error}");
        }
        let error = parse(&["--worker-threads", "0"]).expect_err("0").to_string();
        assert!(error.contains("1..=64"), "{error}");
    }
}

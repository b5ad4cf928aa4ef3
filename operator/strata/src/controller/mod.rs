//! `strata controller`: the operator. It reconciles Agents into StatefulSets with the gateway
//! sidecar, keeps policy status, runs CompactionJobs, and leads through a coordination Lease.
//!
//! Follow one Agent from manifest to children in [`agent`]: dereference → validate → build →
//! apply → status → orphans, each step its own module.

pub mod agent;
pub mod agent_pods;
pub mod child_index;
pub mod client;
pub mod compaction;
pub mod conditions;
pub mod context;
pub mod counting_thread;
pub mod error;
pub mod hashing;
pub mod labels;
pub mod leader;
pub mod metrics;
pub mod policy;
pub mod prefix_cache;
pub mod referenced_config_maps;
pub mod runner;
pub mod server;
pub mod tenant_key;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context as _;
use futures::FutureExt;
use kube::Config;

use client::Purpose;
use context::{Settings, system_clock};
use leader::{LeaderElector, Leadership, LeaseSettings};
use metrics::Metrics;
use server::Probes;

/// The image of this build, used for the gateway and compactor unless told otherwise.
pub const DEFAULT_IMAGE: &str = concat!("ghcr.io/strata-dev/strata:", env!("CARGO_PKG_VERSION"));

/// Arguments of `strata controller`.
#[derive(Debug, clap::Args)]
pub struct ControllerArgs {
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub metrics_listen: SocketAddr,
    /// Run only while holding the leader Lease (the default).
    #[arg(long, overrides_with = "no_leader_election")]
    pub leader_election: bool,
    /// Run without leader election (a single replica only).
    #[arg(long, overrides_with = "leader_election")]
    pub no_leader_election: bool,
    /// Namespace of the leader Lease; defaults to the operator namespace.
    #[arg(long)]
    pub lease_namespace: Option<String>,
    /// Name of the leader Lease.
    #[arg(long, default_value = "strata-controller-leader")]
    pub lease_name: String,
    /// Reconciles running at once, per controller (reconciles wait on the apiserver, not the CPU).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub concurrency: u16,
    /// Image of the gateway sidecar.
    #[arg(long, default_value = DEFAULT_IMAGE)]
    pub gateway_image: String,
    /// Image of compaction Jobs; defaults to the gateway image.
    #[arg(long)]
    pub compactor_image: Option<String>,
    /// The operator's namespace (master key Secret, Lease); defaults to $POD_NAMESPACE, then strata-system.
    #[arg(long)]
    pub operator_namespace: Option<String>,
    /// Every Agent is reconciled at least this often, in seconds (a safety net: everything an
    /// Agent depends on is watched). A settled Agent's resync makes no request at all.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(10..=86_400))]
    pub resync_seconds: u64,
    /// Log format.
    #[command(flatten)]
    pub log: crate::logging::LogArgs,
}

/// Run the operator until SIGTERM or Ctrl-C.
pub fn run(args: &ControllerArgs) -> anyhow::Result<()> {
    crate::logging::init(args.log);
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting tokio")?;
    runtime.block_on(run_operator(args))
}

async fn run_operator(args: &ControllerArgs) -> anyhow::Result<()> {
    let operator_namespace = args
        .operator_namespace
        .clone()
        .or_else(|| std::env::var("POD_NAMESPACE").ok())
        .unwrap_or_else(|| "strata-system".into());
    let identity = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| format!("strata-controller-{}", std::process::id()));
    let mut settings = Settings::new(
        &args.gateway_image,
        args.compactor_image.as_deref().unwrap_or(&args.gateway_image),
        &operator_namespace,
    );
    settings.resync_interval = std::time::Duration::from_secs(args.resync_seconds);
    let metrics = Arc::new(Metrics::new().context("registering metrics")?);
    let config = Config::infer().await.context("reading the Kubernetes client configuration")?;
    let leadership =
        if args.no_leader_election { Leadership::unconditional() } else { Leadership::elected() };
    let client =
        client::build(config.clone(), metrics.clone(), Purpose::Reconcilers, Some(leadership.clone()))
            .context("building a Kubernetes client")?;
    let election_client = client::build(config, metrics.clone(), Purpose::LeaderElection, None)
        .context("building the leader election client")?;
    let ready = Arc::new(AtomicBool::new(false));

    let (stop, stopped) = tokio::sync::watch::channel(false);
    let shutdown = async move {
        let mut stopped = stopped;
        let _ = stopped.wait_for(|stop| *stop).await;
    }
    .boxed()
    .shared();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutting down");
        let _ = stop.send(true);
    });
    let probes = Probes { metrics: metrics.clone(), ready: ready.clone() };
    let server = tokio::spawn(server::serve(args.metrics_listen, probes, shutdown.clone()));
    ready.store(true, Ordering::Relaxed);

    let elector = (!args.no_leader_election).then(|| {
        let lease_namespace = args.lease_namespace.clone().unwrap_or_else(|| operator_namespace.clone());
        LeaderElector::new(
            election_client,
            LeaseSettings::new(&lease_namespace, &args.lease_name, &identity),
            system_clock(),
            leadership.clone(),
        )
    });
    if let Some(elector) = &elector {
        tracing::info!(%identity, "waiting for the leader Lease");
        tokio::select! {
            () = elector.wait_until_leading() => {}
            () = shutdown.clone() => return Ok(()),
        }
    }
    metrics.set_leader(true);
    tracing::info!(%identity, "leading; starting the controllers");
    let master_key = tenant_key::ensure_master_key(client.clone(), &operator_namespace).await?;
    let controllers = runner::run_controllers(
        client,
        settings,
        master_key,
        metrics.clone(),
        args.concurrency,
        shutdown.clone(),
    );
    let lost = async {
        match &elector {
            Some(elector) => elector.keep_leading().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        () = controllers => {}
        error = lost => {
            metrics.set_leader(false);
            return Err(error.into());
        }
    }
    if let Some(elector) = &elector
        && let Err(error) = elector.release().await
    {
        tracing::warn!(%error, "releasing the leader Lease failed; a standby takes over when it expires");
    }
    server.await.context("the metrics server task")??;
    Ok(())
}

async fn wait_for_signal() {
    let mut terminate = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(signal) => signal,
        Err(error) => {
            tracing::warn!(%error, "cannot listen for SIGTERM; only Ctrl-C stops the controller");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = terminate.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

//! `kubectl strata`: the fleet from the command line, read from Agent status and the API.
//!
//! Every command returns its output as text, so the same code serves the binary and the tests;
//! `inspect --ui` also prints its URL when it starts serving.

mod error;
mod jobs;
mod policy;
mod status;
pub mod ui;

use std::time::Duration;

use clap::{Parser, Subcommand};
use kube::Client;

pub use error::PluginError;

/// Context, policy and compaction of Strata agents.
#[derive(Debug, Parser)]
#[command(name = "kubectl-strata", bin_name = "kubectl strata", version, about)]
pub struct PluginCli {
    /// Namespace; the kubeconfig context's namespace when omitted.
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    /// The command.
    #[command(subcommand)]
    pub command: PluginCommand,
}

/// `kubectl strata` commands.
#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Fleet table: context %, level, cached ratio, journal generation and last compaction of each Agent.
    Status {
        /// One agent only.
        agent: Option<String>,
        /// Every namespace.
        #[arg(short = 'A', long)]
        all_namespaces: bool,
    },
    /// The effective policy of an agent: every field's value and the object that set it, and every clamp.
    Policy {
        /// The agent.
        agent: String,
    },
    /// The gateway's inspect view (sections, inclusion reasons, cache outcome, churn cause) through the pod proxy.
    Inspect {
        /// The agent.
        agent: String,
        /// Serve the Context Inspector page on a local port (forwarded through the pod proxy) and
        /// print its URL, until interrupted.
        #[arg(long)]
        ui: bool,
        /// Local port for `--ui` (0 picks a free one).
        #[arg(long, default_value_t = 0, requires = "ui")]
        port: u16,
        /// With `--ui`: also open the URL in the desktop's browser (xdg-open or open).
        #[arg(long, requires = "ui")]
        open: bool,
    },
    /// Create a CompactionJob for an agent and follow it to the end.
    Compact {
        /// The agent.
        agent: String,
        /// TaskBoundary, Budget or Emergency.
        #[arg(long, default_value = "TaskBoundary", value_parser = ["TaskBoundary", "Budget", "Emergency"])]
        mode: String,
        /// How the agent resumes after the compaction.
        #[arg(long)]
        resume: Option<String>,
        /// Why (recorded).
        #[arg(long)]
        reason: Option<String>,
        /// Return once the CompactionJob is created.
        #[arg(long)]
        no_wait: bool,
        /// Give up following after this many seconds.
        #[arg(long, default_value_t = 600)]
        timeout_seconds: u64,
    },
    /// Roll an agent's journal back to a retained generation, and follow it to the end.
    Rollback {
        /// The agent.
        agent: String,
        /// The generation to restore.
        #[arg(long)]
        to_generation: u64,
        /// Return once the CompactionJob is created.
        #[arg(long)]
        no_wait: bool,
        /// Give up following after this many seconds.
        #[arg(long, default_value_t = 600)]
        timeout_seconds: u64,
    },
}

/// How often `compact` and `rollback` look at the CompactionJob while following it.
pub const FOLLOW_INTERVAL: Duration = Duration::from_secs(2);

/// Run one command against `client` and return what it prints.
pub async fn run(cli: &PluginCli, client: Client) -> Result<String, PluginError> {
    let namespace = cli.namespace.clone().unwrap_or_else(|| client.default_namespace().to_string());
    match &cli.command {
        PluginCommand::Status { agent, all_namespaces } => {
            status::status(&client, (!*all_namespaces).then_some(namespace.as_str()), agent.as_deref()).await
        }
        PluginCommand::Policy { agent } => policy::policy(&client, &namespace, agent).await,
        PluginCommand::Inspect { agent, ui: false, .. } => status::inspect(&client, &namespace, agent).await,
        PluginCommand::Inspect { agent, ui: true, port, open } => {
            let listen = std::net::SocketAddr::from(([127, 0, 0, 1], *port));
            let (open, shown) = (*open, format!("{namespace}/{agent}"));
            let announce = move |url: &str| {
                println!("Context Inspector of {shown}: {url}  (Ctrl-C stops forwarding)");
                if open {
                    open_in_browser(url);
                }
            };
            let interrupted = async {
                // Without a signal handler the process still stops on Ctrl-C, just less gracefully.
                if tokio::signal::ctrl_c().await.is_err() {
                    std::future::pending::<()>().await;
                }
            };
            ui::serve(&client, &namespace, agent, listen, announce, interrupted).await
        }
        PluginCommand::Compact { agent, mode, resume, reason, no_wait, timeout_seconds } => {
            let request = jobs::JobRequest {
                agent,
                mode,
                resume: resume.as_deref(),
                reason: reason.as_deref(),
                to_generation: None,
                follow: (!*no_wait).then(|| Duration::from_secs(*timeout_seconds)),
            };
            jobs::run_job(&client, &namespace, &request, FOLLOW_INTERVAL).await
        }
        PluginCommand::Rollback { agent, to_generation, no_wait, timeout_seconds } => {
            let request = jobs::JobRequest {
                agent,
                mode: "Rollback",
                resume: None,
                reason: Some("kubectl strata rollback"),
                to_generation: Some(*to_generation),
                follow: (!*no_wait).then(|| Duration::from_secs(*timeout_seconds)),
            };
            jobs::run_job(&client, &namespace, &request, FOLLOW_INTERVAL).await
        }
    }
}

/// Opens `url` with the desktop's opener, when there is one; the URL is printed either way.
fn open_in_browser(url: &str) {
    for opener in ["xdg-open", "open"] {
        if std::process::Command::new(opener).arg(url).spawn().is_ok() {
            return;
        }
    }
    eprintln!("no xdg-open or open found; open the URL above yourself");
}

//! The `strata` command: one binary for every Strata process.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// jemalloc serves every allocation of every Strata process. The image links musl statically, whose
/// allocator serialises threads; the glibc build used in development grows one arena per thread and
/// keeps their free pages, so an always-on gateway's RSS drifted upwards (RELIABILITY.md, "Soak").
/// jemalloc behaves the same in both builds (tikv-jemallocator: the maintained binding TiKV ships
/// with). Its options are baked in at build time (`.cargo/config.toml`, and the `background_threads`
/// feature): one arena, and freed pages returned to the system at once by a background thread, which
/// keeps a sidecar's RSS near its live heap (BENCHMARKS.md, "The allocator setting, link-time
/// optimisation and the listen backlog"; RELIABILITY.md, "Soak").
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Strata keeps always-on LLM agents inside their context windows.
#[derive(Debug, Parser)]
#[command(name = "strata", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// What Strata would save on recorded agent sessions: every call rebuilt under each context policy
    /// and priced the way providers bill prefix caching. Needs no cluster and no API key.
    Replay(strata::replay::ReplayArgs),
    /// Write the strata.dev CustomResourceDefinitions as YAML, one file per CRD, plus a kustomization.yaml.
    Crdgen(strata::crdgen::CrdgenArgs),
    /// Compact, purge or roll back an agent's journal and print the compaction record.
    Compact(strata::compact::CompactArgs),
    /// Run the context gateway sidecar: an OpenAI/Anthropic-compatible proxy that journals every turn,
    /// compiles a cache-stable prompt, enforces the context budget and gives the model its memory tools.
    Gateway(strata::gateway::GatewayArgs),
    /// Run the operator: reconcile Agents, ContextPolicies, ClusterContextPolicies and CompactionJobs,
    /// serving /metrics, /healthz and /readyz, and leading through a coordination.k8s.io Lease.
    Controller(strata::controller::ControllerArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Replay(args) => match strata::replay::run(&args) {
            Ok(true) => Ok(()),
            // Some inputs failed (reported above) while the others replayed.
            Ok(false) => return ExitCode::from(2),
            Err(error) => Err(error),
        },
        Command::Crdgen(args) => strata::crdgen::run(&args),
        Command::Compact(args) => return strata::compact::main(&args),
        Command::Gateway(args) => strata::gateway::run(&args),
        Command::Controller(args) => strata::controller::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("strata: {error:#}");
            ExitCode::FAILURE
        }
    }
}

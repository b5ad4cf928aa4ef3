//! `strata-gateway`: the context gateway sidecar alone, with the same flags as `strata gateway`.
//! The operator's sidecars run it: it links only the gateway's code, so the pages of program text a
//! sidecar keeps resident are fewer than with the all-in-one `strata` binary (BENCHMARKS.md).

use std::process::ExitCode;

use clap::Parser;

/// The same allocator, with the same baked-in options, as the `strata` binary (see `main.rs`).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Run the context gateway sidecar: an OpenAI/Anthropic-compatible proxy that journals every turn,
/// compiles a cache-stable prompt, enforces the context budget and gives the model its memory tools.
#[derive(Debug, Parser)]
#[command(name = "strata-gateway", version, about)]
struct Cli {
    #[command(flatten)]
    args: strata::gateway::GatewayArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match strata::gateway::run(&cli.args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("strata-gateway: {error:#}");
            ExitCode::FAILURE
        }
    }
}

//! The `strata` command: one binary for every Strata process.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Strata keeps always-on LLM agents inside their context windows.
#[derive(Debug, Parser)]
#[command(name = "strata", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Write the strata.dev CustomResourceDefinitions as YAML, one file per CRD, plus a kustomization.yaml.
    Crdgen(strata::crdgen::CrdgenArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Crdgen(args) => strata::crdgen::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("strata: {error:#}");
            ExitCode::FAILURE
        }
    }
}

//! `kubectl-strata`: the kubectl plugin (krew naming), run as `kubectl strata ...`.

use std::process::ExitCode;

use clap::Parser;
use strata::plugin::{PluginCli, run};

fn main() -> ExitCode {
    let cli = PluginCli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("kubectl strata: cannot start: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let client = kube::Client::try_default().await.map_err(|e| {
            format!("cannot reach the cluster: {e}; check your kubeconfig (`kubectl config current-context`)")
        })?;
        run(&cli, client).await.map_err(|e| e.to_string())
    });
    match result {
        Ok(output) => {
            print!("{output}");
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("kubectl strata: {message}");
            ExitCode::FAILURE
        }
    }
}

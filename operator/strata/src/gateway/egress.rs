//! Polls the egress files (the proxy's URL, the trusted authorities) and rebuilds the upstream
//! client when the kubelet swaps in a rotated Secret or ConfigMap.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use super::config::{RELOAD_POLL_INTERVAL, modified};
use super::connector::{PROXY_URL_FILE_ENV, TRUSTED_CA_FILE_ENV};
use super::pipeline::Gateway;
use super::upstream::ClientError;

/// What was last seen of one egress file: its modification time and bytes.
struct Seen {
    path: PathBuf,
    modified: Option<SystemTime>,
    bytes: Option<Vec<u8>>,
}

impl Seen {
    fn now(path: PathBuf) -> Self {
        Self { modified: modified(&path), bytes: std::fs::read(&path).ok(), path }
    }

    /// Looks again: reads the file when its modification time moved, and says whether its bytes
    /// changed (a file touched without a change keeps the client and its connections).
    fn changed(&mut self) -> bool {
        let modified = modified(&self.path);
        if modified == self.modified {
            return false;
        }
        self.modified = modified;
        let bytes = std::fs::read(&self.path).ok();
        if bytes == self.bytes {
            return false;
        }
        self.bytes = bytes;
        true
    }
}

/// The egress files the environment names.
fn egress_files() -> Vec<PathBuf> {
    [PROXY_URL_FILE_ENV, TRUSTED_CA_FILE_ENV]
        .into_iter()
        .filter_map(|name| std::env::var_os(name).map(PathBuf::from))
        .collect()
}

/// Rebuilds `gateway`'s upstream client whenever an egress file's bytes change. A file that
/// changed into something unusable is logged, counted in `strata_gateway_egress_rejected` and
/// shown in `/strata/v1/status` (`egress`), and the client built from the earlier files stays in
/// force. Returns at once when no file is named.
pub async fn watch(gateway: Arc<Gateway>) {
    let files = egress_files();
    if files.is_empty() {
        return;
    }
    let mut seen: Vec<Seen> = files.into_iter().map(Seen::now).collect();
    let mut ticker = tokio::time::interval(RELOAD_POLL_INTERVAL);
    loop {
        ticker.tick().await;
        // Every file is looked at, so each one's new state is remembered.
        let mut changed = false;
        for file in &mut seen {
            changed |= file.changed();
        }
        if !changed {
            continue;
        }
        // Building a client loads the system's trusted roots from disk: off the runtime's workers.
        let rebuilding = Arc::clone(&gateway);
        let rebuilt = match tokio::task::spawn_blocking(move || rebuilding.upstream.reload_egress()).await {
            Ok(rebuilt) => rebuilt,
            Err(stopped) => {
                let error = ClientError::from_reason(format!("the rebuild stopped: {stopped}"));
                gateway.upstream.record_egress_outcome(Some(&error));
                Err(error)
            }
        };
        match rebuilt {
            Ok(()) => {
                tracing::info!("the egress files changed; new upstream connections use them");
                gateway.metrics.egress_rejected.set(0);
            }
            Err(error) => {
                tracing::error!(%error, "the egress files changed into something unusable; the upstream client built from the earlier files stays in force. Fix the Secret or ConfigMap; it is picked up within a second of the next change");
                gateway.metrics.egress_rejected.set(1);
            }
        }
    }
}

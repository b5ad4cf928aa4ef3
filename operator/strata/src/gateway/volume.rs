//! The data volume's bytes used (journal, artifacts, gateway state), measured in the background on
//! the blocking pool and shown in `/strata/v1/status` and `strata_gateway_volume_bytes`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus::IntGauge;

/// How often the data directory is measured.
pub const MEASURE_INTERVAL: Duration = Duration::from_secs(30);

/// The last measurement of the data directory, in bytes.
#[derive(Debug, Default)]
pub struct VolumeUsage {
    bytes: AtomicU64,
}

impl VolumeUsage {
    /// Bytes used at the last measurement.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
}

/// Sums the sizes of the files under `dir` (entries that vanish while walking are skipped).
pub fn bytes_under(dir: &Path) -> u64 {
    let mut total = 0;
    let mut pending: Vec<PathBuf> = vec![dir.to_owned()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            match entry.metadata() {
                Ok(meta) if meta.is_dir() => pending.push(entry.path()),
                Ok(meta) => total += meta.len(),
                Err(_) => {}
            }
        }
    }
    total
}

/// Measures `data_dir` now and then every [`MEASURE_INTERVAL`].
pub async fn measure(data_dir: PathBuf, usage: Arc<VolumeUsage>, gauge: IntGauge) {
    let mut ticker = tokio::time::interval(MEASURE_INTERVAL);
    loop {
        ticker.tick().await;
        let dir = data_dir.clone();
        match tokio::task::spawn_blocking(move || bytes_under(&dir)).await {
            Ok(bytes) => {
                usage.bytes.store(bytes, Ordering::Relaxed);
                gauge.set(i64::try_from(bytes).unwrap_or(i64::MAX));
            }
            Err(error) => tracing::warn!(%error, "measuring the data volume"),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn sums_files_in_nested_directories() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::fs::write(dir.path().join("one"), [0u8; 10]).unwrap();
        std::fs::write(dir.path().join("a/b/two"), [0u8; 32]).unwrap();
        assert_eq!(bytes_under(dir.path()), 42);
        assert_eq!(bytes_under(&dir.path().join("missing")), 0);
    }
}

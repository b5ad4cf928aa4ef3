//! The data volume's bytes used (journal, artifacts, gateway state), measured in the background on
//! the blocking pool and shown in `/strata/v1/status` and `strata_gateway_volume_bytes`, and the
//! capacity and free bytes of the filesystem holding it (`strata_gateway_volume_capacity_bytes`,
//! `strata_gateway_volume_available_bytes`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::metrics::Metrics;

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

/// The size of the filesystem holding `dir` and the bytes still available to unprivileged
/// writers on it.
pub fn filesystem_space(dir: &Path) -> std::io::Result<(u64, u64)> {
    let stats = rustix::fs::statvfs(dir)?;
    let unit = if stats.f_frsize > 0 { stats.f_frsize } else { stats.f_bsize };
    Ok((stats.f_blocks.saturating_mul(unit), stats.f_bavail.saturating_mul(unit)))
}

fn as_gauge(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// Measures `data_dir` now and then every [`MEASURE_INTERVAL`].
pub async fn measure(data_dir: PathBuf, usage: Arc<VolumeUsage>, metrics: Metrics) {
    let mut ticker = tokio::time::interval(MEASURE_INTERVAL);
    let mut space_error = String::new();
    loop {
        ticker.tick().await;
        let dir = data_dir.clone();
        match tokio::task::spawn_blocking(move || (bytes_under(&dir), filesystem_space(&dir))).await {
            Ok((bytes, space)) => {
                usage.bytes.store(bytes, Ordering::Relaxed);
                metrics.volume_bytes.set(as_gauge(bytes));
                match space {
                    Ok((capacity, available)) => {
                        metrics.volume_capacity_bytes.set(as_gauge(capacity));
                        metrics.volume_available_bytes.set(as_gauge(available));
                        space_error.clear();
                    }
                    // Said once per distinct error: it repeats every measurement.
                    Err(error) if error.to_string() != space_error => {
                        space_error = error.to_string();
                        tracing::warn!(%error, dir = %data_dir.display(), "reading the data volume's capacity");
                    }
                    Err(_) => {}
                }
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

    #[test]
    fn the_filesystem_has_a_capacity_and_no_more_free_than_that() {
        let dir = tempfile::tempdir().unwrap();
        let (capacity, available) = filesystem_space(dir.path()).unwrap();
        assert!(capacity > 0 && available <= capacity, "{capacity} {available}");
        assert!(filesystem_space(&dir.path().join("missing")).is_err());
    }
}

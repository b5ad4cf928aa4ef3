//! The real `strata gateway` binary as a child process: spawned on a config and a data dir, polled
//! until ready, killed with SIGKILL, and its memory read from `/proc`.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `strata gateway` process; killed (SIGKILL) when dropped.
pub struct GatewayProcess {
    /// The child process.
    pub child: Child,
    /// The OpenAI/Anthropic API address.
    pub address: SocketAddr,
    /// The metrics address.
    pub metrics_address: SocketAddr,
}

/// A loopback address that was free a moment ago.
pub fn free_port() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

impl GatewayProcess {
    /// Starts `binary gateway` on `config_path` and `data_dir`, on fresh loopback ports, logging
    /// warnings and errors to `log` (appended) or nowhere.
    pub fn spawn(binary: &Path, config_path: &Path, data_dir: &Path, log: Option<&Path>) -> Self {
        let address = free_port();
        let metrics_address = free_port();
        let output = || match log {
            Some(path) => Stdio::from(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display())),
            ),
            None => Stdio::null(),
        };
        let child = Command::new(binary)
            .args(["gateway", "--config"])
            .arg(config_path)
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--listen", &address.to_string(), "--metrics-listen", &metrics_address.to_string()])
            .env("RUST_LOG", "warn")
            .stdout(output())
            .stderr(output())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", binary.display()));
        Self { child, address, metrics_address }
    }

    /// Polls `/readyz` until it answers 200; returns how long that took, or why it did not.
    pub async fn wait_ready(
        &mut self,
        client: &reqwest::Client,
        timeout: Duration,
    ) -> Result<Duration, String> {
        let started = Instant::now();
        let url = format!("http://{}/readyz", self.address);
        let mut last = String::from("no answer yet");
        while started.elapsed() < timeout {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("the gateway exited with {status} before it was ready"));
            }
            match client.get(&url).timeout(Duration::from_secs(2)).send().await {
                Ok(response) if response.status().is_success() => return Ok(started.elapsed()),
                Ok(response) => last = format!("/readyz answered {}", response.status()),
                Err(error) => last = error.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Err(format!("not ready after {timeout:?}: {last}"))
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGKILL and reaps the process.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// `(VmRSS, VmHWM)` in KiB: resident memory now and its peak.
    pub fn rss_kib(&self) -> (u64, u64) {
        rss_kib(self.pid())
    }
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `(VmRSS, VmHWM)` of process `pid` in KiB (0 when unknown).
pub fn rss_kib(pid: u32) -> (u64, u64) {
    let status = ProcStatus::read(pid);
    (status.field("VmRSS:"), status.field("VmHWM:"))
}

/// `(RssAnon, RssFile)` of process `pid` in KiB: the heap, stacks and allocator pages against the
/// binary's and libraries' pages (0 when unknown).
pub fn rss_split_kib(pid: u32) -> (u64, u64) {
    let status = ProcStatus::read(pid);
    (status.field("RssAnon:"), status.field("RssFile:"))
}

/// `/proc/<pid>/status`, empty when the process is gone.
struct ProcStatus(String);

impl ProcStatus {
    fn read(pid: u32) -> Self {
        Self(std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default())
    }

    /// A `kB` field's value, 0 when missing.
    fn field(&self, name: &str) -> u64 {
        self.0
            .lines()
            .find(|line| line.starts_with(name))
            .and_then(|line| line.split_whitespace().nth(1))
            .and_then(|value| value.parse().ok())
            .unwrap_or(0)
    }
}

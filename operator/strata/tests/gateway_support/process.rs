//! The real gateway (`strata-gateway`, or `strata gateway`) as a child process: spawned on a config and a data dir, polled
//! until ready, killed with SIGKILL, and its memory read from `/proc`.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
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

/// A loopback address that is free now and stays free for the gateway to bind: its port lies
/// below the kernel's ephemeral range, so no outgoing connection (the harness's own, to the
/// gateway or the fake upstream) can take it between this check and the gateway's bind. A port
/// taken from the ephemeral range (`bind` to port 0) could be, and the crash suite once saw a
/// restart fail with "address in use" that way. Each process starts at its own offset, so
/// concurrent test processes rarely try the same ports; the bind check skips any in use.
pub fn free_port() -> SocketAddr {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    // The ports below the ephemeral range, from 10,000 (clear of well-known and common service
    // ports); ephemeral ones only when the range starts too low to leave any.
    let (first, span) = if low > 11_000 { (10_000, low - 10_000) } else { (low, 65_535 - low) };
    let start = std::process::id().wrapping_mul(7_919) % span;
    for _ in 0..span {
        let offset = (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span;
        let port = u16::try_from(first + offset).expect("ports fit in 16 bits");
        if let Ok(listener) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            return listener.local_addr().unwrap();
        }
    }
    panic!("no free loopback port in {first}..{}", first + span)
}

impl GatewayProcess {
    /// Starts `binary gateway` on `config_path` and `data_dir`, on fresh loopback ports, logging
    /// warnings and errors to `log` (appended) or nowhere.
    pub fn spawn(binary: &Path, config_path: &Path, data_dir: &Path, log: Option<&Path>) -> Self {
        Self::spawn_with_env(binary, config_path, data_dir, log, &[])
    }

    /// [`Self::spawn`] with `env` set in the gateway's environment. The proxy variables of the
    /// test's own environment are not passed on, so only `env` can route the gateway through a
    /// proxy.
    pub fn spawn_with_env(
        binary: &Path,
        config_path: &Path,
        data_dir: &Path,
        log: Option<&Path>,
        env: &[(&str, &str)],
    ) -> Self {
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
        let mut command = Command::new(binary);
        // `strata-gateway`, the sidecar's program, is the gateway alone; `strata` takes a subcommand.
        if binary.file_name().is_some_and(|name| name != "strata-gateway") {
            command.arg("gateway");
        }
        let child = command
            .arg("--config")
            .arg(config_path)
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--listen", &address.to_string(), "--metrics-listen", &metrics_address.to_string()])
            .env("RUST_LOG", "warn")
            .env_remove("HTTPS_PROXY")
            .env_remove("https_proxy")
            .env_remove("HTTP_PROXY")
            .env_remove("http_proxy")
            .env_remove("ALL_PROXY")
            .env_remove("all_proxy")
            .env_remove("NO_PROXY")
            .env_remove("no_proxy")
            .envs(env.iter().copied())
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

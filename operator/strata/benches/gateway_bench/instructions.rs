//! The gateway's instructions per request, counted by callgrind: a measure of its work that the
//! machine's load and cache state do not move (`STRATA_BENCH_INSTRUCTIONS=1`; needs valgrind).
//!
//! The gateway runs under `valgrind --tool=callgrind` uninstrumented, so it starts and warms up at
//! near its usual speed. Counting is switched on (`callgrind_control -i on`) after the warm-up and
//! the counts are dumped (`callgrind_control -d`) after the measured requests, so the total covers
//! exactly those requests, on every thread of the gateway, in user space (the kernel's work for its
//! syscalls is not counted).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The valgrind tools this mode runs.
const TOOLS: [&str; 2] = ["valgrind", "callgrind_control"];

/// Why the mode cannot run here, if it cannot: a tool is missing.
pub fn unavailable() -> Option<String> {
    TOOLS.iter().find_map(|tool| match Command::new(tool).arg("--version").output() {
        Ok(output) if output.status.success() => None,
        _ => Some(format!(
            "STRATA_BENCH_INSTRUCTIONS needs `{tool}` on the PATH: install valgrind (Debian: apt-get install valgrind)"
        )),
    })
}

/// Writes, in `dir`, a program named `strata-gateway` that runs `gateway` under callgrind with its
/// counts dumped into `dir`; returns its path.
pub fn wrapper(dir: &Path, gateway: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let program = dir.join("strata-gateway");
    let script = format!(
        "#!/bin/sh\nexec valgrind --quiet --tool=callgrind --instr-atstart=no --callgrind-out-file='{}/callgrind.%p' '{}' \"$@\"\n",
        dir.display(),
        gateway.display()
    );
    std::fs::write(&program, script).unwrap();
    let mut permissions = std::fs::metadata(&program).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    std::fs::set_permissions(&program, permissions).unwrap();
    program
}

/// Runs `callgrind_control` with `args` against `pid` (it waits for the gateway to take the
/// command, which an idle gateway does at its next timer tick).
async fn control(pid: u32, args: &[&str]) -> Result<(), String> {
    let mut command = Command::new("callgrind_control");
    command.args(args).arg(pid.to_string());
    let output = tokio::task::spawn_blocking(move || command.output()).await.map_err(|e| e.to_string())?;
    match output {
        Ok(output) if output.status.success() => Ok(()),
        Ok(output) => Err(format!(
            "callgrind_control {args:?} {pid}: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )),
        Err(error) => Err(format!("callgrind_control: {error}")),
    }
}

/// Starts counting in the gateway `pid`.
pub async fn start(pid: u32) -> Result<(), String> {
    control(pid, &["--instr=on"]).await
}

/// Dumps the gateway `pid`'s counts into `dir` and returns the instructions counted since
/// [`start`].
pub async fn instructions(pid: u32, dir: &Path) -> Result<u64, String> {
    control(pid, &["--dump"]).await?;
    let prefix = format!("callgrind.{pid}.");
    let dump = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(Result::ok)
        .filter(|entry| entry.file_name().to_string_lossy().starts_with(&prefix))
        .max_by_key(|entry| entry.metadata().and_then(|m| m.modified()).ok())
        .ok_or_else(|| format!("no callgrind dump {prefix}* in {}", dir.display()))?;
    let text = std::fs::read_to_string(dump.path()).map_err(|e| format!("{}: {e}", dump.path().display()))?;
    text.lines()
        .find_map(|line| line.strip_prefix("totals:").or_else(|| line.strip_prefix("summary:")))
        .and_then(|counts| counts.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| format!("{}: no totals line", dump.path().display()))
}

//! Log output of a running `strata gateway` read through a pipe, as a log collector reads it:
//! no terminal colour codes in text lines, and one parseable JSON object per line with
//! `--log-format json`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod gateway_support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use gateway_support::{FakeUpstream, config, write_config};
use serde_json::Value;
use strata_api::agent::Provider;

/// The stdout lines of `strata gateway` up to and including its "listening" line.
async fn gateway_log_lines(extra: &[&str]) -> Vec<String> {
    let fake = FakeUpstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("gateway.json");
    write_config(&config_path, &config(&fake, Provider::OpenAI, dir.path()));
    let mut child = Command::new(env!("CARGO_BIN_EXE_strata"))
        .arg("gateway")
        .arg("--config")
        .arg(&config_path)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .args(extra)
        .env_remove("NO_COLOR")
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (lines_tx, lines_rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let listening = line.contains("listening");
            if lines_tx.send(line).is_err() || listening {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    while let Ok(line) = lines_rx.recv_timeout(Duration::from_secs(30)) {
        lines.push(line);
    }
    let _ = child.kill();
    let output = child.wait_with_output().unwrap();
    assert!(
        lines.iter().any(|l| l.contains("listening")),
        "the gateway never logged that it listens: {lines:?}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    lines
}

#[tokio::test]
async fn text_logs_through_a_pipe_carry_no_colour_codes() {
    let lines = gateway_log_lines(&[]).await;
    for line in &lines {
        assert!(!line.contains('\u{1b}'), "an escape sequence in a piped log line: {line:?}");
    }
    assert!(lines.iter().any(|l| l.contains(" INFO ")), "{lines:?}");
}

#[tokio::test]
async fn json_logs_are_one_object_per_line() {
    let lines = gateway_log_lines(&["--log-format", "json"]).await;
    for line in &lines {
        let object: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
        assert!(object["timestamp"].is_string() && object["level"].is_string(), "{line}");
        assert!(object["target"].as_str().unwrap().starts_with("strata"), "{line}");
    }
    let listening = lines.iter().find(|l| l.contains("listening")).unwrap();
    let object: Value = serde_json::from_str(listening).unwrap();
    assert_eq!(object["message"], "strata gateway listening");
    assert!(object["address"].as_str().unwrap().starts_with("127.0.0.1:"), "{object}");
}

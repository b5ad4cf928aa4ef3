//! Soak: the real `strata-gateway` (the sidecar's program, release build) serves a bounded request loop for an hour while
//! its resident memory is sampled; flat RSS is the goal.
//!
//! Method: an in-process fake OpenAI upstream on loopback answers each call with the recorded
//! assistant message. The client plays seed 003's session and the long sessions of
//! `../shared/corpus/long-sessions` one after another, in a loop, in Transparent mode (the whole
//! history on every call, as a real client does), at a fixed request rate, every other call
//! streamed. Each session starts a new conversation, and the 32k-token window makes the gateway
//! compact within sessions, so the journal's live context stays bounded. Every `--sample-seconds`
//! it prints the gateway's VmRSS and VmHWM (`/proc/PID/status`), requests served and failed, the
//! journal's generation and the volume's bytes. The summary gives RSS after the warm-up, at the end
//! and at its peak.
//!
//! Run with `cargo bench -p strata --bench gateway_soak -- --minutes 60` (see `--help`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/gateway_support/mod.rs"]
mod gateway_support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use gateway_support::corpus::{files, load, reply_of, seed_003, shared};
use gateway_support::process::GatewayProcess;
use gateway_support::{FakeUpstream, config, write_config};
use serde_json::{Value, json};
use strata_api::agent::Provider;

/// The soak's parameters.
#[derive(Debug, Parser)]
struct Args {
    /// How long requests are sent, in minutes.
    #[arg(long, default_value_t = 60.0)]
    minutes: f64,
    /// Requests per second (fixed rate; a slow answer delays the next tick, it never piles up).
    #[arg(long, default_value_t = 2.0)]
    rate: f64,
    /// Seconds between RSS samples.
    #[arg(long, default_value_t = 30)]
    sample_seconds: u64,
    /// Minutes of warm-up: the "start" RSS is the first sample after it.
    #[arg(long, default_value_t = 5.0)]
    warmup_minutes: f64,
    /// The model's context window in tokens (small enough that the gateway compacts).
    #[arg(long, default_value_t = 32_000)]
    window: u32,
    /// Where the data dir goes (default: the system's temp dir).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Ignored (cargo bench passes it).
    #[arg(long, hide = true)]
    bench: bool,
}

/// One call of a recorded session: the messages up to it and the recorded answer.
struct Call {
    session: usize,
    end: usize,
}

#[derive(Default)]
struct Counts {
    served: u64,
    failed: u64,
    streamed: u64,
    first_failures: Vec<String>,
}

/// Sends one call; `Err` with why it failed.
async fn send(client: &reqwest::Client, url: &str, body: &Value) -> Result<(), String> {
    let response = client.post(url).json(body).send().await.map_err(|e| e.to_string())?;
    let status = response.status();
    let text = response.text().await.map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!("{status}: {}", text.chars().take(300).collect::<String>()));
    }
    if body["stream"] == json!(true) && (!text.contains("data: [DONE]") || text.contains("\"error\"")) {
        return Err(format!("stream did not finish cleanly: …{}", tail(&text)));
    }
    Ok(())
}

fn tail(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    chars[chars.len().saturating_sub(300)..].iter().collect()
}

async fn status(client: &reqwest::Client, gateway: &GatewayProcess) -> Value {
    let url = format!("http://{}/strata/v1/status", gateway.address);
    match client.get(url).send().await {
        Ok(response) => response.json().await.unwrap_or(Value::Null),
        Err(_) => Value::Null,
    }
}

fn dir_bytes(path: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(path) else { return 0 };
    entries
        .flatten()
        .map(|entry| match entry.file_type() {
            Ok(kind) if kind.is_dir() => dir_bytes(&entry.path()),
            _ => entry.metadata().map(|m| m.len()).unwrap_or(0),
        })
        .sum()
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let Some(shared) = shared() else { return };
    let mut paths = seed_003(&shared);
    paths.extend(files(&shared.join("corpus/long-sessions/sessions"), ".json"));
    let transcripts: Vec<Vec<Value>> =
        paths.iter().map(|path| load(path).messages.iter().map(|m| m.wire.clone()).collect()).collect();
    let calls: Vec<Call> = paths
        .iter()
        .enumerate()
        .flat_map(|(session, path)| {
            load(path).calls.iter().map(move |&(end, _)| Call { session, end }).collect::<Vec<_>>()
        })
        .collect();

    let fake = FakeUpstream::start().await;
    let root = match &args.dir {
        Some(dir) => tempfile::tempdir_in(dir).unwrap(),
        None => tempfile::tempdir().unwrap(),
    };
    let mut gateway_config = config(&fake, Provider::OpenAI, root.path());
    gateway_config.upstream.context_window = args.window;
    gateway_config.stable_prefix.system_prompt = String::new();
    let config_path = root.path().join("gateway.json");
    write_config(&config_path, &gateway_config);
    let data_dir = root.path().join("data");
    let log = root.path().join("gateway.log");
    let mut gateway = GatewayProcess::spawn(
        std::path::Path::new(env!("CARGO_BIN_EXE_strata-gateway")),
        &config_path,
        &data_dir,
        Some(&log),
    );
    let client = reqwest::Client::new();
    gateway.wait_ready(&client, Duration::from_secs(30)).await.unwrap();
    let url = format!("http://{}/v1/chat/completions", gateway.address);
    println!(
        "soak: {} min at {} req/s, {} sessions ({} calls per pass), window {}, pid {}, data {}",
        args.minutes,
        args.rate,
        paths.len(),
        calls.len(),
        args.window,
        gateway.pid(),
        data_dir.display()
    );
    println!(
        "elapsed_s | VmRSS MiB | VmHWM MiB | served | failed | generation | journal tokens | volume MiB"
    );

    let duration = Duration::from_secs_f64(args.minutes * 60.0);
    let warmup = Duration::from_secs_f64(args.warmup_minutes * 60.0);
    let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / args.rate));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let started = Instant::now();
    let mut next_sample = Duration::ZERO;
    let mut counts = Counts::default();
    let mut samples: Vec<(Duration, u64)> = Vec::new();
    let mut index = 0usize;
    loop {
        let elapsed = started.elapsed();
        if elapsed >= next_sample || elapsed >= duration {
            let (rss, peak) = gateway.rss_kib();
            let status = status(&client, &gateway).await;
            samples.push((elapsed, rss));
            println!(
                "{:>9.0} | {:>9.1} | {:>9.1} | {:>6} | {:>6} | {:>10} | {:>14} | {:>10.1}",
                elapsed.as_secs_f64(),
                mib(rss),
                mib(peak),
                counts.served,
                counts.failed,
                status["generation"],
                status["journalTokens"],
                dir_bytes(&data_dir) as f64 / 1048576.0
            );
            next_sample += Duration::from_secs(args.sample_seconds);
        }
        if elapsed >= duration {
            break;
        }
        ticker.tick().await;
        let call = &calls[index % calls.len()];
        let wires = &transcripts[call.session];
        let stream = index % 2 == 1;
        fake.unscript();
        fake.script([reply_of(&wires[call.end])]);
        let body = json!({"model": "m", "messages": &wires[..call.end], "stream": stream});
        match send(&client, &url, &body).await {
            Ok(()) => counts.served += 1,
            Err(error) => {
                counts.failed += 1;
                if counts.first_failures.len() < 5 {
                    counts.first_failures.push(format!("request {index}: {error}"));
                }
            }
        }
        counts.streamed += u64::from(stream);
        fake.forget_seen();
        index += 1;
    }

    let (end_rss, peak_hwm) = gateway.rss_kib();
    let start = samples.iter().find(|(at, _)| *at >= warmup).or(samples.first()).map(|s| s.1).unwrap_or(0);
    let peak_sampled = samples.iter().map(|s| s.1).max().unwrap_or(0);
    let status = status(&client, &gateway).await;
    println!(
        "summary: {:.1} min, {} requests served ({} streamed), {} failed, {:.2} req/s; RSS after {:.0} min warm-up {:.1} MiB, at the end {:.1} MiB, peak sampled {:.1} MiB, VmHWM {:.1} MiB; generation {}, volume {:.1} MiB",
        started.elapsed().as_secs_f64() / 60.0,
        counts.served,
        counts.streamed,
        counts.failed,
        (counts.served + counts.failed) as f64 / started.elapsed().as_secs_f64(),
        args.warmup_minutes,
        mib(start),
        mib(end_rss),
        mib(peak_sampled),
        mib(peak_hwm),
        status["generation"],
        dir_bytes(&data_dir) as f64 / 1048576.0
    );
    for failure in &counts.first_failures {
        println!("failure: {failure}");
    }
    gateway.kill();
}

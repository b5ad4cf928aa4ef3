//! Added latency of the gateway versus a direct call to the same fake upstream, sequential and at
//! 256 and 2,048 concurrent streams, on a 1k- and a 200k-token journal; and the gateway's RSS.
//!
//! Method: the real gateway, `strata-gateway` as the sidecars run it (release build), runs as a child
//! process in front of an in-process fake OpenAI upstream on loopback that answers at once. Every
//! client request goes through the gateway in Stateful mode (a short new user message) and is
//! immediately followed, on the same stream, by a direct request that replays to the fake the exact
//! body the gateway most recently sent upstream, so both paths move the same bytes at the same
//! journal size. Added latency is the difference of the percentiles of the two paths. Each phase
//! starts from a fresh copy of the seeded journal. Concurrent streams start 100 µs apart and send one
//! unmeasured request first (so connection setup is not measured), then run their measured requests
//! back to back. Run with
//! `cargo bench -p strata --bench gateway`; `STRATA_BENCH_QUICK=1` runs a shorter version, and
//! `STRATA_BENCH_SEQUENTIAL=N` sets the sequential phases' request count (longer runs for a profiler);
//! `STRATA_BENCH_TOOL_TOKENS=N` gives every request a synthetic tool block of about N tokens;
//! `STRATA_BENCH_RESPONSE_CACHE_TTL=S` turns the optional response cache on with a TTL of S seconds
//! (the bench's bodies never repeat, so it measures what keying every request costs);
//! `STRATA_BENCH_GATEWAY=PATH` times that binary instead of the `strata-gateway` cargo built
//! (another build of the same code, e.g. a profile-guided one, measured by the same bench; a file
//! not named `strata-gateway` is run as `strata gateway`);
//! `STRATA_BENCH_TAILS=1` also prints each path's p50, p90, p95, p98, p99, p99.5 and p99.9, to tell a
//! constant offset from a tail. A numeric setting that does not parse stops the run before it
//! starts, with a message that names the variable.
//! Each phase also prints the gateway's own account from its metrics: the mean time of its own work
//! (`strata_gateway_added_overhead_seconds`), the bucket bound its p99 falls under, and the mean
//! time of waiting on the upstream. The sequential phases
//! also time two reference paths (`gateway_bench/pass_through.rs`), each a proxy in its own process
//! that sends the upstream the gateway's last body, staged before the turn, and does none of the
//! gateway's work: the two-hop limit, on the gateway's HTTP stack (axum server, a kept hyper HTTP/1
//! connection, as the gateway sends to a plain-`http` upstream);
//! and the floor, on hyper's own server with the same client. Each measured turn of these phases
//! times the gateway, the direct path, the limit and the floor in turn, starting one path later on
//! each turn (the gateway first, then the direct path first, and so on), so that each path comes
//! first, right after the staging, on a quarter of the turns: with a fixed order the ratios carried
//! the order's effect, which differed by journal size (BENCHMARKS.md, "The paths timed in a
//! rotating order"). `STRATA_BENCH_FIXED_ORDER=1` times them in the fixed order of the earlier
//! records instead. When the direct path goes before the gateway, it replays the body the gateway
//! sent on the previous turn, one exchange shorter, as the reference proxies always do. The
//! concurrent phases have no staging and keep the order gateway, then direct, on every stream.
//! The `gateway alone` phase is a sequential Stateful one with neither the direct path nor the
//! reference proxies: it times the gateway when the only bodies moved between two of its requests
//! are its own. The last lines compare the gateway's mean own work at 200k with 1k, in this phase
//! and in the interleaved one (the flat-cost goal).
//! `STRATA_BENCH_INSTRUCTIONS=1` times nothing: it runs the gateway under callgrind (valgrind must
//! be installed) in the `gateway alone` and Transparent phases and prints the instructions it
//! executes per request, a measure of its work that load and cache state do not move
//! (`gateway_bench/instructions.rs`). It exits non-zero when the instructions per request at 200k
//! differ from those at 1k by more than the flat-cost goal's ±20%.
//!
//! CI mode: `STRATA_BENCH_CI_MAX_RATIO=R` runs only the sequential phases, Stateful (interleaved
//! and alone) and Transparent (300 measured requests at each journal size), and exits non-zero
//! when a request failed or the p99 ratio gateway / direct exceeds `R` (the Transparent phase at
//! 1k is timed but not judged: its ratio on disk is fsync noise), so a large regression fails the
//! run. `STRATA_BENCH_CI_MAX_RSS_MIB=M` also fails it when the gateway's RSS at the end of a
//! sequential phase is over `M` MiB. The ratio is measured side by side in the same run, which
//! keeps it meaningful on a shared, noisy machine. A judged phase over the bound runs again, up to
//! three attempts in all, and fails the run only when every attempt is over it: a slow stretch of
//! the machine passes, a regression does not.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "gateway_bench/instructions.rs"]
mod instructions;
#[path = "gateway_bench/pass_through.rs"]
mod pass_through;
#[path = "../tests/gateway_support/process.rs"]
mod process;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::Response;
use axum::routing::post;
use process::{GatewayProcess, rss_kib, rss_split_kib};
use serde_json::json;
use strata_api::agent::{Provider, SessionMode, Tokenizer};
use strata_api::effective::EffectivePolicy;
use strata_api::gateway_config::{
    AgentIdentity, GATEWAY_CONFIG_VERSION, GatewayConfig, StablePrefixConfig, UpstreamConfig,
};
use strata_core::entry::{Content, EntryDraft, EntryKind, RetentionClass, Role};
use strata_core::journal::{Journal, JournalOptions, StdStorage, SyncPolicy};
use strata_core::tokens::{TokenCounter, TokenizerKind};

const ANSWER_JSON: &str = r#"{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"k"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":1,"total_tokens":11,"prompt_tokens_details":{"cached_tokens":8}}}"#;

#[derive(Default)]
struct Fake {
    latest: Mutex<Bytes>,
}

fn answer(stream: bool) -> Response {
    if !stream {
        let mut response = Response::new(Body::from(ANSWER_JSON));
        response.headers_mut().insert(header::CONTENT_TYPE, "application/json".parse().unwrap());
        return response;
    }
    let chunk = |delta: &str, finish: &str| {
        format!(
            "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":{finish}}}]}}\n\n"
        )
    };
    let usage = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":1,\"total_tokens\":11,\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\n";
    let text = format!(
        "{}{}{}{usage}data: [DONE]\n\n",
        chunk("{\"role\":\"assistant\",\"content\":\"\"}", "null"),
        chunk("{\"content\":\"k\"}", "null"),
        chunk("{}", "\"stop\"")
    );
    let mut response = Response::new(Body::from(text));
    response.headers_mut().insert(header::CONTENT_TYPE, "text/event-stream".parse().unwrap());
    response
}

async fn upstream(State(fake): State<Arc<Fake>>, headers: HeaderMap, body: Bytes) -> Response {
    let head = &body[..body.len().min(2048)];
    let stream = head.windows(13).any(|window| window == b"\"stream\":true");
    if !headers.contains_key("x-bench-direct") {
        *fake.latest.lock().unwrap() = body;
    }
    answer(stream)
}

/// The `index`th note of a history that grows to `target_tokens`.
fn note(index: u64, target_tokens: u64) -> String {
    let paragraph = "The deployment pipeline retries the flaky integration suite twice before paging. ";
    format!("Note {index}: {}", paragraph.repeat(if target_tokens < 5_000 { 30 } else { 35 }))
}

fn seed(dir: &Path, target_tokens: u64) -> u64 {
    let counter = TokenCounter::new(TokenizerKind::O200kBase).unwrap();
    let options = JournalOptions {
        sync_policy: SyncPolicy::Batched { max_pending: 0 },
        ..JournalOptions::new("bench seed", 1)
    };
    let (mut journal, _) = Journal::open(Arc::new(StdStorage), dir, options).unwrap();
    let mut index = 0u64;
    while journal.total_tokens() < target_tokens {
        let role = if index.is_multiple_of(2) { Role::User } else { Role::Assistant };
        let text = note(index, target_tokens);
        journal
            .append(EntryDraft {
                kind: EntryKind::Message,
                role,
                tokens: u64::from(counter.count(&text)),
                content: Content::text(text),
                retention: RetentionClass::Working,
                created_at_ms: 1,
                artifact_refs: vec![],
            })
            .unwrap();
        index += 1;
    }
    journal.sync().unwrap();
    journal.total_tokens()
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

fn config(fake: SocketAddr, session_mode: SessionMode, response_cache_ttl_seconds: u32) -> GatewayConfig {
    let mut policy = EffectivePolicy::default();
    policy.cache.response_cache_ttl_seconds = response_cache_ttl_seconds;
    GatewayConfig {
        version: GATEWAY_CONFIG_VERSION,
        agent: AgentIdentity {
            name: "bench".into(),
            namespace: "bench".into(),
            privacy_scope: "tenant".into(),
            uid: None,
            adopt_journal_from_uid: None,
        },
        upstream: UpstreamConfig {
            provider: Provider::OpenAI,
            model: "m".into(),
            endpoint: format!("http://{fake}/v1"),
            context_window: 1_000_000,
            tokenizer: Tokenizer::O200kBase,
            api_key_file: None,
            timeout_seconds: 60,
        },
        policy,
        stable_prefix: StablePrefixConfig {
            system_prompt: "You are a benchmark agent.".into(),
            tools: vec![],
            constants: Default::default(),
        },
        cache_key: "ab".repeat(32),
        cache_key_short: "ab".repeat(8),
        cache_epoch: 0,
        session_mode,
    }
}

/// Starts `program` (the gateway, or the script that runs it under callgrind) and waits until it is
/// ready; under callgrind it starts uninstrumented, so it is ready in about the usual time.
async fn spawn_gateway(program: &Path, config_path: &Path, data_dir: &Path) -> GatewayProcess {
    let mut process = GatewayProcess::spawn(program, config_path, data_dir, None);
    process
        .wait_ready(&reqwest::Client::new(), Duration::from_secs(30))
        .await
        .expect("the gateway did not start");
    process
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

/// A transport error with every cause under it (reqwest's own text names only the request).
fn error_chain(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Reads a whole answer; a failure (status or transport) is returned with its text.
async fn read_all(response: Result<reqwest::Response, reqwest::Error>) -> Result<usize, String> {
    let response = response.map_err(|error| error_chain(&error))?;
    let status = response.status();
    let body = response.bytes().await.map_err(|error| error_chain(&error))?;
    if status.is_success() {
        Ok(body.len())
    } else {
        Err(format!("{status}: {}", String::from_utf8_lossy(&body)))
    }
}

/// The flat-cost goal: a request's cost at a 200k-token journal within this many % of a 1k one.
const FLAT_COST_GOAL_PERCENT: f64 = 20.0;

/// The sequential phase whose client is a Transparent one (the whole history on every call).
const TRANSPARENT: &str = "transparent";
/// How many times CI mode runs a judged phase whose ratio is over the bound before it fails the
/// run. A busy neighbour on the shared machine can slow every path for seconds, and the gateway
/// path, with two hops, the most: one CI run measured 14.2x at 1k against a bound of 20x while the
/// zero-work floor proxy was itself 8.1x direct. A regression over the bound is over it on every
/// attempt; a slow stretch rarely lasts through three 300-request phases.
const CI_ATTEMPTS: u32 = 3;

/// The sequential Stateful phase that times the gateway alone: no direct path and no reference
/// proxies between its requests, so the only bodies moved between two of them are its own.
const ALONE: &str = "gateway alone";

/// How the reference paths are named in the report, in the order they are timed.
const REFERENCE_LABELS: [&str; 2] =
    ["two-hop limit (pass-through proxy, axum server)", "floor (zero-work proxy, hyper server)"];

struct Phase {
    gateway: Vec<Duration>,
    direct: Vec<Duration>,
    /// Through each reference proxy, in the order given (sequential phases only).
    references: Vec<Vec<Duration>>,
    failures: Vec<String>,
}

/// Sends `body` to `url` as the direct path does (the fake does not keep it) and times the answer.
async fn timed_replay(client: &reqwest::Client, url: &str, body: Bytes) -> Result<Duration, String> {
    let started = Instant::now();
    let response = client
        .post(url)
        .header("x-bench-direct", "1")
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await;
    read_all(response).await.map(|_| started.elapsed())
}

/// The messages a Transparent client has sent and received so far, shared by the phases of one
/// gateway (its journal holds them).
type Transcript = Arc<Mutex<Vec<serde_json::Value>>>;

/// A chat request body as a client serializes it.
#[derive(serde::Serialize)]
struct ChatBody<'a> {
    messages: &'a [serde_json::Value],
    stream: bool,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    tools: &'a [serde_json::Value],
}

/// The tool block every request carries: none, or with `STRATA_BENCH_TOOL_TOKENS=N` the
/// synthetic tool set of about N tokens (`strata replay --synthetic-tools`) in OpenAI's shape, as
/// a coding agent sends its tools with every call.
fn bench_tools() -> &'static [serde_json::Value] {
    static TOOLS: std::sync::OnceLock<Vec<serde_json::Value>> = std::sync::OnceLock::new();
    TOOLS.get_or_init(|| {
        // `bench` has refused a value that does not parse before any request is built.
        let Ok(Some(tokens)) = tool_tokens_setting() else {
            return Vec::new();
        };
        let counter = TokenCounter::new(TokenizerKind::O200kBase).unwrap();
        strata_core::replay::tool_set::synthetic_tool_set(tokens, &counter)
            .into_iter()
            .map(|tool| {
                json!({"type": "function", "function": {
                    "name": tool["name"], "description": tool["description"], "parameters": tool["input_schema"]
                }})
            })
            .collect()
    })
}

/// The whole message list of a Transparent client whose history is at least `target_tokens`
/// (the same notes the Stateful phases' journal is seeded with).
fn transparent_history(target_tokens: u64) -> Vec<serde_json::Value> {
    let counter = TokenCounter::new(TokenizerKind::O200kBase).unwrap();
    let (mut messages, mut tokens) = (Vec::new(), 0u64);
    let mut index = 0u64;
    while tokens < target_tokens {
        let role = if index.is_multiple_of(2) { "user" } else { "assistant" };
        let text = note(index, target_tokens);
        tokens += u64::from(counter.count(&text));
        messages.push(json!({"role": role, "content": text}));
        index += 1;
    }
    // A client's history ends with the model's answer; the first request adds a user message.
    if messages.last().is_some_and(|last| last["role"] == "user") {
        messages.push(json!({"role": "assistant", "content": "Noted."}));
    }
    messages
}

/// Runs `per_stream` measured requests (after one unmeasured) on each of `streams` streams, each
/// followed by the direct path to the fake upstream at `direct` (none: the gateway alone) and then
/// each of the `references` proxies. With a `transcript`, the client is a Transparent one: it sends
/// the whole message list on every call (one stream only) and keeps each answer in it.
async fn run_phase(
    gateway: SocketAddr,
    direct: Option<SocketAddr>,
    references: &[SocketAddr],
    state: Arc<Fake>,
    (streams, per_stream): (usize, usize),
    transcript: Option<Transcript>,
) -> Phase {
    assert!(transcript.is_none() || streams == 1, "a Transparent client is one stream");
    let client = reqwest::Client::builder().pool_max_idle_per_host(streams * 2).build().unwrap();
    let stream_requests = streams > 1;
    let rotate = std::env::var_os("STRATA_BENCH_FIXED_ORDER").is_none();
    // Each path's URL, written once rather than inside the timed requests.
    let chat = "/v1/chat/completions";
    let gateway_url = format!("http://{gateway}{chat}");
    let direct_url = direct.map(|fake| format!("http://{fake}{chat}"));
    let reference_urls: Vec<String> =
        references.iter().map(|proxy| format!("http://{proxy}{chat}")).collect();
    let mut tasks = Vec::with_capacity(streams);
    for stream in 0..streams {
        let client = client.clone();
        let state = Arc::clone(&state);
        let transcript = transcript.clone();
        let references = references.to_vec();
        let (gateway_url, direct_url, reference_urls) =
            (gateway_url.clone(), direct_url.clone(), reference_urls.clone());
        tasks.push(tokio::spawn(async move {
            let mut gateway_times = Vec::with_capacity(per_stream);
            let mut direct_times = Vec::with_capacity(per_stream);
            let mut reference_times = vec![Vec::with_capacity(per_stream); references.len()];
            if stream_requests {
                tokio::time::sleep(Duration::from_micros(100 * stream as u64)).await;
            }
            let mut failures = Vec::new();
            for index in 0..=per_stream {
                let message = json!({"role": "user", "content": format!("p{stream}.{index}")});
                // Serialized before the clock starts: a client's own work is not the gateway's.
                let body = match &transcript {
                    Some(transcript) => {
                        let mut messages = transcript.lock().unwrap();
                        messages.push(message);
                        serde_json::to_vec(&ChatBody {
                            messages: &messages,
                            stream: stream_requests,
                            tools: bench_tools(),
                        })
                    }
                    None => serde_json::to_vec(&ChatBody {
                        messages: &[message],
                        stream: stream_requests,
                        tools: bench_tools(),
                    }),
                };
                let body = Bytes::from(body.unwrap());
                for proxy in &references {
                    // A proxy sends the upstream the body the gateway sent last (one turn shorter
                    // than the one it is about to send), staged now so that the proxy is as idle as
                    // the gateway when its measured request comes.
                    let replay = state.latest.lock().unwrap().clone();
                    let staged = client.post(format!("http://{proxy}/stage")).body(replay).send().await;
                    if let Err(error) = staged.and_then(reqwest::Response::error_for_status) {
                        failures.push(format!("staging at a reference proxy: {}", error_chain(&error)));
                    }
                }
                // The paths are timed in turn. Where there is a staging (the sequential phases with
                // reference proxies), each turn starts one path later unless the fixed order was
                // asked for, so that no path always comes right after the staging.
                let paths = 2 + references.len();
                let first = if rotate && !references.is_empty() { index % paths } else { 0 };
                let mut through_gateway = Err("not timed".to_owned());
                let mut direct = None;
                let mut through_references: Vec<Result<Duration, String>> =
                    vec![Err("not timed".to_owned()); references.len()];
                for step in 0..paths {
                    match (first + step) % paths {
                        0 => {
                            let started = Instant::now();
                            let mut request = client
                                .post(&gateway_url)
                                .header("content-type", "application/json")
                                .body(body.clone());
                            if transcript.is_none() {
                                request = request.header("x-strata-session", "bench");
                            }
                            through_gateway = read_all(request.send().await).await.map(|_| started.elapsed());
                            if let Some(transcript) = &transcript {
                                transcript.lock().unwrap().push(json!({"role": "assistant", "content": "k"}));
                            }
                        }
                        1 => {
                            if let Some(url) = &direct_url {
                                let replay = state.latest.lock().unwrap().clone();
                                direct = Some(timed_replay(&client, url, replay).await);
                            }
                        }
                        reference => {
                            let started = Instant::now();
                            let response = client
                                .post(&reference_urls[reference - 2])
                                .header("content-type", "application/json")
                                .body(body.clone())
                                .send()
                                .await;
                            through_references[reference - 2] =
                                read_all(response).await.map(|_| started.elapsed());
                        }
                    }
                }
                if index == 0 {
                    continue;
                }
                let through_references: Result<Vec<Duration>, String> =
                    through_references.into_iter().collect();
                match (through_gateway, direct.transpose(), through_references) {
                    (Ok(gateway_time), Ok(direct_time), Ok(reference_time)) => {
                        gateway_times.push(gateway_time);
                        direct_times.extend(direct_time);
                        for (times, time) in reference_times.iter_mut().zip(reference_time) {
                            times.push(time);
                        }
                    }
                    (Err(error), _, _) => failures.push(format!("gateway: {error}")),
                    (_, Err(error), _) => failures.push(format!("direct: {error}")),
                    (_, _, Err(error)) => failures.push(format!("reference proxy: {error}")),
                }
            }
            (gateway_times, direct_times, reference_times, failures)
        }));
    }
    let mut phase = Phase {
        gateway: Vec::new(),
        direct: Vec::new(),
        references: vec![Vec::new(); references.len()],
        failures: Vec::new(),
    };
    for task in tasks {
        let (gateway_times, direct_times, reference_times, failures) = task.await.unwrap();
        phase.gateway.extend(gateway_times);
        phase.direct.extend(direct_times);
        for (all, times) in phase.references.iter_mut().zip(reference_times) {
            all.extend(times);
        }
        phase.failures.extend(failures);
    }
    phase.gateway.sort();
    phase.direct.sort();
    for times in &mut phase.references {
        times.sort();
    }
    phase
}

fn micros(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e6
}

async fn journal_tokens(gateway: SocketAddr) -> u64 {
    let status: serde_json::Value =
        reqwest::get(format!("http://{gateway}/strata/v1/status")).await.unwrap().json().await.unwrap();
    status["journalTokens"].as_u64().unwrap_or(0)
}

/// A histogram's sum (seconds) and count, as the gateway's metrics report them.
#[derive(Clone, Copy)]
struct Totals {
    seconds: f64,
    count: f64,
}

impl Totals {
    /// The mean, in µs, of what was observed between `before` and `self`.
    fn mean_micros_since(self, before: Totals) -> f64 {
        let count = self.count - before.count;
        if count > 0.0 { (self.seconds - before.seconds) / count * 1e6 } else { 0.0 }
    }
}

/// The gateway's own account: its own work, its wait on the upstream, and how often a Transparent
/// history had to be rewound (a sign that the bench's client diverged from the journal).
struct OwnTimes {
    work: Totals,
    /// The own-work histogram's cumulative bucket counts: (upper bound in seconds, count).
    work_buckets: Vec<(f64, f64)>,
    upstream: Totals,
    rewinds: f64,
}

impl OwnTimes {
    /// The upper bound, in µs, of the own-work bucket holding the `p` quantile of the requests
    /// observed since `before`; `None` when it lies above the largest finite bound.
    fn work_quantile_bound_since(&self, before: &OwnTimes, p: f64) -> Option<f64> {
        let count = self.work.count - before.work.count;
        let wanted = (count * p).ceil();
        self.work_buckets
            .iter()
            .zip(&before.work_buckets)
            .find_map(|((bound, after), (_, earlier))| (after - earlier >= wanted).then_some(bound * 1e6))
    }
}

async fn own_times(metrics: SocketAddr) -> OwnTimes {
    let text = reqwest::get(format!("http://{metrics}/metrics")).await.unwrap().text().await.unwrap();
    let value = |name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(name).and_then(|rest| rest.trim().parse::<f64>().ok()))
            .unwrap_or(0.0)
    };
    let totals = |histogram: &str| Totals {
        seconds: value(&format!("{histogram}_sum")),
        count: value(&format!("{histogram}_count")),
    };
    let work_buckets = text
        .lines()
        .filter_map(|line| line.strip_prefix("strata_gateway_added_overhead_seconds_bucket{le=\""))
        .filter_map(|rest| {
            let (bound, count) = rest.split_once("\"}")?;
            Some((bound.parse::<f64>().ok()?, count.trim().parse::<f64>().ok()?))
        })
        .filter(|(bound, _)| bound.is_finite())
        .collect();
    OwnTimes {
        work: totals("strata_gateway_added_overhead_seconds"),
        work_buckets,
        upstream: totals("strata_gateway_upstream_seconds"),
        rewinds: text
            .lines()
            .filter(|line| line.starts_with("strata_gateway_transparent_rewinds_total"))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum(),
    }
}

/// The flat-cost goal: the gateway's cost per request at a 200k-token journal against a 1k one
/// (goal: within ±20%), for each sequential Stateful phase: its mean own work in time, or its instructions
/// when `counting`. In the `sequential` phase the direct path and the reference proxies move the
/// large body four more times between two of the gateway's requests, which leaves its caches
/// colder at 200k than its own traffic would; the `gateway alone` phase has no such traffic.
/// Returns each phase's change, in %.
fn print_flat_cost<'a>(means: &[(u64, &'a str, f64)], counting: bool) -> Vec<(&'a str, f64)> {
    let mut changes = Vec::new();
    let mean = |target: u64, name: &str| {
        means.iter().find(|(t, n, _)| *t == target && *n == name).map(|(_, _, m)| *m)
    };
    for name in ["sequential", ALONE] {
        if let (Some(small), Some(large)) = (mean(1_000, name), mean(200_000, name))
            && small > 0.0
        {
            let change = (large / small - 1.0) * 100.0;
            changes.push((name, change));
            if counting {
                println!(
                    "flat cost, {name}: {small:.0} instructions per request at 1k, {large:.0} at 200k = {change:+.1}% (goal: within ±{FLAT_COST_GOAL_PERCENT}%)"
                );
            } else {
                println!(
                    "flat cost, {name}: own work {small:.1} µs at 1k, {large:.1} µs at 200k = {change:+.0}% (goal: within ±{FLAT_COST_GOAL_PERCENT}%)"
                );
            }
        }
    }
    changes
}

fn bench_root() -> PathBuf {
    std::env::var_os("STRATA_BENCH_DIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|arg| arg == "--list") {
        return;
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    if let [_, mode, upstream, ..] = args.as_slice() {
        if mode == pass_through::ARG {
            pass_through::serve(upstream);
            return;
        }
        if mode == pass_through::FLOOR_ARG {
            pass_through::serve_floor(upstream);
            return;
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let code = runtime.block_on(bench());
    drop(runtime);
    std::process::exit(code);
}

/// The numbers the environment may set, each refused with a clear message when it does not parse.
struct Settings {
    /// `STRATA_BENCH_CI_MAX_RATIO`: CI mode's bound on a judged phase's p99 ratio.
    max_ratio: Option<f64>,
    /// `STRATA_BENCH_CI_MAX_RSS_MIB`: CI mode's bound on the RSS at the end of each sequential phase
    /// (memory is not noisy).
    max_rss_mib: Option<f64>,
    /// `STRATA_BENCH_SEQUENTIAL`: requests a sequential phase sends, instead of the mode's number.
    sequential_override: Option<usize>,
    /// `STRATA_BENCH_RESPONSE_CACHE_TTL`: the response cache's TTL in seconds (off when unset).
    response_cache_ttl_seconds: Option<u32>,
}

impl Settings {
    fn from_env() -> Result<Self, String> {
        tool_tokens_setting()?;
        Ok(Settings {
            max_ratio: setting(
                "STRATA_BENCH_CI_MAX_RATIO",
                |ratio| *ratio > 1.0,
                "the largest acceptable p99 ratio, above 1",
            )?,
            max_rss_mib: setting(
                "STRATA_BENCH_CI_MAX_RSS_MIB",
                |mib| *mib > 0.0,
                "the largest acceptable RSS in MiB, above 0",
            )?,
            sequential_override: setting(
                "STRATA_BENCH_SEQUENTIAL",
                |count| *count > 0,
                "the number of requests a sequential phase sends",
            )?,
            response_cache_ttl_seconds: setting(
                "STRATA_BENCH_RESPONSE_CACHE_TTL",
                |seconds| *seconds > 0,
                "the response cache's TTL in seconds, above 0",
            )?,
        })
    }
}

/// `STRATA_BENCH_TOOL_TOKENS`: the size of the synthetic tool block, in tokens.
fn tool_tokens_setting() -> Result<Option<u64>, String> {
    setting("STRATA_BENCH_TOOL_TOKENS", |tokens| *tokens > 0, "the tool block's size in tokens, above 0")
}

/// A setting from the environment variable `name`: `None` when unset, or an error that names the
/// variable and says what to give when its value does not parse or `valid` refuses it.
fn setting<T: std::str::FromStr>(
    name: &str,
    valid: impl Fn(&T) -> bool,
    what: &str,
) -> Result<Option<T>, String> {
    let Ok(text) = std::env::var(name) else {
        return Ok(None);
    };
    match text.parse::<T>() {
        Ok(value) if valid(&value) => Ok(Some(value)),
        _ => Err(format!("{name}={text:?}: give {what}")),
    }
}

/// Runs the phases; returns the exit code.
async fn bench() -> i32 {
    let quick = std::env::var_os("STRATA_BENCH_QUICK").is_some();
    let counting = std::env::var_os("STRATA_BENCH_INSTRUCTIONS").is_some();
    if counting && let Some(why) = instructions::unavailable() {
        eprintln!("{why}");
        return 2;
    }
    let settings = match Settings::from_env() {
        Ok(settings) => settings,
        Err(why) => {
            eprintln!("{why}");
            return 2;
        }
    };
    let Settings { max_ratio, max_rss_mib, sequential_override, response_cache_ttl_seconds } = settings;
    let state = Arc::new(Fake::default());
    // The gateway's backlog, not tokio's 1024: 2,048 streams connect to the fake directly too.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(strata::gateway::LISTEN_BACKLOG).unwrap();
    let fake = listener.local_addr().unwrap();
    let router = Router::new().route("/v1/chat/completions", post(upstream)).with_state(Arc::clone(&state));
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    let proxy = pass_through::PassThrough::spawn(pass_through::ARG, fake);
    let floor = pass_through::PassThrough::spawn(pass_through::FLOOR_ARG, fake);

    let root = tempfile::tempdir_in(bench_root()).unwrap();
    let config_path = |mode: SessionMode| root.path().join(format!("gateway-{mode:?}.json"));
    for mode in [SessionMode::Stateful, SessionMode::Transparent] {
        std::fs::write(
            config_path(mode),
            serde_json::to_vec(&config(fake, mode, response_cache_ttl_seconds.unwrap_or(0))).unwrap(),
        )
        .unwrap();
    }
    let gateway_program = match std::env::var_os("STRATA_BENCH_GATEWAY") {
        Some(path) => {
            let path = PathBuf::from(path);
            if !path.is_file() {
                eprintln!(
                    "STRATA_BENCH_GATEWAY={}: no such file; give the path of a strata-gateway or strata binary",
                    path.display()
                );
                return 2;
            }
            path
        }
        None => PathBuf::from(env!("CARGO_BIN_EXE_strata-gateway")),
    };
    println!("gateway: {}", gateway_program.display());
    let callgrind_dir = root.path().join("callgrind");
    let program =
        if counting { instructions::wrapper(&callgrind_dir, &gateway_program) } else { gateway_program };
    let phases: &[(&str, usize, usize)] = if counting {
        &[(ALONE, 1, 300), (TRANSPARENT, 1, 300)]
    } else if max_ratio.is_some() {
        &[("sequential", 1, 300), (ALONE, 1, 300), (TRANSPARENT, 1, 300)]
    } else if quick {
        &[
            ("sequential", 1, 300),
            (ALONE, 1, 300),
            (TRANSPARENT, 1, 300),
            ("256 streams", 256, 2),
            ("2048 streams", 2048, 1),
        ]
    } else {
        &[
            ("sequential", 1, 2000),
            (ALONE, 1, 2000),
            (TRANSPARENT, 1, 2000),
            ("256 streams", 256, 8),
            ("2048 streams", 2048, 2),
        ]
    };
    let phases: Vec<(&str, usize, usize)> = phases
        .iter()
        .map(|&(name, streams, count)| {
            (name, streams, if streams == 1 { sequential_override.unwrap_or(count) } else { count })
        })
        .collect();
    let mut regressions = Vec::new();
    // (journal target, phase, cost per request) of each sequential phase: the gateway's mean own
    // work in µs, or its instructions per request when counting.
    let mut per_request_costs: Vec<(u64, &str, f64)> = Vec::new();
    println!("data dir root: {}", root.path().display());
    for target in [1_000u64, 200_000] {
        let seeded = root.path().join(format!("seed-{target}"));
        let seeded_tokens = seed(&seeded, target);
        // Each phase runs once; in CI mode a judged phase over the bound runs again (see
        // `CI_ATTEMPTS`), so the queue holds the attempt number too.
        let mut queue: VecDeque<(&str, usize, usize, u32)> =
            phases.iter().map(|&(name, streams, per_stream)| (name, streams, per_stream, 1)).collect();
        while let Some((name, streams, per_stream, attempt)) = queue.pop_front() {
            let data = root.path().join(format!("data-{target}-{name}-{attempt}"));
            // A Transparent client starts from an empty journal: its first (unmeasured) request
            // sends the whole history, which the gateway journals.
            let (mode, transcript) = if name == TRANSPARENT {
                (SessionMode::Transparent, Some(Arc::new(Mutex::new(transparent_history(target)))))
            } else {
                copy_dir(&seeded, &data);
                (SessionMode::Stateful, None)
            };
            let gateway = spawn_gateway(&program, &config_path(mode), &data).await;
            // Counting times nothing, so it sends the gateway's requests alone.
            let alone = name == ALONE || counting;
            let references =
                if streams == 1 && !alone { vec![proxy.address, floor.address] } else { Vec::new() };
            let direct = (!alone).then_some(fake);
            let warm_up = run_phase(
                gateway.address,
                direct,
                &references,
                Arc::clone(&state),
                (1, 20),
                transcript.clone(),
            )
            .await;
            if let Some(failure) = warm_up.failures.first() {
                println!("  warm-up failed in {name}: {failure}");
                regressions.push(format!("the warm-up failed at {target} tokens, {name}"));
                continue;
            }
            if counting && let Err(error) = instructions::start(gateway.pid()).await {
                eprintln!("{error}");
                return 2;
            }
            let before = journal_tokens(gateway.address).await;
            let own_before = own_times(gateway.metrics_address).await;
            let phase = run_phase(
                gateway.address,
                direct,
                &references,
                Arc::clone(&state),
                (streams, per_stream),
                transcript,
            )
            .await;
            let own_after = own_times(gateway.metrics_address).await;
            if counting {
                let handled = own_after.work.count - own_before.work.count;
                match instructions::instructions(gateway.pid(), &callgrind_dir).await {
                    Ok(count) if handled > 0.0 && phase.failures.is_empty() => {
                        let per_request = count as f64 / handled;
                        println!(
                            "journal {seeded_tokens:>7} tok | {name:<13} n={handled:<5} | instructions per request {per_request:>10.0} (callgrind, all of the gateway's threads, user space)"
                        );
                        per_request_costs.push((target, name, per_request));
                    }
                    Ok(_) => {
                        println!(
                            "  {name} at {target} tokens: no request counted; failures: {:?}",
                            phase.failures
                        );
                        regressions.push(format!("no request counted at {target} tokens, {name}"));
                    }
                    Err(error) => {
                        eprintln!("{error}");
                        return 2;
                    }
                }
                continue;
            }
            if own_after.rewinds > 0.0 {
                println!(
                    "  the gateway rewound {} times: the bench's Transparent client diverged from its journal",
                    own_after.rewinds
                );
                regressions.push(format!("transparent rewinds at {target} tokens, {name}"));
            }
            let after = journal_tokens(gateway.address).await;
            let (rss, peak) = rss_kib(gateway.child.id());
            let (anon, file) = rss_split_kib(gateway.child.id());
            let rss_mib = rss as f64 / 1024.0;
            if let Some(bound) = max_rss_mib
                && streams == 1
                && rss_mib > bound
            {
                println!("  RSS {rss_mib:.1} MiB > {bound} MiB at {target} tokens, {name}");
                // Once per phase, whichever attempt is over it.
                let regression = format!("RSS over {bound} MiB at {target} tokens, {name} (printed above)");
                if !regressions.contains(&regression) {
                    regressions.push(regression);
                }
            }
            let mut kinds: Vec<&String> = phase.failures.iter().collect();
            kinds.sort();
            kinds.dedup();
            for kind in kinds.iter().take(5) {
                println!("  failure: {kind}");
            }
            if let Some(first) = phase.failures.first() {
                let count = |prefix: &str| phase.failures.iter().filter(|f| f.starts_with(prefix)).count();
                let (through_gateway, direct) = (count("gateway:"), count("direct:"));
                println!(
                    "  {} failed requests in {name} ({through_gateway} through the gateway, {direct} direct, {} at a reference proxy), e.g. {first}",
                    phase.failures.len(),
                    phase.failures.len() - through_gateway - direct
                );
                regressions
                    .push(format!("{} failed requests at {target} tokens, {name}", phase.failures.len()));
            }
            if phase.gateway.is_empty() {
                continue;
            }
            let work_mean = own_after.work.mean_micros_since(own_before.work);
            if streams == 1 {
                per_request_costs.push((target, name, work_mean));
            }
            let (g50, g99) = (percentile(&phase.gateway, 0.5), percentile(&phase.gateway, 0.99));
            let memory = format!(
                "RSS {:.1} MiB (peak {:.1} MiB; anon {:.1} MiB, file {:.1} MiB)",
                rss as f64 / 1024.0,
                peak as f64 / 1024.0,
                anon as f64 / 1024.0,
                file as f64 / 1024.0,
            );
            let own_account = format!(
                "the gateway's own account, mean: its work {work_mean:.0} µs (p99 within {}), waiting on the upstream {:.0} µs",
                own_after
                    .work_quantile_bound_since(&own_before, 0.99)
                    .map_or_else(|| "over 50 ms".to_owned(), |bound| format!("{bound:.0} µs")),
                own_after.upstream.mean_micros_since(own_before.upstream)
            );
            let head = format!(
                "journal {seeded_tokens:>7} tok ({before}->{after}) | {name:<13} n={:<5} | gateway p50 {:>9.0} µs p99 {:>9.0} µs",
                phase.gateway.len(),
                micros(g50),
                micros(g99),
            );
            if alone {
                println!("{head} | {memory}");
                println!("  {own_account}");
                continue;
            }
            let (d50, d99) = (percentile(&phase.direct, 0.5), percentile(&phase.direct, 0.99));
            println!(
                "{head} | direct p50 {:>8.0} µs p99 {:>8.0} µs | added p50 {:>8.0} µs p99 {:>8.0} µs | {memory}",
                micros(d50),
                micros(d99),
                micros(g50) - micros(d50),
                micros(g99) - micros(d99),
            );
            let ratio = micros(g99) / micros(d99);
            println!("  p99 gateway / direct = {ratio:.2}x | {own_account}");
            if std::env::var_os("STRATA_BENCH_TAILS").is_some() {
                let tails = |times: &[Duration]| {
                    [0.5, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999]
                        .iter()
                        .map(|&p| format!("{:.0}", micros(percentile(times, p))))
                        .collect::<Vec<_>>()
                        .join(" ")
                };
                println!(
                    "  tails p50 p90 p95 p98 p99 p99.5 p99.9 | gateway {} | direct {}",
                    tails(&phase.gateway),
                    tails(&phase.direct)
                );
                for (times, label) in phase.references.iter().zip(REFERENCE_LABELS) {
                    let name = label.split(" (").next().unwrap_or(label);
                    println!("  tails {name}: {}", tails(times));
                }
            }
            for (times, label) in phase.references.iter().zip(REFERENCE_LABELS) {
                let (p50, p99) = (percentile(times, 0.5), percentile(times, 0.99));
                println!(
                    "  {label}: p50 {:.0} µs p99 {:.0} µs = {:.2}x direct at p99 | p99 gateway / it = {:.2}x",
                    micros(p50),
                    micros(p99),
                    micros(p99) / micros(d99),
                    micros(g99) / micros(p99)
                );
            }
            // The Transparent phase at 1k is timed, not judged: on disk its p99 is two fsyncs (the
            // journal's log and the transparent index) against a direct path of about 70 µs, and
            // it measured 7.6x and 14.8x in two CI-mode runs of the same code (BENCHMARKS.md).
            let judged = !(name == TRANSPARENT && target < 10_000);
            if let Some(bound) = max_ratio
                && judged
                && ratio > bound
            {
                if attempt < CI_ATTEMPTS {
                    println!(
                        "  {ratio:.2}x > {bound}x: a regression or a slow stretch of the machine; running {name} again (attempt {} of {CI_ATTEMPTS})",
                        attempt + 1
                    );
                    // The flat-cost line compares the attempt that counts.
                    per_request_costs
                        .retain(|&(cost_target, phase, _)| (cost_target, phase) != (target, name));
                    queue.push_front((name, streams, per_stream, attempt + 1));
                    continue;
                }
                regressions.push(format!(
                    "p99 gateway / direct {ratio:.2}x > {bound}x at {target} tokens, {name}, in each of {CI_ATTEMPTS} attempts"
                ));
            }
        }
    }
    let flat_changes = print_flat_cost(&per_request_costs, counting);
    if counting {
        // Instructions do not move with the machine's load, so the flat-cost goal is judged on
        // them: a step that grows with the history fails the run.
        match flat_changes.iter().find(|(name, _)| *name == ALONE) {
            Some((_, change)) if change.abs() > FLAT_COST_GOAL_PERCENT => regressions.push(format!(
                "instructions per request at 200k differ from 1k by {change:+.1}%, beyond ±{FLAT_COST_GOAL_PERCENT}%"
            )),
            Some(_) => {}
            None => regressions.push("no flat-cost figure: a phase counted nothing".to_owned()),
        }
    }
    if max_ratio.is_some() || max_rss_mib.is_some() || counting {
        if regressions.is_empty() {
            println!("gateway bench check: pass");
        } else {
            println!("gateway bench check: FAIL\n  {}", regressions.join("\n  "));
            return 1;
        }
    }
    0
}

//! Crash suite: kill -9 the real `strata-gateway` process (the sidecar's program) at random points while it serves long
//! recorded sessions; after every restart on the same volume the journal verifies, no turn is lost
//! or duplicated, and the client's retry of the interrupted call succeeds.
//!
//! Method: an in-process fake upstream answers each call with the recorded assistant message,
//! after a random delay, streams paced event by event. The client plays seed 003's session and the
//! long sessions of `../shared/corpus/long-sessions`, call by call: in Transparent mode the whole
//! history on every call, in Stateful mode only the new messages with a session header and an
//! `Idempotency-Key` per call (the same on its retries). Each
//! session first runs once without kills (the reference): after every call the journal's current
//! generation is read from disk and its entries fingerprinted (kind, role, content hash). Then the
//! session runs again on a fresh volume while a killer sends SIGKILL at a random moment of a random
//! share of the calls (before the request reaches upstream, while upstream is answering,
//! mid-stream, after the answer while idle, and during a restart). After each kill:
//! - the journal verifies: the current generation is read from disk with strata-core's reader
//!   (header, manifest, every record's CRC32C and entry decoding; a torn final record is counted,
//!   it is the one thing the next open repairs), every entry's content hash matches its content,
//!   and entry IDs are unique;
//! - no acknowledged turn is lost and none is duplicated: the journal equals the reference after
//!   the last call the client got a complete answer for, or lies between that and the reference
//!   after the interrupted call (a cut turn may be absent, partly or wholly present, never twice);
//! - the gateway restarts on the same volume, and the client's retry of the interrupted call gets
//!   a complete answer, after which the journal equals the reference for that call.
//!
//! Run with `cargo bench -p strata --bench gateway_crash -- --kills 500 --seed 1` (see `--help`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/gateway_support/mod.rs"]
mod gateway_support;

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use gateway_support::corpus::{files, load, reply_of, seed_003, shared};
use gateway_support::process::GatewayProcess;
use gateway_support::{FakeUpstream, Reply, config, write_config};
use serde_json::{Value, json};
use strata_api::agent::{Provider, SessionMode};
use strata_core::entry::{EntryKind, Role};
use strata_core::journal::sim::SimRng;
use strata_core::journal::{StdStorage, read_current_generation};

/// The suite's parameters.
#[derive(Debug, Parser)]
struct Args {
    /// Kills to inflict in total.
    #[arg(long, default_value_t = 500)]
    kills: u64,
    /// Seed of the kill schedule and the fake's delays (timing still depends on the machine).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Session modes, used in turn session by session.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Mode::Transparent, Mode::Stateful])]
    modes: Vec<Mode>,
    /// Context windows in tokens, used in turn (32k makes the gateway compact within sessions).
    #[arg(long, value_delimiter = ',', default_values_t = [200_000, 32_000])]
    windows: Vec<u32>,
    /// Share of call attempts that get a kill, in percent.
    #[arg(long, default_value_t = 50)]
    kill_percent: u64,
    /// Share of restarts that get a kill before the gateway is ready, in percent.
    #[arg(long, default_value_t = 10)]
    startup_kill_percent: u64,
    /// Where the volumes go (default: the system's temp dir).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Only the sessions with these names (default: seed 003 and every long session).
    #[arg(long, value_delimiter = ',')]
    sessions: Vec<String>,
    /// Ignored (cargo bench passes it).
    #[arg(long, hide = true)]
    bench: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    Transparent,
    Stateful,
}

/// Where the client was when the kill landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    /// The request was on its way or inside the gateway, upstream had not seen it yet (parsing,
    /// journaling the new turns, compiling, compacting).
    BeforeUpstream,
    /// [`Phase::BeforeUpstream`] on a call where the reference compacted.
    BeforeUpstreamCompacting,
    /// Upstream had the request and had not answered the client's head yet.
    AwaitingUpstream,
    /// The client had the answer's head and part of its body (a stream, mid-way).
    MidAnswer,
    /// The client had the whole answer; the gateway was idle or finishing up.
    AfterAnswer,
    /// The gateway was starting and not ready yet.
    Startup,
}

/// The window of the uncompacted reference (the sessions peak far below it).
const FULL_WINDOW: u32 = 1_000_000;

const SENDING: u8 = 0;
const READING: u8 = 1;
const IDLE: u8 = 2;

/// One entry's identity for comparison: kind, role and content hash. Entry IDs are left out: they
/// may differ after a crash by design (a retried turn drops the entries the client never saw, and
/// their IDs are not issued again). A compaction summary names the entries it covers and the
/// archive artifact holding them (whose bytes carry those IDs and creation times), so it is hashed
/// with the digits of every entry ID and every artifact hash blanked.
type Fingerprint = (EntryKind, Role, String);

fn fingerprint(entry: &strata_core::entry::Entry) -> Fingerprint {
    let hash = if entry.id.kind() == EntryKind::Summary {
        let text = serde_json::to_string(&entry.content).unwrap();
        let blanked = blank_entry_ids(&text);
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(blanked.as_bytes()))
    } else {
        entry.content_hash.clone()
    };
    (entry.id.kind(), entry.role, hash)
}

/// `text` with the number of every `msg_N`, `tool_call_N`, `tool_res_N` and `summary_N`, and the
/// hex of every `art:sha256:HEX`, replaced by `#`.
fn blank_entry_ids(text: &str) -> String {
    let mut text = text.to_owned();
    let mut from = 0;
    while let Some(at) = text[from..].find("art:sha256:") {
        let start = from + at + "art:sha256:".len();
        let hex = text[start..].bytes().take_while(u8::is_ascii_hexdigit).count();
        text.replace_range(start..start + hex, "#");
        from = start;
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(at) = rest.find('_') {
        let (before, after) = rest.split_at(at);
        out.push_str(before);
        let is_id = ["msg", "tool_call", "tool_res", "summary"].iter().any(|prefix| out.ends_with(prefix));
        out.push('_');
        let after = &after[1..];
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        if is_id && digits > 0 {
            out.push('#');
            rest = &after[digits..];
        } else {
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// A journal read from disk.
struct Verified {
    generation: u64,
    entries: Vec<Fingerprint>,
    torn_tail: bool,
}

/// Reads and checks the current generation without taking the writer lock.
fn verify(data_dir: &Path) -> Result<Verified, String> {
    let view = read_current_generation(&StdStorage, data_dir).map_err(|error| error.to_string())?;
    let mut ids = HashSet::new();
    for entry in &view.entries {
        if !entry.hash_is_valid() {
            return Err(format!("entry {} does not match its content hash", entry.id));
        }
        if !ids.insert(entry.id) {
            return Err(format!("entry id {} appears twice", entry.id));
        }
    }
    Ok(Verified {
        generation: view.generation,
        entries: view.entries.iter().map(fingerprint).collect(),
        torn_tail: view.torn_tail.is_some(),
    })
}

/// One recorded session, ready to send.
struct Session {
    name: String,
    wires: Vec<Value>,
    /// Index of the assistant message each call produced.
    ends: Vec<usize>,
}

impl Session {
    /// The body of call `call` in `mode`.
    fn body(&self, call: usize, mode: Mode, stream: bool) -> Value {
        let end = self.ends[call];
        let start = match mode {
            Mode::Transparent => 0,
            Mode::Stateful => self.previous_end(call).map_or(0, |previous| previous + 1),
        };
        json!({"model": "m", "messages": &self.wires[start..end], "stream": stream})
    }

    fn previous_end(&self, call: usize) -> Option<usize> {
        call.checked_sub(1).map(|previous| self.ends[previous])
    }

    /// Calls that send something: in Stateful mode a call right after another answer with no new
    /// message in between is skipped.
    fn calls(&self, mode: Mode) -> Vec<usize> {
        (0..self.ends.len())
            .filter(|&call| {
                mode == Mode::Transparent
                    || self.previous_end(call).map_or(self.ends[call] > 0, |p| p + 1 < self.ends[call])
            })
            .collect()
    }
}

/// Everything one run of the suite counted.
#[derive(Default)]
struct Tally {
    kills: u64,
    by_phase: BTreeMap<String, u64>,
    by_mode: BTreeMap<String, u64>,
    retries: u64,
    retries_ok_first_time: u64,
    retry_failures: Vec<String>,
    verified: u64,
    verify_failures: Vec<String>,
    torn_tails: u64,
    lost_or_duplicated: Vec<String>,
    acknowledged_checked: u64,
    /// Checks that passed only as compaction-consistent (the crash run compacted at other calls).
    compaction_shifted: u64,
    restarts: u64,
    restart_times: Vec<Duration>,
    restart_failures: Vec<String>,
    calls_served: u64,
    sessions: u64,
    reference_calls: u64,
}

impl Tally {
    fn count_kill(&mut self, phase: Phase, mode: Mode) {
        self.kills += 1;
        *self.by_phase.entry(format!("{phase:?}")).or_default() += 1;
        *self.by_mode.entry(format!("{mode:?}")).or_default() += 1;
    }

    fn failures(&self) -> usize {
        self.retry_failures.len()
            + self.verify_failures.len()
            + self.lost_or_duplicated.len()
            + self.restart_failures.len()
    }
}

/// What one attempt of a call came to.
enum Attempt {
    /// A complete answer.
    Answered,
    /// An answer that was not a success (status or stream error event).
    Failed(String),
    /// Killed mid-way, in this phase.
    Killed(Phase),
}

struct Runner {
    args: Args,
    rng: SimRng,
    fake: FakeUpstream,
    client: reqwest::Client,
    root: tempfile::TempDir,
    tally: Tally,
    /// Typical duration of a call, for spreading kill times over it.
    typical_call: Duration,
    typical_start: Duration,
}

fn is_prefix(prefix: &[Fingerprint], of: &[Fingerprint]) -> bool {
    prefix.len() <= of.len() && prefix == &of[..prefix.len()]
}

/// Whether `part` occurs contiguously in `whole`.
fn is_slice_of(part: &[Fingerprint], whole: &[Fingerprint]) -> bool {
    part.is_empty() || whole.windows(part.len()).any(|window| window == part)
}

/// Whether a journal that compacted at other calls than the reference (compaction timing follows
/// the gateway's token calibration, which a crash can leave a call behind) still holds every turn
/// once: the entries after its last summary are a contiguous run of the uncompacted conversation
/// (`full_next`, the reference without compaction) that reaches at least the end of `full_acked`,
/// and every entry kept before that summary is in the conversation.
fn compaction_consistent(
    entries: &[Fingerprint],
    full_acked: &[Fingerprint],
    full_next: &[Fingerprint],
) -> bool {
    let Some(last_summary) = entries.iter().rposition(|(kind, _, _)| *kind == EntryKind::Summary) else {
        return false;
    };
    let (head, tail) = (&entries[..last_summary], &entries[last_summary + 1..]);
    let head_known = head.iter().all(|entry| entry.0 == EntryKind::Summary || full_next.contains(entry));
    let tail_placed = tail.is_empty()
        || (0..=full_next.len().saturating_sub(tail.len()))
            .any(|at| full_next[at..at + tail.len()] == *tail && at + tail.len() >= full_acked.len());
    head_known && tail_placed
}

fn has_summary(entries: &[Fingerprint]) -> bool {
    entries.iter().any(|(kind, _, _)| *kind == EntryKind::Summary)
}

fn describe(actual: &[Fingerprint], expected: &[Fingerprint]) -> String {
    let first =
        actual.iter().zip(expected).position(|(a, e)| a != e).unwrap_or(actual.len().min(expected.len()));
    let show = |list: &[Fingerprint]| {
        list.iter()
            .skip(first)
            .take(3)
            .map(|(k, r, h)| format!("{k:?}/{r:?}/{}", &h[..8]))
            .collect::<Vec<_>>()
    };
    let mut text = format!(
        "{} entries vs {} expected; first difference at {first}: {:?} vs {:?}",
        actual.len(),
        expected.len(),
        show(actual),
        show(expected)
    );
    if std::env::var_os("STRATA_CRASH_SHOW_ENTRIES").is_some() {
        let all = |list: &[Fingerprint]| {
            list.iter().map(|(k, r, h)| format!("{k:?}/{r:?}/{}", &h[..8])).collect::<Vec<_>>().join(" ")
        };
        text.push_str(&format!("\n    found:    {}\n    expected: {}", all(actual), all(expected)));
    }
    text
}

impl Runner {
    fn binary() -> &'static Path {
        Path::new(env!("CARGO_BIN_EXE_strata-gateway"))
    }

    /// A fresh volume with its config: `(config path, data dir, log)`.
    fn volume(&self, label: &str, mode: Mode, window: u32) -> (PathBuf, PathBuf, PathBuf) {
        let dir = self.root.path().join(label);
        std::fs::create_dir_all(&dir).unwrap();
        let mut gateway_config = config(&self.fake, Provider::OpenAI, &dir);
        gateway_config.upstream.context_window = window;
        gateway_config.stable_prefix.system_prompt = String::new();
        gateway_config.session_mode = match mode {
            Mode::Transparent => SessionMode::Transparent,
            Mode::Stateful => SessionMode::Stateful,
        };
        let config_path = dir.join("gateway.json");
        write_config(&config_path, &gateway_config);
        (config_path, dir.join("data"), dir.join("gateway.log"))
    }

    fn delay(&mut self, within: Duration) -> Duration {
        Duration::from_micros(self.rng.below(u64::try_from(within.as_micros()).unwrap_or(u64::MAX).max(1)))
    }

    /// The fake's answer for `call`: the recorded message after a random delay, streams paced.
    fn script(&mut self, session: &Session, call: usize) {
        let delay = Duration::from_millis(self.rng.below(25));
        let pace = Duration::from_millis(1 + self.rng.below(6));
        self.fake.unscript();
        self.fake.forget_seen();
        let reply = reply_of(&session.wires[session.ends[call]]);
        self.fake.script([Reply::Delayed(delay, Box::new(Reply::Paced(pace, Box::new(reply))))]);
    }

    /// Starts the gateway, killing it during startup now and then (each such kill is counted and
    /// verified); `Err` when it cannot start.
    async fn start(
        &mut self,
        volume: &(PathBuf, PathBuf, PathBuf),
        mode: Mode,
    ) -> Result<GatewayProcess, String> {
        let (config_path, data_dir, log) = volume;
        // Starting never changes the journal's entries (a torn final record is cut, not counted).
        let expected = match verify(data_dir) {
            Ok(found) => found.entries,
            Err(_) => Vec::new(),
        };
        let mut port_races = 0;
        loop {
            let mut gateway = GatewayProcess::spawn(Self::binary(), config_path, data_dir, Some(log));
            self.tally.restarts += 1;
            if self.rng.below(100) < self.args.startup_kill_percent {
                let within = self.typical_start;
                tokio::time::sleep(self.delay(within)).await;
                let ready = matches!(gateway.child.try_wait(), Ok(None))
                    && reqwest::get(format!("http://{}/readyz", gateway.address))
                        .await
                        .is_ok_and(|r| r.status().is_success());
                // Already up: the start was faster than the drawn delay, no kill this time.
                if !ready {
                    gateway.kill();
                    self.tally.count_kill(Phase::Startup, mode);
                    self.check_after_kill(data_dir, &expected, &expected, false, None, "startup kill");
                    continue;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            if let Some(status) = gateway.child.try_wait().ok().flatten() {
                let text = std::fs::read_to_string(log).unwrap_or_default();
                let last = text.lines().last().unwrap_or_default().to_owned();
                // Ports are picked free (below the ephemeral range, so no outgoing connection takes
                // them) a moment before the gateway binds them; another test process may still take
                // one in between. That is the harness's race, not a gateway failure.
                if last.contains("in use") && port_races < 5 {
                    port_races += 1;
                    continue;
                }
                return Err(format!("the gateway exited at start with {status}: {last}"));
            }
            let ready = gateway.wait_ready(&self.client, Duration::from_secs(60)).await?;
            self.tally.restart_times.push(ready);
            self.typical_start = (self.typical_start * 7 + ready * 2) / 8;
            return Ok(gateway);
        }
    }

    /// Verifies the volume after a kill; the journal must lie between `acked` and `next` (the
    /// reference after the last acknowledged call and after the interrupted one).
    fn check_after_kill(
        &mut self,
        data_dir: &Path,
        acked: &[Fingerprint],
        next: &[Fingerprint],
        next_compacts: bool,
        full: Option<(&[Fingerprint], &[Fingerprint])>,
        what: &str,
    ) {
        if !data_dir.join("CURRENT").exists() {
            // Killed before the journal was created: nothing can be lost yet.
            if acked.is_empty() {
                self.tally.verified += 1;
            } else {
                self.tally.verify_failures.push(format!("{what}: the journal is gone"));
            }
            return;
        }
        match verify(data_dir) {
            Err(error) => self.tally.verify_failures.push(format!("{what}: {error}")),
            Ok(found) => {
                self.tally.verified += 1;
                self.tally.torn_tails += u64::from(found.torn_tail);
                let entries = &found.entries;
                // The cut turn's entries, in order and at most once each, after the acknowledged
                // state; or, when the call compacts, a prefix of the compacted journal.
                let between = entries == acked
                    || (is_prefix(acked, entries) && is_slice_of(&entries[acked.len()..], next))
                    || (next_compacts && is_prefix(entries, next) && !entries.is_empty());
                let shifted = !between
                    && full.is_some_and(|(full_acked, full_next)| {
                        (has_summary(entries) || has_summary(next))
                            && (compaction_consistent(entries, full_acked, full_next)
                                || (!has_summary(entries)
                                    && is_prefix(full_acked, entries)
                                    && is_prefix(entries, full_next)))
                    });
                self.tally.compaction_shifted += u64::from(shifted);
                if !between && !shifted {
                    self.tally.lost_or_duplicated.push(format!(
                        "{what} (generation {}): against the acknowledged state {}; against the next {}",
                        found.generation,
                        describe(entries, acked),
                        describe(entries, next)
                    ));
                }
            }
        }
    }

    /// One attempt of `call`, with a kill at `kill_after` if given.
    async fn attempt(
        &mut self,
        gateway: &mut GatewayProcess,
        (body, call): (&Value, usize),
        mode: Mode,
        kill_after: Option<Duration>,
        compacting: bool,
    ) -> Attempt {
        let url = format!("http://{}/v1/chat/completions", gateway.address);
        let stage = Arc::new(AtomicU8::new(SENDING));
        let client = self.client.clone();
        let work_stage = Arc::clone(&stage);
        let mut request = client.post(url).json(body);
        if mode == Mode::Stateful {
            // One key per call, the same on every retry of it: the gateway journals the turn once.
            request = request
                .header("x-strata-session", "crash-suite")
                .header("idempotency-key", format!("call-{call}"));
        }
        let idle = Duration::from_millis(self.rng.below(10));
        let streamed = body["stream"] == json!(true);
        let work = async move {
            let response = request.send().await.map_err(|e| format!("send: {e}"))?;
            work_stage.store(READING, Ordering::SeqCst);
            let status = response.status();
            let text = response.text().await.map_err(|e| format!("read: {e}"))?;
            if !status.is_success() {
                return Err(format!("{status}: {}", text.chars().take(400).collect::<String>()));
            }
            if streamed && (!text.contains("data: [DONE]") || text.contains("\"error\"")) {
                return Err(format!(
                    "the stream did not finish cleanly: {}",
                    text.chars().rev().take(400).collect::<String>().chars().rev().collect::<String>()
                ));
            }
            work_stage.store(IDLE, Ordering::SeqCst);
            tokio::time::sleep(idle).await;
            Ok::<(), String>(())
        };
        let started = Instant::now();
        let seen_before = self.fake.seen().len();
        let outcome = match kill_after {
            None => Some(work.await),
            Some(after) => tokio::select! {
                result = work => Some(result),
                () = tokio::time::sleep(after) => None,
            },
        };
        match outcome {
            Some(Ok(())) => {
                self.typical_call = (self.typical_call * 7 + started.elapsed()) / 8;
                Attempt::Answered
            }
            Some(Err(error)) => Attempt::Failed(error),
            None => {
                let phase = match stage.load(Ordering::SeqCst) {
                    SENDING if self.fake.seen().len() > seen_before => Phase::AwaitingUpstream,
                    SENDING if compacting => Phase::BeforeUpstreamCompacting,
                    SENDING => Phase::BeforeUpstream,
                    READING => Phase::MidAnswer,
                    _ => Phase::AfterAnswer,
                };
                gateway.kill();
                Attempt::Killed(phase)
            }
        }
    }

    /// Runs `session` without kills and fingerprints the journal after each call.
    async fn reference(
        &mut self,
        session: &Session,
        label: &str,
        mode: Mode,
        window: u32,
    ) -> Result<Vec<(Vec<Fingerprint>, u64)>, String> {
        let volume = self.volume(&format!("{label}-reference"), mode, window);
        let mut gateway = GatewayProcess::spawn(Self::binary(), &volume.0, &volume.1, Some(&volume.2));
        gateway.wait_ready(&self.client, Duration::from_secs(60)).await?;
        let mut states = Vec::new();
        for (index, call) in session.calls(mode).into_iter().enumerate() {
            self.script(session, call);
            let body = session.body(call, mode, index % 2 == 1);
            match self.attempt(&mut gateway, (&body, call), mode, None, false).await {
                Attempt::Answered => {}
                Attempt::Failed(error) => return Err(format!("reference call {call}: {error}")),
                Attempt::Killed(_) => unreachable!("the reference is never killed"),
            }
            let found = verify(&volume.1).map_err(|error| format!("reference call {call}: {error}"))?;
            states.push((found.entries, found.generation));
            self.tally.reference_calls += 1;
        }
        gateway.kill();
        Ok(states)
    }

    /// Runs `session` with kills until it is done or the kill budget is spent.
    async fn crash_run(
        &mut self,
        session: &Session,
        label: &str,
        mode: Mode,
        window: u32,
    ) -> Result<(), String> {
        let reference = self.reference(session, label, mode, window).await?;
        // The conversation without compaction, for runs that compact at other calls than the
        // reference.
        let full = if reference.iter().any(|(entries, _)| has_summary(entries)) {
            Some(self.reference(session, &format!("{label}-full"), mode, FULL_WINDOW).await?)
        } else {
            None
        };
        let volume = self.volume(label, mode, window);
        let data_dir = volume.1.clone();
        let empty = Vec::new();
        let mut gateway = self.start(&volume, mode).await?;
        let calls = session.calls(mode);
        for (index, &call) in calls.iter().enumerate() {
            let acked: &[Fingerprint] = if index == 0 { &empty } else { &reference[index - 1].0 };
            let (next, next_generation) = (&reference[index].0, reference[index].1);
            let compacts = index > 0 && reference[index - 1].1 != next_generation;
            let full_states = full.as_ref().map(|full| {
                let acked: &[Fingerprint] = if index == 0 { &empty } else { &full[index - 1].0 };
                (acked, full[index].0.as_slice())
            });
            let body = session.body(call, mode, index % 2 == 1);
            let mut after_kill = false;
            let mut failures = 0;
            loop {
                if self.tally.kills >= self.args.kills && !after_kill {
                    gateway.kill();
                    return Ok(());
                }
                self.script(session, call);
                let kill_after = (self.rng.below(100) < self.args.kill_percent).then(|| {
                    let within = self.typical_call + Duration::from_millis(10);
                    self.delay(within)
                });
                match self.attempt(&mut gateway, (&body, call), mode, kill_after, compacts).await {
                    Attempt::Answered => {
                        self.tally.calls_served += 1;
                        if after_kill {
                            self.tally.retries += 1;
                            self.tally.retries_ok_first_time += u64::from(failures == 0);
                        }
                        let full_next = full_states.map(|(_, next)| (next, next));
                        self.check_acknowledged(&data_dir, next, full_next, &format!("{label} call {call}"));
                        break;
                    }
                    Attempt::Failed(error) => {
                        if after_kill {
                            self.tally.retries += 1;
                        }
                        self.tally
                            .retry_failures
                            .push(format!("{label} call {call} (after a kill: {after_kill}): {error}"));
                        failures += 1;
                        if failures >= 3 {
                            gateway.kill();
                            return Err(format!("{label} call {call} failed 3 times in a row"));
                        }
                    }
                    Attempt::Killed(phase) => {
                        if after_kill {
                            self.tally.retries += 1;
                        }
                        self.tally.count_kill(phase, mode);
                        let what = format!("{label} call {call} killed {phase:?}");
                        if phase == Phase::AfterAnswer {
                            // The client has the answer: the journal must hold all of it.
                            self.tally.calls_served += 1;
                            let full_next = full_states.map(|(_, next)| (next, next));
                            self.check_after_kill(&data_dir, next, next, false, full_next, &what);
                            gateway = self.start(&volume, mode).await?;
                            break;
                        }
                        self.check_after_kill(&data_dir, acked, next, compacts, full_states, &what);
                        gateway = self.start(&volume, mode).await.map_err(|error| {
                            self.tally.restart_failures.push(format!("{what}: {error}"));
                            error
                        })?;
                        after_kill = true;
                    }
                }
            }
        }
        gateway.kill();
        self.tally.sessions += 1;
        Ok(())
    }

    /// After a complete answer the journal equals the reference for that call.
    fn check_acknowledged(
        &mut self,
        data_dir: &Path,
        expected: &[Fingerprint],
        full: Option<(&[Fingerprint], &[Fingerprint])>,
        what: &str,
    ) {
        self.tally.acknowledged_checked += 1;
        match verify(data_dir) {
            Err(error) => self.tally.verify_failures.push(format!("{what} after its answer: {error}")),
            Ok(found)
                if found.entries != expected
                    && (has_summary(&found.entries) || has_summary(expected))
                    && full.is_some_and(|(acked, next)| {
                        compaction_consistent(&found.entries, acked, next)
                            || (!has_summary(&found.entries) && found.entries == next)
                    }) =>
            {
                self.tally.compaction_shifted += 1;
            }
            Ok(found) if found.entries != expected => {
                let kind = if found.entries.len() > expected.len() {
                    "duplicated"
                } else if found.entries.len() < expected.len() {
                    "lost"
                } else {
                    "different"
                };
                self.tally.lost_or_duplicated.push(format!(
                    "{what}: after its answer the journal has {kind} entries: {}",
                    describe(&found.entries, expected)
                ));
            }
            Ok(_) => {}
        }
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn print_list(title: &str, list: &[String]) {
    if list.is_empty() {
        return;
    }
    println!("{title}: {} (the first 5, then the first of each further run)", list.len());
    let mut runs_shown = HashSet::new();
    for (index, item) in list.iter().enumerate() {
        let run = item.split(' ').next().unwrap_or_default();
        if runs_shown.insert(run) || index < 5 {
            println!("  {item}");
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let Some(shared) = shared() else { return };
    let mut paths = seed_003(&shared);
    paths.extend(files(&shared.join("corpus/long-sessions/sessions"), ".json"));
    let sessions: Vec<Session> = paths
        .iter()
        .map(|path| {
            let transcript = load(path);
            Session {
                name: transcript.name.clone(),
                wires: transcript.messages.iter().map(|m| m.wire.clone()).collect(),
                ends: transcript.calls.iter().map(|&(end, _)| end).collect(),
            }
        })
        .collect();
    let names: Vec<String> = sessions.iter().map(|session| session.name.clone()).collect();
    let sessions: Vec<Session> = sessions
        .into_iter()
        .filter(|session| args.sessions.is_empty() || args.sessions.contains(&session.name))
        .collect();
    if sessions.is_empty() {
        eprintln!("no session is named {:?}; the sessions are: {}", args.sessions, names.join(", "));
        std::process::exit(2);
    }
    let root = match &args.dir {
        Some(dir) => tempfile::tempdir_in(dir).unwrap(),
        None => tempfile::tempdir().unwrap(),
    };
    println!(
        "crash suite: {} kills, seed {}, modes {:?}, windows {:?}, {}% of calls killed, {}% of restarts killed; volumes in {}",
        args.kills,
        args.seed,
        args.modes,
        args.windows,
        args.kill_percent,
        args.startup_kill_percent,
        root.path().display()
    );
    let mut runner = Runner {
        rng: SimRng::new(args.seed),
        fake: FakeUpstream::start().await,
        client: reqwest::Client::new(),
        root,
        tally: Tally::default(),
        typical_call: Duration::from_millis(40),
        typical_start: Duration::from_millis(200),
        args,
    };
    let started = Instant::now();
    let mut aborted = Vec::new();
    let mut run = 0usize;
    while runner.tally.kills < runner.args.kills {
        let session = &sessions[run % sessions.len()];
        let mode = runner.args.modes[run % runner.args.modes.len()];
        let window = runner.args.windows[(run / runner.args.modes.len()) % runner.args.windows.len()];
        let label = format!("run{run:03}-{mode:?}-{window}");
        let kills_before = runner.tally.kills;
        if let Err(error) = runner.crash_run(session, &label, mode, window).await {
            aborted.push(format!("{label} {}: {error}", session.name));
        }
        println!(
            "{label} {}: {} kills ({} in total), {} failures so far, {:.0} s",
            session.name,
            runner.tally.kills - kills_before,
            runner.tally.kills,
            runner.tally.failures(),
            started.elapsed().as_secs_f64()
        );
        run += 1;
    }
    let tally = &mut runner.tally;
    tally.restart_times.sort();
    println!("\nsummary ({:.0} s):", started.elapsed().as_secs_f64());
    println!("  kills: {} ({:?} by mode)", tally.kills, tally.by_mode);
    for (phase, count) in &tally.by_phase {
        println!("    {phase}: {count}");
    }
    println!(
        "  journal verified after {} kills; torn final records (repaired at open): {}; verify failures: {}",
        tally.verified,
        tally.torn_tails,
        tally.verify_failures.len()
    );
    println!(
        "  retries of interrupted calls: {} ({} succeeded at the first uninterrupted try); failed answers: {}",
        tally.retries,
        tally.retries_ok_first_time,
        tally.retry_failures.len()
    );
    println!(
        "  acknowledged calls checked against the reference: {}; lost or duplicated: {}; states that matched only as compaction-consistent (compacted at another call than the reference): {}",
        tally.acknowledged_checked,
        tally.lost_or_duplicated.len(),
        tally.compaction_shifted
    );
    println!(
        "  calls served {}, reference calls {}, sessions completed {}, restarts {} (ready p50 {:?}, max {:?}), restart failures {}",
        tally.calls_served,
        tally.reference_calls,
        tally.sessions,
        tally.restarts,
        percentile(&tally.restart_times, 0.5),
        tally.restart_times.last().copied().unwrap_or_default(),
        tally.restart_failures.len()
    );
    print_list("verify failures", &tally.verify_failures);
    print_list("lost or duplicated", &tally.lost_or_duplicated);
    print_list("failed answers", &tally.retry_failures);
    print_list("restart failures", &tally.restart_failures);
    print_list("aborted runs", &aborted);
    if tally.failures() > 0 || !aborted.is_empty() {
        std::process::exit(1);
    }
}

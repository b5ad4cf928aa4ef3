//! Replays one session under every policy: rebuild each call's prompt, price it, and measure.
//!
//! The strata policy drives the session engine (the gateway's engine) call by call, on an
//! in-memory volume, as a client that resends its whole history each call: every call's new
//! messages go in through [`SessionEngine::begin_turn`], the upstream body it compiles is priced,
//! and the recorded assistant message goes back in through [`SessionEngine::record_answer`]. What
//! it prices is, by construction, what the gateway forwards.
//!
//! The anchor policies rebuild their prompt from the messages as published (see [`super::policies`]).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use regex::Regex;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::artifacts::ArtifactRef;
use crate::budget::{BudgetPolicy, OperationId};
use crate::entry::Role;
use crate::session::openai_messages::{parse_message, parse_messages};
use crate::session::tool_block::Tools;
use crate::session::tool_schema::is_memory_tool;
use crate::session::{
    Api, AssistantOutput, ChatRequest, ContextEvent, SessionEngine, SessionSettings, TurnOutcome,
    TurnRequest, UpstreamCall,
};
use crate::tokens::{MESSAGE_OVERHEAD_TOKENS, TokenCounter};

use super::policies::{MessageIndex, PolicyKind, PolicySettings, Variant, anchor_variant, variant_text};
use super::pricing::{Block, CallCost, Provider, ProviderCache, block_hash};
use super::readback::{READ_BACK_OUTPUT_TOKENS, ReadBackSummary, ReadBackTracker, ReadBackUse, Removal};
use super::transcript::{Transcript, TranscriptMessage};

/// What a cached prompt token costs on every later call, for both providers (fresh = 1).
const CARRIED_READ_PRICE: f64 = 0.1;

/// Most choices the oracle re-prices one by one in a session (each is a whole pass).
const ORACLE_MAX_FLIPS: usize = 128;

/// Uses of removed content kept per policy report as examples.
const MAX_READ_BACK_EXAMPLES: usize = 3;

/// Follows what the engine moved off-window (spilled or elided, each behind a `data_ref`).
fn track_offloaded(tracker: &mut ReadBackTracker, offloaded: &[(ArtifactRef, String)], before_call: usize) {
    for (data_ref, text) in offloaded {
        tracker.removed(Removal::new(data_ref.to_string(), before_call, text.clone(), true));
    }
}

/// What the model wrote in an assistant message: its text and its tool calls' arguments.
fn output_text(message: &TranscriptMessage) -> String {
    let mut text = message.text.clone();
    if let Some(calls) = message.wire.get("tool_calls").and_then(Value::as_array) {
        for call in calls {
            if let Some(arguments) = call.pointer("/function/arguments").and_then(Value::as_str) {
                text.push('\n');
                text.push_str(arguments);
            }
        }
    }
    text
}

/// Seconds between calls when the input has no timestamps.
const DEFAULT_CALL_SPACING_MS: u64 = 30_000;

/// Everything a replay needs besides the transcript.
#[derive(Clone, Debug)]
pub struct ReplayOptions {
    /// Whose cache rules price the calls (and, for the strata policy, whose API the engine
    /// renders).
    pub provider: Provider,
    /// Anchor-policy knobs.
    pub anchors: PolicySettings,
    /// The session engine's settings: the context window is `strata.limit`, the reservations
    /// `strata.budget`.
    pub strata: SessionSettings,
    /// The leading fields of every upstream body the engine renders (model, cache hints), as the
    /// gateway adds them.
    pub head: Map<String, Value>,
    /// Policies to run.
    pub policies: Vec<PolicyKind>,
    /// The tool schemas the client sends with every call (recorded sessions rarely keep them;
    /// see [`super::tool_set`]; none by default).
    pub tools: Vec<Value>,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            provider: Provider::Anthropic,
            anchors: PolicySettings::default(),
            strata: SessionSettings::defaults(Api::Anthropic, 200_000),
            head: Map::new(),
            policies: PolicyKind::ALL.to_vec(),
            tools: Vec::new(),
        }
    }
}

impl ReplayOptions {
    /// The model's context window.
    pub fn context_window(&self) -> u64 {
        self.strata.limit
    }
}

/// One priced call.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CallRecord {
    /// Call number, from 0.
    pub call: usize,
    /// What it cost.
    pub cost: CallCost,
    /// Whether the prompt plus reservations exceeded the window.
    pub over_budget: bool,
    /// Whether a compaction ran before this call.
    pub compacted: bool,
    /// What the engine did to the context at this call (strata only), as the Inspector marks it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<ContextEvent>,
}

/// What a policy kept readable.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Preservation {
    /// Outputs moved off-window (spilled or elided).
    pub stored_outputs: u64,
    /// Of which read back byte-exact from the artifact store.
    pub readable_byte_exact: u64,
    /// Decision, constraint and TODO lines in the source.
    pub markers: u64,
    /// Of which still in the final context or reopenable from an artifact.
    pub markers_surviving: u64,
}

/// One policy over one session.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyReport {
    /// The policy.
    pub policy: PolicyKind,
    /// Every call.
    pub calls: Vec<CallRecord>,
    /// Largest prompt.
    pub peak_context: u64,
    /// Calls whose prompt did not fit the budget.
    pub calls_over_budget: u64,
    /// Calls the budget blocked (strata: the engine refused the turn; nothing was sent).
    pub blocked_calls: u64,
    /// Compactions run.
    pub compactions: u64,
    /// Outputs spilled.
    pub spills: u64,
    /// Outputs elided.
    pub elisions: u64,
    /// Entries expired.
    pub expirations: u64,
    /// Duplicate outputs replaced by references.
    pub deduplications: u64,
    /// Lazy tool schemas (strata only).
    pub schemas: SchemaLoading,
    /// Preservation (strata only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preservation: Option<Preservation>,
    /// Later uses of content this policy removed, and what reading it back would have cost.
    pub read_backs: ReadBackSummary,
    /// The first few uses detected, with their evidence.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub read_back_examples: Vec<ReadBackUse>,
    /// The engine's state after the last call (strata only), in the shape of the gateway's
    /// `status`, `entries` and `inspect` endpoints, for `strata replay --html`.
    #[serde(skip)]
    pub final_view: Option<Value>,
}

impl PolicyReport {
    fn new(policy: PolicyKind) -> Self {
        PolicyReport {
            policy,
            calls: Vec::new(),
            peak_context: 0,
            calls_over_budget: 0,
            blocked_calls: 0,
            compactions: 0,
            spills: 0,
            elisions: 0,
            expirations: 0,
            deduplications: 0,
            schemas: SchemaLoading::default(),
            preservation: None,
            read_backs: ReadBackSummary::default(),
            read_back_examples: Vec::new(),
            final_view: None,
        }
    }

    /// Sum of the calls' bills plus the read-backs charged.
    pub fn units_with_read_backs(&self) -> f64 {
        self.totals().units + self.read_backs.cost_units
    }

    /// Charges the uses detected at one call: each recoverable use one read-back round trip (the
    /// call's prompt again, priced against the cache it just warmed, a short answer, and the slice
    /// read back as fresh input) plus what the read-back leaves in context (the answer and the
    /// slice, read from the cache at 0.1x on each of the `later_calls` calls of the session), each
    /// unrecoverable one nothing but the count. Returns each use's removal with what it was charged.
    fn charge_read_backs(
        &mut self,
        uses: Vec<ReadBackUse>,
        cache: &mut ProviderCache,
        blocks: &[Block],
        (now_ms, later_calls): (u64, usize),
        provider: Provider,
    ) -> Vec<(String, f64)> {
        let mut charged = Vec::with_capacity(uses.len());
        for found in uses {
            self.read_backs.uses_detected += 1;
            let mut units = 0.0;
            if found.recoverable {
                let repeat = cache.price(blocks, now_ms);
                let carried = (READ_BACK_OUTPUT_TOKENS + found.slice_tokens) as f64;
                units = repeat.units
                    + READ_BACK_OUTPUT_TOKENS as f64 * provider.output_price_ratio()
                    + found.slice_tokens as f64
                    + CARRIED_READ_PRICE * carried * later_calls as f64;
                self.read_backs.read_backs += 1;
                self.read_backs.cost_units += units;
            } else {
                self.read_backs.unrecoverable += 1;
            }
            charged.push((found.removal_id.clone(), units));
            if self.read_back_examples.len() < MAX_READ_BACK_EXAMPLES {
                self.read_back_examples.push(found);
            }
        }
        charged
    }

    /// Sum of the calls' bills.
    pub fn totals(&self) -> CallCost {
        self.calls.iter().fold(CallCost::default(), |sum, c| sum + c.cost)
    }

    fn record(&mut self, cost: CallCost, reserved: u64, window: u64, events: Vec<ContextEvent>) {
        let over_budget = cost.total + reserved > window;
        self.peak_context = self.peak_context.max(cost.total);
        self.calls_over_budget += u64::from(over_budget);
        let compacted = events.contains(&ContextEvent::Compaction);
        self.calls.push(CallRecord { call: self.calls.len(), cost, over_budget, compacted, events });
    }
}

/// What lazy tool schemas did over a session (strata only).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SchemaLoading {
    /// Calls whose tools were summarised.
    pub lazy_calls: u64,
    /// Tool-schema tokens sent, over every call.
    pub sent_tool_tokens: u64,
    /// Tool-schema tokens the full schemas would have taken, over every call.
    pub full_tool_tokens: u64,
    /// Schemas loaded on demand (a call of a summarised tool, or `strata_load_tools`).
    pub loaded_on_demand: u64,
    /// Calls repeated because the model called a tool it saw only summarised (each priced as a
    /// second upstream call).
    pub retries: u64,
}

/// How the input's own usage compares with our token count (naive prompts).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenCalibration {
    /// Calls with recorded usage.
    pub calls: u64,
    /// Prompt tokens the provider reported.
    pub recorded_prompt_tokens: u64,
    /// Prompt tokens we counted for the same calls.
    pub counted_prompt_tokens: u64,
    /// Cached tokens the provider reported.
    pub recorded_cached_tokens: u64,
}

/// One session under every policy.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionReport {
    /// The input.
    pub name: String,
    /// Model calls.
    pub calls: usize,
    /// Our count against the provider's.
    pub calibration: TokenCalibration,
    /// Per policy.
    pub policies: Vec<PolicyReport>,
}

/// A replay that cannot run.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The engine refused something (journal, artifacts, compaction) or a message is not one a
    /// client could send.
    #[error("{session}: the strata engine failed at call {call}: {message}")]
    Engine {
        /// Session name.
        session: String,
        /// Call number.
        call: usize,
        /// What failed.
        message: String,
    },
}

/// Replay `transcript` under `options.policies`.
pub fn replay_session(
    transcript: &Transcript,
    options: &ReplayOptions,
    counter: &TokenCounter,
) -> Result<SessionReport, ReplayError> {
    let mut tokens = TokenMemo::new(counter);
    let times = call_times(transcript);
    let mut policies = Vec::with_capacity(options.policies.len());
    let mut calibration = TokenCalibration::default();
    for &kind in &options.policies {
        let report = if kind == PolicyKind::Strata {
            replay_strata(transcript, options, &times, |_, _| {})?
        } else {
            let run = AnchorRun { kind, transcript, options, times: &times };
            replay_anchor(run, &mut tokens, &mut calibration)
        };
        policies.push(report);
    }
    Ok(SessionReport { name: transcript.name.clone(), calls: transcript.calls.len(), calibration, policies })
}

pub(crate) fn call_times(transcript: &Transcript) -> Vec<u64> {
    let mut last = 0;
    transcript
        .calls
        .iter()
        .map(|&(index, _)| {
            let at = transcript.messages[index]
                .at_ms
                .filter(|&t| t >= last)
                .unwrap_or(last + DEFAULT_CALL_SPACING_MS);
            last = at;
            at
        })
        .collect()
}

/// Token counts of message texts, counted once.
struct TokenMemo<'a> {
    counter: &'a TokenCounter,
    counts: HashMap<u64, u64>,
}

impl<'a> TokenMemo<'a> {
    fn new(counter: &'a TokenCounter) -> Self {
        TokenMemo { counter, counts: HashMap::new() }
    }

    fn block(&mut self, text: &str, breakpoint: bool) -> Block {
        let hash = block_hash(text);
        let tokens = *self
            .counts
            .entry(hash)
            .or_insert_with(|| u64::from(self.counter.count(text)) + u64::from(MESSAGE_OVERHEAD_TOKENS));
        Block { hash, tokens, breakpoint }
    }
}

fn reserved(budget: &BudgetPolicy) -> u64 {
    budget.reserved_completion_tokens + budget.protocol_overhead_tokens + budget.safety_margin_tokens
}

/// What every pass of an anchor policy replays: the policy, the session, the options and the calls'
/// times.
#[derive(Clone, Copy)]
struct AnchorRun<'a> {
    kind: PolicyKind,
    transcript: &'a Transcript,
    options: &'a ReplayOptions,
    times: &'a [u64],
}

fn replay_anchor(
    run: AnchorRun<'_>,
    tokens: &mut TokenMemo<'_>,
    calibration: &mut TokenCalibration,
) -> PolicyReport {
    let AnchorRun { kind, transcript, options, .. } = run;
    let unmarked = vec![false; transcript.messages.len()];
    let (report, used) = replay_anchor_pass(run, tokens, calibration, unmarked);
    if kind != PolicyKind::Oracle {
        return report;
    }
    // The oracle's second pass keeps whole each used output that costs less kept than read back:
    // kept, its tokens beyond the preview are written once and read from the cache on every later
    // call; spilled, the first pass charged its read-back. Keeping only adds content to the prompts,
    // so no use can appear that the first pass did not see.
    let write_price = match options.provider {
        Provider::Anthropic => 1.25,
        Provider::OpenAi => 1.0,
    };
    let mut keep = vec![false; transcript.messages.len()];
    for &(index, read_back_units) in &used {
        let message = &transcript.messages[index];
        let removed_tokens =
            message.text.chars().count().saturating_sub(options.anchors.oracle_spill.preview_chars) as f64
                / 4.0;
        let calls_with_it = transcript.calls.iter().filter(|&&(end, _)| end > index).count();
        let kept_units =
            removed_tokens * (write_price + CARRIED_READ_PRICE * calls_with_it.saturating_sub(1) as f64);
        keep[index] = kept_units < read_back_units;
    }
    let (mut best, _) = replay_anchor_pass(run, tokens, calibration, keep.clone());
    // The estimate prices each output alone. One sweep of single flips, each priced by a whole
    // pass, corrects it where cache effects (the 1024-token minimum, one removal moving another's
    // hits) make the other choice cheaper. A session with very many uses tries only the outputs
    // whose read-backs cost most.
    let mut by_cost = used.clone();
    by_cost.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut candidates: Vec<usize> = Vec::new();
    for (index, _) in by_cost {
        if !candidates.contains(&index) && candidates.len() < ORACLE_MAX_FLIPS {
            candidates.push(index);
        }
    }
    for index in candidates {
        keep[index] = !keep[index];
        let (trial, _) = replay_anchor_pass(run, tokens, calibration, keep.clone());
        if trial.units_with_read_backs() < best.units_with_read_backs() {
            best = trial;
        } else {
            keep[index] = !keep[index];
        }
    }
    best
}

/// One pass of an anchor policy over the session, with `marked` as the policy's per-message state
/// to start from (see [`anchor_variant`]). Returns the report and, for each removal a later call
/// used, its message and what its read-back was charged.
fn replay_anchor_pass(
    run: AnchorRun<'_>,
    tokens: &mut TokenMemo<'_>,
    calibration: &mut TokenCalibration,
    mut marked: Vec<bool>,
) -> (PolicyReport, Vec<(usize, f64)>) {
    let AnchorRun { kind, transcript, options, times } = run;
    let settings = &options.anchors;
    let messages = &transcript.messages;
    let index_of = MessageIndex::new(messages);
    let mut report = PolicyReport::new(kind);
    let mut cache = ProviderCache::new(options.provider);
    let mut removal_message: HashMap<String, usize> = HashMap::new();
    let mut used = Vec::new();
    // (message, variant) → (hash, tokens): each variant's text is built and counted once.
    let mut variants: HashMap<(usize, Variant), (u64, u64)> = HashMap::new();
    let mut spilled = HashSet::new();
    let mut elided = HashSet::new();
    let mut deduplicated = HashSet::new();
    let mut tracker = ReadBackTracker::new();
    let mut removed = vec![false; messages.len()];
    for (call, &(end, usage)) in transcript.calls.iter().enumerate() {
        let mut newly_removed: Vec<(usize, bool)> = Vec::new();
        let mut build = |marked: &[bool]| -> Vec<Block> {
            (0..end)
                .map(|i| {
                    let variant = anchor_variant(kind, settings, messages, &index_of, i, end, marked);
                    // A repeat's content is still in the prompt (or removed with its first
                    // occurrence), so it is no removal of its own.
                    let removes = !matches!(variant, Variant::Full | Variant::OracleDuplicate(_));
                    if removes && !removed[i] {
                        removed[i] = true;
                        // seed-002 and the oracle keep the full output behind a data_ref; masking
                        // and clearing keep nothing.
                        let recoverable = matches!(variant, Variant::Seed002 { .. } | Variant::OracleSpilled);
                        newly_removed.push((i, recoverable));
                    }
                    match variant {
                        Variant::Seed002 { spilled: s, elided: e } => {
                            if s {
                                spilled.insert(i);
                            }
                            if e {
                                elided.insert(i);
                            }
                        }
                        Variant::OracleSpilled => {
                            spilled.insert(i);
                        }
                        Variant::OracleDuplicate(_) => {
                            deduplicated.insert(i);
                        }
                        Variant::Full | Variant::Masked | Variant::Cleared => {}
                    }
                    let (hash, count) = *variants.entry((i, variant)).or_insert_with(|| {
                        let block = tokens.block(&variant_text(settings, &messages[i], variant), false);
                        (block.hash, block.tokens)
                    });
                    let breakpoint = i + 1 == end || (i == 0 && messages[0].role == Role::System);
                    Block { hash, tokens: count, breakpoint }
                })
                .collect()
        };
        let mut blocks = build(&marked);
        let total: u64 = blocks.iter().map(|b| b.tokens).sum();
        if kind == PolicyKind::ClearToolUses && total > settings.clear_trigger_tokens {
            let results: Vec<usize> = (0..end).filter(|&i| messages[i].is_tool_result()).collect();
            for &i in results.iter().rev().skip(settings.clear_keep) {
                marked[i] = true;
            }
            blocks = build(&marked);
        }
        let cost = cache.price(&blocks, times[call]);
        for (i, recoverable) in newly_removed {
            let id = format!("message {i}");
            removal_message.insert(id.clone(), i);
            tracker.removed(Removal::new(id, call, messages[i].text.clone(), recoverable));
        }
        if tracker.pending() > 0 && end < messages.len() {
            let mut prompt: Option<String> = None;
            let uses = tracker.observe_output(call, &output_text(&messages[end]), &mut |anchor| {
                prompt
                    .get_or_insert_with(|| {
                        (0..end)
                            .map(|i| {
                                let variant =
                                    anchor_variant(kind, settings, messages, &index_of, i, end, &marked);
                                variant_text(settings, &messages[i], variant)
                            })
                            .collect::<Vec<_>>()
                            .join("\n")
                    })
                    .contains(anchor)
            });
            let later_calls = transcript.calls.len() - call - 1;
            let charged = report.charge_read_backs(
                uses,
                &mut cache,
                &blocks,
                (times[call], later_calls),
                options.provider,
            );
            used.extend(
                charged.into_iter().filter_map(|(id, units)| Some((*removal_message.get(&id)?, units))),
            );
        }
        if kind == PolicyKind::Naive
            && let Some(usage) = usage
        {
            calibration.calls += 1;
            calibration.recorded_prompt_tokens += usage.prompt_tokens;
            calibration.recorded_cached_tokens += usage.cached_tokens;
            calibration.counted_prompt_tokens += cost.total;
        }
        report.record(cost, reserved(&options.strata.budget), options.context_window(), Vec::new());
    }
    report.spills = spilled.len() as u64;
    report.elisions = elided.len() as u64;
    report.deduplications = deduplicated.len() as u64;
    if kind == PolicyKind::ClearToolUses {
        report.expirations = marked.iter().filter(|c| **c).count() as u64;
    }
    (report, used)
}

/// Lines that carry decisions, constraints and to-dos.
fn marker_pattern() -> Option<Regex> {
    Regex::new(r"(?i)\b(decided|decision|constraint|must not|TODO|FIXME)\b").ok()
}

/// The request a client sends for the call whose prompt is `messages` (its whole history).
/// Every call shares one `tools` value, as the gateway's requests do when a client resends the
/// same block, so the engine compares a pointer instead of the whole block.
fn client_request(messages: &[Value], tools: &Tools) -> Result<ChatRequest, String> {
    let parsed = parse_messages(messages)?;
    Ok(ChatRequest {
        tools: Arc::clone(tools),
        ..ChatRequest::plain(Api::OpenAi, parsed.system.join("\n\n"), parsed.turns)
    })
}

/// The recorded assistant message as the upstream's answer.
fn recorded_answer(index: usize, message: &Value) -> Result<AssistantOutput, String> {
    let turn = parse_message(index, message, &mut Vec::new())?
        .filter(|turn| turn.role == Role::Assistant)
        .ok_or_else(|| format!("messages[{index}] is not an assistant message"))?;
    Ok(AssistantOutput {
        text: turn.content.text,
        tool_calls: turn.content.tool_calls,
        ..AssistantOutput::default()
    })
}

/// The strata policy: the session engine driven call by call, as the gateway drives it for a
/// client that resends its whole history. `observe` sees every call's upstream body (`None` for
/// a call the budget blocked).
pub fn replay_strata(
    transcript: &Transcript,
    options: &ReplayOptions,
    times: &[u64],
    observe: impl FnMut(usize, Option<&UpstreamCall>),
) -> Result<PolicyReport, ReplayError> {
    replay_strata_with(transcript, options, times, observe, |_, _| Ok(()))
}

/// [`replay_strata`], calling `after_call` with the engine and the call's (simulated) time after
/// every call, e.g. to run the volume sweeper on the replay's clock.
pub(crate) fn replay_strata_with(
    transcript: &Transcript,
    options: &ReplayOptions,
    times: &[u64],
    mut observe: impl FnMut(usize, Option<&UpstreamCall>),
    mut after_call: impl FnMut(&mut SessionEngine, u64) -> Result<(), crate::session::EngineError>,
) -> Result<PolicyReport, ReplayError> {
    let fail = |call: usize, message: String| ReplayError::Engine {
        session: transcript.name.clone(),
        call,
        message,
    };
    let mut settings = options.strata.clone();
    settings.api = match options.provider {
        Provider::Anthropic => Api::Anthropic,
        Provider::OpenAi => Api::OpenAi,
    };
    let start = times.first().copied().unwrap_or(0);
    let mut engine = SessionEngine::in_memory(&settings, start).map_err(|e| fail(0, e.to_string()))?;
    let wires: Vec<Value> = transcript.messages.iter().map(|m| m.wire.clone()).collect();
    let mut report = PolicyReport::new(PolicyKind::Strata);
    let mut cache = ProviderCache::new(options.provider);
    let mut stored: Vec<(ArtifactRef, String)> = Vec::new();
    let mut tracker = ReadBackTracker::new();
    let reserved = reserved(&settings.budget);
    let tools: Tools = options.tools.as_slice().into();
    for (call, &(end, _)) in transcript.calls.iter().enumerate() {
        let now = times[call];
        let request = client_request(&wires[..end], &tools).map_err(|e| fail(call, e))?;
        let turn = TurnRequest {
            request: &request,
            transparent: true,
            request_key: None,
            operation_id: OperationId::from_request(
                "replay",
                format!("{}#{call}", transcript.name).as_bytes(),
            ),
            head: options.head.clone(),
            now_ms: now,
        };
        let admitted = match engine.begin_turn(&settings, turn).map_err(|e| fail(call, e.to_string()))? {
            TurnOutcome::Admitted(admitted) => *admitted,
            TurnOutcome::Blocked(_) => {
                observe(call, None);
                report.blocked_calls += 1;
                after_call(&mut engine, now).map_err(|e| fail(call, e.to_string()))?;
                continue;
            }
            // Replay sends every turn whole (`hollow_turns` is 0).
            TurnOutcome::NeedsWholeHistory => {
                return Err(fail(
                    call,
                    "the engine asked for whole turns, and replay sent them whole".into(),
                ));
            }
        };
        track_offloaded(&mut tracker, &admitted.offloaded, call);
        report.compactions += admitted.compactions;
        report.spills += admitted.spilled_outputs;
        report.deduplications += admitted.deduplicated_outputs;
        stored.extend(admitted.offloaded.iter().cloned());
        let answer = recorded_answer(end, &wires[end]).map_err(|e| fail(call, e))?;
        let mut events = admitted.events();
        let chain_tail = admitted.chain_tail;
        let mut first_call = admitted.first_call;
        let mut blocks = engine.prompt_blocks(&settings).map_err(|e| fail(call, e.to_string()))?;
        let mut cost = cache.price(&blocks, now);
        // The model called a tool it saw only summarised: the gateway delivers the schemas in the
        // history and calls again, so the call is paid twice (the second against the cache the
        // first warmed).
        let delivered =
            engine.deliver_schemas(&settings, &answer, now).map_err(|e| fail(call, e.to_string()))?;
        if !delivered.is_empty() {
            report.schemas.loaded_on_demand += delivered.len() as u64;
            report.schemas.retries += 1;
            first_call =
                engine.next_call(&settings, options.head.clone()).map_err(|e| fail(call, e.to_string()))?;
            blocks = engine.prompt_blocks(&settings).map_err(|e| fail(call, e.to_string()))?;
            // Both calls are billed; the prompt size is the one the answer came from.
            let retry = cache.price(&blocks, now);
            cost = CallCost { total: retry.total, ..cost + retry };
        }
        let first_call = &first_call;
        report.schemas.lazy_calls += u64::from(first_call.tools.lazy);
        report.schemas.sent_tool_tokens += first_call.tools.sent_tokens;
        report.schemas.full_tool_tokens += first_call.tools.full_tokens;
        observe(call, Some(first_call));
        if tracker.pending() > 0 {
            let mut prompt: Option<String> = None;
            let uses = tracker.observe_output(call, &output_text(&transcript.messages[end]), &mut |anchor| {
                prompt
                    .get_or_insert_with(|| engine.context_text(&settings).unwrap_or_default())
                    .contains(anchor)
            });
            let later_calls = transcript.calls.len() - call - 1;
            report.charge_read_backs(uses, &mut cache, &blocks, (now, later_calls), options.provider);
        }
        let effects = engine
            .record_answer(&settings, first_call, &answer, now)
            .map_err(|e| fail(call, e.to_string()))?;
        report.elisions += effects.elided_entries;
        report.schemas.loaded_on_demand += effects.tools_loaded;
        report.expirations += effects.expired_entries;
        events.extend(effects.events());
        track_offloaded(&mut tracker, &effects.offloaded, call + 1);
        report.record(cost, reserved, settings.limit, events);
        stored.extend(effects.offloaded);
        engine
            .remember_answer(chain_tail, &answer.visible_turn(is_memory_tool))
            .map_err(|e| fail(call, e.to_string()))?;
        after_call(&mut engine, now).map_err(|e| fail(call, e.to_string()))?;
    }
    report.preservation = Some(preservation(transcript, &engine, &settings, &stored));
    report.final_view =
        Some(final_view(transcript, &engine, &settings).map_err(|e| fail(times.len(), e.to_string()))?);
    Ok(report)
}

/// The engine after the session, as the gateway's `status`, `entries` and `inspect` endpoints show a
/// live agent (the requests are added by the caller from the call records).
fn final_view(
    transcript: &Transcript,
    engine: &SessionEngine,
    settings: &SessionSettings,
) -> Result<Value, crate::session::EngineError> {
    let status = engine.status(settings)?;
    let journal = engine.journal();
    Ok(serde_json::json!({
        "status": {
            "agent": {"name": transcript.name, "namespace": "replay"},
            "context": status,
            "telemetry": status.telemetry_line(),
            "generation": journal.generation(),
            "entries": journal.entries().len(),
            "journalTokens": journal.total_tokens(),
            "sessionMode": "Transparent",
            "budget": settings.budget,
        },
        "entries": {"generation": journal.generation(), "entries": engine.entry_summaries()},
        "inspect": {"decisions": engine.decisions(), "lowerBudgets": engine.lower_budgets(settings)},
    }))
}

/// What the strata policy kept readable: off-window outputs read back byte-exact, and decision
/// markers still in the final context or in an artifact.
fn preservation(
    transcript: &Transcript,
    engine: &SessionEngine,
    settings: &SessionSettings,
    stored: &[(ArtifactRef, String)],
) -> Preservation {
    let store = engine.store();
    let tenant = settings.tenant.as_str();
    let mut result = Preservation { stored_outputs: stored.len() as u64, ..Preservation::default() };
    result.readable_byte_exact = stored
        .iter()
        .filter(|(data_ref, original)| {
            store.get(tenant, data_ref).is_ok_and(|bytes| bytes == original.as_bytes())
        })
        .count() as u64;
    let Some(pattern) = marker_pattern() else { return result };
    let Ok(context) = engine.context_text(settings) else { return result };
    let archives: Vec<String> = engine
        .journal()
        .entries()
        .iter()
        .flat_map(|e| e.artifact_refs.iter())
        .filter_map(|r| store.get(tenant, r).ok())
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
        .chain(stored.iter().map(|(_, original)| original.clone()))
        .collect();
    let first = usize::from(transcript.messages.first().is_some_and(|m| m.role == Role::System));
    let end = transcript.calls.last().map_or(0, |&(end, _)| end);
    for message in &transcript.messages[first.min(end)..end] {
        for line in message.text.lines().filter(|l| pattern.is_match(l)) {
            let line = line.trim();
            result.markers += 1;
            let redacted =
                settings.redactor.as_ref().map_or(line.to_string(), |r| r.redact(line).text.into_owned());
            let found = context.contains(&redacted)
                || archives.iter().any(|a| a.contains(line) || a.contains(&redacted));
            result.markers_surviving += u64::from(found);
        }
    }
    result
}

//! One chat request end to end: parse, journal the new turns, admit, compile, call the upstream,
//! run memory tools in a bounded loop, journal the answer and reply in the client's shape.
//!
//! Streaming hides memory tools by name: a tool call's deltas are held until its name is known
//! (OpenAI sends it in a call's first delta as a rule, but a first delta without a name, a name split
//! across deltas and parallel calls interleaved by index are all handled; Anthropic names the tool
//! in `content_block_start`). A memory tool's deltas are dropped; a client tool's held deltas are
//! sent as one delta once its name is decided, later ones are forwarded at once, with indices
//! renumbered. A round that called only memory tools has its finish event held back; the gateway
//! runs the tools and streams the next round into the same client stream, so the client sees one
//! answer. A round whose stream fails or ends early (no finish) ends the client's stream with an
//! error event in its provider's shape and journals nothing of that round.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::Response;
use bytes::Bytes;
use serde_json::{Map, Value};
use strata_api::agent::SessionMode;
use strata_core::budget::{BudgetLevel, MaxTokensClamp, OperationId};
use strata_core::session::message_memo::{BodyOrigin, MessageMemo};
use strata_core::session::request_keys::KeyRefusal;
use strata_core::session::tool_block::ToolBlocks;
use strata_core::session::tool_schema::is_memory_tool;
use strata_core::session::transparent::ChainHash;
use strata_core::session::{
    Api, AssistantOutput, ChatRequest, ContextEvent, EngineError, SessionEngine, Turn, TurnOutcome,
    TurnRequest, UpstreamCall, Usage, now_ms,
};
use tokio::sync::mpsc;

use super::answer_wire;
use super::config::{LiveSettings, Settings};
use super::engine_host::{EngineHost, PendingWrites, Placement};
use super::errors::GatewayError;
use super::inspect::{InspectLog, RequestRecord, RoundRecord, cache_outcome};
use super::metrics::Metrics;
use super::pending::PendingOperations;
use super::provider::{ParsedRequest, ProviderAdapter, adapter, adapter_for};
use super::response_cache::{CacheKey, CachedAnswer, ResponseCache};
use super::sse::SseParser;
use super::upstream::{Upstream, UpstreamResponse};

/// Upstream calls per client request at most (memory-tool rounds included).
pub const MAX_ROUNDS: usize = 8;

/// The header naming a stateful session.
pub const SESSION_HEADER: &str = "x-strata-session";

/// A stateful client's key for one turn: sent again with a retry, it keeps the turn from being
/// journaled twice (ignored in transparent sessions, whose history identifies every turn).
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";

/// The response header reporting that the client's max_tokens was lowered to the output reserve:
/// `requested=64000, applied=8192`.
pub const MAX_TOKENS_CLAMPED_HEADER: &str = "x-strata-max-tokens-clamped";

/// Shared state of a running gateway.
#[derive(Debug)]
pub struct Gateway {
    /// The settings in force.
    pub live: LiveSettings,
    /// The agent's context, off the async runtime.
    pub engine: Arc<EngineHost>,
    /// The upstream client.
    pub upstream: Upstream,
    /// Metrics.
    pub metrics: Metrics,
    /// Blocked requests.
    pub pending: PendingOperations,
    /// Recent requests for the inspector.
    pub inspect: InspectLog,
    /// Largest accepted request body.
    pub max_body_bytes: usize,
    /// The large request-body buffer kept between requests.
    pub body_buffers: super::body_buffer::BodyBuffers,
    /// Answers of tool-less transparent requests, when the policy enables the response cache.
    pub responses: ResponseCache,
    /// The last transparent request's messages, so the history a client resends is not parsed
    /// and hashed again.
    pub messages: Mutex<MessageMemo>,
    /// The last tool block a client sent, parsed once.
    pub tool_blocks: ToolBlocks,
    /// Bytes used on the data volume.
    pub volume: Arc<super::volume::VolumeUsage>,
    /// Compactions with the policy's summariser model, off the engine.
    pub compactor: Arc<super::compactor::Compactor>,
    /// What the artifact sweeper deleted.
    pub sweeps: super::sweeper::SweepLog,
    /// A task growing the engine's lists is on its way ([`Gateway::make_room_aside`]).
    pub room_pending: Arc<AtomicBool>,
}

impl Gateway {
    /// Runs `work` on the engine (on the blocking pool) and returns once its writes are durable.
    pub async fn with_engine<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut SessionEngine) -> Result<T, EngineError> + Send + 'static,
    ) -> Result<T, GatewayError> {
        self.engine.run(Placement::Blocking, self.live.get(), work).await
    }

    /// Grows the engine's lists that are close to reallocating, in a task of its own on the
    /// blocking pool: the copy is paid beside the request that found them low, not inside the next
    /// one (see [`strata_core::room_ahead`]). It writes nothing; a failure only leaves the growth to
    /// a later push. Requests that find the room low together start one task.
    fn make_room_aside(&self) {
        if self.room_pending.swap(true, Ordering::AcqRel) {
            return;
        }
        let pending = Arc::clone(&self.room_pending);
        let engine = Arc::clone(&self.engine);
        let settings = self.live.get();
        let made_count = self.metrics.room_made.clone();
        self.engine.spawn_beside(async move {
            let made = engine.run(Placement::Blocking, settings, |engine| Ok(engine.make_room())).await;
            pending.store(false, Ordering::Release);
            match made {
                Ok(true) => made_count.inc(),
                Ok(false) => {}
                Err(error) => tracing::debug!(%error, "room ahead of the history not made"),
            }
        });
    }

    /// Runs a request's engine call in place (see [`EngineHost::run`]) and returns once
    /// its writes are durable.
    async fn with_engine_in_place<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut SessionEngine) -> Result<T, EngineError> + Send + 'static,
    ) -> Result<T, GatewayError> {
        self.engine.run(Placement::InPlace, self.live.get(), work).await
    }

    /// The message memo, taken over by a transparent request.
    fn take_memo(&self) -> MessageMemo {
        std::mem::take(&mut *self.messages.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Hands a memo back.
    fn put_memo(&self, memo: MessageMemo) {
        *self.messages.lock().unwrap_or_else(PoisonError::into_inner) = memo;
    }

    /// Runs a request's engine call in place without waiting for its writes to be durable; see
    /// [`EngineHost::run_in_place_unsynced`].
    async fn with_engine_in_place_unsynced<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut SessionEngine) -> Result<T, EngineError> + Send + 'static,
    ) -> Result<(T, PendingWrites), GatewayError> {
        self.engine.run_in_place_unsynced(self.live.get(), work).await
    }
}

/// A request after its turns were journaled.
struct Prepared {
    settings: Arc<Settings>,
    request: ChatRequest,
    head: Map<String, Value>,
    chain_tail: Option<ChainHash>,
    record: RequestRecord,
    overhead: Duration,
    cache_key: Option<CacheKey>,
    first_call: Option<Box<UpstreamCall>>,
    /// Events of admitting the turn, shown on its first round.
    admission_events: Vec<ContextEvent>,
    /// The client's max_tokens lowered to the output reserve, if it was.
    max_tokens_clamp: Option<MaxTokensClamp>,
    /// The journaled turn, made durable before the client is answered.
    turn_writes: PendingWrites,
}

fn check_api(settings: &Settings, adapter: &dyn ProviderAdapter) -> Result<(), GatewayError> {
    let provider = settings.provider();
    if adapter.serves(provider) {
        return Ok(());
    }
    let right = adapter_for(provider).client_path();
    Err(GatewayError::BadRequest(format!(
        "this gateway's upstream is {provider:?}; send requests to {right} in that provider's format"
    )))
}

fn level_value(level: BudgetLevel) -> i64 {
    match level {
        BudgetLevel::Normal => 0,
        BudgetLevel::Warning => 1,
        BudgetLevel::HighRisk => 2,
        BudgetLevel::Critical => 3,
    }
}

/// The upstream body's leading fields: the client's parameters, the model, streaming and the
/// provider's cache hint.
pub fn upstream_head(settings: &Settings, request: &ChatRequest) -> Map<String, Value> {
    let mut head = request.params.clone();
    head.insert("model".into(), settings.config.upstream.model.clone().into());
    if request.stream {
        head.insert("stream".into(), true.into());
    }
    let provider = settings.provider();
    adapter(request.api).add_upstream_fields(
        &mut head,
        provider,
        settings.cache_key.as_hex(),
        request.stream,
    );
    head
}

async fn prepare(
    gateway: &Arc<Gateway>,
    api: Api,
    headers: &HeaderMap,
    body: &Bytes,
    origin: Option<BodyOrigin>,
) -> Result<Prepared, GatewayError> {
    let started = Instant::now();
    let settings = gateway.live.get();
    let adapter = adapter(api);
    check_api(&settings, adapter)?;
    let has_session = headers.contains_key(SESSION_HEADER);
    let transparent = !has_session;
    // A request takes the memo over and hands it back after the engine (a concurrent one meanwhile
    // reads all of its messages): each memo is one request's bytes, turns and chains.
    let mut memo = if transparent { gateway.take_memo() } else { MessageMemo::default() };
    // The body's reader compared it with the last one: a resent history is not digested again.
    memo.set_origin(origin);
    let ParsedRequest { mut request, mut recollection, messages, mut reused_messages } =
        adapter.parse_request(body, memo, &gateway.tool_blocks)?;
    if settings.config.session_mode == SessionMode::Stateful && !has_session {
        return Err(GatewayError::BadRequest(format!(
            "this agent's session mode is Stateful: send only the new messages, with an {SESSION_HEADER} header"
        )));
    }
    let request_key = headers
        .get(IDEMPOTENCY_KEY_HEADER)
        .filter(|_| !transparent)
        .map(|value| value.to_str().map(str::to_owned))
        .transpose()
        .map_err(|_| GatewayError::Engine(KeyRefusal::Malformed.into()))?;
    // Named from the digest the memo took of its messages' bytes: a resent history is hashed once.
    let operation_id = OperationId::from_payload_digest(adapter.name(), recollection.body_digest(body));
    let mut record = RequestRecord {
        operation_id: operation_id.as_str().to_owned(),
        at_ms: now_ms(),
        api: adapter.name(),
        stream: request.stream,
        session: if transparent { "transparent" } else { "stateful" },
        new_entries: 0,
        rounds: Vec::new(),
        overhead_micros: 0,
        outcome: String::new(),
    };
    let head = upstream_head(&settings, &request);
    // At most twice: the second time every turn is whole, so the engine cannot ask again.
    let mut attempts = 0;
    let (mut request, outcome, turn_writes) = loop {
        attempts += 1;
        let work_settings = Arc::clone(&settings);
        let operation = operation_id.clone();
        let work_head = head.clone();
        let request_key = request_key.clone();
        let ((returned, outcome, ask), turn_writes) = gateway
            .with_engine_in_place_unsynced(move |engine| {
                let turn = TurnRequest {
                    request: &request,
                    transparent,
                    request_key: request_key.as_deref(),
                    operation_id: operation,
                    head: work_head,
                    now_ms: now_ms(),
                };
                let outcome = engine.begin_turn(&work_settings.session, turn)?;
                // The memo's chain values were read; the next request's are built in their vector.
                let mut request = request;
                engine.recycle_chains(std::mem::take(&mut request.known_chains));
                Ok((request, outcome, engine.take_compaction_ask()))
            })
            .await?;
        if let Some(ask) = ask {
            gateway.compactor.start(ask);
        }
        if !matches!(outcome, TurnOutcome::NeedsWholeHistory) || attempts > 1 {
            break (returned, outcome, turn_writes);
        }
        // The journal no longer holds turns the memo took for journaled (a rewind by another
        // conversation's request, a rollback, an edit of a summarised turn): read every message
        // again, whole.
        let mut fresh = MessageMemo::default();
        fresh.set_origin(origin);
        let whole = adapter.parse_request(body, fresh, &gateway.tool_blocks)?;
        (request, recollection, reused_messages) = (whole.request, whole.recollection, 0);
    };
    if transparent {
        let read = &gateway.metrics.per_request;
        read.messages_reused.inc_by(reused_messages as u64);
        read.messages_parsed.inc_by((messages - reused_messages) as u64);
    }
    let admitted = match outcome {
        TurnOutcome::Admitted(admitted) => admitted,
        TurnOutcome::NeedsWholeHistory => {
            return Err(GatewayError::EngineUnavailable {
                cause: "the context engine asked for the whole history again after it was sent whole".into(),
                reason: "send the request again".into(),
            });
        }
        TurnOutcome::Blocked(notice) => {
            gateway.engine.make_durable(turn_writes).await?;
            gateway.metrics.blocked_operations.inc();
            // A copy of its own, sized to the body: the body may sit in the larger buffer kept
            // between requests (`body_buffer`), which the store would hold uncounted.
            let held = Bytes::copy_from_slice(body);
            if let Some(forgotten) = gateway.pending.insert(operation_id.as_str(), api, headers.clone(), held)
            {
                tracing::warn!(operation = %operation_id, %forgotten, "blocked request not held");
            }
            gateway
                .metrics
                .held_request_bytes
                .set(i64::try_from(gateway.pending.usage().1).unwrap_or(i64::MAX));
            record.outcome = "blocked".into();
            record.overhead_micros = elapsed_micros(started.elapsed());
            gateway.inspect.push(record);
            return Err(GatewayError::Blocked(notice));
        }
    };
    let mut admitted = *admitted;
    if transparent {
        let turns = std::mem::take(&mut request.turns);
        gateway.put_memo(recollection.remember(turns, std::mem::take(&mut admitted.chains)));
    }
    let admission_events = admitted.events();
    let (new_entries, spilled_bytes, deduplicated, chain_tail, first_call) = (
        admitted.new_entries,
        admitted.spilled_bytes,
        admitted.deduplicated,
        admitted.chain_tail,
        Box::new(admitted.first_call),
    );
    gateway.metrics.compactions.inc_by(admitted.compactions);
    if let Some(rewind) = &admitted.rewind {
        gateway.metrics.transparent_rewinds.with_label_values(&[rewind.cause.label()]).inc();
    }
    for kind in &admitted.volatile_system {
        gateway.metrics.volatile_system.with_label_values(&[&kind.to_string()]).inc();
    }
    record.new_entries = new_entries;
    gateway.pending.remove(operation_id.as_str());
    gateway.metrics.held_request_bytes.set(i64::try_from(gateway.pending.usage().1).unwrap_or(i64::MAX));
    gateway.metrics.spilled_bytes.inc_by(spilled_bytes);
    gateway.metrics.deduplicated_tokens.inc_by(deduplicated);
    for digest in &admitted.digests {
        gateway.metrics.delegation_digests.with_label_values(&[digest.source.label()]).inc();
        gateway.metrics.delegation_tokens.with_label_values(&["full"]).inc_by(digest.full_tokens);
        gateway.metrics.delegation_tokens.with_label_values(&["returned"]).inc_by(digest.return_tokens);
    }
    Ok(Prepared {
        first_call: Some(first_call),
        chain_tail,
        settings,
        request,
        head,
        record,
        overhead: started.elapsed(),
        cache_key: None,
        admission_events,
        max_tokens_clamp: None,
        turn_writes,
    })
}

fn elapsed_micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

/// The next upstream call: the one compiled with the request's turns, or a fresh compile.
async fn plan(gateway: &Gateway, prepared: &mut Prepared) -> Result<UpstreamCall, GatewayError> {
    let started = Instant::now();
    let call = match prepared.first_call.take() {
        Some(call) => *call,
        None => {
            let settings = Arc::clone(&prepared.settings);
            let head = prepared.head.clone();
            gateway.with_engine_in_place(move |engine| engine.next_call(&settings.session, head)).await?
        }
    };
    gateway.metrics.count_churn(call.churn);
    gateway.metrics.context_tokens.set(i64::try_from(call.status.tokens).unwrap_or(i64::MAX));
    gateway.metrics.context_limit.set(i64::try_from(call.status.limit).unwrap_or(i64::MAX));
    gateway.metrics.context_level.set(level_value(call.status.level));
    record_call_shape(&gateway.metrics, &call);
    if prepared.max_tokens_clamp.is_none() && call.max_tokens_clamp.is_some() {
        prepared.max_tokens_clamp = call.max_tokens_clamp;
        gateway.metrics.max_tokens_clamped.inc();
    }
    if call.status.tokens > 0 {
        gateway.metrics.compression_ratio.set(call.source_tokens as f64 / call.status.tokens as f64);
    }
    prepared.overhead += started.elapsed();
    Ok(call)
}

/// The tool block's and the stages' gauges at one call.
fn record_call_shape(metrics: &Metrics, call: &UpstreamCall) {
    let gauge = |value: u64| i64::try_from(value).unwrap_or(i64::MAX);
    let series = &metrics.per_request;
    series.tool_schemas_full.set(gauge(call.tools.full));
    series.tool_schemas_summarised.set(gauge(call.tools.summarised));
    series.tool_tokens_sent.set(gauge(call.tools.sent_tokens));
    series.tool_tokens_full.set(gauge(call.tools.full_tokens));
    for stage in &call.stages {
        metrics.set_stage_tokens(stage.stage, gauge(stage.used), gauge(stage.allocated));
    }
}

/// The model called tools it saw only summarised: their schemas are delivered in the history (a
/// `strata_load_tools` round the engine appends) and the round's answer is dropped, to be
/// repeated. Returns the call to record when nothing was delivered (schemas are not lazy, or every
/// called tool had its schema), `None` when the round must be repeated.
async fn load_summarised(
    gateway: &Gateway,
    prepared: &mut Prepared,
    call: UpstreamCall,
    output: &AssistantOutput,
    upstream_time: Duration,
    total: &mut Usage,
) -> Result<Option<UpstreamCall>, GatewayError> {
    if !call.tools.lazy || output.tool_calls.is_empty() {
        return Ok(Some(call));
    }
    let settings = Arc::clone(&prepared.settings);
    let answer = output.without_raw();
    let loaded = gateway
        .with_engine_in_place(move |engine| engine.deliver_schemas(&settings.session, &answer, now_ms()))
        .await?;
    if loaded.is_empty() {
        return Ok(Some(call));
    }
    let metrics = &gateway.metrics;
    metrics.tool_schema_retries.inc();
    metrics.per_request.loaded_by_summarised_call.inc_by(loaded.len() as u64);
    metrics.per_request.upstream_ok.inc();
    metrics.upstream_duration.observe(upstream_time.as_secs_f64());
    if let Some(usage) = &output.usage {
        total.add(usage);
    }
    prepared
        .record
        .rounds
        .push(RoundRecord { schema_retry: loaded, ..round_record(call, output, upstream_time) });
    Ok(None)
}

/// The Inspector's record of one round: the call as compiled and the answer's usage.
fn round_record(call: UpstreamCall, output: &AssistantOutput, upstream_time: Duration) -> RoundRecord {
    RoundRecord {
        sections: call.sections,
        breakpoints: call.breakpoints,
        churn: call.churn,
        status: call.status,
        usage: output.usage,
        cache_outcome: cache_outcome(output.usage.as_ref()),
        memory_calls: Vec::new(),
        events: Vec::new(),
        upstream_micros: elapsed_micros(upstream_time),
        stages: call.stages,
        tools: call.tools,
        max_tokens_clamp: call.max_tokens_clamp,
        schema_retry: Vec::new(),
    }
}

/// Journals one round's answer through the engine (which learns from its usage and runs its
/// memory tools) and records the round; in a transparent session, a final round's answer is also
/// remembered as the client will see it (`earlier_texts` are the texts of the request's earlier
/// rounds), in the same hand-off to the engine. Returns whether the round only called memory tools
/// (the gateway calls the model again).
async fn record_round(
    gateway: &Gateway,
    prepared: &mut Prepared,
    call: UpstreamCall,
    output: &AssistantOutput,
    upstream_time: Duration,
    total: &mut Usage,
    earlier_texts: &[String],
) -> Result<bool, GatewayError> {
    let started = Instant::now();
    let settings = Arc::clone(&prepared.settings);
    let answer = output.without_raw();
    let chain_tail = prepared.chain_tail;
    let api = prepared.request.api;
    // Only a transparent session remembers its answer, and only it needs the earlier texts.
    let mut texts = chain_tail.map(|_| earlier_texts.to_vec());
    let (effects, call, ask, room_low) = gateway
        .with_engine_in_place(move |engine| {
            let effects = engine.record_answer(&settings.session, &call, &answer, now_ms())?;
            if let Some(texts) = texts.as_mut().filter(|_| !effects.internal) {
                texts.push(answer.text.clone());
                engine.remember_answer(chain_tail, &visible_turn(api, texts, &answer))?;
            }
            Ok((effects, call, engine.take_compaction_ask(), engine.room_low()))
        })
        .await?;
    if let Some(ask) = ask {
        gateway.compactor.start(ask);
    }
    if room_low {
        gateway.make_room_aside();
    }
    let metrics = &gateway.metrics;
    for name in &effects.memory_calls {
        metrics.memory_tool_calls.with_label_values(&[name.as_str()]).inc();
    }
    metrics.purges.inc_by(effects.purges);
    metrics.elided_tokens.inc_by(effects.elided_tokens);
    metrics.compactions.inc_by(effects.compactions);
    if let Some(usage) = &output.usage {
        total.add(usage);
        let series = &metrics.per_request;
        series.prompt_fresh.inc_by(usage.fresh_tokens());
        series.prompt_cached.inc_by(usage.cached_tokens);
        series.prompt_cache_write.inc_by(usage.cache_write_tokens);
        let outcome = if usage.cached_tokens > 0 { &series.prefix_hit } else { &series.prefix_miss };
        outcome.inc();
        metrics.completion_tokens.inc_by(usage.completion_tokens);
    }
    metrics.per_request.upstream_ok.inc();
    metrics.upstream_duration.observe(upstream_time.as_secs_f64());
    let mut events = std::mem::take(&mut prepared.admission_events);
    events.extend(effects.events());
    metrics.per_request.loaded_by_load_tool.inc_by(effects.tools_loaded);
    prepared.record.rounds.push(RoundRecord {
        memory_calls: effects.memory_calls,
        events,
        ..round_record(call, output, upstream_time)
    });
    prepared.overhead += started.elapsed();
    Ok(effects.internal)
}

fn visible_turn(api: Api, texts: &[String], final_output: &AssistantOutput) -> Turn {
    let mut turn = final_output.visible_turn(is_memory_tool);
    turn.content.text = adapter(api).join_texts(texts);
    turn
}

fn finish_record(gateway: &Gateway, mut prepared: Prepared, outcome: &str) {
    prepared.record.outcome = outcome.to_owned();
    prepared.record.overhead_micros = elapsed_micros(prepared.overhead);
    gateway.metrics.added_overhead.observe(prepared.overhead.as_secs_f64());
    gateway.inspect.push(prepared.record);
}

async fn complete(
    gateway: &Gateway,
    mut prepared: Prepared,
    headers: &HeaderMap,
) -> Result<Response, GatewayError> {
    let adapter = adapter(prepared.request.api);
    let mut texts: Vec<String> = Vec::new();
    let mut total = Usage::default();
    let mut retried = false;
    for _ in 0..MAX_ROUNDS {
        let mut call = plan(gateway, &mut prepared).await?;
        let body = std::mem::take(&mut call.body);
        let upstream_started = Instant::now();
        let response =
            gateway.upstream.post(&prepared.settings, adapter.upstream_path(), body, headers, false).await;
        let mut response =
            response.inspect_err(|_| gateway.metrics.upstream_calls.with_label_values(&["error"]).inc())?;
        let bytes = gateway.upstream.read_body(&mut response).await?;
        let upstream_time = upstream_started.elapsed();
        let output = adapter.read_answer(&bytes)?;
        let call = if retried {
            call
        } else {
            match load_summarised(gateway, &mut prepared, call, &output, upstream_time, &mut total).await? {
                Some(call) => call,
                None => {
                    retried = true;
                    continue;
                }
            }
        };
        let internal =
            record_round(gateway, &mut prepared, call, &output, upstream_time, &mut total, &texts).await?;
        texts.push(output.text.clone());
        if internal {
            continue;
        }
        let started = Instant::now();
        let earlier = &texts[..texts.len() - 1];
        // The request's only round, untouched by the engine's tools: its answer as the upstream
        // sent it, byte for byte, instead of parsed, copied and encoded again.
        let as_sent = earlier.is_empty() && !retried && adapter.answer_passes_as_sent(&output);
        let body = if as_sent {
            bytes
        } else {
            let output = answer_wire::with_raw(output, &bytes)?;
            Bytes::from(adapter.client_response(&output, earlier, &total).to_string())
        };
        if let Some(key) = prepared.cache_key
            && texts.len() == 1
        {
            // The upstream's answer may lie in a larger read buffer, which the cache would hold
            // uncounted for its whole time to live: it keeps a copy of its own. A rebuilt answer is
            // already sized to itself.
            let kept = if as_sent { Bytes::copy_from_slice(&body) } else { body.clone() };
            gateway.responses.put(key, false, kept, response_cache_ttl(&prepared.settings));
        }
        prepared.overhead += started.elapsed();
        let clamp = prepared.max_tokens_clamp;
        finish_record(gateway, prepared, "ok");
        let mut response = bytes_response(false, body);
        report_clamp(&mut response, clamp);
        return Ok(response);
    }
    finish_record(gateway, prepared, "memory_loop");
    Err(GatewayError::MemoryLoop { rounds: MAX_ROUNDS })
}

fn stream_error_event(adapter: &dyn ProviderAdapter, error: &GatewayError) -> Bytes {
    adapter.stream_error_event(&error.body(adapter.api()).to_string())
}

struct ClientStream {
    sender: mpsc::Sender<Result<Bytes, Infallible>>,
    connected: bool,
    copy: Option<Vec<u8>>,
}

impl ClientStream {
    async fn send(&mut self, bytes: Bytes) {
        if let Some(copy) = &mut self.copy {
            copy.extend_from_slice(&bytes);
        }
        if self.connected && self.sender.send(Ok(bytes)).await.is_err() {
            self.connected = false;
        }
    }
}

async fn stream_rounds(
    gateway: Arc<Gateway>,
    mut prepared: Prepared,
    headers: HeaderMap,
    first: (UpstreamCall, UpstreamResponse, Instant),
    mut client: ClientStream,
) {
    let adapter = adapter(prepared.request.api);
    let mut translator = adapter.stream_translator(prepared.request.wants_usage);
    let mut texts: Vec<String> = Vec::new();
    let mut total = Usage::default();
    let (mut call, mut response, mut upstream_started) = first;
    // One held round per request at most, as in the non-streaming path.
    let mut retried = false;
    for round in 0..MAX_ROUNDS {
        let summarised = std::mem::take(&mut call.summarised_tools);
        translator.hold_summarised(if retried { Vec::new() } else { summarised });
        let mut parser = SseParser::default();
        let mut failure = None;
        let mut read_bytes = 0usize;
        let limit = gateway.upstream.max_response_bytes();
        'read: loop {
            let chunk = match response.chunk().await {
                Ok(Some(chunk)) => chunk,
                Ok(None) => break 'read,
                Err(error) => {
                    failure = Some(error);
                    break 'read;
                }
            };
            read_bytes += chunk.len();
            if read_bytes > limit {
                failure = Some(GatewayError::UpstreamTooLarge { limit });
                break 'read;
            }
            for event in parser.push(&chunk) {
                match translator.on_event(&event) {
                    Ok(Some(bytes)) => client.send(bytes).await,
                    Ok(None) => {}
                    Err(error) => {
                        failure = Some(error);
                        break 'read;
                    }
                }
            }
        }
        if failure.is_none()
            && let Some(event) = parser.finish()
        {
            match translator.on_event(&event) {
                Ok(Some(bytes)) => client.send(bytes).await,
                Ok(None) => {}
                Err(error) => failure = Some(error),
            }
        }
        if failure.is_none() && !translator.round_complete() {
            failure = Some(GatewayError::UpstreamProtocol(
                "the stream ended before the answer was complete; nothing of it was journaled, send the request again"
                    .into(),
            ));
        }
        if let Some(error) = failure {
            client.send(stream_error_event(adapter, &error)).await;
            finish_record(&gateway, prepared, &error.to_string());
            return;
        }
        let upstream_time = upstream_started.elapsed();
        let held = translator.held_for_retry();
        let output = translator.finish_round();
        if held {
            // The model called a tool it saw only summarised before the client saw anything of
            // the round: nothing of it was forwarded; load the schemas and repeat the round.
            retried = true;
            let loaded =
                load_summarised(&gateway, &mut prepared, call, &output, upstream_time, &mut total).await;
            match loaded {
                Ok(None) => {}
                Ok(Some(_)) => tracing::warn!("a held round's tools were all loaded already; repeating it"),
                Err(error) => {
                    client.send(stream_error_event(adapter, &error)).await;
                    finish_record(&gateway, prepared, &error.to_string());
                    return;
                }
            }
        } else {
            let internal =
                match record_round(&gateway, &mut prepared, call, &output, upstream_time, &mut total, &texts)
                    .await
                {
                    Ok(internal) => internal,
                    Err(error) => {
                        client.send(stream_error_event(adapter, &error)).await;
                        finish_record(&gateway, prepared, &error.to_string());
                        return;
                    }
                };
            texts.push(output.text.clone());
            if !internal {
                for bytes in translator.closing(&total) {
                    client.send(bytes).await;
                }
                if let (Some(key), Some(copy), 1) = (prepared.cache_key, client.copy.take(), texts.len()) {
                    gateway.responses.put(
                        key,
                        true,
                        Bytes::from(copy),
                        response_cache_ttl(&prepared.settings),
                    );
                }
                finish_record(&gateway, prepared, "ok");
                return;
            }
        }
        if round + 1 == MAX_ROUNDS {
            break;
        }
        let next = async {
            let mut next_call = plan(&gateway, &mut prepared).await?;
            let started = Instant::now();
            let body = std::mem::take(&mut next_call.body);
            let response = gateway
                .upstream
                .post(&prepared.settings, adapter.upstream_path(), body, &headers, true)
                .await?;
            Ok::<_, GatewayError>((next_call, response, started))
        };
        match next.await {
            Ok((next_call, next_response, started)) => {
                call = next_call;
                response = next_response;
                upstream_started = started;
            }
            Err(error) => {
                client.send(stream_error_event(adapter, &error)).await;
                finish_record(&gateway, prepared, &error.to_string());
                return;
            }
        }
    }
    let error = GatewayError::MemoryLoop { rounds: MAX_ROUNDS };
    client.send(stream_error_event(adapter, &error)).await;
    finish_record(&gateway, prepared, "memory_loop");
}

async fn stream(
    gateway: Arc<Gateway>,
    mut prepared: Prepared,
    headers: HeaderMap,
) -> Result<Response, GatewayError> {
    let path = adapter(prepared.request.api).upstream_path();
    let mut call = plan(&gateway, &mut prepared).await?;
    let started = Instant::now();
    let body = std::mem::take(&mut call.body);
    // The turn's fsync runs while the upstream call is under way; the client hears nothing before
    // both are done.
    let (response, durable) = tokio::join!(
        gateway.upstream.post(&prepared.settings, path, body, &headers, true),
        gateway.engine.make_durable(prepared.turn_writes)
    );
    durable?;
    let response =
        response.inspect_err(|_| gateway.metrics.upstream_calls.with_label_values(&["error"]).inc())?;
    let clamp = prepared.max_tokens_clamp;
    let (sender, receiver) = mpsc::channel::<Result<Bytes, Infallible>>(64);
    let client = ClientStream { sender, connected: true, copy: prepared.cache_key.map(|_| Vec::new()) };
    // Beside the request: the stream journals its answer after the client's body may have ended.
    let engine = Arc::clone(&gateway.engine);
    engine.spawn_beside(stream_rounds(gateway, prepared, headers, (call, response, started), client));
    let body = futures::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|item| (item, receiver))
    });
    let mut response = Response::new(Body::from_stream(body));
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    report_clamp(&mut response, clamp);
    Ok(response)
}

/// Names the max_tokens clamp in the response's headers.
fn report_clamp(response: &mut Response, clamp: Option<MaxTokensClamp>) {
    let Some(clamp) = clamp else { return };
    let value = format!("requested={}, applied={}", clamp.requested, clamp.applied);
    if let Ok(value) = HeaderValue::from_str(&value) {
        response.headers_mut().insert(MAX_TOKENS_CLAMPED_HEADER, value);
    }
}

fn response_cache_ttl(settings: &Settings) -> Duration {
    Duration::from_secs(u64::from(settings.config.policy.cache.response_cache_ttl_seconds))
}

fn bytes_response(stream: bool, body: Bytes) -> Response {
    let mut response = Response::new(Body::from(body));
    let content_type = if stream { "text/event-stream" } else { "application/json" };
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

fn cached_response(answer: CachedAnswer) -> Response {
    bytes_response(answer.stream, answer.body)
}

/// Serves one chat request on `api`.
pub async fn chat(
    gateway: Arc<Gateway>,
    api: Api,
    headers: HeaderMap,
    body: &Bytes,
    origin: Option<BodyOrigin>,
) -> Result<Response, GatewayError> {
    let settings = gateway.live.get();
    let ttl = response_cache_ttl(&settings);
    let keying_started = Instant::now();
    let cache_key = (!ttl.is_zero() && !headers.contains_key(SESSION_HEADER))
        .then(|| gateway.responses.key(api, &settings.cache_key, body, origin));
    let keying = keying_started.elapsed();
    if let Some(key) = &cache_key
        && let Some(answer) = gateway.responses.get(key, ttl)
    {
        gateway.metrics.response_cache_hits.inc();
        return Ok(cached_response(answer));
    }
    let mut prepared = prepare(&gateway, api, &headers, body, origin).await?;
    // Keying the request for the response cache is the gateway's own work too.
    prepared.overhead += keying;
    if prepared.request.tools.is_empty() {
        prepared.cache_key = cache_key;
    }
    let turn_writes = prepared.turn_writes;
    let answered = if prepared.request.stream {
        stream(Arc::clone(&gateway), prepared, headers).await
    } else {
        complete(&gateway, prepared, &headers).await
    };
    // Whatever the outcome, the client's turn is durable before it hears back. An answer's own
    // fsync (or a stream's) already covered it, so this usually returns at once.
    let durable = gateway.engine.make_durable(turn_writes).await;
    match (answered, durable) {
        (Err(error), _) | (Ok(_), Err(error)) => Err(error),
        (Ok(response), Ok(())) => Ok(response),
    }
}

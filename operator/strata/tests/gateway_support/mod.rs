//! Shared test support: an in-process fake upstream speaking the OpenAI and Anthropic APIs (JSON and
//! SSE, usage with cached tokens, scripted tool calls, errors and delays) and a gateway launcher.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use strata::gateway::{GatewayArgs, RunningGateway};
use strata_api::agent::{Provider, SessionMode, Tokenizer};
use strata_api::effective::EffectivePolicy;
use strata_api::gateway_config::{
    AgentIdentity, GATEWAY_CONFIG_VERSION, GatewayConfig, StablePrefixConfig, UpstreamConfig,
};

pub mod corpus;
pub mod process;

/// Cached prompt tokens the fake reports on every call.
pub const CACHED_TOKENS: u64 = 7;
/// The API key the gateway is configured with.
pub const API_KEY: &str = "sk-test-upstream-key";
/// The tenant cache key in every test config.
pub const CACHE_KEY: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// What the fake model answers next.
#[derive(Clone, Debug)]
pub enum Reply {
    /// A text answer.
    Text(String),
    /// Tool calls `(id, name, arguments JSON)`, optionally with text before them.
    Calls(String, Vec<(String, String, String)>),
    /// An error status with a body.
    Error(u16, String),
    /// Sleep, then answer.
    Delayed(Duration, Box<Reply>),
    /// Answer slowly: a pause before each SSE event of a stream, or between the two halves of a
    /// JSON body (so a client or a crash can land mid-answer).
    Paced(Duration, Box<Reply>),
    /// Exactly this HTTP answer, whatever the request asked for (faults: malformed or cut streams,
    /// non-JSON bodies, headers such as `retry-after`).
    Raw(RawReply),
}

/// A scripted HTTP answer.
#[derive(Clone, Debug)]
pub struct RawReply {
    /// Its status.
    pub status: u16,
    /// Its headers.
    pub headers: Vec<(String, String)>,
    /// Its body.
    pub body: String,
    /// Whether the connection fails after the body was sent (instead of ending the body cleanly):
    /// the client sees the body reset mid-way.
    pub reset_after_body: bool,
}

impl RawReply {
    /// A 200 of `content_type` with `body`, ended cleanly.
    pub fn ok(content_type: &str, body: impl Into<String>) -> Reply {
        Reply::Raw(RawReply {
            status: 200,
            headers: vec![("content-type".into(), content_type.into())],
            body: body.into(),
            reset_after_body: false,
        })
    }

    fn into_response(self) -> Response {
        let RawReply { status, headers, body, reset_after_body } = self;
        let mut response = if reset_after_body {
            let chunks: Vec<Result<bytes::Bytes, std::io::Error>> = vec![
                Ok(bytes::Bytes::from(body)),
                Err(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "fake upstream reset")),
            ];
            Response::new(Body::from_stream(futures::stream::iter(chunks)))
        } else {
            Response::new(Body::from(body))
        };
        *response.status_mut() = StatusCode::from_u16(status).unwrap();
        for (name, value) in headers {
            response
                .headers_mut()
                .insert(header::HeaderName::from_bytes(name.as_bytes()).unwrap(), value.parse().unwrap());
        }
        response
    }
}

/// A tool call for [`Reply::Calls`].
pub fn call(id: &str, name: &str, arguments: Value) -> (String, String, String) {
    (id.to_owned(), name.to_owned(), arguments.to_string())
}

/// One request the fake received.
#[derive(Clone, Debug)]
pub struct Seen {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Value,
    pub raw: String,
}

/// Answers every request for one model, whatever the script says (a summariser model beside the
/// agent's, called at times the test does not control).
pub type ModelResponder = Arc<dyn Fn(&Value) -> Reply + Send + Sync>;

#[derive(Default)]
struct FakeState {
    script: Mutex<VecDeque<Reply>>,
    seen: Mutex<Vec<Seen>>,
    by_model: Mutex<Vec<(String, ModelResponder)>>,
}

/// The fake upstream.
#[derive(Clone)]
pub struct FakeUpstream {
    pub address: SocketAddr,
    state: Arc<FakeState>,
    /// Over TLS: the application protocol agreed by ALPN on each connection (`h2`, `http/1.1`, or
    /// `none`), in the order the connections were made.
    pub negotiated: Arc<Mutex<Vec<String>>>,
}

impl FakeUpstream {
    /// Starts the fake on 127.0.0.1:0.
    pub async fn start() -> Self {
        Self::serve(tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap())
    }

    fn router(state: &Arc<FakeState>) -> Router {
        Router::new()
            .route("/v1/chat/completions", post(openai))
            .route("/v1/messages", post(anthropic))
            .route("/v1/models", get(models))
            .with_state(Arc::clone(state))
    }

    /// Starts the fake on `listener`.
    pub fn serve(listener: tokio::net::TcpListener) -> Self {
        let state = Arc::new(FakeState::default());
        let router = Self::router(&state);
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        Self { address, state, negotiated: Arc::default() }
    }

    /// Starts the fake on `listener` behind TLS with `tls`: HTTP/2 when the client agrees to it by
    /// ALPN, HTTP/1.1 otherwise.
    pub fn serve_tls(listener: tokio::net::TcpListener, tls: rustls::ServerConfig) -> Self {
        use hyper_util::rt::{TokioExecutor, TokioIo};
        use tower::ServiceExt;
        let state = Arc::new(FakeState::default());
        let router = Self::router(&state);
        let negotiated: Arc<Mutex<Vec<String>>> = Arc::default();
        let address = listener.local_addr().unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let seen = Arc::clone(&negotiated);
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let (acceptor, router, seen) = (acceptor.clone(), router.clone(), Arc::clone(&seen));
                tokio::spawn(async move {
                    // A client that refuses the certificate ends the handshake: nothing to serve.
                    let Ok(stream) = acceptor.accept(stream).await else { return };
                    let protocol = stream.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
                    let name = protocol
                        .as_deref()
                        .map_or("none".into(), |p| String::from_utf8_lossy(p).into_owned());
                    seen.lock().unwrap().push(name);
                    let service =
                        hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                            router.clone().oneshot(request.map(Body::new))
                        });
                    let io = TokioIo::new(stream);
                    let _ = if protocol.as_deref() == Some(b"h2".as_slice()) {
                        hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                            .serve_connection(io, service)
                            .await
                    } else {
                        hyper::server::conn::http1::Builder::new().serve_connection(io, service).await
                    };
                });
            }
        });
        Self { address, state, negotiated }
    }

    /// Queues replies.
    pub fn script(&self, replies: impl IntoIterator<Item = Reply>) {
        self.state.script.lock().unwrap().extend(replies);
    }

    /// Answers every request naming `model` with `responder` (the script is left alone).
    pub fn respond_to_model(&self, model: &str, responder: ModelResponder) {
        self.state.by_model.lock().unwrap().push((model.to_owned(), responder));
    }

    /// Drops the replies not used yet.
    pub fn unscript(&self) {
        self.state.script.lock().unwrap().clear();
    }

    /// Forgets the requests received so far (long runs keep the fake's memory bounded).
    pub fn forget_seen(&self) {
        self.state.seen.lock().unwrap().clear();
    }

    /// Every request received so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }

    /// The last request body received.
    pub fn last(&self) -> Value {
        self.seen().last().expect("the fake upstream received no request").body.clone()
    }

    /// Base URL for OpenAI-style configs.
    pub fn openai_endpoint(&self) -> String {
        format!("http://{}/v1", self.address)
    }

    /// Base URL for Anthropic configs.
    pub fn anthropic_endpoint(&self) -> String {
        format!("http://{}", self.address)
    }
}

fn next_reply(state: &FakeState, path: &str, headers: &HeaderMap, raw: &str) -> Reply {
    let body: Value = serde_json::from_str(raw).unwrap();
    let responder = body["model"].as_str().and_then(|model| {
        state.by_model.lock().unwrap().iter().find(|(name, _)| name == model).map(|(_, r)| Arc::clone(r))
    });
    let seen =
        Seen { path: path.to_owned(), headers: headers.clone(), body: body.clone(), raw: raw.to_owned() };
    state.seen.lock().unwrap().push(seen);
    if let Some(responder) = responder {
        return responder(&body);
    }
    state.script.lock().unwrap().pop_front().unwrap_or_else(|| Reply::Text("ok".into()))
}

/// The reply after its delays, and the pace to send it at.
async fn resolve(mut reply: Reply) -> (Reply, Option<Duration>) {
    let mut pace = None;
    loop {
        reply = match reply {
            Reply::Delayed(delay, next) => {
                tokio::time::sleep(delay).await;
                *next
            }
            Reply::Paced(every, next) => {
                pace = Some(every);
                *next
            }
            reply => return (reply, pace),
        };
    }
}

/// A body sent in `parts`, with `pace` before each part after the first.
fn paced_body(parts: Vec<String>, pace: Option<Duration>) -> Body {
    use futures::StreamExt;
    let Some(pace) = pace else {
        return Body::from(parts.concat());
    };
    let stream = futures::stream::iter(parts.into_iter().enumerate()).then(move |(index, part)| async move {
        if index > 0 {
            tokio::time::sleep(pace).await;
        }
        Ok::<_, std::io::Error>(bytes::Bytes::from(part))
    });
    Body::from_stream(stream)
}

fn prompt_tokens(body: &Value) -> u64 {
    (body.to_string().len() / 4) as u64 + CACHED_TOKENS
}

fn sse(events: Vec<(Option<&str>, Value)>, done: bool, pace: Option<Duration>) -> Response {
    let mut parts = Vec::new();
    for (event, data) in events {
        let mut text = String::new();
        if let Some(event) = event {
            text.push_str(&format!("event: {event}\n"));
        }
        text.push_str(&format!("data: {data}\n\n"));
        parts.push(text);
    }
    if done {
        parts.push("data: [DONE]\n\n".to_owned());
    }
    let mut response = Response::new(paced_body(parts, pace));
    response.headers_mut().insert(header::CONTENT_TYPE, "text/event-stream".parse().unwrap());
    response
}

/// The char boundary at or just after the middle of `text`.
fn middle_of(text: &str) -> usize {
    (text.len() / 2..=text.len()).find(|&at| text.is_char_boundary(at)).unwrap_or(text.len())
}

fn json_body(value: Value, pace: Option<Duration>) -> Response {
    let mut text = value.to_string();
    let second = text.split_off(middle_of(&text));
    let mut response = Response::new(paced_body(vec![text, second], pace));
    response.headers_mut().insert(header::CONTENT_TYPE, "application/json".parse().unwrap());
    response
}

fn error_response(status: u16, body: String) -> Response {
    let mut response = (StatusCode::from_u16(status).unwrap(), body).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, "application/json".parse().unwrap());
    response
}

async fn openai(State(state): State<Arc<FakeState>>, headers: HeaderMap, body: String) -> Response {
    let (reply, pace) = resolve(next_reply(&state, "/v1/chat/completions", &headers, &body)).await;
    if let Reply::Raw(raw) = reply {
        return raw.into_response();
    }
    let body: Value = serde_json::from_str(&body).unwrap();
    let prompt = prompt_tokens(&body);
    let usage = json!({"prompt_tokens": prompt, "completion_tokens": 5, "total_tokens": prompt + 5,
        "prompt_tokens_details": {"cached_tokens": CACHED_TOKENS}});
    let (text, calls) = match reply {
        Reply::Text(text) => (text, vec![]),
        Reply::Calls(text, calls) => (text, calls),
        Reply::Error(status, body) => return error_response(status, body),
        Reply::Delayed(..) | Reply::Paced(..) | Reply::Raw(_) => unreachable!(),
    };
    let finish = if calls.is_empty() { "stop" } else { "tool_calls" };
    if body["stream"] != json!(true) {
        let mut message = json!({"role": "assistant", "content": if text.is_empty() { Value::Null } else { text.clone().into() }});
        if !calls.is_empty() {
            message["tool_calls"] = calls
                .iter()
                .map(|(id, name, args)| json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}}))
                .collect();
        }
        return json_body(
            json!({"id": "chatcmpl-fake", "object": "chat.completion", "created": 1, "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": usage}),
            pace,
        );
    }
    let chunk = |delta: Value, finish: Value| {
        (
            None,
            json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": body["model"],
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}),
        )
    };
    let mut events = vec![chunk(json!({"role": "assistant", "content": ""}), Value::Null)];
    let middle = middle_of(&text);
    if !text.is_empty() {
        events.push(chunk(json!({"content": &text[..middle]}), Value::Null));
        events.push(chunk(json!({"content": &text[middle..]}), Value::Null));
    }
    for (index, (id, name, args)) in calls.iter().enumerate() {
        events.push(chunk(
            json!({"tool_calls": [{"index": index, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}]}),
            Value::Null,
        ));
        let half = middle_of(args);
        events.push(chunk(
            json!({"tool_calls": [{"index": index, "function": {"arguments": &args[..half]}}]}),
            Value::Null,
        ));
        events.push(chunk(
            json!({"tool_calls": [{"index": index, "function": {"arguments": &args[half..]}}]}),
            Value::Null,
        ));
    }
    events.push(chunk(json!({}), finish.into()));
    if body["stream_options"]["include_usage"] == json!(true) {
        events.push((
            None,
            json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1,
            "model": body["model"], "choices": [], "usage": usage}),
        ));
    }
    sse(events, true, pace)
}

async fn anthropic(State(state): State<Arc<FakeState>>, headers: HeaderMap, body: String) -> Response {
    let (reply, pace) = resolve(next_reply(&state, "/v1/messages", &headers, &body)).await;
    if let Reply::Raw(raw) = reply {
        return raw.into_response();
    }
    let body: Value = serde_json::from_str(&body).unwrap();
    let prompt = prompt_tokens(&body);
    let usage = json!({"input_tokens": prompt - CACHED_TOKENS - 3, "cache_read_input_tokens": CACHED_TOKENS,
        "cache_creation_input_tokens": 3, "output_tokens": 5});
    let (text, calls) = match reply {
        Reply::Text(text) => (text, vec![]),
        Reply::Calls(text, calls) => (text, calls),
        Reply::Error(status, body) => return error_response(status, body),
        Reply::Delayed(..) | Reply::Paced(..) | Reply::Raw(_) => unreachable!(),
    };
    let stop = if calls.is_empty() { "end_turn" } else { "tool_use" };
    let mut content: Vec<Value> = Vec::new();
    if !text.is_empty() {
        content.push(json!({"type": "text", "text": text}));
    }
    for (id, name, args) in &calls {
        content.push(json!({"type": "tool_use", "id": id, "name": name, "input": serde_json::from_str::<Value>(args).unwrap()}));
    }
    if body["stream"] != json!(true) {
        return json_body(
            json!({"id": "msg_fake", "type": "message", "role": "assistant", "model": body["model"],
            "content": content, "stop_reason": stop, "usage": usage}),
            pace,
        );
    }
    let mut events = vec![(
        Some("message_start"),
        json!({"type": "message_start", "message": {"id": "msg_fake", "type": "message", "role": "assistant",
            "content": [], "model": body["model"], "usage": usage}}),
    )];
    for (index, block) in content.iter().enumerate() {
        let mut start = block.clone();
        if block["type"] == "text" {
            start["text"] = "".into();
        } else {
            start["input"] = json!({});
        }
        events.push((
            Some("content_block_start"),
            json!({"type": "content_block_start", "index": index, "content_block": start}),
        ));
        let delta = if block["type"] == "text" {
            json!({"type": "text_delta", "text": block["text"]})
        } else {
            json!({"type": "input_json_delta", "partial_json": block["input"].to_string()})
        };
        events.push((
            Some("content_block_delta"),
            json!({"type": "content_block_delta", "index": index, "delta": delta}),
        ));
        events.push((Some("content_block_stop"), json!({"type": "content_block_stop", "index": index})));
    }
    events.push((
        Some("message_delta"),
        json!({"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": 5}}),
    ));
    events.push((Some("message_stop"), json!({"type": "message_stop"})));
    sse(events, false, pace)
}

async fn models() -> Response {
    json_body(json!({"object": "list", "data": [{"id": "fake-model", "object": "model"}]}), None)
}

/// A gateway config for `provider` in front of `fake`.
pub fn config(fake: &FakeUpstream, provider: Provider, dir: &Path) -> GatewayConfig {
    let key_file = dir.join("api-key");
    std::fs::write(&key_file, format!("{API_KEY}\n")).unwrap();
    let endpoint =
        if provider == Provider::Anthropic { fake.anthropic_endpoint() } else { fake.openai_endpoint() };
    GatewayConfig {
        version: GATEWAY_CONFIG_VERSION,
        agent: AgentIdentity {
            name: "builder".into(),
            namespace: "rateright".into(),
            privacy_scope: "tenant".into(),
            uid: None,
            adopt_journal_from_uid: None,
        },
        upstream: UpstreamConfig {
            provider,
            model: "fake-model".into(),
            endpoint,
            context_window: 128_000,
            tokenizer: Tokenizer::O200kBase,
            api_key_file: Some(key_file.display().to_string()),
            timeout_seconds: 30,
        },
        policy: EffectivePolicy::default(),
        stable_prefix: StablePrefixConfig {
            system_prompt: "You are builder, a careful coding agent.".into(),
            tools: vec![],
            constants: Default::default(),
        },
        cache_key: CACHE_KEY.into(),
        cache_key_short: CACHE_KEY[..16].into(),
        cache_epoch: 0,
        session_mode: SessionMode::Transparent,
    }
}

/// Writes `config` to `path`.
pub fn write_config(path: &Path, config: &GatewayConfig) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(config).unwrap()).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A gateway under test with its directories.
pub struct Harness {
    pub dir: tempfile::TempDir,
    pub config_path: PathBuf,
    pub data_dir: PathBuf,
    pub gateway: RunningGateway,
    pub client: reqwest::Client,
}

/// Arguments for a gateway on loopback ports chosen by the OS.
pub fn args(config_path: &Path, data_dir: &Path) -> GatewayArgs {
    GatewayArgs {
        config: config_path.to_owned(),
        data_dir: data_dir.to_owned(),
        listen: "127.0.0.1:0".parse().unwrap(),
        metrics_listen: "127.0.0.1:0".parse().unwrap(),
        max_body_bytes: 1024 * 1024,
        max_upstream_response_bytes: strata::gateway::DEFAULT_MAX_RESPONSE_BYTES,
        max_held_bytes: strata::gateway::DEFAULT_MAX_HELD_BYTES,
        summarizer_api_key_file: config_path.with_file_name("summarizer-api-key"),
        worker_threads: strata::gateway::DEFAULT_WORKER_THREADS,
        log: strata::logging::LogArgs::default(),
    }
}

impl Harness {
    /// Starts a gateway with `config` (edited by `adjust`).
    pub async fn start(
        fake: &FakeUpstream,
        provider: Provider,
        adjust: impl FnOnce(&mut GatewayConfig),
    ) -> Self {
        Self::start_with(fake, provider, adjust, |_| {}).await
    }

    /// Starts a gateway with `config` (edited by `adjust`) and arguments edited by `adjust_args`.
    pub async fn start_with(
        fake: &FakeUpstream,
        provider: Provider,
        adjust: impl FnOnce(&mut GatewayConfig),
        adjust_args: impl FnOnce(&mut GatewayArgs),
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut config = config(fake, provider, dir.path());
        adjust(&mut config);
        let config_path = dir.path().join("gateway.json");
        write_config(&config_path, &config);
        let data_dir = dir.path().join("data");
        let mut gateway_args = args(&config_path, &data_dir);
        adjust_args(&mut gateway_args);
        let gateway = strata::gateway::start(&gateway_args).await.unwrap();
        Self { dir, config_path, data_dir, gateway, client: reqwest::Client::new() }
    }

    /// Stops the gateway and starts a new one on the same config and data dir.
    pub async fn restart(self) -> Self {
        let Harness { dir, config_path, data_dir, gateway, client } = self;
        gateway.shutdown().await;
        let gateway = strata::gateway::start(&args(&config_path, &data_dir)).await.unwrap();
        Harness { dir, config_path, data_dir, gateway, client }
    }

    /// URL of `path` on the gateway.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.gateway.address)
    }

    /// POSTs JSON and returns status and body text.
    pub async fn post(&self, path: &str, body: &Value, headers: &[(&str, &str)]) -> (u16, String) {
        let mut request = self.client.post(self.url(path)).json(body);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.text().await.unwrap())
    }

    /// POSTs `body` as it is (its keys in the order written) and parses a JSON answer.
    pub async fn post_text_json(&self, path: &str, body: String) -> (u16, Value) {
        let request = self.client.post(self.url(path)).header("content-type", "application/json").body(body);
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}")))
    }

    /// POSTs JSON and parses a JSON answer.
    pub async fn post_json(&self, path: &str, body: &Value, headers: &[(&str, &str)]) -> (u16, Value) {
        let (status, text) = self.post(path, body, headers).await;
        (status, serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}")))
    }

    /// GETs a JSON resource.
    pub async fn get_json(&self, path: &str) -> Value {
        self.client.get(self.url(path)).send().await.unwrap().json().await.unwrap()
    }

    /// The metrics text.
    pub async fn metrics(&self) -> String {
        let url = format!("http://{}/metrics", self.gateway.metrics_address);
        self.client.get(url).send().await.unwrap().text().await.unwrap()
    }

    /// The journal's entries as the gateway lists them.
    pub async fn entries(&self) -> Vec<Value> {
        self.get_json("/strata/v1/entries").await["entries"].as_array().unwrap().clone()
    }
}

/// The `data:` payloads of an SSE body, with their event names.
pub fn sse_events(text: &str) -> Vec<(Option<String>, String)> {
    let mut events = Vec::new();
    for block in text.split("\n\n").filter(|block| !block.trim().is_empty()) {
        let mut name = None;
        let mut data = Vec::new();
        for line in block.lines() {
            if let Some(value) = line.strip_prefix("event: ") {
                name = Some(value.to_owned());
            } else if let Some(value) = line.strip_prefix("data: ") {
                data.push(value);
            }
        }
        events.push((name, data.join("\n")));
    }
    events
}

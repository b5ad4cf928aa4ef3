//! The provider abstraction: everything that differs between the OpenAI and the Anthropic wire
//! formats (paths, credentials, request and answer shapes, streams, error envelopes), behind one
//! trait with one implementation per API. The round loop in `pipeline.rs` is written once against it.

use axum::http::{HeaderMap, HeaderValue, header};
use bytes::Bytes;
use serde_json::{Map, Value, json};
use strata_api::agent::Provider;
use strata_core::session::message_memo::{MessageMemo, ReadMessages, Recollection};
use strata_core::session::tool_block::ToolBlocks;
use strata_core::session::{Api, AssistantOutput, ChatRequest, Usage};

use super::errors::GatewayError;
use super::sse::SseEvent;
use super::{answer_wire, anthropic, openai};

/// The Anthropic API version sent when the client names none.
pub const DEFAULT_ANTHROPIC_VERSION: &str = "2023-06-01";

/// A credential as a header value, marked sensitive (kept out of debug output and HTTP/2 header
/// compression tables).
fn secret_header(value: &str) -> Result<HeaderValue, String> {
    let mut header = HeaderValue::from_str(value).map_err(|_| {
        "the API key holds characters an HTTP header cannot carry; rewrite the key file (upstream.apiKeyFile) with the key alone".to_owned()
    })?;
    header.set_sensitive(true);
    Ok(header)
}

/// A client's request, parsed, and what the message memo is to keep of it.
#[derive(Debug)]
pub struct ParsedRequest {
    /// The request in neutral form.
    pub request: ChatRequest,
    /// Its messages, remembered once the engine has chain-hashed their turns.
    pub recollection: Recollection,
    /// Messages in the request.
    pub messages: usize,
    /// Of those, the ones taken from the memo rather than parsed.
    pub reused_messages: usize,
}

impl ParsedRequest {
    /// `request` with the turns and known chain values of `read`, the reading of its body's
    /// `messages` (`messages` of them).
    pub fn with_messages(mut request: ChatRequest, read: ReadMessages, messages: usize) -> Self {
        request.turns = read.turns;
        request.known_chains = read.known_chains;
        request.hollow_turns = read.hollow_turns;
        Self { request, recollection: read.recollection, messages, reused_messages: read.reused_messages }
    }
}

/// An upstream answer's JSON tree; an answer that is not JSON is the upstream's protocol error.
fn answer_tree(bytes: &[u8]) -> Result<Value, GatewayError> {
    serde_json::from_slice(bytes)
        .map_err(|error| GatewayError::UpstreamProtocol(format!("answer is not JSON: {error}")))
}

/// One provider API as the gateway speaks it, to clients and to the upstream.
pub trait ProviderAdapter: Sync {
    /// The API, as the session engine knows it.
    fn api(&self) -> Api;
    /// Its name in metrics, operation ids and the Inspector.
    fn name(&self) -> &'static str;
    /// The path clients send chat requests to.
    fn client_path(&self) -> &'static str;
    /// The chat path on the upstream, relative to its API base.
    fn upstream_path(&self) -> &'static str;
    /// Whether an upstream of `provider` speaks this API.
    fn serves(&self, provider: Provider) -> bool;
    /// The client's request, parsed; messages equal to those `memo` remembers are taken from it,
    /// and a tool block equal to the last one `tools` read is that one.
    fn parse_request(
        &self,
        body: &Bytes,
        memo: MessageMemo,
        tools: &ToolBlocks,
    ) -> Result<ParsedRequest, GatewayError>;
    /// A complete (non-streaming) upstream answer, parsed.
    fn parse_answer(&self, value: Value) -> Result<AssistantOutput, GatewayError>;
    /// A complete upstream answer of this API's usual shape, read straight into its fields (without
    /// the `raw` tree, see [`super::answer_wire`]); `None` when it takes the JSON tree to read it.
    fn usual_answer(&self, bytes: &[u8]) -> Option<AssistantOutput>;
    /// A complete upstream answer from its bytes: [`Self::usual_answer`] when it has the usual
    /// shape, parsed whole otherwise.
    fn read_answer(&self, bytes: &[u8]) -> Result<AssistantOutput, GatewayError> {
        match self.usual_answer(bytes) {
            Some(output) => Ok(output),
            None => self.parse_answer(answer_tree(bytes)?),
        }
    }
    /// Whether the answer stopped at its output-token limit.
    fn stopped_at_limit(&self, output: &AssistantOutput) -> bool;
    /// The texts of a request's rounds as one assistant text, the way the client sees them.
    fn join_texts(&self, texts: &[String]) -> String;
    /// The client's (non-streaming) answer: the final round, with the earlier rounds' texts and the
    /// usage of all rounds.
    fn client_response(&self, output: &AssistantOutput, earlier_texts: &[String], total: &Usage) -> Value;
    /// Whether the answer of a request's only round reaches the client as the upstream sent it:
    /// [`Self::client_response`] would change nothing in it but its key order and the form of its
    /// usage, which is that round's alone.
    fn answer_passes_as_sent(&self, output: &AssistantOutput) -> bool;
    /// A translator of this API's upstream stream into one client stream.
    fn stream_translator(&self, wants_usage: bool) -> Box<dyn StreamTranslation>;
    /// An error body: `kind` and `message`, plus `details` merged into the error object.
    fn error_body(&self, kind: &str, message: &str, details: Map<String, Value>) -> Value;
    /// An error as the last event of a client stream.
    fn stream_error_event(&self, body: &str) -> Bytes;
    /// Adds the provider's credentials and version headers to an upstream request's `headers`; an
    /// API key that an HTTP header cannot carry is refused with the reason.
    fn authenticate(
        &self,
        headers: &mut HeaderMap,
        api_key: Option<&str>,
        client_sent_version: bool,
    ) -> Result<(), String>;
    /// The URL of `path` under an upstream `base`.
    fn url(&self, base: &str, path: &str) -> String;
    /// Adds this API's upstream fields to a request body's head: the prefix-cache hint of an upstream
    /// of `provider` (keyed by `cache_key`) and, for a stream, what makes it report usage.
    fn add_upstream_fields(
        &self,
        head: &mut Map<String, Value>,
        provider: Provider,
        cache_key: &str,
        stream: bool,
    );
}

/// One request's upstream stream, round after round, translated into the client's stream.
pub trait StreamTranslation: Send {
    /// Handles one upstream event; returns the bytes to forward to the client.
    fn on_event(&mut self, event: &SseEvent) -> Result<Option<Bytes>, GatewayError>;
    /// Whether the current round's stream ended properly.
    fn round_complete(&self) -> bool;
    /// The round's answer; the translator is ready for the next round.
    fn finish_round(&mut self) -> AssistantOutput;
    /// The events that close the client's stream, with the usage of all rounds.
    fn closing(&self, total: &Usage) -> Vec<Bytes>;
    /// Arms the next round: when the model calls one of `summarised` (tools it saw only as a
    /// summary) before anything of the round reached the client, the whole round is held back.
    fn hold_summarised(&mut self, summarised: Vec<String>);
    /// Whether the round just read was held back, to be repeated once the schemas are loaded.
    fn held_for_retry(&self) -> bool;
}

/// The OpenAI chat-completions API (OpenAI and OpenAI-compatible upstreams).
#[derive(Debug)]
pub struct OpenAiAdapter;

/// The Anthropic messages API.
#[derive(Debug)]
pub struct AnthropicAdapter;

/// The adapter of `api`.
pub fn adapter(api: Api) -> &'static dyn ProviderAdapter {
    match api {
        Api::OpenAi => &OpenAiAdapter,
        Api::Anthropic => &AnthropicAdapter,
    }
}

/// The adapter of the API an upstream of `provider` speaks.
pub fn adapter_for(provider: Provider) -> &'static dyn ProviderAdapter {
    adapter(crate::engine_policy::api_of(provider))
}

impl ProviderAdapter for OpenAiAdapter {
    fn api(&self) -> Api {
        Api::OpenAi
    }

    fn name(&self) -> &'static str {
        "openai"
    }

    fn client_path(&self) -> &'static str {
        "/v1/chat/completions"
    }

    fn upstream_path(&self) -> &'static str {
        "chat/completions"
    }

    fn serves(&self, provider: Provider) -> bool {
        matches!(provider, Provider::OpenAI | Provider::OpenAICompatible)
    }

    fn parse_request(
        &self,
        body: &Bytes,
        memo: MessageMemo,
        tools: &ToolBlocks,
    ) -> Result<ParsedRequest, GatewayError> {
        openai::parse_request(body, memo, tools)
    }

    fn parse_answer(&self, value: Value) -> Result<AssistantOutput, GatewayError> {
        openai::parse_response(value)
    }

    fn usual_answer(&self, bytes: &[u8]) -> Option<AssistantOutput> {
        answer_wire::openai_answer(bytes)
    }

    fn stopped_at_limit(&self, output: &AssistantOutput) -> bool {
        output.stop_reason == "length"
    }

    fn join_texts(&self, texts: &[String]) -> String {
        texts.concat()
    }

    fn client_response(&self, output: &AssistantOutput, earlier_texts: &[String], total: &Usage) -> Value {
        openai::client_response(output, &earlier_texts.concat(), total)
    }

    fn answer_passes_as_sent(&self, output: &AssistantOutput) -> bool {
        openai::answer_passes_as_sent(output)
    }

    fn stream_translator(&self, wants_usage: bool) -> Box<dyn StreamTranslation> {
        Box::new(openai::StreamTranslator::new(wants_usage))
    }

    fn error_body(&self, kind: &str, message: &str, details: Map<String, Value>) -> Value {
        let mut error = json!({"message": message, "type": kind, "param": null, "code": kind});
        if let Some(fields) = error.as_object_mut() {
            fields.extend(details);
        }
        json!({"error": error})
    }

    fn stream_error_event(&self, body: &str) -> Bytes {
        super::sse::encode(None, body)
    }

    fn authenticate(
        &self,
        headers: &mut HeaderMap,
        api_key: Option<&str>,
        _client_sent_version: bool,
    ) -> Result<(), String> {
        if let Some(key) = api_key {
            headers.insert(header::AUTHORIZATION, secret_header(&format!("Bearer {key}"))?);
        }
        Ok(())
    }

    fn url(&self, base: &str, path: &str) -> String {
        // Joined in one allocation of the final size, without the formatting machinery: every
        // request names its URL.
        [base, "/", path].concat()
    }

    fn add_upstream_fields(
        &self,
        head: &mut Map<String, Value>,
        provider: Provider,
        cache_key: &str,
        stream: bool,
    ) {
        // OpenAI routes by `prompt_cache_key`; vLLM-style compatible servers salt their prefix cache.
        let hint = if provider == Provider::OpenAI { "prompt_cache_key" } else { "cache_salt" };
        head.insert(hint.into(), cache_key.into());
        if stream {
            head.insert("stream_options".into(), json!({"include_usage": true}));
        }
    }
}

impl ProviderAdapter for AnthropicAdapter {
    fn api(&self) -> Api {
        Api::Anthropic
    }

    fn name(&self) -> &'static str {
        "anthropic"
    }

    fn client_path(&self) -> &'static str {
        "/v1/messages"
    }

    fn upstream_path(&self) -> &'static str {
        "messages"
    }

    fn serves(&self, provider: Provider) -> bool {
        provider == Provider::Anthropic
    }

    fn parse_request(
        &self,
        body: &Bytes,
        memo: MessageMemo,
        tools: &ToolBlocks,
    ) -> Result<ParsedRequest, GatewayError> {
        anthropic::parse_request(body, memo, tools)
    }

    fn parse_answer(&self, value: Value) -> Result<AssistantOutput, GatewayError> {
        anthropic::parse_response(value)
    }

    fn usual_answer(&self, bytes: &[u8]) -> Option<AssistantOutput> {
        answer_wire::anthropic_answer(bytes)
    }

    fn stopped_at_limit(&self, output: &AssistantOutput) -> bool {
        output.stop_reason == "max_tokens"
    }

    fn join_texts(&self, texts: &[String]) -> String {
        anthropic::join_texts(texts.iter().map(String::as_str))
    }

    fn client_response(&self, output: &AssistantOutput, earlier_texts: &[String], total: &Usage) -> Value {
        anthropic::client_response(output, earlier_texts, total)
    }

    fn answer_passes_as_sent(&self, output: &AssistantOutput) -> bool {
        anthropic::answer_passes_as_sent(output)
    }

    fn stream_translator(&self, _wants_usage: bool) -> Box<dyn StreamTranslation> {
        Box::new(anthropic::StreamTranslator::default())
    }

    fn error_body(&self, kind: &str, message: &str, details: Map<String, Value>) -> Value {
        let mut error = json!({"type": kind, "message": message});
        if let Some(fields) = error.as_object_mut() {
            fields.extend(details);
        }
        json!({"type": "error", "error": error})
    }

    fn stream_error_event(&self, body: &str) -> Bytes {
        super::sse::encode(Some("error"), body)
    }

    fn authenticate(
        &self,
        headers: &mut HeaderMap,
        api_key: Option<&str>,
        client_sent_version: bool,
    ) -> Result<(), String> {
        if !client_sent_version {
            headers.insert("anthropic-version", HeaderValue::from_static(DEFAULT_ANTHROPIC_VERSION));
        }
        if let Some(key) = api_key {
            headers.insert("x-api-key", secret_header(key)?);
        }
        Ok(())
    }

    fn url(&self, base: &str, path: &str) -> String {
        if base.ends_with("/v1") { [base, "/", path].concat() } else { [base, "/v1/", path].concat() }
    }

    fn add_upstream_fields(&self, _: &mut Map<String, Value>, _: Provider, _: &str, _: bool) {
        // Anthropic's cache is addressed by breakpoints in the body, and its streams report usage.
    }
}

impl StreamTranslation for openai::StreamTranslator {
    fn on_event(&mut self, event: &SseEvent) -> Result<Option<Bytes>, GatewayError> {
        openai::StreamTranslator::on_event(self, &event.data)
    }

    fn round_complete(&self) -> bool {
        openai::StreamTranslator::round_complete(self)
    }

    fn finish_round(&mut self) -> AssistantOutput {
        openai::StreamTranslator::finish_round(self)
    }

    fn hold_summarised(&mut self, summarised: Vec<String>) {
        openai::StreamTranslator::hold_summarised(self, summarised);
    }

    fn held_for_retry(&self) -> bool {
        openai::StreamTranslator::held_for_retry(self)
    }

    fn closing(&self, total: &Usage) -> Vec<Bytes> {
        openai::StreamTranslator::closing(self, total)
    }
}

impl StreamTranslation for anthropic::StreamTranslator {
    fn on_event(&mut self, event: &SseEvent) -> Result<Option<Bytes>, GatewayError> {
        anthropic::StreamTranslator::on_event(self, event.event.as_deref(), &event.data)
    }

    fn round_complete(&self) -> bool {
        anthropic::StreamTranslator::round_complete(self)
    }

    fn finish_round(&mut self) -> AssistantOutput {
        anthropic::StreamTranslator::finish_round(self)
    }

    fn hold_summarised(&mut self, summarised: Vec<String>) {
        anthropic::StreamTranslator::hold_summarised(self, summarised);
    }

    fn held_for_retry(&self) -> bool {
        anthropic::StreamTranslator::held_for_retry(self)
    }

    fn closing(&self, _total: &Usage) -> Vec<Bytes> {
        anthropic::StreamTranslator::closing(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_api_has_its_adapter_and_each_provider_the_right_one() {
        for api in [Api::OpenAi, Api::Anthropic] {
            assert_eq!(adapter(api).api(), api);
        }
        assert_eq!(adapter_for(Provider::Anthropic).api(), Api::Anthropic);
        assert_eq!(adapter_for(Provider::OpenAI).api(), Api::OpenAi);
        assert_eq!(adapter_for(Provider::OpenAICompatible).api(), Api::OpenAi);
        assert!(adapter(Api::OpenAi).serves(Provider::OpenAICompatible));
        assert!(!adapter(Api::OpenAi).serves(Provider::Anthropic));
        assert!(!adapter(Api::Anthropic).serves(Provider::OpenAI));
    }

    #[test]
    fn anthropic_urls_gain_the_version_segment_once() {
        let anthropic = adapter(Api::Anthropic);
        assert_eq!(
            anthropic.url("https://api.anthropic.com", "messages"),
            "https://api.anthropic.com/v1/messages"
        );
        assert_eq!(anthropic.url("http://proxy/v1", "messages"), "http://proxy/v1/messages");
        assert_eq!(
            adapter(Api::OpenAi).url("http://proxy/v1", "chat/completions"),
            "http://proxy/v1/chat/completions"
        );
    }

    #[test]
    fn error_bodies_have_each_providers_envelope() {
        let mut details = Map::new();
        details.insert("level".into(), "critical".into());
        let openai = adapter(Api::OpenAi).error_body("invalid_request_error", "bad", details.clone());
        assert_eq!(openai["error"]["type"], "invalid_request_error");
        assert_eq!(openai["error"]["message"], "bad");
        assert_eq!(openai["error"]["level"], "critical");
        let anthropic = adapter(Api::Anthropic).error_body("invalid_request_error", "bad", details);
        assert_eq!(anthropic["type"], "error");
        assert_eq!(anthropic["error"]["type"], "invalid_request_error");
        assert_eq!(anthropic["error"]["level"], "critical");
    }
}

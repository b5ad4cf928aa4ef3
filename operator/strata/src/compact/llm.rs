//! The LLM summariser: OpenAI chat completions (json_schema response format) or Anthropic messages
//! (JSON instruction), validated against the CompactedState schema, one repair retry, and delta
//! chunking so no request exceeds the input bound.

use std::time::Duration;

use crate::gateway::connector::{
    ProxiedConnector, UpstreamConnector, error_chain, pooled_client, request_failure,
};
use crate::gateway::provider::adapter_for;
use axum::http::{HeaderMap, HeaderValue, Request, Uri, header};
use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use serde_json::{Value, json};
use strata_api::agent::Provider;
use strata_core::compaction::{
    CompactedState, SummarizeError, Summarizer, SummaryFuture, SummaryInput, chunk_delta,
};
use strata_core::session::Api;

/// Where and how to call the summariser model.
#[derive(Debug, Clone)]
pub struct LlmSettings {
    /// Provider API.
    pub provider: Provider,
    /// Base URL, e.g. `https://api.openai.com/v1` or `https://api.anthropic.com`.
    pub endpoint: String,
    /// Model name.
    pub model: String,
    /// API key, if the endpoint needs one.
    pub api_key: Option<String>,
    /// Limit for one request.
    pub timeout: Duration,
    /// Output bound in tokens.
    pub max_output_tokens: u32,
    /// Input bound per request in characters (the delta is chunked to fit).
    pub max_input_chars: usize,
}

/// How long an idle connection to the summariser's model is kept open.
const IDLE_CONNECTION_TIMEOUT: Duration = Duration::from_secs(90);

/// The largest summariser answer read; a larger one is refused (a CompactedState is a few KB).
const MAX_REPLY_BYTES: usize = 8 * 1024 * 1024;

/// A summariser backed by a chat model.
#[derive(Clone)]
pub struct LlmSummarizer {
    client: Client<UpstreamConnector, Full<Bytes>>,
    /// Which requests go through a proxy, for their `Proxy-Authorization`.
    proxied: ProxiedConnector,
    settings: LlmSettings,
}

impl std::fmt::Debug for LlmSummarizer {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("LlmSummarizer").field("settings", &self.settings).finish_non_exhaustive()
    }
}

/// One conversation turn sent to the model.
#[derive(Debug, Clone)]
struct Turn {
    role: &'static str,
    text: String,
}

impl LlmSummarizer {
    /// A summariser with its own HTTP client, built as the gateway's upstream client is: the same
    /// connector (TLS with the platform's roots and the ring provider, HTTP/2 by ALPN, the
    /// environment's proxy, a 10 s connect timeout).
    pub fn new(settings: LlmSettings) -> Result<Self, String> {
        let (client, proxied) = pooled_client(IDLE_CONNECTION_TIMEOUT)?;
        Ok(Self { client, proxied, settings })
    }

    async fn summarize_chunks(&self, input: &SummaryInput) -> Result<CompactedState, SummarizeError> {
        let chunks = chunk_delta(&input.delta, self.settings.max_input_chars);
        let mut state = input.previous.clone();
        let total = chunks.len();
        for (index, chunk) in chunks.iter().enumerate() {
            let prompt = self.prompt(input, state.as_ref(), chunk, index + 1, total);
            state = Some(self.call_validated(prompt).await?);
        }
        state.ok_or_else(|| SummarizeError::InvalidOutput("no chunk was summarised".into()))
    }

    fn prompt(
        &self,
        input: &SummaryInput,
        previous: Option<&CompactedState>,
        chunk: &str,
        index: usize,
        total: usize,
    ) -> String {
        let previous = previous
            .and_then(|state| serde_json::to_string_pretty(state).ok())
            .unwrap_or_else(|| "none (this is the first compaction)".into());
        let findings = &input.findings;
        let mut must = String::new();
        for question in &findings.open_questions {
            must.push_str(&format!(
                "- open_questions item (verbatim): {:?} from {}\n",
                question.text,
                question.source_ids.join(",")
            ));
        }
        for action in &findings.pending_actions {
            must.push_str(&format!(
                "- tool_state.pending_actions item: call_id {:?}, tool {:?}, arguments {:?}, source_id {:?}\n",
                action.call_id, action.tool, action.arguments, action.source_id
            ));
        }
        let retained: Vec<String> = input.retained.iter().map(ToString::to_string).collect();
        format!(
            "Update the CompactedState of an always-on agent. Merge the previous state with the new \
             entries (chunk {index} of {total}); keep every decision, constraint, open question, pending \
             tool action, approval and side effect that still holds, with the entry IDs it came from. \
             Drop nothing the agent needs to resume.\n\nPrevious state:\n{previous}\n\nNew entries:\n{chunk}\n\n\
             The new state must contain:\n{must}- privacy_scope: {:?}\n- resume_instruction: {:?}\n\
             - evidence_refs.entry_ids should list the entries kept verbatim: {}\n\n\
             Reply with one JSON object that matches the schema, and nothing else.",
            input.privacy_scope,
            input.resume_instruction,
            retained.join(", ")
        )
    }

    async fn call_validated(&self, prompt: String) -> Result<CompactedState, SummarizeError> {
        let mut turns = vec![Turn { role: "user", text: prompt }];
        let first = self.call(&turns).await?;
        let problem = match first.parse() {
            Ok(state) => return Ok(state),
            Err(problem) => problem,
        };
        turns.push(Turn { role: "assistant", text: first.text });
        turns.push(Turn {
            role: "user",
            text: format!(
                "That reply is not usable: {problem}. Reply again with only the complete, corrected JSON \
                 object matching the schema; be concise so it fits."
            ),
        });
        self.call(&turns).await?.parse().map_err(SummarizeError::InvalidOutput)
    }

    async fn call(&self, turns: &[Turn]) -> Result<Reply, SummarizeError> {
        let seconds = self.settings.timeout.as_secs();
        match tokio::time::timeout(self.settings.timeout, self.send(turns)).await {
            Ok(reply) => reply,
            Err(_) => Err(SummarizeError::Timeout { seconds }),
        }
    }

    async fn send(&self, turns: &[Turn]) -> Result<Reply, SummarizeError> {
        let settings = &self.settings;
        let base = settings.endpoint.trim_end_matches('/');
        let schema = model_schema();
        let instructions = "You compact the history of an always-on LLM agent into a CompactedState JSON \
                            object. Be dense and factual. Never invent entry IDs.";
        let adapter = adapter_for(settings.provider);
        let url = adapter.url(base, adapter.upstream_path());
        let body = match adapter.api() {
            Api::Anthropic => {
                let system =
                    format!("{instructions}\nThe JSON object must match this JSON Schema:\n{schema}");
                let messages: Vec<Value> =
                    turns.iter().map(|turn| json!({"role": turn.role, "content": turn.text})).collect();
                json!({
                    "model": settings.model,
                    "max_tokens": settings.max_output_tokens,
                    "system": system,
                    "messages": messages,
                })
            }
            Api::OpenAi => {
                let mut messages = vec![json!({"role": "system", "content": instructions})];
                messages.extend(turns.iter().map(|turn| json!({"role": turn.role, "content": turn.text})));
                json!({
                    "model": settings.model,
                    "messages": messages,
                    "max_completion_tokens": settings.max_output_tokens,
                    "response_format": {
                        "type": "json_schema",
                        "json_schema": {"name": "compacted_state", "strict": true, "schema": schema},
                    },
                })
            }
        };
        let unavailable = |reason: String| SummarizeError::Unavailable(format!("POST {url}: {reason}"));
        let (status, text) = self.post_json(&url, &body).await.map_err(unavailable)?;
        if !status.is_success() {
            let excerpt: String = text.chars().take(300).collect();
            return Err(SummarizeError::Unavailable(format!("POST {url}: HTTP {status}: {excerpt}")));
        }
        let value: Value = serde_json::from_str(&text).map_err(|error| {
            SummarizeError::Unavailable(format!("POST {url}: the reply is not JSON: {error}"))
        })?;
        let output = adapter
            .parse_answer(value)
            .map_err(|error| SummarizeError::Unavailable(format!("POST {url}: {error}")))?;
        Ok(Reply { truncated: adapter.stopped_at_limit(&output), text: output.text })
    }

    /// POSTs `body` as JSON to `url` with the provider's credentials; returns the status and the
    /// answer's text, read up to [`MAX_REPLY_BYTES`].
    async fn post_json(&self, url: &str, body: &Value) -> Result<(axum::http::StatusCode, String), String> {
        let uri: Uri = url.parse().map_err(|error| format!("not a valid URL: {error}"))?;
        let mut headers = HeaderMap::new();
        adapter_for(self.settings.provider).authenticate(
            &mut headers,
            self.settings.api_key.as_deref(),
            false,
        )?;
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(credentials) = self.proxied.proxy_authorization(&uri) {
            headers.insert(header::PROXY_AUTHORIZATION, credentials);
        }
        let mut request = Request::post(uri)
            .body(Full::new(Bytes::from(body.to_string())))
            .map_err(|error| format!("building the request: {error}"))?;
        *request.headers_mut() = headers;
        let response = self
            .client
            .request(request)
            .await
            .map_err(|error| request_failure(&error, "the summariser's model"))?;
        let status = response.status();
        let mut body = response.into_body();
        let mut text = BytesMut::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|error| format!("reading the answer: {}", error_chain(&error)))?;
            if let Ok(data) = frame.into_data() {
                if text.len() + data.len() > MAX_REPLY_BYTES {
                    return Err(format!("the answer is over {MAX_REPLY_BYTES} bytes"));
                }
                text.extend_from_slice(&data);
            }
        }
        let text = String::from_utf8(text.to_vec()).map_err(|_| "the answer is not UTF-8".to_owned())?;
        Ok((status, text))
    }
}

/// The model's answer.
struct Reply {
    text: String,
    truncated: bool,
}

impl Reply {
    fn parse(&self) -> Result<CompactedState, String> {
        match CompactedState::parse_validated(&self.text) {
            Ok(state) => Ok(state),
            Err(_) if self.truncated => {
                Err("the output was cut off at the token limit, so the JSON is incomplete".into())
            }
            Err(error) => Err(error.to_string()),
        }
    }
}

/// The CompactedState schema without the keywords model APIs reject at the top level.
fn model_schema() -> Value {
    let mut schema = CompactedState::json_schema();
    if let Some(object) = schema.as_object_mut() {
        object.remove("$schema");
        object.remove("title");
    }
    schema
}

impl Summarizer for LlmSummarizer {
    fn version(&self) -> String {
        let provider = match self.settings.provider {
            Provider::OpenAI => "openai",
            Provider::Anthropic => "anthropic",
            Provider::OpenAICompatible => "openai-compatible",
        };
        format!("{provider}:{}", self.settings.model)
    }

    fn summarize<'a>(&'a self, input: &'a SummaryInput) -> SummaryFuture<'a> {
        Box::pin(self.summarize_chunks(input))
    }
}

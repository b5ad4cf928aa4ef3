//! The HTTP client to the upstream provider: URLs, credentials, timeouts and error mapping.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, header};
use bytes::{Bytes, BytesMut};

use super::config::Settings;
use super::errors::GatewayError;
use super::provider::adapter_for;
use strata_core::session::render::body::ChunkedBody;

/// Client headers forwarded to the upstream.
const FORWARDED_HEADERS: [&str; 3] = ["anthropic-version", "anthropic-beta", "openai-organization"];

/// Upstream error headers passed to the client with the error (besides `content-type`): what a
/// client needs to back off and to quote the provider's request id.
const PASSED_ERROR_HEADERS: [&str; 4] = ["retry-after", "retry-after-ms", "x-request-id", "request-id"];

/// Prefixes of provider rate-limit headers passed to the client with an error.
const PASSED_ERROR_HEADER_PREFIXES: [&str; 2] = ["x-ratelimit-", "anthropic-ratelimit-"];

/// Attempts to connect to the upstream for one call before its error reaches the client.
const CONNECT_ATTEMPTS: u32 = 3;

/// Pause before the second connection attempt; the third waits twice as long.
const CONNECT_RETRY_PAUSE: Duration = Duration::from_millis(50);

/// Largest upstream answer read by default (32 MiB); a larger one is refused.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 32 * 1024 * 1024;

/// Request bodies smaller than this go upstream as one buffer (joined with one small copy), which
/// the HTTP client writes without polling a stream; larger ones are streamed from the body's
/// shared pieces, never copied whole. The bound keeps the joined buffer in jemalloc's small size
/// classes (up to 14 KiB): a larger one comes from fresh pages, which with the shipped
/// `dirty_decay_ms:0` are faulted in on every request (measured at up to 30 µs for 60 KB).
const WHOLE_BODY_BELOW_BYTES: usize = 14 * 1024;

/// Distinct upstream URLs kept parsed at most (an endpoint changes only with the config).
const PARSED_URLS_KEPT: usize = 16;

/// A request body as it is sent upstream.
enum Payload {
    Whole(Bytes),
    Pieces(Vec<Bytes>),
}

/// A failure building the HTTP client.
#[derive(Debug, thiserror::Error)]
#[error("building the upstream HTTP client: {reason}")]
pub struct ClientError {
    reason: String,
}

/// The upstream client, shared by all requests.
#[derive(Debug, Clone)]
pub struct Upstream {
    client: reqwest::Client,
    max_response_bytes: usize,
    /// Upstream URLs by their text, parsed once: parsing one (the host goes through IDNA
    /// processing) cost microseconds on every request.
    parsed_urls: Arc<Mutex<HashMap<String, reqwest::Url>>>,
}

fn base(settings: &Settings) -> String {
    let endpoint = settings.config.upstream.endpoint.trim_end_matches('/');
    if endpoint.is_empty() {
        settings.provider().default_endpoint().unwrap_or_default().to_owned()
    } else {
        endpoint.to_owned()
    }
}

/// The URL of `path` (`chat/completions`, `messages`, `models`) on the upstream.
pub fn url(settings: &Settings, path: &str) -> String {
    adapter_for(settings.provider()).url(&base(settings), path)
}

impl Upstream {
    /// A client with the given per-read timeout (streams may run longer in total) that reads
    /// answers of at most `max_response_bytes`.
    pub fn new(read_timeout: Duration, max_response_bytes: usize) -> Result<Self, ClientError> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .read_timeout(read_timeout)
            .pool_max_idle_per_host(1024)
            // A redirect is answered to the client as the upstream's status, never followed: a
            // followed 307 would resend the prompt, and a provider's key header, to another host.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|error| ClientError { reason: error.to_string() })?;
        Ok(Self { client, max_response_bytes, parsed_urls: Arc::default() })
    }

    fn request(
        &self,
        settings: &Settings,
        method: reqwest::Method,
        url: &str,
        client_headers: &HeaderMap,
    ) -> reqwest::RequestBuilder {
        let mut request = match self.parsed_url(url) {
            Some(parsed) => self.client.request(method, parsed),
            // Unparseable: reqwest reports it when the request is sent, as before.
            None => self.client.request(method, url),
        };
        for name in FORWARDED_HEADERS {
            if let Some(value) = client_headers.get(name) {
                request = request.header(name, value.as_bytes());
            }
        }
        let client_sent_version = client_headers.contains_key("anthropic-version");
        adapter_for(settings.provider()).authenticate(
            request,
            settings.api_key.as_deref(),
            client_sent_version,
        )
    }

    /// `text` parsed, from the cache when it was parsed before; `None` if it is not a URL.
    fn parsed_url(&self, text: &str) -> Option<reqwest::Url> {
        let mut parsed = self.parsed_urls.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(url) = parsed.get(text) {
            return Some(url.clone());
        }
        let url = reqwest::Url::parse(text).ok()?;
        if parsed.len() >= PARSED_URLS_KEPT {
            parsed.clear();
        }
        parsed.insert(text.to_owned(), url.clone());
        Some(url)
    }

    fn map_error(settings: &Settings, url: &str, error: reqwest::Error) -> GatewayError {
        if error.is_timeout() {
            GatewayError::UpstreamTimeout {
                url: url.to_owned(),
                seconds: settings.config.upstream.timeout_seconds,
            }
        } else {
            GatewayError::UpstreamUnreachable { url: url.to_owned(), reason: error.to_string() }
        }
    }

    /// The largest answer read, in bytes.
    pub fn max_response_bytes(&self) -> usize {
        self.max_response_bytes
    }

    async fn check(
        &self,
        settings: &Settings,
        response: reqwest::Response,
    ) -> Result<reqwest::Response, GatewayError> {
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status();
        let mut headers = HeaderMap::new();
        for (name, value) in response.headers() {
            let name_text = name.as_str();
            if name == header::CONTENT_TYPE
                || PASSED_ERROR_HEADERS.contains(&name_text)
                || PASSED_ERROR_HEADER_PREFIXES.iter().any(|prefix| name_text.starts_with(prefix))
            {
                headers.append(name.clone(), value.clone());
            }
        }
        let body = self.read_body(settings, response).await?;
        Err(GatewayError::UpstreamStatus { status, headers: Box::new(headers), body })
    }

    /// POSTs a JSON body to `path`; a non-2xx answer becomes [`GatewayError::UpstreamStatus`].
    pub async fn post(
        &self,
        settings: &Settings,
        path: &str,
        body: ChunkedBody,
        client_headers: &HeaderMap,
        stream: bool,
    ) -> Result<reqwest::Response, GatewayError> {
        let url = url(settings, path);
        let length = body.len();
        let payload = if length < WHOLE_BODY_BELOW_BYTES {
            Payload::Whole(body.into_bytes())
        } else {
            Payload::Pieces(body.into_chunks())
        };
        let mut attempt = 1;
        let response = loop {
            // Both are shared buffers: a repeated attempt copies no body bytes.
            let body = match &payload {
                Payload::Whole(bytes) => reqwest::Body::from(bytes.clone()),
                Payload::Pieces(chunks) => reqwest::Body::wrap_stream(futures::stream::iter(
                    chunks.clone().into_iter().map(Ok::<Bytes, std::io::Error>),
                )),
            };
            let mut request = self
                .request(settings, reqwest::Method::POST, &url, client_headers)
                .header(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))
                .header(header::CONTENT_LENGTH, length)
                .body(body);
            if !stream {
                request =
                    request.timeout(Duration::from_secs(u64::from(settings.config.upstream.timeout_seconds)));
            }
            match request.send().await {
                Ok(response) => break response,
                // Nothing was sent when the connection could not be made, so trying again cannot
                // duplicate a model call: an upstream that briefly refuses connections (a full
                // accept queue, a restarting proxy) is tried again after a short pause.
                Err(error) if error.is_connect() && attempt < CONNECT_ATTEMPTS => {
                    tracing::warn!(%url, attempt, %error, "upstream connection failed; trying again");
                    tokio::time::sleep(CONNECT_RETRY_PAUSE * attempt).await;
                    attempt += 1;
                }
                Err(error) => return Err(Self::map_error(settings, &url, error)),
            }
        };
        self.check(settings, response).await
    }

    /// Reads a whole answer body, refusing one over the limit as soon as it is exceeded (a
    /// declared length over it is refused before reading).
    pub async fn read_body(
        &self,
        settings: &Settings,
        mut response: reqwest::Response,
    ) -> Result<Bytes, GatewayError> {
        let limit = self.max_response_bytes;
        if response.content_length().is_some_and(|length| length > limit as u64) {
            return Err(GatewayError::UpstreamTooLarge { limit });
        }
        let url = response.url().to_string();
        let mut body = BytesMut::new();
        while let Some(chunk) =
            response.chunk().await.map_err(|error| Self::map_error(settings, &url, error))?
        {
            if body.len() + chunk.len() > limit {
                return Err(GatewayError::UpstreamTooLarge { limit });
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body.freeze())
    }

    /// GETs `path` and returns status, content type and body unchanged.
    pub async fn get(
        &self,
        settings: &Settings,
        path: &str,
        client_headers: &HeaderMap,
    ) -> Result<(reqwest::StatusCode, Option<HeaderValue>, Bytes), GatewayError> {
        let url = url(settings, path);
        let response = self
            .request(settings, reqwest::Method::GET, &url, client_headers)
            .timeout(Duration::from_secs(u64::from(settings.config.upstream.timeout_seconds)))
            .send()
            .await
            .map_err(|error| Self::map_error(settings, &url, error))?;
        let status = response.status();
        let content_type = response.headers().get(header::CONTENT_TYPE).cloned();
        let body = self.read_body(settings, response).await?;
        Ok((status, content_type, body))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn urls_are_parsed_once_and_the_cache_stays_bounded() {
        let upstream = Upstream::new(Duration::from_secs(5), DEFAULT_MAX_RESPONSE_BYTES).unwrap();
        let text = "http://127.0.0.1:8080/v1/chat/completions";
        let first = upstream.parsed_url(text).unwrap();
        assert_eq!(first.as_str(), text);
        assert_eq!(upstream.parsed_url(text).unwrap(), first, "the cached parse is the same URL");
        assert!(upstream.parsed_url("not a url").is_none(), "reqwest reports it when sending");
        for port in 0..3 * PARSED_URLS_KEPT {
            upstream.parsed_url(&format!("http://127.0.0.1:{port}/v1/messages")).unwrap();
            assert!(upstream.parsed_urls.lock().unwrap().len() <= PARSED_URLS_KEPT);
        }
    }

    /// Settings of an OpenAI-compatible upstream at `endpoint`.
    fn settings(dir: &std::path::Path, endpoint: &str) -> Settings {
        let config = strata_api::gateway_config::GatewayConfig::from_json(
            format!(
                r#"{{"version": 1, "agent": {{"name": "a", "namespace": "n"}},
                "upstream": {{"provider": "OpenAICompatible", "model": "m", "endpoint": "{endpoint}",
                             "contextWindow": 32768, "tokenizer": "Approximate"}},
                "cacheKey": "k", "cacheKeyShort": "k", "sessionMode": "Stateful"}}"#
            )
            .as_bytes(),
        )
        .unwrap();
        Settings::from_config(config, &dir.join("gateway.json")).unwrap()
    }

    #[tokio::test]
    async fn an_upstream_redirect_is_answered_not_followed_whatever_the_body_size() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let hits = Arc::new(AtomicUsize::new(0));
        let elsewhere = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let elsewhere_address = elsewhere.local_addr().unwrap();
        let counted = Arc::clone(&hits);
        let elsewhere_app = axum::Router::new().fallback(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            async { "{}" }
        });
        tokio::spawn(async move { axum::serve(elsewhere, elsewhere_app).await });
        let redirecting = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let redirecting_address = redirecting.local_addr().unwrap();
        let location = format!("http://{elsewhere_address}/v1/chat/completions");
        let redirecting_app = axum::Router::new().fallback(move || {
            let location = location.clone();
            async move { (axum::http::StatusCode::TEMPORARY_REDIRECT, [(header::LOCATION, location)]) }
        });
        tokio::spawn(async move { axum::serve(redirecting, redirecting_app).await });

        let dir = tempfile::tempdir().unwrap();
        let settings = settings(dir.path(), &format!("http://{redirecting_address}/v1"));
        let upstream = Upstream::new(Duration::from_secs(5), DEFAULT_MAX_RESPONSE_BYTES).unwrap();
        for size in [100, WHOLE_BODY_BELOW_BYTES + 100] {
            let mut head = serde_json::Map::new();
            head.insert("pad".into(), "x".repeat(size).into());
            let body = ChunkedBody::open_object(head);
            let answer = upstream.post(&settings, "chat/completions", body, &HeaderMap::new(), false).await;
            assert!(
                matches!(&answer, Err(GatewayError::UpstreamStatus { status, .. }) if status.as_u16() == 307),
                "{size} bytes: {answer:?}"
            );
        }
        assert_eq!(hits.load(Ordering::SeqCst), 0, "the prompt never reached the redirect's target");
    }

    #[tokio::test]
    async fn an_unparseable_upstream_url_is_still_refused_when_sent() {
        let dir = tempfile::tempdir().unwrap();
        let settings = settings(dir.path(), "http://127.0.0.1:9/v1");
        let upstream = Upstream::new(Duration::from_secs(5), DEFAULT_MAX_RESPONSE_BYTES).unwrap();
        let request = upstream.request(&settings, reqwest::Method::GET, "not a url", &HeaderMap::new());
        let error = request.send().await.unwrap_err();
        assert!(error.is_builder(), "{error}");
        assert!(upstream.parsed_urls.lock().unwrap().is_empty(), "nothing unparseable is cached");
    }
}

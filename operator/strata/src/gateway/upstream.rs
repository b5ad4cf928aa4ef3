//! The HTTP client to the upstream provider: URLs, credentials, timeouts and error mapping.
//!
//! It is hyper-util's pooled client over [`super::connector`], not a higher-level client: the
//! gateway needs no redirects, cookies or decompression, and on this path a higher-level client
//! cost 35–40 µs a request (BENCHMARKS.md, "The floor: a zero-work proxy on hyper alone"). A
//! plain-`http` upstream reached directly is spoken to over [`super::plain_http`]'s connections,
//! which go back for reuse when the answer is read, without a task per request.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode, Uri, header};
use bytes::{Bytes, BytesMut};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use hyper::body::{Body as _, Frame, Incoming};
use hyper_util::client::legacy::Client;
use tokio::time::Instant;

use super::config::Settings;
use super::connector::{
    ProxiedConnector, UpstreamConnector, certificate_refusal, error_chain, pooled_client, request_failure,
};
use super::errors::GatewayError;
use super::plain_http::{Lease, PlainHttpError, PlainHttpPool, PlainTarget};
use super::provider::adapter_for;
use strata_core::session::render::body::ChunkedBody;

/// Client headers forwarded to the upstream.
const FORWARDED_HEADERS: [HeaderName; 3] = [
    ANTHROPIC_VERSION,
    HeaderName::from_static("anthropic-beta"),
    HeaderName::from_static("openai-organization"),
];

/// The header that names the Anthropic API version (typed, so a lookup does not parse the name).
const ANTHROPIC_VERSION: HeaderName = HeaderName::from_static("anthropic-version");

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

/// Distinct upstream URLs whose routes are kept at most (an endpoint changes only with the config).
const ROUTES_KEPT: usize = 16;

/// Why an upstream URL is refused before anything is sent.
const INVALID_ENDPOINT: &str =
    "the endpoint is not a valid http or https URL; fix upstream.endpoint in the agent's spec";

/// How long an idle upstream connection is kept open.
const IDLE_CONNECTION_TIMEOUT: Duration = Duration::from_secs(90);

/// A request body as it goes upstream.
type UpstreamBody = BoxBody<Bytes, Infallible>;

/// A request body as it is sent upstream.
enum Payload {
    Whole(Bytes),
    Pieces(Vec<Bytes>),
}

impl Payload {
    /// The body of one attempt; both kinds are shared buffers, so a repeated attempt copies no
    /// body bytes.
    fn body(&self) -> UpstreamBody {
        match self {
            Payload::Whole(bytes) => Full::new(bytes.clone()).boxed(),
            Payload::Pieces(chunks) => {
                let frames = chunks.clone().into_iter().map(|chunk| Ok::<_, Infallible>(Frame::data(chunk)));
                StreamBody::new(futures::stream::iter(frames)).boxed()
            }
        }
    }
}

/// A failure building the HTTP client.
#[derive(Debug, thiserror::Error)]
#[error("building the upstream HTTP client: {reason}")]
pub struct ClientError {
    reason: String,
}

impl ClientError {
    /// An error with `reason`.
    pub fn from_reason(reason: String) -> Self {
        Self { reason }
    }
}

/// The upstream's answer: its status and headers, and its body still to be read.
pub struct UpstreamResponse {
    response: axum::http::Response<Incoming>,
    url: String,
    read_timeout: Duration,
    /// When the whole call must be over (requests that are not streamed).
    deadline: Option<Instant>,
    timeout_seconds: u32,
    /// The plain-`http` connection the answer came on, given back once the body was read to its end.
    lease: Option<Lease>,
}

impl std::fmt::Debug for UpstreamResponse {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("UpstreamResponse")
            .field("url", &self.url)
            .field("status", &self.response.status())
            .finish_non_exhaustive()
    }
}

impl UpstreamResponse {
    /// The status.
    pub fn status(&self) -> StatusCode {
        self.response.status()
    }

    /// The headers.
    pub fn headers(&self) -> &HeaderMap {
        self.response.headers()
    }

    /// The next piece of the body, `None` at its end. Each read waits at most the read timeout,
    /// and no longer than the call's deadline.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, GatewayError> {
        loop {
            let wait = read_wait(self.read_timeout, self.deadline);
            let frame = match tokio::time::timeout(wait, self.response.body_mut().frame()).await {
                Err(_) => {
                    return Err(GatewayError::UpstreamTimeout {
                        url: self.url.clone(),
                        seconds: self.timeout_seconds,
                    });
                }
                Ok(None) => {
                    self.give_back_connection();
                    return Ok(None);
                }
                Ok(Some(Err(error))) => {
                    return Err(GatewayError::UpstreamUnreachable {
                        url: self.url.clone(),
                        reason: error_chain(&error),
                    });
                }
                Ok(Some(Ok(frame))) => frame,
            };
            if self.response.body().is_end_stream() {
                self.give_back_connection();
            }
            if let Ok(data) = frame.into_data() {
                return Ok(Some(data));
            }
        }
    }

    /// Gives the connection back for reuse: the body was read to its end.
    fn give_back_connection(&mut self) {
        if let Some(lease) = self.lease.take() {
            lease.give_back();
        }
    }
}

/// How long the next read may wait: the read timeout, and no longer than `deadline`.
fn read_wait(read_timeout: Duration, deadline: Option<Instant>) -> Duration {
    match deadline {
        Some(deadline) => read_timeout.min(deadline.saturating_duration_since(Instant::now())),
        None => read_timeout,
    }
}

/// The upstream client, shared by all requests.
pub struct Upstream {
    /// The client in force, replaced whole when the egress files change.
    transport: RwLock<Arc<Transport>>,
    /// Why the egress files' last change could not be used, while the earlier client serves.
    egress_problem: Mutex<Option<String>>,
    idle_timeout: Duration,
    read_timeout: Duration,
    max_response_bytes: usize,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Upstream")
            .field("read_timeout", &self.read_timeout)
            .field("max_response_bytes", &self.max_response_bytes)
            .finish_non_exhaustive()
    }
}

/// A pooled client, the proxy settings its connector was built with, the connections to a
/// plain-`http` upstream reached directly, and the routes of the URLs it was asked for.
struct Transport {
    client: Client<UpstreamConnector, UpstreamBody>,
    /// The TCP side of the client's connector: which requests go through a proxy.
    proxied: ProxiedConnector,
    plain: Arc<PlainHttpPool>,
    /// Upstream URLs by their text, each worked out once for this transport's proxy settings.
    routes: Mutex<HashMap<String, Arc<Route>>>,
}

/// How requests to one upstream URL are sent, worked out once: the URL parsed, and either what
/// the plain-`http` connections need (a plain-`http` upstream reached directly) or, for a
/// plain-`http` request through a proxy with credentials, the proxy's `Proxy-Authorization`.
/// Every request names its URL, and working this out each time cost a parse, two proxy matches
/// and several small strings (BENCHMARKS.md).
struct Route {
    uri: Uri,
    plain: Option<PlainTarget>,
    proxy_authorization: Option<HeaderValue>,
}

impl Transport {
    fn new(idle_timeout: Duration) -> Result<Self, String> {
        let (client, proxied) = pooled_client(idle_timeout)?;
        Ok(Self::with(client, proxied, idle_timeout))
    }

    fn with(
        client: Client<UpstreamConnector, UpstreamBody>,
        proxied: ProxiedConnector,
        idle_timeout: Duration,
    ) -> Self {
        let plain = PlainHttpPool::new(proxied.clone(), idle_timeout);
        Self { client, proxied, plain, routes: Mutex::default() }
    }

    /// The route of `url`, from the cache when it was worked out before; `None` if `url` is not an
    /// absolute http or https URL of a host.
    fn route(&self, url: &str) -> Option<Arc<Route>> {
        let mut routes = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(route) = routes.get(url) {
            return Some(Arc::clone(route));
        }
        let uri: Uri = url.parse().ok()?;
        uri.host()?;
        let route = match uri.scheme_str() {
            Some("http") if self.proxied.is_direct(&uri) => {
                Route { plain: Some(PlainTarget::of(&uri)?), proxy_authorization: None, uri }
            }
            Some("http") => {
                Route { proxy_authorization: self.proxied.proxy_authorization(&uri), plain: None, uri }
            }
            Some("https") => Route { plain: None, proxy_authorization: None, uri },
            _ => return None,
        };
        if routes.len() >= ROUTES_KEPT {
            routes.clear();
        }
        let route = Arc::new(route);
        routes.insert(url.to_owned(), Arc::clone(&route));
        Some(route)
    }

    /// Sends `request` by `route`: on a plain-`http` connection when the upstream is reached
    /// directly over `http`, on the pooled client otherwise.
    async fn send(
        &self,
        request: Request<UpstreamBody>,
        route: &Route,
    ) -> Result<(axum::http::Response<Incoming>, Option<Lease>), Failure> {
        if let Some(target) = &route.plain {
            return match self.plain.send(request, target).await {
                Ok((response, lease)) => Ok((response, Some(lease))),
                Err(PlainHttpError::Connect(reason)) => Err(Failure { reason, retry: true }),
                Err(PlainHttpError::Exchange(reason)) => Err(Failure { reason, retry: false }),
            };
        }
        match self.client.request(request).await {
            Ok(response) => Ok((response, None)),
            Err(error) => Err(Failure {
                retry: error.is_connect() && certificate_refusal(&error).is_none(),
                reason: request_failure(&error, "the upstream"),
            }),
        }
    }
}

/// Why a request was not answered, and whether trying again is safe and worth it (no connection
/// was made, for a reason other than a refused certificate).
struct Failure {
    reason: String,
    retry: bool,
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
        Self::with_idle_timeout(read_timeout, max_response_bytes, IDLE_CONNECTION_TIMEOUT)
    }

    /// [`Self::new`] with idle connections closed after `idle_timeout`.
    fn with_idle_timeout(
        read_timeout: Duration,
        max_response_bytes: usize,
        idle_timeout: Duration,
    ) -> Result<Self, ClientError> {
        let transport = Transport::new(idle_timeout).map_err(|reason| ClientError { reason })?;
        Ok(Self {
            transport: RwLock::new(Arc::new(transport)),
            egress_problem: Mutex::default(),
            idle_timeout,
            read_timeout,
            max_response_bytes,
        })
    }

    /// Builds the client again from the egress files (the proxy's URL and the trusted
    /// authorities) and puts it in force; calls under way finish on the old one. On an error the
    /// client in force stays, and [`Self::egress_problem`] says why until a rebuild succeeds.
    pub fn reload_egress(&self) -> Result<(), ClientError> {
        let rebuilt = Transport::new(self.idle_timeout).map_err(|reason| ClientError { reason });
        self.record_egress_outcome(rebuilt.as_ref().err());
        *self.transport.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(rebuilt?);
        Ok(())
    }

    /// Records the outcome of the egress files' last change: `None` when it was put in force.
    pub fn record_egress_outcome(&self, error: Option<&ClientError>) {
        *self.egress_problem.lock().unwrap_or_else(PoisonError::into_inner) = error.map(ToString::to_string);
    }

    /// Why the egress files' last change could not be used, while the earlier client serves.
    pub fn egress_problem(&self) -> Option<String> {
        self.egress_problem.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn transport(&self) -> Arc<Transport> {
        Arc::clone(&self.transport.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// The request to `uri` (the text `url`) with the forwarded client headers and the provider's
    /// credentials.
    fn request(
        &self,
        settings: &Settings,
        method: Method,
        (url, uri): (&str, &Uri),
        client_headers: &HeaderMap,
        body: UpstreamBody,
    ) -> Result<Request<UpstreamBody>, GatewayError> {
        let mut headers = HeaderMap::new();
        for name in &FORWARDED_HEADERS {
            if let Some(value) = client_headers.get(name) {
                headers.insert(name.clone(), value.clone());
            }
        }
        let client_sent_version = client_headers.contains_key(&ANTHROPIC_VERSION);
        adapter_for(settings.provider())
            .authenticate(&mut headers, settings.api_key.as_deref(), client_sent_version)
            .map_err(|reason| GatewayError::UpstreamUnreachable { url: url.to_owned(), reason })?;
        let mut request = Request::new(body);
        *request.method_mut() = method;
        *request.uri_mut() = uri.clone();
        *request.headers_mut() = headers;
        Ok(request)
    }

    /// The largest answer read, in bytes.
    pub fn max_response_bytes(&self) -> usize {
        self.max_response_bytes
    }

    /// Sends a request to `url` (built anew for each attempt by `build`, given the URL parsed) and
    /// waits for the answer's head, trying a refused connection again. Waits at most the read
    /// timeout, and no longer than `deadline`.
    async fn send(
        &self,
        settings: &Settings,
        url: &str,
        build: impl Fn(&Uri) -> Result<Request<UpstreamBody>, GatewayError>,
        deadline: Option<Instant>,
    ) -> Result<UpstreamResponse, GatewayError> {
        let timeout_seconds = settings.config.upstream.timeout_seconds;
        let timed_out = || GatewayError::UpstreamTimeout { url: url.to_owned(), seconds: timeout_seconds };
        let transport = self.transport();
        let route = transport.route(url).ok_or_else(|| GatewayError::UpstreamUnreachable {
            url: url.to_owned(),
            reason: INVALID_ENDPOINT.into(),
        })?;
        let mut attempt = 1;
        loop {
            let wait = read_wait(self.read_timeout, deadline);
            let mut request = build(&route.uri)?;
            if let Some(credentials) = &route.proxy_authorization {
                request.headers_mut().insert(header::PROXY_AUTHORIZATION, credentials.clone());
            }
            let sent =
                tokio::time::timeout(wait, transport.send(request, &route)).await.map_err(|_| timed_out())?;
            match sent {
                Ok((response, lease)) => {
                    let response = UpstreamResponse {
                        response,
                        url: url.to_owned(),
                        read_timeout: self.read_timeout,
                        deadline,
                        timeout_seconds,
                        lease,
                    };
                    return self.check(response).await;
                }
                // Nothing was sent when the connection could not be made, so trying again cannot
                // duplicate a model call: an upstream that briefly refuses connections (a full
                // accept queue, a restarting proxy) is tried again after a short pause. A refused
                // certificate would be refused again.
                Err(failure) if failure.retry && attempt < CONNECT_ATTEMPTS => {
                    tracing::warn!(%url, attempt, error = %failure.reason, "upstream connection failed; trying again");
                    tokio::time::sleep(CONNECT_RETRY_PAUSE * attempt).await;
                    attempt += 1;
                }
                Err(failure) => {
                    return Err(GatewayError::UpstreamUnreachable {
                        url: url.to_owned(),
                        reason: failure.reason,
                    });
                }
            }
        }
    }

    async fn check(&self, mut response: UpstreamResponse) -> Result<UpstreamResponse, GatewayError> {
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
        let body = self.read_body(&mut response).await?;
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
    ) -> Result<UpstreamResponse, GatewayError> {
        let url = url(settings, path);
        let length = body.len();
        let payload = if length < WHOLE_BODY_BELOW_BYTES {
            Payload::Whole(body.into_bytes())
        } else {
            Payload::Pieces(body.into_chunks())
        };
        let deadline = (!stream).then(|| {
            Instant::now() + Duration::from_secs(u64::from(settings.config.upstream.timeout_seconds))
        });
        let build = |uri: &Uri| {
            let mut request =
                self.request(settings, Method::POST, (&url, uri), client_headers, payload.body())?;
            let headers = request.headers_mut();
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
            Ok(request)
        };
        self.send(settings, &url, build, deadline).await
    }

    /// Reads a whole answer body, refusing one over the limit as soon as it is exceeded (a
    /// declared length over it is refused before reading).
    pub async fn read_body(&self, response: &mut UpstreamResponse) -> Result<Bytes, GatewayError> {
        let limit = self.max_response_bytes;
        let declared = response
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|value| value.to_str().ok())
            .and_then(|text| text.parse::<u64>().ok());
        if declared.is_some_and(|length| length > limit as u64) {
            return Err(GatewayError::UpstreamTooLarge { limit });
        }
        let mut body = BytesMut::new();
        while let Some(chunk) = response.chunk().await? {
            if body.len() + chunk.len() > limit {
                return Err(GatewayError::UpstreamTooLarge { limit });
            }
            if body.is_empty() && response.response.body().is_end_stream() {
                // The whole body in one piece: no copy.
                return Ok(chunk);
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
    ) -> Result<(StatusCode, Option<HeaderValue>, Bytes), GatewayError> {
        let url = url(settings, path);
        let deadline =
            Instant::now() + Duration::from_secs(u64::from(settings.config.upstream.timeout_seconds));
        let build = |uri: &Uri| {
            self.request(settings, Method::GET, (&url, uri), client_headers, Empty::new().boxed())
        };
        // A non-2xx answer is passed through as it is, like a 2xx one.
        let mut response = match self.send(settings, &url, build, Some(deadline)).await {
            Ok(response) => response,
            Err(GatewayError::UpstreamStatus { status, headers, body }) => {
                return Ok((status, headers.get(header::CONTENT_TYPE).cloned(), body));
            }
            Err(error) => return Err(error),
        };
        let status = response.status();
        let content_type = response.headers().get(header::CONTENT_TYPE).cloned();
        let body = self.read_body(&mut response).await?;
        Ok((status, content_type, body))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A transport with `proxied` as its proxy settings.
    fn transport(proxied: ProxiedConnector) -> Transport {
        let client = super::super::connector::pooled_client_through(proxied.clone(), IDLE_CONNECTION_TIMEOUT);
        Transport::with(client.unwrap(), proxied, IDLE_CONNECTION_TIMEOUT)
    }

    #[test]
    fn routes_are_worked_out_once_per_url_and_the_cache_stays_bounded() {
        let direct = transport(ProxiedConnector::direct());
        let text = "http://127.0.0.1:8080/v1/chat/completions";
        let first = direct.route(text).unwrap();
        assert_eq!(first.uri.to_string(), text);
        assert!(first.plain.is_some(), "a plain-http upstream reached directly goes on its own connections");
        assert!(Arc::ptr_eq(&direct.route(text).unwrap(), &first), "the second request finds the route made");
        let secure = direct.route("https://api.openai.com/v1/chat/completions").unwrap();
        assert!(secure.plain.is_none() && secure.proxy_authorization.is_none());
        assert!(direct.route("not a url").is_none());
        assert!(direct.route("ftp://127.0.0.1/v1/models").is_none(), "only http and https");
        assert!(direct.route("http:///v1/models").is_none(), "a URL names its host");
        for port in 0..3 * ROUTES_KEPT {
            direct.route(&format!("http://127.0.0.1:{port}/v1/messages")).unwrap();
            assert!(direct.routes.lock().unwrap().len() <= ROUTES_KEPT);
        }
        let proxied = transport(ProxiedConnector::through("http://agent:s3cret@127.0.0.1:3128", "").unwrap());
        let through = proxied.route(text).unwrap();
        assert!(through.plain.is_none(), "a request through a proxy goes on the pooled client");
        assert!(through.proxy_authorization.is_some(), "with the proxy's credentials");
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
            let body = ChunkedBody::open_object(head, 0);
            let answer = upstream.post(&settings, "chat/completions", body, &HeaderMap::new(), false).await;
            assert!(
                matches!(&answer, Err(GatewayError::UpstreamStatus { status, .. }) if status.as_u16() == 307),
                "{size} bytes: {answer:?}"
            );
        }
        assert_eq!(hits.load(Ordering::SeqCst), 0, "the prompt never reached the redirect's target");
    }

    /// An idle connection is closed after the idle timeout (here a plain-`http` one, kept by
    /// [`PlainHttpPool`], whose sweep closes it; hyper-util's pool, for `https`, needs its timer
    /// for that, without which it keeps every idle connection open for good).
    #[tokio::test]
    async fn an_idle_upstream_connection_is_closed_after_the_idle_timeout() {
        use tokio::io::AsyncReadExt;
        let server = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = server.local_addr().unwrap();
        let closed = tokio::spawn(async move {
            let (mut stream, _) = server.accept().await.unwrap();
            super::super::connector::tests::answer_once(&mut stream).await;
            // The client keeps the connection for reuse, then closes it once idle for long enough.
            let mut buffer = [0u8; 64];
            let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buffer)).await;
            matches!(read, Ok(Ok(0)))
        });
        let dir = tempfile::tempdir().unwrap();
        let settings = settings(dir.path(), &format!("http://{address}/v1"));
        let upstream = Upstream::with_idle_timeout(
            Duration::from_secs(5),
            DEFAULT_MAX_RESPONSE_BYTES,
            Duration::from_millis(200),
        )
        .unwrap();
        let (status, _, body) = upstream.get(&settings, "models", &HeaderMap::new()).await.unwrap();
        assert_eq!((status.as_u16(), &body[..]), (200, &b"{}"[..]));
        assert!(closed.await.unwrap(), "the idle connection was closed within 5 s");
    }

    /// The client in force decides the proxy and its credentials: a plain-HTTP upstream is asked in
    /// absolute form through the proxy, with `Proxy-Authorization`.
    #[tokio::test]
    async fn a_plain_http_upstream_behind_a_proxy_is_asked_through_it_with_the_proxys_credentials() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy_address = proxy.local_addr().unwrap();
        let head = tokio::spawn(async move {
            let (mut stream, _) = proxy.accept().await.unwrap();
            let (mut head, mut byte) = (Vec::new(), [0u8; 1]);
            while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).await.unwrap() == 1 {
                head.push(byte[0]);
            }
            let answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
            stream.write_all(answer).await.unwrap();
            String::from_utf8(head).unwrap().to_ascii_lowercase()
        });
        let proxied = ProxiedConnector::through(&format!("http://agent:s3cret@{proxy_address}"), "").unwrap();
        let upstream = Upstream {
            transport: RwLock::new(Arc::new(transport(proxied))),
            egress_problem: Mutex::default(),
            idle_timeout: IDLE_CONNECTION_TIMEOUT,
            read_timeout: Duration::from_secs(5),
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
        };
        let dir = tempfile::tempdir().unwrap();
        let settings = settings(dir.path(), "http://upstream.invalid:8080/v1");
        let (status, _, body) = upstream.get(&settings, "models", &HeaderMap::new()).await.unwrap();
        assert_eq!((status.as_u16(), &body[..]), (200, &b"{}"[..]));
        let head = head.await.unwrap();
        assert!(head.starts_with("get http://upstream.invalid:8080/v1/models http/1.1\r\n"), "{head}");
        // base64("agent:s3cret")
        assert!(head.contains("proxy-authorization: basic ywdlbnq6cznjcmv0\r\n"), "{head}");
    }

    #[tokio::test]
    async fn an_unparseable_upstream_url_is_still_refused_when_sent() {
        let dir = tempfile::tempdir().unwrap();
        let settings = settings(dir.path(), "http://127.0.0.1:9/v1");
        let upstream = Upstream::new(Duration::from_secs(5), DEFAULT_MAX_RESPONSE_BYTES).unwrap();
        let headers = HeaderMap::new();
        let build = |uri: &Uri| {
            upstream.request(&settings, Method::GET, ("not a url", uri), &headers, Empty::new().boxed())
        };
        let sent = upstream.send(&settings, "not a url", build, None).await;
        let Err(GatewayError::UpstreamUnreachable { url, reason }) = sent else {
            panic!("an unparseable URL was accepted");
        };
        assert_eq!(url, "not a url");
        assert!(reason.contains("upstream.endpoint"), "{reason}");
        assert!(upstream.transport().routes.lock().unwrap().is_empty(), "nothing unparseable is cached");
    }
}

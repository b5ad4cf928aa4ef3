//! The gateway before it has a usable gateway.json: up but not ready, every answer naming the file
//! and its error (provider requests get a 503 in their provider's shape), while the file is polled
//! until it loads (`routes::Switch` then puts the real gateway on the same listeners).

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;
use strata_api::gateway_config::GatewayConfig;
use strata_core::session::turn::Api;

use super::config::{ConfigError, RELOAD_POLL_INTERVAL, Settings};
use super::errors::{GatewayError, json_response};
use super::metrics::Metrics;

/// What the waiting gateway knows: the file, its current error and the metrics.
#[derive(Clone)]
pub struct Waiting {
    path: PathBuf,
    error: Arc<RwLock<String>>,
    metrics: Metrics,
}

impl Waiting {
    /// Waiting for `path`, which failed with `error`.
    pub fn new(path: &Path, error: &ConfigError, metrics: Metrics) -> Self {
        metrics.config_rejected.set(1);
        Waiting { path: path.to_owned(), error: Arc::new(RwLock::new(error.to_string())), metrics }
    }

    fn error(&self) -> String {
        match self.error.read() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn set_error(&self, error: String) {
        match self.error.write() {
            Ok(mut guard) => *guard = error,
            Err(poisoned) => *poisoned.into_inner() = error,
        }
    }

    fn unavailable(&self) -> GatewayError {
        GatewayError::EngineUnavailable {
            cause: format!("gateway config {} cannot be used: {}", self.path.display(), self.error()),
            reason: "fix the file; the gateway loads it within a second, without a restart".into(),
        }
    }

    /// Poll the file until it loads; returns its settings and bytes.
    pub async fn until_usable(&self) -> (Settings, Vec<u8>) {
        let mut last_seen = files_now(&self.path);
        let mut ticker = tokio::time::interval(RELOAD_POLL_INTERVAL);
        loop {
            ticker.tick().await;
            let seen = files_now(&self.path);
            if seen == last_seen {
                continue;
            }
            last_seen = seen;
            match Settings::load_with_bytes(&self.path) {
                Ok(loaded) => {
                    tracing::info!(path = %self.path.display(), "gateway config is usable now; starting");
                    self.metrics.config_rejected.set(0);
                    return loaded;
                }
                Err(error) => {
                    tracing::error!(%error, "gateway config is still unusable; the gateway stays not ready");
                    self.set_error(error.to_string());
                }
            }
        }
    }
}

/// The bytes of gateway.json at `path` and of the upstream API key file it names, if it parses:
/// the config may be unusable because of either.
fn files_now(path: &Path) -> (Option<Vec<u8>>, Option<Vec<u8>>) {
    let config = std::fs::read(path).ok();
    let key = config
        .as_deref()
        .and_then(|bytes| GatewayConfig::from_json(bytes).ok())
        .and_then(|config| config.upstream.api_key_file)
        .and_then(|file| std::fs::read(file).ok());
    (config, key)
}

/// The API while waiting: health yes, ready no, provider requests 503 in their shape.
pub fn api_router(waiting: Waiting) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(openai))
        .route("/v1/messages", post(anthropic))
        .route("/v1/models", get(openai))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/strata/v1/status", get(status))
        .fallback(openai)
        .with_state(waiting)
}

/// The metrics port while waiting: metrics and status.
pub fn metrics_router(waiting: Waiting) -> Router {
    Router::new().route("/metrics", get(metrics)).route("/strata/v1/status", get(status)).with_state(waiting)
}

async fn openai(State(waiting): State<Waiting>) -> Response {
    waiting.unavailable().into_response_for(Api::OpenAi)
}

async fn anthropic(State(waiting): State<Waiting>) -> Response {
    waiting.unavailable().into_response_for(Api::Anthropic)
}

async fn readyz(State(waiting): State<Waiting>) -> Response {
    (StatusCode::SERVICE_UNAVAILABLE, waiting.unavailable().to_string()).into_response()
}

async fn status(State(waiting): State<Waiting>) -> Response {
    json_response(
        StatusCode::SERVICE_UNAVAILABLE,
        &json!({
            "ready": false,
            "config": {"inForce": "none", "error": waiting.error()},
        }),
    )
}

async fn metrics(State(waiting): State<Waiting>) -> Response {
    let mut response = Response::new(axum::body::Body::from(waiting.metrics.render()));
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"));
    response
}

//! Gateway errors and their HTTP answers in the calling API's own error shape.

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::Value;
use strata_core::budget::BudgetExceeded;

use strata_core::session::EngineError;
use strata_core::session::request_keys::KeyRefusal;
use strata_core::session::turn::Api;

/// A request the gateway could not serve.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// Malformed JSON or an unsupported field combination.
    #[error("{0}")]
    BadRequest(String),
    /// The body is over the limit.
    #[error("request body exceeds the gateway's limit of {limit} bytes")]
    PayloadTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// Unknown resource.
    #[error("{0}")]
    NotFound(String),
    /// The resource existed but the volume retention policy deleted it.
    #[error("{0}")]
    Expired(String),
    /// The operation does not fit the context budget.
    #[error(
        "context budget exceeded: the new input needs {} tokens but only {} are available; purge or compact, then resume operation {}",
        .0.estimated_result_tokens, .0.available_operation_tokens, .0.pending_operation_id
    )]
    Blocked(Box<BudgetExceeded>),
    /// The upstream did not answer in time.
    #[error("upstream {url} did not answer within {seconds}s")]
    UpstreamTimeout {
        /// Where the request went.
        url: String,
        /// The configured timeout.
        seconds: u32,
    },
    /// The upstream could not be reached.
    #[error("upstream {url} could not be reached: {reason}")]
    UpstreamUnreachable {
        /// Where the request went.
        url: String,
        /// The transport error.
        reason: String,
    },
    /// The upstream answered with an error; passed through unchanged.
    #[error("upstream answered {status}")]
    UpstreamStatus {
        /// Its status.
        status: StatusCode,
        /// Its content type and the headers a client acts on (`retry-after`, rate-limit headers,
        /// request ids); boxed to keep the error small.
        headers: Box<HeaderMap>,
        /// Its body.
        body: Bytes,
    },
    /// The upstream's answer is larger than the gateway reads.
    #[error(
        "upstream answer exceeds the gateway's limit of {limit} bytes (--max-upstream-response-bytes); nothing of it was journaled"
    )]
    UpstreamTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// The upstream's answer could not be understood.
    #[error("upstream answer could not be understood: {0}")]
    UpstreamProtocol(String),
    /// The model kept calling memory tools.
    #[error(
        "the model called memory tools in {rounds} consecutive rounds without answering; the loop was stopped"
    )]
    MemoryLoop {
        /// Rounds run.
        rounds: usize,
    },
    /// The context engine failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The context engine was unloaded after a fault (a panic, a storage error) and cannot be
    /// reloaded from the journal yet.
    #[error("the gateway is not ready: {cause}; {reason}")]
    EngineUnavailable {
        /// Why it was unloaded.
        cause: String,
        /// Why it is not back yet, or what happens next.
        reason: String,
    },
}

impl GatewayError {
    /// HTTP status of the error.
    pub fn status(&self) -> StatusCode {
        match self {
            GatewayError::BadRequest(_) | GatewayError::Blocked(_) => StatusCode::BAD_REQUEST,
            GatewayError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            GatewayError::NotFound(_) => StatusCode::NOT_FOUND,
            GatewayError::Expired(_) => StatusCode::GONE,
            GatewayError::UpstreamTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            GatewayError::UpstreamUnreachable { .. }
            | GatewayError::UpstreamProtocol(_)
            | GatewayError::UpstreamTooLarge { .. }
            | GatewayError::MemoryLoop { .. } => StatusCode::BAD_GATEWAY,
            GatewayError::UpstreamStatus { status, .. } => *status,
            GatewayError::Engine(EngineError::RequestKey(
                KeyRefusal::Reused { .. } | KeyRefusal::NotLatest { .. },
            )) => StatusCode::UNPROCESSABLE_ENTITY,
            GatewayError::Engine(error) if error.is_client_error() => StatusCode::BAD_REQUEST,
            GatewayError::Engine(_) => StatusCode::INTERNAL_SERVER_ERROR,
            GatewayError::EngineUnavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            GatewayError::BadRequest(_) => "invalid_request_error",
            GatewayError::PayloadTooLarge { .. } => "request_too_large",
            GatewayError::NotFound(_) => "not_found_error",
            GatewayError::Expired(_) => "expired_by_retention_policy",
            GatewayError::Blocked(_) => "context_budget_exceeded",
            GatewayError::UpstreamTimeout { .. } => "upstream_timeout",
            GatewayError::UpstreamUnreachable { .. }
            | GatewayError::UpstreamProtocol(_)
            | GatewayError::UpstreamTooLarge { .. } => "upstream_error",
            GatewayError::MemoryLoop { .. } => "memory_tool_loop_exceeded",
            GatewayError::UpstreamStatus { .. } => "upstream_error",
            GatewayError::Engine(error) if error.is_client_error() => "invalid_request_error",
            GatewayError::Engine(_) => "gateway_error",
            GatewayError::EngineUnavailable { .. } => "gateway_unavailable",
        }
    }

    /// The error body in `api`'s shape.
    pub fn body(&self, api: Api) -> Value {
        let mut details = serde_json::Map::new();
        if let GatewayError::Blocked(notice) = self
            && let Ok(Value::Object(notice)) = serde_json::to_value(notice.as_ref())
        {
            details = notice;
        }
        super::provider::adapter(api).error_body(self.kind(), &self.to_string(), details)
    }

    /// The HTTP response in `api`'s shape (upstream errors unchanged).
    pub fn into_response_for(self, api: Api) -> Response {
        if let GatewayError::UpstreamStatus { status, headers, body } = self {
            let mut response = (status, body).into_response();
            response.headers_mut().extend(*headers);
            return response;
        }
        let internal = match &self {
            GatewayError::Engine(error) => !error.is_client_error(),
            GatewayError::EngineUnavailable { .. } => true,
            _ => false,
        };
        if internal {
            tracing::error!(error = %self, "request failed");
        }
        let mut response = json_response(self.status(), &self.body(api));
        if matches!(self, GatewayError::PayloadTooLarge { .. }) {
            // The rest of the body is not read: the connection cannot carry another request, and
            // saying so keeps clients from reusing it (they would see it closed mid-request).
            response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

/// A JSON response.
pub fn json_response(status: StatusCode, body: &Value) -> Response {
    let mut response = (status, body.to_string()).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

//! HTTP routes: the provider APIs, health, introspection, operation resume and metrics.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::StreamExt;
use serde_json::{Value, json};

use super::errors::{GatewayError, json_response};
use super::http_serve::ClientConnection;
use super::pipeline::{Gateway, chat};
use super::provider::adapter;
use strata_core::session::CompactionAsk;
use strata_core::session::message_memo::BodyOrigin;
use strata_core::session::turn::Api;

/// Requests shown by `GET /strata/v1/inspect` unless `?limit=` says otherwise.
const DEFAULT_INSPECT_LIMIT: usize = 10;

/// The API router.
pub fn router(gateway: Arc<Gateway>) -> Router {
    Router::new()
        .route(adapter(Api::OpenAi).client_path(), post(openai_chat))
        .route(adapter(Api::Anthropic).client_path(), post(anthropic_chat))
        .route("/v1/models", get(models))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/strata/v1/status", get(status))
        .route("/strata/v1/entries", get(entries))
        .route("/strata/v1/inspect", get(inspect))
        .route("/strata/v1/operations/{id}/resume", post(resume))
        .route("/strata/v1/compact", post(compact))
        .route("/strata/v1/sweep", post(sweep))
        .route("/strata/v1/artifacts/{data_ref}", get(artifact))
        .with_state(gateway)
}

/// The metrics router. It also serves the read-only Context Inspector (the page and the JSON it
/// reads), so that `kubectl strata inspect` can reach it through a port-forward or the apiserver's
/// pod proxy (the API listener is loopback-only). In a cluster the agent's NetworkPolicy admits this
/// port from the agent's own namespace and the operator's namespace only. `entries/{id}` shows an
/// entry's content, redacted as it was journaled.
pub fn metrics_router(gateway: Arc<Gateway>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/strata/v1/status", get(status))
        .route("/strata/v1/inspect", get(inspect))
        .route("/strata/v1/entries", get(entries))
        .route("/strata/v1/entries/{id}", get(entry))
        .route("/strata/v1/artifacts/{data_ref}", get(artifact))
        .route("/strata/v1/ui", get(inspector_page))
        .with_state(gateway)
}

async fn inspector_page() -> Response {
    let mut response = Response::new(Body::from(crate::inspector::PAGE));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    // Everything the page needs is inline; it may only fetch from this origin.
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:",
        ),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

async fn entry(State(gateway): State<Arc<Gateway>>, Path(id): Path<String>) -> Response {
    let lookup = id.clone();
    match gateway.with_engine(move |engine| Ok(engine.entry_detail(&lookup))).await {
        Ok(Some(detail)) => json_response(StatusCode::OK, &serde_json::to_value(&detail).unwrap_or_default()),
        Ok(None) => GatewayError::NotFound(format!(
            "no entry {id} in the live generation; GET /strata/v1/entries lists the entries"
        ))
        .into_response_for(provider_api(&gateway)),
        Err(error) => error.into_response_for(provider_api(&gateway)),
    }
}

/// `POST /strata/v1/sweep`: runs the artifact sweeper now and answers its report.
async fn sweep(State(gateway): State<Arc<Gateway>>) -> Response {
    match super::sweeper::sweep_now(&gateway).await {
        Ok(report) => json_response(StatusCode::OK, &serde_json::to_value(&report).unwrap_or_default()),
        Err(error) => error.into_response_for(provider_api(&gateway)),
    }
}

/// `GET /strata/v1/artifacts/{data_ref}`: an artifact's bytes, exactly as stored; 410 when the
/// volume retention policy swept it, 404 when it never existed.
async fn artifact(State(gateway): State<Arc<Gateway>>, Path(data_ref): Path<String>) -> Response {
    use strata_core::artifacts::{ArtifactError, ArtifactRef};
    let api = provider_api(&gateway);
    let parsed: ArtifactRef = match data_ref.parse() {
        Ok(parsed) => parsed,
        Err(error) => {
            return GatewayError::BadRequest(format!(
                "{error}: a data_ref looks like art:sha256:<64 hex digits>"
            ))
            .into_response_for(api);
        }
    };
    let tenant = gateway.live.get().session.tenant.clone();
    let read = gateway
        .with_engine(move |engine| match engine.store().get(&tenant, &parsed) {
            Ok(bytes) => Ok(Ok(bytes)),
            Err(error @ (ArtifactError::Expired { .. } | ArtifactError::NotFound { .. })) => Ok(Err(error)),
            Err(error) => Err(error.into()),
        })
        .await;
    match read {
        Ok(Ok(bytes)) => {
            let mut response = (StatusCode::OK, bytes).into_response();
            response
                .headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
            response
        }
        Ok(Err(error @ ArtifactError::Expired { .. })) => {
            GatewayError::Expired(error.to_string()).into_response_for(api)
        }
        Ok(Err(_)) => GatewayError::NotFound(format!("no artifact {data_ref} on this agent's volume"))
            .into_response_for(api),
        Err(error) => error.into_response_for(api),
    }
}

async fn read_body(
    gateway: &Gateway,
    request: Request,
) -> Result<(axum::http::HeaderMap, bytes::Bytes, BodyOrigin), GatewayError> {
    let limit = gateway.max_body_bytes;
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<usize>().ok());
    let (parts, body) = request.into_parts();
    let headers = owned_headers(&parts.headers);
    drop(parts);
    let mut stream = body.into_data_stream();
    if declared.is_some_and(|length| length > limit) {
        drain(stream).await;
        return Err(GatewayError::PayloadTooLarge { limit });
    }
    // Sized once from the declared length: growing by doubling copied a 1.4 MB body about twice
    // more, each time into freshly faulted pages. A large one goes into the buffer the last large
    // body left (see `serve_chat`).
    // It is compared with the last body as it is read, and only what differs is written.
    let mut fill = gateway.body_buffers.take(declared.unwrap_or(0).min(limit));
    while let Some(chunk) = stream.next().await {
        let chunk =
            chunk.map_err(|error| GatewayError::BadRequest(format!("reading the request body: {error}")))?;
        if fill.len() + chunk.len() > limit {
            drain(stream).await;
            return Err(GatewayError::PayloadTooLarge { limit });
        }
        fill.push(&chunk);
    }
    let (body, origin) = fill.finish();
    Ok((headers, body, origin))
}

/// `headers` with every value copied out of the request head's buffer.
///
/// hyper's header values are slices of the buffer it read the head into, which it goes on reading
/// the body into: while any slice lives, the buffer is shared, and hyper reads each further part
/// of a large body into a newly allocated, freshly faulted buffer instead of reusing it.
fn owned_headers(headers: &axum::http::HeaderMap) -> axum::http::HeaderMap {
    let mut owned = axum::http::HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        let mut copy = HeaderValue::from_bytes(value.as_bytes()).unwrap_or_else(|_| value.clone());
        copy.set_sensitive(value.is_sensitive());
        owned.append(name.clone(), copy);
    }
    owned
}

/// Bytes of a refused body read and discarded before the refusal is sent, at most.
const DRAIN_MAX_BYTES: usize = 64 * 1024 * 1024;

/// Time spent reading and discarding a refused body, at most.
const DRAIN_MAX_TIME: std::time::Duration = std::time::Duration::from_secs(5);

/// Reads and discards the rest of a refused body (at most [`DRAIN_MAX_BYTES`], for at most
/// [`DRAIN_MAX_TIME`]), so the client, still sending, reads the 413 instead of a broken pipe: a
/// server that answers and closes with unread bytes in its socket resets the connection.
async fn drain(mut stream: axum::body::BodyDataStream) {
    let mut read = 0usize;
    let _ = tokio::time::timeout(DRAIN_MAX_TIME, async {
        while let Some(Ok(chunk)) = stream.next().await {
            read += chunk.len();
            if read > DRAIN_MAX_BYTES {
                break;
            }
        }
    })
    .await;
}

/// Serves one chat request on `api` (`routes::Routes` hands chat requests here before the router);
/// `client` watches its connection for the client's hang-up, when it can be watched.
pub(super) async fn serve_chat(
    gateway: Arc<Gateway>,
    api: Api,
    request: Request,
    client: Option<ClientConnection>,
) -> Response {
    let (headers, body, origin) = match read_body(&gateway, request).await {
        Ok(read) => read,
        Err(error) => return error.into_response_for(api),
    };
    let work = chat(Arc::clone(&gateway), api, headers, &body, Some(origin));
    // A client that leaves cancels its request: the work, with its upstream call, is dropped, as
    // hyper's own read would have done (see `http_serve`). Its journaled turn stays.
    let answered = match client {
        Some(client) => tokio::select! {
            biased;
            answered = work => Some(answered),
            () = client.hung_up() => None,
        },
        None => Some(work.await),
    };
    gateway.body_buffers.give_back(body, origin);
    match answered {
        Some(Ok(response)) => response,
        Some(Err(error)) => error.into_response_for(api),
        None => client_left(),
    }
}

/// The answer to a request whose client closed its side of the connection before the answer: no
/// one reads it when the client has gone; one that only half-closed learns why.
fn client_left() -> Response {
    tracing::debug!("the client closed its connection before the answer; its request was cancelled");
    let mut response = (
        StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
        "the client closed its connection before the answer; the request was cancelled",
    )
        .into_response();
    response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

// The router's own chat handlers answer only when it is served without `Routes::api` in front,
// which takes chat requests first with the connection's hang-up watch; here none is watched. On the
// API listener they are never reached for `POST`, and other methods on the chat paths get 405.
async fn openai_chat(State(gateway): State<Arc<Gateway>>, request: Request) -> Response {
    serve_chat(gateway, Api::OpenAi, request, None).await
}

async fn anthropic_chat(State(gateway): State<Arc<Gateway>>, request: Request) -> Response {
    serve_chat(gateway, Api::Anthropic, request, None).await
}

fn provider_api(gateway: &Gateway) -> Api {
    crate::engine_policy::api_of(gateway.live.get().provider())
}

async fn models(State(gateway): State<Arc<Gateway>>, request: Request) -> Response {
    let settings = gateway.live.get();
    match gateway.upstream.get(&settings, "models", request.headers()).await {
        Ok((status, content_type, body)) => {
            let mut response = (status, body).into_response();
            if let Some(content_type) = content_type {
                response.headers_mut().insert(header::CONTENT_TYPE, content_type);
            }
            response
        }
        Err(error) => error.into_response_for(provider_api(&gateway)),
    }
}

async fn healthz() -> &'static str {
    "ok"
}

/// Ready when the engine is loaded and its journal writer healthy. After a fault (a panic, a
/// storage error) the engine is reloaded from the journal here or by the next request, as soon as
/// a probe write succeeds; until then the answer says why it is not ready.
async fn readyz(State(gateway): State<Arc<Gateway>>) -> Response {
    let poisoned = gateway.with_engine(|engine| Ok(engine.journal().is_poisoned())).await;
    match poisoned {
        Ok(false) => "ready".into_response(),
        Ok(true) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "journal writer failed; the engine is reloaded on the next request",
        )
            .into_response(),
        Err(error) => (StatusCode::SERVICE_UNAVAILABLE, error.to_string()).into_response(),
    }
}

async fn status(State(gateway): State<Arc<Gateway>>) -> Response {
    let settings = gateway.live.get();
    let for_engine = Arc::clone(&settings);
    let snapshot = gateway
        .with_engine(move |engine| {
            let journal = engine.journal();
            Ok((
                engine.status(&for_engine.session)?,
                journal.generation(),
                journal.entries().len(),
                journal.total_tokens(),
                derived_status(engine.derived_ledger()),
            ))
        })
        .await;
    match snapshot {
        Ok((status, generation, entries, journal_tokens, derived)) => json_response(
            StatusCode::OK,
            &json!({
                "agent": {"name": settings.config.agent.name, "namespace": settings.config.agent.namespace},
                "context": status,
                "telemetry": status.telemetry_line(),
                "generation": generation,
                "entries": entries,
                "journalTokens": journal_tokens,
                "cacheKeyShort": settings.config.cache_key_short,
                "upstreamCacheKeyShort": settings.cache_key.short(),
                "sessionMode": settings.config.session_mode,
                "budget": settings.session.budget,
                "engineReloads": gateway.engine.reloads(),
                "config": match gateway.live.problem() {
                    None => json!({"inForce": "file"}),
                    Some(problem) => json!({"inForce": problem.in_force, "error": problem.error}),
                },
                "egress": gateway.upstream.egress_problem().map(|error| json!({"inForce": "previous", "error": error})),
                "volumeBytes": gateway.volume.bytes(),
                "volumeRetention": settings.session.volume,
                "sweeper": gateway.sweeps.status(),
                "derived": derived,
            }),
        ),
        Err(error) => error.into_response_for(provider_api(&gateway)),
    }
}

/// The cache scope derived context is made under, how many derived items carry a stamp, and the
/// last revocation purges (spec §17.10).
fn derived_status(ledger: &strata_core::derived::DerivedLedger) -> Value {
    json!({
        "scope": ledger.scope,
        "stamped": ledger.items.len(),
        "revocationPurges": ledger.purges,
    })
}

async fn entries(State(gateway): State<Arc<Gateway>>) -> Response {
    let listing = gateway
        .with_engine(|engine| {
            Ok(json!({"generation": engine.journal().generation(), "entries": engine.entry_summaries()}))
        })
        .await;
    match listing {
        Ok(body) => json_response(StatusCode::OK, &body),
        Err(error) => error.into_response_for(provider_api(&gateway)),
    }
}

async fn inspect(State(gateway): State<Arc<Gateway>>, request: Request) -> Response {
    let limit = request
        .uri()
        .query()
        .and_then(|query| query.split('&').find_map(|pair| pair.strip_prefix("limit=")))
        .and_then(|value| value.parse().ok())
        .unwrap_or(DEFAULT_INSPECT_LIMIT);
    let requests = gateway.inspect.last(limit);
    let settings = gateway.live.get();
    match gateway
        .with_engine(move |engine| Ok((engine.decisions(), engine.lower_budgets(&settings.session))))
        .await
    {
        Ok((decisions, lower_budgets)) => json_response(
            StatusCode::OK,
            &json!({"requests": requests, "decisions": decisions, "lowerBudgets": lower_budgets}),
        ),
        Err(error) => error.into_response_for(provider_api(&gateway)),
    }
}

async fn resume(State(gateway): State<Arc<Gateway>>, Path(id): Path<String>) -> Response {
    let api = provider_api(&gateway);
    let pending = match gateway.pending.get(&id) {
        Ok(pending) => pending,
        Err(Some(forgotten)) => {
            return GatewayError::NotFound(format!("blocked operation {id} is no longer held: {forgotten}"))
                .into_response_for(api);
        }
        Err(None) => {
            return GatewayError::NotFound(format!(
                "no blocked operation {id}: it already ran, or the gateway restarted since it was blocked (send the request again)"
            ))
            .into_response_for(api);
        }
    };
    let settings = gateway.live.get();
    if let Err(error) = gateway.with_engine(move |engine| engine.refresh(&settings.session, true)).await {
        return error.into_response_for(pending.api);
    }
    match chat(Arc::clone(&gateway), pending.api, pending.headers, &pending.body, None).await {
        Ok(response) => response,
        Err(error) => error.into_response_for(pending.api),
    }
}

async fn metrics(State(gateway): State<Arc<Gateway>>) -> Response {
    let mut response = Response::new(Body::from(gateway.metrics.render()));
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"));
    response
}

/// `POST /strata/v1/compact` body: the user's trigger, e.g. from a UI.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
struct CompactRequest {
    /// TaskBoundary (default), Budget or Emergency.
    mode: Option<String>,
    /// How the agent resumes.
    resume_instruction: Option<String>,
    /// Why (recorded).
    reason: Option<String>,
}

async fn compact(State(gateway): State<Arc<Gateway>>, request: Request) -> Response {
    let api = provider_api(&gateway);
    let (_, body, origin) = match read_body(&gateway, request).await {
        Ok(read) => read,
        Err(error) => return error.into_response_for(api),
    };
    let parsed = if body.is_empty() {
        Ok(CompactRequest::default())
    } else {
        serde_json::from_slice::<CompactRequest>(&body)
    };
    // A large body was read into the kept buffer, which the next chat request wants back.
    gateway.body_buffers.give_back(body, origin);
    let parsed = match parsed {
        Ok(parsed) => parsed,
        Err(error) => {
            return GatewayError::BadRequest(format!(
                "compact request: {error}; send {{\"mode\": \"TaskBoundary\", \"resumeInstruction\": \"...\"}}"
            ))
            .into_response_for(api);
        }
    };
    let mode = match parsed.mode.as_deref().unwrap_or("TaskBoundary") {
        "TaskBoundary" => strata_core::compaction::CompactionMode::TaskBoundary,
        "Budget" => strata_core::compaction::CompactionMode::Budget,
        "Emergency" => strata_core::compaction::CompactionMode::Emergency,
        other => {
            return GatewayError::BadRequest(format!(
                "compact request: mode {other:?} is not TaskBoundary, Budget or Emergency (rollback and purge run as CompactionJobs)"
            ))
            .into_response_for(api);
        }
    };
    let reason = parsed.reason.unwrap_or_else(|| "requested through POST /strata/v1/compact".into());
    let ask = CompactionAsk { mode, reason, resume_instruction: parsed.resume_instruction };
    let outcome = gateway.compactor.run(&ask).await;
    match outcome {
        Ok(Ok(record)) => {
            let status = if record.quality_check == strata_core::compaction::QualityCheck::Passed {
                StatusCode::OK
            } else {
                StatusCode::UNPROCESSABLE_ENTITY
            };
            json_response(status, &serde_json::to_value(&record).unwrap_or_default())
        }
        Ok(Err(error)) => json_response(
            StatusCode::CONFLICT,
            &json!({"error": {"type": "compaction_failed", "message": error.to_string()}}),
        ),
        Err(error) => error.into_response_for(api),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn owned_headers_keep_every_value_in_buffers_of_their_own() {
        let head = bytes::Bytes::from_static(b"Bearer sk-key\x00application/json\x00a\x00b");
        let shared =
            |range: std::ops::Range<usize>| HeaderValue::from_maybe_shared(head.slice(range)).unwrap();
        let mut headers = axum::http::HeaderMap::new();
        let mut key = shared(0..13);
        key.set_sensitive(true);
        headers.insert(header::AUTHORIZATION, key);
        headers.insert(header::CONTENT_TYPE, shared(14..30));
        headers.append("x-many", shared(31..32));
        headers.append("x-many", shared(33..34));

        let owned = owned_headers(&headers);
        assert_eq!(owned, headers);
        assert!(owned[header::AUTHORIZATION].is_sensitive(), "a key stays out of logs");
        let many: Vec<&HeaderValue> = owned.get_all("x-many").iter().collect();
        assert_eq!(many, [&HeaderValue::from_static("a"), &HeaderValue::from_static("b")]);
        let in_head = |value: &HeaderValue| head.as_ptr_range().contains(&value.as_bytes().as_ptr());
        assert!(headers.values().all(in_head), "the fixture shares the head");
        assert!(!owned.values().any(in_head), "no value still points into the head's buffer");
    }
}

//! `kubectl strata inspect AGENT --ui`: the agent's Context Inspector page on a local port. Each
//! request is forwarded to the gateway's metrics listener through the apiserver's pod proxy, with
//! the caller's own credentials, so it needs no more access than `inspect` does.

use std::future::Future;
use std::net::SocketAddr;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use kube::Client;

use super::PluginError;
use super::status::{INTROSPECTION_PORT, running_pod};

/// Where the forwarded page is, relative to the local address.
pub const UI_PATH: &str = "/strata/v1/ui";

#[derive(Clone)]
struct Target {
    client: Client,
    /// `/api/v1/namespaces/NS/pods/POD:PORT/proxy`.
    proxy_base: String,
}

/// Serves the agent's Inspector on `listen` until `shutdown` completes. `on_ready` gets the page's
/// URL once the port is bound (the binary prints it and may open a browser).
pub async fn serve(
    client: &Client,
    namespace: &str,
    agent: &str,
    listen: SocketAddr,
    on_ready: impl FnOnce(&str),
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<String, PluginError> {
    let pod = running_pod(client, namespace, agent).await?;
    let target = Target {
        client: client.clone(),
        proxy_base: format!("/api/v1/namespaces/{namespace}/pods/{pod}:{INTROSPECTION_PORT}/proxy"),
    };
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| PluginError::Policy(format!("cannot listen on {listen}: {e}; pick another --port")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| PluginError::Policy(format!("reading the bound address of {listen}: {e}")))?;
    on_ready(&format!("http://{bound}{UI_PATH}"));
    let app = Router::new().fallback(forward).with_state(target);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|e| PluginError::Policy(format!("serving the Inspector on {bound}: {e}")))?;
    Ok(format!("stopped forwarding the Inspector of {namespace}/{agent}\n"))
}

async fn forward(State(target): State<Target>, request: Request) -> Response {
    let path = request.uri().path();
    if request.method() != axum::http::Method::GET || !path.starts_with("/strata/v1/") {
        return (StatusCode::NOT_FOUND, format!("only GET {UI_PATH} and the JSON it reads are forwarded\n"))
            .into_response();
    }
    let upstream = match request.uri().query() {
        Some(query) => format!("{}{path}?{query}", target.proxy_base),
        None => format!("{}{path}", target.proxy_base),
    };
    let proxied = match http::Request::get(upstream).body(Vec::new()) {
        Ok(proxied) => proxied,
        Err(error) => return (StatusCode::BAD_REQUEST, format!("{error}\n")).into_response(),
    };
    match target.client.request_text(proxied).await {
        Ok(text) => {
            let content_type = if path == UI_PATH { "text/html; charset=utf-8" } else { "application/json" };
            let mut response = Response::new(Body::from(text));
            response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
            response
        }
        Err(kube::Error::Api(status)) => {
            let code = StatusCode::from_u16(status.code).unwrap_or(StatusCode::BAD_GATEWAY);
            (code, format!("the gateway or the apiserver answered {}: {}\n", status.code, status.message))
                .into_response()
        }
        Err(error) => {
            (StatusCode::BAD_GATEWAY, format!("reaching the gateway through the pod proxy: {error}\n"))
                .into_response()
        }
    }
}

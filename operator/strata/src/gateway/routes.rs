//! What a listener serves: its axum router, the two chat routes taken before it, and the switch that
//! replaces them while the listener keeps serving.
//!
//! A chat request is the request that counts, and it went through two axum routers: the switch's
//! (a fallback that looked up the routes in force) and the gateway's. Serving it before them took
//! about 5% off a Stateful request's instructions (BENCHMARKS.md, "Chat requests served before the
//! router"). [`Routes::serve`] now hands `POST /v1/chat/completions` and `POST /v1/messages` to the
//! chat handler directly, and everything else, other methods on the same paths included, to the
//! router as before.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};

use axum::Router;
use axum::extract::Request;
use axum::http::Method;
use axum::response::Response;
use strata_core::session::turn::Api;
use tower::ServiceExt;

use super::http_serve::ClientConnection;
use super::pipeline::Gateway;
use super::provider::adapter;
use super::server;

/// The answer to one request, as [`Routes::serve`] gives it.
pub type Answering = Pin<Box<dyn Future<Output = Response> + Send>>;

/// The routes of one listener: its router, and the gateway whose chat routes are served first.
#[derive(Clone)]
pub struct Routes {
    router: Router,
    chat: Option<Arc<Gateway>>,
}

impl Routes {
    /// The gateway's API: its chat routes, then [`server::router`].
    pub fn api(gateway: &Arc<Gateway>) -> Self {
        Routes { router: server::router(Arc::clone(gateway)), chat: Some(Arc::clone(gateway)) }
    }

    /// `router` alone, with no chat routes taken before it.
    pub fn only(router: Router) -> Self {
        Routes { router, chat: None }
    }

    /// Answers `request`, which came on `client`'s connection: a chat request by the chat handler,
    /// anything else by the router.
    pub fn serve(self, request: Request, client: Option<&ClientConnection>) -> Answering {
        if let Some(gateway) = self.chat
            && request.method() == Method::POST
            && let Some(api) = chat_api(request.uri().path())
        {
            return Box::pin(server::serve_chat(gateway, api, request, client.cloned()));
        }
        let router = self.router;
        Box::pin(async move {
            match router.oneshot(request).await {
                Ok(response) => response,
                Err(never) => match never {},
            }
        })
    }
}

/// The provider API whose chat path (its adapter's `client_path`) is `path`; `None` for any other.
fn chat_api(path: &str) -> Option<Api> {
    [Api::OpenAi, Api::Anthropic].into_iter().find(|api| adapter(*api).client_path() == path)
}

/// Routes that can be replaced while their listener keeps serving: every request goes to the
/// routes in force when it arrives.
#[derive(Clone)]
pub struct Switch {
    current: Arc<RwLock<Routes>>,
}

impl Switch {
    /// Serving `routes` first.
    pub fn new(routes: Routes) -> Self {
        Switch { current: Arc::new(RwLock::new(routes)) }
    }

    /// Serve `routes` from the next request on.
    pub fn replace(&self, routes: Routes) {
        match self.current.write() {
            Ok(mut guard) => *guard = routes,
            Err(poisoned) => *poisoned.into_inner() = routes,
        }
    }

    /// The routes in force now.
    pub fn current(&self) -> Routes {
        match self.current.read() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Answers `request`, which came on `client`'s connection, with the routes in force now.
    pub fn serve(
        &self,
        request: Request,
        client: Option<&ClientConnection>,
    ) -> impl Future<Output = Result<Response, Infallible>> + use<> {
        let answering = self.current().serve(request, client);
        async move { Ok(answering.await) }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn only_the_two_chat_paths_are_chat_routes() {
        assert_eq!(chat_api("/v1/chat/completions"), Some(Api::OpenAi));
        assert_eq!(chat_api("/v1/messages"), Some(Api::Anthropic));
        for other in ["/v1/chat/completions/", "/v1/messages/x", "/v1/models", "/", "/V1/messages"] {
            assert_eq!(chat_api(other), None, "{other}");
        }
    }
}

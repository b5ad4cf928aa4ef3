//! Requests blocked by the context budget, kept in memory until resumed by their operation id.

use std::collections::HashMap;
use std::sync::Mutex;

use axum::http::HeaderMap;
use bytes::Bytes;

use strata_core::session::turn::Api;

/// Blocked requests kept at most; the oldest is forgotten first.
pub const MAX_PENDING: usize = 64;

/// A blocked request, as received.
#[derive(Debug, Clone)]
pub struct PendingRequest {
    /// The API it came in on.
    pub api: Api,
    /// Its headers.
    pub headers: HeaderMap,
    /// Its body.
    pub body: Bytes,
    sequence: u64,
}

/// Blocked requests by operation id.
#[derive(Debug, Default)]
pub struct PendingOperations {
    requests: Mutex<(u64, HashMap<String, PendingRequest>)>,
}

impl PendingOperations {
    /// Remembers a blocked request under `operation_id`.
    pub fn insert(&self, operation_id: &str, api: Api, headers: HeaderMap, body: Bytes) {
        let mut guard = match self.requests.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        let (sequence, requests) = &mut *guard;
        *sequence += 1;
        requests.insert(operation_id.to_owned(), PendingRequest { api, headers, body, sequence: *sequence });
        if requests.len() > MAX_PENDING
            && let Some(oldest) = requests.iter().min_by_key(|(_, r)| r.sequence).map(|(id, _)| id.clone())
        {
            requests.remove(&oldest);
        }
    }

    /// The blocked request `operation_id`, if known.
    pub fn get(&self, operation_id: &str) -> Option<PendingRequest> {
        let guard = match self.requests.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        guard.1.get(operation_id).cloned()
    }

    /// Forgets `operation_id` (it ran).
    pub fn remove(&self, operation_id: &str) {
        let mut guard = match self.requests.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        guard.1.remove(operation_id);
    }
}

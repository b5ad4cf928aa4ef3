//! Requests blocked by the context budget, kept in memory until resumed by their operation id,
//! within a count and a byte budget (the oldest is forgotten first, and its resume says why). The
//! ids of held requests are written durably to `gateway/held-operations.json`, so that after a
//! restart their resume answers "cancelled by a restart" instead of an unknown id.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};

use axum::http::HeaderMap;
use bytes::Bytes;

use strata_core::session::StateDir;
use strata_core::session::turn::Api;

/// Blocked requests kept at most; the oldest is forgotten first.
pub const MAX_PENDING: usize = 64;

/// Bytes of blocked requests (bodies and headers) kept by default (256 MiB).
pub const DEFAULT_MAX_HELD_BYTES: usize = 256 * 1024 * 1024;

/// The state file listing the ids of held requests.
pub const HELD_FILE: &str = "held-operations.json";

/// Forgotten operation ids remembered, so that their resume can say why they are gone.
const FORGOTTEN_REMEMBERED: usize = 1024;

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

impl PendingRequest {
    fn bytes(&self) -> usize {
        let headers: usize =
            self.headers.iter().map(|(name, value)| name.as_str().len() + value.as_bytes().len()).sum();
        self.body.len() + headers
    }
}

/// Why a blocked operation is no longer held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Forgotten {
    /// Its request alone is larger than the byte budget.
    TooLarge {
        /// The request's size.
        bytes: usize,
        /// The budget.
        budget: usize,
    },
    /// Newer blocked requests pushed it out of the count or byte budget.
    Evicted {
        /// The byte budget.
        budget: usize,
    },
    /// The gateway restarted while it was held (held requests live in memory).
    CancelledByRestart,
}

impl std::fmt::Display for Forgotten {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Forgotten::TooLarge { bytes, budget } => write!(
                f,
                "its request ({bytes} bytes) is larger than the gateway's budget for held requests ({budget} bytes, --max-held-bytes), so it was not kept; send the request again once space is freed"
            ),
            Forgotten::Evicted { budget } => write!(
                f,
                "newer blocked requests pushed it out of the gateway's budget for held requests ({MAX_PENDING} requests, {budget} bytes, --max-held-bytes); send the request again once space is freed"
            ),
            Forgotten::CancelledByRestart => write!(
                f,
                "it was cancelled by a restart of the gateway (held requests live in memory); send the request again once space is freed"
            ),
        }
    }
}

#[derive(Debug, Default)]
struct Held {
    sequence: u64,
    requests: HashMap<String, PendingRequest>,
    bytes: usize,
    forgotten: VecDeque<(String, Forgotten)>,
}

impl Held {
    fn forget(&mut self, operation_id: String, why: Forgotten) {
        if self.forgotten.len() == FORGOTTEN_REMEMBERED {
            self.forgotten.pop_front();
        }
        self.forgotten.push_back((operation_id, why));
    }

    fn evict_oldest(&mut self, budget: usize) {
        let Some(oldest) = self.requests.iter().min_by_key(|(_, r)| r.sequence).map(|(id, _)| id.clone())
        else {
            return;
        };
        if let Some(request) = self.requests.remove(&oldest) {
            self.bytes -= request.bytes();
        }
        self.forget(oldest, Forgotten::Evicted { budget });
    }
}

/// Blocked requests by operation id.
#[derive(Debug)]
pub struct PendingOperations {
    max_bytes: usize,
    held: Mutex<Held>,
    state: StateDir,
}

impl PendingOperations {
    /// Keeps blocked requests of at most `max_bytes` in total, listing their ids in `state`. Ids
    /// listed there by the previous run are answered as cancelled by the restart.
    pub fn new(max_bytes: usize, state: StateDir) -> Self {
        let mut held = Held::default();
        match state.read::<Vec<String>>(HELD_FILE) {
            Ok((ids, corrupt)) => {
                if let Some(corrupt) = corrupt {
                    tracing::warn!("{corrupt}");
                }
                for id in ids {
                    held.forget(id, Forgotten::CancelledByRestart);
                }
            }
            Err(error) => tracing::warn!(%error, "reading the held operations of the previous run"),
        }
        let pending = Self { max_bytes, held: Mutex::new(held), state };
        pending.persist(&pending.lock());
        pending
    }

    /// Writes the held ids durably (a failure is logged: it only loses the restart notice).
    fn persist(&self, held: &Held) {
        let mut ids: Vec<&String> = held.requests.keys().collect();
        ids.sort();
        if let Err(error) = self.state.write(HELD_FILE, &ids) {
            tracing::warn!(%error, "recording the held operations");
        }
    }

    fn lock(&self) -> MutexGuard<'_, Held> {
        // The map is consistent after every statement, so a panic elsewhere cannot tear it.
        match self.held.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Remembers a blocked request under `operation_id`, forgetting the oldest past the budgets.
    /// Returns why it was not kept, when it alone exceeds the byte budget.
    pub fn insert(&self, operation_id: &str, api: Api, headers: HeaderMap, body: Bytes) -> Option<Forgotten> {
        let mut held = self.lock();
        if let Some(previous) = held.requests.remove(operation_id) {
            held.bytes -= previous.bytes();
        }
        held.sequence += 1;
        let request = PendingRequest { api, headers, body, sequence: held.sequence };
        let bytes = request.bytes();
        if bytes > self.max_bytes {
            let why = Forgotten::TooLarge { bytes, budget: self.max_bytes };
            held.forget(operation_id.to_owned(), why.clone());
            return Some(why);
        }
        while !held.requests.is_empty()
            && (held.requests.len() >= MAX_PENDING || held.bytes + bytes > self.max_bytes)
        {
            held.evict_oldest(self.max_bytes);
        }
        held.bytes += bytes;
        held.requests.insert(operation_id.to_owned(), request);
        held.forgotten.retain(|(id, _)| id != operation_id);
        self.persist(&held);
        None
    }

    /// The blocked request `operation_id`, or why it is no longer held (`None` when unknown).
    pub fn get(&self, operation_id: &str) -> Result<PendingRequest, Option<Forgotten>> {
        let held = self.lock();
        if let Some(request) = held.requests.get(operation_id) {
            return Ok(request.clone());
        }
        Err(held.forgotten.iter().rev().find(|(id, _)| id == operation_id).map(|(_, why)| why.clone()))
    }

    /// Forgets `operation_id` (it ran).
    pub fn remove(&self, operation_id: &str) {
        let mut held = self.lock();
        if let Some(request) = held.requests.remove(operation_id) {
            held.bytes -= request.bytes();
            self.persist(&held);
        }
    }

    /// Requests and bytes held now.
    pub fn usage(&self) -> (usize, usize) {
        let held = self.lock();
        (held.requests.len(), held.bytes)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn held_ids_are_cancelled_by_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let state = || {
            let storage = std::sync::Arc::new(strata_core::journal::StdStorage);
            StateDir::on_disk(storage, dir.path().join("gateway")).unwrap()
        };
        let before = PendingOperations::new(1_000, state());
        before.insert("op_a", Api::OpenAi, HeaderMap::new(), body(10));
        before.insert("op_b", Api::OpenAi, HeaderMap::new(), body(10));
        before.remove("op_b");
        let after = PendingOperations::new(1_000, state());
        let cancelled = after.get("op_a").unwrap_err().unwrap();
        assert_eq!(cancelled, Forgotten::CancelledByRestart);
        assert!(cancelled.to_string().contains("cancelled by a restart"));
        assert_eq!(after.get("op_b").unwrap_err(), None, "an operation that ran is not reported");
        let again = PendingOperations::new(1_000, state());
        assert_eq!(again.get("op_a").unwrap_err(), None, "reported by the first restart only");
    }

    fn body(bytes: usize) -> Bytes {
        Bytes::from(vec![b'x'; bytes])
    }

    #[test]
    fn the_byte_budget_forgets_the_oldest_and_says_why() {
        let pending = PendingOperations::new(1_000, StateDir::in_memory());
        assert_eq!(pending.insert("a", Api::OpenAi, HeaderMap::new(), body(400)), None);
        assert_eq!(pending.insert("b", Api::OpenAi, HeaderMap::new(), body(400)), None);
        assert_eq!(pending.insert("c", Api::OpenAi, HeaderMap::new(), body(400)), None);
        assert_eq!(pending.usage(), (2, 800));
        assert_eq!(pending.get("a").unwrap_err(), Some(Forgotten::Evicted { budget: 1_000 }));
        assert!(pending.get("b").is_ok() && pending.get("c").is_ok());
        let too_large = pending.insert("d", Api::OpenAi, HeaderMap::new(), body(1_001)).unwrap();
        assert_eq!(too_large, Forgotten::TooLarge { bytes: 1_001, budget: 1_000 });
        assert!(too_large.to_string().contains("--max-held-bytes"));
        assert_eq!(pending.usage(), (2, 800), "a request over the budget evicts nothing");
        pending.remove("b");
        assert_eq!(pending.usage(), (1, 400));
        assert_eq!(pending.get("zzz").unwrap_err(), None);
    }

    #[test]
    fn the_count_budget_still_applies() {
        let pending = PendingOperations::new(usize::MAX, StateDir::in_memory());
        for id in 0..=MAX_PENDING {
            pending.insert(&id.to_string(), Api::Anthropic, HeaderMap::new(), body(1));
        }
        assert_eq!(pending.usage().0, MAX_PENDING);
        assert!(pending.get("0").is_err());
    }
}

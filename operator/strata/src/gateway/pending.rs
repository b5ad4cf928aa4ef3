//! Requests blocked by the context budget, kept in memory until resumed by their operation id,
//! within a count and a byte budget (the oldest is forgotten first, and its resume says why).

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};

use axum::http::HeaderMap;
use bytes::Bytes;

use strata_core::session::turn::Api;

/// Blocked requests kept at most; the oldest is forgotten first.
pub const MAX_PENDING: usize = 64;

/// Bytes of blocked requests (bodies and headers) kept by default (256 MiB).
pub const DEFAULT_MAX_HELD_BYTES: usize = 256 * 1024 * 1024;

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
        let Some(oldest) = self.requests.iter().min_by_key(|(_, r)| r.sequence).map(|(id, _)| id.clone()) else {
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
}

impl Default for PendingOperations {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_HELD_BYTES)
    }
}

impl PendingOperations {
    /// Keeps blocked requests of at most `max_bytes` in total.
    pub fn new(max_bytes: usize) -> Self {
        Self { max_bytes, held: Mutex::new(Held::default()) }
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
        while !held.requests.is_empty() && (held.requests.len() >= MAX_PENDING || held.bytes + bytes > self.max_bytes)
        {
            held.evict_oldest(self.max_bytes);
        }
        held.bytes += bytes;
        held.requests.insert(operation_id.to_owned(), request);
        held.forgotten.retain(|(id, _)| id != operation_id);
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

    fn body(bytes: usize) -> Bytes {
        Bytes::from(vec![b'x'; bytes])
    }

    #[test]
    fn the_byte_budget_forgets_the_oldest_and_says_why() {
        let pending = PendingOperations::new(1_000);
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
        let pending = PendingOperations::new(usize::MAX);
        for id in 0..=MAX_PENDING {
            pending.insert(&id.to_string(), Api::Anthropic, HeaderMap::new(), body(1));
        }
        assert_eq!(pending.usage().0, MAX_PENDING);
        assert!(pending.get("0").is_err());
    }
}

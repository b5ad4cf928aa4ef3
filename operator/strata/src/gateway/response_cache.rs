//! The optional response cache (seed 002 #1): a transparent-session request whose body is
//! byte-identical to an earlier one that offered no tools is answered from memory within the TTL.
//! Such a request adds nothing to the journal (its messages and the answer are already there).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use sha2::{Digest, Sha256};

use strata_core::session::turn::Api;

/// Answers kept at most; expired ones are dropped first, then the oldest.
pub const MAX_ENTRIES: usize = 256;

/// The key of a request.
pub type CacheKey = [u8; 32];

/// A cached answer.
#[derive(Debug, Clone)]
pub struct CachedAnswer {
    /// Whether it is an SSE stream.
    pub stream: bool,
    /// The bytes the client received.
    pub body: Bytes,
    stored_at: Instant,
}

/// Answers by request key.
#[derive(Debug, Default)]
pub struct ResponseCache {
    answers: Mutex<HashMap<CacheKey, CachedAnswer>>,
}

/// The key of a request body on `api` under the upstream cache key `scope`: an answer is reused
/// only while the policy, model, adapter, runtime, credential and tenant it was made under hold.
pub fn key(api: Api, scope: &strata_core::cache_key::CacheKey, body: &[u8]) -> CacheKey {
    let mut hasher = Sha256::new();
    hasher.update([match api {
        Api::OpenAi => 0u8,
        Api::Anthropic => 1u8,
    }]);
    hasher.update(scope.as_hex().as_bytes());
    hasher.update(body);
    hasher.finalize().into()
}

impl ResponseCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<CacheKey, CachedAnswer>> {
        match self.answers.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// The answer stored under `key` if it is younger than `ttl`.
    pub fn get(&self, key: &CacheKey, ttl: Duration) -> Option<CachedAnswer> {
        let answers = self.lock();
        answers.get(key).filter(|answer| answer.stored_at.elapsed() < ttl).cloned()
    }

    /// Stores an answer, dropping expired ones (and the oldest when full).
    pub fn put(&self, key: CacheKey, stream: bool, body: Bytes, ttl: Duration) {
        let mut answers = self.lock();
        answers.retain(|_, answer| answer.stored_at.elapsed() < ttl);
        if answers.len() >= MAX_ENTRIES
            && let Some(oldest) =
                answers.iter().min_by_key(|(_, answer)| answer.stored_at).map(|(key, _)| *key)
        {
            answers.remove(&oldest);
        }
        answers.insert(key, CachedAnswer { stream, body, stored_at: Instant::now() });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use strata_core::cache_key::{RuntimeBinding, bind_runtime};

    fn scope(policy_version: &str) -> strata_core::cache_key::CacheKey {
        let binding = RuntimeBinding {
            tenant: "ns".into(),
            privacy_scope: "tenant".into(),
            model: "m".into(),
            tokenizer: "approximate".into(),
            policy_version: policy_version.into(),
            adapter: "openai-chat/v1".into(),
            runtime: "strata-gateway/test".into(),
            authorization: "none".into(),
            epoch: 0,
        };
        bind_runtime("base", &binding)
    }

    #[test]
    fn answers_expire_after_the_ttl() {
        let cache = ResponseCache::default();
        let key = key(Api::OpenAi, &scope("p1"), b"{}");
        assert_ne!(key, super::key(Api::Anthropic, &scope("p1"), b"{}"));
        assert_ne!(key, super::key(Api::OpenAi, &scope("p2"), b"{}"), "another policy, another entry");
        cache.put(key, false, Bytes::from_static(b"answer"), Duration::from_secs(60));
        assert_eq!(
            cache.get(&key, Duration::from_secs(60)).map(|a| a.body),
            Some(Bytes::from_static(b"answer"))
        );
        assert!(cache.get(&key, Duration::ZERO).is_none());
    }
}

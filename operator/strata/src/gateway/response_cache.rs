//! The optional response cache (seed 002 #1): a transparent-session request whose body is
//! byte-identical to an earlier one that offered no tools is answered from memory within the TTL.
//! Such a request adds nothing to the journal (its messages and the answer are already there).
//!
//! A request's key is the SHA-256 of its whole body, which for a transparent client is its whole
//! history (about 1.4 MB at a 200k-token journal): hashed from the start on every call, that cost
//! more than all the rest of a request's own work. So the hash's state is kept every
//! [`CHECKPOINT_BYTES`] of the last large body, and a body that the reader found to share its
//! opening with that one ([`BodyOrigin`]) resumes from the last state inside the shared bytes.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use sha2::{Digest, Sha256};

use strata_core::session::message_memo::BodyOrigin;
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

/// Bytes of a body between two kept states of its key's hash: a body that shares its opening with
/// the last one hashes at most this many of the shared bytes again.
pub const CHECKPOINT_BYTES: usize = 16 * 1024;

/// Answers by request key, and the key's hash states over the last large body.
#[derive(Debug, Default)]
pub struct ResponseCache {
    answers: Mutex<HashMap<CacheKey, CachedAnswer>>,
    checkpoints: Mutex<Option<Checkpoints>>,
}

/// The states of a body's key hash, after its scope and every [`CHECKPOINT_BYTES`] of the body:
/// `states[i]` has hashed the body's first `(i + 1) * CHECKPOINT_BYTES` bytes.
#[derive(Debug)]
struct Checkpoints {
    /// The body's number ([`BodyOrigin::id`]).
    body: u64,
    /// The api and the scope (its hex form) the body was keyed under.
    api: Api,
    scope: String,
    states: Vec<Sha256>,
}

/// The key of a request body on `api` under the upstream cache key `scope`, hashed whole: an
/// answer is reused only while the policy, model, adapter, runtime, credential and tenant it was
/// made under hold.
fn whole_key(api: Api, scope: &strata_core::cache_key::CacheKey, body: &[u8]) -> CacheKey {
    let mut hasher = scoped_hasher(api, scope);
    hasher.update(body);
    hasher.finalize().into()
}

/// A hash that has taken `api` and `scope`, ready for the body.
fn scoped_hasher(api: Api, scope: &strata_core::cache_key::CacheKey) -> Sha256 {
    let mut hasher = Sha256::new();
    hasher.update([match api {
        Api::OpenAi => 0u8,
        Api::Anthropic => 1u8,
    }]);
    hasher.update(scope.as_hex().as_bytes());
    hasher
}

/// How many checkpoints of `kept` a body read as `origin` can resume from: those wholly inside the
/// bytes it shares with the kept body, when the kept body is the one it was compared with and was
/// keyed under the same `api` and `scope`.
fn usable_checkpoints(kept: &Checkpoints, origin: Option<BodyOrigin>, api: Api, scope: &str) -> usize {
    match origin.and_then(|origin| origin.shares_opening_with) {
        Some((earlier, shared)) if earlier == kept.body && kept.api == api && kept.scope == scope => {
            (shared / CHECKPOINT_BYTES).min(kept.states.len())
        }
        _ => 0,
    }
}

impl ResponseCache {
    /// [`whole_key`] of `body`, resumed from the states kept of the last large body when `origin` says
    /// the two share their opening; this body's states are kept in their place when it has any.
    /// Requests that key at the same time each hash on their own.
    pub fn key(
        &self,
        api: Api,
        scope: &strata_core::cache_key::CacheKey,
        body: &[u8],
        origin: Option<BodyOrigin>,
    ) -> CacheKey {
        if body.len() < CHECKPOINT_BYTES {
            return whole_key(api, scope, body);
        }
        let kept = self.checkpoints.lock().unwrap_or_else(PoisonError::into_inner).take();
        let mut states = match kept {
            Some(kept) => {
                let usable = usable_checkpoints(&kept, origin, api, scope.as_hex());
                let mut states = kept.states;
                states.truncate(usable);
                states
            }
            None => Vec::new(),
        };
        let resumed_at = states.len() * CHECKPOINT_BYTES;
        let mut hasher = states.last().cloned().unwrap_or_else(|| scoped_hasher(api, scope));
        for piece in body.get(resumed_at..).unwrap_or_default().chunks(CHECKPOINT_BYTES) {
            hasher.update(piece);
            if piece.len() == CHECKPOINT_BYTES {
                states.push(hasher.clone());
            }
        }
        if let Some(origin) = origin {
            let scope = scope.as_hex().to_owned();
            *self.checkpoints.lock().unwrap_or_else(PoisonError::into_inner) =
                Some(Checkpoints { body: origin.id, api, scope, states });
        }
        hasher.finalize().into()
    }

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
        let key = cache.key(Api::OpenAi, &scope("p1"), b"{}", None);
        assert_ne!(key, cache.key(Api::Anthropic, &scope("p1"), b"{}", None));
        assert_ne!(key, cache.key(Api::OpenAi, &scope("p2"), b"{}", None), "another policy, another entry");
        cache.put(key, false, Bytes::from_static(b"answer"), Duration::from_secs(60));
        assert_eq!(
            cache.get(&key, Duration::from_secs(60)).map(|a| a.body),
            Some(Bytes::from_static(b"answer"))
        );
        assert!(cache.get(&key, Duration::ZERO).is_none());
    }

    /// A body of `length` bytes, each a function of its place and `seed`.
    fn body(length: usize, seed: u8) -> Vec<u8> {
        (0..length).map(|at| (at % 251) as u8 ^ seed).collect()
    }

    fn origin(id: u64, shares_opening_with: Option<(u64, usize)>) -> Option<BodyOrigin> {
        Some(BodyOrigin { id, shares_opening_with })
    }

    /// The number of leading bytes `a` and `b` have equal.
    fn shared(a: &[u8], b: &[u8]) -> usize {
        a.iter().zip(b).take_while(|(x, y)| x == y).count()
    }

    #[test]
    fn a_body_that_shares_its_opening_resumes_from_the_kept_states() {
        let cache = ResponseCache::default();
        let first = body(5 * CHECKPOINT_BYTES + 100, 0);
        assert_eq!(
            cache.key(Api::OpenAi, &scope("p"), &first, origin(1, None)),
            whole_key(Api::OpenAi, &scope("p"), &first)
        );
        // A false claim is believed: the second body's first four checkpoints are taken from the
        // first body's states, not hashed, so its key is the first body's opening with its own end.
        let second = body(5 * CHECKPOINT_BYTES, 7);
        let claimed =
            cache.key(Api::OpenAi, &scope("p"), &second, origin(2, Some((1, 4 * CHECKPOINT_BYTES + 1))));
        let mut spliced = first[..4 * CHECKPOINT_BYTES].to_vec();
        spliced.extend_from_slice(&second[4 * CHECKPOINT_BYTES..]);
        assert_eq!(claimed, whole_key(Api::OpenAi, &scope("p"), &spliced), "the kept states were used");
        assert_ne!(claimed, whole_key(Api::OpenAi, &scope("p"), &second));
    }

    #[test]
    fn a_claim_about_another_body_scope_or_api_is_not_used() {
        let first = body(3 * CHECKPOINT_BYTES, 0);
        let second = body(3 * CHECKPOINT_BYTES, 9);
        let everything = Some((1, 3 * CHECKPOINT_BYTES));
        for (api, policy, claim) in [
            (Api::OpenAi, "p", Some((5, 3 * CHECKPOINT_BYTES))),
            (Api::OpenAi, "p", Some((1, CHECKPOINT_BYTES - 1))),
            (Api::OpenAi, "p", None),
            (Api::OpenAi, "other", everything),
            (Api::Anthropic, "p", everything),
        ] {
            let cache = ResponseCache::default();
            cache.key(Api::OpenAi, &scope("p"), &first, origin(1, None));
            assert_eq!(
                cache.key(api, &scope(policy), &second, origin(2, claim)),
                whole_key(api, &scope(policy), &second),
                "{api:?} {policy} {claim:?}"
            );
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

        /// Whatever two bodies a client sends in turn, the second's key is its whole hash when the
        /// reader's claim is true: resuming never changes a key.
        #[test]
        fn a_true_claim_gives_the_whole_hash(
            first in proptest::collection::vec(0u8..4, 0..6 * CHECKPOINT_BYTES),
            edit_at in 0usize..6 * CHECKPOINT_BYTES,
            grow in 0usize..3 * CHECKPOINT_BYTES,
        ) {
            let mut second = first.clone();
            second.truncate(edit_at);
            second.extend(std::iter::repeat_n(9u8, grow));
            let cache = ResponseCache::default();
            let p = scope("p");
            proptest::prop_assert_eq!(cache.key(Api::OpenAi, &p, &first, origin(1, None)), whole_key(Api::OpenAi, &p, &first));
            let claim = Some((1, shared(&first, &second)));
            proptest::prop_assert_eq!(cache.key(Api::OpenAi, &p, &second, origin(2, claim)), whole_key(Api::OpenAi, &p, &second));
            let third = [second.as_slice(), b"more"].concat();
            let claim = Some((2, shared(&second, &third)));
            proptest::prop_assert_eq!(cache.key(Api::OpenAi, &p, &third, origin(3, claim)), whole_key(Api::OpenAi, &p, &third));
        }
    }
}

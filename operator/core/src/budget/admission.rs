//! Operation admission: identifiers, requests and the seed-000 `context_budget_exceeded` notice.

use serde::{Deserialize, Serialize};
use twox_hash::XxHash3_128;

use super::policy::BudgetError;

/// Hex characters of the request digest in [`OperationId::from_request`].
const REQUEST_DIGEST_HEX_CHARS: usize = 16;
/// Longest id part after `op_`.
const MAX_OPERATION_ID_SUFFIX: usize = 64;

/// Stable id of a pending operation (`op_…`), used to resume it after purge or compaction.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct OperationId(String);

impl OperationId {
    /// `op_<sequence>` from a caller-maintained counter (e.g. the journal sequence number).
    pub fn from_sequence(sequence: u64) -> Self {
        Self(format!("op_{sequence}"))
    }

    /// `op_<16 hex>` from a digest (XXH3-128) of the operation kind and its canonical payload: a
    /// retry of the same request gets the same id. The id names an operation; it is not a secret
    /// or a proof of integrity, so a fast non-cryptographic digest serves (the payload is a whole
    /// request body, megabytes at a long history).
    pub fn from_request(kind: &str, payload: &[u8]) -> Self {
        let mut hasher = XxHash3_128::new();
        for field in [kind.as_bytes(), payload] {
            hasher.write(&(field.len() as u64).to_be_bytes());
            hasher.write(field);
        }
        let digest = hasher.finish_128().to_be_bytes();
        let mut id = String::with_capacity(3 + REQUEST_DIGEST_HEX_CHARS);
        id.push_str("op_");
        crate::hex_text::push_lower_hex(&mut id, &digest[..REQUEST_DIGEST_HEX_CHARS / 2]);
        Self(id)
    }

    /// `op_<16 hex>` from the operation kind and a digest the caller already took of its payload
    /// (the gateway's [`Recollection::body_digest`](crate::session::message_memo::Recollection::body_digest)),
    /// so a large payload is not hashed again. A retry of the same request gets the same id as
    /// long as the digest is the same for it.
    pub fn from_payload_digest(kind: &str, digest: u128) -> Self {
        Self::from_request(kind, &digest.to_be_bytes())
    }

    /// Accepts an id supplied from outside (e.g. a resumed operation).
    pub fn parse(id: &str) -> Result<Self, BudgetError> {
        let valid = id.strip_prefix("op_").is_some_and(|suffix| {
            !suffix.is_empty()
                && suffix.len() <= MAX_OPERATION_ID_SUFFIX
                && suffix.bytes().all(|byte| byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-')
        });
        if valid {
            Ok(Self(id.to_owned()))
        } else {
            Err(BudgetError::InvalidOperationId { id: id.to_owned() })
        }
    }

    /// The id text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for OperationId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// An operation asking to add its result to the context.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OperationRequest {
    /// Stable id reported when the operation is blocked.
    pub operation_id: OperationId,
    /// Estimated tokens the result adds to the context.
    pub estimated_tokens: u64,
    /// Large tool calls, sub-agent runs, bulk reads: blocked at Critical.
    pub high_volume: bool,
}

/// Always `"context_budget_exceeded"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum ExceededStatus {
    /// The only status of a blocked operation.
    #[default]
    #[serde(rename = "context_budget_exceeded")]
    ContextBudgetExceeded,
}

/// What the agent must do before the operation can resume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum RequiredAction {
    /// Use `purge` or `compact_context`.
    #[default]
    #[serde(rename = "purge_or_compact")]
    PurgeOrCompact,
}

/// Why an operation was blocked (not part of the seed-000 JSON).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BlockReason {
    /// The (possibly conservative) estimate does not fit the available budget.
    #[default]
    InsufficientBudget,
    /// A high-volume operation at Critical pressure.
    CriticalHighVolume,
}

/// The structured notification of seed 000 for a blocked operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetExceeded {
    /// Always `context_budget_exceeded`.
    pub status: ExceededStatus,
    /// Stable id to resume the operation with.
    pub pending_operation_id: OperationId,
    /// Tokens currently in context.
    pub current_context_tokens: u64,
    /// The estimate the decision used (the conservative one at HighRisk and above).
    pub estimated_result_tokens: u64,
    /// Tokens available to the operation at the current level (0 when in deficit).
    pub available_operation_tokens: u64,
    /// Always `purge_or_compact`.
    pub required_action: RequiredAction,
    /// Why it was blocked.
    #[serde(skip)]
    pub reason: BlockReason,
}

/// Outcome of [`super::ContextBudget::admit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// The operation may run.
    Allowed,
    /// The operation must wait for purge or compaction.
    Blocked(BudgetExceeded),
}

impl Admission {
    /// Whether the operation may run.
    pub fn is_allowed(&self) -> bool {
        matches!(self, Self::Allowed)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn ids_from_sequence_and_request_are_stable() {
        assert_eq!(OperationId::from_sequence(1842).as_str(), "op_1842");
        let first = OperationId::from_request("web_fetch", br#"{"url":"https://x"}"#);
        let retry = OperationId::from_request("web_fetch", br#"{"url":"https://x"}"#);
        let other = OperationId::from_request("web_fetch", br#"{"url":"https://y"}"#);
        assert_eq!(first, retry);
        assert_ne!(first, other);
        assert_eq!(first.as_str().len(), 3 + 16);
        assert_ne!(OperationId::from_request("ab", b"c"), OperationId::from_request("a", b"bc"));
    }

    #[test]
    fn parse_validates_shape() {
        assert_eq!(OperationId::parse("op_1842").unwrap().as_str(), "op_1842");
        for bad in ["1842", "op_", "op_a b", "op_x\n", &format!("op_{}", "a".repeat(65))] {
            assert!(OperationId::parse(bad).is_err(), "{bad:?}");
        }
    }
}

//! `gateway.json`: the contract between the controller, which writes it into the Agent's ConfigMap,
//! and the gateway sidecar (and `strata compact`), which read it. Pure serde types.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::agent::{Provider, SessionMode, Tokenizer};
use crate::effective::EffectivePolicy;

/// Current version of the file format.
pub const GATEWAY_CONFIG_VERSION: u32 = 1;

/// Everything the gateway needs to serve one agent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayConfig {
    /// Format version; readers refuse versions they do not know.
    pub version: u32,
    /// The agent this gateway serves.
    pub agent: AgentIdentity,
    /// The upstream model.
    pub upstream: UpstreamConfig,
    /// The effective context policy (the built-in defaults when absent, e.g. in a hand-written file).
    #[serde(default)]
    pub policy: EffectivePolicy,
    /// Tier-1 sources (empty when absent).
    #[serde(default)]
    pub stable_prefix: StablePrefixConfig,
    /// The tenant-scoped cache key (full hex); `cacheKeyShort` is its label form.
    pub cache_key: String,
    /// First 16 hex characters of the cache key.
    pub cache_key_short: String,
    /// The tenant's cache epoch (the namespace annotation `strata.dev/cache-epoch`): when it
    /// changes, the gateway purges the context derived under the old one.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_epoch: u64,
    /// How clients talk to the gateway.
    pub session_mode: SessionMode,
}

/// Which agent, in which tenant.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentIdentity {
    /// Agent name.
    pub name: String,
    /// Namespace, which is also the tenant.
    pub namespace: String,
    /// Privacy scope recorded on cache keys and compactions.
    #[serde(default = "default_privacy_scope")]
    pub privacy_scope: String,
    /// `metadata.uid` of the Agent: the gateway binds the journal to it and refuses a journal that
    /// another Agent created. Absent for a gateway run by hand (no binding).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// The UID of an earlier Agent whose journal this one takes over on purpose (the Agent's
    /// `strata.dev/adopt-journal-from-uid` annotation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adopt_journal_from_uid: Option<String>,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

fn default_privacy_scope() -> String {
    "tenant".into()
}

/// The upstream provider.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamConfig {
    /// Provider API.
    pub provider: Provider,
    /// Model name.
    pub model: String,
    /// Base URL, e.g. `https://api.openai.com/v1` or `http://vllm.models.svc:8000/v1`.
    pub endpoint: String,
    /// Context window in tokens.
    pub context_window: u32,
    /// Tokenizer.
    pub tokenizer: Tokenizer,
    /// File holding the API key (the mounted Secret key); absent for keyless local servers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_file: Option<String>,
    /// Upstream request timeout in seconds.
    #[serde(default = "default_timeout_seconds")]
    pub timeout_seconds: u32,
}

fn default_timeout_seconds() -> u32 {
    600
}

impl Provider {
    /// The provider's public endpoint, used when the Agent sets none.
    pub fn default_endpoint(self) -> Option<&'static str> {
        match self {
            Provider::OpenAI => Some("https://api.openai.com/v1"),
            Provider::Anthropic => Some("https://api.anthropic.com"),
            Provider::OpenAICompatible => None,
        }
    }
}

/// Resolved Tier-1 sources (ConfigMap contents already read by the controller).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StablePrefixConfig {
    /// The system prompt text.
    #[serde(default)]
    pub system_prompt: String,
    /// Tool schemas, as given.
    #[serde(default)]
    pub tools: Vec<serde_json::Value>,
    /// Project constants.
    #[serde(default)]
    pub constants: BTreeMap<String, String>,
}

/// A gateway.json that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum GatewayConfigError {
    /// Not valid JSON for this format.
    #[error(
        "gateway config is not valid: {0}; regenerate it (the controller writes it) or fix the field named"
    )]
    Parse(#[from] serde_json::Error),
    /// A version this build does not understand.
    #[error(
        "gateway config version {found} is not supported (this build reads version {GATEWAY_CONFIG_VERSION}); upgrade the gateway image"
    )]
    Version {
        /// The version in the file.
        found: u32,
    },
}

impl GatewayConfig {
    /// Parse and check the version.
    pub fn from_json(bytes: &[u8]) -> Result<Self, GatewayConfigError> {
        let config: GatewayConfig = serde_json::from_slice(bytes)?;
        if config.version != GATEWAY_CONFIG_VERSION {
            return Err(GatewayConfigError::Version { found: config.version });
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn sample() -> GatewayConfig {
        GatewayConfig {
            version: GATEWAY_CONFIG_VERSION,
            agent: AgentIdentity {
                name: "builder".into(),
                namespace: "rateright".into(),
                privacy_scope: "tenant".into(),
                uid: None,
                adopt_journal_from_uid: None,
            },
            upstream: UpstreamConfig {
                provider: Provider::Anthropic,
                model: "claude-sonnet-4-20250514".into(),
                endpoint: "https://api.anthropic.com".into(),
                context_window: 200_000,
                tokenizer: Tokenizer::Approximate,
                api_key_file: Some("/var/run/strata/credentials/api-key".into()),
                timeout_seconds: 600,
            },
            policy: EffectivePolicy::default(),
            stable_prefix: StablePrefixConfig::default(),
            cache_key: "ab".repeat(32),
            cache_key_short: "ab".repeat(8),
            cache_epoch: 0,
            session_mode: SessionMode::Transparent,
        }
    }

    #[test]
    fn round_trips_and_checks_the_version() {
        let json = serde_json::to_vec(&sample()).unwrap();
        assert_eq!(GatewayConfig::from_json(&json).unwrap(), sample());
        let mut newer = sample();
        newer.version = 2;
        let err = GatewayConfig::from_json(&serde_json::to_vec(&newer).unwrap()).unwrap_err();
        assert!(err.to_string().contains("upgrade the gateway image"));
        assert!(GatewayConfig::from_json(b"{}").unwrap_err().to_string().contains("missing field"));
    }
}

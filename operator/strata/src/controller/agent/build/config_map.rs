//! The ConfigMap holding `gateway.json`. The sidecar hot-reloads it, so policy and prefix edits
//! reach a running agent without a restart.

use k8s_openapi::api::core::v1::ConfigMap;
use strata_api::Agent;
use strata_api::gateway_config::{
    AgentIdentity, GATEWAY_CONFIG_VERSION, GatewayConfig, StablePrefixConfig, UpstreamConfig,
};

use super::metadata::ChildMeta;
use super::stateful_set::API_KEY_FILE;
use crate::controller::agent::validate::{PRIVACY_SCOPE, Validated};
use crate::controller::error::{Error, Result};
use crate::controller::labels::ANNOTATION_ADOPT_JOURNAL_FROM_UID;

/// The key (and file name) of the gateway configuration.
pub const CONFIG_FILE: &str = "gateway.json";
/// Upstream request timeout written into the config.
const UPSTREAM_TIMEOUT_SECONDS: u32 = 600;

/// The ConfigMap's name.
pub fn config_map_name(agent: &str) -> String {
    format!("{agent}-gateway")
}

/// The gateway configuration of `agent`.
pub fn gateway_config(meta: &ChildMeta, agent: &Agent, validated: &Validated) -> GatewayConfig {
    let model = &agent.spec.model;
    GatewayConfig {
        version: GATEWAY_CONFIG_VERSION,
        agent: AgentIdentity {
            name: meta.agent.clone(),
            namespace: meta.namespace.clone(),
            privacy_scope: PRIVACY_SCOPE.into(),
            uid: agent.metadata.uid.clone(),
            adopt_journal_from_uid: agent
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANNOTATION_ADOPT_JOURNAL_FROM_UID))
                .map(|uid| uid.trim().to_string())
                .filter(|uid| !uid.is_empty()),
        },
        upstream: UpstreamConfig {
            provider: model.provider,
            model: model.name.clone(),
            endpoint: validated.endpoint.clone(),
            context_window: model.context_window,
            tokenizer: model.effective_tokenizer(),
            api_key_file: Some(API_KEY_FILE.into()),
            timeout_seconds: UPSTREAM_TIMEOUT_SECONDS,
        },
        policy: validated.resolution.policy.clone(),
        stable_prefix: StablePrefixConfig {
            system_prompt: validated.prefix_sources.system_prompt.clone(),
            tools: validated.prefix_sources.tools.clone(),
            constants: validated.prefix_sources.constants.clone(),
        },
        cache_key: validated.cache_key.as_hex().to_string(),
        cache_key_short: validated.cache_key.short().to_string(),
        cache_epoch: validated.epoch,
        session_mode: agent.spec.session_mode.unwrap_or(strata_api::agent::SessionMode::Transparent),
    }
}

/// The ConfigMap.
pub fn config_map(meta: &ChildMeta, agent: &Agent, validated: &Validated) -> Result<ConfigMap> {
    let config = gateway_config(meta, agent, validated);
    let json = serde_json::to_string_pretty(&config)
        .map_err(|source| Error::Serialize { what: "gateway.json".into(), source })?;
    Ok(ConfigMap {
        metadata: meta.object_meta(&config_map_name(&meta.agent)),
        data: Some([(CONFIG_FILE.to_string(), json)].into()),
        ..ConfigMap::default()
    })
}

//! Where an agent's summariser model is reached, from its gateway.json: provider, endpoint, key and
//! bounds, for `strata compact` and for the gateway's own compactions.

use std::path::{Path, PathBuf};
use std::time::Duration;

use strata_api::gateway_config::GatewayConfig;

use super::llm::LlmSettings;

/// Why the summariser of a gateway.json cannot be reached.
#[derive(Debug, thiserror::Error)]
pub enum LlmConfigError {
    /// The configuration does not say where, or would leak the agent's key.
    #[error("{0}")]
    Usage(String),
    /// The API key file cannot be read.
    #[error("reading the summariser's API key {path}: {source}")]
    Key {
        /// The key file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Where the summariser `model` is reached: its own provider, endpoint and key (`own_key_file`)
/// when the policy gives them, else the agent's (the endpoint of another provider defaults to that
/// provider's public one). Refuses to send the agent's key to another provider.
pub fn llm_settings(
    config: &GatewayConfig,
    model: String,
    own_key_file: &Path,
) -> Result<LlmSettings, LlmConfigError> {
    let upstream = &config.upstream;
    let summarizer = &config.policy.compaction.summarizer;
    let provider = summarizer.provider.unwrap_or(upstream.provider);
    let endpoint = match &summarizer.endpoint {
        Some(endpoint) => endpoint.clone(),
        None if provider == upstream.provider && !upstream.endpoint.trim().is_empty() => {
            upstream.endpoint.clone()
        }
        None => provider.default_endpoint().unwrap_or_default().to_owned(),
    };
    if endpoint.is_empty() {
        return Err(LlmConfigError::Usage(
            "no endpoint for the summariser: an OpenAICompatible provider needs upstream.endpoint or compaction.summarizer.endpoint".into(),
        ));
    }
    let key_file = if summarizer.credentials_secret_ref.is_some() {
        Some(own_key_file.to_path_buf())
    } else if provider == upstream.provider {
        upstream.api_key_file.as_ref().map(PathBuf::from)
    } else {
        return Err(LlmConfigError::Usage(
            "the summariser's provider differs from the agent's and compaction.summarizer.credentialsSecretRef is not set; refusing to send the agent's API key to another provider".into(),
        ));
    };
    let api_key = match key_file {
        Some(path) => match std::fs::read_to_string(&path) {
            Ok(key) => Some(key.trim().to_owned()),
            Err(source) => return Err(LlmConfigError::Key { path, source }),
        },
        None => None,
    };
    let max_summary_tokens = summarizer.max_summary_tokens;
    let input_tokens = (upstream.context_window / 2).saturating_sub(max_summary_tokens).max(1024);
    Ok(LlmSettings {
        provider,
        endpoint,
        model,
        api_key,
        timeout: Duration::from_secs(u64::from(upstream.timeout_seconds.max(1))),
        max_output_tokens: max_summary_tokens,
        max_input_chars: input_tokens as usize * 3,
    })
}

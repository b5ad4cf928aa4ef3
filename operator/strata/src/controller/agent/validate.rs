//! Step 2 of the Agent pipeline (pure): check the fetched inputs and compute what follows from them:
//! the effective policy, the stable prefix and the tenant-scoped cache key.

use std::sync::Arc;

use strata_api::Agent;
use strata_api::agent::Provider;
use strata_api::effective::{EffectivePolicy, EffectiveSummarizer, PolicyInputs, Resolution, resolve};
use strata_api::status::{
    CONDITION_JOURNAL_BOUND, CONDITION_POLICY_RESOLVED, CONDITION_REFERENCES_RESOLVED,
    CONDITION_SUMMARIZER_READY,
};
use strata_core::cache_key::{CacheKey, CacheKeyInputs, MasterKey, compute_cache_key, derive_tenant_key};
use strata_core::prefix::{StablePrefixManifest, StablePrefixSources};
use strata_core::redaction::Redactor;
use strata_core::retention::Classifier;
use strata_core::tokens::TokenizerKind;

use crate::controller::agent::dereference::{AgentInputs, Fetched, PolicyLookup};
use crate::controller::error::{Error, Result};
use crate::controller::prefix_cache::{PrefixCache, PrefixFailure};
use crate::gateway::connector::trusted_authorities;

/// Longest Agent name: the StatefulSet's pods get a `controller-revision-hash` label of
/// `<name>-<10 characters>`, which must fit in 63.
pub const MAX_AGENT_NAME_CHARS: usize = 52;
/// Privacy scope of an agent's cache key: the tenant as a whole.
pub const PRIVACY_SCOPE: &str = "tenant";

/// One thing wrong with an Agent, reported as a False condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The condition type it falsifies.
    pub condition: &'static str,
    /// CamelCase reason.
    pub reason: &'static str,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl Problem {
    fn reference(reason: &'static str, message: String) -> Self {
        Problem { condition: CONDITION_REFERENCES_RESOLVED, reason, message }
    }
    fn policy(reason: &'static str, message: String) -> Self {
        Problem { condition: CONDITION_POLICY_RESOLVED, reason, message }
    }
}

/// A usable Agent: everything the build step needs.
#[derive(Clone, Debug)]
pub struct Validated {
    /// The effective policy with provenance and clamps.
    pub resolution: Resolution,
    /// Raw stable-prefix sources.
    pub prefix_sources: StablePrefixSources,
    /// The canonical prefix's manifest.
    pub manifest: Arc<StablePrefixManifest>,
    /// The tenant-scoped cache key.
    pub cache_key: CacheKey,
    /// Tenant id (the namespace UID).
    pub tenant: String,
    /// The tenant's cache epoch.
    pub epoch: u64,
    /// The upstream base URL.
    pub endpoint: String,
    /// Problems that do not stop the children from being applied (e.g. a missing Secret).
    pub warnings: Vec<Problem>,
}

/// The verdict on an Agent.
#[derive(Clone, Debug)]
pub enum Validation {
    /// Children can be built.
    Valid(Box<Validated>),
    /// Children must be left as they are until these are fixed.
    Invalid(Vec<Problem>),
}

pub use crate::engine_policy::tokenizer_kind;

/// The provider's name in cache identities.
pub fn provider_id(provider: Provider) -> &'static str {
    match provider {
        Provider::OpenAI => "openai",
        Provider::Anthropic => "anthropic",
        Provider::OpenAICompatible => "openai-compatible",
    }
}

/// Check `inputs` and compute the policy, prefix and cache key.
pub fn validate(
    agent: &Agent,
    inputs: &AgentInputs,
    prefixes: &PrefixCache,
    master_key: &MasterKey,
) -> Result<Validation> {
    let mut problems = Vec::new();
    let name = agent.metadata.name.as_deref().unwrap_or_default();
    if name.len() > MAX_AGENT_NAME_CHARS {
        problems.push(Problem::reference(
            "NameTooLong",
            format!(
                "the Agent name has {} characters; at most {MAX_AGENT_NAME_CHARS} fit the StatefulSet's pod labels: recreate it with a shorter name",
                name.len()
            ),
        ));
    }
    let endpoint = match (&agent.spec.model.endpoint, agent.spec.model.provider.default_endpoint()) {
        (Some(endpoint), _) => endpoint.clone(),
        (None, Some(default)) => default.to_string(),
        (None, None) => {
            problems.push(Problem::reference(
                "EndpointMissing",
                "model.endpoint is required for provider OpenAICompatible: set it to the server's base URL"
                    .into(),
            ));
            String::new()
        }
    };
    let context_policy = match &inputs.context_policy {
        PolicyLookup::Found(policy) => Some(policy.as_ref()),
        PolicyLookup::NoDefault => None,
        PolicyLookup::Missing(policy) => {
            problems.push(Problem::reference(
                "ContextPolicyNotFound",
                format!(
                    "ContextPolicy {policy:?} (spec.contextPolicyRef) does not exist in this namespace: create it or remove the reference"
                ),
            ));
            None
        }
    };
    let system_prompt =
        text_or_problem(inputs.system_prompt.as_ref(), "stablePrefix.systemPrompt", &mut problems);
    let tools_text = text_or_problem(inputs.tools.as_ref(), "stablePrefix.tools", &mut problems);
    let authorities_field = "spec.model.egress.trustedCAConfigMapRef";
    if let Some(bundle) =
        text_or_problem(inputs.trusted_authorities.as_ref(), authorities_field, &mut problems)
        && let Err(error) = trusted_authorities(bundle.as_bytes())
    {
        problems.push(Problem::reference(
            "TrustedAuthoritiesInvalid",
            format!(
                "the ConfigMap key of {authorities_field} cannot be trusted: {error}; put the authorities' PEM certificates in it"
            ),
        ));
    }
    let tools = match tools_text.as_deref() {
        None => Vec::new(),
        Some(text) => match serde_json::from_str::<Vec<serde_json::Value>>(text) {
            Ok(tools) => tools,
            Err(error) => {
                problems.push(Problem::reference(
                    "ToolsInvalid",
                    format!("stablePrefix.tools must hold a JSON array of tool schemas: {error}"),
                ));
                Vec::new()
            }
        },
    };
    let epoch = match inputs.namespace.cache_epoch.as_deref() {
        None => 0,
        Some(raw) => raw.trim().parse::<u64>().unwrap_or_else(|_| {
            problems.push(Problem::reference(
                "CacheEpochInvalid",
                format!(
                    "the namespace annotation strata.dev/cache-epoch is {raw:?}; it must be a non-negative integer"
                ),
            ));
            0
        }),
    };
    let resolution = resolve(&PolicyInputs {
        namespace_labels: &inputs.namespace.labels,
        cluster_policies: &inputs.cluster_policies,
        context_policy,
        agent_overrides: agent.spec.overrides.as_ref().map(|overrides| (name, overrides)),
        context_window: Some(agent.spec.model.context_window),
    });
    let resolution = match resolution {
        Ok(resolution) => {
            problems.extend(engine_problems(&resolution.policy));
            Some(resolution)
        }
        Err(error) => {
            problems.push(Problem::policy("PolicyInvalid", error.to_string()));
            None
        }
    };
    let constants = agent.spec.stable_prefix.as_ref().and_then(|p| p.constants.clone()).unwrap_or_default();
    let prefix_sources =
        StablePrefixSources { system_prompt: system_prompt.unwrap_or_default(), tools, constants };
    let (Some(resolution), true) = (resolution, problems.is_empty()) else {
        return Ok(Validation::Invalid(problems));
    };

    let tokenizer = tokenizer_kind(agent.spec.model.effective_tokenizer());
    let manifest = match prefixes.manifest(&prefix_sources, tokenizer) {
        Ok(manifest) => manifest,
        Err(PrefixFailure::Invalid(error)) => {
            return Ok(Validation::Invalid(vec![Problem::reference(
                "StablePrefixInvalid",
                format!("the stable prefix cannot be used: {error}; move volatile material out of it"),
            )]));
        }
        Err(PrefixFailure::Internal(error)) => return Err(error),
    };
    let tenant = inputs.namespace.uid.clone();
    let cache_key = cache_key(agent, master_key, &tenant, epoch, tokenizer, &manifest)?;
    let mut warnings: Vec<Problem> =
        resolution.warnings.iter().map(|warning| Problem::policy("PolicyWarning", warning.clone())).collect();
    warnings.extend(summarizer_problem(agent, &resolution.policy.compaction.summarizer));
    if let Some(refusal) = inputs.pod.as_ref().and_then(|pod| pod.foreign_journal.as_ref()) {
        warnings.push(Problem {
            condition: CONDITION_JOURNAL_BOUND,
            reason: "ForeignJournal",
            message: format!("the gateway refused the journal on the agent's volume: {refusal}"),
        });
    }
    if let Some(secret) = inputs.pod.as_ref().and_then(|pod| pod.missing_secret.as_ref()) {
        let model = &agent.spec.model;
        let proxy = model.egress.as_ref().and_then(|egress| egress.proxy_secret_ref.as_ref());
        let names_proxy =
            proxy.is_some_and(|proxy| &proxy.name == secret) && model.credentials_secret_ref.name != *secret;
        let (what, field) = if names_proxy {
            ("the egress proxy's Secret", "spec.model.egress.proxySecretRef")
        } else {
            ("the credentials Secret", "spec.model.credentialsSecretRef")
        };
        warnings.push(Problem::reference(
            "SecretNotFound",
            format!("{what} {secret:?} ({field}) does not exist: create it in this namespace"),
        ));
    }
    Ok(Validation::Valid(Box::new(Validated {
        resolution,
        prefix_sources,
        manifest,
        cache_key,
        tenant,
        epoch,
        endpoint,
        warnings,
    })))
}

/// Why the effective summariser cannot work for `agent`, if it cannot: a model named for another
/// provider than the one it would be sent to, another provider without its own credentials (the
/// agent's key would go to the wrong provider), or an OpenAI-compatible server without an endpoint.
pub fn summarizer_problem(agent: &Agent, summarizer: &EffectiveSummarizer) -> Option<Problem> {
    let model = summarizer.model.as_deref()?;
    let agent_provider = agent.spec.model.provider;
    let provider = summarizer.provider.unwrap_or(agent_provider);
    let problem = |message: String| Problem {
        condition: CONDITION_SUMMARIZER_READY,
        reason: "SummarizerUnavailable",
        message,
    };
    let fix = "set compaction.summarizer.provider (with its credentialsSecretRef) in the policy that names the model (status.effectivePolicy lists the sources), or pick a model of this provider";
    if let Some(family) = model_family(model)
        && family != provider
        && provider != Provider::OpenAICompatible
    {
        return Some(problem(format!(
            "the summariser model {model:?} is a {} model, but compactions would send it to {}{}; {fix}",
            provider_id(family),
            provider_id(provider),
            if summarizer.provider.is_none() { " (the agent's provider)" } else { "" },
        )));
    }
    if provider != agent_provider && summarizer.credentials_secret_ref.is_none() {
        return Some(problem(format!(
            "the summariser's provider is {} but the agent's is {}: without compaction.summarizer.credentialsSecretRef the agent's {} key would be sent to {}; set credentialsSecretRef to a Secret key holding a {} API key",
            provider_id(provider),
            provider_id(agent_provider),
            provider_id(agent_provider),
            provider_id(provider),
            provider_id(provider),
        )));
    }
    if provider == Provider::OpenAICompatible && provider != agent_provider && summarizer.endpoint.is_none() {
        return Some(problem(
            "the summariser's provider is OpenAICompatible but compaction.summarizer.endpoint is not set: set it to the server's base URL".into(),
        ));
    }
    None
}

/// The provider whose public API a model name belongs to, when the name says so.
fn model_family(model: &str) -> Option<Provider> {
    let name = model.rsplit('/').next().unwrap_or(model).to_ascii_lowercase();
    if name.starts_with("claude") {
        Some(Provider::Anthropic)
    } else if ["gpt-", "chatgpt", "o1", "o3", "o4"].iter().any(|p| name.starts_with(p)) {
        Some(Provider::OpenAI)
    } else {
        None
    }
}

/// What the gateway would refuse to load in the effective policy: a `contentRegex` of a retention
/// rule or a `redaction.extraPatterns` entry that is not a valid regular expression, or an
/// inconsistent retention rule. Refused here, the agent keeps its last good children instead of
/// getting a sidecar that cannot start.
pub fn engine_problems(policy: &EffectivePolicy) -> Vec<Problem> {
    let mut problems = Vec::new();
    let fix = "fix it in the policy that sets it (status.effectivePolicy names the source of each field)";
    if let Err(error) = Redactor::new(policy.redaction.enabled, &policy.redaction.extra_patterns) {
        problems.push(Problem::policy("InvalidPattern", format!("{error}; {fix}")));
    }
    if let Err(error) = Classifier::new(policy.retention.rules.clone()) {
        problems.push(Problem::policy("InvalidRetentionRule", format!("{error}; {fix}")));
    }
    problems
}

fn text_or_problem(fetched: Option<&Fetched>, field: &str, problems: &mut Vec<Problem>) -> Option<String> {
    match fetched? {
        Fetched::Text(text) => Some(text.clone()),
        Fetched::MissingConfigMap(name) => {
            problems.push(Problem::reference(
                "ConfigMapNotFound",
                format!("ConfigMap {name:?} ({field}) does not exist in this namespace: create it"),
            ));
            None
        }
        Fetched::MissingKey { name, key } => {
            problems.push(Problem::reference(
                "ConfigMapKeyNotFound",
                format!("ConfigMap {name:?} has no key {key:?} ({field}): add the key or fix the reference"),
            ));
            None
        }
    }
}

fn cache_key(
    agent: &Agent,
    master_key: &MasterKey,
    tenant: &str,
    epoch: u64,
    tokenizer: TokenizerKind,
    manifest: &StablePrefixManifest,
) -> Result<CacheKey> {
    let identity = |e: strata_core::cache_key::CacheKeyError| Error::CacheIdentity(e.to_string());
    let tenant_key = derive_tenant_key(master_key, tenant, epoch).map_err(identity)?;
    let inputs = CacheKeyInputs::for_prefix(
        tenant,
        PRIVACY_SCOPE,
        provider_id(agent.spec.model.provider),
        &agent.spec.model.name,
        tokenizer,
        manifest,
    )
    .map_err(identity)?;
    compute_cache_key(&tenant_key, &inputs).map_err(identity)
}

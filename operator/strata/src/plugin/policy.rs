//! `policy`: resolve an agent's effective policy the way the operator does, and show where every field came from.

use std::fmt::Write as _;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::ListParams;
use kube::{Api, Client};
use serde_json::Value;
use strata_api::effective::{PolicyInputs, resolve};
use strata_api::fields::PolicyField;
use strata_api::{Agent, ClusterContextPolicy, ContextPolicy};

use super::PluginError;

/// Every policy field with its value and source, then the clamps and warnings.
pub async fn policy(client: &Client, namespace: &str, agent_name: &str) -> Result<String, PluginError> {
    let agents: Api<Agent> = Api::namespaced(client.clone(), namespace);
    let agent = agents
        .get(agent_name)
        .await
        .map_err(|e| PluginError::from_api(e, "get", "agents", namespace, Some(agent_name)))?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let labels = namespaces
        .get_metadata(namespace)
        .await
        .map_err(|e| PluginError::from_api(e, "get", "namespaces", namespace, Some(namespace)))?
        .metadata
        .labels
        .unwrap_or_default();
    let cluster_policies = Api::<ClusterContextPolicy>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| PluginError::from_api(e, "list", "clustercontextpolicies", namespace, None))?
        .items;
    let explicit = agent.spec.context_policy_ref.as_ref().map(|r| r.name.clone());
    let policy_name = explicit.clone().unwrap_or_else(|| "default".into());
    let context_policy = match Api::<ContextPolicy>::namespaced(client.clone(), namespace)
        .get_opt(&policy_name)
        .await
    {
        Ok(found) => found,
        Err(e) => {
            return Err(PluginError::from_api(e, "get", "contextpolicies", namespace, Some(&policy_name)));
        }
    };
    if explicit.is_some() && context_policy.is_none() {
        return Err(PluginError::Policy(format!(
            "agent {agent_name:?} references ContextPolicy {policy_name:?}, which does not exist in namespace {namespace:?}: create it or fix spec.contextPolicyRef"
        )));
    }
    let resolution = resolve(&PolicyInputs {
        namespace_labels: &labels,
        cluster_policies: &cluster_policies,
        context_policy: context_policy.as_ref(),
        agent_overrides: agent.spec.overrides.as_ref().map(|o| (agent_name, o)),
        context_window: Some(agent.spec.model.context_window),
    })
    .map_err(|e| PluginError::Policy(format!("agent {agent_name:?}: {e}")))?;

    let values = serde_json::to_value(&resolution.policy).unwrap_or(Value::Null);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Effective policy of {namespace}/{agent_name} (hash {})",
        &resolution.hash[..16.min(resolution.hash.len())]
    );
    let sources: Vec<String> = resolution.sources.iter().map(ToString::to_string).collect();
    let _ = writeln!(out, "Merged from: {}", sources.join(" → "));
    let _ = writeln!(out, "{:<42} {:<28} SOURCE", "FIELD", "VALUE");
    for field in PolicyField::ALL {
        let value = field
            .path()
            .split('.')
            .try_fold(&values, |node, key| node.get(key))
            .cloned()
            .unwrap_or(Value::Null);
        let shown = match &value {
            Value::Array(items) if field == &PolicyField::RetentionRules => items
                .iter()
                .filter_map(|r| r.get("name").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join(", "),
            other => other.to_string(),
        };
        let source = resolution.provenance.get(field.path()).map_or("-".into(), ToString::to_string);
        let _ = writeln!(out, "{:<42} {:<28} {}", field.path(), shown, source);
    }
    for (key, source) in resolution.provenance.iter().filter(|(k, _)| k.starts_with("retention.rules[")) {
        let _ = writeln!(out, "{:<42} {:<28} {}", key, "", source);
    }
    if resolution.clamps.is_empty() {
        let _ = writeln!(out, "Clamps: none");
    } else {
        let _ = writeln!(out, "Clamps:");
        for clamp in &resolution.clamps {
            let _ = writeln!(
                out,
                "  {}: {} → {} ({:?}, by {})",
                clamp.field, clamp.requested, clamp.applied, clamp.reason, clamp.by
            );
        }
    }
    for warning in &resolution.warnings {
        let _ = writeln!(out, "Warning: {warning}");
    }
    Ok(out)
}

//! `status` (the fleet table from Agent status) and `inspect` (the gateway's view through the pod proxy).

use std::fmt::Write as _;

use kube::api::ListParams;
use kube::{Api, Client};
use strata_api::Agent;
use strata_api::agent::AgentPhase;

use super::PluginError;

/// The fleet table.
pub async fn status(
    client: &Client,
    namespace: Option<&str>,
    agent: Option<&str>,
) -> Result<String, PluginError> {
    let api: Api<Agent> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let scope = namespace.unwrap_or("(all)");
    let agents: Vec<Agent> = match agent {
        Some(name) => vec![
            api.get(name).await.map_err(|e| PluginError::from_api(e, "get", "agents", scope, Some(name)))?,
        ],
        None => {
            api.list(&ListParams::default())
                .await
                .map_err(|e| PluginError::from_api(e, "list", "agents", scope, None))?
                .items
        }
    };
    Ok(render_table(&agents))
}

fn render_table(agents: &[Agent]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<16} {:<20} {:<10} {:>8} {:<9} {:>7} {:>8} {:>4} {:<24}",
        "NAMESPACE", "AGENT", "PHASE", "CONTEXT", "LEVEL", "CACHED", "VOLUME", "GEN", "LAST COMPACTION"
    );
    for agent in agents {
        let status = agent.status.clone().unwrap_or_default();
        let phase = status.phase.map_or("-".to_string(), |p| format!("{p:?}"));
        let (context, level, cached, volume) = match &status.context {
            Some(c) => {
                let billed = c.cached_tokens + c.fresh_tokens;
                let cached =
                    (c.cached_tokens * 100).checked_div(billed).map_or("-".into(), |p| format!("{p}%"));
                let level = c.level.map_or("-".into(), |l| format!("{l:?}"));
                (format!("{}%", c.percent), level, cached, c.volume_bytes.map_or("-".into(), binary_size))
            }
            None => ("-".into(), "-".into(), "-".into(), "-".into()),
        };
        let generation = status.journal.map_or("-".into(), |j| j.generation.to_string());
        let last = status
            .last_compaction
            .map_or("-".into(), |c| format!("{} {}→{}", c.job_name, c.tokens_before, c.tokens_after));
        let _ = writeln!(
            out,
            "{:<16} {:<20} {:<10} {:>8} {:<9} {:>7} {:>8} {:>4} {:<24}",
            agent.metadata.namespace.as_deref().unwrap_or("-"),
            agent.metadata.name.as_deref().unwrap_or("-"),
            phase,
            context,
            level,
            cached,
            volume,
            generation,
            last
        );
    }
    out
}

/// Bytes in the Kubernetes binary units a PVC is sized in (`812Mi`, `1.2Gi`).
fn binary_size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["Ki", "Mi", "Gi", "Ti"];
    if bytes < 1024 {
        return format!("{bytes}B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if value < 10.0 { format!("{value:.1}{}", UNITS[unit]) } else { format!("{value:.0}{}", UNITS[unit]) }
}

/// Port the gateway serves its read-only introspection on, beside `/metrics`.
pub const INTROSPECTION_PORT: u16 = 9464;

/// The pod of a running (or degraded) agent, whose gateway serves the Inspector.
pub async fn running_pod(client: &Client, namespace: &str, agent: &str) -> Result<String, PluginError> {
    let agents: Api<Agent> = Api::namespaced(client.clone(), namespace);
    let found = agents
        .get(agent)
        .await
        .map_err(|e| PluginError::from_api(e, "get", "agents", namespace, Some(agent)))?;
    let phase = found.status.as_ref().and_then(|s| s.phase);
    if phase != Some(AgentPhase::Running) && phase != Some(AgentPhase::Degraded) {
        return Err(PluginError::NotRunning {
            name: agent.into(),
            phase: phase.map_or("unknown".into(), |p| format!("{p:?}")),
            hint: "inspect reads the live gateway; unsuspend the agent or wait for its pod".into(),
        });
    }
    Ok(format!("{agent}-0"))
}

/// The gateway's `/strata/v1/inspect`, through the apiserver's pod proxy.
pub async fn inspect(client: &Client, namespace: &str, agent: &str) -> Result<String, PluginError> {
    let pod = running_pod(client, namespace, agent).await?;
    let path =
        format!("/api/v1/namespaces/{namespace}/pods/{pod}:{INTROSPECTION_PORT}/proxy/strata/v1/inspect");
    let request = http::Request::get(path)
        .body(Vec::new())
        .map_err(|e| PluginError::Policy(format!("building the proxy request: {e}")))?;
    let text = client
        .request_text(request)
        .await
        .map_err(|e| PluginError::from_api(e, "get", "pods/proxy", namespace, Some(&pod)))?;
    // Pretty-print when it is JSON; otherwise show it as it came.
    Ok(serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or(text)
        + "\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_sizes_read_like_pvc_sizes() {
        assert_eq!(binary_size(512), "512B");
        assert_eq!(binary_size(3 * 1024 * 1024 / 2), "1.5Mi");
        assert_eq!(binary_size(812 * 1024 * 1024), "812Mi");
        assert_eq!(binary_size(1024 * 1024 * 1024), "1.0Gi");
    }
}

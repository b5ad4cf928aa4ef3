//! `strata replay --html`: the Context Inspector page for a replayed session, the same page the
//! gateway serves for a live agent, with the strata policy's data embedded.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use strata_core::replay::{PolicyKind, SessionReport};

/// The page's data for one session: the engine's final state plus one request per replayed call,
/// newest first, as the gateway's `inspect` lists them.
pub fn session_view(session: &SessionReport, provider: &str) -> Option<Value> {
    let strata = session.policies.iter().find(|p| p.policy == PolicyKind::Strata)?;
    let mut view = strata.final_view.clone()?;
    let limit = view["status"]["context"]["limit"].clone();
    let requests: Vec<Value> = strata
        .calls
        .iter()
        .rev()
        .map(|call| {
            json!({
                "operationId": format!("{}#{}", session.name, call.call),
                "outcome": "ok",
                "rounds": [{
                    "status": {"tokens": call.cost.total, "limit": limit},
                    "usage": {
                        "promptTokens": call.cost.total,
                        "cachedTokens": call.cost.cache_read,
                        "cacheWriteTokens": call.cost.cache_write,
                        "completionTokens": 0,
                    },
                    "events": call.events,
                    "churn": "none",
                    "memoryCalls": [],
                }],
            })
        })
        .collect();
    view["inspect"]["requests"] = Value::Array(requests);
    let short = Path::new(&session.name)
        .file_name()
        .map_or(session.name.clone(), |n| n.to_string_lossy().into_owned());
    view["status"]["agent"] = json!({"name": short, "namespace": "replay"});
    view["source"] = json!(format!(
        "replay of {short} ({} calls, priced as {provider}; cache reads, writes and fresh tokens are simulated)",
        session.calls
    ));
    Some(view)
}

/// Where the page of session `index` of `count` goes: `path` itself for one session, otherwise
/// `path` with the session's name before the extension.
pub fn page_path(path: &Path, session: &str, count: usize) -> PathBuf {
    if count <= 1 {
        return path.to_owned();
    }
    let stem = path.file_stem().map_or_else(|| "replay".into(), |s| s.to_string_lossy().into_owned());
    let safe: String = session
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' })
        .collect();
    path.with_file_name(format!("{stem}.{safe}.html"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn several_sessions_get_one_page_each_beside_the_named_file() {
        let path = Path::new("out/report.html");
        assert_eq!(page_path(path, "cc_95f81cf4.json", 1), PathBuf::from("out/report.html"));
        assert_eq!(page_path(path, "cc_95f81cf4.json", 3), PathBuf::from("out/report.cc_95f81cf4_json.html"));
    }
}

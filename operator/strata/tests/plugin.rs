//! `kubectl strata` against an in-process fake apiserver (tower-test): the fleet table, the
//! effective policy with provenance, compact/rollback followed to the end, and the clear errors.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod controller_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use clap::Parser;
use controller_support::{FakeApiServer, NAMESPACE, agent, cluster_policies, context_policies, status_body};
use serde_json::{Value, json};
use strata::plugin::{PluginCli, PluginError, run};

fn cli(args: &[&str]) -> PluginCli {
    PluginCli::parse_from(std::iter::once("kubectl-strata").chain(args.iter().copied()))
}

fn agent_with_status(name: &str, status: Value) -> Value {
    let mut value = serde_json::to_value(agent(name)).unwrap();
    value["status"] = status;
    value
}

fn list(kind: &str, items: Vec<Value>) -> Value {
    json!({"apiVersion": "strata.dev/v1alpha1", "kind": format!("{kind}List"), "metadata": {}, "items": items})
}

fn running(percent: u8) -> Value {
    json!({"phase": "Running", "context": {"tokens": 170000, "limit": 200000, "available": 1000, "percent": percent,
           "level": "Warning", "cachedTokens": 900, "freshTokens": 100},
           "journal": {"generation": 4},
           "lastCompaction": {"jobName": "builder-budget-x1", "tokensBefore": 180000, "tokensAfter": 22000}})
}

#[tokio::test]
async fn status_prints_the_fleet_table_from_agent_status() {
    let (client, server) = FakeApiServer::start(Box::new(|seen| {
        (seen.method == "GET"
            && seen.path == format!("/apis/strata.dev/v1alpha1/namespaces/{NAMESPACE}/agents"))
        .then(|| {
            (
                200,
                list(
                    "Agent",
                    vec![agent_with_status("builder", running(85)), agent_with_status("rivet", json!({}))],
                ),
            )
        })
    }));
    let out = run(&cli(&["-n", NAMESPACE, "status"]), client).await.unwrap();
    let builder = out.lines().find(|l| l.contains("builder")).unwrap();
    for expected in ["Running", "85%", "Warning", "90%", "4", "builder-budget-x1 180000→22000"] {
        assert!(builder.contains(expected), "{expected:?} missing in {builder:?}");
    }
    assert!(out.lines().any(|l| l.contains("rivet") && l.contains(" - ")), "{out}");
    assert_eq!(server.writes().len(), 0, "status never writes");
}

#[tokio::test]
async fn a_missing_agent_says_how_to_find_the_right_one() {
    let (client, _server) = FakeApiServer::start(Box::new(|_| None));
    let err = run(&cli(&["-n", NAMESPACE, "status", "ghost"]), client).await.unwrap_err();
    assert!(matches!(err, PluginError::AgentNotFound { .. }), "{err}");
    assert!(err.to_string().contains("kubectl strata status -n rateright"), "{err}");
}

#[tokio::test]
async fn policy_shows_every_field_with_its_source_and_the_clamps() {
    let (client, _server) = FakeApiServer::start(Box::new(|seen| {
        if seen.method != "GET" {
            return None;
        }
        let path = seen.path.as_str();
        if path.ends_with("/agents/builder") {
            return Some((200, serde_json::to_value(agent("builder")).unwrap()));
        }
        if path == format!("/api/v1/namespaces/{NAMESPACE}") {
            return Some((
                200,
                json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": NAMESPACE, "labels": {"strata.dev/fleet": "always-on"}}}),
            ));
        }
        if path == "/apis/strata.dev/v1alpha1/clustercontextpolicies" {
            let items = cluster_policies().into_iter().map(|p| serde_json::to_value(p).unwrap()).collect();
            return Some((200, list("ClusterContextPolicy", items)));
        }
        if path.ends_with("/contextpolicies/default") {
            return Some((200, serde_json::to_value(context_policies().remove(0)).unwrap()));
        }
        None
    }));
    let out = run(&cli(&["-n", NAMESPACE, "policy", "builder"]), client).await.unwrap();
    let line = |field: &str| {
        out.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("{field} in {out}")).to_string()
    };
    assert!(line("compaction.triggerPercent").ends_with("Agent/builder"), "{out}");
    assert!(line("redaction.enabled").ends_with("ClusterContextPolicy/fleet-default"), "{out}");
    assert!(line("budget.reservedCompletionTokens").contains("ContextPolicy/default"), "{out}");
    assert!(out.contains("Merged from: Default/builtin → ClusterContextPolicy/fleet-default"), "{out}");
    assert!(out.contains("Clamps:"), "{out}");
}

#[tokio::test]
async fn compact_creates_a_job_and_follows_it_to_the_record() {
    let polls = Arc::new(AtomicUsize::new(0));
    let counter = polls.clone();
    let (client, server) = FakeApiServer::start(Box::new(move |seen| {
        let jobs = format!("/apis/strata.dev/v1alpha1/namespaces/{NAMESPACE}/compactionjobs");
        match (seen.method.as_str(), seen.path.as_str()) {
            ("GET", path) if path.ends_with("/agents/builder") => {
                Some((200, serde_json::to_value(agent("builder")).unwrap()))
            }
            ("POST", path) if path == jobs => {
                let mut created = seen.body.clone();
                created["metadata"]["name"] = json!("builder-taskboundary-abcde");
                Some((201, created))
            }
            ("GET", path) if path == format!("{jobs}/builder-taskboundary-abcde") => {
                let poll = counter.fetch_add(1, Ordering::SeqCst);
                let mut job = json!({"apiVersion": "strata.dev/v1alpha1", "kind": "CompactionJob",
                    "metadata": {"name": "builder-taskboundary-abcde", "namespace": NAMESPACE},
                    "spec": {"agentRef": {"name": "builder"}, "mode": "TaskBoundary"}});
                job["status"] = if poll == 0 {
                    json!({"phase": "Running"})
                } else {
                    json!({"phase": "Succeeded", "record": {"compactionId": "cmp:1f2e", "sourceGeneration": 4,
                        "resultGeneration": 5, "tokensBefore": 180000, "tokensAfter": 22000, "qualityCheck": "Passed"}})
                };
                Some((200, job))
            }
            _ => None,
        }
    }));
    let out =
        run(&cli(&["-n", NAMESPACE, "compact", "builder", "--resume", "Start the pricing task."]), client)
            .await
            .unwrap();
    assert!(out.contains("compactionjob.strata.dev/builder-taskboundary-abcde created"), "{out}");
    assert!(out.contains("cmp:1f2e generation 4 → 5, tokens 180000 → 22000, check Passed"), "{out}");
    let created = server.writes().into_iter().find(|w| w.method == "POST").unwrap();
    assert_eq!(created.body["spec"]["agentRef"]["name"], "builder");
    assert_eq!(created.body["spec"]["mode"], "TaskBoundary");
    assert_eq!(created.body["spec"]["resumeInstruction"], "Start the pricing task.");
    assert_eq!(created.body["metadata"]["generateName"], "builder-taskboundary-");
    assert!(polls.load(Ordering::SeqCst) >= 2);
}

#[tokio::test]
async fn rollback_without_rbac_explains_what_is_missing() {
    let (client, server) = FakeApiServer::start(Box::new(|seen| match seen.method.as_str() {
        "GET" if seen.path.ends_with("/agents/builder") => {
            Some((200, serde_json::to_value(agent("builder")).unwrap()))
        }
        "POST" => Some((403, status_body(403, "Forbidden"))),
        _ => None,
    }));
    let err = run(&cli(&["-n", NAMESPACE, "rollback", "builder", "--to-generation", "3"]), client)
        .await
        .unwrap_err();
    assert!(matches!(err, PluginError::Forbidden { .. }), "{err}");
    assert!(err.to_string().contains("kubectl auth can-i create compactionjobs -n rateright"), "{err}");
    let attempted = server.requests().into_iter().find(|r| r.method == "POST").unwrap();
    assert_eq!(attempted.body["spec"]["rollback"]["toGeneration"], 3);
    assert_eq!(attempted.body["spec"]["mode"], "Rollback");
}

#[tokio::test]
async fn inspect_refuses_a_suspended_agent_and_proxies_to_a_running_one() {
    let (client, _server) = FakeApiServer::start(Box::new(|seen| {
        if seen.path.ends_with("/agents/rivet") {
            return Some((200, agent_with_status("rivet", json!({"phase": "Suspended"}))));
        }
        None
    }));
    let err = run(&cli(&["-n", NAMESPACE, "inspect", "rivet"]), client).await.unwrap_err();
    assert!(matches!(err, PluginError::NotRunning { .. }), "{err}");

    let (client, server) = FakeApiServer::start(Box::new(|seen| {
        if seen.path.ends_with("/agents/builder") {
            return Some((200, agent_with_status("builder", running(40))));
        }
        if seen.path.contains("/pods/builder-0:9464/proxy/strata/v1/inspect") {
            return Some((200, json!({"requests": [{"churnCause": null}]})));
        }
        None
    }));
    let out = run(&cli(&["-n", NAMESPACE, "inspect", "builder"]), client).await.unwrap();
    assert!(out.contains("\"churnCause\": null"), "{out}");
    assert!(
        server.requests().iter().any(|r| r.path
            == format!("/api/v1/namespaces/{NAMESPACE}/pods/builder-0:9464/proxy/strata/v1/inspect"))
    );
}

#[tokio::test]
async fn inspect_ui_forwards_the_inspector_through_the_pod_proxy() {
    let proxy = format!("/api/v1/namespaces/{NAMESPACE}/pods/builder-0:9464/proxy/strata/v1/status");
    let (client, server) = FakeApiServer::start(Box::new(move |seen| {
        if seen.method != "GET" {
            return None;
        }
        if seen.path.ends_with("/agents/builder") {
            return Some((200, agent_with_status("builder", running(42))));
        }
        (seen.path == proxy).then(|| (200, json!({"context": {"tokens": 1234, "percent": 42}})))
    }));
    let (url_tx, url_rx) = tokio::sync::oneshot::channel::<String>();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(async move {
        strata::plugin::ui::serve(
            &client,
            NAMESPACE,
            "builder",
            "127.0.0.1:0".parse().unwrap(),
            move |url| url_tx.send(url.to_owned()).unwrap(),
            async move {
                let _ = stop_rx.await;
            },
        )
        .await
    });
    let url = url_rx.await.unwrap();
    assert!(url.ends_with("/strata/v1/ui"), "{url}");
    let base = url.trim_end_matches("/strata/v1/ui").to_owned();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    let status: Value =
        http.get(format!("{base}/strata/v1/status")).send().await.unwrap().json().await.unwrap();
    assert_eq!(status["context"]["tokens"], 1234, "the gateway's JSON, as the pod proxy returned it");
    let other = http.get(format!("{base}/api/v1/secrets")).send().await.unwrap();
    assert_eq!(other.status(), 404, "only the Inspector's paths are forwarded");
    let write = http.post(format!("{base}/strata/v1/compact")).send().await.unwrap();
    assert_eq!(write.status(), 404, "nothing but GET is forwarded");
    stop_tx.send(()).unwrap();
    let out = serving.await.unwrap().unwrap();
    assert!(out.contains("stopped forwarding"), "{out}");
    assert_eq!(server.writes().len(), 0, "the UI never writes");
}

#[tokio::test]
async fn inspect_ui_refuses_an_agent_that_is_not_running() {
    let (client, _server) = FakeApiServer::start(Box::new(|seen| {
        seen.path
            .ends_with("/agents/builder")
            .then(|| (200, agent_with_status("builder", json!({"phase": "Suspended"}))))
    }));
    let err = strata::plugin::ui::serve(
        &client,
        NAMESPACE,
        "builder",
        "127.0.0.1:0".parse().unwrap(),
        |_| panic!("must not start serving"),
        async {},
    )
    .await
    .unwrap_err();
    assert!(matches!(err, PluginError::NotRunning { .. }), "{err}");
}

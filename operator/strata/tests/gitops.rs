//! The GitOps artefacts in config/gitops.
//!
//! The Argo CD health checks are Lua, kept as data in config/gitops/*.lua. No Lua runs here, so this test
//! reads each script's `phase_health` table, mirrors the rest of its logic in Rust (the mirror checks
//! that the script contains every piece of logic it mirrors), and runs the mirror on sample statuses.
//! It also checks the tables cover exactly the phases the CRDs allow.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

fn gitops() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/gitops")
}

fn script(name: &str) -> String {
    std::fs::read_to_string(gitops().join(name)).unwrap()
}

/// The `local phase_health = { Phase = "Health", ... }` table of a script.
fn phase_table(lua: &str) -> BTreeMap<String, String> {
    let start = lua.find("local phase_health = {").expect("the script has a phase_health table");
    let body = &lua[start..];
    let body = &body[body.find('{').unwrap() + 1..body.find('}').unwrap()];
    body.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .map(|line| {
            let (phase, health) = line.trim_end_matches(',').split_once('=').unwrap();
            (phase.trim().to_string(), health.trim().trim_matches('"').to_string())
        })
        .collect()
}

/// Argo CD's health statuses.
const ARGO_HEALTH: &[&str] = &["Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown"];

/// The phases a kind's CRD allows in status.phase.
fn crd_phases(kind: &str) -> Vec<String> {
    let crd = strata_api::crds::all().into_iter().find(|crd| crd.spec.names.kind == kind).unwrap();
    let crd = serde_json::to_value(crd).unwrap();
    let phase = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
        ["phase"];
    let values = phase["enum"].as_array().or_else(|| phase["anyOf"][0]["enum"].as_array());
    let mut phases: Vec<String> = values
        .unwrap_or_else(|| panic!("{kind} status.phase has no enum: {phase}"))
        .iter()
        .filter_map(|v| v.as_str().map(String::from))
        .collect();
    phases.sort();
    phases
}

fn assert_script_contains(lua: &str, pieces: &[&str]) {
    for piece in pieces {
        assert!(
            lua.contains(piece),
            "the Lua script no longer contains `{piece}`: update the mirror in this test"
        );
    }
}

fn ready(status: &Value) -> Option<&Value> {
    status["conditions"].as_array()?.iter().rev().find(|c| c["type"] == "Ready")
}

fn non_empty(value: &Value) -> Option<&str> {
    value.as_str().filter(|s| !s.is_empty())
}

/// Mirror of config/gitops/argocd-health-agent.lua.
fn agent_health(table: &BTreeMap<String, String>, obj: &Value) -> (String, String) {
    let Some(status) = obj.get("status").filter(|s| !s.is_null()) else {
        return ("Progressing".into(), "Waiting for the Strata operator to report status".into());
    };
    if let Some(generation) = obj["metadata"]["generation"].as_i64()
        && status["observedGeneration"].as_i64().is_none_or(|observed| observed < generation)
    {
        return (
            "Progressing".into(),
            format!("Waiting for the Strata operator to reconcile generation {generation}"),
        );
    }
    let ready = ready(status);
    let phase = status["phase"].as_str();
    let mut health = phase.and_then(|p| table.get(p)).cloned().unwrap_or_else(|| "Progressing".into());
    if health == "Healthy" && ready.is_none_or(|r| r["status"] != "True") {
        health = "Progressing".into();
    }
    let message = match (ready, phase) {
        (Some(r), _) if non_empty(&r["message"]).is_some() => non_empty(&r["message"]).unwrap().into(),
        (Some(r), _) if non_empty(&r["reason"]).is_some() => non_empty(&r["reason"]).unwrap().into(),
        (_, Some(phase)) => format!("Agent is {phase}"),
        _ => "Waiting for the Strata operator to report status".into(),
    };
    (health, message)
}

/// Mirror of config/gitops/argocd-health-compactionjob.lua.
fn compaction_job_health(table: &BTreeMap<String, String>, obj: &Value) -> (String, String) {
    let Some(phase) = obj["status"]["phase"].as_str() else {
        return ("Progressing".into(), "Waiting for the Strata operator to pick up the job".into());
    };
    let status = &obj["status"];
    let health = table.get(phase).cloned().unwrap_or_else(|| "Progressing".into());
    let message = if let Some(reason) = non_empty(&status["reason"]) {
        format!("{phase}: {reason}")
    } else if let Some(message) = ready(status).and_then(|r| non_empty(&r["message"])) {
        format!("{phase}: {message}")
    } else {
        format!("CompactionJob is {phase}")
    };
    (health, message)
}

fn agent(generation: i64, status: Value) -> Value {
    json!({"apiVersion": "strata.dev/v1alpha1", "kind": "Agent",
           "metadata": {"name": "builder", "generation": generation}, "status": status})
}

fn ready_condition(status: &str, reason: &str, message: &str) -> Value {
    json!({"type": "Ready", "status": status, "reason": reason, "message": message})
}

#[test]
fn agent_health_follows_phase_and_ready() {
    let lua = script("argocd-health-agent.lua");
    assert_script_contains(
        &lua,
        &[
            "if obj.status == nil then",
            "status.observedGeneration < obj.metadata.generation",
            "condition.type == \"Ready\"",
            "if health == \"Healthy\" and (ready == nil or ready.status ~= \"True\") then",
            "hs.message = ready.message",
            "hs.message = ready.reason",
            "\"Agent is \" .. status.phase",
            "return hs",
        ],
    );
    let table = phase_table(&lua);
    assert_eq!(table.keys().cloned().collect::<Vec<_>>(), crd_phases("Agent"), "every Agent phase, no other");
    for health in table.values() {
        assert!(ARGO_HEALTH.contains(&health.as_str()), "{health} is not an Argo CD health status");
    }

    let health = |obj: &Value| agent_health(&table, obj);
    let no_status = json!({"kind": "Agent", "metadata": {"name": "builder", "generation": 1}});
    assert_eq!(health(&no_status).0, "Progressing");

    let running_ready = agent(
        3,
        json!({"phase": "Running", "observedGeneration": 3,
               "conditions": [ready_condition("True", "Running", "")],
               "context": {"percent": 41, "level": "Normal"}}),
    );
    assert_eq!(health(&running_ready), ("Healthy".into(), "Running".into()));

    let stale = agent(
        4,
        json!({"phase": "Running", "observedGeneration": 3,
                                "conditions": [ready_condition("True", "Running", "")]}),
    );
    assert_eq!(
        health(&stale),
        ("Progressing".into(), "Waiting for the Strata operator to reconcile generation 4".into())
    );

    let running_not_ready = agent(
        3,
        json!({"phase": "Running", "observedGeneration": 3,
               "conditions": [ready_condition("False", "PodNotReady", "the gateway is not ready yet")]}),
    );
    assert_eq!(health(&running_not_ready), ("Progressing".into(), "the gateway is not ready yet".into()));

    let running_no_condition = agent(3, json!({"phase": "Running", "observedGeneration": 3}));
    assert_eq!(health(&running_no_condition), ("Progressing".into(), "Agent is Running".into()));

    let pending = agent(
        1,
        json!({"phase": "Pending", "observedGeneration": 1,
                                  "conditions": [ready_condition("False", "Starting", "")]}),
    );
    assert_eq!(health(&pending), ("Progressing".into(), "Starting".into()));

    let degraded = agent(
        2,
        json!({"phase": "Degraded", "observedGeneration": 2,
               "conditions": [ready_condition("False", "SecretMissing", "Secret anthropic-api not found")]}),
    );
    assert_eq!(health(&degraded), ("Degraded".into(), "Secret anthropic-api not found".into()));

    let failed = agent(2, json!({"phase": "Failed", "observedGeneration": 2}));
    assert_eq!(health(&failed), ("Degraded".into(), "Agent is Failed".into()));

    let suspended = agent(
        5,
        json!({"phase": "Suspended", "observedGeneration": 5,
                                    "conditions": [ready_condition("False", "Suspended", "")]}),
    );
    assert_eq!(health(&suspended).0, "Suspended");
}

#[test]
fn compaction_job_health_follows_phase() {
    let lua = script("argocd-health-compactionjob.lua");
    assert_script_contains(
        &lua,
        &[
            "if obj.status == nil or obj.status.phase == nil then",
            "condition.type == \"Ready\"",
            "hs.message = status.phase .. \": \" .. status.reason",
            "hs.message = status.phase .. \": \" .. ready.message",
            "\"CompactionJob is \" .. status.phase",
            "return hs",
        ],
    );
    let table = phase_table(&lua);
    assert_eq!(
        table.keys().cloned().collect::<Vec<_>>(),
        crd_phases("CompactionJob"),
        "every CompactionJob phase, no other"
    );
    for health in table.values() {
        assert!(ARGO_HEALTH.contains(&health.as_str()), "{health} is not an Argo CD health status");
    }
    let health = |status: Value| {
        compaction_job_health(
            &table,
            &json!({"kind": "CompactionJob", "metadata": {"name": "c"}, "status": status}),
        )
    };
    assert_eq!(health(Value::Null).0, "Progressing");
    assert_eq!(
        health(json!({"phase": "Pending", "reason": "WaitingForActiveJob"})),
        ("Progressing".into(), "Pending: WaitingForActiveJob".into())
    );
    assert_eq!(health(json!({"phase": "Running", "jobName": "c-x"})).0, "Progressing");
    assert_eq!(
        health(json!({"phase": "Succeeded", "record": {"generation": 4}})),
        ("Healthy".into(), "CompactionJob is Succeeded".into())
    );
    assert_eq!(
        health(
            json!({"phase": "Failed", "conditions": [ready_condition("False", "Failed", "summary missed hardConstraints")]})
        ),
        ("Degraded".into(), "Failed: summary missed hardConstraints".into())
    );
}

#[test]
fn the_flux_examples_point_at_paths_that_exist() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for file in ["flux/helmrelease.yaml", "flux/kustomize-install.yaml"] {
        let text = script(file);
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
        assert!(!docs.is_empty(), "{file}");
        for doc in &docs {
            let path =
                doc["spec"]["path"].as_str().or_else(|| doc["spec"]["chart"]["spec"]["chart"].as_str());
            if let Some(path) = path {
                assert!(repo.join(path).is_dir(), "{file}: {path} is not a directory of this repository");
            }
        }
    }
}

//! The install artefacts: the Helm chart (charts/strata) and the kustomize install (config/default).
//!
//! The tests that render need `helm` (and `kubectl` for kustomize). They look for `.tools/helm` and
//! `.tools/kubectl` (installed by `.ci/packaging-checks.sh`), or `$STRATA_HELM` / `$STRATA_KUBECTL`.
//! Without helm they print why and pass, unless `STRATA_PACKAGING_REQUIRED` is set (as the packaging
//! script does), in which case they fail. The dashboard and version checks need no tools.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

fn chart() -> PathBuf {
    repo().join("charts/strata")
}

/// `$var`, else `.tools/<name>`, else (for kubectl only) `kubectl` on the PATH.
fn tool(var: &str, name: &str, path_fallback: bool) -> Option<PathBuf> {
    if let Some(explicit) = std::env::var_os(var) {
        return Some(PathBuf::from(explicit));
    }
    let local = repo().join(".tools").join(name);
    if local.is_file() {
        return Some(local);
    }
    if path_fallback && Command::new(name).arg("version").arg("--client").output().is_ok() {
        return Some(PathBuf::from(name));
    }
    None
}

struct Tools {
    helm: PathBuf,
    kubectl: PathBuf,
}

/// The tools, or `None` after printing why the test is skipped.
fn tools(test: &str) -> Option<Tools> {
    let helm = tool("STRATA_HELM", "helm", false);
    let kubectl = tool("STRATA_KUBECTL", "kubectl", true);
    match (helm, kubectl) {
        (Some(helm), Some(kubectl)) => Some(Tools { helm, kubectl }),
        (helm, _) => {
            let missing = if helm.is_none() { ".tools/helm" } else { "kubectl" };
            let message = format!(
                "{test}: SKIPPED: {missing} is not installed; run .ci/packaging-checks.sh to install it into .tools/ and run these checks"
            );
            assert!(std::env::var_os("STRATA_PACKAGING_REQUIRED").is_none(), "{message}");
            // Straight to stderr, past the test harness's capture, so the skip shows in `cargo test`.
            let _ = writeln!(std::io::stderr(), "{message}");
            None
        }
    }
}

fn run(program: &Path, args: &[&str]) -> String {
    let output = Command::new(program)
        .args(args)
        .current_dir(repo())
        .output()
        .unwrap_or_else(|error| panic!("running {}: {error}", program.display()));
    assert!(
        output.status.success(),
        "{} {} failed:\n{}",
        program.display(),
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

fn documents(yaml: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(yaml).unwrap().into_iter().filter(|doc| doc.is_object()).collect()
}

const ALL_FEATURES: &str = "charts/strata/ci/all-features-values.yaml";

fn helm_default(tools: &Tools) -> Vec<Value> {
    documents(&run(
        &tools.helm,
        &["template", "strata", "charts/strata", "--namespace", "strata-system", "--include-crds"],
    ))
}

fn helm_all_features(tools: &Tools) -> Vec<Value> {
    documents(&run(
        &tools.helm,
        &[
            "template",
            "strata",
            "charts/strata",
            "--namespace",
            "strata-system",
            "--include-crds",
            "-f",
            ALL_FEATURES,
        ],
    ))
}

fn kustomize(tools: &Tools) -> Vec<Value> {
    documents(&run(&tools.kubectl, &["kustomize", "config/default"]))
}

fn kind(doc: &Value) -> &str {
    doc["kind"].as_str().unwrap_or_default()
}

fn name(doc: &Value) -> String {
    format!("{}/{}", kind(doc), doc["metadata"]["name"].as_str().unwrap_or_default())
}

fn of_kind<'a>(docs: &'a [Value], wanted: &str) -> Vec<&'a Value> {
    docs.iter().filter(|doc| kind(doc) == wanted).collect()
}

fn the<'a>(docs: &'a [Value], wanted: &str) -> &'a Value {
    let found = of_kind(docs, wanted);
    assert_eq!(found.len(), 1, "expected exactly one {wanted}, found {}", found.len());
    found[0]
}

// ---------------------------------------------------------------------------------------------
// Pod Security "restricted"

/// Every pod spec in a render, with where it came from.
fn pod_specs(docs: &[Value]) -> Vec<(String, &Value)> {
    let mut specs = Vec::new();
    for doc in docs {
        let spec = match kind(doc) {
            "Pod" => Some(&doc["spec"]),
            "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet" | "Job" => {
                Some(&doc["spec"]["template"]["spec"])
            }
            "CronJob" => Some(&doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]),
            _ => None,
        };
        if let Some(spec) = spec {
            specs.push((name(doc), spec));
        }
    }
    specs
}

/// Why a pod spec is not PSS restricted (empty when it is).
fn restricted_violations(pod: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let pod_sc = &pod["securityContext"];
    for host in ["hostNetwork", "hostPID", "hostIPC"] {
        if pod[host] == json!(true) {
            problems.push(format!("{host} is true"));
        }
    }
    if pod_sc["runAsUser"] == json!(0) {
        problems.push("pod runAsUser is 0".into());
    }
    let containers = ["initContainers", "containers", "ephemeralContainers"]
        .iter()
        .flat_map(|field| pod[field].as_array().cloned().unwrap_or_default());
    let mut any = false;
    for container in containers {
        any = true;
        let cname = container["name"].as_str().unwrap_or("?").to_string();
        let sc = &container["securityContext"];
        let non_root = sc.get("runAsNonRoot").or_else(|| pod_sc.get("runAsNonRoot"));
        if non_root != Some(&json!(true)) {
            problems.push(format!("{cname}: runAsNonRoot is not true (pod or container)"));
        }
        if sc["runAsUser"] == json!(0) {
            problems.push(format!("{cname}: runAsUser is 0"));
        }
        let seccomp = sc
            .get("seccompProfile")
            .or_else(|| pod_sc.get("seccompProfile"))
            .and_then(|profile| profile["type"].as_str());
        if !matches!(seccomp, Some("RuntimeDefault" | "Localhost")) {
            problems.push(format!("{cname}: seccompProfile.type is {seccomp:?}, not RuntimeDefault"));
        }
        if sc["allowPrivilegeEscalation"] != json!(false) {
            problems.push(format!("{cname}: allowPrivilegeEscalation is not false"));
        }
        if sc["privileged"] == json!(true) {
            problems.push(format!("{cname}: privileged"));
        }
        let drops: Vec<&str> = sc["capabilities"]["drop"]
            .as_array()
            .map(|drop| drop.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if !drops.contains(&"ALL") {
            problems.push(format!("{cname}: capabilities.drop does not contain ALL"));
        }
        for add in sc["capabilities"]["add"].as_array().into_iter().flatten() {
            if add != "NET_BIND_SERVICE" {
                problems.push(format!("{cname}: adds capability {add}"));
            }
        }
    }
    if !any {
        problems.push("no containers".into());
    }
    problems
}

fn assert_restricted(render: &str, docs: &[Value]) {
    let specs = pod_specs(docs);
    assert!(!specs.is_empty(), "{render}: no pod specs rendered");
    let failures: Vec<String> = specs
        .iter()
        .flat_map(|(name, spec)| {
            restricted_violations(spec).into_iter().map(move |problem| format!("{render} {name}: {problem}"))
        })
        .collect();
    assert!(failures.is_empty(), "not Pod Security restricted:\n{}", failures.join("\n"));
}

#[test]
fn the_restricted_check_catches_what_it_should() {
    let good = json!({
        "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "c", "securityContext": {
            "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}]
    });
    assert!(restricted_violations(&good).is_empty(), "{:?}", restricted_violations(&good));
    let bad = json!({
        "hostNetwork": true,
        "containers": [{"name": "c", "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}]
    });
    let problems = restricted_violations(&bad);
    for expected in
        ["hostNetwork", "runAsNonRoot", "seccompProfile", "allowPrivilegeEscalation", "drop", "SYS_ADMIN"]
    {
        assert!(problems.iter().any(|p| p.contains(expected)), "{expected} not caught: {problems:?}");
    }
}

#[test]
fn every_rendered_pod_spec_is_pss_restricted() {
    let Some(tools) = tools("every_rendered_pod_spec_is_pss_restricted") else { return };
    assert_restricted("helm template (defaults)", &helm_default(&tools));
    assert_restricted("helm template (all features)", &helm_all_features(&tools));
    assert_restricted("kubectl kustomize config/default", &kustomize(&tools));
}

// ---------------------------------------------------------------------------------------------
// RBAC

/// A ClusterRole rule that lets its subject read Secrets in every namespace.
fn reads_secrets_cluster_wide(rule: &Value) -> bool {
    let has = |field: &str, wanted: &[&str]| {
        rule[field]
            .as_array()
            .is_some_and(|list| list.iter().any(|v| wanted.contains(&v.as_str().unwrap_or_default())))
    };
    has("apiGroups", &["", "*"])
        && has("resources", &["secrets", "*"])
        && has("verbs", &["get", "list", "watch", "*"])
}

fn assert_no_cluster_secret_reads(render: &str, docs: &[Value]) {
    let roles = of_kind(docs, "ClusterRole");
    assert!(!roles.is_empty(), "{render}: no ClusterRole rendered");
    for role in roles {
        for rule in role["rules"].as_array().into_iter().flatten() {
            assert!(
                !reads_secrets_cluster_wide(rule),
                "{render} {} reads Secrets cluster-wide: {rule}",
                name(role)
            );
        }
    }
}

#[test]
fn the_secret_check_catches_what_it_should() {
    assert!(reads_secrets_cluster_wide(
        &json!({"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]})
    ));
    assert!(reads_secrets_cluster_wide(&json!({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]})));
    assert!(!reads_secrets_cluster_wide(
        &json!({"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]})
    ));
    assert!(!reads_secrets_cluster_wide(
        &json!({"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]})
    ));
}

#[test]
fn no_cluster_role_reads_secrets() {
    let Some(tools) = tools("no_cluster_role_reads_secrets") else { return };
    assert_no_cluster_secret_reads("helm template (defaults)", &helm_default(&tools));
    assert_no_cluster_secret_reads("helm template (all features)", &helm_all_features(&tools));
    assert_no_cluster_secret_reads("kubectl kustomize config/default", &kustomize(&tools));
}

/// A role's rules as a sorted set of sorted, comparable rules.
fn normalized_rules(role: &Value) -> BTreeSet<String> {
    role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|rule| {
            let mut fields = BTreeMap::new();
            for (key, value) in rule.as_object().unwrap() {
                let mut items: Vec<String> =
                    value.as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect();
                items.sort();
                fields.insert(key.clone(), items);
            }
            serde_json::to_string(&fields).unwrap()
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// config/default and the chart's defaults

/// Kinds only kustomize renders: Helm takes its namespace from `--namespace --create-namespace`.
const KUSTOMIZE_ONLY: &[&str] = &["Namespace"];

#[test]
fn config_default_and_chart_defaults_install_the_same_thing() {
    let Some(tools) = tools("config_default_and_chart_defaults_install_the_same_thing") else { return };
    let kustomized = kustomize(&tools);
    let helm = helm_default(&tools);

    let kinds = |docs: &[Value], skip: &[&str]| -> BTreeSet<String> {
        docs.iter().map(|doc| kind(doc).to_string()).filter(|k| !skip.contains(&k.as_str())).collect()
    };
    assert_eq!(
        kinds(&kustomized, KUSTOMIZE_ONLY),
        kinds(&helm, &[]),
        "the kinds of `kubectl kustomize config/default` and `helm template charts/strata` differ"
    );
    let crds = |docs: &[Value]| -> BTreeSet<String> {
        of_kind(docs, "CustomResourceDefinition").into_iter().map(name).collect()
    };
    assert_eq!(crds(&kustomized), crds(&helm), "the CRDs differ");

    for role_kind in ["ClusterRole", "Role"] {
        assert_eq!(
            normalized_rules(the(&kustomized, role_kind)),
            normalized_rules(the(&helm, role_kind)),
            "{role_kind} rules differ between config/rbac and charts/strata/templates/rbac.yaml: config/rbac is the source of truth"
        );
    }
    for binding in ["ClusterRoleBinding", "RoleBinding"] {
        let (k, h) = (the(&kustomized, binding), the(&helm, binding));
        assert_eq!(k["roleRef"], h["roleRef"], "{binding} roleRef");
        assert_eq!(k["subjects"], h["subjects"], "{binding} subjects");
    }

    let (k, h) = (the(&kustomized, "Deployment"), the(&helm, "Deployment"));
    assert_eq!(k["metadata"]["name"], h["metadata"]["name"], "Deployment name");
    assert_eq!(k["metadata"]["namespace"], h["metadata"]["namespace"], "Deployment namespace");
    assert_eq!(k["spec"]["replicas"], h["spec"]["replicas"], "replicas");
    let (kp, hp) = (&k["spec"]["template"]["spec"], &h["spec"]["template"]["spec"]);
    for field in ["serviceAccountName", "securityContext", "terminationGracePeriodSeconds"] {
        assert_eq!(kp[field], hp[field], "pod {field}");
    }
    let (kc, hc) = (&kp["containers"][0], &hp["containers"][0]);
    for field in
        ["name", "image", "ports", "livenessProbe", "readinessProbe", "resources", "securityContext", "env"]
    {
        assert_eq!(kc[field], hc[field], "controller container {field}");
    }
    // The chart states every flag; the kustomize install relies on the same values as defaults.
    let args = |c: &Value| -> BTreeSet<String> {
        c["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_string()).collect()
    };
    let (ka, ha) = (args(kc), args(hc));
    assert!(ka.is_subset(&ha), "config/manager passes args the chart does not: {:?}", ka.difference(&ha));
    for extra in ha.difference(&ka) {
        let default_valued = extra == "--leader-election"
            || extra == "--lease-name=strata-controller-leader"
            || extra == &format!("--gateway-image={}", kc["image"].as_str().unwrap());
        assert!(default_valued, "the chart passes {extra}, which config/manager does not default to");
    }

    let (k, h) = (the(&kustomized, "Service"), the(&helm, "Service"));
    assert_eq!(k["metadata"]["name"], h["metadata"]["name"], "Service name");
    assert_eq!(k["spec"]["ports"], h["spec"]["ports"], "Service ports");
}

#[test]
fn every_optional_feature_renders() {
    let Some(tools) = tools("every_optional_feature_renders") else { return };
    let docs = helm_all_features(&tools);
    let kinds: BTreeSet<&str> = docs.iter().map(kind).collect();
    for wanted in ["ServiceMonitor", "NetworkPolicy", "ClusterContextPolicy", "ConfigMap", "PrometheusRule"] {
        assert!(kinds.contains(wanted), "all-features render has no {wanted}: {kinds:?}");
    }
    let policy = the(&docs, "ClusterContextPolicy");
    if let Err(violations) = strata_api::schema_check::validate_manifest(policy, None) {
        panic!(
            "the chart's fleetPolicy is rejected by the CRD: {}",
            violations.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
        );
    }
    let dashboard = the(&docs, "ConfigMap");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], json!("1"));
    let shipped = dashboard["data"]["strata-fleet.json"].as_str().unwrap();
    let on_disk = std::fs::read_to_string(chart().join("dashboards/strata-fleet.json")).unwrap();
    assert_eq!(shipped.trim_end(), on_disk.trim_end(), "the ConfigMap must carry the dashboard unchanged");

    let deployment = the(&docs, "Deployment");
    let args = deployment["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(args.contains("--gateway-image=ghcr.io/strata-dev/strata:0.1.0-gateway"), "{args}");
    assert!(args.contains("--compactor-image=ghcr.io/strata-dev/strata-compactor:"), "{args}");
}

#[test]
fn more_than_one_replica_needs_leader_election() {
    let Some(tools) = tools("more_than_one_replica_needs_leader_election") else { return };
    let output = Command::new(&tools.helm)
        .args(["template", "strata", "charts/strata", "--set", "leaderElection.enabled=false"])
        .current_dir(repo())
        .output()
        .unwrap();
    assert!(!output.status.success(), "replicas=2 without leader election must not render");
    let single = run(
        &tools.helm,
        &[
            "template",
            "strata",
            "charts/strata",
            "--set",
            "leaderElection.enabled=false",
            "--set",
            "replicas=1",
        ],
    );
    assert!(single.contains("--no-leader-election"));
    assert!(!single.contains("leases"), "no Lease rules without leader election");
}

// ---------------------------------------------------------------------------------------------
// Checks that need no tools

/// Every metric name the controller's and the gateway's registries export.
fn registered_metrics() -> BTreeSet<String> {
    let mut names: BTreeSet<String> = strata::gateway::metric_names().unwrap().into_iter().collect();
    names.extend(strata::controller::metrics::Metrics::new().unwrap().names());
    names
}

/// The `strata_*` metric names `expr` queries that no registry exports (histogram series count as
/// their family).
fn unknown_metrics(expr: &str, known: &BTreeSet<String>) -> Vec<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|word| word.starts_with("strata_"))
        .filter(|word| {
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| word.strip_suffix(suffix).filter(|b| known.contains(*b)))
                .unwrap_or(word);
            !known.contains(base)
        })
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_alerts_query_only_metrics_the_code_exports_and_say_what_to_do() {
    let Some(tools) = tools("the_alerts_query_only_metrics_the_code_exports_and_say_what_to_do") else {
        return;
    };
    let default = helm_default(&tools);
    assert!(of_kind(&default, "PrometheusRule").is_empty(), "the alerts are opt-in");
    let docs = helm_all_features(&tools);
    let rule = the(&docs, "PrometheusRule");
    let known = registered_metrics();
    let mut alerts = BTreeSet::new();
    let mut unknown = Vec::new();
    for group in rule["spec"]["groups"].as_array().unwrap() {
        for alert in group["rules"].as_array().unwrap() {
            let name = alert["alert"].as_str().unwrap().to_owned();
            let expr = alert["expr"].as_str().unwrap();
            assert!(expr.contains("strata_gateway_"), "{name} queries no Strata metric: {expr}");
            unknown
                .extend(unknown_metrics(expr, &known).into_iter().map(|metric| format!("{name}: {metric}")));
            let description = alert["annotations"]["description"].as_str().unwrap_or_default();
            assert!(description.len() > 120, "{name} must say what to do: {description:?}");
            let has_cause = alert["labels"]["cause"].is_string() || expr.contains("cause");
            assert!(has_cause, "{name} carries no cause classification");
            alerts.insert(name);
        }
    }
    assert!(unknown.is_empty(), "the alerts query metrics no code exports: {unknown:?}");
    for wanted in [
        "StrataContextOverThreshold",
        "StrataPrefixChurnSustained",
        "StrataCompactionPreservationFailures",
        "StrataBlockedOperations",
        "StrataCompactionFailures",
        "StrataVolumeNearlyFull",
        "StrataGatewayConfigRejected",
        "StrataEgressRejected",
    ] {
        assert!(alerts.contains(wanted), "the rule has no alert {wanted}: {alerts:?}");
    }
    let churn = unknown_metrics("strata_gateway_no_such_metric + strata_gateway_prefix_churn_total", &known);
    assert_eq!(churn, ["strata_gateway_no_such_metric"], "the check itself finds unknown names");
}

#[test]
fn the_dashboard_queries_only_metrics_the_code_exports() {
    let text = std::fs::read_to_string(chart().join("dashboards/strata-fleet.json")).unwrap();
    let dashboard: Value = serde_json::from_str(&text).unwrap();
    let known = registered_metrics();
    assert!(known.contains("strata_gateway_context_tokens") && known.contains("strata_controller_leader"));
    let mut titles = BTreeSet::new();
    let mut unknown = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        titles.insert(panel["title"].as_str().unwrap().to_string());
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap();
            for word in unknown_metrics(expr, &known) {
                unknown.push(format!("{}: {word}", panel["title"]));
            }
        }
    }
    assert!(unknown.is_empty(), "the dashboard queries metrics no code exports: {unknown:?}");
    for wanted in [
        "Fleet context % per agent",
        "Budget level distribution",
        "Prompt tokens by kind (cached, fresh, cache write)",
        "Prefix churn by cause",
        "Compaction and context savings",
        "Blocked operations",
        "Reconcile errors by controller and reason",
    ] {
        assert!(titles.contains(wanted), "the dashboard has no panel {wanted:?}");
    }
}

#[test]
fn the_chart_app_version_is_the_crate_version() {
    // The controller's default gateway image is ghcr.io/strata-dev/strata:<crate version>; the chart's
    // default image tag is its appVersion. They must agree.
    let chart_yaml = std::fs::read_to_string(chart().join("Chart.yaml")).unwrap();
    let chart: Value = serde_saphyr::from_str(&chart_yaml).unwrap();
    assert_eq!(
        chart["appVersion"],
        json!(env!("CARGO_PKG_VERSION")),
        "bump appVersion in charts/strata/Chart.yaml"
    );
}

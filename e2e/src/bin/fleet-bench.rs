//! `fleet-bench N`: the operator at scale on a real control plane. Creates N Agents (100 per
//! namespace, with the ConfigMaps they refer to) against the controller that `e2e/control-plane.sh
//! --bench N` runs, and reports: the time until every Agent has its StatefulSet and `status.prefix`,
//! the controller's RSS, apiserver requests per reconcile while converging, and the writes of a quiet
//! window longer than one resync. Prints one Markdown table row for BENCHMARKS.md.
//!
//! Before the fleet it measures the control plane's own write ceiling: server-side applies of
//! small ConfigMaps, `CALIBRATION_IN_FLIGHT` at a time, with nothing else running. While the fleet
//! converges it counts every write the apiserver served (its `apiserver_request_total`, all
//! clients: the bench, the controller, the kube-controller-manager), so a converge time can be
//! read against what this control plane can write at all.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams, PostParams};
use kube::core::PartialObjectMeta;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use strata_api::Agent;
use strata_e2e::{
    E2eError, TempNamespace, client, controller_metrics, controller_pid, controller_writes, install_crds,
    load_documents, metric_sum, repo_root, samples_dir,
};

const AGENTS_PER_NAMESPACE: usize = 100;
const CREATES_IN_FLIGHT: usize = 32;
/// How long the bench waits for convergence before it gives up and says how far the fleet got.
const CONVERGE_LIMIT: Duration = Duration::from_secs(3600);
/// Server-side applies in the control-plane calibration, and how many are in flight at once.
const CALIBRATION_APPLIES: usize = 4000;
const CALIBRATION_IN_FLIGHT: usize = 64;

/// Writes the apiserver has served so far, from every client (its own `apiserver_request_total`;
/// server-side applies are counted under the verb APPLY).
async fn apiserver_writes(client: &Client) -> Result<f64, Box<dyn std::error::Error>> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    let text = client.request_text(request).await?;
    Ok(["POST", "PUT", "PATCH", "APPLY", "DELETE"]
        .iter()
        .map(|verb| metric_sum(&text, "apiserver_request_total", &format!("verb=\"{verb}\"")))
        .sum())
}

/// The control plane's write ceiling here: server-side applies of small ConfigMaps, many in
/// flight, in a namespace of their own. Returns applies per second.
async fn calibrate(client: &Client) -> Result<f64, Box<dyn std::error::Error>> {
    let namespace = TempNamespace::create(client, "calibrate", &[]).await?;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace.name);
    let params = PatchParams::apply("strata.dev/fleet-bench");
    let started = Instant::now();
    let applies = futures::stream::iter(0..CALIBRATION_APPLIES)
        .map(|n| {
            let maps = maps.clone();
            let params = params.clone();
            async move {
                let name = format!("calibrate-{n:05}");
                let body = serde_json::json!({
                    "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": name, "labels": {"strata.dev/bench": "calibration"}},
                    "data": {"gateway.json": "{\"listen\":\"0.0.0.0:8080\",\"mode\":\"stateful\"}"},
                });
                maps.patch(&name, &params, &Patch::Apply(&body)).await.map(|_| ())
            }
        })
        .buffer_unordered(CALIBRATION_IN_FLIGHT);
    futures::pin_mut!(applies);
    while let Some(result) = applies.next().await {
        result?;
    }
    let rate = CALIBRATION_APPLIES as f64 / started.elapsed().as_secs_f64();
    namespace.delete().await?;
    Ok(rate)
}

fn rss_mib(pid: i32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
            line.split_whitespace().nth(1)?.parse::<f64>().ok()
        })
        .map_or(f64::NAN, |kib| kib / 1024.0)
}

/// What the watches have seen so far: the Agents with a `status.prefix`, and the StatefulSets the
/// operator manages. Kept current by [`follow_fleet`] from two watches, so the bench adds no LIST
/// polling of its own to the apiserver's load (an earlier version LISTed every Agent and StatefulSet
/// every two seconds, which at 10,000 Agents took 13 to 20 s a poll).
#[derive(Default)]
struct Progress {
    agents_with_status: HashSet<(String, String)>,
    stateful_sets: HashSet<(String, String)>,
}

fn key_of(meta: &kube::api::ObjectMeta) -> (String, String) {
    (meta.namespace.clone().unwrap_or_default(), meta.name.clone().unwrap_or_default())
}

/// Follow the fleet's Agents (whole objects: the status is not in the metadata) and the managed
/// StatefulSets (metadata only) until the process ends.
fn follow_fleet(client: &Client, progress: Arc<Mutex<Progress>>) {
    let agents = watcher(Api::<Agent>::all(client.clone()), watcher::Config::default().any_semantic())
        .default_backoff()
        .touched_objects();
    let agent_progress = progress.clone();
    tokio::spawn(async move {
        futures::pin_mut!(agents);
        while let Some(next) = agents.next().await {
            let Ok(agent) = next else { continue };
            let done = agent.status.as_ref().is_some_and(|s| s.prefix.is_some());
            if done && let Ok(mut progress) = agent_progress.lock() {
                progress.agents_with_status.insert(key_of(&agent.metadata));
            }
        }
    });
    let sets = watcher(
        Api::<PartialObjectMeta<StatefulSet>>::all(client.clone()),
        watcher::Config::default().labels("app.kubernetes.io/managed-by=strata-operator").any_semantic(),
    )
    .default_backoff()
    .touched_objects();
    tokio::spawn(async move {
        futures::pin_mut!(sets);
        while let Some(next) = sets.next().await {
            let Ok(set) = next else { continue };
            if let Ok(mut progress) = progress.lock() {
                progress.stateful_sets.insert(key_of(&set.metadata));
            }
        }
    });
}

fn requests(text: &str) -> f64 {
    metric_sum(text, "strata_controller_apiserver_requests_total", "client=\"reconcilers\"")
}

fn reconciles(text: &str) -> f64 {
    metric_sum(text, "strata_controller_reconciles_total", "controller=\"agent\"")
}

async fn create_namespace(
    client: &Client,
    index: usize,
    template: &Agent,
    maps: &[ConfigMap],
) -> Result<TempNamespace, E2eError> {
    let namespace =
        TempNamespace::create(client, &format!("bench{index}"), &[("strata.dev/fleet", "always-on")]).await?;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace.name);
    for map in maps {
        let mut map = map.clone();
        map.metadata.namespace = Some(namespace.name.clone());
        config_maps.create(&PostParams::default(), &map).await?;
    }
    let agents: Api<Agent> = Api::namespaced(client.clone(), &namespace.name);
    let numbers: Vec<usize> = (0..AGENTS_PER_NAMESPACE).collect();
    for batch in numbers.chunks(CREATES_IN_FLIGHT) {
        let creates = batch.iter().map(|n| {
            let mut agent = template.clone();
            agent.metadata.name = Some(format!("agent-{n:03}"));
            let agents = agents.clone();
            async move { agents.create(&PostParams::default(), &agent).await.map(|_| ()) }
        });
        for result in futures::future::join_all(creates).await {
            result?;
        }
    }
    Ok(namespace)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let total: usize = std::env::args().nth(1).ok_or("usage: fleet-bench N")?.parse()?;
    let quiet_seconds: u64 = std::env::args().nth(2).map_or(Ok(75), |s| s.parse())?;
    let client = client().await?;
    install_crds(&client).await?;
    let references = repo_root().join("operator/strata/tests/golden/fleet-references.yaml");
    let maps: Vec<ConfigMap> = load_documents(&references)?
        .into_iter()
        .filter(|d| d["kind"] == "ConfigMap")
        .map(serde_json::from_value)
        .collect::<Result<_, _>>()?;
    let doc = load_documents(&samples_dir().join("strata_v1alpha1_agent.yaml"))?.remove(0);
    let mut template: Agent = serde_json::from_value(doc)?;
    template.spec.context_policy_ref = None;

    let ceiling = calibrate(&client).await?;
    eprintln!(
        "control plane write ceiling: {ceiling:.0} server-side applies/s ({CALIBRATION_IN_FLIGHT} in flight)"
    );
    // Let the calibration namespace's deletion finish before the fleet starts.
    tokio::time::sleep(Duration::from_secs(20)).await;

    let pid = controller_pid();
    let start_metrics = controller_metrics().await;
    let writes_at_start = apiserver_writes(&client).await?;
    let progress = Arc::new(Mutex::new(Progress::default()));
    follow_fleet(&client, progress.clone());
    let started = Instant::now();
    let namespaces = total.div_ceil(AGENTS_PER_NAMESPACE);
    let mut created = Vec::new();
    for index in 0..namespaces {
        created.push(create_namespace(&client, index, &template, &maps).await?);
    }
    let created_after = started.elapsed();
    eprintln!("created {total} Agents in {namespaces} namespaces in {created_after:.1?}");

    let mut peak_rss = rss_mib(pid);
    let mut last_report = Instant::now();
    let converged = loop {
        let (with_status, with_children) = {
            let progress = progress.lock().map_err(|_| "the progress lock was poisoned")?;
            (progress.agents_with_status.len(), progress.stateful_sets.len())
        };
        peak_rss = peak_rss.max(rss_mib(pid));
        let done = with_status >= total && with_children >= total;
        if done || last_report.elapsed() >= Duration::from_secs(10) {
            eprintln!(
                "{:>6.1?}: {with_children}/{total} StatefulSets, {with_status}/{total} statuses, RSS {:.1} MiB (peak {peak_rss:.1})",
                started.elapsed(),
                rss_mib(pid)
            );
            last_report = Instant::now();
        }
        if done {
            break started.elapsed();
        }
        if started.elapsed() > CONVERGE_LIMIT {
            return Err(format!(
                "not converged after {} min: {with_children} StatefulSets, {with_status} statuses",
                CONVERGE_LIMIT.as_secs() / 60
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let converged_metrics = controller_metrics().await;
    let per_reconcile = (requests(&converged_metrics) - requests(&start_metrics))
        / (reconciles(&converged_metrics) - reconciles(&start_metrics)).max(1.0);
    let rss_converged = rss_mib(pid);
    let fleet_writes = apiserver_writes(&client).await? - writes_at_start;
    eprintln!(
        "the apiserver served {fleet_writes:.0} writes while the fleet converged ({:.0}/s; ceiling {ceiling:.0}/s)",
        fleet_writes / converged.as_secs_f64()
    );

    // Let the last watch events land, then watch a window longer than one resync.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let writes_before = controller_writes().await;
    let reconciles_before = reconciles(&controller_metrics().await);
    tokio::time::sleep(Duration::from_secs(quiet_seconds)).await;
    let quiet_metrics = controller_metrics().await;
    let quiet_writes = controller_writes().await - writes_before;
    let quiet_reconciles = reconciles(&quiet_metrics) - reconciles_before;
    let rss_quiet = rss_mib(pid);
    peak_rss = peak_rss.max(rss_quiet);

    println!(
        "| {total} | {:.0} s | {:.1} MiB | {:.1} MiB | {:.1} MiB | {per_reconcile:.1} | {quiet_reconciles:.0} reconciles, {quiet_writes:.0} writes in {quiet_seconds} s |",
        converged.as_secs_f64(),
        rss_converged,
        peak_rss,
        rss_quiet
    );
    for namespace in created {
        namespace.delete().await?;
    }
    Ok(())
}

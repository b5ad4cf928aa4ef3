//! Shared fixtures of the controller tests: the seed-003 fleet with its references, a fixed master
//! key and clock, caches filled by hand, and an in-process fake apiserver that records requests.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use http::{Request, Response, StatusCode};
use k8s_openapi::api::core::v1::{ConfigMap, Event as CoreEvent, Namespace, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::client::Body;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{Lookup, Store, store};
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use strata::controller::agent::dereference::{AgentInputs, Fetched, NamespaceInfo, PolicyLookup};
use strata::controller::agent_pods::PodIndex;
use strata::controller::child_index::ChildIndex;
use strata::controller::context::{Caches, Context, Settings};
use strata::controller::metrics::Metrics;
use strata_api::{Agent, ClusterContextPolicy, CompactionJob, ContextPolicy};
use strata_core::cache_key::MasterKey;

pub const NAMESPACE: &str = "rateright";

/// A Budget-mode CompactionJob `name` for the fixture's `builder`, in its namespace.
#[allow(dead_code)] // not every test binary that includes this module compacts
pub fn budget_compaction_job(name: &str) -> CompactionJob {
    use strata_api::compaction_job::{CompactionJobSpec, CompactionMode};
    use strata_api::refs::LocalRef;
    let mut job = CompactionJob::new(
        name,
        CompactionJobSpec {
            agent_ref: LocalRef { name: "builder".into() },
            mode: CompactionMode::Budget,
            reason: None,
            resume_instruction: None,
            rollback: None,
            purge: None,
            ttl_seconds_after_finished: None,
        },
    );
    job.metadata.namespace = Some(NAMESPACE.into());
    job
}
pub const OPERATOR_NAMESPACE: &str = "strata-system";
pub const GATEWAY_IMAGE: &str = "ghcr.io/strata-dev/strata:0.1.0";

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_saphyr::from_str_multiple::<Value, Vec<Value>>(&text).unwrap()
}

fn of_kind<K: DeserializeOwned>(docs: &[Value], kind: &str) -> Vec<K> {
    docs.iter().filter(|d| d["kind"] == kind).map(|d| serde_json::from_value(d.clone()).unwrap()).collect()
}

/// The eight Agents of seed 003, as the apiserver would hand them to the controller.
pub fn fleet() -> Vec<Agent> {
    let samples = repo_root().join("config/samples");
    let mut docs = documents(&samples.join("strata_v1alpha1_agent.yaml"));
    docs.extend(documents(&samples.join("fleet-rateright.yaml")));
    of_kind::<Agent>(&docs, "Agent")
        .into_iter()
        .map(|mut agent| {
            let name = agent.metadata.name.clone().unwrap();
            agent.metadata.namespace = Some(NAMESPACE.into());
            agent.metadata.uid = Some(format!("00000000-0000-4000-8000-{:0>12}", name));
            agent.metadata.generation = Some(1);
            agent
        })
        .collect()
}

pub fn agent(name: &str) -> Agent {
    fleet().into_iter().find(|a| a.metadata.name.as_deref() == Some(name)).unwrap()
}

pub fn cluster_policies() -> Vec<ClusterContextPolicy> {
    of_kind(
        &documents(&repo_root().join("config/samples/strata_v1alpha1_clustercontextpolicy.yaml")),
        "ClusterContextPolicy",
    )
}

pub fn context_policies() -> Vec<ContextPolicy> {
    of_kind::<ContextPolicy>(
        &documents(&repo_root().join("config/samples/strata_v1alpha1_contextpolicy.yaml")),
        "ContextPolicy",
    )
    .into_iter()
    .map(|mut p| {
        p.metadata.namespace = Some(NAMESPACE.into());
        p
    })
    .collect()
}

fn reference_docs() -> Vec<Value> {
    documents(&golden_dir().join("fleet-references.yaml"))
}

/// The referenced ConfigMaps, each at resourceVersion 1.
pub fn config_maps() -> Vec<ConfigMap> {
    of_kind::<ConfigMap>(&reference_docs(), "ConfigMap")
        .into_iter()
        .map(|mut map| {
            map.metadata.resource_version = Some("1".into());
            map
        })
        .collect()
}

/// The referenced ConfigMaps as the metadata watch caches them.
pub fn config_map_metas() -> Vec<PartialObjectMeta<ConfigMap>> {
    config_maps()
        .into_iter()
        .map(|map| PartialObjectMeta {
            types: None,
            metadata: map.metadata,
            _phantom: std::marker::PhantomData,
        })
        .collect()
}

pub fn namespace_meta() -> PartialObjectMeta<Namespace> {
    let namespace: Namespace = of_kind(&reference_docs(), "Namespace").remove(0);
    PartialObjectMeta { types: None, metadata: namespace.metadata, _phantom: std::marker::PhantomData }
}

pub fn namespace_info() -> NamespaceInfo {
    let meta = namespace_meta().metadata;
    NamespaceInfo {
        name: NAMESPACE.into(),
        uid: meta.uid.unwrap(),
        labels: meta.labels.unwrap_or_default(),
        cache_epoch: meta.annotations.and_then(|a| a.get("strata.dev/cache-epoch").cloned()),
    }
}

fn config_map_text(name: &str, key: &str) -> Fetched {
    match config_maps().into_iter().find(|cm| cm.metadata.name.as_deref() == Some(name)) {
        None => Fetched::MissingConfigMap(name.into()),
        Some(cm) => match cm.data.unwrap_or_default().get(key) {
            Some(text) => Fetched::Text(text.clone()),
            None => Fetched::MissingKey { name: name.into(), key: key.into() },
        },
    }
}

/// What dereference would fetch for `agent` in the fixture cluster (the pod does not exist yet).
pub fn inputs_for(agent: &Agent) -> AgentInputs {
    let prefix = agent.spec.stable_prefix.clone().unwrap_or_default();
    let policy_name =
        agent.spec.context_policy_ref.as_ref().map(|r| r.name.clone()).unwrap_or("default".into());
    let context_policy =
        match context_policies().into_iter().find(|p| p.metadata.name.as_deref() == Some(&policy_name)) {
            Some(policy) => PolicyLookup::Found(Box::new(policy)),
            None => PolicyLookup::NoDefault,
        };
    AgentInputs {
        namespace: namespace_info(),
        cluster_policies: cluster_policies(),
        context_policy,
        system_prompt: prefix.system_prompt.map(|source| match (source.inline, source.config_map_key_ref) {
            (Some(text), _) => Fetched::Text(text),
            (None, Some(r)) => config_map_text(&r.name, &r.key),
            (None, None) => Fetched::Text(String::new()),
        }),
        tools: prefix.tools.map(|r| config_map_text(&r.name, &r.key)),
        trusted_authorities: agent
            .spec
            .model
            .egress
            .as_ref()
            .and_then(|egress| egress.trusted_ca_config_map_ref.as_ref())
            .map(|r| config_map_text(&r.name, &r.key)),
        pod: None,
    }
}

pub fn master_key() -> MasterKey {
    MasterKey::new(vec![0x42; 32]).unwrap()
}

pub fn settings() -> Settings {
    Settings::new(GATEWAY_IMAGE, GATEWAY_IMAGE, OPERATOR_NAMESPACE)
}

pub fn fixed_now() -> Timestamp {
    Timestamp::from_second(1_760_000_000).unwrap()
}

/// A store holding exactly `objects`, marked ready.
pub fn filled_store<K>(objects: Vec<K>) -> Store<K>
where
    K: Lookup + Clone + 'static,
    <K as Lookup>::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (reader, mut writer) = store::<K>();
    writer.apply_watcher_event(&watcher::Event::Init);
    for object in objects {
        writer.apply_watcher_event(&watcher::Event::InitApply(object));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    reader
}

/// Caches of the fixture cluster: the fleet, both sample policies, the namespace, no jobs.
pub fn fleet_caches(compaction_jobs: Vec<CompactionJob>, context_policies_present: bool) -> Caches {
    Caches {
        agents: filled_store(fleet()),
        context_policies: filled_store(if context_policies_present {
            context_policies()
        } else {
            Vec::new()
        }),
        cluster_policies: filled_store(cluster_policies()),
        namespaces: filled_store(vec![namespace_meta()]),
        compaction_jobs: filled_store(compaction_jobs),
        children: ChildIndex::new_synced(),
        pods: PodIndex::new_synced(),
        mount_failures: filled_store(Vec::new()),
        config_maps: filled_store(config_map_metas()),
    }
}

/// `caches` with the pod index holding exactly `pod` (as JSON), as the watch records it.
pub fn with_pod(mut caches: Caches, pod: Value) -> Caches {
    let pod: Pod = serde_json::from_value(pod).unwrap();
    caches.pods = PodIndex::new_synced();
    caches.pods.insert(&pod);
    caches
}

/// `caches` with the FailedMount event cache holding exactly `events` (as JSON).
pub fn with_mount_failures(mut caches: Caches, events: Vec<Value>) -> Caches {
    let events: Vec<CoreEvent> = events
        .into_iter()
        .map(|event| {
            let mut event: CoreEvent = serde_json::from_value(event).unwrap();
            strata::controller::agent_pods::trim_event(&mut event);
            event
        })
        .collect();
    caches.mount_failures = filled_store(events);
    caches
}

/// One request the fake apiserver saw.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub query: String,
    pub body: Value,
}

impl Seen {
    pub fn is_write(&self) -> bool {
        self.method != "GET"
    }
}

/// How the fake apiserver answers: `Some((status, body))`, or `None` for the default answer.
pub type Responder = Box<dyn Fn(&Seen) -> Option<(u16, Value)> + Send + Sync>;

/// An in-process apiserver behind a tower-test mock: answers every request and records it.
pub struct FakeApiServer {
    pub seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

pub fn status_body(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": format!("{reason} (fake apiserver)"), "reason": reason, "code": code})
}

/// The default answers: config maps of the fixture, 404 for anything else read, echo for writes.
pub fn default_answer(seen: &Seen) -> (u16, Value) {
    match seen.method.as_str() {
        "GET" => {
            if let Some(name) = seen.path.strip_prefix(&format!("/api/v1/namespaces/{NAMESPACE}/configmaps/"))
            {
                return match config_maps().into_iter().find(|cm| cm.metadata.name.as_deref() == Some(name)) {
                    Some(cm) => (200, serde_json::to_value(cm).unwrap()),
                    None => (404, status_body(404, "NotFound")),
                };
            }
            if seen.path.ends_with("/events") {
                return (200, json!({"apiVersion": "v1", "kind": "EventList", "metadata": {}, "items": []}));
            }
            (404, status_body(404, "NotFound"))
        }
        "DELETE" => (200, json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"})),
        _ => {
            let mut body = seen.body.clone();
            if seen.path.ends_with("/status") && seen.path.contains("/agents/") {
                let name = seen.path.split('/').rev().nth(1).unwrap().to_string();
                let mut agent = serde_json::to_value(agent(&name)).unwrap();
                agent["status"] = body["status"].clone();
                body = agent;
            }
            (if seen.method == "POST" { 201 } else { 200 }, body)
        }
    }
}

/// What the fake apiserver records of a request.
pub async fn seen_of(request: Request<Body>) -> Seen {
    let (parts, body) = request.into_parts();
    let bytes = body.collect_bytes().await.unwrap();
    Seen {
        method: parts.method.to_string(),
        path: parts.uri.path().to_string(),
        query: parts.uri.query().unwrap_or_default().to_string(),
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    }
}

/// The HTTP response for an answer of a [`Responder`].
pub fn response_of((code, answer): (u16, Value)) -> Response<Body> {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap())
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(&answer).unwrap()))
        .unwrap()
}

impl FakeApiServer {
    /// A client wired to a fake apiserver that answers with `responder`, falling back to [`default_answer`].
    pub fn start(responder: Responder) -> (Client, FakeApiServer) {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(service, "default");
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let log = seen.clone();
        let task = tokio::spawn(async move {
            while let Some((request, send)) = handle.next_request().await {
                let request = seen_of(request).await;
                let answer = responder(&request).unwrap_or_else(|| default_answer(&request));
                log.lock().unwrap().push(request);
                send.send_response(response_of(answer));
            }
        });
        (client, FakeApiServer { seen, task })
    }

    pub fn requests(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    pub fn writes(&self) -> Vec<Seen> {
        self.requests().into_iter().filter(Seen::is_write).collect()
    }

    pub fn clear(&self) {
        self.seen.lock().unwrap().clear();
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A controller context over `client` and `caches`, with the fixture key and clock.
pub fn context(client: Client, caches: Caches) -> Arc<Context> {
    Arc::new(Context::new(
        client,
        settings(),
        caches,
        Arc::new(master_key()),
        Arc::new(Metrics::new().unwrap()),
        Arc::new(fixed_now),
    ))
}

/// A context over new `caches` that shares `previous`'s memo of ConfigMap data.
pub fn context_sharing_memo(client: Client, caches: Caches, previous: &Context) -> Arc<Context> {
    let mut ctx = Context::new(
        client,
        settings(),
        caches,
        Arc::new(master_key()),
        Arc::new(Metrics::new().unwrap()),
        Arc::new(fixed_now),
    );
    ctx.config_map_data = previous.config_map_data.clone();
    Arc::new(ctx)
}

//! Helpers for Strata's real-cluster tests: a client from STRATA_E2E_KUBECONFIG, throwaway
//! namespaces, CRD installation, sample loading, waiting, and the running controller (its metrics,
//! log and process) that `e2e/control-plane.sh` starts.
//!
//! The tests in `tests/` are ignored unless STRATA_E2E_KUBECONFIG is set when they are built.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, Client, Config};
use serde_json::Value;

/// Field manager the tests apply with.
pub const FIELD_MANAGER: &str = "strata.dev/e2e";

/// What can go wrong while preparing a cluster test.
#[derive(Debug, thiserror::Error)]
pub enum E2eError {
    /// STRATA_E2E_KUBECONFIG is not set.
    #[error("STRATA_E2E_KUBECONFIG is not set: point it at a kubeconfig for a disposable test cluster")]
    NoKubeconfig,
    /// The kubeconfig could not be read or used.
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        /// Its path.
        path: PathBuf,
        /// Why.
        source: kube::config::KubeconfigError,
    },
    /// The client could not be built.
    #[error("building a client: {0}")]
    Client(#[from] kube::Error),
    /// Waiting for a condition timed out.
    #[error("timed out after {0:?} waiting for {1}")]
    Timeout(Duration, String),
    /// A sample file could not be read.
    #[error("sample {path}: {message}")]
    Sample {
        /// Its path.
        path: PathBuf,
        /// Why.
        message: String,
    },
}

/// A client for the cluster named by STRATA_E2E_KUBECONFIG.
pub async fn client() -> Result<Client, E2eError> {
    let path = PathBuf::from(std::env::var_os("STRATA_E2E_KUBECONFIG").ok_or(E2eError::NoKubeconfig)?);
    let kubeconfig =
        Kubeconfig::read_from(&path).map_err(|source| E2eError::Kubeconfig { path: path.clone(), source })?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|source| E2eError::Kubeconfig { path, source })?;
    Ok(Client::try_from(config)?)
}

/// Server-side apply every Strata CRD and wait until each is Established.
pub async fn install_crds(client: &Client) -> Result<(), E2eError> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    for crd in strata_api::crds::all() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &params, &Patch::Apply(&crd)).await?;
        let established = await_condition(api.clone(), &name, conditions::is_crd_established());
        tokio::time::timeout(Duration::from_secs(30), established)
            .await
            .map_err(|_| E2eError::Timeout(Duration::from_secs(30), format!("CRD {name} to be Established")))?
            .map_err(|e| E2eError::Timeout(Duration::from_secs(30), format!("CRD {name}: {e}")))?;
    }
    Ok(())
}

/// A namespace created for one test; call [`TempNamespace::delete`] at the end.
pub struct TempNamespace {
    /// Its name.
    pub name: String,
    client: Client,
}

impl TempNamespace {
    /// Create `strata-e2e-<prefix>-<random suffix>` with the given labels.
    pub async fn create(client: &Client, prefix: &str, labels: &[(&str, &str)]) -> Result<Self, E2eError> {
        let suffix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() % 1_000_000_000)
            .unwrap_or_default();
        let name = format!("strata-e2e-{prefix}-{suffix}");
        let mut namespace = Namespace::default();
        namespace.metadata.name = Some(name.clone());
        namespace.metadata.labels =
            Some(labels.iter().map(|(k, v)| ((*k).to_string(), (*v).to_string())).collect());
        Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &namespace).await?;
        Ok(TempNamespace { name, client: client.clone() })
    }

    /// Delete the namespace (and everything in it).
    pub async fn delete(self) -> Result<(), E2eError> {
        Api::<Namespace>::all(self.client).delete(&self.name, &DeleteParams::background()).await?;
        Ok(())
    }
}

/// Probe every second until `probe` returns a value; panics after `timeout` naming `what`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A STRATA_E2E_* variable that `e2e/control-plane.sh` exports.
pub fn harness_var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run the cluster tests through e2e/control-plane.sh, which starts the controller")
    })
}

/// The controller's Prometheus text from its metrics endpoint (a plain HTTP/1.0 GET).
pub async fn controller_metrics() -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let address = harness_var("STRATA_E2E_CONTROLLER_METRICS");
    let mut stream = tokio::net::TcpStream::connect(&address)
        .await
        .unwrap_or_else(|e| panic!("connecting to the controller's metrics on {address}: {e}"));
    stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n").await.unwrap_or_default();
    let mut text = String::new();
    stream.read_to_string(&mut text).await.unwrap_or_default();
    text
}

/// Sum of a counter's samples whose label set contains `label_filter` (e.g. `method="PATCH"`).
pub fn metric_sum(text: &str, name: &str, label_filter: &str) -> f64 {
    text.lines()
        .filter(|line| line.starts_with(name) && !line.starts_with('#'))
        .filter(|line| line[name.len()..].starts_with(['{', ' ']))
        .filter(|line| label_filter.is_empty() || line.contains(label_filter))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Writes (non-GET requests) the controller's reconcilers have sent so far (Lease renewals are the
/// leader election's and not counted).
pub async fn controller_writes() -> f64 {
    let text = controller_metrics().await;
    ["POST", "PUT", "PATCH", "DELETE"]
        .iter()
        .map(|method| {
            let filter = format!("client=\"reconcilers\",method=\"{method}\"");
            metric_sum(&text, "strata_controller_apiserver_requests_total", &filter)
        })
        .sum()
}

/// The pid of the controller process the harness runs now.
pub fn controller_pid() -> i32 {
    let file = harness_var("STRATA_E2E_CONTROLLER_PID_FILE");
    std::fs::read_to_string(&file)
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or_else(|| panic!("no pid in {file}"))
}

/// Send `signal` (e.g. "STOP", "CONT", "TERM") to a process with kill(1).
pub fn signal(pid: i32, signal: &str) {
    let status = std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .unwrap_or_else(|e| panic!("running kill: {e}"));
    assert!(status.success(), "kill -{signal} {pid} failed");
}

/// The repository's `config/samples` directory.
pub fn samples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/samples")
}

/// A namespace labelled for the fleet, with the ConfigMaps the builder Agent refers to (from the
/// golden fleet references) and the sample builder Agent (without a ContextPolicy reference, so the
/// namespace's `default` ContextPolicy applies if there is one). Installs the CRDs first.
pub async fn fleet_namespace(
    client: &Client,
    prefix: &str,
) -> Result<(TempNamespace, Api<strata_api::Agent>), E2eError> {
    install_crds(client).await?;
    let namespace = TempNamespace::create(client, prefix, &[("strata.dev/fleet", "always-on")]).await?;
    let references = repo_root().join("operator/strata/tests/golden/fleet-references.yaml");
    let maps: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), &namespace.name);
    for doc in load_documents(&references)?.into_iter().filter(|d| d["kind"] == "ConfigMap") {
        let mut map: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(doc)
            .map_err(|e| E2eError::Sample { path: references.clone(), message: e.to_string() })?;
        map.metadata.namespace = Some(namespace.name.clone());
        maps.create(&PostParams::default(), &map).await?;
    }
    let path = samples_dir().join("strata_v1alpha1_agent.yaml");
    let doc = load_documents(&path)?
        .into_iter()
        .next()
        .ok_or_else(|| E2eError::Sample { path: path.clone(), message: "no document".into() })?;
    let mut agent: strata_api::Agent =
        serde_json::from_value(doc).map_err(|e| E2eError::Sample { path, message: e.to_string() })?;
    agent.spec.context_policy_ref = None;
    let agents: Api<strata_api::Agent> = Api::namespaced(client.clone(), &namespace.name);
    agents.create(&PostParams::default(), &agent).await?;
    Ok((namespace, agents))
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every YAML document in a sample file, as JSON.
pub fn load_documents(path: &Path) -> Result<Vec<Value>, E2eError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| E2eError::Sample { path: path.to_path_buf(), message: e.to_string() })?;
    serde_saphyr::from_str_multiple::<Value, Vec<Value>>(&text)
        .map_err(|e| E2eError::Sample { path: path.to_path_buf(), message: e.to_string() })
}

//! The ConfigMaps Agents refer to (system prompt, tools, trusted authorities): a metadata-only
//! watch of the ConfigMaps Strata does not manage keeps their resourceVersions, and each version's
//! data is read once with a targeted get and memoised, so a settled Agent's reconcile reads nothing
//! and an edit wakes at once every Agent that names the ConfigMap.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client};
use strata_api::Agent;

use crate::controller::error::{Error, Result};
use crate::controller::labels::{LABEL_MANAGED_BY, MANAGED_BY};

/// Label selector of the watch: every ConfigMap but the gateway.json children.
pub fn unmanaged_selector() -> String {
    format!("{LABEL_MANAGED_BY}!={MANAGED_BY}")
}

/// Keep only a ConfigMap's identity and version (the watch is cluster-wide; its cache stays small).
pub fn trim(meta: &mut PartialObjectMeta<ConfigMap>) {
    let full = std::mem::take(&mut meta.metadata);
    meta.metadata = ObjectMeta {
        name: full.name,
        namespace: full.namespace,
        resource_version: full.resource_version,
        ..ObjectMeta::default()
    };
}

/// The names of the ConfigMaps `agent` refers to.
pub fn referenced_by(agent: &Agent) -> Vec<&str> {
    let prefix = agent.spec.stable_prefix.as_ref();
    let prompt =
        prefix.and_then(|p| p.system_prompt.as_ref()).and_then(|source| source.config_map_key_ref.as_ref());
    let tools = prefix.and_then(|p| p.tools.as_ref());
    let authorities =
        agent.spec.model.egress.as_ref().and_then(|egress| egress.trusted_ca_config_map_ref.as_ref());
    [prompt, tools, authorities].into_iter().flatten().map(|r| r.name.as_str()).collect()
}

/// The Agents of `agents` that refer to the ConfigMap `meta`.
pub fn agents_referring_to(
    agents: &Store<Agent>,
    meta: &PartialObjectMeta<ConfigMap>,
) -> Vec<ObjectRef<Agent>> {
    let (Some(namespace), Some(name)) = (meta.metadata.namespace.as_deref(), meta.metadata.name.as_deref())
    else {
        return Vec::new();
    };
    agents
        .state()
        .iter()
        .filter(|agent| agent.metadata.namespace.as_deref() == Some(namespace))
        .filter(|agent| referenced_by(agent).contains(&name))
        .map(|agent| ObjectRef::from_obj(agent.as_ref()))
        .collect()
}

/// The data of a ConfigMap at one resourceVersion.
type Data = Arc<BTreeMap<String, String>>;
/// Memo entries: (namespace, name) → (resourceVersion, data).
type Entries = HashMap<(String, String), (String, Data)>;

/// Memoised ConfigMap data, one entry per referenced ConfigMap, keyed by its resourceVersion.
#[derive(Clone, Default)]
pub struct ConfigMapData {
    entries: Arc<Mutex<Entries>>,
}

impl ConfigMapData {
    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Number of memoised ConfigMaps.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether nothing is memoised.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The data of ConfigMap `namespace/name`, or `None` when the watch shows it does not exist. Read
    /// from the apiserver only when the watched version differs from the memoised one.
    pub async fn get(
        &self,
        client: &Client,
        versions: &Store<PartialObjectMeta<ConfigMap>>,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Data>> {
        let key = (namespace.to_string(), name.to_string());
        let Some(watched) = versions.get(&ObjectRef::new(name).within(namespace)) else {
            self.lock().remove(&key);
            return Ok(None);
        };
        let version = watched.metadata.resource_version.clone().unwrap_or_default();
        if let Some((memo_version, data)) = self.lock().get(&key)
            && !version.is_empty()
            && *memo_version == version
        {
            return Ok(Some(data.clone()));
        }
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
        let Some(found) = api
            .get_opt(name)
            .await
            .map_err(|e| Error::kube(format!("reading ConfigMap {namespace}/{name}"), e))?
        else {
            self.lock().remove(&key);
            return Ok(None);
        };
        let read_version = found.metadata.resource_version.unwrap_or_default();
        let data: Data = Arc::new(found.data.unwrap_or_default());
        self.lock().insert(key, (read_version, data.clone()));
        Ok(Some(data))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trimming_keeps_identity_and_version_only() {
        let mut meta = PartialObjectMeta::<ConfigMap> {
            types: None,
            metadata: ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ns".into()),
                resource_version: Some("9".into()),
                annotations: Some(
                    [("kubectl.kubernetes.io/last-applied-configuration".into(), "x".repeat(4096))].into(),
                ),
                ..ObjectMeta::default()
            },
            _phantom: std::marker::PhantomData,
        };
        trim(&mut meta);
        assert_eq!(meta.metadata.resource_version.as_deref(), Some("9"));
        assert!(meta.metadata.annotations.is_none());
    }
}

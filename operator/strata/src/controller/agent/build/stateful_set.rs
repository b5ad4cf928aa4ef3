//! The agent's StatefulSet: one pod with the gateway as a native sidecar, the user's runtime
//! container pointed at it, the journal volume, and cache-affinity placement. Every container
//! meets Pod Security "restricted".

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    StatefulSet, StatefulSetPersistentVolumeClaimRetentionPolicy, StatefulSetSpec,
};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, ConfigMapProjection, ConfigMapVolumeSource, Container, ContainerPort,
    DownwardAPIProjection, DownwardAPIVolumeFile, EmptyDirVolumeSource, EnvVar, EnvVarSource, KeyToPath,
    ObjectFieldSelector, PersistentVolumeClaim, PersistentVolumeClaimSpec, PodAffinity, PodAffinityTerm,
    PodSecurityContext, PodSpec, PodTemplateSpec, Probe, ProjectedVolumeSource, ResourceRequirements,
    SeccompProfile, SecretVolumeSource, SecurityContext, ServiceAccountTokenProjection, TCPSocketAction,
    Volume, VolumeMount, VolumeProjection, VolumeResourceRequirements, WeightedPodAffinityTerm,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::json;
use strata_api::Agent;
use strata_api::agent::CacheAffinityMode;
use strata_api::refs::LocalKeyRef;

use super::config_map::{CONFIG_FILE, config_map_name};
use super::egress::{EgressMounts, egress_mounts};
use super::metadata::ChildMeta;
use crate::compact::SUMMARIZER_KEY_FILE;
use crate::controller::agent::dereference::GATEWAY_CONTAINER;
use crate::controller::context::Settings;
use crate::controller::error::Result;
use crate::controller::hashing::json_sha256;
use crate::controller::labels::{ANNOTATION_ROLLOUT_HASH, LABEL_PREFIX_KEY, LABEL_TENANT};

/// Port of the gateway's OpenAI/Anthropic API, on loopback only.
pub const GATEWAY_PORT: i32 = 4100;
/// `--listen` of the gateway.
pub const GATEWAY_LISTEN: &str = "127.0.0.1:4100";
/// The sidecar's program in the image: the gateway alone, with the flags of `strata gateway`. It
/// links only the gateway's code, so a sidecar keeps about 2 MiB less program text resident than
/// with the all-in-one `strata` binary (BENCHMARKS.md, "A binary for the sidecar alone").
pub const GATEWAY_PROGRAM: &str = "/usr/local/bin/strata-gateway";
/// Port of the gateway's metrics.
pub const METRICS_PORT: i32 = 9464;
/// Where the journal volume is mounted.
pub const DATA_DIR: &str = "/var/lib/strata";
/// Where gateway.json is mounted.
pub const CONFIG_DIR: &str = "/etc/strata";
/// Directory of the mounted credentials Secret key.
pub const CREDENTIALS_DIR: &str = "/var/run/strata/credentials";
/// The API key file the gateway reads (`upstream.apiKeyFile`).
pub const API_KEY_FILE: &str = "/var/run/strata/credentials/api-key";
/// Name of the journal volumeClaimTemplate.
pub const JOURNAL_VOLUME: &str = "journal";
/// The volume holding the summariser's own API key.
const SUMMARIZER_VOLUME: &str = "summarizer-credentials";
/// UID and GID of the gateway process.
pub const GATEWAY_UID: i64 = 65532;
/// Default journal size.
const DEFAULT_STORAGE: &str = "1Gi";
/// Default weight of a Preferred cache affinity.
const DEFAULT_AFFINITY_WEIGHT: i32 = 50;
/// Node topology of cache affinity.
const HOSTNAME_TOPOLOGY: &str = "kubernetes.io/hostname";
/// Where a kube client looks for its in-cluster token.
const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The PVC of the agent pod (StatefulSet naming: `<template>-<statefulset>-<ordinal>`).
pub fn journal_claim_name(agent: &str) -> String {
    format!("{JOURNAL_VOLUME}-{agent}-0")
}

/// The StatefulSet.
/// `summarizer_key` is the summariser's own API key when the effective policy names one: the
/// gateway mounts it for its compactions with the summariser model.
pub fn stateful_set(
    meta: &ChildMeta,
    agent: &Agent,
    settings: &Settings,
    summarizer_key: Option<&LocalKeyRef>,
) -> Result<StatefulSet> {
    let suspended = agent.spec.suspend.unwrap_or(false);
    Ok(StatefulSet {
        metadata: meta.object_meta(&meta.agent),
        spec: Some(StatefulSetSpec {
            replicas: Some(if suspended { 0 } else { 1 }),
            service_name: Some(meta.agent.clone()),
            selector: LabelSelector { match_labels: Some(meta.selector.clone()), match_expressions: None },
            revision_history_limit: Some(3),
            template: pod_template(meta, agent, settings, summarizer_key)?,
            volume_claim_templates: Some(vec![journal_claim(meta, agent)]),
            persistent_volume_claim_retention_policy: Some(claim_retention(agent)),
            ..StatefulSetSpec::default()
        }),
        status: None,
    })
}

/// What happens to the journal claim: deleted with the Agent unless `spec.storage.retainOnDelete`,
/// and always kept when the agent is suspended (scaled to zero).
pub fn claim_retention(agent: &Agent) -> StatefulSetPersistentVolumeClaimRetentionPolicy {
    let retain = agent.spec.storage.as_ref().and_then(|s| s.retain_on_delete).unwrap_or(false);
    StatefulSetPersistentVolumeClaimRetentionPolicy {
        when_deleted: Some(if retain { "Retain" } else { "Delete" }.into()),
        when_scaled: Some("Retain".into()),
    }
}

/// The pod template. Its annotations hash only what must restart the pod (model and credentials);
/// policy lives in the ConfigMap, which the gateway reloads in place.
fn pod_template(
    meta: &ChildMeta,
    agent: &Agent,
    settings: &Settings,
    summarizer_key: Option<&LocalKeyRef>,
) -> Result<PodTemplateSpec> {
    let model = &agent.spec.model;
    let mut rollout_inputs = json!({
        "provider": model.provider,
        "model": model.name,
        "endpoint": model.endpoint,
        "tokenizer": model.effective_tokenizer(),
        "credentials": model.credentials_secret_ref,
    });
    if let Some(key) = summarizer_key {
        rollout_inputs["summarizerCredentials"] = json!(key);
    }
    if let Some(egress) = &model.egress {
        rollout_inputs["egress"] = json!(egress);
    }
    let egress = egress_mounts(model.egress.as_ref());
    let rollout_hash = json_sha256(&rollout_inputs, "pod rollout inputs")?;
    Ok(PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(meta.labels.clone()),
            annotations: Some([(ANNOTATION_ROLLOUT_HASH.to_string(), rollout_hash)].into()),
            ..ObjectMeta::default()
        }),
        spec: Some(PodSpec {
            service_account_name: Some(meta.agent.clone()),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                fs_group: Some(GATEWAY_UID),
                seccomp_profile: Some(runtime_default_seccomp()),
                ..PodSecurityContext::default()
            }),
            init_containers: Some(vec![gateway_container(meta, settings, summarizer_key.is_some(), &egress)]),
            containers: vec![runtime_container(agent)],
            volumes: Some({
                let mut volumes = volumes(meta, agent, summarizer_key);
                volumes.extend(egress.volumes);
                volumes
            }),
            affinity: cache_affinity(meta, agent),
            ..PodSpec::default()
        }),
    })
}

/// The volume of the summariser's own API key (`SUMMARIZER_KEY_FILE`), for the gateway and the
/// compaction Job.
pub(crate) fn summarizer_volume(key: &LocalKeyRef) -> Volume {
    api_key_volume(SUMMARIZER_VOLUME, key)
}

/// Where the summariser's key volume is mounted: the directory of `SUMMARIZER_KEY_FILE`.
pub(crate) fn summarizer_mount() -> VolumeMount {
    let dir = SUMMARIZER_KEY_FILE.rsplit_once('/').map(|(dir, _)| dir).unwrap_or(SUMMARIZER_KEY_FILE);
    mount(SUMMARIZER_VOLUME, dir, true)
}

/// The `config` (gateway.json) and `credentials` (the provider key as `api-key`) volumes that the
/// gateway sidecar and the compaction Job both mount.
pub(crate) fn config_and_credentials_volumes(config_map: &str, credentials: &LocalKeyRef) -> [Volume; 2] {
    [
        Volume {
            name: "config".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: config_map.into(),
                ..ConfigMapVolumeSource::default()
            }),
            ..Volume::default()
        },
        api_key_volume("credentials", credentials),
    ]
}

/// A volume `name` holding the Secret key `key` as the file `api-key`, readable by the group only.
fn api_key_volume(name: &str, key: &LocalKeyRef) -> Volume {
    secret_file_volume(name, key, "api-key")
}

/// A volume `name` holding the Secret key `key` as the file `file`, readable by the group only.
pub(crate) fn secret_file_volume(name: &str, key: &LocalKeyRef, file: &str) -> Volume {
    Volume {
        name: name.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(key.name.clone()),
            items: Some(vec![KeyToPath { key: key.key.clone(), path: file.into(), mode: None }]),
            default_mode: Some(0o440),
            optional: Some(false),
        }),
        ..Volume::default()
    }
}

pub(crate) fn runtime_default_seccomp() -> SeccompProfile {
    SeccompProfile { type_: "RuntimeDefault".into(), localhost_profile: None }
}

/// Restricted container security: no privilege escalation, every capability dropped.
pub(crate) fn restricted(read_only_root: bool, run_as: Option<i64>) -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), add: None }),
        read_only_root_filesystem: read_only_root.then_some(true),
        run_as_non_root: Some(true),
        run_as_user: run_as,
        run_as_group: run_as,
        seccomp_profile: Some(runtime_default_seccomp()),
        ..SecurityContext::default()
    }
}

pub(crate) fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: read_only.then_some(true),
        ..VolumeMount::default()
    }
}

pub(crate) fn plain_env(name: &str, value: &str) -> EnvVar {
    EnvVar { name: name.into(), value: Some(value.into()), value_from: None }
}

fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector { field_path: path.into(), api_version: None }),
            ..EnvVarSource::default()
        }),
    }
}

/// The gateway, as a native sidecar (an init container that keeps running).
fn gateway_container(
    meta: &ChildMeta,
    settings: &Settings,
    summarizer_key: bool,
    egress: &EgressMounts,
) -> Container {
    let metrics_listen = format!("0.0.0.0:{METRICS_PORT}");
    let config_path = format!("{CONFIG_DIR}/{CONFIG_FILE}");
    let args = [
        "--config",
        &config_path,
        "--data-dir",
        DATA_DIR,
        "--listen",
        GATEWAY_LISTEN,
        "--metrics-listen",
        &metrics_listen,
    ];
    let tcp_probe = |period: i32, failures: i32| Probe {
        tcp_socket: Some(TCPSocketAction { port: IntOrString::String("metrics".into()), host: None }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        ..Probe::default()
    };
    Container {
        name: GATEWAY_CONTAINER.into(),
        image: Some(settings.gateway_image.clone()),
        command: Some(vec![GATEWAY_PROGRAM.into()]),
        args: Some(args.iter().map(|arg| arg.to_string()).collect()),
        restart_policy: Some("Always".into()),
        env: Some(
            [
                plain_env("STRATA_AGENT_NAME", &meta.agent),
                field_env("STRATA_NAMESPACE", "metadata.namespace"),
            ]
            .into_iter()
            .chain(egress.env.iter().cloned())
            .collect(),
        ),
        ports: Some(vec![ContainerPort {
            name: Some("metrics".into()),
            container_port: METRICS_PORT,
            protocol: Some("TCP".into()),
            ..ContainerPort::default()
        }]),
        startup_probe: Some(tcp_probe(1, 120)),
        readiness_probe: Some(tcp_probe(10, 3)),
        resources: Some(ResourceRequirements {
            requests: Some(quantities(&[("cpu", "50m"), ("memory", "64Mi")])),
            limits: Some(quantities(&[("memory", "256Mi")])),
            ..ResourceRequirements::default()
        }),
        security_context: Some(restricted(true, Some(GATEWAY_UID))),
        volume_mounts: Some({
            let mut mounts = vec![
                mount(JOURNAL_VOLUME, DATA_DIR, false),
                mount("config", CONFIG_DIR, true),
                mount("credentials", CREDENTIALS_DIR, true),
                mount("service-account-token", SERVICE_ACCOUNT_DIR, true),
                mount("tmp", "/tmp", false),
            ];
            if summarizer_key {
                mounts.push(summarizer_mount());
            }
            mounts.extend(egress.mounts.iter().cloned());
            mounts
        }),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Container::default()
    }
}

fn quantities(pairs: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
    pairs.iter().map(|(k, v)| (k.to_string(), Quantity(v.to_string()))).collect()
}

/// The user's agent container: its base URLs point at the sidecar; it never sees the API key.
fn runtime_container(agent: &Agent) -> Container {
    let runtime = &agent.spec.runtime;
    let mut env = vec![
        plain_env("OPENAI_BASE_URL", &format!("http://127.0.0.1:{GATEWAY_PORT}/v1")),
        plain_env("ANTHROPIC_BASE_URL", &format!("http://127.0.0.1:{GATEWAY_PORT}")),
    ];
    env.extend(runtime.env.iter().flatten().cloned());
    Container {
        name: "agent".into(),
        image: Some(runtime.image.clone()),
        command: runtime.command.clone(),
        args: runtime.args.clone(),
        env: Some(env),
        resources: runtime.resources.clone(),
        security_context: Some(restricted(false, None)),
        ..Container::default()
    }
}

fn volumes(meta: &ChildMeta, agent: &Agent, summarizer_key: Option<&LocalKeyRef>) -> Vec<Volume> {
    let credentials = &agent.spec.model.credentials_secret_ref;
    let [config, credentials] = config_and_credentials_volumes(&config_map_name(&meta.agent), credentials);
    let mut volumes = vec![
        config,
        credentials,
        Volume {
            name: "service-account-token".into(),
            projected: Some(ProjectedVolumeSource {
                default_mode: Some(0o440),
                sources: Some(vec![
                    VolumeProjection {
                        service_account_token: Some(ServiceAccountTokenProjection {
                            path: "token".into(),
                            expiration_seconds: Some(3600),
                            audience: None,
                        }),
                        ..VolumeProjection::default()
                    },
                    VolumeProjection {
                        config_map: Some(ConfigMapProjection {
                            name: "kube-root-ca.crt".into(),
                            items: Some(vec![KeyToPath {
                                key: "ca.crt".into(),
                                path: "ca.crt".into(),
                                mode: None,
                            }]),
                            optional: None,
                        }),
                        ..VolumeProjection::default()
                    },
                    VolumeProjection {
                        downward_api: Some(DownwardAPIProjection {
                            items: Some(vec![DownwardAPIVolumeFile {
                                path: "namespace".into(),
                                field_ref: Some(ObjectFieldSelector {
                                    field_path: "metadata.namespace".into(),
                                    api_version: None,
                                }),
                                ..DownwardAPIVolumeFile::default()
                            }]),
                        }),
                        ..VolumeProjection::default()
                    },
                ]),
            }),
            ..Volume::default()
        },
        Volume { name: "tmp".into(), empty_dir: Some(EmptyDirVolumeSource::default()), ..Volume::default() },
    ];
    volumes.extend(summarizer_key.map(summarizer_volume));
    volumes
}

fn journal_claim(meta: &ChildMeta, agent: &Agent) -> PersistentVolumeClaim {
    let storage = agent.spec.storage.clone().unwrap_or_default();
    let size = storage.size.unwrap_or_else(|| Quantity(DEFAULT_STORAGE.into()));
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(JOURNAL_VOLUME.into()),
            labels: Some(meta.selector.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: storage.storage_class_name,
            resources: Some(VolumeResourceRequirements {
                requests: Some([("storage".to_string(), size)].into()),
                limits: None,
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        status: None,
    }
}

/// Co-locate pods of the same tenant that share a prefix key. The term has no namespace selector,
/// so it only ever matches pods in the Agent's own namespace.
fn cache_affinity(meta: &ChildMeta, agent: &Agent) -> Option<Affinity> {
    let spec = agent.spec.cache_affinity.clone().unwrap_or_default();
    let term = PodAffinityTerm {
        label_selector: Some(LabelSelector {
            match_labels: Some(
                [
                    (LABEL_PREFIX_KEY.to_string(), meta.prefix_key.clone()),
                    (LABEL_TENANT.to_string(), meta.labels.get(LABEL_TENANT).cloned().unwrap_or_default()),
                ]
                .into(),
            ),
            match_expressions: None,
        }),
        topology_key: HOSTNAME_TOPOLOGY.into(),
        ..PodAffinityTerm::default()
    };
    let pod_affinity = match spec.mode.unwrap_or(CacheAffinityMode::Preferred) {
        CacheAffinityMode::Disabled => return None,
        CacheAffinityMode::Required => PodAffinity {
            required_during_scheduling_ignored_during_execution: Some(vec![term]),
            ..PodAffinity::default()
        },
        CacheAffinityMode::Preferred => PodAffinity {
            preferred_during_scheduling_ignored_during_execution: Some(vec![WeightedPodAffinityTerm {
                weight: spec.weight.map(i32::from).unwrap_or(DEFAULT_AFFINITY_WEIGHT),
                pod_affinity_term: term,
            }]),
            ..PodAffinity::default()
        },
    };
    Some(Affinity { pod_affinity: Some(pod_affinity), ..Affinity::default() })
}

//! The batch/v1 Job that runs `strata compact` against an agent's journal volume (pure).

use k8s_openapi::api::batch::v1::{
    Job, JobSpec, PodFailurePolicy, PodFailurePolicyOnExitCodesRequirement, PodFailurePolicyRule,
};
use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, PersistentVolumeClaimVolumeSource, PodSecurityContext, PodSpec,
    PodTemplateSpec, ResourceRequirements, Volume,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::Resource;
use kube::api::ObjectMeta;
use sha2::{Digest, Sha256};
use strata_api::compaction_job::CompactionMode;
use strata_api::refs::LocalKeyRef;
use strata_api::{Agent, CompactionJob};

use crate::compact::exit::{EXIT_CHECK_FAILED, EXIT_DATA, EXIT_USAGE};
use crate::controller::agent::build::{
    API_KEY_FILE, CONFIG_DIR, CONFIG_FILE, DATA_DIR, config_and_credentials_volumes, config_map_name,
    egress_mounts, journal_claim_name, mount, restricted, runtime_default_seccomp, summarizer_mount,
    summarizer_volume,
};
use crate::controller::error::{Error, Result, name_of, namespace_of};
use crate::controller::labels::{LABEL_AGENT, LABEL_COMPACTION_JOB, LABEL_MANAGED_BY, MANAGED_BY};

/// Name of the container running `strata compact`.
pub const COMPACT_CONTAINER: &str = "compact";
/// Where the container writes its record.
pub const TERMINATION_LOG: &str = "/dev/termination-log";
/// Volume of the summariser's own API key.
/// Retries of a failed compaction pod.
pub const BACKOFF_LIMIT: i32 = 2;
/// A compaction that runs longer than this is stopped.
pub const ACTIVE_DEADLINE_SECONDS: i64 = 1800;
/// Label of the node name.
const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
/// UID and GID of the compactor.
const COMPACTOR_UID: i64 = 65532;

/// The Job's name: a readable prefix of the CompactionJob's name plus a hash, within 63 characters.
pub fn job_name(compaction: &CompactionJob) -> String {
    let name = compaction.metadata.name.as_deref().unwrap_or_default();
    let namespace = compaction.metadata.namespace.as_deref().unwrap_or_default();
    let digest = hex::encode(Sha256::digest(format!("{namespace}/{name}").as_bytes()));
    let prefix: String = name.chars().take(40).collect();
    format!("{}-{}", prefix.trim_end_matches(['-', '.']), &digest[..8])
}

/// The arguments of `strata compact` for this CompactionJob.
pub fn compact_args(compaction: &CompactionJob) -> Vec<String> {
    let spec = &compaction.spec;
    let mode = match spec.mode {
        CompactionMode::TaskBoundary => "TaskBoundary",
        CompactionMode::Budget => "Budget",
        CompactionMode::Emergency => "Emergency",
        CompactionMode::Rollback => "Rollback",
        CompactionMode::Purge => "Purge",
    };
    let mut args: Vec<String> =
        ["compact", "--data-dir", DATA_DIR, "--mode", mode].map(String::from).to_vec();
    if let Some(reason) = &spec.reason {
        args.extend(["--reason".into(), reason.clone()]);
    }
    if let Some(instruction) = &spec.resume_instruction {
        args.extend(["--resume-instruction".into(), instruction.clone()]);
    }
    if let Some(generation) = spec.rollback.as_ref().and_then(|r| r.to_generation) {
        args.extend(["--to-generation".into(), generation.to_string()]);
    }
    if let Some(purge) = &spec.purge {
        args.extend(["--ids".into(), purge.ids.join(",")]);
        if let Some(summary) = &purge.summary {
            args.extend(["--summary".into(), summary.clone()]);
        }
    }
    args.extend(["--config".into(), format!("{CONFIG_DIR}/{CONFIG_FILE}")]);
    args.extend(["--termination-log".into(), TERMINATION_LOG.into()]);
    args
}

/// Failures that a retry cannot fix end the Job at once: a failed preservation check, a bad
/// request and a damaged journal. A summariser outage, an I/O error or a lost race are retried.
fn fail_at_once_on_deterministic_errors() -> PodFailurePolicy {
    PodFailurePolicy {
        rules: vec![PodFailurePolicyRule {
            action: "FailJob".into(),
            on_exit_codes: Some(PodFailurePolicyOnExitCodesRequirement {
                container_name: Some(COMPACT_CONTAINER.into()),
                operator: "In".into(),
                values: [EXIT_CHECK_FAILED, EXIT_USAGE, EXIT_DATA].map(i32::from).to_vec(),
            }),
            on_pod_conditions: None,
        }],
    }
}

/// The Job for `compaction` on `agent`, pinned to `node` when the agent pod holds the volume there,
/// with the summariser's own API key mounted when the policy gives it one.
pub fn build_job(
    compaction: &CompactionJob,
    agent: &Agent,
    image: &str,
    node: Option<&str>,
    summarizer_credentials: Option<&LocalKeyRef>,
) -> Result<Job> {
    let namespace = namespace_of(&compaction.metadata, "CompactionJob")?;
    let compaction_name = name_of(&compaction.metadata, "CompactionJob")?;
    let agent_name = name_of(&agent.metadata, "Agent")?;
    let owner = compaction
        .controller_owner_ref(&())
        .ok_or(Error::MissingField { kind: "CompactionJob", field: "metadata.uid" })?;
    let labels = std::collections::BTreeMap::from([
        (LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string()),
        (LABEL_AGENT.to_string(), agent_name.clone()),
        (LABEL_COMPACTION_JOB.to_string(), compaction_name),
    ]);
    let credentials = &agent.spec.model.credentials_secret_ref;
    let credentials_dir = API_KEY_FILE.rsplit_once('/').map(|(dir, _)| dir).unwrap_or(API_KEY_FILE);
    let seccomp = runtime_default_seccomp();
    let mut mounts = vec![
        mount("journal", DATA_DIR, false),
        mount("config", CONFIG_DIR, true),
        mount("credentials", credentials_dir, true),
        mount("tmp", "/tmp", false),
    ];
    if summarizer_credentials.is_some() {
        mounts.push(summarizer_mount());
    }
    // The summariser calls a model, so the Job reaches it as the gateway does.
    let egress = egress_mounts(agent.spec.model.egress.as_ref());
    mounts.extend(egress.mounts);
    let container = Container {
        name: COMPACT_CONTAINER.into(),
        image: Some(image.into()),
        args: Some(compact_args(compaction)),
        env: (!egress.env.is_empty()).then_some(egress.env),
        termination_message_path: Some(TERMINATION_LOG.into()),
        // The record (or the error `strata compact` wrote); the log tail if it wrote nothing.
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        resources: Some(ResourceRequirements {
            requests: Some(
                [("cpu".into(), Quantity("100m".into())), ("memory".into(), Quantity("128Mi".into()))].into(),
            ),
            limits: Some([("memory".into(), Quantity("1Gi".into()))].into()),
            ..ResourceRequirements::default()
        }),
        security_context: Some(restricted(true, Some(COMPACTOR_UID))),
        volume_mounts: Some(mounts),
        ..Container::default()
    };
    let [config, credentials_volume] =
        config_and_credentials_volumes(&config_map_name(&agent_name), credentials);
    let mut volumes = vec![
        Volume {
            name: "journal".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: journal_claim_name(&agent_name),
                read_only: None,
            }),
            ..Volume::default()
        },
        config,
        credentials_volume,
        Volume { name: "tmp".into(), empty_dir: Some(EmptyDirVolumeSource::default()), ..Volume::default() },
    ];
    volumes.extend(summarizer_credentials.map(summarizer_volume));
    volumes.extend(egress.volumes);
    Ok(Job {
        metadata: ObjectMeta {
            name: Some(job_name(compaction)),
            namespace: Some(namespace),
            labels: Some(labels.clone()),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec: Some(JobSpec {
            backoff_limit: Some(BACKOFF_LIMIT),
            pod_failure_policy: Some(fail_at_once_on_deterministic_errors()),
            active_deadline_seconds: Some(ACTIVE_DEADLINE_SECONDS),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta { labels: Some(labels), ..ObjectMeta::default() }),
                spec: Some(PodSpec {
                    restart_policy: Some("Never".into()),
                    automount_service_account_token: Some(false),
                    enable_service_links: Some(false),
                    node_selector: node.map(|node| [(HOSTNAME_LABEL.to_string(), node.to_string())].into()),
                    security_context: Some(PodSecurityContext {
                        run_as_non_root: Some(true),
                        fs_group: Some(COMPACTOR_UID),
                        seccomp_profile: Some(seccomp),
                        ..PodSecurityContext::default()
                    }),
                    containers: vec![container],
                    volumes: Some(volumes),
                    ..PodSpec::default()
                }),
            },
            ..JobSpec::default()
        }),
        status: None,
    })
}

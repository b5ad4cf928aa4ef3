//! What `kubectl strata` reports when it cannot do what was asked, with what to do about it.

/// A plugin failure.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// No such Agent.
    #[error(
        "agent {name:?} not found in namespace {namespace:?}: list them with `kubectl strata status -n {namespace}` or `kubectl get agents -A`"
    )]
    AgentNotFound {
        /// The agent.
        name: String,
        /// The namespace.
        namespace: String,
    },
    /// RBAC refused.
    #[error(
        "not allowed to {verb} {resource} in namespace {namespace:?}: {message}; ask your cluster admin for access (e.g. `kubectl auth can-i {verb} {resource} -n {namespace}`)"
    )]
    Forbidden {
        /// The verb.
        verb: String,
        /// The resource.
        resource: String,
        /// The namespace.
        namespace: String,
        /// The apiserver's message.
        message: String,
    },
    /// The agent's pod is not running.
    #[error("agent {name:?} is not running (phase {phase}): {hint}")]
    NotRunning {
        /// The agent.
        name: String,
        /// Its phase.
        phase: String,
        /// What to do.
        hint: String,
    },
    /// The agent's ContextPolicy reference is dangling, or its policy cannot be resolved.
    #[error("{0}")]
    Policy(String),
    /// The CompactionJob failed.
    #[error(
        "CompactionJob {name} failed ({reason}); see `kubectl describe compactionjob {name} -n {namespace}`"
    )]
    JobFailed {
        /// Job name.
        name: String,
        /// Namespace.
        namespace: String,
        /// Reason from its status.
        reason: String,
    },
    /// Following timed out.
    #[error(
        "CompactionJob {name} is still {phase} after {seconds}s; follow it with `kubectl get compactionjob {name} -n {namespace} -w`"
    )]
    Timeout {
        /// Job name.
        name: String,
        /// Namespace.
        namespace: String,
        /// Last phase seen.
        phase: String,
        /// How long we waited.
        seconds: u64,
    },
    /// Any other API failure.
    #[error("the Kubernetes API failed: {0}")]
    Kube(#[from] kube::Error),
}

impl PluginError {
    /// Turn a kube error into the plugin's clearer errors where the status code says what happened.
    pub fn from_api(
        error: kube::Error,
        verb: &str,
        resource: &str,
        namespace: &str,
        name: Option<&str>,
    ) -> Self {
        match &error {
            kube::Error::Api(status) if status.code == 404 && resource == "agents" => {
                PluginError::AgentNotFound {
                    name: name.unwrap_or_default().to_string(),
                    namespace: namespace.to_string(),
                }
            }
            kube::Error::Api(status) if status.code == 403 => PluginError::Forbidden {
                verb: verb.into(),
                resource: resource.into(),
                namespace: namespace.into(),
                message: status.message.clone(),
            },
            _ => PluginError::Kube(error),
        }
    }
}

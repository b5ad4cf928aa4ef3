//! strata-api: the `strata.dev/v1alpha1` custom resources and effective-policy resolution.
//!
//! Pure: no client, no IO. The operator, the gateway and the CLI all read these types.

pub mod agent;
pub mod cluster_policy;
pub mod compaction_job;
pub mod context_policy;
pub mod crds;
pub mod effective;
pub mod fields;
pub mod gateway_config;
pub mod policy;
pub mod refs;
pub mod schema_check;
pub mod selector;
pub mod status;

pub use agent::{Agent, AgentSpec, AgentStatus};
pub use cluster_policy::{ClusterContextPolicy, ClusterContextPolicySpec};
pub use compaction_job::{CompactionJob, CompactionJobSpec, CompactionJobStatus};
pub use context_policy::{ContextPolicy, ContextPolicySpec};

/// API group of every Strata kind.
pub const GROUP: &str = "strata.dev";
/// API version of every Strata kind.
pub const VERSION: &str = "v1alpha1";

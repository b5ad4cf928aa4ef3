//! Label and annotation keys the controller sets, and how values are made label-safe.

use std::collections::BTreeMap;

/// `app.kubernetes.io/name` of every agent child.
pub const APP_NAME: &str = "strata-agent";
/// `app.kubernetes.io/managed-by` of every object the controller creates.
pub const MANAGED_BY: &str = "strata-operator";
/// The label selector the child watches use.
pub const MANAGED_SELECTOR: &str = "app.kubernetes.io/managed-by=strata-operator";

/// Label: the standard name label.
pub const LABEL_NAME: &str = "app.kubernetes.io/name";
/// Label: the standard instance label (the Agent's name).
pub const LABEL_INSTANCE: &str = "app.kubernetes.io/instance";
/// Label: the standard managed-by label.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Label: the standard part-of label.
pub const LABEL_PART_OF: &str = "app.kubernetes.io/part-of";
/// Label: the Agent a child belongs to.
pub const LABEL_AGENT: &str = "strata.dev/agent";
/// Label: the tenant (the namespace).
pub const LABEL_TENANT: &str = "strata.dev/tenant";
/// Label: the short tenant-scoped prefix-cache key, for cache affinity.
pub const LABEL_PREFIX_KEY: &str = "strata.dev/prefix-key";
/// Label: the model, sanitised.
pub const LABEL_MODEL: &str = "strata.dev/model";
/// Label: the CompactionJob a batch Job runs.
pub const LABEL_COMPACTION_JOB: &str = "strata.dev/compaction-job";

/// Annotation: sha256 of the desired child, compared before writing.
pub const ANNOTATION_SPEC_HASH: &str = "strata.dev/spec-hash";
/// Annotation on the pod template: hash of the inputs that must roll the pod (model, credentials).
pub const ANNOTATION_ROLLOUT_HASH: &str = "strata.dev/rollout-hash";
/// Annotation on a Namespace: the tenant's cache epoch; bumping it revokes every cache key.
pub const ANNOTATION_CACHE_EPOCH: &str = "strata.dev/cache-epoch";
/// Agent annotation: the UID of an earlier Agent whose journal (on a retained claim) this Agent
/// takes over on purpose; without it the gateway refuses a journal another Agent created.
pub const ANNOTATION_ADOPT_JOURNAL_FROM_UID: &str = "strata.dev/adopt-journal-from-uid";

/// Turn any string into a valid label value: at most 63 characters of `[A-Za-z0-9._-]`,
/// starting and ending alphanumeric. Other characters become `-`; an empty result is `unknown`.
pub fn sanitize_label_value(raw: &str) -> String {
    let mapped: String = raw
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '-' })
        .take(63)
        .collect();
    let trimmed = mapped.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    if trimmed.is_empty() { "unknown".to_string() } else { trimmed.to_string() }
}

/// The immutable selector labels of an agent's pods.
pub fn selector_labels(agent: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_NAME.to_string(), APP_NAME.to_string()),
        (LABEL_INSTANCE.to_string(), agent.to_string()),
        (LABEL_AGENT.to_string(), agent.to_string()),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_sanitised() {
        assert_eq!(sanitize_label_value("claude-sonnet-4-20250514"), "claude-sonnet-4-20250514");
        assert_eq!(
            sanitize_label_value("accounts/fireworks/models/llama-v3"),
            "accounts-fireworks-models-llama-v3"
        );
        assert_eq!(sanitize_label_value("/x:"), "x");
        assert_eq!(sanitize_label_value("@@"), "unknown");
        assert_eq!(sanitize_label_value(&"a".repeat(100)).len(), 63);
    }
}

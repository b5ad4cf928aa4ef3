//! Problems of a policy object that its CEL rules cannot see, because they involve other objects
//! or the merge (pure).

use std::collections::BTreeMap;

use serde_json::Value;
use strata_api::ClusterContextPolicy;
use strata_api::fields::PolicyField;
use strata_api::policy::PolicySpec;
use strata_api::selector::{SelectorError, selector_matches};

/// The value `spec` sets for `field`, if it sets one.
pub fn field_value(spec: &PolicySpec, field: PolicyField) -> Option<Value> {
    let mut value = serde_json::to_value(spec).ok()?;
    for segment in field.path().split('.') {
        value = value.get(segment)?.clone();
    }
    (!value.is_null()).then_some(value)
}

/// Problems of a ClusterContextPolicy on its own.
pub fn cluster_policy_problems(policy: &ClusterContextPolicy) -> Vec<String> {
    let mut problems = Vec::new();
    if let Some(selector) = &policy.spec.namespace_selector
        && let Err(SelectorError(message)) = selector_matches(selector, &BTreeMap::new())
    {
        problems.push(format!("namespaceSelector is invalid, so this policy applies nowhere: {message}"));
    }
    for field in policy.spec.locks.iter().flatten() {
        if field_value(&policy.spec.policy, *field).is_none() {
            problems.push(format!(
                "lock on {field}: this policy does not set it, so the lock pins whatever lower-priority layers produce; set a value"
            ));
        }
    }
    for bound in policy.spec.bounds.iter().flatten() {
        let Some(own) =
            field_value(&policy.spec.policy, bound.field.as_policy_field()).and_then(|v| v.as_f64())
        else {
            continue;
        };
        if bound.min.is_some_and(|min| own < min) || bound.max.is_some_and(|max| own > max) {
            problems.push(format!(
                "{} is {own}, outside this policy's own bound; it will be clamped",
                bound.field
            ));
        }
    }
    problems
}

/// Fields a ContextPolicy sets that a cluster policy selecting its namespace has locked.
pub fn locked_fields_set(spec: &PolicySpec, cluster_policies: &[&ClusterContextPolicy]) -> Vec<String> {
    let mut problems = Vec::new();
    for cluster in cluster_policies {
        let owner = cluster.metadata.name.as_deref().unwrap_or_default();
        for field in cluster.spec.locks.iter().flatten() {
            if field_value(spec, *field).is_some() {
                problems.push(format!(
                    "{field} is locked by ClusterContextPolicy/{owner}; this policy's value is ignored"
                ));
            }
        }
    }
    problems
}

/// The cluster policies whose selector matches `labels`.
pub fn selecting<'a>(
    cluster_policies: &'a [std::sync::Arc<ClusterContextPolicy>],
    labels: &BTreeMap<String, String>,
) -> Vec<&'a ClusterContextPolicy> {
    cluster_policies
        .iter()
        .filter(|policy| match &policy.spec.namespace_selector {
            None => true,
            Some(selector) => selector_matches(selector, labels).unwrap_or(false),
        })
        .map(|policy| policy.as_ref())
        .collect()
}

#[cfg(test)]
mod tests {
    use strata_api::cluster_policy::{ClusterContextPolicySpec, FieldBound};
    use strata_api::fields::NumericField;
    use strata_api::policy::{CompactionSpec, RedactionSpec};

    use super::*;

    #[test]
    fn locks_on_unset_fields_and_self_violating_bounds_are_problems() {
        let mut spec = ClusterContextPolicySpec::default();
        spec.policy.compaction = Some(CompactionSpec { trigger_percent: Some(95), ..Default::default() });
        spec.locks = Some(vec![PolicyField::RedactionEnabled]);
        spec.bounds = Some(vec![FieldBound {
            field: NumericField::CompactionTriggerPercent,
            min: None,
            max: Some(90.0),
        }]);
        let policy = ClusterContextPolicy::new("fleet", spec);
        let problems = cluster_policy_problems(&policy);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("redaction.enabled"), "{problems:?}");
        assert!(problems[1].contains("compaction.triggerPercent is 95"), "{problems:?}");

        let tenant = PolicySpec {
            redaction: Some(RedactionSpec { enabled: Some(false), extra_patterns: None }),
            ..PolicySpec::default()
        };
        let locked = locked_fields_set(&tenant, &[&policy]);
        assert_eq!(locked.len(), 1);
        assert!(locked[0].contains("ClusterContextPolicy/fleet"));
    }
}

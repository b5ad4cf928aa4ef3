//! Label-selector matching for ClusterContextPolicy namespace selectors (meta/v1 LabelSelector semantics).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// A selector that cannot be evaluated, with the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectorError(pub String);

/// Whether `labels` satisfy `selector`. An empty selector matches everything.
pub fn selector_matches(
    selector: &LabelSelector,
    labels: &BTreeMap<String, String>,
) -> Result<bool, SelectorError> {
    for (key, value) in selector.match_labels.iter().flatten() {
        if labels.get(key) != Some(value) {
            return Ok(false);
        }
    }
    for requirement in selector.match_expressions.iter().flatten() {
        let values = requirement.values.as_deref().unwrap_or_default();
        let actual = labels.get(&requirement.key);
        let holds = match requirement.operator.as_str() {
            "In" => {
                require_values(&requirement.key, "In", values)?;
                actual.is_some_and(|v| values.contains(v))
            }
            "NotIn" => {
                require_values(&requirement.key, "NotIn", values)?;
                actual.is_none_or(|v| !values.contains(v))
            }
            "Exists" => actual.is_some(),
            "DoesNotExist" => actual.is_none(),
            other => {
                return Err(SelectorError(format!(
                    "operator {other:?} on key {:?} is not one of In, NotIn, Exists, DoesNotExist",
                    requirement.key
                )));
            }
        };
        if !holds {
            return Ok(false);
        }
    }
    Ok(true)
}

fn require_values(key: &str, operator: &str, values: &[String]) -> Result<(), SelectorError> {
    if values.is_empty() {
        return Err(SelectorError(format!("operator {operator} on key {key:?} needs at least one value")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn expression(key: &str, operator: &str, values: &[&str]) -> LabelSelector {
        LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: key.into(),
                operator: operator.into(),
                values: Some(values.iter().map(|v| v.to_string()).collect()),
            }]),
            match_labels: None,
        }
    }

    #[test]
    fn empty_selector_matches_everything() {
        assert_eq!(selector_matches(&LabelSelector::default(), &labels(&[])), Ok(true));
    }

    #[test]
    fn match_labels_need_every_pair() {
        let selector = LabelSelector {
            match_labels: Some(labels(&[("tier", "agents"), ("env", "prod")])),
            match_expressions: None,
        };
        assert_eq!(selector_matches(&selector, &labels(&[("tier", "agents"), ("env", "prod")])), Ok(true));
        assert_eq!(selector_matches(&selector, &labels(&[("tier", "agents")])), Ok(false));
    }

    #[test]
    fn operators_follow_kubernetes_semantics() {
        let ns = labels(&[("env", "prod")]);
        assert_eq!(selector_matches(&expression("env", "In", &["prod", "staging"]), &ns), Ok(true));
        assert_eq!(selector_matches(&expression("env", "NotIn", &["prod"]), &ns), Ok(false));
        assert_eq!(selector_matches(&expression("team", "NotIn", &["x"]), &ns), Ok(true));
        assert_eq!(selector_matches(&expression("env", "Exists", &[]), &ns), Ok(true));
        assert_eq!(selector_matches(&expression("env", "DoesNotExist", &[]), &ns), Ok(false));
    }

    #[test]
    fn invalid_operators_are_reported() {
        let err = selector_matches(&expression("env", "Near", &["prod"]), &labels(&[]));
        assert!(matches!(err, Err(SelectorError(m)) if m.contains("Near")));
        let err = selector_matches(&expression("env", "In", &[]), &labels(&[]));
        assert!(matches!(err, Err(SelectorError(m)) if m.contains("at least one value")));
    }
}

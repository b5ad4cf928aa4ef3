//! Structural promises of the generated CRDs: local-only references, status subresources,
//! conditions, printer columns, short names and the `strata` category.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;
use strata_api::crds;

fn schema_of(
    crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> Value {
    serde_json::to_value(crd.spec.versions[0].schema.as_ref().unwrap().open_api_v3_schema.as_ref().unwrap())
        .unwrap()
}

/// Every property path named `namespace` anywhere in the schema.
fn namespace_fields(node: &Value, path: &str, found: &mut Vec<String>) {
    if let Some(properties) = node.get("properties").and_then(Value::as_object) {
        for (key, child) in properties {
            let child_path = format!("{path}.{key}");
            if key == "namespace" {
                found.push(child_path.clone());
            }
            namespace_fields(child, &child_path, found);
        }
    }
    for key in ["items", "additionalProperties"] {
        if let Some(child) = node.get(key) {
            namespace_fields(child, &format!("{path}[]"), found);
        }
    }
}

#[test]
fn no_reference_can_name_another_namespace() {
    for crd in crds::all() {
        let schema = schema_of(&crd);
        let mut found = Vec::new();
        namespace_fields(&schema["properties"]["spec"], "spec", &mut found);
        assert!(found.is_empty(), "{} has namespace fields: {found:?}", crd.spec.names.kind);
    }
}

#[test]
fn every_kind_has_status_conditions_columns_and_category() {
    let crds = crds::all();
    assert_eq!(crds.len(), 4);
    for crd in crds {
        let kind = crd.spec.names.kind.clone();
        assert_eq!(crd.spec.group, "strata.dev");
        let version = &crd.spec.versions[0];
        assert_eq!(version.name, "v1alpha1");
        assert!(
            version.subresources.as_ref().and_then(|s| s.status.as_ref()).is_some(),
            "{kind}: status subresource"
        );
        assert!(
            version.additional_printer_columns.as_ref().is_some_and(|c| c.len() >= 2),
            "{kind}: printer columns"
        );
        assert!(crd.spec.names.short_names.as_ref().is_some_and(|s| !s.is_empty()), "{kind}: short names");
        assert_eq!(
            crd.spec.names.categories.as_deref(),
            Some(&["strata".to_string()][..]),
            "{kind}: category"
        );
        let status = &schema_of(&crd)["properties"]["status"]["properties"];
        assert!(status.get("conditions").is_some(), "{kind}: status.conditions");
        assert!(status.get("observedGeneration").is_some(), "{kind}: status.observedGeneration");
        assert_eq!(
            status["conditions"]["items"]["required"].as_array().map(Vec::len),
            Some(5),
            "{kind}: conditions are meta/v1 Conditions"
        );
    }
}

#[test]
fn scopes_match_the_design() {
    let scopes: Vec<(String, String)> =
        crds::all().into_iter().map(|c| (c.spec.names.kind, c.spec.scope)).collect();
    assert_eq!(
        scopes,
        [
            ("Agent".into(), "Namespaced".into()),
            ("ContextPolicy".into(), "Namespaced".into()),
            ("ClusterContextPolicy".into(), "Cluster".into()),
            ("CompactionJob".into(), "Namespaced".into()),
        ]
    );
}

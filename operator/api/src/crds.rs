//! The generated CustomResourceDefinitions of every Strata kind, in a fixed order, with their
//! schemas reduced to the integer formats the apiserver knows.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use kube::CustomResourceExt;

use crate::{Agent, ClusterContextPolicy, CompactionJob, ContextPolicy};

/// Every CRD, in the order they are written to `crds/`.
pub fn all() -> Vec<CustomResourceDefinition> {
    let mut crds =
        vec![Agent::crd(), ContextPolicy::crd(), ClusterContextPolicy::crd(), CompactionJob::crd()];
    for crd in &mut crds {
        for version in &mut crd.spec.versions {
            if let Some(schema) = version.schema.as_mut().and_then(|s| s.open_api_v3_schema.as_mut()) {
                known_integer_formats(schema);
            }
        }
    }
    crds
}

/// Rewrite the unsigned formats schemars emits (`uint8`, `uint16`, `uint32`, `uint64`), which the
/// apiserver warns about on every apply, as `int32`/`int64` with the type's bounds. Recursive.
pub fn known_integer_formats(schema: &mut JSONSchemaProps) {
    let bounds = match schema.format.as_deref() {
        Some("uint8") => Some(("int32", Some(f64::from(u8::MAX)))),
        Some("uint16") => Some(("int32", Some(f64::from(u16::MAX)))),
        Some("uint32") => Some(("int64", Some(f64::from(u32::MAX)))),
        Some("uint64") => Some(("int64", None)),
        _ => None,
    };
    if let Some((format, max)) = bounds {
        schema.format = Some(format.into());
        schema.minimum = Some(schema.minimum.map_or(0.0, |min| min.max(0.0)));
        if let Some(max) = max {
            schema.maximum = Some(schema.maximum.map_or(max, |existing| existing.min(max)));
        }
    }
    let children = schema
        .properties
        .iter_mut()
        .flat_map(|p| p.values_mut())
        .chain(schema.all_of.iter_mut().flatten())
        .chain(schema.any_of.iter_mut().flatten())
        .chain(schema.one_of.iter_mut().flatten())
        .chain(schema.not.as_deref_mut())
        .chain(match schema.items.as_mut() {
            Some(JSONSchemaPropsOrArray::Schema(item)) => vec![item.as_mut()],
            Some(JSONSchemaPropsOrArray::Schemas(items)) => items.iter_mut().collect(),
            None => Vec::new(),
        })
        .chain(match schema.additional_properties.as_mut() {
            Some(JSONSchemaPropsOrBool::Schema(value)) => Some(value.as_mut()),
            _ => None,
        });
    for child in children {
        known_integer_formats(child);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn formats(schema: &JSONSchemaProps, out: &mut Vec<String>) {
        out.extend(schema.format.clone());
        for child in schema.properties.iter().flat_map(|p| p.values()) {
            formats(child, out);
        }
        if let Some(JSONSchemaPropsOrArray::Schema(item)) = &schema.items {
            formats(item, out);
        }
        if let Some(JSONSchemaPropsOrBool::Schema(value)) = &schema.additional_properties {
            formats(value, out);
        }
    }

    #[test]
    fn every_integer_format_is_one_the_apiserver_knows() {
        let mut seen = Vec::new();
        for crd in all() {
            for version in &crd.spec.versions {
                if let Some(schema) = version.schema.as_ref().and_then(|s| s.open_api_v3_schema.as_ref()) {
                    formats(schema, &mut seen);
                }
            }
        }
        let unknown: Vec<&String> = seen
            .iter()
            .filter(|f| !["int32", "int64", "date-time", "byte", "double"].contains(&f.as_str()))
            .collect();
        assert!(unknown.is_empty(), "formats the apiserver warns about: {unknown:?}");
        assert!(seen.iter().any(|f| f == "int64"), "the unsigned formats became int64: {seen:?}");
    }

    #[test]
    fn unsigned_formats_keep_their_bounds() {
        let mut schema = JSONSchemaProps {
            format: Some("uint8".into()),
            minimum: Some(1.0),
            maximum: Some(100.0),
            ..JSONSchemaProps::default()
        };
        known_integer_formats(&mut schema);
        assert_eq!(
            (schema.format.as_deref(), schema.minimum, schema.maximum),
            (Some("int32"), Some(1.0), Some(100.0))
        );
        let mut wide = JSONSchemaProps { format: Some("uint32".into()), ..JSONSchemaProps::default() };
        known_integer_formats(&mut wide);
        assert_eq!((wide.minimum, wide.maximum), (Some(0.0), Some(4_294_967_295.0)));
    }
}

//! Offline validation of a manifest the way the apiserver would: the CRD's structural
//! openAPIV3Schema first, then its CEL `x-kubernetes-validations` rules (through kube's CEL engine).
//!
//! Used by the sample tests, and usable by tools that want to reject a manifest before applying it.
//! Structural errors are worded as the apiserver words them (`Unsupported value: …`, `Invalid
//! value: …: … in body should match …`, `strict decoding error: unknown field …`), so a user sees
//! one message whether the check ran here or in the cluster.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::core::cel::Validator;
use serde_json::Value;

/// One reason a manifest is invalid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// JSON path of the offending field, e.g. `spec.model.endpoint`.
    pub path: String,
    /// What is wrong and, for CEL rules, how to fix it.
    pub message: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// Validate `object` (and, for updates, its `old` version) against the matching Strata CRD.
pub fn validate_manifest(object: &Value, old: Option<&Value>) -> Result<(), Vec<Violation>> {
    let kind = object.get("kind").and_then(Value::as_str).unwrap_or_default();
    let api_version = object.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
    let crd = crate::crds::all().into_iter().find(|crd| {
        crd.spec.names.kind == kind
            && crd.spec.versions.iter().any(|v| format!("{}/{}", crd.spec.group, v.name) == api_version)
    });
    let Some(crd) = crd else {
        return Err(vec![Violation {
            path: String::new(),
            message: format!(
                "{api_version}/{kind} is not a Strata kind: expected apiVersion {}/{} and kind Agent, ContextPolicy, ClusterContextPolicy or CompactionJob",
                crate::GROUP,
                crate::VERSION
            ),
        }]);
    };
    validate_against(&crd, object, old)
}

/// Validate `object` against one CRD's schema and CEL rules.
pub fn validate_against(
    crd: &CustomResourceDefinition,
    object: &Value,
    old: Option<&Value>,
) -> Result<(), Vec<Violation>> {
    let schema = crd
        .spec
        .versions
        .first()
        .and_then(|v| v.schema.as_ref())
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .and_then(|s| serde_json::to_value(s).ok())
        .unwrap_or(Value::Null);
    let mut violations = Vec::new();
    check_node(&schema, object, "", true, &mut violations);
    if !violations.is_empty() {
        // The apiserver stops at structural errors too: CEL rules only see well-typed objects.
        return Err(violations);
    }
    if let Err(errors) = Validator::new().validate(&schema, object, old) {
        violations.extend(
            errors.into_vec().into_iter().map(|e| Violation { path: e.field_path, message: e.message }),
        );
    }
    if violations.is_empty() { Ok(()) } else { Err(violations) }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() { key.to_string() } else { format!("{path}.{key}") }
}

fn push(violations: &mut Vec<Violation>, path: &str, message: String) {
    violations.push(Violation { path: path.to_string(), message });
}

/// Check one value against one structural schema node.
fn check_node(schema: &Value, value: &Value, path: &str, root: bool, violations: &mut Vec<Violation>) {
    if value.is_null() {
        if schema.get("nullable").and_then(Value::as_bool) != Some(true) {
            push(violations, path, "must not be null".into());
        }
        return;
    }
    if schema.get("x-kubernetes-int-or-string").and_then(Value::as_bool) == Some(true) {
        if !(value.is_string() || value.is_i64() || value.is_u64()) {
            push(violations, path, format!("must be an integer or a string, got {}", type_name(value)));
        }
        return;
    }
    let preserve_unknown =
        schema.get("x-kubernetes-preserve-unknown-fields").and_then(Value::as_bool) == Some(true);
    let expected = schema.get("type").and_then(Value::as_str);
    if let Some(expected) = expected
        && !type_matches(expected, value)
    {
        push(violations, path, format!("must be of type {expected}, got {}", type_name(value)));
        return;
    }
    if let Some(options) = schema.get("enum").and_then(Value::as_array)
        && !options.contains(value)
    {
        let names: Vec<String> = options.iter().map(|o| o.to_string()).collect();
        push(violations, path, format!("Unsupported value: {value}: supported values: {}", names.join(", ")));
    }
    check_limits(schema, value, path, violations);
    match value {
        Value::Object(map) => {
            for required in schema.get("required").and_then(Value::as_array).into_iter().flatten() {
                if let Some(key) = required.as_str()
                    && !map.contains_key(key)
                {
                    push(violations, &join(path, key), "is required".into());
                }
            }
            let properties = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            for (key, child) in map {
                let child_path = join(path, key);
                if root && key == "metadata" {
                    check_metadata(child, &child_path, violations);
                    continue;
                }
                if root && (key == "apiVersion" || key == "kind") {
                    continue;
                }
                match (properties.and_then(|p| p.get(key)), additional) {
                    (Some(child_schema), _) | (None, Some(child_schema)) => {
                        check_node(child_schema, child, &child_path, false, violations);
                    }
                    (None, None) if preserve_unknown => {}
                    // The apiserver's strict field validation names the whole path in its message.
                    (None, None) => {
                        push(violations, "", format!("strict decoding error: unknown field {:?}", child_path))
                    }
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (index, item) in items.iter().enumerate() {
                    check_node(item_schema, item, &format!("{path}[{index}]"), false, violations);
                }
            }
        }
        _ => {}
    }
}

fn check_metadata(metadata: &Value, path: &str, violations: &mut Vec<Violation>) {
    let Some(map) = metadata.as_object() else {
        push(violations, path, "must be an object".into());
        return;
    };
    match map.get("name").and_then(Value::as_str) {
        Some(name) if is_dns_subdomain(name) => {}
        Some(name) => push(
            violations,
            &join(path, "name"),
            format!(
                "{name:?} is not a valid DNS-1123 subdomain: use lower-case letters, digits, '-' and '.'"
            ),
        ),
        None if map.contains_key("generateName") => {}
        None => push(violations, &join(path, "name"), "is required".into()),
    }
}

fn is_dns_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

fn check_limits(schema: &Value, value: &Value, path: &str, violations: &mut Vec<Violation>) {
    let limit = |key: &str| schema.get(key).and_then(Value::as_f64);
    let invalid = |rule: String| format!("Invalid value: {value}: {path} in body {rule}");
    if let Some(number) = value.as_f64() {
        if let Some(min) = limit("minimum")
            && number < min
        {
            push(violations, path, invalid(format!("should be greater than or equal to {}", go_number(min))));
        }
        if let Some(max) = limit("maximum")
            && number > max
        {
            push(violations, path, invalid(format!("should be less than or equal to {}", go_number(max))));
        }
    }
    if let Some(text) = value.as_str() {
        let length = text.chars().count() as f64;
        if let Some(min) = limit("minLength")
            && length < min
        {
            push(violations, path, format!("must be at least {min} characters long"));
        }
        if let Some(max) = limit("maxLength")
            && length > max
        {
            push(violations, path, format!("must be at most {max} characters long"));
        }
        if let Some(pattern) = schema.get("pattern").and_then(Value::as_str) {
            match regex::Regex::new(pattern) {
                Ok(re) if re.is_match(text) => {}
                Ok(_) => push(violations, path, invalid(format!("should match '{pattern}'"))),
                Err(e) => push(violations, path, format!("schema pattern {pattern} is invalid: {e}")),
            }
        }
    }
    if let Some(items) = value.as_array() {
        if let Some(max) = limit("maxItems")
            && items.len() as f64 > max
        {
            push(violations, path, format!("must have at most {max} items"));
        }
        if let Some(min) = limit("minItems")
            && (items.len() as f64) < min
        {
            push(violations, path, format!("must have at least {min} items"));
        }
    }
    if let Some(map) = value.as_object()
        && let Some(max) = limit("maxProperties")
        && map.len() as f64 > max
    {
        push(violations, path, format!("must have at most {max} properties"));
    }
}

/// A schema bound as the apiserver prints it (`100`, not `100.0`).
fn go_number(number: f64) -> String {
    if number.fract() == 0.0 && number.abs() < 1e15 {
        format!("{}", number as i64)
    } else {
        number.to_string()
    }
}

fn type_matches(expected: &str, value: &Value) -> bool {
    match expected {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "boolean" => value.is_boolean(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        _ => true,
    }
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

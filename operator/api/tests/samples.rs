//! Every sample in config/samples is accepted by the generated schema and its CEL rules, and every
//! manifest in config/samples/invalid is rejected with the message its `# expect:` line names.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;
use strata_api::schema_check::validate_manifest;
use strata_api::{Agent, ClusterContextPolicy, CompactionJob, ContextPolicy};

fn samples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/samples")
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "yaml")
                && p.file_name().is_some_and(|n| n != "kustomization.yaml")
        })
        .collect();
    files.sort();
    files
}

fn documents(path: &Path) -> Vec<Value> {
    let text = fs::read_to_string(path).unwrap();
    serde_saphyr::from_str_multiple::<Value, Vec<Value>>(&text)
        .unwrap_or_else(|e| panic!("{} is not valid YAML: {e}", path.display()))
}

/// Deserialize into the typed resource too: the Rust types and the schema must agree.
fn assert_typed(doc: &Value, path: &Path) {
    let kind = doc["kind"].as_str().unwrap();
    let typed = match kind {
        "Agent" => serde_json::from_value::<Agent>(doc.clone()).map(|_| ()),
        "ContextPolicy" => serde_json::from_value::<ContextPolicy>(doc.clone()).map(|_| ()),
        "ClusterContextPolicy" => serde_json::from_value::<ClusterContextPolicy>(doc.clone()).map(|_| ()),
        "CompactionJob" => serde_json::from_value::<CompactionJob>(doc.clone()).map(|_| ()),
        other => panic!("{}: unexpected kind {other}", path.display()),
    };
    typed.unwrap_or_else(|e| panic!("{} does not deserialize as {kind}: {e}", path.display()));
}

#[test]
fn every_sample_is_valid() {
    let files = yaml_files(&samples_dir());
    let mut kinds = std::collections::BTreeSet::new();
    let mut agents = 0;
    for path in &files {
        for doc in documents(path) {
            if let Err(violations) = validate_manifest(&doc, None) {
                let list: Vec<String> = violations.iter().map(ToString::to_string).collect();
                panic!("{} is rejected:\n  {}", path.display(), list.join("\n  "));
            }
            assert_typed(&doc, path);
            let kind = doc["kind"].as_str().unwrap().to_string();
            if kind == "Agent" {
                agents += 1;
            }
            kinds.insert(kind);
        }
    }
    assert_eq!(kinds.len(), 4, "one sample per kind, got {kinds:?}");
    assert_eq!(agents, 8, "the seed-003 fleet has eight agents");
}

struct InvalidCase {
    path: PathBuf,
    expect: String,
    update_of: Option<PathBuf>,
    doc: Value,
}

fn invalid_cases() -> Vec<InvalidCase> {
    let dir = samples_dir().join("invalid");
    yaml_files(&dir)
        .into_iter()
        .map(|path| {
            let text = fs::read_to_string(&path).unwrap();
            let header = |key: &str| {
                text.lines().find_map(|l| l.strip_prefix(&format!("# {key}: "))).map(|s| s.trim().to_string())
            };
            let expect =
                header("expect").unwrap_or_else(|| panic!("{} has no '# expect:' line", path.display()));
            let update_of = header("update-of").map(|rel| dir.join(rel));
            let doc = documents(&path).into_iter().next().unwrap();
            InvalidCase { path, expect, update_of, doc }
        })
        .collect()
}

#[test]
fn every_invalid_manifest_is_rejected_with_its_own_message() {
    let cases = invalid_cases();
    assert!(cases.len() >= 20, "expected the full set of invalid manifests, found {}", cases.len());
    for case in &cases {
        let old = case.update_of.as_ref().map(|p| documents(p).into_iter().next().unwrap());
        let violations = match validate_manifest(&case.doc, old.as_ref()) {
            Ok(()) => panic!("{} was accepted, expected: {}", case.path.display(), case.expect),
            Err(v) => v,
        };
        let rendered: Vec<String> = violations.iter().map(ToString::to_string).collect();
        assert!(
            rendered.iter().any(|m| m.contains(&case.expect)),
            "{}: expected a violation containing {:?}, got:\n  {}",
            case.path.display(),
            case.expect,
            rendered.join("\n  ")
        );
        assert_eq!(
            rendered.len(),
            1,
            "{}: exactly one problem expected, got {rendered:?}",
            case.path.display()
        );
    }
}

#[test]
fn invalid_manifests_test_distinct_rules() {
    let cases = invalid_cases();
    let mut expectations: Vec<&str> = cases.iter().map(|c| c.expect.as_str()).collect();
    expectations.sort();
    let before = expectations.len();
    expectations.dedup();
    assert_eq!(before, expectations.len(), "two invalid manifests expect the same message");
}

#[test]
fn updates_that_keep_immutable_fields_are_accepted() {
    for sample in ["strata_v1alpha1_agent.yaml", "strata_v1alpha1_compactionjob.yaml"] {
        let doc = documents(&samples_dir().join(sample)).into_iter().next().unwrap();
        let mut updated = doc.clone();
        updated["metadata"]["labels"] = serde_json::json!({"touched": "yes"});
        validate_manifest(&updated, Some(&doc)).unwrap_or_else(|v| panic!("{sample} update rejected: {v:?}"));
    }
}

#[test]
fn non_strata_kinds_are_refused_with_guidance() {
    let doc = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}});
    let violations = validate_manifest(&doc, None).unwrap_err();
    assert!(violations[0].message.contains("is not a Strata kind"));
}

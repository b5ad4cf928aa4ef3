//! Unit tests of stable-prefix building.
#![allow(clippy::unwrap_used)]

use super::*;
use serde_json::json;

fn counter() -> TokenCounter {
    TokenCounter::new(TokenizerKind::O200kBase).unwrap()
}

fn sources() -> StablePrefixSources {
    StablePrefixSources {
        system_prompt: "You are a careful agent.\r\n\r\n\r\nFollow the policy.  ".to_owned(),
        tools: vec![
            json!({"name": "read_file", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}),
            json!({"description": "Search", "name": "grep"}),
        ],
        constants: BTreeMap::from([
            ("repo".to_owned(), "strata".to_owned()),
            ("language".to_owned(), "Rust".to_owned()),
        ]),
    }
}

#[test]
fn renders_canonical_sections() {
    let prefix = StablePrefix::build(&sources(), &mut ToolRegistry::new(), &counter()).unwrap();
    assert_eq!(
        prefix.section(SectionClass::System).unwrap().text,
        "You are a careful agent.\n\nFollow the policy."
    );
    assert_eq!(
        prefix.section(SectionClass::Tools).unwrap().text,
        "{\"input_schema\":{\"properties\":{\"path\":{\"type\":\"string\"}},\"type\":\"object\"},\"name\":\"read_file\"}\n{\"description\":\"Search\",\"name\":\"grep\"}"
    );
    assert_eq!(
        prefix.section(SectionClass::Constants).unwrap().text,
        "\"language\":\"Rust\"\n\"repo\":\"strata\""
    );
    assert!(prefix.text().starts_with("You are a careful agent.\n\nFollow the policy.\n\n{"));
}

#[test]
fn manifest_hashes_and_counts_sections() {
    let counter = counter();
    let prefix = StablePrefix::build(&sources(), &mut ToolRegistry::new(), &counter).unwrap();
    let manifest = prefix.manifest();
    assert_eq!(manifest.canonicalization_version, CANONICALIZATION_VERSION);
    let ids: Vec<&str> = manifest.sections.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, ["system", "tools", "constants"]);
    for (entry, section) in manifest.sections.iter().zip(prefix.sections()) {
        assert_eq!(entry.source_hash, hex::encode(Sha256::digest(section.text.as_bytes())));
        assert_eq!(entry.tokens, counter.count(&section.text));
    }
    let sum: u32 = manifest.sections.iter().map(|s| s.tokens).sum();
    assert_eq!(manifest.total_tokens, sum);
    assert_eq!(manifest.prefix_hash, prefix_hash(prefix.sections()));
    assert_eq!(manifest.prefix_hash.len(), 64);
}

#[test]
fn prefix_hash_is_framed() {
    let a = [
        CanonicalSection { class: SectionClass::System, text: "ab".to_owned() },
        CanonicalSection { class: SectionClass::Tools, text: "c".to_owned() },
    ];
    let b = [
        CanonicalSection { class: SectionClass::System, text: "a".to_owned() },
        CanonicalSection { class: SectionClass::Tools, text: "bc".to_owned() },
    ];
    assert_ne!(prefix_hash(&a), prefix_hash(&b));
}

#[test]
fn volatile_system_prompt_is_rejected_with_section() {
    let mut volatile = sources();
    volatile.system_prompt.push_str("\nCurrent time: 2024-05-01T10:15:00Z");
    let error = StablePrefix::build(&volatile, &mut ToolRegistry::new(), &counter()).unwrap_err();
    match &error {
        PrefixError::VolatileMaterial { section, findings } => {
            assert_eq!(*section, SectionClass::System);
            assert_eq!(findings[0].kind, VolatileKind::Timestamp);
        }
        other => panic!("unexpected error {other:?}"),
    }
    let message = error.to_string();
    assert!(message.contains("`system`"), "{message}");
    assert!(message.contains("2024-05-01T10:15:00Z"), "{message}");
}

#[test]
fn volatile_tool_and_constant_are_rejected_with_section() {
    let mut tool = sources();
    tool.tools.push(json!({"name": "status", "description": "last trace 4bf92f3577b34da6a3ce929d0e0e4736"}));
    let error = StablePrefix::build(&tool, &mut ToolRegistry::new(), &counter()).unwrap_err();
    assert!(matches!(error, PrefixError::VolatileMaterial { section: SectionClass::Tools, .. }));

    let mut constant = sources();
    constant.constants.insert("session".to_owned(), "123e4567-e89b-12d3-a456-426614174000".to_owned());
    let error = StablePrefix::build(&constant, &mut ToolRegistry::new(), &counter()).unwrap_err();
    assert!(matches!(error, PrefixError::VolatileMaterial { section: SectionClass::Constants, .. }));
}

#[test]
fn failed_build_leaves_registry_untouched() {
    let mut registry = ToolRegistry::new();
    StablePrefix::build(&sources(), &mut registry, &counter()).unwrap();
    let before = registry.clone();
    let mut volatile = sources();
    volatile.tools.push(json!({"name": "new_tool"}));
    volatile.system_prompt.push_str(" This is call #12.");
    assert!(StablePrefix::build(&volatile, &mut registry, &counter()).is_err());
    assert_eq!(registry, before);
}

#[test]
fn tool_errors_are_reported() {
    let mut unnamed = sources();
    unnamed.tools.push(json!({"description": "no name"}));
    let error = StablePrefix::build(&unnamed, &mut ToolRegistry::new(), &counter()).unwrap_err();
    assert_eq!(error, PrefixError::ToolOrder(ToolOrderError::MissingName { index: 2 }));

    let mut colliding = sources();
    colliding.tools.push(json!({"name": "x", "e\u{301}": 1, "\u{E9}": 2}));
    let error = StablePrefix::build(&colliding, &mut ToolRegistry::new(), &counter()).unwrap_err();
    assert!(matches!(error, PrefixError::ToolSchema { ref name, .. } if name == "x"));
}

#[test]
fn constant_keys_colliding_after_nfc_are_rejected() {
    let mut colliding = sources();
    colliding.constants.insert("caf\u{E9}".to_owned(), "1".to_owned());
    colliding.constants.insert("cafe\u{301}".to_owned(), "2".to_owned());
    let error = StablePrefix::build(&colliding, &mut ToolRegistry::new(), &counter()).unwrap_err();
    assert!(matches!(error, PrefixError::DuplicateConstant { .. }));
}

#[test]
fn manifest_serializes_in_camel_case() {
    let prefix = StablePrefix::build(&sources(), &mut ToolRegistry::new(), &counter()).unwrap();
    let json = serde_json::to_value(prefix.manifest()).unwrap();
    assert_eq!(json["canonicalizationVersion"], CANONICALIZATION_VERSION);
    assert_eq!(json["sections"][1]["class"], "Tools");
    assert!(json["sections"][0]["sourceHash"].is_string());
    assert!(json["totalTokens"].is_u64());
    let restored: StablePrefixManifest = serde_json::from_value(json).unwrap();
    assert_eq!(&restored, prefix.manifest());
}

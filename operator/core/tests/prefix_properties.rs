//! Property tests of stable-prefix canonicalisation, hashing and tool ordering.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use proptest::prelude::*;
use serde_json::{Value, json};
use strata_core::prefix::{
    StablePrefix, StablePrefixSources, ToolRegistry, canonicalize_text, to_canonical_json, tool_name,
};
use strata_core::tokens::{TokenCounter, TokenizerKind};

/// Text rich in the characters canonicalisation touches: CR/LF, spaces, tabs, Unicode
/// whitespace, combining marks, BOMs and precomposable letters.
fn messy_text() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop::sample::select(vec![
            "a", "e", "\u{301}", "\u{E9}", " ", "\t", "\n", "\r", "\r\n", "\u{A0}", "\u{2003}", "\u{FEFF}",
            "\u{85}", "\u{2028}", "Z", "\u{1100}", "\u{1161}", "\u{AC00}", "\u{0323}", "\u{0307}", "s",
        ]),
        0..60,
    )
    .prop_map(|parts| parts.concat())
}

/// Prose without digits, so it can never look volatile.
fn stable_prose() -> impl Strategy<Value = String> {
    "[a-zA-Z ,.\n\r\t]{0,200}"
}

fn tool_names() -> impl Strategy<Value = Vec<String>> {
    prop::collection::btree_set("[a-z_]{1,12}", 0..8).prop_map(|set| set.into_iter().collect())
}

fn tool(name: &str) -> Value {
    json!({"name": name, "description": format!("The {name} tool."), "input_schema": {"type": "object", "properties": {}}})
}

fn ordered_names(registry: &mut ToolRegistry, names: &[String]) -> Vec<String> {
    let tools: Vec<Value> = names.iter().map(|name| tool(name)).collect();
    registry.arrange(&tools).unwrap().into_iter().map(|tool| tool_name(tool).unwrap().to_owned()).collect()
}

fn counter() -> TokenCounter {
    TokenCounter::new(TokenizerKind::O200kBase).unwrap()
}

proptest! {
    #[test]
    fn canonicalization_is_idempotent_on_messy_text(text in messy_text()) {
        let once = canonicalize_text(&text);
        prop_assert_eq!(canonicalize_text(&once), once);
    }

    #[test]
    fn canonicalization_is_idempotent_on_any_text(text in any::<String>()) {
        let once = canonicalize_text(&text);
        prop_assert_eq!(canonicalize_text(&once), once.clone());
        prop_assert!(!once.contains('\r'));
        prop_assert!(once.lines().all(|line| line == line.trim_end()));
        prop_assert!(!once.contains("\n\n\n"));
    }

    #[test]
    fn canonical_json_is_a_fixed_point(
        entries in prop::collection::btree_map("[a-z\u{E9}]{0,6}", messy_text(), 0..6),
        reverse in any::<bool>(),
    ) {
        let mut pairs: Vec<(String, String)> = entries.into_iter().collect();
        if reverse {
            pairs.reverse();
        }
        let mut object = serde_json::Map::new();
        for (key, value) in pairs {
            object.insert(key, Value::String(value));
        }
        let value = Value::Object(object);
        let canonical = to_canonical_json(&value).unwrap();
        let reparsed: Value = serde_json::from_str(&canonical).unwrap();
        prop_assert_eq!(to_canonical_json(&reparsed).unwrap(), canonical);
    }

    #[test]
    fn tool_order_is_stable_under_re_presentation(
        names in tool_names(),
        shuffle_seed in any::<u64>(),
    ) {
        let mut registry = ToolRegistry::new();
        let first = ordered_names(&mut registry, &names);
        prop_assert_eq!(&first, &names);
        let mut shuffled = names.clone();
        let len = shuffled.len();
        if len > 1 {
            let mut seed = shuffle_seed;
            for index in (1..len).rev() {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                shuffled.swap(index, (seed >> 33) as usize % (index + 1));
            }
        }
        prop_assert_eq!(ordered_names(&mut registry, &shuffled), first);
    }

    #[test]
    fn new_tools_are_appended_and_removals_keep_relative_order(
        names in tool_names(),
        extra in tool_names(),
        removed_mask in any::<u8>(),
    ) {
        let mut registry = ToolRegistry::new();
        let first = ordered_names(&mut registry, &names);
        let new: Vec<String> = extra.into_iter().filter(|name| !names.contains(name)).collect();
        let mut presented = new.clone();
        presented.extend(names.iter().cloned());
        let second = ordered_names(&mut registry, &presented);
        let mut expected = first.clone();
        expected.extend(new.iter().cloned());
        prop_assert_eq!(&second, &expected);

        let kept: Vec<String> = second
            .iter()
            .enumerate()
            .filter(|(index, _)| removed_mask & (1 << (index % 8)) == 0)
            .map(|(_, name)| name.clone())
            .collect();
        let mut reversed = kept.clone();
        reversed.reverse();
        prop_assert_eq!(ordered_names(&mut registry, &reversed), kept);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn identical_inputs_give_byte_identical_prefixes(
        system_prompt in stable_prose(),
        names in tool_names(),
        constants in prop::collection::btree_map("[a-z]{1,8}", stable_prose(), 0..4),
    ) {
        let sources = StablePrefixSources {
            system_prompt,
            tools: names.iter().map(|name| tool(name)).collect(),
            constants,
        };
        let counter = counter();
        let first = StablePrefix::build(&sources, &mut ToolRegistry::new(), &counter).unwrap();
        let second = StablePrefix::build(&sources.clone(), &mut ToolRegistry::new(), &counter).unwrap();
        let (first_text, second_text) = (first.text(), second.text());
        prop_assert_eq!(first_text.as_bytes(), second_text.as_bytes());
        prop_assert_eq!(first.manifest(), second.manifest());
        // Re-presenting the same tools in another order with a persisted registry changes nothing.
        let mut registry = ToolRegistry::new();
        StablePrefix::build(&sources, &mut registry, &counter).unwrap();
        let mut reversed = sources.clone();
        reversed.tools.reverse();
        let third = StablePrefix::build(&reversed, &mut registry, &counter).unwrap();
        prop_assert_eq!(&third.manifest().prefix_hash, &first.manifest().prefix_hash);
    }

    #[test]
    fn any_source_change_changes_the_prefix_hash(
        system_prompt in "[a-z]{1,40}",
        suffix in "[a-z]{1,10}",
    ) {
        let counter = counter();
        let base = StablePrefixSources {
            system_prompt: system_prompt.clone(),
            tools: vec![tool("read_file")],
            constants: BTreeMap::from([("repo".to_owned(), "strata".to_owned())]),
        };
        let hash = |sources: &StablePrefixSources| {
            StablePrefix::build(sources, &mut ToolRegistry::new(), &counter)
                .unwrap()
                .manifest()
                .prefix_hash
                .clone()
        };
        let original = hash(&base);
        let mut system = base.clone();
        system.system_prompt.push_str(&suffix);
        let mut tools = base.clone();
        tools.tools.push(tool(&format!("t_{suffix}")));
        let mut constants = base.clone();
        constants.constants.insert("k".to_owned(), suffix.clone());
        for changed in [system, tools, constants] {
            prop_assert_ne!(hash(&changed), original.clone());
        }
    }
}

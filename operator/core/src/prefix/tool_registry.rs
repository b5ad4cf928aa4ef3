//! First-seen ordering of tool schemas, persisted per agent so the tools section stays stable.
//!
//! A tool keeps the position it had when first offered; tools new to the agent are appended in
//! the order the current list presents them; a tool no longer offered drops out without
//! reordering the others (and is appended again if it ever returns, which keeps the longest
//! possible common prefix with the previous turn).

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The tool list cannot be ordered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolOrderError {
    /// A tool schema has neither a string `name` nor a string `function.name`.
    #[error("tool schema at index {index} has no string `name` (or `function.name`) field")]
    MissingName {
        /// Position in the presented tool list.
        index: usize,
    },
    /// Two tool schemas in one list share a name.
    #[error("tool `{name}` appears more than once in the tool list")]
    DuplicateName {
        /// The repeated name.
        name: String,
    },
    /// A persisted registry lists a name twice.
    #[error("persisted tool registry lists `{name}` more than once")]
    CorruptRegistry {
        /// The repeated name.
        name: String,
    },
}

/// Name of a tool schema: top-level `name` (Anthropic, MCP) or `function.name` (OpenAI).
pub fn tool_name(tool: &Value) -> Option<&str> {
    tool.get("name").and_then(Value::as_str).or_else(|| tool.get("function")?.get("name")?.as_str())
}

/// Remembers the first-seen order of tool names across calls.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", try_from = "ToolRegistryRecord")]
pub struct ToolRegistry {
    order: Vec<String>,
}

/// Untrusted persisted form, validated into a [`ToolRegistry`].
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ToolRegistryRecord {
    order: Vec<String>,
}

impl TryFrom<ToolRegistryRecord> for ToolRegistry {
    type Error = ToolOrderError;

    fn try_from(record: ToolRegistryRecord) -> Result<Self, Self::Error> {
        let mut seen = HashSet::new();
        for name in &record.order {
            if !seen.insert(name.as_str()) {
                return Err(ToolOrderError::CorruptRegistry { name: name.clone() });
            }
        }
        Ok(Self { order: record.order })
    }
}

impl ToolRegistry {
    /// An empty registry: the first list presented defines the order.
    pub fn new() -> Self {
        Self::default()
    }

    /// Tool names in their stable order.
    pub fn names(&self) -> &[String] {
        &self.order
    }

    /// Records `tools` and returns them in stable order. The registry is only updated when the
    /// list is valid.
    pub fn arrange<'a>(&mut self, tools: &'a [Value]) -> Result<Vec<&'a Value>, ToolOrderError> {
        let mut by_name: HashMap<&str, &'a Value> = HashMap::with_capacity(tools.len());
        let mut presented_order = Vec::with_capacity(tools.len());
        for (index, tool) in tools.iter().enumerate() {
            let name = tool_name(tool).ok_or(ToolOrderError::MissingName { index })?;
            if by_name.insert(name, tool).is_some() {
                return Err(ToolOrderError::DuplicateName { name: name.to_owned() });
            }
            presented_order.push(name);
        }
        self.order.retain(|name| by_name.contains_key(name.as_str()));
        let known: HashSet<String> = self.order.iter().cloned().collect();
        for name in presented_order {
            if !known.contains(name) {
                self.order.push(name.to_owned());
            }
        }
        Ok(self.order.iter().filter_map(|name| by_name.get(name.as_str()).copied()).collect())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn tools(names: &[&str]) -> Vec<Value> {
        names.iter().map(|name| json!({ "name": name })).collect()
    }

    fn arranged(registry: &mut ToolRegistry, names: &[&str]) -> Vec<String> {
        let list = tools(names);
        registry.arrange(&list).unwrap().into_iter().map(|tool| tool_name(tool).unwrap().to_owned()).collect()
    }

    #[test]
    fn keeps_first_seen_order_and_appends_new_tools() {
        let mut registry = ToolRegistry::new();
        assert_eq!(arranged(&mut registry, &["b", "a"]), ["b", "a"]);
        assert_eq!(arranged(&mut registry, &["c", "a", "b"]), ["b", "a", "c"]);
    }

    #[test]
    fn removed_tool_drops_out_and_returns_at_the_end() {
        let mut registry = ToolRegistry::new();
        arranged(&mut registry, &["a", "b", "c"]);
        assert_eq!(arranged(&mut registry, &["c", "a"]), ["a", "c"]);
        assert_eq!(arranged(&mut registry, &["b", "c", "a"]), ["a", "c", "b"]);
    }

    #[test]
    fn reads_openai_function_names() {
        let list = vec![json!({"type": "function", "function": {"name": "grep"}})];
        let mut registry = ToolRegistry::new();
        registry.arrange(&list).unwrap();
        assert_eq!(registry.names(), ["grep"]);
    }

    #[test]
    fn invalid_lists_leave_registry_untouched() {
        let mut registry = ToolRegistry::new();
        arranged(&mut registry, &["a"]);
        let missing = vec![json!({"name": "b"}), json!({"description": "x"})];
        assert_eq!(registry.arrange(&missing), Err(ToolOrderError::MissingName { index: 1 }));
        let duplicate = tools(&["b", "b"]);
        assert!(matches!(registry.arrange(&duplicate), Err(ToolOrderError::DuplicateName { .. })));
        assert_eq!(registry.names(), ["a"]);
    }

    #[test]
    fn persists_and_rejects_corrupt_state() {
        let mut registry = ToolRegistry::new();
        arranged(&mut registry, &["x", "y"]);
        let json = serde_json::to_string(&registry).unwrap();
        assert_eq!(json, r#"{"order":["x","y"]}"#);
        assert_eq!(serde_json::from_str::<ToolRegistry>(&json).unwrap(), registry);
        assert!(serde_json::from_str::<ToolRegistry>(r#"{"order":["x","x"]}"#).is_err());
    }
}

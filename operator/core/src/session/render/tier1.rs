//! Tier 1 as provider JSON: the system text and the ordered tool list, serialised once per prefix change.

use crate::prefix::{SectionClass, StablePrefix};
use bytes::Bytes;
use serde_json::{Value, json};

use crate::session::turn::Api;

/// `cache_control` marker of an Anthropic breakpoint.
pub fn ephemeral() -> Value {
    json!({"type": "ephemeral"})
}

/// Serialised Tier 1 for one API.
#[derive(Debug, Default, Clone)]
pub struct Tier1Json {
    /// System text sent to the model: the canonical system and constants sections.
    pub system_text: String,
    /// Whether there are tools to send. The schemas themselves are kept only as JSON: a coding
    /// agent's are hundreds of kilobytes as values, in every sidecar.
    pub has_tools: bool,
    /// The tool schemas in stable order, memory tools last, as a JSON array.
    pub tools_json: Bytes,
    /// Anthropic: `tools_json` with a breakpoint on the last tool (empty for OpenAI).
    pub tools_json_breakpoint: Bytes,
    /// OpenAI: the system message; Anthropic: the `system` blocks array.
    pub system_json: Bytes,
    /// Anthropic: the `system` blocks array with a breakpoint.
    pub system_json_breakpoint: Bytes,
}

impl Tier1Json {
    /// Serialises `prefix` (whose tools section lists `tools`, in that order) for `api`.
    pub fn build(api: Api, prefix: &StablePrefix, tools: &[Value]) -> Self {
        let system_text = [SectionClass::System, SectionClass::Constants]
            .iter()
            .filter_map(|class| prefix.section(*class))
            .map(|section| section.text.as_str())
            .filter(|text| !text.is_empty())
            .collect::<Vec<_>>()
            .join("\n\n");
        // Serialised as `Value::Array(tools)` would be, each tool once: the breakpoint's array
        // differs only in its last tool.
        let mut items: Vec<String> = tools.iter().map(Value::to_string).collect();
        let tools_json = format!("[{}]", items.join(","));
        let tools_json_breakpoint = match (api, tools.last(), items.last_mut()) {
            (Api::Anthropic, Some(Value::Object(last)), Some(item)) => {
                let mut marked = last.clone();
                marked.insert("cache_control".into(), ephemeral());
                *item = Value::Object(marked).to_string();
                format!("[{}]", items.join(","))
            }
            (Api::Anthropic, ..) => tools_json.clone(),
            (Api::OpenAi, ..) => String::new(),
        };
        let (system_json, system_json_breakpoint) = match api {
            Api::OpenAi => (json!({"role": "system", "content": system_text}).to_string(), String::new()),
            Api::Anthropic => (
                json!([{"type": "text", "text": system_text}]).to_string(),
                json!([{"type": "text", "text": system_text, "cache_control": ephemeral()}]).to_string(),
            ),
        };
        Self {
            system_text,
            has_tools: !tools.is_empty(),
            tools_json: Bytes::from(tools_json),
            tools_json_breakpoint: Bytes::from(tools_json_breakpoint),
            system_json: Bytes::from(system_json),
            system_json_breakpoint: Bytes::from(system_json_breakpoint),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::prefix::{StablePrefixSources, ToolRegistry};
    use crate::tokens::{TokenCounter, TokenizerKind};

    #[test]
    fn the_tool_arrays_are_the_tools_serialised_with_a_breakpoint_on_the_last_for_anthropic() {
        let counter = TokenCounter::new(TokenizerKind::O200kBase).unwrap();
        let tools = vec![
            json!({"name": "read", "description": "Read a file.", "input_schema": {"type": "object"}}),
            json!({"name": "write", "description": "Write \"it\".", "input_schema": {"type": "object"}}),
        ];
        let sources = StablePrefixSources {
            system_prompt: "Be brief.".into(),
            tools: tools.clone(),
            ..Default::default()
        };
        let prefix = StablePrefix::build(&sources, &mut ToolRegistry::new(), &counter).unwrap();
        let mut marked = tools.clone();
        marked[1]["cache_control"] = ephemeral();
        let anthropic = Tier1Json::build(Api::Anthropic, &prefix, &tools);
        assert!(anthropic.has_tools);
        assert_eq!(anthropic.tools_json, Value::Array(tools.clone()).to_string().as_bytes());
        assert_eq!(anthropic.tools_json_breakpoint, Value::Array(marked).to_string().as_bytes());
        let openai = Tier1Json::build(Api::OpenAi, &prefix, &tools);
        assert_eq!(openai.tools_json, anthropic.tools_json);
        assert!(openai.tools_json_breakpoint.is_empty(), "OpenAI has no breakpoints");
        let none = Tier1Json::build(Api::Anthropic, &prefix, &[]);
        assert!(!none.has_tools);
        assert_eq!(none.tools_json, &b"[]"[..]);
    }
}

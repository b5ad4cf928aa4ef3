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
    /// Tool schemas in stable order, memory tools last.
    pub tools: Vec<Value>,
    /// `tools` as a JSON array.
    pub tools_json: Bytes,
    /// Anthropic: `tools` with a breakpoint on the last tool.
    pub tools_json_breakpoint: Bytes,
    /// OpenAI: the system message; Anthropic: the `system` blocks array.
    pub system_json: Bytes,
    /// Anthropic: the `system` blocks array with a breakpoint.
    pub system_json_breakpoint: Bytes,
}

impl Tier1Json {
    /// Serialises `prefix` (whose tools section lists `tools`, in that order) for `api`.
    pub fn build(api: Api, prefix: &StablePrefix, tools: Vec<Value>) -> Self {
        let system_text = [SectionClass::System, SectionClass::Constants]
            .iter()
            .filter_map(|class| prefix.section(*class))
            .map(|section| section.text.as_str())
            .filter(|text| !text.is_empty())
            .collect::<Vec<_>>()
            .join("\n\n");
        let tools_json = Value::Array(tools.clone()).to_string();
        let mut marked = tools.clone();
        if let Some(Value::Object(last)) = marked.last_mut() {
            last.insert("cache_control".into(), ephemeral());
        }
        let tools_json_breakpoint = Value::Array(marked).to_string();
        let (system_json, system_json_breakpoint) = match api {
            Api::OpenAi => (json!({"role": "system", "content": system_text}).to_string(), String::new()),
            Api::Anthropic => (
                json!([{"type": "text", "text": system_text}]).to_string(),
                json!([{"type": "text", "text": system_text, "cache_control": ephemeral()}]).to_string(),
            ),
        };
        Self {
            system_text,
            tools,
            tools_json: Bytes::from(tools_json),
            tools_json_breakpoint: Bytes::from(tools_json_breakpoint),
            system_json: Bytes::from(system_json),
            system_json_breakpoint: Bytes::from(system_json_breakpoint),
        }
    }
}

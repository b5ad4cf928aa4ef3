//! Tool schemas: the memory tools the gateway adds, and conversion of configured tools to each API's shape.

use crate::prefix::tool_name;
use crate::tool_output::READ_OUTPUT_TOOL_NAME;
use serde_json::{Value, json};

use crate::session::turn::Api;

/// The memory tool that purges entries.
pub const PURGE_TOOL_NAME: &str = "strata_purge";

/// The memory tool that compacts the whole history.
pub const COMPACT_TOOL_NAME: &str = "strata_compact_context";

/// Whether `name` is a tool the gateway executes itself.
pub fn is_memory_tool(name: &str) -> bool {
    name == PURGE_TOOL_NAME
        || name == COMPACT_TOOL_NAME
        || name == READ_OUTPUT_TOOL_NAME
        || name == super::capabilities::LOAD_TOOLS_NAME
}

// The schemas go upstream on every call (cached with Tier 1, still read at 0.1x each time), so
// they say what the model needs and no more. Argument ranges are checked by the gateway, which
// answers a bad call with a message naming the field.

fn purge_schema() -> (String, Value) {
    (
        "Remove entries from your context by ID (e.g. msg_104, tool_res_106), replaced by your dense \
         summary. It rewrites the cached prompt once: use it when a sub-task is done or large \
         irrelevant output is present."
            .to_owned(),
        json!({
            "type": "object",
            "properties": {
                "ids": {"type": "array", "items": {"type": "string"}},
                "summary": {"type": "string", "description": "What the removed entries held."}
            },
            "required": ["ids", "summary"]
        }),
    )
}

fn compact_schema() -> (String, Value) {
    (
        "Replace your history with a dense state (objective, constraints, decisions, open questions, \
         tool state) and your resume instruction, when the context is near its limit or bloated. \
         Critical and the most recent entries stay verbatim."
            .to_owned(),
        json!({
            "type": "object",
            "properties": {
                "resume_instruction": {"type": "string", "description": "What to do next."}
            },
            "required": ["resume_instruction"]
        }),
    )
}

fn read_output_schema() -> (String, Value) {
    (
        "Read a spilled or elided tool output by its data_ref (art:sha256:…). Modes: head (lines, \
         chars), slice (offset, length in characters), search (pattern: a per-line regular \
         expression, max_matches)."
            .to_owned(),
        json!({
            "type": "object",
            "properties": {
                "data_ref": {"type": "string"},
                "mode": {"type": "string", "enum": ["head", "slice", "search"]},
                "lines": {"type": "integer"},
                "chars": {"type": "integer"},
                "offset": {"type": "integer"},
                "length": {"type": "integer"},
                "pattern": {"type": "string"},
                "max_matches": {"type": "integer"}
            },
            "required": ["data_ref", "mode"]
        }),
    )
}

pub(super) fn shaped(api: Api, name: &str, description: String, parameters: Value) -> Value {
    match api {
        Api::OpenAi => json!({
            "type": "function",
            "function": {"name": name, "description": description, "parameters": parameters}
        }),
        Api::Anthropic => json!({"name": name, "description": description, "input_schema": parameters}),
    }
}

/// The memory tools in `api`'s shape, in their fixed order (appended after the client's tools).
pub fn memory_tools(api: Api) -> Vec<Value> {
    let (purge_description, purge_parameters) = purge_schema();
    let (compact_description, compact_parameters) = compact_schema();
    let (read_description, read_parameters) = read_output_schema();
    vec![
        shaped(api, PURGE_TOOL_NAME, purge_description, purge_parameters),
        shaped(api, COMPACT_TOOL_NAME, compact_description, compact_parameters),
        shaped(api, READ_OUTPUT_TOOL_NAME, read_description, read_parameters),
    ]
}

/// `strata_load_tools` in `api`'s shape (appended after the memory tools while schemas are lazy).
pub fn load_tools_tool(api: Api) -> Value {
    let (description, parameters) = super::capabilities::load_tools_schema();
    shaped(api, super::capabilities::LOAD_TOOLS_NAME, description, parameters)
}

/// Converts a tool schema given in either shape (OpenAI `{type, function}` or Anthropic/MCP
/// `{name, input_schema}`) into `api`'s shape. Unknown shapes are returned unchanged.
pub fn to_api_shape(api: Api, tool: &Value) -> Value {
    let is_openai = tool.get("function").is_some();
    match (api, is_openai) {
        (Api::OpenAi, true) | (Api::Anthropic, false) => tool.clone(),
        (Api::OpenAi, false) => {
            let name = tool_name(tool).unwrap_or_default();
            let description = tool.get("description").cloned().unwrap_or(Value::String(String::new()));
            let parameters = tool
                .get("input_schema")
                .or_else(|| tool.get("inputSchema"))
                .cloned()
                .unwrap_or_else(|| json!({"type": "object"}));
            json!({"type": "function", "function": {"name": name, "description": description, "parameters": parameters}})
        }
        (Api::Anthropic, true) => {
            let function = &tool["function"];
            let name = tool_name(tool).unwrap_or_default();
            let description = function.get("description").cloned().unwrap_or(Value::String(String::new()));
            let parameters = function.get("parameters").cloned().unwrap_or_else(|| json!({"type": "object"}));
            json!({"name": name, "description": description, "input_schema": parameters})
        }
    }
}

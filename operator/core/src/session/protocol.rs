//! The provider protocol rules every upstream request must keep, checked on the rendered body:
//! each tool result directly follows the assistant message that called it, every call is
//! answered, parallel calls stay together, and (Anthropic) roles alternate with tool results
//! first in their user message. The gateway's tests and property tests check every compiled
//! request with it.

use std::collections::HashSet;

use serde_json::Value;

use super::turn::Api;

/// A rule the request breaks, with the message index.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("message {index}: {rule}")]
pub struct ProtocolViolation {
    /// Index in `messages`.
    pub index: usize,
    /// What is wrong.
    pub rule: String,
}

fn violation(index: usize, rule: impl Into<String>) -> ProtocolViolation {
    ProtocolViolation { index, rule: rule.into() }
}

/// Checks an upstream request body of `api` against the provider's tool-pairing rules.
pub fn check_request(api: Api, body: &Value) -> Result<(), ProtocolViolation> {
    let messages =
        body.get("messages").and_then(Value::as_array).ok_or_else(|| violation(0, "no messages array"))?;
    match api {
        Api::OpenAi => check_openai(messages),
        Api::Anthropic => check_anthropic(messages),
    }
}

fn check_openai(messages: &[Value]) -> Result<(), ProtocolViolation> {
    let mut open: Vec<String> = Vec::new();
    let mut open_since = 0;
    for (index, message) in messages.iter().enumerate() {
        let role = message.get("role").and_then(Value::as_str).unwrap_or_default();
        if role == "tool" {
            let id = message.get("tool_call_id").and_then(Value::as_str).unwrap_or_default();
            let Some(position) = open.iter().position(|call| call == id) else {
                return Err(violation(index, format!("tool result for {id:?} does not follow its call")));
            };
            open.remove(position);
            continue;
        }
        if let Some(call) = open.first() {
            return Err(violation(
                open_since,
                format!("call {call:?} is not answered before message {index}"),
            ));
        }
        if role == "assistant"
            && let Some(calls) = message.get("tool_calls").and_then(Value::as_array)
        {
            let ids: Vec<String> =
                calls.iter().map(|call| call["id"].as_str().unwrap_or_default().to_owned()).collect();
            if ids.iter().collect::<HashSet<_>>().len() != ids.len() {
                return Err(violation(index, "duplicate tool call ids in one message"));
            }
            if ids.is_empty() {
                return Err(violation(index, "empty tool_calls array"));
            }
            open = ids;
            open_since = index;
        }
    }
    match open.first() {
        Some(call) => Err(violation(open_since, format!("call {call:?} is never answered"))),
        None => Ok(()),
    }
}

fn check_anthropic(messages: &[Value]) -> Result<(), ProtocolViolation> {
    let mut expected_results: Vec<String> = Vec::new();
    let mut previous_role = "";
    for (index, message) in messages.iter().enumerate() {
        let role = message.get("role").and_then(Value::as_str).unwrap_or_default();
        if role != "user" && role != "assistant" {
            return Err(violation(index, format!("role {role:?}")));
        }
        if index == 0 && role != "user" {
            return Err(violation(index, "the first message is not the user's"));
        }
        if role == previous_role {
            return Err(violation(index, format!("two {role} messages in a row")));
        }
        previous_role = role;
        let blocks = message.get("content").and_then(Value::as_array);
        let Some(blocks) = blocks.filter(|blocks| !blocks.is_empty()) else {
            return Err(violation(index, "empty or non-array content"));
        };
        let kind = |block: &Value| block.get("type").and_then(Value::as_str).unwrap_or_default().to_owned();
        if blocks
            .iter()
            .any(|block| kind(block) == "text" && block["text"].as_str().is_none_or(str::is_empty))
        {
            return Err(violation(index, "empty text block"));
        }
        if role == "assistant" {
            if blocks.iter().any(|block| kind(block) == "tool_result") {
                return Err(violation(index, "tool_result in an assistant message"));
            }
            expected_results = blocks
                .iter()
                .filter(|block| kind(block) == "tool_use")
                .map(|block| block["id"].as_str().unwrap_or_default().to_owned())
                .collect();
            continue;
        }
        let results: Vec<&str> = blocks
            .iter()
            .take_while(|block| kind(block) == "tool_result")
            .map(|block| block["tool_use_id"].as_str().unwrap_or_default())
            .collect();
        if blocks.iter().skip(results.len()).any(|block| kind(block) == "tool_result") {
            return Err(violation(index, "a tool_result after other content in its user message"));
        }
        for id in &results {
            let Some(position) = expected_results.iter().position(|call| call == id) else {
                return Err(violation(
                    index,
                    format!("tool_result for {id:?} does not answer the previous message"),
                ));
            };
            expected_results.remove(position);
        }
        if let Some(call) = expected_results.first() {
            return Err(violation(index, format!("tool_use {call:?} is not answered in the next message")));
        }
    }
    match expected_results.first() {
        Some(call) => Err(violation(messages.len(), format!("tool_use {call:?} is never answered"))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn call(id: &str) -> Value {
        json!({"id": id, "type": "function", "function": {"name": "f", "arguments": "{}"}})
    }

    #[test]
    fn openai_pairs_are_checked() {
        let ok = json!({"messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "tool_calls": [call("a"), call("b")]},
            {"role": "tool", "tool_call_id": "b", "content": "1"},
            {"role": "tool", "tool_call_id": "a", "content": "2"},
            {"role": "system", "content": "Status"}
        ]});
        assert_eq!(check_request(Api::OpenAi, &ok), Ok(()));
        let orphan = json!({"messages": [{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "a", "content": "x"}]});
        assert!(check_request(Api::OpenAi, &orphan).unwrap_err().rule.contains("does not follow"));
        let split = json!({"messages": [
            {"role": "assistant", "content": "", "tool_calls": [call("a"), call("b")]},
            {"role": "tool", "tool_call_id": "a", "content": "1"},
            {"role": "user", "content": "wait"},
            {"role": "tool", "tool_call_id": "b", "content": "2"}
        ]});
        assert!(check_request(Api::OpenAi, &split).unwrap_err().rule.contains("not answered"));
        let unanswered =
            json!({"messages": [{"role": "assistant", "content": "", "tool_calls": [call("a")]}]});
        assert!(check_request(Api::OpenAi, &unanswered).unwrap_err().rule.contains("never answered"));
    }

    #[test]
    fn anthropic_pairs_and_alternation_are_checked() {
        let ok = json!({"messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": "1"}, {"type": "text", "text": "Status"}]}
        ]});
        assert_eq!(check_request(Api::Anthropic, &ok), Ok(()));
        let late = json!({"messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "tool_result", "tool_use_id": "a", "content": "1"}]}
        ]});
        assert!(check_request(Api::Anthropic, &late).is_err());
        let twice = json!({"messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "user", "content": [{"type": "text", "text": "again"}]}
        ]});
        assert!(check_request(Api::Anthropic, &twice).unwrap_err().rule.contains("in a row"));
    }
}

//! An upstream's non-streaming answer read straight into its fields, without a JSON tree: the usual
//! answer, read on every request, costs a few allocations instead of one per key and value.
//!
//! Each reader takes the answers whose every field it reads has the expected type, and gives
//! `None` for any other (a field of another type, a repeated key, content parts instead of a
//! string, an OpenAI `tool_calls: []`): the caller then reads the answer as a JSON tree, with the
//! same result and the same errors as before. The output of the fast path carries no `raw` tree;
//! [`with_raw`] adds it when the client's answer has to be built again.

use std::borrow::Cow;

use serde::{Deserialize, Deserializer};
use serde_json::Value;
use strata_core::entry::ToolCall;
use strata_core::session::turn::{AssistantOutput, Usage};

use super::errors::GatewayError;

/// `Some` for a field that is present, whatever its value (`null` included), so a missing field and
/// a `null` one stay apart, as they are in a JSON tree.
fn present<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(deserializer).map(Some)
}

#[derive(Deserialize)]
struct OpenAiAnswer<'a> {
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    choices: Vec<OpenAiChoice<'a>>,
    #[serde(default)]
    usage: Option<OpenAiUsage>,
}

#[derive(Deserialize)]
struct OpenAiChoice<'a> {
    #[serde(borrow, default)]
    message: Option<OpenAiMessage<'a>>,
    #[serde(borrow, default)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct OpenAiMessage<'a> {
    #[serde(borrow, default)]
    content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    tool_calls: Option<Vec<OpenAiToolCall<'a>>>,
}

#[derive(Deserialize)]
struct OpenAiToolCall<'a> {
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    function: Option<OpenAiFunction<'a>>,
}

#[derive(Deserialize)]
struct OpenAiFunction<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    arguments: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct OpenAiUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens_details: Option<OpenAiUsageDetails>,
}

#[derive(Deserialize)]
struct OpenAiUsageDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

fn owned(text: Option<Cow<'_, str>>) -> String {
    text.map(Cow::into_owned).unwrap_or_default()
}

/// An OpenAI chat completion, or `None` when it takes the JSON tree to read it.
pub fn openai_answer(bytes: &[u8]) -> Option<AssistantOutput> {
    let answer: OpenAiAnswer<'_> = serde_json::from_slice(bytes).ok()?;
    let choice = answer.choices.into_iter().next()?;
    let (text, calls) = match choice.message {
        Some(message) => (owned(message.content), message.tool_calls),
        None => (String::new(), None),
    };
    if calls.as_ref().is_some_and(Vec::is_empty) {
        return None;
    }
    let tool_calls = calls
        .unwrap_or_default()
        .into_iter()
        .map(|call| {
            let (name, arguments) = match call.function {
                Some(function) => (owned(function.name), function.arguments),
                None => (String::new(), None),
            };
            ToolCall {
                call_id: owned(call.id),
                name,
                arguments_json: arguments.map_or_else(|| "{}".to_owned(), Cow::into_owned),
            }
        })
        .collect();
    let usage = answer.usage.and_then(|usage| {
        Some(Usage {
            prompt_tokens: usage.prompt_tokens?,
            cached_tokens: usage.prompt_tokens_details.and_then(|details| details.cached_tokens).unwrap_or(0),
            cache_write_tokens: 0,
            completion_tokens: usage.completion_tokens.unwrap_or(0),
        })
    });
    Some(AssistantOutput {
        id: owned(answer.id),
        text,
        tool_calls,
        stop_reason: owned(choice.finish_reason),
        usage,
        raw: None,
    })
}

#[derive(Deserialize)]
struct AnthropicAnswer<'a> {
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    content: Vec<AnthropicBlock<'a>>,
    #[serde(borrow, default)]
    stop_reason: Option<Cow<'a, str>>,
    #[serde(default)]
    usage: Option<AnthropicUsage>,
}

#[derive(Deserialize)]
struct AnthropicBlock<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(default, deserialize_with = "present")]
    input: Option<Value>,
}

#[derive(Deserialize)]
struct AnthropicUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
}

/// An Anthropic message, or `None` when it takes the JSON tree to read it.
pub fn anthropic_answer(bytes: &[u8]) -> Option<AssistantOutput> {
    let answer: AnthropicAnswer<'_> = serde_json::from_slice(bytes).ok()?;
    let mut texts: Vec<Cow<'_, str>> = Vec::new();
    let mut tool_calls = Vec::new();
    for block in answer.content {
        match block.kind.as_deref() {
            Some("text") => texts.push(block.text.unwrap_or_default()),
            Some("tool_use") => tool_calls.push(ToolCall {
                call_id: owned(block.id),
                name: owned(block.name),
                arguments_json: block.input.unwrap_or_else(|| Value::Object(Default::default())).to_string(),
            }),
            _ => {}
        }
    }
    let usage = answer.usage.and_then(|usage| {
        let cached = usage.cache_read_input_tokens.unwrap_or(0);
        let written = usage.cache_creation_input_tokens.unwrap_or(0);
        Some(Usage {
            prompt_tokens: usage.input_tokens?.saturating_add(cached).saturating_add(written),
            cached_tokens: cached,
            cache_write_tokens: written,
            completion_tokens: usage.output_tokens.unwrap_or(0),
        })
    });
    Some(AssistantOutput {
        id: owned(answer.id),
        text: super::anthropic::join_texts(texts.iter().map(|text| text.as_ref())),
        tool_calls,
        stop_reason: owned(answer.stop_reason),
        usage,
        raw: None,
    })
}

/// `output` with the JSON tree of `bytes`, the answer it was read from, when it has none yet: the
/// client's answer is built from it.
pub fn with_raw(mut output: AssistantOutput, bytes: &[u8]) -> Result<AssistantOutput, GatewayError> {
    if output.raw.is_none() {
        let value = serde_json::from_slice(bytes)
            .map_err(|error| GatewayError::UpstreamProtocol(format!("answer is not JSON: {error}")))?;
        output.raw = Some(value);
    }
    Ok(output)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::gateway::provider::adapter;
    use strata_core::session::turn::Api;

    /// What the JSON tree's reader makes of `answer`, without its `raw` tree.
    fn read_as_a_tree(api: Api, answer: &str) -> String {
        let value: Value = serde_json::from_str(answer).unwrap();
        match adapter(api).parse_answer(value) {
            Ok(output) => format!("{:?}", output.without_raw()),
            Err(error) => format!("error: {error}"),
        }
    }

    fn read(api: Api, answer: &str) -> String {
        match adapter(api).read_answer(answer.as_bytes()) {
            Ok(output) => format!("{:?}", output.without_raw()),
            Err(error) => format!("error: {error}"),
        }
    }

    fn fast(api: Api, answer: &str) -> Option<AssistantOutput> {
        adapter(api).usual_answer(answer.as_bytes())
    }

    const OPENAI: [&str; 14] = [
        r#"{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi \u00e9\n"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":1,"total_tokens":11,"prompt_tokens_details":{"cached_tokens":8},"completion_tokens_details":{"reasoning_tokens":0}}}"#,
        r#"{"id":"c2","choices":[{"message":{"content":null,"tool_calls":[{"id":"t1","type":"function","function":{"name":"grep","arguments":"{\"q\":\"x\"}"}},{"id":"t2","function":{"name":"strata_purge"}}]},"finish_reason":"tool_calls"}]}"#,
        r#"{"id":"c3","choices":[{"message":{"content":"x","tool_calls":[]},"finish_reason":"stop"}]}"#,
        r#"{"id":"c4","choices":[{"message":{"content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}}]}"#,
        r#"{"id":7,"choices":[{"message":{"content":"x"}}]}"#,
        r#"{"id":null,"choices":[{"finish_reason":null}],"usage":null}"#,
        r#"{"choices":[]}"#,
        r#"{"choices":{}}"#,
        r#"{"id":"c5"}"#,
        r#"{"id":"a","id":"b","choices":[{"message":{"content":"x"}}]}"#,
        r#"{"choices":[{"message":{"content":"x","tool_calls":[{"function":{"name":"f","arguments":{"a":1}}}]}}]}"#,
        r#"{"choices":[{"message":{"content":"x"}}],"usage":{"completion_tokens":3}}"#,
        r#"{"choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":5,"prompt_tokens_details":null,"completion_tokens":null}}"#,
        r#"{"choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":5.5}}"#,
    ];

    const ANTHROPIC: [&str; 10] = [
        r#"{"id":"m1","type":"message","role":"assistant","content":[{"type":"text","text":"hi"},{"type":"text","text":""},{"type":"text","text":"there"}],"stop_reason":"end_turn","usage":{"input_tokens":3,"cache_read_input_tokens":100,"cache_creation_input_tokens":7,"output_tokens":2}}"#,
        r#"{"id":"m2","content":[{"type":"thinking","thinking":"hm","signature":"s"},{"type":"tool_use","id":"u1","name":"grep","input":{"b":[1,2],"a":"x"}},{"type":"tool_use","id":"u2","name":"f","input":null},{"type":"tool_use","id":"u3","name":"g"}],"stop_reason":"tool_use"}"#,
        r#"{"id":"m3","content":[{"type":"text"}],"stop_reason":null,"usage":{"output_tokens":1}}"#,
        r#"{"id":"m4","content":"text"}"#,
        r#"{"id":"m5"}"#,
        r#"{"id":"m6","content":[{"type":"text","text":5}]}"#,
        r#"{"id":"m7","content":[{"text":"no type"}],"stop_reason":"tool_use"}"#,
        r#"{"id":"m8","content":[],"usage":{"input_tokens":18446744073709551615,"cache_read_input_tokens":5}}"#,
        r#"{"content":[{"type":"text","text":"a"}],"stop_reason":7}"#,
        r#"{"content":[{"type":"text","text":"a","type":"text"}]}"#,
    ];

    #[test]
    fn every_answer_reads_as_its_json_tree_reads_fast_path_or_not() {
        for (api, answers) in [(Api::OpenAi, &OPENAI[..]), (Api::Anthropic, &ANTHROPIC[..])] {
            for answer in answers {
                assert_eq!(read(api, answer), read_as_a_tree(api, answer), "{api:?}: {answer}");
            }
        }
    }

    #[test]
    fn the_usual_answers_take_the_fast_path_and_the_others_the_tree() {
        let fast_openai: Vec<bool> =
            OPENAI.iter().map(|answer| fast(Api::OpenAi, answer).is_some()).collect();
        assert_eq!(
            fast_openai,
            [true, true, false, false, false, true, false, false, false, false, false, true, true, false]
        );
        let fast_anthropic: Vec<bool> =
            ANTHROPIC.iter().map(|answer| fast(Api::Anthropic, answer).is_some()).collect();
        assert_eq!(fast_anthropic, [true, true, true, false, false, false, true, true, false, false]);
    }

    #[test]
    fn a_fast_answer_carries_no_tree_until_the_clients_answer_needs_one() {
        let output = fast(Api::OpenAi, OPENAI[0]).unwrap();
        assert!(output.raw.is_none());
        let output = with_raw(output, OPENAI[0].as_bytes()).unwrap();
        let tree: Value = serde_json::from_str(OPENAI[0]).unwrap();
        assert_eq!(output.raw, Some(tree));
        let kept = with_raw(output.clone(), b"not json").unwrap();
        assert_eq!(kept.raw, output.raw);
    }

    #[test]
    fn an_answer_that_is_not_json_is_the_upstreams_protocol_error() {
        for api in [Api::OpenAi, Api::Anthropic] {
            let error = adapter(api).read_answer(b"<html>bad gateway</html>").unwrap_err();
            assert!(matches!(error, GatewayError::UpstreamProtocol(_)), "{error}");
            assert!(error.to_string().contains("answer is not JSON"), "{error}");
        }
    }
}

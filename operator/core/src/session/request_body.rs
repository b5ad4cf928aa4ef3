//! A chat request body read at its top level only: each message as its raw bytes, every other
//! field parsed, so that messages a client resends unchanged need not be parsed again.

use std::fmt;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// A request body split at its top level.
#[derive(Debug)]
pub struct SplitBody<'a> {
    /// Each element of `messages`, as the exact bytes the client sent.
    pub messages: Vec<&'a RawValue>,
    /// Every other top-level field.
    pub fields: Map<String, Value>,
}

/// Why a body could not be split.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// Not JSON at all.
    #[error("request body is not valid JSON: {0}")]
    NotJson(serde_json::Error),
    /// JSON, but not an object.
    #[error("request body must be a JSON object")]
    NotObject,
    /// `messages` is missing or not an array.
    #[error("`messages` is required and must be an array")]
    NoMessages,
}

/// Splits `body`: `messages` into its elements' raw bytes, the other fields parsed.
pub fn split_body(body: &[u8]) -> Result<SplitBody<'_>, BodyError> {
    let top: TopLevel<'_> = match serde_json::from_slice(body) {
        Ok(top) => top,
        // The only data error the reader raises is the body's own type; anything nested is read
        // as a `Value` or raw bytes, which accept every JSON value.
        Err(error) if error.is_data() => return Err(BodyError::NotObject),
        Err(error) => return Err(BodyError::NotJson(error)),
    };
    match top.messages {
        Some(Messages::Array(messages)) => Ok(SplitBody { messages, fields: top.fields }),
        Some(Messages::Other) | None => Err(BodyError::NoMessages),
    }
}

/// The top-level object (`messages` apart).
struct TopLevel<'a> {
    messages: Option<Messages<'a>>,
    fields: Map<String, Value>,
}

/// The value of `messages`.
enum Messages<'a> {
    Array(Vec<&'a RawValue>),
    /// Anything but an array (read and dropped, so the error can say what was expected).
    Other,
}

impl<'de> serde::Deserialize<'de> for TopLevel<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(TopLevelVisitor)
    }
}

struct TopLevelVisitor;

impl<'de> Visitor<'de> for TopLevelVisitor {
    type Value = TopLevel<'de>;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut top = TopLevel { messages: None, fields: Map::new() };
        while let Some(key) = map.next_key::<String>()? {
            if key == "messages" {
                top.messages = Some(map.next_value()?);
            } else {
                let value = map.next_value::<Value>()?;
                top.fields.insert(key, value);
            }
        }
        Ok(top)
    }
}

impl<'de> serde::Deserialize<'de> for Messages<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(MessagesVisitor)
    }
}

struct MessagesVisitor;

impl<'de> Visitor<'de> for MessagesVisitor {
    type Value = Messages<'de>;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("an array of messages")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut messages = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(message) = seq.next_element::<&'de RawValue>()? {
            messages.push(message);
        }
        Ok(Messages::Array(messages))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Messages::Other)
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Messages::Other)
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Messages::Other)
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Messages::Other)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Messages::Other)
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(Messages::Other)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Messages::Other)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn messages_keep_their_exact_bytes_and_other_fields_are_parsed() {
        let body = br#"{"model":"m","messages":[{"role":"user","content":"a\u00e9"} , {"role":"assistant","content":"b"}],"stream":true}"#;
        let split = split_body(body).unwrap();
        let raw: Vec<&str> = split.messages.iter().map(|message| message.get()).collect();
        assert_eq!(raw, [r#"{"role":"user","content":"a\u00e9"}"#, r#"{"role":"assistant","content":"b"}"#]);
        assert_eq!(split.fields.get("model"), Some(&Value::from("m")));
        assert_eq!(split.fields.get("stream"), Some(&Value::from(true)));
        assert!(!split.fields.contains_key("messages"));
    }

    #[test]
    fn each_kind_of_bad_body_gets_its_own_error() {
        assert!(matches!(split_body(b"{\"messages\": [").unwrap_err(), BodyError::NotJson(_)));
        assert!(matches!(split_body(b"[1, 2]").unwrap_err(), BodyError::NotObject));
        assert!(matches!(split_body(b"\"text\"").unwrap_err(), BodyError::NotObject));
        assert!(matches!(split_body(b"{\"model\": \"m\"}").unwrap_err(), BodyError::NoMessages));
        for messages in [r#"{"a": {"b": 1}}"#, "null", "1", "-1", "1.5", "true", "\"x\""] {
            let body = format!(r#"{{"messages": {messages}, "model": "m"}}"#);
            assert!(matches!(split_body(body.as_bytes()).unwrap_err(), BodyError::NoMessages), "{messages}");
        }
        // Malformed JSON inside a message is a syntax error, not a missing array.
        assert!(matches!(split_body(br#"{"messages": [{"role": }]}"#).unwrap_err(), BodyError::NotJson(_)));
    }
}

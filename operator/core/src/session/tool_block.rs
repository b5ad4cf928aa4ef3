//! The client's tool block, parsed once: a coding agent resends the same tools (tens of thousands
//! of tokens of JSON schemas) with every request, and parsing them again each time cost more than
//! the rest of the gateway's work on a request. A block whose bytes equal the last one's is the
//! last one's parsed value, shared; the engine then sees the very same tools and compares nothing.

use std::ops::Range;
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::Value;

/// A tool block as a request carries it.
pub type Tools = Arc<[Value]>;

/// Why a request's `tools` could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ToolBlockError {
    /// Not an array (nor null).
    #[error("`tools` must be an array")]
    NotAnArray,
    /// Not JSON. Finding where the block ends checks less than parsing it (a lone surrogate
    /// escape passes, for one), so this is where such a body is refused; the position is within
    /// the block.
    #[error("request body is not valid JSON in `tools`: {0} (counted from the start of `tools`)")]
    NotJson(serde_json::Error),
}

/// The last tool block read: its bytes and its value.
#[derive(Debug, Default)]
struct LastBlock {
    bytes: Arc<[u8]>,
    tools: Tools,
}

/// The last tool block a gateway read, shared by its requests.
#[derive(Debug, Default)]
pub struct ToolBlocks {
    last: Mutex<LastBlock>,
}

impl ToolBlocks {
    /// The last block's bytes, for a split to find the block by ([`super::tool_splice`]); None
    /// before any block was read.
    pub fn last_bytes(&self) -> Option<Arc<[u8]>> {
        let last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        (!last.bytes.is_empty()).then(|| Arc::clone(&last.bytes))
    }

    /// The tools at `span` of `body` (none when there is no span or the value is null): the
    /// last block's value when the bytes are the same, parsed otherwise (outside the lock) and
    /// remembered.
    pub fn read(&self, body: &[u8], span: Option<Range<usize>>) -> Result<Tools, ToolBlockError> {
        let Some(bytes) = span.and_then(|span| body.get(span)) else { return Ok(Tools::default()) };
        {
            let last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
            if *last.bytes == *bytes {
                return Ok(Arc::clone(&last.tools));
            }
        }
        let tools: Tools = match serde_json::from_slice(bytes).map_err(ToolBlockError::NotJson)? {
            Value::Null => return Ok(Tools::default()),
            Value::Array(tools) => tools.into(),
            _ => return Err(ToolBlockError::NotAnArray),
        };
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if *last.bytes == *bytes {
            // Another request parsed the same block meanwhile: one shared value for both.
            return Ok(Arc::clone(&last.tools));
        }
        last.bytes = bytes.into();
        last.tools = Arc::clone(&tools);
        Ok(tools)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn span_of(body: &str, value: &str) -> Option<Range<usize>> {
        let start = body.find(value)?;
        Some(start..start + value.len())
    }

    #[test]
    fn the_same_bytes_give_the_same_shared_tools_and_new_bytes_are_parsed() {
        let blocks = ToolBlocks::default();
        let first = r#"{"tools":[{"name":"read"}],"messages":[]}"#;
        let span = span_of(first, r#"[{"name":"read"}]"#);
        let read = blocks.read(first.as_bytes(), span.clone()).unwrap();
        assert_eq!(&*read, [serde_json::json!({"name": "read"})]);
        // Another body with the same block elsewhere: the very same value, not a new parse.
        let second = r#"{"messages":[{"role":"user"}],"tools":[{"name":"read"}]}"#;
        let again = blocks.read(second.as_bytes(), span_of(second, r#"[{"name":"read"}]"#)).unwrap();
        assert!(Arc::ptr_eq(&read, &again));
        let third = r#"{"tools":[{"name":"write"}]}"#;
        let changed = blocks.read(third.as_bytes(), span_of(third, r#"[{"name":"write"}]"#)).unwrap();
        assert!(!Arc::ptr_eq(&read, &changed));
        assert_eq!(&*changed, [serde_json::json!({"name": "write"})]);
    }

    #[test]
    fn no_tools_null_and_other_values() {
        let blocks = ToolBlocks::default();
        assert!(blocks.read(b"{}", None).unwrap().is_empty());
        let null = r#"{"tools":null}"#;
        assert!(blocks.read(null.as_bytes(), span_of(null, "null")).unwrap().is_empty());
        let object = r#"{"tools":{"name":"read"}}"#;
        let error = blocks.read(object.as_bytes(), span_of(object, r#"{"name":"read"}"#)).unwrap_err();
        assert_eq!(error.to_string(), "`tools` must be an array");
        // A lone surrogate passes the splitter's skip over the block and is refused here.
        let surrogate = r#"{"tools":["\ud800"]}"#;
        let error = blocks.read(surrogate.as_bytes(), span_of(surrogate, r#"["\ud800"]"#)).unwrap_err();
        assert!(error.to_string().starts_with("request body is not valid JSON in `tools`"), "{error}");
    }
}

//! Canonical JSON: object keys sorted recursively, compact separators, NFC strings.
//!
//! Rules (part of `strata.canon/v1`):
//! * object members are ordered by the UTF-8 bytes of their NFC-normalised key;
//! * no insignificant whitespace (`,` and `:` separators only);
//! * strings (keys and values) are NFC-normalised with LF line endings and escaped as
//!   `serde_json` escapes them;
//! * numbers are printed as `serde_json` prints them;
//! * nothing is omitted: `null` members and empty containers are kept, so the canonical form is
//!   a faithful rendering of the input;
//! * array order is preserved (arrays are ordered data).

use std::collections::BTreeMap;

use serde_json::Value;

use super::canon_text::normalize_string;

/// A JSON value cannot be rendered canonically.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CanonicalJsonError {
    /// Two distinct keys of one object become equal after NFC normalisation.
    #[error("object has two keys that are equal after Unicode NFC normalisation: {key:?}")]
    DuplicateKeyAfterNormalization {
        /// The normalised key.
        key: String,
    },
}

/// Renders `value` in canonical form.
pub fn to_canonical_json(value: &Value) -> Result<String, CanonicalJsonError> {
    let mut out = String::new();
    write_value(value, &mut out)?;
    Ok(out)
}

fn write_value(value: &Value, out: &mut String) -> Result<(), CanonicalJsonError> {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(flag) => out.push_str(if *flag { "true" } else { "false" }),
        Value::Number(number) => out.push_str(&number.to_string()),
        Value::String(text) => write_string(&normalize_string(text), out),
        Value::Array(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                write_value(item, out)?;
            }
            out.push(']');
        }
        Value::Object(members) => {
            let mut sorted = BTreeMap::new();
            for (key, member) in members {
                let normalized = normalize_string(key);
                if sorted.contains_key(&normalized) {
                    return Err(CanonicalJsonError::DuplicateKeyAfterNormalization { key: normalized });
                }
                sorted.insert(normalized, member);
            }
            out.push('{');
            for (index, (key, member)) in sorted.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                write_string(key, out);
                out.push(':');
                write_value(member, out)?;
            }
            out.push('}');
        }
    }
    Ok(())
}

fn write_string(text: &str, out: &mut String) {
    out.push_str(&json_string(text));
}

/// `text` as a JSON string literal, escaped exactly as `serde_json` escapes it.
pub(super) fn json_string(text: &str) -> String {
    // Serialising a `&str` cannot fail; the fallback keeps the function total regardless.
    serde_json::to_string(text).unwrap_or_else(|_| String::from("\"\""))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn sorts_keys_recursively_and_is_compact() {
        let value = json!({"b": 1, "a": {"z": [3, {"y": null, "x": true}], "c": "s"}});
        assert_eq!(
            to_canonical_json(&value).unwrap(),
            r#"{"a":{"c":"s","z":[3,{"x":true,"y":null}]},"b":1}"#
        );
    }

    #[test]
    fn numbers_print_like_serde_json() {
        let value = json!({"f": 1.5, "i": -7, "big": 18446744073709551615u64});
        assert_eq!(to_canonical_json(&value).unwrap(), r#"{"big":18446744073709551615,"f":1.5,"i":-7}"#);
    }

    #[test]
    fn strings_are_nfc_and_escaped() {
        let value = json!({"e\u{301}": "line\r\n\"q\""});
        assert_eq!(to_canonical_json(&value).unwrap(), "{\"\u{E9}\":\"line\\n\\\"q\\\"\"}");
    }

    #[test]
    fn rejects_keys_colliding_after_nfc() {
        let value = json!({"e\u{301}": 1, "\u{E9}": 2});
        assert!(matches!(
            to_canonical_json(&value),
            Err(CanonicalJsonError::DuplicateKeyAfterNormalization { .. })
        ));
    }
}

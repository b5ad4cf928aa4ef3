//! A chat request body read at its top level only: each message as its raw bytes, every other
//! field parsed, so that messages a client resends unchanged need not be parsed again.

use std::fmt;
use std::ops::Range;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::tool_splice::Splice;

/// A request body split at its top level.
#[derive(Debug)]
pub struct SplitBody {
    /// Where each element of `messages` lies in the body: the exact bytes the client sent.
    pub messages: Vec<Range<usize>>,
    /// Every other top-level field.
    pub fields: Map<String, Value>,
    /// The fields before `messages`, when `messages` appears once: what a later body that opens
    /// with the same bytes is resumed with ([`split_body_after`]).
    pub opening: Option<Map<String, Value>>,
    /// How many leading messages a resumed split ([`split_body_after`]) found at the same places
    /// and with the same bytes as in the earlier body; 0 for a split of the whole body.
    pub known: usize,
    /// Where the value of `tools` lies in the body, unparsed (the last one, when the key repeats):
    /// a client resends the same tool block with every request, so it is parsed only when its
    /// bytes change ([`super::tool_block::ToolBlocks`]).
    pub tools: Option<Range<usize>>,
    /// Where the value of `tools` lies when it comes before `messages` (part of `opening`).
    pub opening_tools: Option<Range<usize>>,
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

/// What is known of a body's opening from an earlier body split before: its bytes equal the
/// earlier body's up to `end`, the end of the earlier body's first messages, at `spans`.
#[derive(Debug)]
pub struct KnownOpening<'a> {
    /// Where the known messages end.
    pub end: usize,
    /// The known messages, the last one ending at `end`.
    pub spans: &'a [Range<usize>],
    /// The earlier body's fields before `messages` ([`SplitBody::opening`]).
    pub fields: &'a Map<String, Value>,
    /// The earlier body's `tools` before `messages` ([`SplitBody::opening_tools`]).
    pub tools: Option<Range<usize>>,
}

/// Splits `body`: `messages` into its elements' raw bytes, the other fields parsed.
pub fn split_body(body: &[u8]) -> Result<SplitBody, BodyError> {
    let top: TopLevel<'_> = match serde_json::from_slice(body) {
        Ok(top) => top,
        // The only data error the reader raises is the body's own type; anything nested is read
        // as a `Value` or raw bytes, which accept every JSON value.
        Err(error) if error.is_data() => return Err(BodyError::NotObject),
        Err(error) => return Err(BodyError::NotJson(error)),
    };
    let opening = (top.messages_keys == 1).then_some(top.before_messages);
    let opening_tools = top.tools_before_messages.filter(|_| opening.is_some()).map(|raw| span(body, raw, 0));
    match top.messages {
        Some(Messages::Array(messages)) => Ok(SplitBody {
            messages: messages.iter().map(|raw| span(body, raw, 0)).collect(),
            fields: top.fields,
            opening,
            known: 0,
            tools: top.tools.map(|raw| span(body, raw, 0)),
            opening_tools,
        }),
        Some(Messages::Other) | None => Err(BodyError::NoMessages),
    }
}

/// [`split_body`] of a body that may carry `known_tools`, the last request's tool block, as its
/// top-level `tools`: the block's bytes are then found and read around, not scanned
/// ([`Splice`]). Anything else is split whole, so errors name their place in the client's body.
pub fn split_body_known(body: &[u8], known_tools: Option<&[u8]>) -> Result<SplitBody, BodyError> {
    if let Some(splice) = Splice::find(body, known_tools, 0) {
        let mut spliced = Vec::new();
        splice.write_spliced(body, 0, &mut spliced);
        if let Ok(Ok(split)) = split_body(&spliced).map(|split| restored(split, &splice)) {
            return Ok(split);
        }
    }
    split_body(body)
}

/// The split of a spliced body as the split of the body, when the stand-in was the body's
/// top-level `tools` (the last one): a JSON value in place of another leaves the rest of the
/// body reading the same, so every span maps back (in place). Otherwise (the block's bytes lay
/// elsewhere, say inside a message) the split's vector of places, for its reuse.
fn restored(mut split: SplitBody, splice: &Splice) -> Result<SplitBody, Vec<Range<usize>>> {
    if split.tools != Some(splice.stand_in()) {
        return Err(split.messages);
    }
    for span in &mut split.messages {
        *span = splice.restore(span.clone());
    }
    split.tools = Some(splice.restore(splice.stand_in()));
    split.opening_tools = split.opening_tools.map(|span| splice.restore(span));
    Ok(split)
}

/// What the split of a body resumed after its known opening starts with: the parser's state just
/// after an object in `messages` (the placeholder `{}`), as it is after the last known message. An
/// object, not a number: after a number the parser would still take `.5` or `e5` as part of it.
const RESUMED_OPENING: &[u8] = b"{\"messages\":[{}";

/// [`split_body_known`] for a body whose opening is `known`: only the bytes after the known
/// messages are read (and a known tool block among them is read around). A deterministic parser
/// is in the same state after equal bytes, and when the last known message is an object (it ends
/// in `}`, checked here) that state is the placeholder's, so what follows is read exactly as a
/// split of the whole body would read it. Any other outcome (an error, `messages` again) is left
/// to a split of the whole body, so errors name their place in the client's body.
///
/// A resumed split writes the messages' places into `spare`, an emptied vector the caller keeps
/// from an earlier split (it is left empty, and a new vector is made when it has no room), so a
/// long history's places are not allocated and freed again on every request.
pub fn split_body_after(
    body: &[u8],
    known: &KnownOpening<'_>,
    known_tools: Option<&[u8]>,
    spare: &mut Vec<Range<usize>>,
) -> Result<SplitBody, BodyError> {
    let ends_an_object = known.end.checked_sub(1).and_then(|last| body.get(last)) == Some(&b'}');
    let Some(rest) = body.get(known.end..).filter(|_| !known.spans.is_empty() && ends_an_object) else {
        return split_body_known(body, known_tools);
    };
    let splice = Splice::find(rest, known_tools, known.end);
    // When the block's bytes lay elsewhere than at the top level, the rest is read through.
    resume(rest, known, splice.as_ref(), spare)
        .or_else(|| splice.and_then(|_| resume(rest, known, None, spare)))
        .map_or_else(|| split_body(body), Ok)
}

/// The split of the body whose bytes after `known` are `rest`, read with `splice` applied to
/// them; None when that reading differs from a split of the whole (see [`split_body_after`]).
fn resume(
    rest: &[u8],
    known: &KnownOpening<'_>,
    splice: Option<&Splice>,
    spare: &mut Vec<Range<usize>>,
) -> Option<SplitBody> {
    // Each write below reserves what it adds: the rest with the block, or without it.
    let mut resumed = RESUMED_OPENING.to_vec();
    match splice {
        Some(splice) => splice.write_spliced(rest, known.end, &mut resumed),
        None => resumed.extend_from_slice(rest),
    }
    let top = serde_json::from_slice::<TopLevel<'_>>(&resumed).ok()?;
    if top.messages_keys != 1 || !top.before_messages.is_empty() {
        return None;
    }
    let Some(Messages::Array(tail)) = top.messages else { return None };
    let mut messages = std::mem::take(spare);
    messages.clear();
    messages.reserve(known.spans.len() + tail.len().saturating_sub(1));
    messages.extend_from_slice(known.spans);
    // The first element is the placeholder; the others lie in `rest`, which starts at `end`.
    let shift = known.end.wrapping_sub(RESUMED_OPENING.len());
    messages.extend(tail.iter().skip(1).map(|raw| span(&resumed, raw, shift)));
    let mut fields = known.fields.clone();
    fields.extend(top.fields);
    // A `tools` after the messages wins over one in the opening, as a later key does.
    let tools = top.tools.map(|raw| span(&resumed, raw, shift)).or_else(|| known.tools.clone());
    let split = SplitBody {
        messages,
        fields,
        opening: Some(known.fields.clone()),
        known: known.spans.len(),
        tools,
        opening_tools: known.tools.clone(),
    };
    let Some(splice) = splice else { return Some(split) };
    match restored(split, splice) {
        Ok(split) => Some(split),
        Err(places) => {
            // The places vector goes back for the reading without the splice.
            *spare = places;
            None
        }
    }
}

/// Where `raw`, read from `input`, lies, moved by `shift` (the offset of `input` in the body).
fn span(input: &[u8], raw: &RawValue, shift: usize) -> Range<usize> {
    let text = raw.get().as_bytes();
    let start = (text.as_ptr() as usize).wrapping_sub(input.as_ptr() as usize).wrapping_add(shift);
    start..start.wrapping_add(text.len())
}

/// The top-level object (`messages` apart).
struct TopLevel<'a> {
    messages: Option<Messages<'a>>,
    fields: Map<String, Value>,
    /// How many times `messages` appeared, and the fields before its first appearance.
    messages_keys: usize,
    before_messages: Map<String, Value>,
    /// The value of `tools`, unparsed, and the one seen before `messages`.
    tools: Option<&'a RawValue>,
    tools_before_messages: Option<&'a RawValue>,
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
        let mut top = TopLevel {
            messages: None,
            fields: Map::new(),
            messages_keys: 0,
            before_messages: Map::new(),
            tools: None,
            tools_before_messages: None,
        };
        while let Some(key) = map.next_key::<String>()? {
            if key == "tools" {
                top.tools = Some(map.next_value()?);
            } else if key == "messages" {
                if top.messages_keys == 0 {
                    top.before_messages.clone_from(&top.fields);
                    top.tools_before_messages = top.tools;
                }
                top.messages_keys += 1;
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
        let raw: Vec<&[u8]> = split.messages.iter().map(|span| &body[span.clone()]).collect();
        assert_eq!(
            raw,
            [&br#"{"role":"user","content":"a\u00e9"}"#[..], br#"{"role":"assistant","content":"b"}"#]
        );
        assert_eq!(split.fields.get("model"), Some(&Value::from("m")));
        assert_eq!(split.fields.get("stream"), Some(&Value::from(true)));
        assert!(!split.fields.contains_key("messages"));
        let opening = split.opening.unwrap();
        assert_eq!(opening.keys().collect::<Vec<_>>(), ["model"], "the fields before `messages`");
        let twice = split_body(br#"{"messages":[],"model":"m","messages":[1]}"#).unwrap();
        assert!(twice.opening.is_none(), "a body with `messages` twice is never resumed");
    }

    /// Splits `later` after the messages it shares with `earlier`, as the memo does.
    fn split_after(earlier: &[u8], later: &[u8]) -> Result<SplitBody, BodyError> {
        split_after_known(earlier, later, None)
    }

    /// [`split_after`] with the last request's tool block known.
    fn split_after_known(
        earlier: &[u8],
        later: &[u8],
        known_tools: Option<&[u8]>,
    ) -> Result<SplitBody, BodyError> {
        let first = split_body(earlier).unwrap();
        let common = earlier.iter().zip(later).take_while(|(a, b)| a == b).count();
        let known = first.messages.partition_point(|span| span.end <= common);
        if known == 0 {
            return split_body_known(later, known_tools);
        }
        let fields = first.opening.unwrap();
        split_body_after(
            later,
            &KnownOpening {
                end: first.messages[known - 1].end,
                spans: &first.messages[..known],
                fields: &fields,
                tools: first.opening_tools.clone(),
            },
            known_tools,
            &mut Vec::new(),
        )
    }

    #[test]
    fn a_body_resumed_after_its_known_messages_splits_as_the_whole_body_does() {
        let earlier = br#"{"model":"m","messages":[{"a":1}, {"b":2}],"stream":true}"#;
        let cases: [&[u8]; 13] = [
            br#"{"model":"m","messages":[{"a":1}, {"b":2}.5]}"#,
            br#"{"model":"m","messages":[{"a":1}, {"b":2}e5]}"#,
            br#"{"model":"m","messages":[{"a":1}, {"b":2}E+1,{"c":3}]}"#,
            br#"{"model":"m","messages":[{"a":1}, {"b":2}.0e3]}"#,
            br#"{"model":"m","messages":[{"a":1}, {"b":2}, {"c":3}],"stream":false,"n":1}"#,
            br#"{"model":"m","messages":[{"a":1}, {"b":2}],"stream":true}"#,
            br#"{"model":"m","messages":[{"a":1}, {"b":2}  ] , "extra" : [1,2] }  "#,
            br#"{"model":"m","messages":[{"a":1}, {"b":2},{"c":3}],"model":"other"}"#,
            br#"{"model":"m","messages":[{"a":1}],"stream":true}"#,
            br#"{"model":"m","messages":[{"a":1}, {"b":2}],"messages":[{"z":0}]}"#,
            br#"{"model":"m","messages":[{"a":1}, {"b":2}, {"c":}]}"#,
            br#"{"model":"m","messages":[{"a":1}, {"b":2}],"tools":[{"n":1}]}"#,
            br#"{"model":"m","messages":[{"a":1}, {"b":2}, {"c":3}],"tools":[],"tools":null}"#,
        ];
        for later in cases {
            let whole = split_body(later);
            let resumed = split_after(earlier, later);
            match (whole, resumed) {
                (Ok(whole), Ok(resumed)) => {
                    let text = String::from_utf8_lossy(later);
                    assert_eq!(whole.messages, resumed.messages, "{text}");
                    assert_eq!(whole.fields, resumed.fields, "{text}");
                    assert_eq!(whole.tools, resumed.tools, "{text}");
                }
                (Err(whole), Err(resumed)) => assert_eq!(whole.to_string(), resumed.to_string()),
                (whole, resumed) => panic!("{whole:?} against {resumed:?}"),
            }
        }
    }

    /// A tool block long enough to be spliced, as a coding agent resends it.
    fn long_block() -> String {
        format!(
            r#"[{{"name":"read","description":"{}"}}]"#,
            "d".repeat(crate::session::tool_splice::SPLICED_FROM_BYTES)
        )
    }

    fn assert_same_split(
        whole: Result<SplitBody, BodyError>,
        other: Result<SplitBody, BodyError>,
        text: &str,
    ) {
        match (whole, other) {
            (Ok(whole), Ok(other)) => {
                assert_eq!(whole.messages, other.messages, "{text}");
                assert_eq!(whole.fields, other.fields, "{text}");
                assert_eq!(whole.opening, other.opening, "{text}");
                assert_eq!(whole.tools, other.tools, "{text}");
                assert_eq!(whole.opening_tools, other.opening_tools, "{text}");
            }
            (Err(whole), Err(other)) => assert_eq!(whole.to_string(), other.to_string(), "{text}"),
            (whole, other) => panic!("{text}: {whole:?} against {other:?}"),
        }
    }

    proptest::proptest! {
        /// Resuming after the shared opening splits any later body as splitting it whole does,
        /// and so does reading around the last request's tool block, resumed or whole.
        #[test]
        fn resuming_equals_splitting_whole(
            messages in proptest::collection::vec("[a-c]{0,2}", 1..6),
            long_tools in proptest::bool::ANY,
            edit in 0usize..80,
            insert in proptest::sample::select(vec!["", " ", ",", "]", "}", "\"x\"", "{", "[1]", ",\"messages\":[]", ",\"tools\":[2]", ",\"tools\":LONG", ",\"x\":LONG", ".5", "e5", "E+1", "0", "-"]),
            cut in 0usize..80,
        ) {
            let block = if long_tools { long_block() } else { r#"[{"n":1}]"#.to_owned() };
            let list: Vec<String> = messages.iter().map(|text| format!(r#"{{"c":"{text}"}}"#)).collect();
            let earlier = format!(r#"{{"model":"m","tools":{block},"messages":[{}],"stream":true}}"#, list.join(","));
            // The later body: the earlier one with something inserted and a tail cut off and regrown.
            let mut later = earlier.clone().into_bytes();
            let at = edit.min(later.len());
            later.splice(at..at, insert.replace("LONG", &long_block()).bytes());
            let keep = later.len().saturating_sub(cut % 8);
            later.truncate(keep);
            later.extend_from_slice(&earlier.as_bytes()[keep.min(earlier.len())..]);
            let text = String::from_utf8_lossy(&later).into_owned();
            assert_same_split(split_body(&later), split_after(earlier.as_bytes(), &later), &text);
            let known = Some(block.as_bytes());
            assert_same_split(split_body(&later), split_after_known(earlier.as_bytes(), &later, known), &text);
            assert_same_split(split_body(&later), split_body_known(&later, known), &text);
        }
    }

    #[test]
    fn a_known_tool_block_is_read_around_wherever_the_body_carries_it() {
        let block = long_block();
        let known = Some(block.as_bytes());
        let cases = [
            format!(r#"{{"model":"m","messages":[{{"a":1}}],"tools":{block}}}"#),
            format!(r#"{{"tools":{block},"model":"m","messages":[{{"a":1}}]}}"#),
            format!(r#"{{"tools":{block},"messages":[{{"a":1}}],"tools":{block}}}"#),
            format!(r#"{{"messages":[{{"a":{block}}}],"tools":{block}}}"#),
            format!(r#"{{"messages":[{{"a":{block}}}],"tools":[]}}"#),
            format!(r#"{{"messages":[{{"a":1}}],"tools":[{block}]}}"#),
            format!(r#"{{"messages":[{{"a":1}}],"tools":{block},"stream":}}"#),
            format!(r#"{{"messages":{block},"tools":{block}}}"#),
            r#"{"messages":[{"a":1}],"tools":[]}"#.to_owned(),
        ];
        for body in &cases {
            let text = body.replace(&block, "BLOCK");
            assert_same_split(split_body(body.as_bytes()), split_body_known(body.as_bytes(), known), &text);
            let earlier = format!(r#"{{"messages":[{{"a":1}}],"tools":{block}}}"#);
            assert_same_split(
                split_body(body.as_bytes()),
                split_after_known(earlier.as_bytes(), body.as_bytes(), known),
                &text,
            );
        }
        let first = split_body_known(cases[0].as_bytes(), known).unwrap();
        assert_eq!(&cases[0].as_bytes()[first.tools.unwrap()], block.as_bytes());
        // The block's bytes first inside a new message: still resumed after the known one.
        let earlier = format!(r#"{{"messages":[{{"a":1}}],"tools":{block}}}"#);
        let later = format!(r#"{{"messages":[{{"a":1}},{{"b":{block}}}],"tools":{block}}}"#);
        let resumed = split_after_known(earlier.as_bytes(), later.as_bytes(), known).unwrap();
        assert_eq!(resumed.known, 1, "resumed, not split whole");
        assert_eq!(resumed.messages, split_body(later.as_bytes()).unwrap().messages);
    }

    #[test]
    fn tools_are_left_unparsed_where_they_lie_and_the_last_one_counts() {
        let body = br#"{"tools":[{"name":"a"}],"messages":[{"x":1}],"tools":[{"name":"b"}]}"#;
        let split = split_body(body).unwrap();
        assert!(!split.fields.contains_key("tools"), "not parsed into the fields");
        assert_eq!(&body[split.tools.clone().unwrap()], br#"[{"name":"b"}]"#);
        assert_eq!(&body[split.opening_tools.clone().unwrap()], br#"[{"name":"a"}]"#);
        let later = br#"{"tools":[{"name":"a"}],"messages":[{"x":1},{"y":2}]}"#;
        let resumed = split_after(body, later).unwrap();
        assert_eq!(&later[resumed.tools.unwrap()], br#"[{"name":"a"}]"#, "the opening's, when none follows");
        assert!(split_body(br#"{"messages":[]}"#).unwrap().tools.is_none());
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

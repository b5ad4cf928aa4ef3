//! Tier-2 journal entries: system-assigned IDs, roles, content, retention classes and content hashes.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};

use crate::artifacts::ArtifactRef;

/// What an entry is; decides the textual prefix of its [`EntryId`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    /// A conversational message (`msg_N`).
    Message,
    /// An assistant turn that requests tool calls (`tool_call_N`).
    ToolCall,
    /// A tool result (`tool_res_N`).
    ToolResult,
    /// A compaction summary (`summary_N`).
    Summary,
}

impl EntryKind {
    /// The prefix used in the textual form of an ID of this kind.
    pub fn prefix(self) -> &'static str {
        match self {
            EntryKind::Message => "msg",
            EntryKind::ToolCall => "tool_call",
            EntryKind::ToolResult => "tool_res",
            EntryKind::Summary => "summary",
        }
    }

    fn from_prefix(prefix: &str) -> Option<Self> {
        match prefix {
            "msg" => Some(EntryKind::Message),
            "tool_call" => Some(EntryKind::ToolCall),
            "tool_res" => Some(EntryKind::ToolResult),
            "summary" => Some(EntryKind::Summary),
            _ => None,
        }
    }
}

/// A system-assigned entry ID such as `msg_12`. The number comes from one per-agent counter that is
/// never reused, so numbers are unique across kinds and generations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EntryId {
    kind: EntryKind,
    number: u64,
}

impl EntryId {
    /// Builds an ID from its kind and counter value.
    pub fn new(kind: EntryKind, number: u64) -> Self {
        Self { kind, number }
    }

    /// The kind encoded in the ID prefix.
    pub fn kind(&self) -> EntryKind {
        self.kind
    }

    /// The value of the per-agent counter this ID was allocated from.
    pub fn number(&self) -> u64 {
        self.number
    }

    /// Appends the ID's text, `msg_12`, to `out`. Every request renders and journals IDs, so the
    /// number is written by `itoa` rather than through the formatting machinery.
    pub fn push_to(&self, out: &mut String) {
        // Writing to a String cannot fail.
        let _ = self.write_to(out);
    }

    /// Writes the ID's text to `out`: its prefix, `_`, and the number by `itoa`.
    fn write_to(&self, out: &mut impl fmt::Write) -> fmt::Result {
        let mut digits = itoa::Buffer::new();
        out.write_str(self.kind.prefix())?;
        out.write_str("_")?;
        out.write_str(digits.format(self.number))
    }
}

/// IDs order by their counter value: the order in which they were allocated.
impl Ord for EntryId {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.number, self.kind).cmp(&(other.number, other.kind))
    }
}

impl PartialOrd for EntryId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for EntryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_to(f)
    }
}

/// Why a string is not a valid [`EntryId`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid entry id {input:?}: {reason}")]
pub struct EntryIdParseError {
    /// The rejected input.
    pub input: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl FromStr for EntryId {
    type Err = EntryIdParseError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let fail = |reason| EntryIdParseError { input: input.to_owned(), reason };
        let (prefix, digits) = input.rsplit_once('_').ok_or_else(|| fail("missing '_'"))?;
        let kind = EntryKind::from_prefix(prefix).ok_or_else(|| fail("unknown prefix"))?;
        let canonical_digits = !digits.is_empty()
            && digits.bytes().all(|b| b.is_ascii_digit())
            && (digits == "0" || !digits.starts_with('0'));
        if !canonical_digits {
            return Err(fail("number must be canonical decimal digits"));
        }
        let number = digits.parse().map_err(|_| fail("number out of range"))?;
        Ok(Self { kind, number })
    }
}

impl Serialize for EntryId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut text = String::with_capacity(32);
        self.push_to(&mut text);
        serializer.serialize_str(&text)
    }
}

impl<'de> Deserialize<'de> for EntryId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Who produced an entry: the message role, as the providers name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// System instructions.
    System,
    /// The user or the agent's driver.
    User,
    /// The model.
    Assistant,
    /// A tool.
    Tool,
}

impl Role {
    fn tag(self) -> u8 {
        match self {
            Role::System => 0,
            Role::User => 1,
            Role::Assistant => 2,
            Role::Tool => 3,
        }
    }
}

/// How compaction may treat an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RetentionClass {
    /// Must be kept verbatim.
    Critical,
    /// Current working context; summarised when old.
    Working,
    /// Reference material; may be moved to artifacts.
    Reference,
    /// May be dropped.
    Ephemeral,
}

/// One structured tool call requested by the assistant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Provider call ID, echoed by the matching result.
    pub call_id: String,
    /// Tool name.
    pub name: String,
    /// Arguments as a JSON text, stored verbatim.
    pub arguments_json: String,
}

/// The result of one tool call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolResult {
    /// The call this result answers.
    pub call_id: String,
    /// Tool name, when the provider reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Tool output text.
    pub output: String,
}

/// The content of an entry: text plus any (possibly parallel) tool calls and tool results.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Content {
    /// Free text.
    #[serde(default)]
    pub text: String,
    /// Tool calls, in request order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// Tool results, in delivery order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_results: Vec<ToolResult>,
}

impl Content {
    /// Plain text content.
    pub fn text(text: impl Into<String>) -> Self {
        Self { text: text.into(), ..Self::default() }
    }
}

/// A journal entry as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// System-assigned ID.
    pub id: EntryId,
    /// Producer.
    pub role: Role,
    /// Text and structured tool traffic.
    pub content: Content,
    /// Retention class.
    pub retention: RetentionClass,
    /// Creation time in unix milliseconds, supplied by the caller.
    pub created_at_ms: u64,
    /// Token count supplied by the caller at append time.
    pub tokens: u64,
    /// [`content_hash`] of role and content.
    pub content_hash: String,
    /// Artifacts this entry refers to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub artifact_refs: Vec<ArtifactRef>,
}

impl Entry {
    /// Whether `content_hash` matches the role and content.
    pub fn hash_is_valid(&self) -> bool {
        self.content_hash == content_hash(self.role, &self.content)
    }
}

/// An entry before the journal assigns its ID and hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryDraft {
    /// Kind, which decides the ID prefix.
    pub kind: EntryKind,
    /// Producer.
    pub role: Role,
    /// Text and structured tool traffic.
    pub content: Content,
    /// Retention class.
    pub retention: RetentionClass,
    /// Creation time in unix milliseconds.
    pub created_at_ms: u64,
    /// Token count computed by the caller.
    pub tokens: u64,
    /// Artifacts this entry refers to.
    #[serde(default)]
    pub artifact_refs: Vec<ArtifactRef>,
}

impl EntryDraft {
    /// Turns the draft into an entry with the given counter value, computing the content hash.
    pub fn into_entry(self, number: u64) -> Entry {
        let content_hash = content_hash(self.role, &self.content);
        Entry {
            id: EntryId::new(self.kind, number),
            role: self.role,
            content: self.content,
            retention: self.retention,
            created_at_ms: self.created_at_ms,
            tokens: self.tokens,
            content_hash,
            artifact_refs: self.artifact_refs,
        }
    }
}

/// Feeds the canonical bytes of role and content that [`content_hash`] covers to `sink` piece by
/// piece, so the hash reads the content in place.
fn feed_canonical_content(role: Role, content: &Content, sink: &mut impl FnMut(&[u8])) {
    fn field(sink: &mut impl FnMut(&[u8]), text: &str) {
        sink(&(text.len() as u64).to_le_bytes());
        sink(text.as_bytes());
    }
    sink(&[role.tag()]);
    field(sink, &content.text);
    sink(&(content.tool_calls.len() as u64).to_le_bytes());
    for call in &content.tool_calls {
        field(sink, &call.call_id);
        field(sink, &call.name);
        field(sink, &call.arguments_json);
    }
    sink(&(content.tool_results.len() as u64).to_le_bytes());
    for result in &content.tool_results {
        match &result.name {
            Some(name) => {
                sink(&[1]);
                field(sink, name);
            }
            None => sink(&[0]),
        }
        field(sink, &result.call_id);
        field(sink, &result.output);
    }
}

/// Lower-case hex SHA-256 of the canonical serialization of role and content.
///
/// Layout: one role tag byte (system 0, user 1, assistant 2, tool 3), then length-prefixed fields
/// (u64 LE byte length, then UTF-8 bytes): text; tool-call count (u64 LE) and per call `call_id`,
/// `name`, `arguments_json`; tool-result count (u64 LE) and per result a presence byte for `name`
/// (0 or 1, followed by the name when 1), `call_id`, `output`.
pub fn content_hash(role: Role, content: &Content) -> String {
    let mut hasher = Sha256::new();
    feed_canonical_content(role, content, &mut |bytes| hasher.update(bytes));
    crate::hex_text::lower_hex(&hasher.finalize())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The canonical bytes whole, for comparing the streamed hash with a hash of the buffer.
    fn canonical_content_bytes(role: Role, content: &Content) -> Vec<u8> {
        let mut out = Vec::with_capacity(content.text.len() + 64);
        feed_canonical_content(role, content, &mut |bytes| out.extend_from_slice(bytes));
        out
    }

    #[test]
    fn content_hash_is_the_hex_sha256_of_the_canonical_bytes() {
        let call = ToolCall {
            call_id: "call_1".into(),
            name: "read_output".into(),
            arguments_json: r#"{"id":"msg_3"}"#.into(),
        };
        let named =
            ToolResult { call_id: "call_1".into(), name: Some("read_output".into()), output: "ok".into() };
        let unnamed = ToolResult { call_id: "call_2".into(), name: None, output: "é\n".into() };
        let contents = [
            Content::text(""),
            Content::text("hello"),
            Content { text: "t".into(), tool_calls: vec![call.clone(), call], tool_results: vec![] },
            Content { text: String::new(), tool_calls: vec![], tool_results: vec![named, unnamed] },
        ];
        for role in [Role::System, Role::User, Role::Assistant, Role::Tool] {
            for content in &contents {
                let expected = hex::encode(Sha256::digest(canonical_content_bytes(role, content)));
                assert_eq!(content_hash(role, content), expected, "{role:?} {content:?}");
            }
        }
        // A hash written to journals before this change, which must still verify.
        assert_eq!(
            content_hash(Role::User, &Content::text("hello")),
            hex::encode(Sha256::digest(b"\x01\x05\0\0\0\0\0\0\0hello\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0"))
        );
    }

    #[test]
    fn entry_id_round_trips_through_text_and_json() {
        for id in [
            EntryId::new(EntryKind::Message, 0),
            EntryId::new(EntryKind::ToolCall, 17),
            EntryId::new(EntryKind::ToolResult, 18),
            EntryId::new(EntryKind::Summary, u64::MAX),
        ] {
            let text = id.to_string();
            assert_eq!(text.parse::<EntryId>().unwrap(), id);
            let json = serde_json::to_string(&id).unwrap();
            assert_eq!(json, format!("\"{text}\""));
            assert_eq!(serde_json::from_str::<EntryId>(&json).unwrap(), id);
        }
        assert_eq!(EntryId::new(EntryKind::ToolCall, 3).to_string(), "tool_call_3");
    }

    #[test]
    fn entry_id_rejects_malformed_text() {
        for bad in [
            "",
            "msg",
            "msg_",
            "msg_01",
            "msg_+1",
            "msg_-1",
            "foo_1",
            "msg_1a",
            "tool_1",
            "msg_99999999999999999999",
        ] {
            assert!(bad.parse::<EntryId>().is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn content_hash_distinguishes_role_and_field_boundaries() {
        let a = content_hash(Role::User, &Content::text("ab"));
        assert_eq!(a.len(), 64);
        assert_ne!(a, content_hash(Role::Assistant, &Content::text("ab")));
        let split = |x: &str, y: &str| Content {
            text: String::new(),
            tool_calls: vec![ToolCall { call_id: x.into(), name: y.into(), arguments_json: "{}".into() }],
            tool_results: vec![],
        };
        assert_ne!(
            content_hash(Role::Assistant, &split("a", "bc")),
            content_hash(Role::Assistant, &split("ab", "c"))
        );
        let draft = EntryDraft {
            kind: EntryKind::Message,
            role: Role::User,
            content: Content::text("ab"),
            retention: RetentionClass::Working,
            created_at_ms: 5,
            tokens: 2,
            artifact_refs: vec![],
        };
        let entry = draft.into_entry(9);
        assert_eq!(entry.content_hash, a);
        assert!(entry.hash_is_valid());
        assert_eq!(entry.id.to_string(), "msg_9");
    }
}

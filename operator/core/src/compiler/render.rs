//! Rendering one journal entry for the window: the visible ID tag, and the entry's treatment.

use crate::entry::{Entry, EntryId};
use crate::tokens::{DigitShapeCounts, TokenCounter};

use super::{InclusionReason, RenderedEntry, Treatment};

/// Tokens reserved for the Tier-3 telemetry line (`Status: Context: 112,000 / 128,000 (87%) | Level: Warning`).
pub(super) const TELEMETRY_TOKENS: u64 = 32;

/// The visible ID tag that starts every Tier-2 entry, e.g. `[msg_104]`.
pub fn id_tag(id: EntryId) -> String {
    let mut tag = String::with_capacity(32);
    push_id_tag(id, &mut tag);
    tag
}

/// Appends the visible ID tag of `id`, `[msg_104]`, to `out`.
pub fn push_id_tag(id: EntryId, out: &mut String) {
    out.push('[');
    id.push_to(out);
    out.push(']');
}

/// The text of `entry` as journaled, with its visible ID tag: `[msg_104] Find the auth errors.`.
pub fn journaled_text(entry: &Entry) -> String {
    let mut text = String::new();
    write_journaled_text(entry, &mut text);
    text
}

/// Appends [`journaled_text`] of `entry` to `out`.
pub fn write_journaled_text(entry: &Entry, out: &mut String) {
    let body_len = journal_body_len(entry);
    out.reserve(ID_TAG_ROOM + body_len);
    push_id_tag(entry.id, out);
    if body_len > 0 {
        append_journal_body(out, entry);
    }
}

/// Room for any visible ID tag: the brackets, the longest kind's prefix and `_`, and a `u64`'s 20
/// digits. Reserved with the body, so writing an entry's text grows its buffer once, not per part.
const ID_TAG_ROOM: usize = 40;

/// The bytes [`append_journal_body`] appends for `entry`.
fn journal_body_len(entry: &Entry) -> usize {
    let content = &entry.content;
    let results = &content.tool_results;
    if content.text.is_empty() && results.iter().all(|result| result.output.is_empty()) {
        return 0;
    }
    1 + content.text.len() + results.iter().map(|result| 1 + result.output.len()).sum::<usize>()
}

/// Render `entry` under an optional treatment. An untreated entry keeps no copy of its text
/// ([`RenderedEntry::replaced_text`] is `None`), and no entry a copy of its tool calls: both are
/// read from the journal entry when the entry is rendered for a provider ([`super::Packet::text`],
/// [`super::Packet::tool_calls`]).
/// `tag_counts` counts the ID tag by its shape.
pub fn render_entry(
    entry: &Entry,
    treatment: Option<&Treatment>,
    counter: &TokenCounter,
    tag_counts: &mut DigitShapeCounts,
) -> RenderedEntry {
    let tag = id_tag(entry.id);
    let tag_tokens = u64::from(tag_counts.count(counter, &tag)) + 1;
    let (replaced_text, tokens, reason, included) = match treatment {
        None => (None, entry.tokens + tag_tokens, InclusionReason::Journal, true),
        Some(Treatment::Replace { text: replacement, reason }) => {
            let tokens = u64::from(counter.count(replacement)) + tag_tokens;
            // The tag, then a space and the replacement when there is one, in a string of its size.
            let mut text = tag;
            if !replacement.is_empty() {
                text.reserve_exact(1 + replacement.len());
                text.push(' ');
                text.push_str(replacement);
            }
            (Some(text), tokens, *reason, true)
        }
        Some(Treatment::Omit) => (Some(tag), 0, InclusionReason::Expired, false),
    };
    RenderedEntry {
        id: entry.id,
        role: entry.role,
        replaced_text,
        tokens,
        reason,
        included,
        retention: entry.retention,
    }
}

/// Appends a space and the entry's own text to `text` (an entry that has some: its
/// [`journal_body_len`] is not 0): its message text, then each tool result's output in completion
/// order, one per line.
fn append_journal_body(text: &mut String, entry: &Entry) {
    let content = &entry.content;
    let results = &content.tool_results;
    text.push(' ');
    text.push_str(&content.text);
    let mut started = !content.text.is_empty();
    for result in results {
        if started {
            text.push('\n');
        }
        text.push_str(&result.output);
        started |= !result.output.is_empty();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::entry::{Content, EntryDraft, EntryKind, RetentionClass, Role, ToolResult};

    fn entry(text: &str, outputs: &[&str]) -> Entry {
        let tool_results = outputs
            .iter()
            .enumerate()
            .map(|(index, output)| ToolResult {
                call_id: format!("c{index}"),
                name: None,
                output: (*output).into(),
            })
            .collect();
        EntryDraft {
            kind: EntryKind::Message,
            role: Role::Tool,
            tokens: 3,
            content: Content { text: text.into(), tool_calls: vec![], tool_results },
            retention: RetentionClass::Working,
            created_at_ms: 1,
            artifact_refs: vec![],
        }
        .into_entry(7)
    }

    /// The text as it was built before it was written in one pass: the body joined, then the tag
    /// and the body formatted together.
    fn joined_then_formatted(entry: &Entry) -> String {
        let mut body = entry.content.text.clone();
        for result in &entry.content.tool_results {
            if !body.is_empty() {
                body.push('\n');
            }
            body.push_str(&result.output);
        }
        let tag = id_tag(entry.id);
        if body.is_empty() { tag } else { format!("{tag} {body}") }
    }

    #[test]
    fn the_text_written_in_one_pass_equals_the_body_joined_and_formatted() {
        let counter = TokenCounter::new(crate::tokens::TokenizerKind::O200kBase).unwrap();
        let cases: [(&str, &[&str]); 7] = [
            ("", &[]),
            ("hello", &[]),
            ("", &["out"]),
            ("", &["", ""]),
            ("", &["", "second"]),
            ("text", &["", "b", ""]),
            ("text", &["a", "b"]),
        ];
        for (text, outputs) in cases {
            let entry = entry(text, outputs);
            let rendered = render_entry(&entry, None, &counter, &mut DigitShapeCounts::default());
            assert_eq!(rendered.replaced_text, None);
            assert_eq!(journaled_text(&entry), joined_then_formatted(&entry), "{text:?} {outputs:?}");
            let mut written = String::from("before ");
            write_journaled_text(&entry, &mut written);
            assert_eq!(written, format!("before {}", joined_then_formatted(&entry)));
        }
        let entry = entry("text", &["a"]);
        let replace = |text: &str| Treatment::Replace { text: text.into(), reason: InclusionReason::Elided };
        let tag = id_tag(entry.id);
        assert_eq!(
            render_entry(&entry, Some(&replace("short")), &counter, &mut DigitShapeCounts::default())
                .replaced_text,
            Some(format!("{tag} short"))
        );
        assert_eq!(
            render_entry(&entry, Some(&replace("")), &counter, &mut DigitShapeCounts::default())
                .replaced_text,
            Some(tag.clone())
        );
        assert_eq!(
            render_entry(&entry, Some(&Treatment::Omit), &counter, &mut DigitShapeCounts::default())
                .replaced_text,
            Some(tag)
        );
    }
}

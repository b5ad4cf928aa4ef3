//! Rendering one journal entry for the window: the visible ID tag, and the entry's treatment.

use crate::entry::{Entry, EntryId, Role};
use crate::tokens::TokenCounter;

use super::{InclusionReason, RenderedEntry, Treatment};

/// Tokens reserved for the Tier-3 telemetry line (`Status: Context: 112,000 / 128,000 (87%) | Level: Warning`).
pub(super) const TELEMETRY_TOKENS: u64 = 32;

/// The visible ID tag that starts every Tier-2 entry, e.g. `[msg_104]`.
pub fn id_tag(id: EntryId) -> String {
    format!("[{id}]")
}

/// Render `entry` under an optional treatment.
pub fn render_entry(entry: &Entry, treatment: Option<&Treatment>, counter: &TokenCounter) -> RenderedEntry {
    let tag = id_tag(entry.id);
    let tag_tokens = u64::from(counter.count(&tag)) + 1;
    let answers_calls: Vec<String> = entry.content.tool_results.iter().map(|r| r.call_id.clone()).collect();
    let (body, tokens, reason, included) = match treatment {
        None => (journal_body(entry), entry.tokens + tag_tokens, InclusionReason::Journal, true),
        Some(Treatment::Replace { text, reason }) => {
            (text.clone(), u64::from(counter.count(text)) + tag_tokens, *reason, true)
        }
        Some(Treatment::Omit) => (String::new(), 0, InclusionReason::Expired, false),
    };
    let text = if body.is_empty() { tag } else { format!("{tag} {body}") };
    RenderedEntry {
        id: entry.id,
        role: entry.role,
        text,
        tool_calls: if included && entry.role == Role::Assistant {
            entry.content.tool_calls.clone()
        } else {
            Vec::new()
        },
        answers_calls,
        tokens,
        source_hash: entry.content_hash.clone(),
        reason,
        included,
        retention: entry.retention,
    }
}

/// The entry's own text: its message text, then each tool result's output in completion order.
fn journal_body(entry: &Entry) -> String {
    let mut body = entry.content.text.clone();
    for result in &entry.content.tool_results {
        if !body.is_empty() {
            body.push('\n');
        }
        body.push_str(&result.output);
    }
    body
}

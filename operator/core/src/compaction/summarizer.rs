//! The summariser seam: what a summariser receives (a bounded delta since the previous state), the
//! trait every summariser implements, and delta rendering and chunking for model prompts.

use std::future::Future;
use std::pin::Pin;

use crate::entry::{Entry, EntryId};

use super::findings::Findings;
use super::state::CompactedState;

/// What a summariser works from: the previous CompactedState and the entries since it (§17.15.4
/// delta summarisation), never the whole history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SummaryInput {
    /// The state of the previous compaction (the latest `summary_N` entry), if any.
    pub previous: Option<CompactedState>,
    /// Entries after the previous state, in journal order, without Ephemeral ones.
    pub delta: Vec<Entry>,
    /// Entries the new generation keeps verbatim (Critical, recent, unanswered tool calls).
    pub retained: Vec<EntryId>,
    /// What the deterministic pass found; the preservation check requires these.
    pub findings: Findings,
    /// How the agent should resume (given by the caller or generated).
    pub resume_instruction: String,
    /// Privacy scope of the material.
    pub privacy_scope: String,
}

/// Why a summariser produced no state.
#[derive(Debug, thiserror::Error)]
pub enum SummarizeError {
    /// The summariser's service could not be reached or answered with an error.
    #[error("summariser request failed: {0}")]
    Unavailable(String),
    /// The summariser did not answer in time.
    #[error("summariser timed out after {seconds} s")]
    Timeout {
        /// The limit.
        seconds: u64,
    },
    /// The output was not a valid CompactedState, even after the repair retry.
    #[error("summariser output is not a valid CompactedState after one repair attempt: {0}")]
    InvalidOutput(String),
}

/// A summariser's pending answer.
pub type SummaryFuture<'a> =
    Pin<Box<dyn Future<Output = Result<CompactedState, SummarizeError>> + Send + 'a>>;

/// Produces a CompactedState from a [`SummaryInput`].
pub trait Summarizer: Send + Sync {
    /// The model or service version recorded in the compaction record, e.g. `extractive/1`.
    fn version(&self) -> String;

    /// Summarises `input`.
    fn summarize<'a>(&'a self, input: &'a SummaryInput) -> SummaryFuture<'a>;
}

/// Renders one entry for a model prompt: `[msg_12] user: …` plus tool calls and results, with the
/// text shortened to at most `max_chars` (head and tail kept, the cut marked with the entry ID).
pub fn render_entry_for_prompt(entry: &Entry, max_chars: usize) -> String {
    let role = match entry.role {
        crate::entry::Role::System => "system",
        crate::entry::Role::User => "user",
        crate::entry::Role::Assistant => "assistant",
        crate::entry::Role::Tool => "tool",
    };
    let mut body = entry.content.text.clone();
    for call in &entry.content.tool_calls {
        body.push_str(&format!(
            "\n<tool_call id={} name={}>{}</tool_call>",
            call.call_id, call.name, call.arguments_json
        ));
    }
    for result in &entry.content.tool_results {
        body.push_str(&format!("\n<tool_result id={}>{}</tool_result>", result.call_id, result.output));
    }
    for reference in &entry.artifact_refs {
        body.push_str(&format!("\n<artifact ref={reference}/>"));
    }
    format!("[{}] {role} ({:?}): {}", entry.id, entry.retention, shorten(&body, max_chars, entry.id))
}

fn shorten(text: &str, max_chars: usize, id: EntryId) -> String {
    let count = text.chars().count();
    if count <= max_chars {
        return text.to_owned();
    }
    let marker = |omitted: usize| {
        format!("\n… [{omitted} characters of {id} omitted; the raw entry stays in the archive] …\n")
    };
    let keep = max_chars.saturating_sub(marker(count).chars().count()) / 2;
    let head: String = text.chars().take(keep).collect();
    let tail: String = text.chars().skip(count - keep).collect();
    format!("{head}{}{tail}", marker(count - 2 * keep))
}

/// Splits the rendered delta into chunks of at most `max_chars` characters each (an entry is
/// never split: each is first shortened to fit), so an oversized delta is summarised chunk by
/// chunk, folding each chunk into the state of the previous one.
pub fn chunk_delta(delta: &[Entry], max_chars: usize) -> Vec<String> {
    let per_entry = max_chars.saturating_sub(64).max(256);
    let mut chunks = Vec::new();
    let mut current = String::new();
    for entry in delta {
        let rendered = render_entry_for_prompt(entry, per_entry);
        let len = rendered.chars().count();
        if !current.is_empty() && current.chars().count() + len + 1 > max_chars {
            chunks.push(std::mem::take(&mut current));
        }
        if !current.is_empty() {
            current.push('\n');
        }
        current.push_str(&rendered);
    }
    if !current.is_empty() || chunks.is_empty() {
        chunks.push(current);
    }
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::{Content, EntryDraft, EntryKind, RetentionClass, Role};

    fn entry(number: u64, text: &str) -> Entry {
        EntryDraft {
            kind: EntryKind::Message,
            role: Role::User,
            content: Content::text(text),
            retention: RetentionClass::Working,
            created_at_ms: 0,
            tokens: 1,
            artifact_refs: vec![],
        }
        .into_entry(number)
    }

    #[test]
    fn chunks_respect_the_bound_and_keep_every_entry() {
        let delta: Vec<Entry> = (1..=40).map(|n| entry(n, &"word ".repeat(50))).collect();
        let chunks = chunk_delta(&delta, 1000);
        assert!(chunks.len() > 1);
        assert!(chunks.iter().all(|c| c.chars().count() <= 1000));
        for n in 1..=40 {
            assert_eq!(chunks.iter().filter(|c| c.contains(&format!("[msg_{n}]"))).count(), 1);
        }
        let huge = vec![entry(7, &"x".repeat(10_000))];
        let single = chunk_delta(&huge, 1000);
        assert_eq!(single.len(), 1);
        assert!(single[0].chars().count() <= 1000);
        assert!(single[0].contains("characters of msg_7 omitted"));
    }
}

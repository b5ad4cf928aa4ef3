//! Per-entry cache of rendered provider JSON, so a request re-serialises only new or changed entries.

use crate::compiler::{InclusionReason, RenderedEntry};
use crate::entry::EntryId;
use bytes::Bytes;

/// One entry rendered as provider JSON.
#[derive(Debug, Clone)]
pub struct Fragment {
    id: EntryId,
    reason: InclusionReason,
    source_hash: String,
    /// Whether the JSON can no longer change (every tool call it carries has its result).
    complete: bool,
    /// Whether the entry belongs to the assistant side of the conversation.
    pub assistant: bool,
    /// The JSON text (one message for OpenAI, comma-separated content blocks for Anthropic).
    pub json: Bytes,
}

/// A freshly rendered fragment: its JSON, whether it is final, and its side.
#[derive(Debug)]
pub struct Rendered {
    /// JSON text.
    pub json: Vec<u8>,
    /// Whether it can no longer change.
    pub complete: bool,
    /// Assistant side.
    pub assistant: bool,
}

impl Fragment {
    /// Whether the JSON can no longer change.
    pub fn is_complete(&self) -> bool {
        self.complete
    }
}

/// Fragments by position in the compiler's Tier 2, checked against the entry they were made from.
#[derive(Debug, Default)]
pub struct FragmentCache {
    items: Vec<Option<Fragment>>,
}

impl FragmentCache {
    /// Whether the list of fragments is close to reallocating (see [`crate::room_ahead`]).
    pub fn room_low(&self) -> bool {
        crate::room_ahead::is_low(&self.items)
    }

    /// Grows the list of fragments ahead of need when its room is low; returns whether it grew.
    pub fn make_room(&mut self) -> bool {
        crate::room_ahead::make(&mut self.items)
    }

    /// The fragment of `entry` at `index`, whose journaled content hashes to `source_hash`,
    /// rendered with `render` when missing, stale or incomplete.
    pub fn get(
        &mut self,
        index: usize,
        entry: &RenderedEntry,
        source_hash: &str,
        render: impl FnOnce(&RenderedEntry) -> Rendered,
    ) -> &Fragment {
        if self.items.len() <= index {
            self.items.resize(index + 1, None);
        }
        let slot = &mut self.items[index];
        let fresh = slot.as_ref().is_some_and(|fragment| {
            fragment.complete
                && fragment.id == entry.id
                && fragment.reason == entry.reason
                && fragment.source_hash == source_hash
        });
        if !fresh {
            *slot = None;
        }
        slot.get_or_insert_with(|| {
            let rendered = render(entry);
            Fragment {
                id: entry.id,
                reason: entry.reason,
                source_hash: source_hash.to_owned(),
                complete: rendered.complete,
                assistant: rendered.assistant,
                json: Bytes::from(rendered.json),
            }
        })
    }

    /// Drops the fragment at `index` (it was copied into the assembly, which holds the bytes from
    /// now on; should the assembly start over, the entry is rendered again).
    pub fn release(&mut self, index: usize) {
        if let Some(slot) = self.items.get_mut(index) {
            *slot = None;
        }
    }

    /// Drops fragments beyond `len` entries (after a generation switch shrank Tier 2).
    pub fn truncate(&mut self, len: usize) {
        self.items.truncate(len);
    }
}

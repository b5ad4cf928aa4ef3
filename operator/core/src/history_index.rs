//! Positions of the journal's entries that pass a test, kept up to date as the journal grows, so
//! that planning on every answer (expiry, elision) looks at those entries and not at the whole
//! history.

use std::collections::HashSet;

use crate::entry::{Entry, EntryId, Role};

/// One indexed entry: its position in the history, and how many Assistant entries there are up to
/// and including it (its age in rounds is [`EntryIndex::rounds_after`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Indexed {
    /// Position in the journal's entries.
    pub position: usize,
    /// Assistant entries in `entries[..=position]`.
    pub assistants_through: u64,
}

/// The entries of one journal generation that passed a test, ascending. Entries are appended and
/// never change, so each is tested once; a generation switch, or a history that no longer ends
/// where the index stopped, starts it over. The caller resets it when its test changes.
#[derive(Debug, Default)]
pub struct EntryIndex {
    generation: u64,
    indexed: usize,
    last_indexed: Option<EntryId>,
    assistants: u64,
    matches: Vec<Indexed>,
}

impl EntryIndex {
    /// Brings the index up to date with `entries` of journal generation `generation`, testing new
    /// entries with `test`, and drops the entries in `gone` (already treated).
    pub fn refresh(
        &mut self,
        generation: u64,
        entries: &[Entry],
        test: impl Fn(&Entry) -> bool,
        gone: &HashSet<EntryId>,
    ) {
        let still_valid = self.generation == generation
            && self.indexed <= entries.len()
            && self.indexed.checked_sub(1).map(|last| entries[last].id) == self.last_indexed;
        if !still_valid {
            *self = EntryIndex { generation, ..EntryIndex::default() };
        }
        for (position, entry) in entries.iter().enumerate().skip(self.indexed) {
            if entry.role == Role::Assistant {
                self.assistants += 1;
            }
            if test(entry) {
                self.matches.push(Indexed { position, assistants_through: self.assistants });
            }
        }
        self.indexed = entries.len();
        self.last_indexed = entries.last().map(|entry| entry.id);
        if !gone.is_empty() {
            self.matches.retain(|indexed| !gone.contains(&entries[indexed.position].id));
        }
    }

    /// The entries that passed the test and are not gone, ascending.
    pub fn matches(&self) -> &[Indexed] {
        &self.matches
    }

    /// Assistant entries in the indexed history.
    pub fn assistants(&self) -> u64 {
        self.assistants
    }

    /// The rounds since `indexed`: the Assistant entries after it in the indexed history.
    pub fn rounds_after(&self, indexed: &Indexed) -> usize {
        usize::try_from(self.assistants - indexed.assistants_through).unwrap_or(usize::MAX)
    }

    /// Forgets everything (the test changed).
    pub fn reset(&mut self) {
        *self = EntryIndex::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::{Content, EntryDraft, EntryKind, RetentionClass};

    fn entry(number: u64, role: Role, class: RetentionClass) -> Entry {
        EntryDraft {
            kind: EntryKind::Message,
            role,
            content: Content::text(format!("entry {number}")),
            retention: class,
            created_at_ms: number,
            tokens: 1,
            artifact_refs: vec![],
        }
        .into_entry(number)
    }

    fn refreshed(
        index: &mut EntryIndex,
        generation: u64,
        entries: &[Entry],
        test: impl Fn(&Entry) -> bool,
        gone: &HashSet<EntryId>,
    ) -> Vec<usize> {
        index.refresh(generation, entries, test, gone);
        index.matches().iter().map(|indexed| indexed.position).collect()
    }

    #[test]
    fn the_index_follows_appends_treatments_and_generation_switches() {
        let ephemeral = |entry: &Entry| entry.retention == RetentionClass::Ephemeral;
        let mut entries = vec![
            entry(0, Role::User, RetentionClass::Ephemeral),
            entry(1, Role::Assistant, RetentionClass::Working),
            entry(2, Role::Tool, RetentionClass::Ephemeral),
        ];
        let mut index = EntryIndex::default();
        let none = HashSet::new();
        index.refresh(1, &entries, ephemeral, &none);
        assert_eq!(
            index.matches(),
            [Indexed { position: 0, assistants_through: 0 }, Indexed { position: 2, assistants_through: 1 }]
        );
        entries.push(entry(3, Role::Assistant, RetentionClass::Ephemeral));
        entries.push(entry(4, Role::User, RetentionClass::Critical));
        assert_eq!(refreshed(&mut index, 1, &entries, ephemeral, &none), [0, 2, 3], "appends are indexed");
        assert_eq!(index.assistants(), 2);
        let treated: HashSet<EntryId> = [entries[2].id].into();
        assert_eq!(refreshed(&mut index, 1, &entries, ephemeral, &treated), [0, 3], "treated entries leave");
        // Another generation with other entries at the same positions is indexed afresh.
        let compacted = vec![
            entry(7, Role::User, RetentionClass::Working),
            entry(8, Role::Tool, RetentionClass::Ephemeral),
        ];
        assert_eq!(refreshed(&mut index, 2, &compacted, ephemeral, &none), [1]);
        assert_eq!(index.assistants(), 0);
        // So is a history that no longer ends where the index stopped, even in the same generation.
        assert_eq!(refreshed(&mut index, 2, &entries, ephemeral, &none), [0, 2, 3]);
        index.reset();
        assert_eq!(refreshed(&mut index, 2, &entries, |_| true, &none), [0, 1, 2, 3, 4]);
    }
}

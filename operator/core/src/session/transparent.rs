//! Transparent sessions: recognising already-journaled client messages by a chained content hash.
//!
//! The client resends its whole message list every call. Each message's hash is chained with the
//! hash of everything before it (`h_i = sha256(h_{i-1} ‖ content_hash_i)`), so a message repeated
//! later in the conversation is still new. Every chain value the gateway has journaled (client
//! messages and the assistant answers it returned) is remembered in a file under the data dir, so
//! after a restart the same list is still recognised, with the journal entry that holds the turn.
//!
//! [`TransparentIndex::locate`] decides how a request relates to the journal: it extends it (the
//! last known turn is the journal's last entry), or it diverged (an edited or retried turn, a new
//! conversation, a client-side compaction) and the journal must be rewound to the last turn both
//! still share before the client's newer turns are journaled.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::entry::{Entry, EntryId, EntryKind, Role, content_hash};
use crate::journal::Storage;
use crate::session::line_file::{LineFile, LineFileSync, read_lines};
use crate::session::tool_schema::is_memory_tool;
use sha2::{Digest, Sha256};

use crate::session::turn::Turn;

/// A chain value.
pub type ChainHash = [u8; 32];

/// The transparent-session index could not be read or written.
#[derive(Debug, thiserror::Error)]
#[error("transparent-session index {path}: {cause}")]
pub struct IndexError {
    path: PathBuf,
    cause: std::io::Error,
}

/// Known chain values, each with the journal entry that holds its turn when recorded; persisted
/// one line each (`<64 hex>` or `<64 hex> <entry id>`).
#[derive(Debug)]
pub struct TransparentIndex {
    known: HashMap<ChainHash, Option<EntryId>>,
    holders: HashSet<EntryId>,
    file: Option<LineFile>,
}

/// Whether `entry` is Strata's own rather than a client turn or an answer the client saw or
/// should see: a compaction summary or resume instruction, or a memory-tool call or result.
fn is_strata_own(entry: &Entry, holders: &HashSet<EntryId>) -> bool {
    if holders.contains(&entry.id) {
        return false;
    }
    if entry.id.kind() == EntryKind::Summary {
        return true;
    }
    match entry.role {
        Role::User | Role::System => true,
        Role::Assistant => {
            entry.content.text.is_empty()
                && !entry.content.tool_calls.is_empty()
                && entry.content.tool_calls.iter().all(|call| is_memory_tool(&call.name))
        }
        Role::Tool => {
            entry.content.tool_results.iter().all(|result| result.name.as_deref().is_some_and(is_memory_tool))
        }
    }
}

/// Where the summaries of a generation stand: `(ID number, index in the entries)`, in order.
fn summaries(entries: &[Entry]) -> Vec<(u64, usize)> {
    let summaries = entries.iter().enumerate().filter(|(_, entry)| entry.id.kind() == EntryKind::Summary);
    summaries.map(|(index, entry)| (entry.id.number(), index)).collect()
}

/// The summary (among `summaries`, from [`summaries`]) that can hold the entry `id`: the earliest
/// one allocated after it, as `(ID number, index)`. A summary's ID is allocated once every entry
/// it covers exists, so a summary with a lower number cannot hold it.
fn folding_summary(summaries: &[(u64, usize)], id: EntryId) -> Option<(u64, usize)> {
    summaries.iter().find(|(number, _)| *number > id.number()).copied()
}

/// The ID number of the newest summary among `entries`.
fn newest_summary(entries: &[Entry]) -> Option<u64> {
    entries.iter().filter(|entry| entry.id.kind() == EntryKind::Summary).map(|entry| entry.id.number()).max()
}

/// Whether rewinding to the first `keep` entries drops a summary that may hold a client turn older
/// than the shared one (entry number `shared`), among the holders the generation no longer holds
/// (`absent`), when no kept summary can hold that turn. The client sends such a turn as journaled, so
/// only the dropped summary still held it. A summary is allocated after every entry it covers, so it
/// can hold only entries numbered below it.
fn may_drop_older_turns(entries: &[Entry], keep: usize, shared: u64, absent: &[u64]) -> bool {
    let Some(newest_dropped) = newest_summary(&entries[keep..]) else { return false };
    let newest_kept = newest_summary(&entries[..keep]);
    absent.iter().any(|&holder| {
        holder < shared && holder < newest_dropped && newest_kept.is_none_or(|kept| kept < holder)
    })
}

/// How a transparent request relates to the journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// The request extends the journal: its turns from `first_new` on are new.
    Extends {
        /// Index of the first turn not yet journaled.
        first_new: usize,
    },
    /// The request diverged: the journal must be rewound to its first `keep` entries (the turns
    /// before `first_new` and whatever Strata added among them), then the turns from `first_new`
    /// on journaled.
    Diverged {
        /// Journal entries (of the current generation) to keep.
        keep: usize,
        /// Index of the first turn to journal after the rewind.
        first_new: usize,
        /// Journal entries dropped by the rewind.
        dropped: usize,
    },
}

/// The chain value after `turn`, given the value before it.
pub fn chain(previous: &ChainHash, turn: &Turn) -> ChainHash {
    let mut hasher = Sha256::new();
    hasher.update(previous);
    hasher.update(content_hash(turn.role, &turn.content).as_bytes());
    hasher.finalize().into()
}

impl IndexError {
    /// `cause` while reading or writing the file at `path`.
    pub fn new(path: &Path, cause: std::io::Error) -> Self {
        Self { path: path.to_owned(), cause }
    }
}

impl TransparentIndex {
    /// Whether the index's tables are close to reallocating (see [`crate::room_ahead`]). An index
    /// not in use (a stateful session's) is left alone.
    pub fn room_low(&self) -> bool {
        !self.known.is_empty()
            && (crate::room_ahead::is_low(&self.known) || crate::room_ahead::is_low(&self.holders))
    }

    /// Grows the index's tables ahead of need when their room is low (an index in use only);
    /// returns whether one grew.
    pub fn make_room(&mut self) -> bool {
        if self.known.is_empty() {
            return false;
        }
        let known = crate::room_ahead::make(&mut self.known);
        crate::room_ahead::make(&mut self.holders) | known
    }

    /// An index kept in memory only (replay).
    pub fn in_memory() -> Self {
        Self { known: HashMap::new(), holders: HashSet::new(), file: None }
    }

    /// Loads the index at `path` on `storage` (absent means empty). Lines that are not 64 hex
    /// digits are a torn final write and are ignored.
    pub fn load(storage: Arc<dyn Storage>, path: &Path) -> Result<Self, IndexError> {
        let mut known = HashMap::new();
        let mut holders = HashSet::new();
        for line in read_lines(&*storage, path)?.lines() {
            let mut fields = line.split_whitespace();
            let mut value = [0u8; 32];
            let Some(chain_hex) = fields.next() else { continue };
            if hex::decode_to_slice(chain_hex, &mut value).is_err() {
                continue;
            }
            let entry = fields.next().and_then(|id| id.parse::<EntryId>().ok());
            let slot = known.entry(value).or_insert(None);
            if let Some(id) = entry {
                *slot = Some(id);
                holders.insert(id);
            }
        }
        Ok(Self { known, holders, file: Some(LineFile::new(storage, path)) })
    }

    /// The chain values of `turns` and the index of the first turn that is not yet journaled.
    /// `known` holds chain values of leading turns already computed by the caller (a
    /// [`super::message_memo::MessageMemo`]): `known[i]` must be the value after `turns[i]`.
    pub fn split(&self, turns: &[Turn], known: &[ChainHash]) -> (Vec<ChainHash>, usize) {
        self.split_into(turns, known, Vec::new())
    }

    /// [`Self::split`] into `buffer`, cleared first: a caller that keeps the vector of an earlier
    /// request reuses its memory instead of allocating as many values again.
    pub fn split_into(
        &self,
        turns: &[Turn],
        known: &[ChainHash],
        buffer: Vec<ChainHash>,
    ) -> (Vec<ChainHash>, usize) {
        let mut chains = buffer;
        chains.clear();
        chains.reserve(turns.len());
        let mut previous = [0u8; 32];
        for (index, turn) in turns.iter().enumerate() {
            previous = match known.get(index) {
                Some(value) => *value,
                None => chain(&previous, turn),
            };
            chains.push(previous);
        }
        // The last known turn, looked for from the end: a resent history is known up to its
        // newest turns, so this is a lookup or two rather than one per turn.
        let first_new =
            chains.iter().rposition(|value| self.known.contains_key(value)).map_or(0, |index| index + 1);
        (chains, first_new)
    }

    /// How the request whose chain values are `chains` (with `first_known` turns already
    /// journaled, from [`Self::split`]) relates to the journal's current generation `entries`.
    ///
    /// It extends the journal when only Strata's own entries (a compaction summary, memory-tool
    /// traffic) follow the entry holding its last known turn (or the journal is empty and nothing
    /// is known, or the turn was recorded before entries were tracked). A turn whose entry a
    /// compaction or a purge folded into a summary of this generation stands where the summary
    /// stands, when it is the newest client turn the summary can hold: a request resending the
    /// history a compaction summarised whole extends the journal after the summary. Otherwise it
    /// diverged, and the journal is rewound to the latest known turn the generation still holds
    /// (with Strata's own entries right after it). A compaction's summary that stands after that
    /// turn and holds only older turns (a retry or an edit of a kept-recent turn after a
    /// compaction) stays, as the keyed retries of Stateful clients keep it: dropping it would lose
    /// the turns it holds, which the client resends as already journaled. When no shared turn is
    /// left (a new conversation, an edit of a summarised turn, a rollback to before every shared
    /// turn) the journal is rewound to nothing and the whole request is journaled again: a
    /// summary of turns the client no longer sends is not spliced onto its conversation. The same
    /// full rewind is taken when the rewind to the shared turn would drop a summary that may also
    /// hold older turns no kept summary holds: the client sends those as journaled, and only the
    /// dropped summary held them.
    pub fn locate(&self, chains: &[ChainHash], first_known: usize, entries: &[Entry]) -> Placement {
        // The last entry that is not Strata's own: the request extends the journal when that is
        // the entry holding its last known turn. Only the journal's tail is read.
        let last_foreign = entries.iter().rposition(|entry| !is_strata_own(entry, &self.holders));
        if first_known == 0 {
            // Nothing but Strata's own entries, and none a summary of another conversation.
            if last_foreign.is_none() && !entries.iter().any(|entry| entry.id.kind() == EntryKind::Summary) {
                return Placement::Extends { first_new: 0 };
            }
        } else {
            match self.known.get(&chains[first_known - 1]) {
                Some(None) => return Placement::Extends { first_new: first_known },
                Some(Some(id))
                    if last_foreign.is_some_and(|index| {
                        entries[index].id == *id && !self.summary_after_holds_newer(entries, index + 1, *id)
                    }) =>
                {
                    return Placement::Extends { first_new: first_known };
                }
                _ => {}
            }
        }
        let position: HashMap<EntryId, usize> =
            entries.iter().enumerate().map(|(index, entry)| (entry.id, index)).collect();
        let summary_positions = summaries(entries);
        // The numbers of the entries holding client turns, in order, and of those the generation
        // does not hold (folded into a summary, or dropped): built when first needed.
        let holder_numbers = std::cell::OnceCell::new();
        let numbers = || {
            holder_numbers.get_or_init(|| {
                let mut all: Vec<u64> = self.holders.iter().map(EntryId::number).collect();
                all.sort_unstable();
                let absent: Vec<u64> = self
                    .holders
                    .iter()
                    .filter(|id| !position.contains_key(id))
                    .map(EntryId::number)
                    .collect();
                (all, absent)
            })
        };
        // The latest shared turn, with how many leading entries to keep for it.
        let shared = (0..first_known).rev().find_map(|turn| {
            let id = self.known.get(&chains[turn]).copied().flatten()?;
            if let Some(index) = position.get(&id) {
                // Whether the summary numbered `summary` may hold a client turn newer than this one
                // (one the request no longer sends).
                let holds_newer = |summary: u64| {
                    numbers().1.iter().any(|number| *number > id.number() && *number < summary)
                };
                // The entries to keep through `index`: Strata's own after it, up to a summary
                // that may hold a turn the client no longer sends.
                let keep_through = |index: usize| {
                    let own = entries[index + 1..].iter().take_while(|entry| {
                        let newer_summary = entry.id.kind() == EntryKind::Summary
                            && entry.id.number() > id.number()
                            && holds_newer(entry.id.number());
                        is_strata_own(entry, &self.holders) && !newer_summary
                    });
                    index + 1 + own.count()
                };
                let keep = keep_through(*index);
                // A summary after the kept entries, made since this turn was journaled, that holds
                // no client turn newer than it: it holds the older turns the client still sends.
                let later_summary = summary_positions
                    .iter()
                    .rev()
                    .find(|(number, summary)| *summary >= keep && *number > id.number());
                if let Some(&(summary, summary_index)) = later_summary
                    && !holds_newer(summary)
                {
                    return Some((turn, keep_through(summary_index), id.number()));
                }
                return Some((turn, keep, id.number()));
            }
            let (summary, index) = folding_summary(&summary_positions, id)?;
            let (all, _) = numbers();
            // Any client turn journaled after this one and before the summary is one the request
            // no longer sends, and the summary may hold it.
            let newest_before_summary = all[..all.partition_point(|number| *number < summary)].last();
            if newest_before_summary != Some(&id.number()) {
                return None;
            }
            // After the summary stand Strata's own entries and the older turns the compaction kept
            // verbatim; the first turn journaled after the summary is one the client never saw, and
            // a later summary (a purge) may hold such turns.
            let kept_after = entries[index + 1..]
                .iter()
                .take_while(|entry| {
                    let later_summary = entry.id.kind() == EntryKind::Summary && entry.id.number() > summary;
                    !later_summary && (is_strata_own(entry, &self.holders) || entry.id.number() < summary)
                })
                .count();
            Some((turn, index + 1 + kept_after, id.number()))
        });
        let (keep, first_new) = match shared {
            // Keeping only what stands before a summary that may also hold older turns the client
            // sends as journaled would lose them: the whole request is journaled again instead.
            Some((turn, keep, shared_number))
                if !may_drop_older_turns(entries, keep, shared_number, &numbers().1) =>
            {
                (keep, turn + 1)
            }
            Some(_) | None => (0, 0),
        };
        if keep == entries.len() && first_new == first_known {
            return Placement::Extends { first_new };
        }
        Placement::Diverged { keep, first_new, dropped: entries.len() - keep }
    }

    /// Whether a summary among `entries[after..]` may hold a client turn journaled after the entry
    /// `id`: one the request, whose last known turn `id` holds, no longer sends (a regenerate or an
    /// edit after a compaction that kept that turn verbatim). Such a summary is not extended.
    fn summary_after_holds_newer(&self, entries: &[Entry], after: usize, id: EntryId) -> bool {
        // A holder between `id` and the newest summary after it is one that summary may hold.
        let Some(summary) = newest_summary(&entries[after..]) else { return false };
        let present: HashSet<EntryId> = entries.iter().map(|entry| entry.id).collect();
        self.holders.iter().any(|holder| {
            holder.number() > id.number() && holder.number() < summary && !present.contains(holder)
        })
    }

    /// Remembers `values`, each with the journal entry holding its turn, and appends them to the
    /// file (durable once the file is fsynced; see [`Self::sync_target`]). Returns whether anything
    /// was written.
    pub fn remember(&mut self, values: &[(ChainHash, EntryId)]) -> Result<bool, IndexError> {
        let mut text = String::new();
        for (value, entry) in values {
            self.holders.insert(*entry);
            if self.known.insert(*value, Some(*entry)) != Some(Some(*entry)) {
                text.push_str(&hex::encode(value));
                text.push(' ');
                text.push_str(&entry.to_string());
                text.push('\n');
            }
        }
        let Some(file) = &mut self.file else { return Ok(false) };
        if text.is_empty() {
            return Ok(false);
        }
        file.append(&text)?;
        Ok(true)
    }

    /// Forgets every turn remembered with an entry ID from `first_unissued` on: the gateway
    /// remembers a turn's chain value before its entry is appended (so a crash in between never
    /// leaves a journaled client turn the index does not know, which a retry would journal
    /// twice), and an ID the journal never made durable may be issued again to another entry. The
    /// file is rewritten without those lines. Returns how many were forgotten.
    pub fn forget_unissued(&mut self, first_unissued: u64) -> Result<usize, IndexError> {
        let unissued: Vec<ChainHash> = self
            .known
            .iter()
            .filter(|(_, entry)| entry.is_some_and(|id| id.number() >= first_unissued))
            .map(|(value, _)| *value)
            .collect();
        if unissued.is_empty() {
            return Ok(0);
        }
        for value in &unissued {
            if let Some(Some(id)) = self.known.remove(value) {
                self.holders.remove(&id);
            }
        }
        self.rewrite_file()?;
        Ok(unissued.len())
    }

    /// Forgets every chain value except `live` (the values of the conversation the client now
    /// sends): after a new conversation replaced the journal's, the old one's values can only
    /// describe turns no client sends any more, and an always-on agent would otherwise keep every
    /// value it ever saw. The file is rewritten. Returns how many values were forgotten.
    pub fn retain_only(&mut self, live: &[ChainHash]) -> Result<usize, IndexError> {
        let live: HashSet<&ChainHash> = live.iter().collect();
        let before = self.known.len();
        self.known.retain(|value, _| live.contains(value));
        let forgotten = before - self.known.len();
        if forgotten == 0 {
            return Ok(0);
        }
        self.holders = self.known.values().flatten().copied().collect();
        self.rewrite_file()?;
        Ok(forgotten)
    }

    /// Rewrites the file with the values known now: a temporary file, synced, renamed over it, so a
    /// crash leaves the old file or the whole new one.
    fn rewrite_file(&mut self) -> Result<(), IndexError> {
        let Some(file) = &mut self.file else { return Ok(()) };
        let mut text = String::new();
        for (value, entry) in &self.known {
            text.push_str(&hex::encode(value));
            if let Some(id) = entry {
                text.push(' ');
                text.push_str(&id.to_string());
            }
            text.push('\n');
        }
        file.replace(&text)
    }

    /// How many chain values are known.
    pub fn len(&self) -> usize {
        self.known.len()
    }

    /// Whether no chain value is known.
    pub fn is_empty(&self) -> bool {
        self.known.is_empty()
    }

    /// What makes the file's appends so far durable, when persisted.
    pub fn sync_target(&self) -> Option<LineFileSync> {
        self.file.as_ref().map(LineFile::sync_target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::{Content, EntryDraft, RetentionClass};

    fn entry(kind: EntryKind, role: Role, text: &str, number: u64) -> Entry {
        let content = Content::text(text.to_owned());
        let retention = RetentionClass::Working;
        EntryDraft { kind, role, content, retention, created_at_ms: 0, tokens: 1, artifact_refs: vec![] }
            .into_entry(number)
    }

    fn turn(role: Role, text: &str) -> Turn {
        Turn { role, content: Content::text(text.to_owned()) }
    }

    /// An index that knows `turns`, the turn at `i` held by the entry numbered `numbers[i]`.
    fn knowing(turns: &[Turn], numbers: &[u64]) -> (TransparentIndex, Vec<ChainHash>) {
        let mut index = TransparentIndex::in_memory();
        let (chains, _) = index.split(turns, &[]);
        let held: Vec<(ChainHash, EntryId)> = chains
            .iter()
            .zip(numbers)
            .map(|(chain, number)| (*chain, EntryId::new(EntryKind::Message, *number)))
            .collect();
        index.remember(&held).ok();
        (index, chains)
    }

    #[test]
    fn turns_a_summary_folded_stand_where_the_summary_stands() {
        let history = [turn(Role::User, "u1"), turn(Role::Assistant, "a1"), turn(Role::User, "u2")];
        let (index, _) = knowing(&history[..2], &[1, 2]);
        let (chains, first_known) = index.split(&history, &[]);
        assert_eq!(first_known, 2);
        // A compaction folded entries 1 and 2 into summary 5, followed by its resume instruction.
        let compacted = [
            entry(EntryKind::Summary, Role::User, "summary", 5),
            entry(EntryKind::Message, Role::User, "resume", 6),
        ];
        assert_eq!(index.locate(&chains, first_known, &compacted), Placement::Extends { first_new: 2 });

        // Older turns the compaction kept verbatim stand after the summary, and stay.
        let mut retained = compacted.to_vec();
        retained.push(entry(EntryKind::Message, Role::User, "u1", 1));
        assert_eq!(index.locate(&chains, first_known, &retained), Placement::Extends { first_new: 2 });

        // Entries the client never saw after the summary are dropped; the summary stays.
        let mut unseen = compacted.to_vec();
        unseen.push(entry(EntryKind::Message, Role::Assistant, "an answer never delivered", 7));
        assert_eq!(
            index.locate(&chains, first_known, &unseen),
            Placement::Diverged { keep: 2, first_new: 2, dropped: 1 }
        );
    }

    #[test]
    fn an_edit_of_a_summarised_turn_is_not_spliced_onto_the_summary() {
        let history = [
            turn(Role::User, "u1"),
            turn(Role::Assistant, "a1"),
            turn(Role::User, "u2"),
            turn(Role::Assistant, "a2"),
        ];
        let (index, _) = knowing(&history, &[1, 2, 3, 4]);
        // The client edits u2, which the summary folded with a2.
        let edited = [history[0].clone(), history[1].clone(), turn(Role::User, "u2, edited")];
        let (chains, first_known) = index.split(&edited, &[]);
        assert_eq!(first_known, 2);
        let compacted = [
            entry(EntryKind::Summary, Role::User, "summary", 5),
            entry(EntryKind::Message, Role::User, "resume", 6),
        ];
        assert_eq!(
            index.locate(&chains, first_known, &compacted),
            Placement::Diverged { keep: 0, first_new: 0, dropped: 2 }
        );
        // Resent unedited, it extends the summary.
        let (chains, first_known) = index.split(&history, &[]);
        assert_eq!(index.locate(&chains, first_known, &compacted), Placement::Extends { first_new: 4 });
    }

    fn six_turns() -> Vec<Turn> {
        ["u1", "a1", "u2", "a2", "u3", "a3"]
            .iter()
            .enumerate()
            .map(|(index, text)| turn(if index % 2 == 0 { Role::User } else { Role::Assistant }, text))
            .collect()
    }

    /// Eight turns, u1 to a4, and an index that knows them held by entries 1 to 6, 9 and 10.
    fn eight_turns_known() -> (Vec<Turn>, TransparentIndex) {
        let mut history = six_turns();
        history.extend([turn(Role::User, "u4"), turn(Role::Assistant, "a4")]);
        let (index, _) = knowing(&history, &[1, 2, 3, 4, 5, 6, 9, 10]);
        (history, index)
    }

    #[test]
    fn a_retry_after_a_compaction_keeps_the_summary_of_the_older_turns() {
        let (history, index) = eight_turns_known();
        // The compaction kept u3 and a3 and placed its summary of turns 1 to 4 after them.
        let mut compacted = vec![
            entry(EntryKind::Message, Role::User, "u3", 5),
            entry(EntryKind::Message, Role::Assistant, "a3", 6),
            entry(EntryKind::Summary, Role::User, "summary", 7),
            entry(EntryKind::Message, Role::User, "resume", 8),
        ];
        // The client regenerates a3: it sends its history up to u3.
        let (chains, first_known) = index.split(&history[..5], &[]);
        assert_eq!(first_known, 5);
        assert_eq!(index.locate(&chains, first_known, &compacted), Placement::Extends { first_new: 5 });
        // Turns journaled after the summary that the client never saw go; the summary stays.
        compacted.push(entry(EntryKind::Message, Role::User, "u4", 9));
        compacted.push(entry(EntryKind::Message, Role::Assistant, "a4", 10));
        assert_eq!(
            index.locate(&chains, first_known, &compacted),
            Placement::Diverged { keep: 4, first_new: 5, dropped: 2 }
        );
    }

    #[test]
    fn a_summary_holding_turns_newer_and_older_than_the_shared_one_is_not_spliced_nor_its_older_turns_lost() {
        let (history, index) = eight_turns_known();
        // A summary of turns 1 to 4 and of a3 (so newer than the kept u3), and u4 after it: a
        // compaction that kept u3 verbatim (a Critical entry) and folded the rest.
        let compacted = [
            entry(EntryKind::Message, Role::User, "u3", 5),
            entry(EntryKind::Summary, Role::User, "summary", 7),
            entry(EntryKind::Message, Role::User, "resume", 8),
            entry(EntryKind::Message, Role::User, "u4", 9),
        ];
        // The client regenerates a3. Keeping u3 alone would lose u1 to a2, which the client sends
        // as journaled and only the summary held: the whole request is journaled again.
        let (chains, first_known) = index.split(&history[..5], &[]);
        assert_eq!(
            index.locate(&chains, first_known, &compacted),
            Placement::Diverged { keep: 0, first_new: 0, dropped: 4 }
        );
    }

    #[test]
    fn a_summary_after_the_last_known_turn_is_not_extended_when_it_holds_a_newer_turn() {
        let history = six_turns();
        // u3 (5) was kept verbatim; summary 7 holds u1 to a2 and a3 (6).
        let (index, _) = knowing(&history, &[1, 2, 3, 4, 5, 6]);
        let compacted = [
            entry(EntryKind::Message, Role::User, "u3", 5),
            entry(EntryKind::Summary, Role::User, "summary", 7),
            entry(EntryKind::Message, Role::User, "resume", 8),
        ];
        // The client regenerates a3: its last known turn is the last client entry, but the summary
        // after it holds a3, which the client abandoned, and the older turns with it.
        let (chains, first_known) = index.split(&history[..5], &[]);
        assert_eq!(
            index.locate(&chains, first_known, &compacted),
            Placement::Diverged { keep: 0, first_new: 0, dropped: 3 }
        );
        // With the older turns in a summary before it, only the summary holding a3 goes.
        let (index, _) = knowing(&history, &[1, 2, 3, 4, 7, 8]);
        let purged = [
            entry(EntryKind::Summary, Role::User, "summary", 5),
            entry(EntryKind::Message, Role::User, "resume", 6),
            entry(EntryKind::Message, Role::User, "u3", 7),
            entry(EntryKind::Summary, Role::User, "purge of a3", 9),
            entry(EntryKind::Message, Role::User, "resume", 10),
        ];
        assert_eq!(
            index.locate(&chains, first_known, &purged),
            Placement::Diverged { keep: 3, first_new: 5, dropped: 2 }
        );
        // A summary that holds only older turns is extended, as before.
        let (index, _) = knowing(&history, &[1, 2, 3, 4, 5, 6]);
        let older_only = [
            entry(EntryKind::Message, Role::User, "u3", 5),
            entry(EntryKind::Message, Role::Assistant, "a3", 6),
            entry(EntryKind::Summary, Role::User, "summary", 7),
        ];
        let (chains, first_known) = index.split(&history, &[]);
        assert_eq!(index.locate(&chains, first_known, &older_only), Placement::Extends { first_new: 6 });
    }

    #[test]
    fn a_summary_holding_only_turns_newer_than_the_shared_one_is_dropped_alone() {
        let mut history = six_turns();
        history.extend([turn(Role::User, "u4"), turn(Role::Assistant, "a4")]);
        let (index, _) = knowing(&history, &[1, 2, 3, 4, 7, 8, 11, 12]);
        // Summary 5 holds turns 1 to 4; u3 (7) stands after it; a purge (9) folded a3 (8); u4 and
        // a4 followed.
        let journal = [
            entry(EntryKind::Summary, Role::User, "summary", 5),
            entry(EntryKind::Message, Role::User, "resume", 6),
            entry(EntryKind::Message, Role::User, "u3", 7),
            entry(EntryKind::Summary, Role::User, "purge of a3", 9),
            entry(EntryKind::Message, Role::User, "resume", 10),
            entry(EntryKind::Message, Role::User, "u4", 11),
            entry(EntryKind::Message, Role::Assistant, "a4", 12),
        ];
        // The client regenerates a3: the older turns stay with the summary that holds them, and
        // only the purge of a3 and what followed it go.
        let (chains, first_known) = index.split(&history[..5], &[]);
        assert_eq!(first_known, 5);
        assert_eq!(
            index.locate(&chains, first_known, &journal),
            Placement::Diverged { keep: 3, first_new: 5, dropped: 4 }
        );
    }

    #[test]
    fn a_new_conversation_does_not_extend_another_ones_summary() {
        let (index, _) = knowing(&six_turns(), &[1, 2, 3, 4, 5, 6]);
        let other = [turn(Role::User, "something else")];
        let (chains, first_known) = index.split(&other, &[]);
        assert_eq!(first_known, 0);
        let compacted = [
            entry(EntryKind::Summary, Role::User, "summary", 7),
            entry(EntryKind::Message, Role::User, "resume", 8),
        ];
        assert_eq!(
            index.locate(&chains, first_known, &compacted),
            Placement::Diverged { keep: 0, first_new: 0, dropped: 2 }
        );
        assert_eq!(index.locate(&chains, first_known, &[]), Placement::Extends { first_new: 0 });
    }

    #[test]
    fn an_edit_after_a_summary_drops_a_later_purge_of_the_edited_turn() {
        let history = six_turns();
        let (index, _) = knowing(&history, &[1, 2, 3, 4, 7, 8]);
        // Summary 5 holds turns 1 to 4; the client went on with u3 (7) and a3 (8); a purge folded u3.
        let purged = [
            entry(EntryKind::Summary, Role::User, "summary", 5),
            entry(EntryKind::Message, Role::User, "resume", 6),
            entry(EntryKind::Summary, Role::User, "purge of u3", 9),
            entry(EntryKind::Message, Role::Assistant, "a3", 8),
        ];
        // The client edits u3.
        let mut edited = history[..4].to_vec();
        edited.push(turn(Role::User, "u3, edited"));
        let (chains, first_known) = index.split(&edited, &[]);
        assert_eq!(first_known, 4);
        assert_eq!(
            index.locate(&chains, first_known, &purged),
            Placement::Diverged { keep: 2, first_new: 4, dropped: 2 }
        );
    }

    #[test]
    fn a_summary_older_than_every_shared_turn_is_not_taken_for_theirs() {
        let history = [turn(Role::User, "u1"), turn(Role::Assistant, "a1"), turn(Role::User, "u2")];
        let (index, _) = knowing(&history[..2], &[8, 9]);
        let (chains, first_known) = index.split(&history, &[]);
        // A rollback to a generation compacted before the shared turns were journaled.
        let earlier = [
            entry(EntryKind::Summary, Role::User, "older summary", 5),
            entry(EntryKind::Message, Role::User, "resume", 6),
            entry(EntryKind::Message, Role::Assistant, "another conversation's answer", 7),
        ];
        assert_eq!(
            index.locate(&chains, first_known, &earlier),
            Placement::Diverged { keep: 0, first_new: 0, dropped: 3 }
        );
    }
}

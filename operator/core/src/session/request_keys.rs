//! Idempotency keys of stateful turns: a retried request is recognised, not journaled twice.
//!
//! A stateful client sends only its new messages. When a request is cut (the gateway crashed, the
//! connection dropped) the client cannot tell whether its turn was journaled, and a plain resend
//! would journal it again. A client that sends an `Idempotency-Key` header lets the engine tell: the
//! key is remembered with the ID of the first entry its turn gets and a digest of the turn, written
//! ahead of the journal append (as the transparent index is), and made durable by the same group
//! commit. A request that comes again with the latest key replaces the earlier attempt instead of
//! adding to it; a key reused for other messages, or for a turn that is no longer the latest, is
//! refused.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::entry::EntryId;
use crate::journal::Storage;
use crate::session::line_file::{LineFile, LineFileSync, read_lines};
use crate::session::transparent::{ChainHash, IndexError, chain};
use crate::session::turn::Turn;

/// Keys remembered at most; past twice as many lines the file is rewritten with the newest.
pub const KEPT_KEYS: usize = 256;

/// Longest key accepted, in bytes.
pub const MAX_KEY_BYTES: usize = 255;

/// What the engine remembers of one keyed turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyedTurn {
    /// The journal entry its first message got (or was about to get).
    pub first_entry: EntryId,
    /// The chain value of its messages: the same key with other messages is another request.
    pub digest: ChainHash,
}

/// How a keyed request relates to what was journaled before.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyedPlacement {
    /// The key is new: journal the turn.
    New,
    /// The latest keyed turn, sent again with the same messages: the earlier attempt is replaced.
    Retry(KeyedTurn),
}

/// Why a keyed request is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyRefusal {
    /// The key is empty, too long, or has characters a header cannot carry.
    #[error(
        "the Idempotency-Key header must be 1 to {MAX_KEY_BYTES} visible ASCII characters; send a fresh key (a UUID, say) for each new turn"
    )]
    Malformed,
    /// The key was used before for other messages.
    #[error(
        "Idempotency-Key {key:?} was already used for a turn with other messages; send a fresh key for each new turn, and the same key only to retry the same messages"
    )]
    Reused {
        /// The key.
        key: String,
    },
    /// The key names a turn that later turns have followed.
    #[error(
        "Idempotency-Key {key:?} names an earlier turn, not the latest: only the latest turn can be retried; send a fresh key for a new turn"
    )]
    NotLatest {
        /// The key.
        key: String,
    },
}

/// Keys of recent stateful turns, persisted one line each (`<sha256 of key> <entry id> <digest>`).
#[derive(Debug)]
pub struct RequestKeys {
    keys: HashMap<ChainHash, KeyedTurn>,
    lines: usize,
    file: Option<LineFile>,
}

/// The digest of a turn's messages.
pub fn turn_digest(turns: &[Turn]) -> ChainHash {
    turns.iter().fold([0u8; 32], |previous, turn| chain(&previous, turn))
}

fn key_hash(key: &str) -> ChainHash {
    let mut hasher = Sha256::new();
    hasher.update(b"strata idempotency key\0");
    hasher.update(key.as_bytes());
    hasher.finalize().into()
}

/// Checks that `key` can be a header value the engine keeps.
pub fn validate_key(key: &str) -> Result<(), KeyRefusal> {
    let visible = key.bytes().all(|byte| byte.is_ascii_graphic());
    if key.is_empty() || key.len() > MAX_KEY_BYTES || !visible {
        return Err(KeyRefusal::Malformed);
    }
    Ok(())
}

impl RequestKeys {
    /// Keys kept in memory only (replay).
    pub fn in_memory() -> Self {
        Self { keys: HashMap::new(), lines: 0, file: None }
    }

    /// Loads the keys at `path` on `storage` (absent means none). A line that does not parse is a
    /// torn final write and is skipped.
    pub fn load(storage: Arc<dyn Storage>, path: &Path) -> Result<Self, IndexError> {
        let mut keys = HashMap::new();
        let mut lines = 0;
        for line in read_lines(&*storage, path)?.lines() {
            lines += 1;
            let mut fields = line.split_whitespace();
            let (Some(key), Some(entry), Some(digest)) = (fields.next(), fields.next(), fields.next()) else {
                continue;
            };
            let (mut key_value, mut digest_value) = ([0u8; 32], [0u8; 32]);
            let Ok(first_entry) = entry.parse::<EntryId>() else { continue };
            if hex::decode_to_slice(key, &mut key_value).is_err()
                || hex::decode_to_slice(digest, &mut digest_value).is_err()
            {
                continue;
            }
            keys.insert(key_value, KeyedTurn { first_entry, digest: digest_value });
        }
        Ok(Self { keys, lines, file: Some(LineFile::new(storage, path)) })
    }

    /// How a request with `key` and messages `turns` relates to the turns keyed before.
    pub fn place(&self, key: &str, turns: &[Turn]) -> Result<KeyedPlacement, KeyRefusal> {
        validate_key(key)?;
        let Some(known) = self.keys.get(&key_hash(key)) else { return Ok(KeyedPlacement::New) };
        if known.digest != turn_digest(turns) {
            return Err(KeyRefusal::Reused { key: key.to_owned() });
        }
        let latest = self.keys.values().map(|turn| turn.first_entry.number()).max();
        if latest != Some(known.first_entry.number()) {
            return Err(KeyRefusal::NotLatest { key: key.to_owned() });
        }
        Ok(KeyedPlacement::Retry(*known))
    }

    /// Remembers `key` for a turn whose first entry is (about to be) `first_entry`, appending a
    /// line to the file (durable once the file is fsynced; see [`Self::sync_target`]). Past twice
    /// [`KEPT_KEYS`] lines the file is rewritten with the newest keys only.
    pub fn remember(&mut self, key: &str, turns: &[Turn], first_entry: EntryId) -> Result<(), IndexError> {
        let hash = key_hash(key);
        let turn = KeyedTurn { first_entry, digest: turn_digest(turns) };
        if self.keys.insert(hash, turn) == Some(turn) {
            return Ok(());
        }
        let Some(file) = &mut self.file else { return Ok(()) };
        if self.lines + 1 > 2 * KEPT_KEYS {
            self.keep_newest();
            return self.rewrite_file();
        }
        let line = format!("{} {} {}\n", hex::encode(hash), first_entry, hex::encode(turn.digest));
        file.append(&line)?;
        self.lines += 1;
        Ok(())
    }

    /// Forgets every key whose first entry number is `first_unissued` or later: written ahead of
    /// an append that never became durable, so the number may be issued again to another entry.
    /// Returns how many were forgotten.
    pub fn forget_unissued(&mut self, first_unissued: u64) -> Result<usize, IndexError> {
        let before = self.keys.len();
        self.keys.retain(|_, turn| turn.first_entry.number() < first_unissued);
        let forgotten = before - self.keys.len();
        if forgotten > 0 {
            self.rewrite_file()?;
        }
        Ok(forgotten)
    }

    fn keep_newest(&mut self) {
        if self.keys.len() <= KEPT_KEYS {
            return;
        }
        let mut numbers: Vec<u64> = self.keys.values().map(|turn| turn.first_entry.number()).collect();
        numbers.sort_unstable_by(|a, b| b.cmp(a));
        let oldest_kept = numbers[KEPT_KEYS - 1];
        self.keys.retain(|_, turn| turn.first_entry.number() >= oldest_kept);
    }

    /// Rewrites the file with the keys known now: a temporary file, synced, renamed over it.
    fn rewrite_file(&mut self) -> Result<(), IndexError> {
        let Some(file) = &mut self.file else { return Ok(()) };
        let mut text = String::new();
        for (hash, turn) in &self.keys {
            text.push_str(&format!(
                "{} {} {}\n",
                hex::encode(hash),
                turn.first_entry,
                hex::encode(turn.digest)
            ));
        }
        file.replace(&text)?;
        self.lines = self.keys.len();
        Ok(())
    }

    /// What makes the file's appends so far durable, when persisted.
    pub fn sync_target(&self) -> Option<LineFileSync> {
        self.file.as_ref().map(LineFile::sync_target)
    }

    /// How many keys are remembered.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether no key is remembered.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

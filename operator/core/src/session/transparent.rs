//! Transparent sessions: recognising already-journaled client messages by a chained content hash.
//!
//! The client resends its whole message list every call. Each message's hash is chained with the
//! hash of everything before it (`h_i = sha256(h_{i-1} ‖ content_hash_i)`), so a message repeated
//! later in the conversation is still new. Every chain value the gateway has journaled (client
//! messages and the assistant answers it returned) is remembered in a file under the data dir, so
//! after a restart the same list is still recognised. The new messages are those after the longest
//! known prefix.

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::entry::content_hash;
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

/// Known chain values, persisted one hex line each.
#[derive(Debug)]
pub struct TransparentIndex {
    known: HashSet<ChainHash>,
    path: Option<PathBuf>,
}

/// The chain value after `turn`, given the value before it.
pub fn chain(previous: &ChainHash, turn: &Turn) -> ChainHash {
    let mut hasher = Sha256::new();
    hasher.update(previous);
    hasher.update(content_hash(turn.role, &turn.content).as_bytes());
    hasher.finalize().into()
}

impl TransparentIndex {
    /// An index kept in memory only (replay).
    pub fn in_memory() -> Self {
        Self { known: HashSet::new(), path: None }
    }

    /// Loads the index at `path` (absent means empty). Lines that are not 64 hex digits are a torn
    /// final write and are ignored.
    pub fn load(path: &Path) -> Result<Self, IndexError> {
        let error = |cause| IndexError { path: path.to_owned(), cause };
        let mut known = HashSet::new();
        match std::fs::read_to_string(path) {
            Ok(text) => {
                for line in text.lines() {
                    let mut value = [0u8; 32];
                    if hex::decode_to_slice(line.trim(), &mut value).is_ok() {
                        known.insert(value);
                    }
                }
            }
            Err(cause) if cause.kind() == std::io::ErrorKind::NotFound => {}
            Err(cause) => return Err(error(cause)),
        }
        Ok(Self { known, path: Some(path.to_owned()) })
    }

    /// The chain values of `turns` and the index of the first turn that is not yet journaled.
    pub fn split(&self, turns: &[Turn]) -> (Vec<ChainHash>, usize) {
        let mut chains = Vec::with_capacity(turns.len());
        let mut previous = [0u8; 32];
        let mut first_new = 0;
        for (index, turn) in turns.iter().enumerate() {
            previous = chain(&previous, turn);
            if self.known.contains(&previous) {
                first_new = index + 1;
            }
            chains.push(previous);
        }
        (chains, first_new)
    }

    /// Remembers `values` and appends them to the file (durable once the file is fsynced; see
    /// [`Self::path`]). Returns whether anything was written.
    pub fn remember(&mut self, values: &[ChainHash]) -> Result<bool, IndexError> {
        let mut text = String::new();
        for value in values {
            if self.known.insert(*value) {
                text.push_str(&hex::encode(value));
                text.push('\n');
            }
        }
        let Some(path) = &self.path else { return Ok(false) };
        if text.is_empty() {
            return Ok(false);
        }
        let error = |cause| IndexError { path: path.clone(), cause };
        let mut file = std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(error)?;
        file.write_all(text.as_bytes()).map_err(error)?;
        Ok(true)
    }

    /// The index file, when persisted.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }
}

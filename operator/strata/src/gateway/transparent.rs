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

use sha2::{Digest, Sha256};
use strata_core::entry::content_hash;

use super::conversation::Turn;

/// A chain value.
pub type ChainHash = [u8; 32];

/// The transparent-session index could not be read or written.
#[derive(Debug, thiserror::Error)]
#[error("transparent-session index {path}: {source}")]
pub struct IndexError {
    path: PathBuf,
    source: std::io::Error,
}

/// Known chain values, persisted one hex line each.
#[derive(Debug)]
pub struct TransparentIndex {
    known: HashSet<ChainHash>,
    staged: Vec<ChainHash>,
    path: PathBuf,
}

/// The chain value after `turn`, given the value before it.
pub fn chain(previous: &ChainHash, turn: &Turn) -> ChainHash {
    let mut hasher = Sha256::new();
    hasher.update(previous);
    hasher.update(content_hash(turn.role, &turn.content).as_bytes());
    hasher.finalize().into()
}

impl TransparentIndex {
    /// Loads the index at `path` (absent means empty). Lines that are not 64 hex digits are a torn
    /// final write and are ignored.
    pub fn load(path: &Path) -> Result<Self, IndexError> {
        let error = |source| IndexError { path: path.to_owned(), source };
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
            Err(source) if source.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(error(source)),
        }
        Ok(Self { known, staged: Vec::new(), path: path.to_owned() })
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

    /// Remembers `values` now; they reach the file at the next [`Self::flush`].
    pub fn stage(&mut self, values: &[ChainHash]) {
        for value in values {
            if self.known.insert(*value) {
                self.staged.push(*value);
            }
        }
    }

    /// Appends the staged values to the file and syncs it.
    pub fn flush(&mut self) -> Result<(), IndexError> {
        if self.staged.is_empty() {
            return Ok(());
        }
        let error = |source| IndexError { path: self.path.clone(), source };
        let mut text = String::with_capacity(self.staged.len() * 65);
        for value in &self.staged {
            text.push_str(&hex::encode(value));
            text.push('\n');
        }
        let mut file =
            std::fs::OpenOptions::new().create(true).append(true).open(&self.path).map_err(error)?;
        file.write_all(text.as_bytes()).map_err(error)?;
        file.sync_data().map_err(error)?;
        self.staged.clear();
        Ok(())
    }
}

//! Hand-off of a compaction computed in another process to the journal writer.
//!
//! Only the writer allocates IDs and switches generations, so a compaction Job that runs beside a
//! live gateway reads the journal offline, computes a baseline, and publishes it as a proposal
//! file. The writer commits it on [`Journal::refresh`], carrying over everything appended after
//! the proposal's watermark. A proposal applies only to the generation it was computed from, so
//! re-running `refresh` after a crash (proposal committed but not yet deleted) finds it stale and
//! discards it: the carry-over happens exactly once.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::error::JournalError;
use super::layout::{Layout, Watermark, generation_dir_name};
use super::reader::JournalView;
use super::storage::Storage;
use super::writer::{BaselineEntry, GenerationSwitch, Journal, Snapshot};

/// Directory (inside the data directory) holding compaction proposals.
pub const PROPOSALS: &str = "proposals";

/// A compaction computed outside the writer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactionProposal {
    /// The generation the compaction read.
    pub generation: u64,
    /// How far it read.
    pub watermark: Watermark,
    /// The new baseline.
    pub baseline: Vec<BaselineEntry>,
    /// Creation time for the new generation (unix milliseconds).
    pub created_at_ms: u64,
}

impl JournalView {
    /// A compaction snapshot of this view (watermark = every intact entry).
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            generation: self.generation,
            watermark: Watermark {
                entries: self.entries.len() as u64,
                last_id: self.entries.last().map(|entry| entry.id),
            },
            entries: self.entries.clone(),
        }
    }
}

fn proposal_name(generation: u64) -> String {
    format!("compaction-{}.json", generation_dir_name(generation))
}

/// Durably publishes a proposal (temp file, fsync, rename, directory fsync) for the writer.
pub fn propose_compaction(
    storage: &dyn Storage,
    dir: &Path,
    proposal: &CompactionProposal,
) -> Result<PathBuf, JournalError> {
    let io = JournalError::io;
    let proposals = dir.join(PROPOSALS);
    if !storage.exists(&proposals).map_err(io("stat", &proposals))? {
        storage.create_dir_all(&proposals).map_err(io("create directory", &proposals))?;
        storage.sync_dir(dir).map_err(io("fsync directory", dir))?;
    }
    let path = proposals.join(proposal_name(proposal.generation));
    let tmp = proposals.join(format!("{}.tmp", proposal_name(proposal.generation)));
    let bytes = serde_json::to_vec(proposal)
        .map_err(|error| JournalError::BadManifest { path: path.clone(), reason: error.to_string() })?;
    storage.write_file(&tmp, &bytes).map_err(io("write", &tmp))?;
    storage.sync_file(&tmp).map_err(io("fsync", &tmp))?;
    storage.rename(&tmp, &path).map_err(io("rename", &path))?;
    storage.sync_dir(&proposals).map_err(io("fsync directory", &proposals))?;
    Ok(path)
}

/// The names of the proposals waiting in `proposals` (a directory that may not exist), sorted;
/// a `.tmp` is one another process is still writing, left to its rename.
fn waiting_names(storage: &dyn Storage, proposals: &Path) -> Result<Vec<String>, JournalError> {
    let io = JournalError::io;
    if !storage.exists(proposals).map_err(io("stat", proposals))? {
        return Ok(Vec::new());
    }
    let mut names = storage.list_dir(proposals).map_err(io("list", proposals))?;
    names.retain(|name| !name.ends_with(".tmp"));
    names.sort();
    Ok(names)
}

impl Journal {
    /// Commits a pending proposal for the current generation, if any, and discards stale ones
    /// (computed from an older generation or from entries that did not survive a crash). With none
    /// waiting it only looks: the directory is fsynced after a removal, not on every call (a
    /// gateway refreshes every second).
    pub fn refresh(&mut self) -> Result<Option<GenerationSwitch>, JournalError> {
        let storage = Arc::clone(self.storage());
        let io = JournalError::io;
        let proposals = Layout::new(self.dir()).root().join(PROPOSALS);
        let names = waiting_names(storage.as_ref(), &proposals)?;
        if names.is_empty() {
            return Ok(None);
        }
        let mut switch = None;
        for name in names {
            let path = proposals.join(&name);
            let wanted = switch.is_none() && name == proposal_name(self.generation());
            if wanted {
                let bytes = storage.read(&path).map_err(io("read", &path))?;
                let proposal: CompactionProposal =
                    serde_json::from_slice(&bytes).map_err(|error| JournalError::BadManifest {
                        path: path.clone(),
                        reason: format!("unreadable compaction proposal: {error}"),
                    })?;
                match self.commit_proposal(proposal) {
                    Ok(done) => switch = Some(done),
                    Err(JournalError::StaleSnapshot { .. } | JournalError::BadBaseline { .. }) => {}
                    Err(other) => return Err(other),
                }
            }
            storage.remove_file(&path).map_err(io("remove", &path))?;
        }
        storage.sync_dir(&proposals).map_err(io("fsync directory", &proposals))?;
        Ok(switch)
    }

    fn commit_proposal(&mut self, proposal: CompactionProposal) -> Result<GenerationSwitch, JournalError> {
        let snapshot =
            Snapshot { generation: proposal.generation, watermark: proposal.watermark, entries: Vec::new() };
        self.commit_generation(&snapshot, proposal.baseline, proposal.created_at_ms)
    }
}

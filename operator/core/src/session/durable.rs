//! What a group commit makes durable: the journal's log and the session's other files.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::journal::{Journal, SharedSync, Storage};
use crate::session::line_file::LineFileSync;

/// The files a group commit fsyncs, and the write count it covers.
pub struct DurableTarget {
    /// Writes up to this count become durable.
    pub seq: u64,
    /// The journal's log, fsynced through `log_sync` when the storage offers a shared handle
    /// (no open by path on every commit), else through [`Storage::sync_file`].
    pub log: PathBuf,
    log_sync: Option<Arc<dyn SharedSync>>,
    /// The session's line files written since the last commit.
    pub files: Vec<LineFileSync>,
}

impl std::fmt::Debug for DurableTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableTarget")
            .field("seq", &self.seq)
            .field("log", &self.log)
            .field("shared_log_handle", &self.log_sync.is_some())
            .field("files", &self.files.iter().map(|file| &file.path).collect::<Vec<_>>())
            .finish()
    }
}

impl DurableTarget {
    /// Every write of `journal` up to `seq`, and of `files`.
    pub(super) fn new(seq: u64, journal: &Journal, files: Vec<LineFileSync>) -> Self {
        Self { seq, log: journal.log_path().to_owned(), log_sync: journal.log_sync(), files }
    }

    /// Fsyncs every file of the target on `storage`; the error names the file that failed.
    ///
    /// The index files go first. Their lines are written ahead of the journal entries they name,
    /// and an index line whose entry a power loss took is forgotten at the next open; a journaled
    /// user turn the index does not know would be taken for Strata's own and journaled again. So
    /// the log is fsynced only once the index lines are durable. (The kernel may still write the
    /// log's pages back earlier on its own; only one file for both would close that.)
    pub fn sync(&self, storage: &dyn Storage) -> Result<(), String> {
        let failed = |path: &Path, error: std::io::Error| format!("fsync {}: {error}", path.display());
        for file in &self.files {
            file.sync(storage).map_err(|error| failed(&file.path, error))?;
        }
        match &self.log_sync {
            Some(handle) => handle.sync().map_err(|error| failed(&self.log, error))?,
            None => storage.sync_file(&self.log).map_err(|error| failed(&self.log, error))?,
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::entry::{Content, EntryDraft, EntryKind, RetentionClass, Role};
    use crate::journal::sim::{Fault, OpKind, SimStorage};
    use crate::journal::{JournalOptions, StdStorage, SyncPolicy};

    fn options() -> JournalOptions {
        let mut options = JournalOptions::new("durable-test", 1_000);
        options.sync_policy = SyncPolicy::Batched { max_pending: 0 };
        options
    }

    fn note() -> EntryDraft {
        EntryDraft {
            kind: EntryKind::Message,
            role: Role::User,
            content: Content::text("a turn"),
            retention: RetentionClass::Working,
            created_at_ms: 2_000,
            tokens: 3,
            artifact_refs: vec![],
        }
    }

    /// Appends one entry without syncing, optionally commits it through a target, crashes the
    /// simulated disk with `seed` and says whether the entry survived.
    fn survives(commit: bool, seed: u64) -> bool {
        let sim = SimStorage::new();
        let storage: Arc<dyn Storage> = Arc::new(sim.clone());
        let (mut journal, _) = Journal::open(Arc::clone(&storage), "/data", options()).unwrap();
        journal.append(note()).unwrap();
        let target = DurableTarget::new(1, &journal, Vec::new());
        assert!(target.log_sync.is_some(), "the simulated disk offers a shared handle");
        if commit {
            target.sync(storage.as_ref()).unwrap();
        }
        drop(journal);
        sim.crash(seed);
        let (journal, _) = Journal::open(storage, "/data", options()).unwrap();
        journal.entries().len() == 1
    }

    #[test]
    fn a_commit_through_the_shared_handle_makes_the_writers_appends_durable() {
        assert!((0..20).all(|seed| survives(true, seed)), "a committed append survives every crash");
        assert!(
            (0..20).any(|seed| !survives(false, seed)),
            "without the commit some crash loses the append, so the commit is what kept it"
        );
    }

    #[test]
    fn a_failed_commit_through_the_shared_handle_names_the_log() {
        let sim = SimStorage::new();
        let storage: Arc<dyn Storage> = Arc::new(sim.clone());
        let (mut journal, _) = Journal::open(Arc::clone(&storage), "/data", options()).unwrap();
        journal.append(note()).unwrap();
        let target = DurableTarget::new(1, &journal, Vec::new());
        sim.set_fault(Some(Fault { kind: Some(OpKind::Fsync), nth: 1, then_crash: false }));
        let error = target.sync(storage.as_ref()).unwrap_err();
        assert!(error.starts_with("fsync ") && error.contains(&*target.log.to_string_lossy()), "{error}");
    }

    #[test]
    fn on_a_real_disk_the_log_is_synced_through_a_duplicated_descriptor() {
        let dir = tempfile::tempdir().unwrap();
        let storage: Arc<dyn Storage> = Arc::new(StdStorage);
        let (mut journal, _) = Journal::open(Arc::clone(&storage), dir.path(), options()).unwrap();
        journal.append(note()).unwrap();
        let target = DurableTarget::new(1, &journal, Vec::new());
        assert!(target.log_sync.is_some());
        assert!(format!("{target:?}").contains("shared_log_handle: true"));
        // The writer keeps appending while a commit syncs its file from elsewhere.
        journal.append(note()).unwrap();
        target.sync(storage.as_ref()).unwrap();
        assert_eq!(target.log, journal.log_path());
    }
}

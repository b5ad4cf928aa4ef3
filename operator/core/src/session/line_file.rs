//! An append-only file of index lines beside the journal, on the journal's [`Storage`] seam: kept
//! open between appends, replaced whole by an atomic rename, and fsynced by a group commit through
//! the handle it was written through.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::journal::{AppendHandle, SharedSync, Storage};
use crate::session::transparent::IndexError;

/// A line file and, once something was appended, the handle appends go through.
pub(crate) struct LineFile {
    path: PathBuf,
    storage: Arc<dyn Storage>,
    open: Option<OpenLines>,
}

/// The handle of an open line file, with the one a group commit syncs it through (when the
/// storage has one).
struct OpenLines {
    handle: Box<dyn AppendHandle>,
    shared: Option<Arc<dyn SharedSync>>,
}

/// What a group commit fsyncs for a line file: the handle the appends went through, or the file by
/// its path when there is none (nothing appended since the file was replaced, or a storage whose
/// handles offer no shared sync).
#[derive(Clone)]
pub struct LineFileSync {
    /// The file, named in errors.
    pub path: PathBuf,
    shared: Option<Arc<dyn SharedSync>>,
}

impl std::fmt::Debug for LineFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LineFile").field("path", &self.path).field("open", &self.open.is_some()).finish()
    }
}

impl std::fmt::Debug for LineFileSync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LineFileSync")
            .field("path", &self.path)
            .field("shared", &self.shared.is_some())
            .finish()
    }
}

/// The whole lines of the line file at `path` on `storage`; empty when there is none. A last line
/// without its newline is a write a crash cut short, and is left out: cut anywhere, it may still
/// look like a whole line with other values (an entry ID missing its last digits). Bytes that are
/// not UTF-8 are replaced, so a damaged line is skipped by its reader like a malformed one.
pub(crate) fn read_lines(storage: &dyn Storage, path: &Path) -> Result<String, IndexError> {
    match storage.read(path) {
        Ok(bytes) => Ok(String::from_utf8_lossy(&bytes[..whole_lines_len(&bytes)]).into_owned()),
        Err(cause) if cause.kind() == io::ErrorKind::NotFound => Ok(String::new()),
        Err(cause) => Err(IndexError::new(path, cause)),
    }
}

impl LineFile {
    /// The file at `path` on `storage`; nothing is opened until the first append.
    pub(crate) fn new(storage: Arc<dyn Storage>, path: &Path) -> Self {
        Self { path: path.to_owned(), storage, open: None }
    }

    /// Appends `text` (whole lines) at the end of the file, creating it when missing. Durable once
    /// [`Self::sync_target`]'s sync returns. After a failed write the handle is dropped, so the
    /// next append opens the file again.
    pub(crate) fn append(&mut self, text: &str) -> Result<(), IndexError> {
        let open = match &mut self.open {
            Some(open) => open,
            None => {
                let handle =
                    open_at_a_line_start(&*self.storage, &self.path).map_err(|cause| self.error(cause))?;
                let shared = handle.shared_sync();
                self.open.insert(OpenLines { handle, shared })
            }
        };
        open.handle.append(text.as_bytes()).map_err(|cause| {
            self.open = None;
            self.error(cause)
        })
    }

    /// Replaces the whole file with `text` durably (temporary file, fsync, rename, directory
    /// fsync). The old handle names the replaced file, so it is dropped.
    pub(crate) fn replace(&mut self, text: &str) -> Result<(), IndexError> {
        self.open = None;
        replace_file(&*self.storage, &self.path, text).map_err(|cause| self.error(cause))
    }

    /// `cause`, naming this file.
    fn error(&self, cause: io::Error) -> IndexError {
        IndexError::new(&self.path, cause)
    }

    /// What makes every append so far durable.
    pub(crate) fn sync_target(&self) -> LineFileSync {
        LineFileSync {
            path: self.path.clone(),
            shared: self.open.as_ref().and_then(|open| open.shared.clone()),
        }
    }
}

impl LineFileSync {
    /// Fsyncs the file's data through the handle its appends went through, or by its path on
    /// `storage`.
    pub fn sync(&self, storage: &dyn Storage) -> io::Result<()> {
        match &self.shared {
            Some(shared) => shared.sync(),
            None => storage.sync_file(&self.path),
        }
    }
}

/// The length of the leading whole lines of `bytes`: up to and with the last newline.
fn whole_lines_len(bytes: &[u8]) -> usize {
    bytes.iter().rposition(|byte| *byte == b'\n').map_or(0, |last| last + 1)
}

/// Opens `path` for appending, after cutting off a torn last line (a write cut short by a full disk
/// or a crash), which [`read_lines`] leaves out anyway, so that the next line starts a line of its
/// own. A file it creates, or finds empty (its creation may not have been made durable), has its
/// directory fsynced too, so that the name survives a power loss along with the lines the group
/// commits make durable.
fn open_at_a_line_start(storage: &dyn Storage, path: &Path) -> io::Result<Box<dyn AppendHandle>> {
    match storage.file_len(path) {
        Ok(Some(0)) => {}
        Ok(_) => {
            let bytes = storage.read(path)?;
            let whole = whole_lines_len(&bytes);
            if whole < bytes.len() {
                storage.truncate(path, whole as u64)?;
            }
            return storage.open_append(path);
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(error) => return Err(error),
    }
    let handle = storage.open_append(path)?;
    sync_parent(storage, path)?;
    Ok(handle)
}

/// Replaces the file at `path` with `text` durably: a temporary file, synced, renamed over it, and
/// the directory synced, so a crash leaves the old file or the whole new one.
fn replace_file(storage: &dyn Storage, path: &Path, text: &str) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    storage.write_file(&tmp, text.as_bytes())?;
    storage.sync_file(&tmp)?;
    storage.rename(&tmp, path)?;
    sync_parent(storage, path)
}

/// Fsyncs the directory holding `path`, making a create or rename there durable.
fn sync_parent(storage: &dyn Storage, path: &Path) -> io::Result<()> {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => storage.sync_dir(dir),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::journal::StdStorage;
    use crate::journal::sim::{Fault, OpKind, SimStorage};

    fn std_storage() -> Arc<dyn Storage> {
        Arc::new(StdStorage)
    }

    #[test]
    fn appends_go_through_one_handle_and_a_replacement_starts_a_new_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lines");
        let mut file = LineFile::new(std_storage(), &path);
        assert!(file.sync_target().shared.is_none(), "nothing is opened before the first append");
        file.append("a\n").unwrap();
        let first = file.sync_target();
        file.append("b\n").unwrap();
        let second = file.sync_target();
        assert!(Arc::ptr_eq(first.shared.as_ref().unwrap(), second.shared.as_ref().unwrap()));
        second.sync(&StdStorage).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "a\nb\n");

        file.replace("c\n").unwrap();
        assert!(file.sync_target().shared.is_none(), "the replaced file's handle is let go");
        file.sync_target().sync(&StdStorage).unwrap();
        file.append("d\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "c\nd\n", "appends land in the new file");
        // A handle taken before the replacement syncs the old file and fails nothing.
        first.sync(&StdStorage).unwrap();
    }

    #[test]
    fn a_torn_last_line_is_never_read_and_is_cut_off_before_the_next_append() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lines");
        // "msg_123" cut short would read as another, valid ID.
        std::fs::write(&path, "whole msg_1\ntorn msg_12").unwrap();
        assert_eq!(read_lines(&StdStorage, &path).unwrap(), "whole msg_1\n");
        let mut file = LineFile::new(std_storage(), &path);
        file.append("next\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "whole msg_1\nnext\n");
        // A file that ends a line is appended to as it is.
        let mut again = LineFile::new(std_storage(), &path);
        again.append("last\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "whole msg_1\nnext\nlast\n");
        assert_eq!(read_lines(&StdStorage, &path).unwrap(), "whole msg_1\nnext\nlast\n");
        std::fs::write(&path, "no newline at all").unwrap();
        assert_eq!(read_lines(&StdStorage, &path).unwrap(), "");
        assert_eq!(
            read_lines(&StdStorage, &dir.path().join("none")).unwrap(),
            "",
            "a missing file has no lines"
        );
    }

    #[test]
    fn an_append_that_cannot_open_the_file_says_so_and_a_later_one_retries() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing-dir").join("lines");
        let mut file = LineFile::new(std_storage(), &path);
        let error = file.append("a\n").unwrap_err();
        assert!(error.to_string().contains("missing-dir"), "{error}");
        assert!(file.sync_target().shared.is_none());
        std::fs::create_dir(dir.path().join("missing-dir")).unwrap();
        file.append("b\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "b\n");
    }

    /// Lines committed through the sync target survive a simulated power loss at any moment; the
    /// created file's name does too.
    fn committed_lines_survive(commit: bool, seed: u64) -> bool {
        let sim = SimStorage::new();
        sim.create_dir_all(Path::new("/data")).unwrap();
        sim.sync_dir(Path::new("/")).unwrap();
        let path = Path::new("/data/lines");
        let mut file = LineFile::new(Arc::new(sim.clone()), path);
        file.append("first\n").unwrap();
        file.append("second\n").unwrap();
        if commit {
            file.sync_target().sync(&sim).unwrap();
        }
        sim.crash(seed);
        read_lines(&sim, path).unwrap() == "first\nsecond\n"
    }

    #[test]
    fn a_commit_makes_the_appended_lines_and_the_new_file_durable() {
        assert!(
            (0..20).all(|seed| committed_lines_survive(true, seed)),
            "committed lines survive every crash"
        );
        assert!(
            (0..20).any(|seed| !committed_lines_survive(false, seed)),
            "without the commit some crash loses them, so the commit is what kept them"
        );
    }

    #[test]
    fn a_creation_whose_directory_fsync_failed_is_made_durable_by_the_next_append() {
        for seed in 0..20 {
            let sim = SimStorage::new();
            sim.create_dir_all(Path::new("/data")).unwrap();
            sim.sync_dir(Path::new("/")).unwrap();
            let path = Path::new("/data/lines");
            let mut file = LineFile::new(Arc::new(sim.clone()), path);
            sim.set_fault(Some(Fault { kind: Some(OpKind::DirFsync), nth: 1, then_crash: false }));
            assert!(file.append("lost\n").is_err(), "the created file's directory fsync failed");
            sim.set_fault(None);
            file.append("kept\n").unwrap();
            file.sync_target().sync(&sim).unwrap();
            sim.crash(seed);
            assert_eq!(read_lines(&sim, path).unwrap(), "kept\n", "seed {seed}");
        }
    }

    #[test]
    fn storage_faults_reach_commits_and_replacements_and_name_the_file() {
        let sim = SimStorage::new();
        sim.create_dir_all(Path::new("/data")).unwrap();
        let path = Path::new("/data/lines");
        let mut file = LineFile::new(Arc::new(sim.clone()), path);
        file.append("a\n").unwrap();
        sim.set_fault(Some(Fault { kind: Some(OpKind::Fsync), nth: 1, then_crash: false }));
        assert!(file.sync_target().sync(&sim).is_err(), "the commit's fsync fails");
        sim.set_fault(Some(Fault { kind: Some(OpKind::Rename), nth: 1, then_crash: false }));
        let error = file.replace("b\n").unwrap_err();
        assert!(error.to_string().contains("/data/lines"), "{error}");
        assert_eq!(read_lines(&sim, path).unwrap(), "a\n", "a failed replacement leaves the file");
        sim.set_fault(Some(Fault { kind: Some(OpKind::Write), nth: 1, then_crash: false }));
        assert!(file.append("c\n").is_err());
        sim.set_fault(None);
        file.append("d\n").unwrap();
        assert_eq!(read_lines(&sim, path).unwrap(), "a\nd\n", "the next append opens the file again");
    }
}

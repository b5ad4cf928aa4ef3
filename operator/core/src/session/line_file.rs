//! An append-only file of index lines beside the journal: kept open between appends, replaced
//! whole by an atomic rename, and fsynced by a group commit through the descriptor it was written
//! through.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::journal::Storage;
use crate::session::transparent::IndexError;

/// A line file and, once something was appended, the descriptor appends go through.
#[derive(Debug)]
pub(crate) struct LineFile {
    path: PathBuf,
    open: Option<Arc<File>>,
}

/// What a group commit fsyncs for a line file: the descriptor the appends went through, or the
/// file by its path when no descriptor is open (nothing appended since the file was replaced).
#[derive(Debug, Clone)]
pub struct LineFileSync {
    /// The file, named in errors.
    pub path: PathBuf,
    file: Option<Arc<File>>,
}

impl LineFile {
    /// The file at `path`; nothing is opened until the first append.
    pub(crate) fn new(path: &Path) -> Self {
        Self { path: path.to_owned(), open: None }
    }

    /// Appends `text` (whole lines) at the end of the file, creating it when missing. Durable once
    /// [`Self::sync_target`]'s sync returns. After a failed write the descriptor is dropped, so the
    /// next append opens the file again.
    pub(crate) fn append(&mut self, text: &str) -> Result<(), IndexError> {
        let file = match &self.open {
            Some(file) => Arc::clone(file),
            None => {
                let file = Arc::new(open_at_a_line_start(&self.path).map_err(|cause| self.error(cause))?);
                self.open = Some(Arc::clone(&file));
                file
            }
        };
        (&*file).write_all(text.as_bytes()).map_err(|cause| {
            self.open = None;
            self.error(cause)
        })
    }

    /// Replaces the whole file with `text` durably (temporary file, fsync, rename, directory
    /// fsync). The old descriptor names the replaced file, so it is dropped.
    pub(crate) fn replace(&mut self, text: &str) -> Result<(), IndexError> {
        self.open = None;
        replace_file(&self.path, text).map_err(|cause| self.error(cause))
    }

    /// `cause`, naming this file.
    fn error(&self, cause: std::io::Error) -> IndexError {
        IndexError::new(&self.path, cause)
    }

    /// What makes every append so far durable.
    pub(crate) fn sync_target(&self) -> LineFileSync {
        LineFileSync { path: self.path.clone(), file: self.open.clone() }
    }
}

impl LineFileSync {
    /// Fsyncs the file's data through its open descriptor (an append-only file needs no more
    /// than `fdatasync`: its length is data), or by its path on `storage`.
    pub fn sync(&self, storage: &dyn Storage) -> std::io::Result<()> {
        match &self.file {
            Some(file) => file.sync_data(),
            None => storage.sync_file(&self.path),
        }
    }
}

/// Opens `path` for appending, after ending a torn last line (a write cut short by a full disk or
/// a crash), so that the next line is not glued onto the fragment and lost with it when the file is
/// read. A file it creates has its directory fsynced too, so that the name survives a power loss
/// along with the lines the group commits make durable.
fn open_at_a_line_start(path: &Path) -> std::io::Result<File> {
    let options = || {
        let mut options = OpenOptions::new();
        options.read(true).append(true);
        options
    };
    let mut file = match options().create_new(true).open(path) {
        Ok(created) => {
            sync_parent(path)?;
            return Ok(created);
        }
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => options().open(path)?,
        Err(error) => return Err(error),
    };
    if file.metadata()?.len() > 0 {
        let mut last = [0u8; 1];
        file.seek(SeekFrom::End(-1))?;
        file.read_exact(&mut last)?;
        if last != *b"\n" {
            file.write_all(b"\n")?;
        }
    }
    Ok(file)
}

/// Replaces the file at `path` with `text` durably: a temporary file, synced, renamed over it, and
/// the directory synced, so a crash leaves the old file or the whole new one.
fn replace_file(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut file = File::create(&tmp)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)?;
    sync_parent(path)
}

/// Fsyncs the directory holding `path`, making a create or rename there durable.
fn sync_parent(path: &Path) -> std::io::Result<()> {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => File::open(dir)?.sync_all(),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::journal::StdStorage;

    #[test]
    fn appends_go_through_one_descriptor_and_a_replacement_starts_a_new_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lines");
        let mut file = LineFile::new(&path);
        assert!(file.sync_target().file.is_none(), "nothing is opened before the first append");
        file.append("a\n").unwrap();
        let first = file.sync_target();
        file.append("b\n").unwrap();
        let second = file.sync_target();
        assert!(Arc::ptr_eq(first.file.as_ref().unwrap(), second.file.as_ref().unwrap()));
        second.sync(&StdStorage).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "a\nb\n");

        file.replace("c\n").unwrap();
        assert!(file.sync_target().file.is_none(), "the replaced file's descriptor is let go");
        file.sync_target().sync(&StdStorage).unwrap();
        file.append("d\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "c\nd\n", "appends land in the new file");
        // A descriptor taken before the replacement syncs the old file and fails nothing.
        first.sync(&StdStorage).unwrap();
    }

    #[test]
    fn a_torn_last_line_is_ended_before_the_next_append() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lines");
        std::fs::write(&path, "whole\ntor").unwrap();
        let mut file = LineFile::new(&path);
        file.append("next\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "whole\ntor\nnext\n");
        // A file that ends a line is appended to as it is.
        let mut again = LineFile::new(&path);
        again.append("last\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "whole\ntor\nnext\nlast\n");
    }

    #[test]
    fn an_append_that_cannot_open_the_file_says_so_and_a_later_one_retries() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing-dir").join("lines");
        let mut file = LineFile::new(&path);
        assert!(file.append("a\n").is_err());
        assert!(file.sync_target().file.is_none());
        std::fs::create_dir(dir.path().join("missing-dir")).unwrap();
        file.append("b\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "b\n");
    }
}

//! The file-system seam used by the journal and the artifact store, and its `std::fs` implementation.

use std::any::Any;
use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::Arc;

/// An open append-only file.
pub trait AppendHandle: Send {
    /// Appends `data` at the end of the file (not durable until [`AppendHandle::sync`]).
    fn append(&mut self, data: &[u8]) -> io::Result<()>;
    /// Makes every appended byte durable.
    fn sync(&mut self) -> io::Result<()>;

    /// A handle that makes this file's appended bytes durable from another thread while the
    /// writer keeps appending (group commit), so a commit need not open the file by its path.
    /// `None` when the implementation has none; callers then use [`Storage::sync_file`].
    fn shared_sync(&self) -> Option<Arc<dyn SharedSync>> {
        None
    }
}

/// Makes an open file's data durable from any thread, without holding its writer.
pub trait SharedSync: Send + Sync {
    /// Makes every byte appended before the call durable.
    fn sync(&self) -> io::Result<()>;
}

/// Keeps an exclusive lock held until dropped.
pub type LockGuard = Box<dyn Any + Send + Sync>;

/// The result of trying to take an exclusive lock file.
pub enum LockOutcome {
    /// The lock is ours until the guard is dropped.
    Acquired(LockGuard),
    /// Someone else holds it; the text is what the holder wrote into the lock file.
    HeldBy(String),
}

/// All file operations the journal and artifact store perform. Durability follows POSIX: written
/// data is durable only after a file sync, and creates, renames and removals only after a sync of
/// the containing directory.
pub trait Storage: Send + Sync {
    /// Reads a whole file.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// Whether a file or directory exists.
    fn exists(&self, path: &Path) -> io::Result<bool>;
    /// Names of the entries of a directory, in no particular order.
    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>>;
    /// The size of a file in bytes; `None` for a directory. The default reads the whole file, so
    /// implementations override it.
    fn file_len(&self, path: &Path) -> io::Result<Option<u64>> {
        match self.read(path) {
            Ok(bytes) => Ok(Some(bytes.len() as u64)),
            Err(error) if error.kind() == io::ErrorKind::IsADirectory => Ok(None),
            Err(error) => Err(error),
        }
    }
    /// Creates a directory and any missing parents.
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;
    /// Creates or truncates a file and writes `data` into it.
    fn write_file(&self, path: &Path, data: &[u8]) -> io::Result<()>;
    /// Opens a file for appending, creating it when missing.
    fn open_append(&self, path: &Path) -> io::Result<Box<dyn AppendHandle>>;
    /// Shortens a file to `len` bytes.
    fn truncate(&self, path: &Path, len: u64) -> io::Result<()>;
    /// Makes a file's data durable.
    fn sync_file(&self, path: &Path) -> io::Result<()>;
    /// Makes a directory's entries (creates, renames, removals) durable.
    fn sync_dir(&self, path: &Path) -> io::Result<()>;
    /// Atomically renames a file, replacing any file at `to`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Removes a file.
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// Removes an empty directory.
    fn remove_dir(&self, path: &Path) -> io::Result<()>;
    /// Tries to take an exclusive lock on `path` without blocking; on success writes `holder` into
    /// the file so that a refused contender can say who holds it.
    fn try_lock(&self, path: &Path, holder: &str) -> io::Result<LockOutcome>;
}

/// [`Storage`] on the real file system.
#[derive(Debug, Clone, Copy, Default)]
pub struct StdStorage;

struct StdAppendHandle {
    file: File,
    /// A duplicate of `file`'s descriptor for group commits; `None` if duplicating failed.
    shared: Option<Arc<SharedFile>>,
}

impl AppendHandle for StdAppendHandle {
    fn append(&mut self, data: &[u8]) -> io::Result<()> {
        self.file.write_all(data)
    }

    fn sync(&mut self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn shared_sync(&self) -> Option<Arc<dyn SharedSync>> {
        self.shared.clone().map(|shared| shared as Arc<dyn SharedSync>)
    }
}

/// A duplicated descriptor of an append-only file: syncing it syncs the same open file.
struct SharedFile(File);

impl SharedSync for SharedFile {
    fn sync(&self) -> io::Result<()> {
        self.0.sync_data()
    }
}

impl Storage for StdStorage {
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        fs::read(path)
    }

    fn exists(&self, path: &Path) -> io::Result<bool> {
        path.try_exists()
    }

    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for item in fs::read_dir(path)? {
            if let Ok(name) = item?.file_name().into_string() {
                names.push(name);
            }
        }
        Ok(names)
    }

    fn file_len(&self, path: &Path) -> io::Result<Option<u64>> {
        let meta = fs::metadata(path)?;
        Ok((!meta.is_dir()).then_some(meta.len()))
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        fs::create_dir_all(path)
    }

    fn write_file(&self, path: &Path, data: &[u8]) -> io::Result<()> {
        fs::write(path, data)
    }

    fn open_append(&self, path: &Path) -> io::Result<Box<dyn AppendHandle>> {
        let file = OpenOptions::new().append(true).create(true).open(path)?;
        // Without a duplicate, group commits fall back to opening the file by its path.
        let shared = file.try_clone().ok().map(|copy| Arc::new(SharedFile(copy)));
        Ok(Box::new(StdAppendHandle { file, shared }))
    }

    fn truncate(&self, path: &Path, len: u64) -> io::Result<()> {
        OpenOptions::new().write(true).open(path)?.set_len(len)
    }

    fn sync_file(&self, path: &Path) -> io::Result<()> {
        File::open(path)?.sync_all()
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        File::open(path)?.sync_all()
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn remove_dir(&self, path: &Path) -> io::Result<()> {
        fs::remove_dir(path)
    }

    fn try_lock(&self, path: &Path, holder: &str) -> io::Result<LockOutcome> {
        let mut file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
        match file.try_lock() {
            Ok(()) => {
                file.set_len(0)?;
                file.seek(SeekFrom::Start(0))?;
                file.write_all(holder.as_bytes())?;
                file.sync_data()?;
                Ok(LockOutcome::Acquired(Box::new(file)))
            }
            Err(TryLockError::WouldBlock) => {
                let mut text = String::new();
                file.read_to_string(&mut text)?;
                Ok(LockOutcome::HeldBy(text))
            }
            Err(TryLockError::Error(error)) => Err(error),
        }
    }
}

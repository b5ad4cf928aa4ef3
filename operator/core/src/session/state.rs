//! The engine's small state files (calibration, tool order, elisions, expirations): JSON under
//! `gateway/` in the data directory, or nowhere for an in-memory session.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::engine::EngineError;
use crate::journal::Storage;

/// Where state files live.
#[derive(Clone)]
pub struct StateDir {
    dir: Option<(PathBuf, Arc<dyn Storage>)>,
}

impl std::fmt::Debug for StateDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateDir").field("dir", &self.dir.as_ref().map(|(dir, _)| dir)).finish()
    }
}

fn state_error(path: &Path, reason: impl ToString) -> EngineError {
    EngineError::State { path: path.to_owned(), reason: reason.to_string() }
}

/// A state file that could not be parsed and was started afresh.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorruptState {
    /// The file.
    pub path: PathBuf,
    /// Why it could not be parsed.
    pub reason: String,
}

impl std::fmt::Display for CorruptState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "state file {} is corrupt ({}); it starts afresh and is rebuilt from the journal and the next requests",
            self.path.display(),
            self.reason
        )
    }
}

impl StateDir {
    /// State files under `dir` on `storage` (created when missing).
    pub fn on_disk(storage: Arc<dyn Storage>, dir: PathBuf) -> Result<Self, EngineError> {
        storage.create_dir_all(&dir).map_err(|error| state_error(&dir, error))?;
        if let Some(parent) = dir.parent() {
            storage
                .sync_dir(parent)
                .map_err(|error| state_error(parent, format!("fsync directory: {error}")))?;
        }
        Ok(StateDir { dir: Some((dir, storage)) })
    }

    /// No persistence (replay).
    pub fn in_memory() -> Self {
        StateDir { dir: None }
    }

    /// Reads state file `name`: absent gives the default; unparsable gives the default and says so
    /// (a torn or damaged state file never stops the gateway: every state file is derived data).
    pub fn read<T: DeserializeOwned + Default>(
        &self,
        name: &str,
    ) -> Result<(T, Option<CorruptState>), EngineError> {
        let Some((dir, storage)) = &self.dir else { return Ok((T::default(), None)) };
        let path = dir.join(name);
        match storage.read(&path) {
            Ok(bytes) => match serde_json::from_slice(&bytes) {
                Ok(value) => Ok((value, None)),
                Err(error) => Ok((T::default(), Some(CorruptState { path, reason: error.to_string() }))),
            },
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok((T::default(), None)),
            Err(error) => Err(state_error(&path, error)),
        }
    }

    /// Replaces state file `name` durably: write a temporary file, fsync it, rename it over the
    /// old one, fsync the directory. A crash leaves the old file or the new one, never a torn one.
    pub fn write<T: Serialize>(&self, name: &str, value: &T) -> Result<(), EngineError> {
        let Some((dir, storage)) = &self.dir else { return Ok(()) };
        let path = dir.join(name);
        let bytes = serde_json::to_vec(value).map_err(|error| state_error(&path, error))?;
        let tmp = path.with_extension("tmp");
        storage.write_file(&tmp, &bytes).map_err(|error| state_error(&tmp, format!("write: {error}")))?;
        storage.sync_file(&tmp).map_err(|error| state_error(&tmp, format!("fsync: {error}")))?;
        storage.rename(&tmp, &path).map_err(|error| state_error(&path, format!("rename: {error}")))?;
        storage.sync_dir(dir).map_err(|error| state_error(dir, format!("fsync directory: {error}")))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::journal::sim::SimStorage;

    #[test]
    fn writes_are_durable_and_corrupt_files_start_afresh() {
        let storage = Arc::new(SimStorage::new());
        let state = StateDir::on_disk(storage.clone(), PathBuf::from("/data/gateway")).unwrap();
        storage.sync_dir(Path::new("/")).unwrap();
        state.write("elided.json", &vec![1u32, 2, 3]).unwrap();
        storage.crash(7);
        let (read, corrupt): (Vec<u32>, _) = state.read("elided.json").unwrap();
        assert_eq!((read, corrupt), (vec![1, 2, 3], None), "the write survives a crash");
        storage.write_file(Path::new("/data/gateway/elided.json"), b"[1, 2, 3").unwrap();
        let (read, corrupt): (Vec<u32>, _) = state.read("elided.json").unwrap();
        assert!(read.is_empty());
        let corrupt = corrupt.unwrap();
        assert_eq!(corrupt.path, Path::new("/data/gateway/elided.json"));
        assert!(corrupt.to_string().contains("rebuilt from the journal"), "{corrupt}");
    }
}

//! The engine's small state files (calibration, tool order, elisions, expirations): JSON under
//! `gateway/` in the data directory, or nowhere for an in-memory session.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::engine::EngineError;

/// Where state files live.
#[derive(Debug, Clone)]
pub struct StateDir {
    dir: Option<PathBuf>,
}

fn state_error(path: &Path, reason: impl ToString) -> EngineError {
    EngineError::State { path: path.to_owned(), reason: reason.to_string() }
}

impl StateDir {
    /// State files under `dir` (created when missing).
    pub fn on_disk(dir: PathBuf) -> Result<Self, EngineError> {
        std::fs::create_dir_all(&dir).map_err(|error| state_error(&dir, error))?;
        Ok(StateDir { dir: Some(dir) })
    }

    /// No persistence (replay).
    pub fn in_memory() -> Self {
        StateDir { dir: None }
    }

    /// The path of state file `name`, when persisted.
    pub fn path(&self, name: &str) -> Option<PathBuf> {
        self.dir.as_ref().map(|dir| dir.join(name))
    }

    /// Reads state file `name` (absent: the default).
    pub fn read<T: DeserializeOwned + Default>(&self, name: &str) -> Result<T, EngineError> {
        let Some(path) = self.path(name) else { return Ok(T::default()) };
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|error| state_error(&path, error)),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(T::default()),
            Err(error) => Err(state_error(&path, error)),
        }
    }

    /// Replaces state file `name` atomically.
    pub fn write<T: Serialize>(&self, name: &str, value: &T) -> Result<(), EngineError> {
        let Some(path) = self.path(name) else { return Ok(()) };
        let bytes = serde_json::to_vec(value).map_err(|error| state_error(&path, error))?;
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, bytes).map_err(|error| state_error(&tmp, error))?;
        std::fs::rename(&tmp, &path).map_err(|error| state_error(&path, error))
    }
}

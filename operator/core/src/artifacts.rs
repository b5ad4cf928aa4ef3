//! Content-addressed, tenant-scoped artifact store on the volume: `artifacts/<tenant>/<aa>/<sha256>`.
//!
//! Writes go to a temporary file that is fsynced and renamed into place, then the directory is
//! fsynced, so an artifact is either absent or complete. Reads re-hash the bytes, so on-disk
//! corruption is reported (naming the file) instead of being served. There is no cross-tenant
//! deduplication: the same bytes put by two tenants are stored twice.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};

use crate::journal::Storage;

const REF_PREFIX: &str = "art:sha256:";

/// A reference to an artifact: `art:sha256:<64 lower-case hex digits>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ArtifactRef {
    digest_hex: String,
}

impl ArtifactRef {
    /// The reference for `bytes`.
    pub fn for_bytes(bytes: &[u8]) -> Self {
        Self { digest_hex: hex::encode(Sha256::digest(bytes)) }
    }

    /// The SHA-256 digest in lower-case hex.
    pub fn digest_hex(&self) -> &str {
        &self.digest_hex
    }
}

impl fmt::Display for ArtifactRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{REF_PREFIX}{}", self.digest_hex)
    }
}

impl FromStr for ArtifactRef {
    type Err = ArtifactError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let digest = input
            .strip_prefix(REF_PREFIX)
            .filter(|d| d.len() == 64 && d.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
            .ok_or_else(|| ArtifactError::InvalidRef { input: input.to_owned() })?;
        Ok(Self { digest_hex: digest.to_owned() })
    }
}

impl Serialize for ArtifactRef {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ArtifactRef {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer)?.parse().map_err(serde::de::Error::custom)
    }
}

/// Artifact store failures.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    /// The tenant name could escape or collide in the directory tree.
    #[error("invalid tenant name {tenant:?}: {reason}")]
    InvalidTenant {
        /// The rejected name.
        tenant: String,
        /// Why.
        reason: &'static str,
    },
    /// Not an `art:sha256:<hex>` reference.
    #[error("invalid artifact reference {input:?}")]
    InvalidRef {
        /// The rejected text.
        input: String,
    },
    /// No such artifact for this tenant.
    #[error("artifact not found: {path}")]
    NotFound {
        /// Where it would be.
        path: PathBuf,
    },
    /// The artifact was deleted by the volume's retention policy (the artifact sweeper).
    #[error(
        "{data_ref} expired by retention policy: the artifact sweeper deleted it at {swept_at} (volume.artifacts \
         maxAgeSeconds/maxBytes); it can no longer be read"
    )]
    Expired {
        /// The reference asked for.
        data_ref: String,
        /// When it was deleted, RFC 3339.
        swept_at: String,
    },
    /// Stored bytes do not hash to their name.
    #[error("{path}: artifact is corrupt: content hashes to {actual}")]
    Corrupt {
        /// The damaged file.
        path: PathBuf,
        /// The digest of what is stored.
        actual: String,
    },
    /// The search pattern is not a valid regular expression.
    #[error("invalid search pattern {pattern:?}: {source}")]
    BadPattern {
        /// The pattern.
        pattern: String,
        /// The regex error.
        source: regex::Error,
    },
    /// An I/O operation failed.
    #[error("{operation} {path}: {source}")]
    Io {
        /// The operation.
        operation: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
}

fn io_error(operation: &'static str, path: &Path) -> impl FnOnce(io::Error) -> ArtifactError + use<> {
    let path = path.to_path_buf();
    move |source| ArtifactError::Io { operation, path, source }
}

/// A line that matched a search.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchMatch {
    /// 1-based line number.
    pub line_number: usize,
    /// The line, without its terminator.
    pub line: String,
}

/// Checks that a tenant name is a single safe path component.
pub fn validate_tenant(tenant: &str) -> Result<(), ArtifactError> {
    let reject = |reason| Err(ArtifactError::InvalidTenant { tenant: tenant.to_owned(), reason });
    if tenant.is_empty() {
        return reject("empty");
    }
    if tenant.len() > 253 {
        return reject("longer than 253 bytes");
    }
    if tenant.starts_with('.') {
        return reject("starts with '.' (covers '.' and '..')");
    }
    if !tenant.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')) {
        return reject("only ASCII letters, digits, '-', '_' and '.' are allowed");
    }
    Ok(())
}

/// The artifact store rooted at a directory (conventionally `<data dir>/artifacts`).
pub struct ArtifactStore {
    storage: Arc<dyn Storage>,
    root: PathBuf,
    temp_counter: AtomicU64,
    /// Digests the sweeper deleted, with when (unix ms), so a read says why it is gone.
    swept: Mutex<HashMap<String, u64>>,
}

impl fmt::Debug for ArtifactStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ArtifactStore").field("root", &self.root).finish_non_exhaustive()
    }
}

impl ArtifactStore {
    /// A store rooted at `root`; directories are created on first put.
    pub fn new(storage: Arc<dyn Storage>, root: impl Into<PathBuf>) -> Self {
        Self { storage, root: root.into(), temp_counter: AtomicU64::new(0), swept: Mutex::default() }
    }

    /// The root directory (`<data dir>/artifacts`).
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn swept_registry(&self) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
        // The map is only ever inserted into or removed from: a panic elsewhere leaves it whole.
        self.swept.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records that the sweeper deleted the artifact with this digest at `at_ms`, so reading it
    /// answers [`ArtifactError::Expired`] instead of "not found".
    pub fn mark_swept(&self, digest_hex: &str, at_ms: u64) {
        self.swept_registry().insert(digest_hex.to_owned(), at_ms);
    }

    /// When the artifact was swept, if it was (and not stored again since).
    pub fn swept_at(&self, artifact: &ArtifactRef) -> Option<u64> {
        self.swept_registry().get(artifact.digest_hex()).copied()
    }

    /// Where an artifact of `tenant` lives.
    pub fn path_of(&self, tenant: &str, artifact: &ArtifactRef) -> Result<PathBuf, ArtifactError> {
        validate_tenant(tenant)?;
        let digest = artifact.digest_hex();
        Ok(self.root.join(tenant).join(&digest[..2]).join(digest))
    }

    /// Stores `bytes` for `tenant` durably and returns its reference. Idempotent: storing the same
    /// bytes again leaves the intact copy alone (a corrupt copy is replaced).
    pub fn put(&self, tenant: &str, bytes: &[u8]) -> Result<ArtifactRef, ArtifactError> {
        let artifact = ArtifactRef::for_bytes(bytes);
        let path = self.path_of(tenant, &artifact)?;
        if self.storage.exists(&path).map_err(io_error("stat", &path))? && self.get(tenant, &artifact).is_ok()
        {
            return Ok(artifact);
        }
        let shard = path.parent().unwrap_or(&self.root).to_path_buf();
        self.create_dirs_durably(&shard)?;
        let serial = self.temp_counter.fetch_add(1, Ordering::Relaxed);
        let tmp = shard.join(format!(".{}.tmp-{}-{serial}", artifact.digest_hex(), std::process::id()));
        self.storage.write_file(&tmp, bytes).map_err(io_error("write", &tmp))?;
        self.storage.sync_file(&tmp).map_err(io_error("fsync", &tmp))?;
        self.storage.rename(&tmp, &path).map_err(io_error("rename", &path))?;
        self.storage.sync_dir(&shard).map_err(io_error("fsync directory", &shard))?;
        self.swept_registry().remove(artifact.digest_hex());
        Ok(artifact)
    }

    /// Creates `dir` and any missing ancestors, fsyncing the parent of each one created so the new
    /// directory entries survive a crash.
    fn create_dirs_durably(&self, dir: &Path) -> Result<(), ArtifactError> {
        let mut missing = Vec::new();
        let mut cursor = Some(dir);
        while let Some(candidate) = cursor.filter(|c| !c.as_os_str().is_empty()) {
            if self.storage.exists(candidate).map_err(io_error("stat", candidate))? {
                break;
            }
            missing.push(candidate.to_path_buf());
            cursor = candidate.parent();
        }
        if missing.is_empty() {
            return Ok(());
        }
        self.storage.create_dir_all(dir).map_err(io_error("create directory", dir))?;
        for created in missing.iter().rev() {
            if let Some(parent) = created.parent().filter(|p| !p.as_os_str().is_empty()) {
                self.storage.sync_dir(parent).map_err(io_error("fsync directory", parent))?;
            }
        }
        Ok(())
    }

    /// The exact bytes of an artifact, verified against its hash.
    pub fn get(&self, tenant: &str, artifact: &ArtifactRef) -> Result<Vec<u8>, ArtifactError> {
        let path = self.path_of(tenant, artifact)?;
        if !self.storage.exists(&path).map_err(io_error("stat", &path))? {
            if let Some(at_ms) = self.swept_at(artifact) {
                return Err(ArtifactError::Expired {
                    data_ref: artifact.to_string(),
                    swept_at: crate::compaction::rfc3339(at_ms),
                });
            }
            return Err(ArtifactError::NotFound { path });
        }
        let bytes = self.storage.read(&path).map_err(io_error("read", &path))?;
        let actual = hex::encode(Sha256::digest(&bytes));
        if actual != artifact.digest_hex() {
            return Err(ArtifactError::Corrupt { path, actual });
        }
        Ok(bytes)
    }

    /// At most the first `max_lines` lines, cut to at most `max_chars` characters in total.
    pub fn head(
        &self,
        tenant: &str,
        artifact: &ArtifactRef,
        max_lines: usize,
        max_chars: usize,
    ) -> Result<String, ArtifactError> {
        let bytes = self.get(tenant, artifact)?;
        let text = String::from_utf8_lossy(&bytes);
        let mut end = 0;
        for (index, line) in text.split_inclusive('\n').enumerate() {
            if index >= max_lines {
                break;
            }
            end += line.len();
        }
        Ok(text[..end].chars().take(max_chars).collect())
    }

    /// Up to `len` bytes starting at byte `offset` (empty past the end).
    pub fn slice(
        &self,
        tenant: &str,
        artifact: &ArtifactRef,
        offset: usize,
        len: usize,
    ) -> Result<Vec<u8>, ArtifactError> {
        let bytes = self.get(tenant, artifact)?;
        let start = offset.min(bytes.len());
        let end = start.saturating_add(len).min(bytes.len());
        Ok(bytes[start..end].to_vec())
    }

    /// Lines matching the regular expression `pattern`, at most `max_matches`, with 1-based line
    /// numbers.
    pub fn search(
        &self,
        tenant: &str,
        artifact: &ArtifactRef,
        pattern: &str,
        max_matches: usize,
    ) -> Result<Vec<SearchMatch>, ArtifactError> {
        let regex = regex::Regex::new(pattern)
            .map_err(|source| ArtifactError::BadPattern { pattern: pattern.to_owned(), source })?;
        let bytes = self.get(tenant, artifact)?;
        let text = String::from_utf8_lossy(&bytes);
        Ok(text
            .lines()
            .enumerate()
            .filter(|(_, line)| regex.is_match(line))
            .take(max_matches)
            .map(|(index, line)| SearchMatch { line_number: index + 1, line: line.to_owned() })
            .collect())
    }
}

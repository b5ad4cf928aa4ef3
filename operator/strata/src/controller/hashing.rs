//! Content hashes of desired objects: the `strata.dev/spec-hash` that lets a reconcile skip writes.

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::controller::error::{Error, Result};

/// sha256 (hex) of `value`'s JSON. Struct fields serialise in declaration order and maps are
/// sorted (BTreeMap), so equal values give equal hashes.
pub fn json_sha256<T: Serialize>(value: &T, what: &str) -> Result<String> {
    let bytes = serde_json::to_vec(value).map_err(|source| Error::Serialize { what: what.into(), source })?;
    Ok(hex::encode(Sha256::digest(&bytes)))
}

/// The first `chars` characters of a hex digest.
pub fn short(hash: &str, chars: usize) -> &str {
    hash.get(..chars).unwrap_or(hash)
}

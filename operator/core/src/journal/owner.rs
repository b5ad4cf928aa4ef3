//! The journal's owner: `<data>/OWNER` records the UID of the Agent whose journal this is, so that a
//! new Agent that happens to get an old volume (same name, a retained claim) never serves another
//! agent's history unless it adopts it on purpose.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::storage::Storage;

/// File name of the owner record in the data directory.
pub const OWNER_FILE: &str = "OWNER";

/// The owner record, JSON in `<data>/OWNER`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JournalOwner {
    /// `metadata.uid` of the Agent.
    pub agent_uid: String,
    /// `<namespace>/<name>` of the Agent, for people reading the error.
    pub agent: String,
    /// When this Agent became the owner (unix milliseconds).
    pub bound_at_ms: u64,
    /// The UID this Agent adopted the journal from, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adopted_from_uid: Option<String>,
}

/// Who asks to use the journal.
#[derive(Clone, Copy, Debug)]
pub struct Claimant<'a> {
    /// `metadata.uid` of the Agent.
    pub agent_uid: &'a str,
    /// `<namespace>/<name>` of the Agent.
    pub agent: &'a str,
    /// An earlier Agent's UID whose journal this Agent may take over (on purpose).
    pub adopt_from_uid: Option<&'a str>,
    /// Now (unix milliseconds).
    pub now_ms: u64,
}

/// How the journal came to be bound to the claimant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Binding {
    /// The data directory had no journal: it is this Agent's from now on.
    Created,
    /// The journal already belonged to this Agent.
    Owned,
    /// The journal had no owner record (written before owners were recorded): claimed.
    Claimed,
    /// The journal belonged to the Agent `from` and was adopted on purpose.
    Adopted {
        /// The previous owner's UID.
        from: String,
    },
}

/// Why the claimant may not use the journal.
#[derive(Debug, thiserror::Error)]
pub enum OwnerError {
    /// The journal belongs to another Agent.
    #[error(
        "the journal in {dir} belongs to Agent {} (uid {}), not to this Agent (uid {claimant}): refusing to serve another agent's history. Delete the claim to start empty, or adopt the journal on purpose by annotating the Agent strata.dev/adopt-journal-from-uid={}",
        .owner.agent, .owner.agent_uid, .owner.agent_uid
    )]
    Foreign {
        /// The data directory.
        dir: PathBuf,
        /// Its recorded owner.
        owner: Box<JournalOwner>,
        /// The claimant's UID.
        claimant: String,
    },
    /// The owner record is not valid JSON of the expected shape.
    #[error(
        "{path} is not a valid owner record ({message}); restore it or remove it to let this Agent claim the journal"
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The parse error.
        message: String,
    },
    /// Reading or writing the owner record failed.
    #[error("{operation} {path}: {source}")]
    Io {
        /// What was attempted.
        operation: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// Bind the journal in `dir` to `claimant`: record it as the owner of a new or unowned journal, take
/// over one whose owner is `claimant.adopt_from_uid`, and refuse one owned by any other Agent.
/// Call before opening the journal; `dir` may not exist yet.
pub fn bind_owner(storage: &dyn Storage, dir: &Path, claimant: Claimant<'_>) -> Result<Binding, OwnerError> {
    let path = dir.join(OWNER_FILE);
    let io = |operation: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| OwnerError::Io { operation, path, source }
    };
    let existing = if storage.exists(&path).map_err(io("check", &path))? {
        let bytes = storage.read(&path).map_err(io("read", &path))?;
        let owner: JournalOwner = serde_json::from_slice(&bytes)
            .map_err(|e| OwnerError::Corrupt { path: path.clone(), message: e.to_string() })?;
        Some(owner)
    } else {
        None
    };
    let binding = match existing {
        Some(owner) if owner.agent_uid == claimant.agent_uid => return Ok(Binding::Owned),
        Some(owner) if claimant.adopt_from_uid == Some(owner.agent_uid.as_str()) => {
            Binding::Adopted { from: owner.agent_uid }
        }
        Some(owner) => {
            return Err(OwnerError::Foreign {
                dir: dir.to_path_buf(),
                owner: Box::new(owner),
                claimant: claimant.agent_uid.to_string(),
            });
        }
        None if has_journal(storage, dir) => Binding::Claimed,
        None => Binding::Created,
    };
    let adopted_from_uid = match &binding {
        Binding::Adopted { from } => Some(from.clone()),
        _ => None,
    };
    let record = JournalOwner {
        agent_uid: claimant.agent_uid.to_string(),
        agent: claimant.agent.to_string(),
        bound_at_ms: claimant.now_ms,
        adopted_from_uid,
    };
    write_owner(storage, dir, &record)?;
    Ok(binding)
}

/// The owner record of the journal in `dir`, if it has one.
pub fn read_owner(storage: &dyn Storage, dir: &Path) -> Result<Option<JournalOwner>, OwnerError> {
    let path = dir.join(OWNER_FILE);
    match storage.read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| OwnerError::Corrupt { path, message: e.to_string() }),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(OwnerError::Io { operation: "read", path, source }),
    }
}

fn has_journal(storage: &dyn Storage, dir: &Path) -> bool {
    storage.exists(&dir.join("CURRENT")).unwrap_or(false)
}

fn write_owner(storage: &dyn Storage, dir: &Path, owner: &JournalOwner) -> Result<(), OwnerError> {
    let path = dir.join(OWNER_FILE);
    let tmp = dir.join(format!("{OWNER_FILE}.tmp"));
    let io = |operation: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| OwnerError::Io { operation, path, source }
    };
    let bytes = serde_json::to_vec_pretty(owner).map_err(|e| OwnerError::Corrupt {
        path: path.clone(),
        message: format!("serialising the owner record: {e}"),
    })?;
    storage.create_dir_all(dir).map_err(io("create", dir))?;
    storage.write_file(&tmp, &bytes).map_err(io("write", &tmp))?;
    storage.sync_file(&tmp).map_err(io("sync", &tmp))?;
    storage.rename(&tmp, &path).map_err(io("rename into place", &path))?;
    storage.sync_dir(dir).map_err(io("sync", dir))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::journal::StdStorage;

    fn claimant<'a>(uid: &'a str, adopt: Option<&'a str>) -> Claimant<'a> {
        Claimant { agent_uid: uid, agent: "rateright/builder", adopt_from_uid: adopt, now_ms: 7 }
    }

    #[test]
    fn a_journal_is_bound_to_the_agent_that_created_it_and_refused_to_any_other() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        assert_eq!(bind_owner(&StdStorage, &data, claimant("uid-a", None)).unwrap(), Binding::Created);
        assert_eq!(bind_owner(&StdStorage, &data, claimant("uid-a", None)).unwrap(), Binding::Owned);
        let error = bind_owner(&StdStorage, &data, claimant("uid-b", None)).unwrap_err();
        let text = error.to_string();
        assert!(matches!(error, OwnerError::Foreign { .. }));
        assert!(text.contains("belongs to Agent rateright/builder (uid uid-a)"), "{text}");
        assert!(text.contains("strata.dev/adopt-journal-from-uid=uid-a"), "{text}");
        assert_eq!(
            read_owner(&StdStorage, &data).unwrap().unwrap().agent_uid,
            "uid-a",
            "a refusal changes nothing"
        );
        // Adopting names the previous owner; anything else is still refused.
        assert!(bind_owner(&StdStorage, &data, claimant("uid-b", Some("uid-z"))).is_err());
        let adopted = bind_owner(&StdStorage, &data, claimant("uid-b", Some("uid-a"))).unwrap();
        assert_eq!(adopted, Binding::Adopted { from: "uid-a".into() });
        let owner = read_owner(&StdStorage, &data).unwrap().unwrap();
        assert_eq!((owner.agent_uid.as_str(), owner.adopted_from_uid.as_deref()), ("uid-b", Some("uid-a")));
        assert!(bind_owner(&StdStorage, &data, claimant("uid-a", None)).is_err(), "the old owner lost it");
    }

    #[test]
    fn a_journal_from_before_owner_records_is_claimed_and_a_corrupt_record_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("CURRENT"), "gen-000001\n").unwrap();
        assert_eq!(bind_owner(&StdStorage, dir.path(), claimant("uid-a", None)).unwrap(), Binding::Claimed);
        std::fs::write(dir.path().join(OWNER_FILE), "{not json").unwrap();
        let error = bind_owner(&StdStorage, dir.path(), claimant("uid-a", None)).unwrap_err();
        assert!(matches!(error, OwnerError::Corrupt { .. }), "{error}");
    }
}

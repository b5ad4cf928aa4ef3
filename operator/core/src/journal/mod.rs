//! The agent journal: a crash-safe, generational, append-only log of Tier-2 entries on the volume.
//!
//! See `FORMAT.md` in this directory for the on-disk layout, record framing, durability policy,
//! recovery rules and the generation-switch protocol.
//!
//! * [`Journal`] is the single writer (guarded by the `LOCK` file): [`Journal::open`] recovers,
//!   [`Journal::append`] assigns IDs, [`Journal::begin_compaction`] /
//!   [`Journal::commit_generation`] and [`Journal::rollback`] switch generations.
//! * [`read_current_generation`] / [`read_generation`] read without locking or repairing.
//! * [`propose_compaction`] lets a compaction running in another process hand its result to the
//!   writer, which commits it on [`Journal::refresh`].
//! * [`bind_owner`] binds the data directory to one Agent (by UID) before the journal is opened.
//! * All I/O goes through [`Storage`]: [`StdStorage`] on disk, [`sim::SimStorage`] in crash tests.

mod error;
mod layout;
mod owner;
mod proposal;
mod reader;
mod record;
pub mod sim;
mod storage;
mod writer;

pub use error::JournalError;
pub use layout::{GenerationOrigin, Manifest, Watermark, generation_dir_name};
pub use owner::{Binding, Claimant, JournalOwner, OWNER_FILE, OwnerError, bind_owner, read_owner};
pub use proposal::{CompactionProposal, propose_compaction};
pub use reader::{JournalView, read_current_generation, read_generation};
pub use record::{FORMAT_VERSION, TornTail};
pub use storage::{AppendHandle, LockGuard, LockOutcome, SharedSync, StdStorage, Storage};
pub use writer::{
    BaselineEntry, GenerationSwitch, Journal, JournalOptions, OpenReport, Snapshot, SyncPolicy,
    TruncatedTail, describe_holder,
};

//! Large tool outputs: spilling to the artifact store, reading them back, and eliding old ones.
//!
//! * [`spill()`] keeps an oversized tool result out of the window: the full text goes to the
//!   artifact store and the window gets a deterministic preview plus a marker line naming the
//!   `data_ref`.
//! * [`read_output`] (module [`read`]) implements the model tool `strata_read_output` (head, slice
//!   or search of a stored output), with bounded answers.
//! * [`plan_elision`] (module [`elide`]) plans cache-aware, batched elision of old large tool
//!   results; [`elide_entry`] stores and renders them.

pub mod elide;
pub mod error;
pub mod read;
pub mod spill;
mod text;

pub use elide::{
    ElisionBatch, ElisionCandidates, ElisionPolicy, elide_entry, has_elidable_output, plan_elision,
    plan_elision_among, render_elided, rounds_after,
};
pub use error::{ReadArgsError, ToolOutputError};
pub use read::{READ_OUTPUT_TOOL_NAME, ReadRequest, read_output};
pub use spill::{SpillOutcome, SpillPolicy, spill};

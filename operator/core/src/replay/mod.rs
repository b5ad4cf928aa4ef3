//! Replay: recorded agent sessions run through the context engine under several context policies,
//! with every model call priced the way providers bill prefix caching.
//!
//! Pure: the caller reads files and renders reports. `strata replay` is the command around it.

pub mod formats;
pub mod param_sweep;
pub mod policies;
pub mod pricing;
pub mod readback;
pub mod simulate;
pub mod synthetic;
pub mod tool_set;

pub mod transcript;
pub mod volume;

pub use formats::{FormatError, InputFormat, parse_transcript};
pub use policies::{PolicyKind, PolicySettings};
pub use pricing::{Provider, ProviderCache};
pub use simulate::{CallRecord, PolicyReport, ReplayOptions, SessionReport, replay_session};
pub use transcript::{RecordedUsage, Transcript, TranscriptMessage};

//! The session engine: one agent's context and the only place that decides what the model sees.
//!
//! [`SessionEngine`] owns the journal, redaction, spill, deduplication, retention expiry, elision,
//! the budget and admission, the compiler, compaction and the provider body renderers. Its API is
//! the conversation: [`SessionEngine::begin_turn`] ("here is the client's request: what goes
//! upstream now?"), [`SessionEngine::record_answer`] ("here is what came back") and
//! [`SessionEngine::next_call`] for the rounds after a memory-tool call. The gateway drives it
//! over HTTP; `strata replay` drives it call by call over recorded sessions.

pub mod capabilities;
mod compacting;
mod durable;
pub mod engine;
pub mod inspect;
mod line_file;
pub mod memory_tools;
pub mod message_memo;
pub mod openai_messages;
pub mod protocol;
pub mod render;
pub mod request_body;
pub mod request_keys;
mod revocation;
pub mod settings;
mod state;
pub mod sweep;
pub mod tool_block;
pub mod tool_schema;
mod tool_splice;
pub mod transparent;
pub mod turn;

pub use compacting::{CompactionAsk, CompactionOutcome, is_superseded};
pub use durable::DurableTarget;
pub use engine::{
    AnswerEffects, ChurnCause, DigestRecord, EngineError, EntrySummary, LOWER_BUDGET_PERCENTS, Rewind,
    RewindCause, SectionSummary, SessionEngine, TurnOutcome, TurnRequest, UpstreamCall, now_ms,
};
pub use inspect::{ContextEvent, EntryDetail};
pub use line_file::LineFileSync;
pub use settings::SessionSettings;
pub use state::{CorruptState, StateDir};
pub use sweep::{
    KindSweep, LifecycleLedger, LiveGenerationAction, LiveGenerationBound, SweepReport, volume_bytes,
};
pub use turn::{Api, AssistantOutput, ChatRequest, Turn, Usage};

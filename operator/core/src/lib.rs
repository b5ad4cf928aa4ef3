//! strata-core: the Strata context engine.
//!
//! It owns the agent journal and artifact store, token counting, the canonical stable prefix,
//! the tenant-scoped cache identity and the context budget. It is pure Rust with no Kubernetes and
//! no network: the gateway, the compactor and the operator call into it.

pub mod artifacts;
pub mod budget;
pub mod cache_key;
pub mod compaction;
pub mod compiler;
pub mod dedup;
pub mod delegation;
pub mod derived;
pub mod economics;
pub mod entry;
pub mod hex_text;
pub mod history_index;
pub mod journal;
pub mod lifecycle;
pub mod prefix;
pub mod purge;
pub mod redaction;
pub mod replay;
pub mod retention;
pub mod room_ahead;
pub mod session;
pub mod tokens;
pub mod tool_output;

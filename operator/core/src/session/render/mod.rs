//! Provider request bodies built from the compiled packet: Tier 1 serialised once per prefix
//! change, Tier 2 from cached per-entry fragments, Tier 3 as a trailing message.

pub mod anthropic;
pub mod body;
pub mod fragments;
pub mod json_write;
pub mod ledger;
pub mod openai;
pub mod tier1;

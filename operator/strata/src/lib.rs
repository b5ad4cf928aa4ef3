//! The IO edge of Strata: the subcommands of the `strata` binary.

pub mod compact;
pub mod controller;
pub mod crdgen;
pub mod engine_policy;
pub mod gateway;
pub mod inspector;
pub mod logging;
pub mod plugin;
pub mod replay;

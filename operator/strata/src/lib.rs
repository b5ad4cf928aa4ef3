//! The IO edge of Strata: the subcommands of the `strata` binary.

pub mod crdgen;

//! Errors of spilling, reading and eliding tool outputs.

use crate::artifacts::{ArtifactError, ArtifactRef};

/// A tool-output operation failed in the artifact store.
#[derive(Debug, thiserror::Error)]
pub enum ToolOutputError {
    /// Storing an output failed.
    #[error("storing a {chars}-char tool output for tenant {tenant:?}: {source}")]
    Store {
        /// The tenant.
        tenant: String,
        /// Size of the output in characters.
        chars: usize,
        /// The store error.
        source: ArtifactError,
    },
    /// Reading a stored output failed.
    #[error("reading {data_ref} ({mode}) for tenant {tenant:?}: {source}")]
    Read {
        /// The tenant.
        tenant: String,
        /// The artifact.
        data_ref: ArtifactRef,
        /// The read mode.
        mode: &'static str,
        /// The store error.
        source: ArtifactError,
    },
}

/// The arguments of a `strata_read_output` call are not valid; the message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadArgsError {
    /// The arguments are not a JSON text.
    #[error("strata_read_output arguments are not valid JSON: {reason}")]
    NotJson {
        /// The parser message.
        reason: String,
    },
    /// The arguments are JSON but not an object.
    #[error("strata_read_output arguments must be a JSON object")]
    NotObject,
    /// A required field is absent.
    #[error("strata_read_output: missing required field `{field}`")]
    Missing {
        /// The field.
        field: &'static str,
    },
    /// A field has the wrong JSON type or an invalid value.
    #[error("strata_read_output: field `{field}` {problem}")]
    Invalid {
        /// The field.
        field: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A field is not used by the chosen mode or not known at all.
    #[error("strata_read_output: field `{field}` is not allowed with mode `{mode}`")]
    Unexpected {
        /// The field.
        field: String,
        /// The mode.
        mode: String,
    },
}

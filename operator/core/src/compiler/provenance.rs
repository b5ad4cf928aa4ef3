//! Where each item of the packet comes from and how far it is trusted (spec §17.7: `source`,
//! `trust_class`), for the inclusion decisions the Context Inspector shows.

use serde::Serialize;

use crate::entry::{EntryKind, Role};
use crate::prefix::SectionClass;

/// How far an item of the packet is trusted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TrustClass {
    /// System and policy text: the operator's stable prefix, the client's system prompt, project
    /// constants.
    Instruction,
    /// Capability contracts: the tool schemas offered to the model.
    Contract,
    /// What the user wrote.
    User,
    /// What the model wrote: its answers and tool calls.
    Model,
    /// Tool output: external content, data and never instructions.
    ToolOutput,
    /// Made by Strata from other items (compaction and purge summaries), under the preservation
    /// check and stamped with the cache scope it was made under.
    Derived,
    /// Strata's own telemetry.
    Gateway,
}

/// Source and trust class of a Tier-1 section.
pub fn section_provenance(class: SectionClass) -> (&'static str, TrustClass) {
    match class {
        SectionClass::System => ("stable_prefix.system", TrustClass::Instruction),
        SectionClass::Tools => ("stable_prefix.tools", TrustClass::Contract),
        SectionClass::Constants => ("stable_prefix.constants", TrustClass::Instruction),
    }
}

/// Source and trust class of a Tier-2 entry.
pub fn entry_provenance(kind: EntryKind, role: Role) -> (&'static str, TrustClass) {
    if kind == EntryKind::Summary {
        return ("strata.summary", TrustClass::Derived);
    }
    match role {
        Role::System => ("client.system", TrustClass::Instruction),
        Role::User => ("client.user", TrustClass::User),
        Role::Assistant => ("model", TrustClass::Model),
        Role::Tool => ("tool", TrustClass::ToolOutput),
    }
}

/// Source and trust class of the Tier-3 telemetry.
pub const TELEMETRY_PROVENANCE: (&str, TrustClass) = ("strata.telemetry", TrustClass::Gateway);

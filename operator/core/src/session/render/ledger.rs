//! Which tool calls the journal holds and which of them have results, so rendering never sends a
//! call without its result (or a result without its call), which providers reject.

use std::collections::{HashMap, HashSet};

use crate::entry::Entry;

/// Tool calls issued and answered in the current generation.
#[derive(Debug, Default)]
pub struct CallLedger {
    issued: HashMap<String, String>,
    answered: HashSet<String>,
}

impl CallLedger {
    /// Rebuilds the ledger from every entry of the generation.
    pub fn rebuild(&mut self, entries: &[Entry]) {
        self.issued.clear();
        self.answered.clear();
        self.observe(entries);
    }

    /// Adds newly appended entries.
    pub fn observe(&mut self, entries: &[Entry]) {
        for entry in entries {
            for call in &entry.content.tool_calls {
                self.issued.insert(call.call_id.clone(), call.name.clone());
            }
            for result in &entry.content.tool_results {
                self.answered.insert(result.call_id.clone());
            }
        }
    }

    /// Whether the journal holds the call `call_id`.
    pub fn is_issued(&self, call_id: &str) -> bool {
        self.issued.contains_key(call_id)
    }

    /// Whether the journal holds a result for `call_id`.
    pub fn is_answered(&self, call_id: &str) -> bool {
        self.answered.contains(call_id)
    }

    /// The tool name of the call `call_id`, when known.
    pub fn tool_name(&self, call_id: &str) -> Option<&str> {
        self.issued.get(call_id).map(String::as_str)
    }
}

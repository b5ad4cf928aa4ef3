//! Which tool calls the journal holds and which of them are answered in place, so rendering never
//! sends a call without its result, a result without its call, or a result anywhere but directly
//! after the assistant message that made the call (which providers reject).
//!
//! A result is *in place* when only tool results separate it from the assistant entry that made
//! its call. Calls not answered in place are left out of their assistant message; results not in
//! place are sent as plain text. Both are decided in journal order, once per appended entry.

use std::collections::{HashMap, HashSet};

use crate::entry::{Entry, EntryId, Role};

/// Tool calls issued and answered in place in the current generation.
#[derive(Debug, Default)]
pub struct CallLedger {
    names: HashMap<String, String>,
    answered: HashMap<EntryId, HashSet<String>>,
    results: HashMap<EntryId, Vec<String>>,
    open_entry: Option<EntryId>,
    open_calls: HashSet<String>,
}

impl CallLedger {
    /// Rebuilds the ledger from every entry of the generation.
    pub fn rebuild(&mut self, entries: &[Entry]) {
        *self = CallLedger::default();
        self.observe(entries);
    }

    /// Adds newly appended entries.
    pub fn observe(&mut self, entries: &[Entry]) {
        for entry in entries {
            for call in &entry.content.tool_calls {
                self.names.insert(call.call_id.clone(), call.name.clone());
            }
            if entry.role == Role::Assistant {
                self.open_entry = (!entry.content.tool_calls.is_empty()).then_some(entry.id);
                self.open_calls = entry.content.tool_calls.iter().map(|call| call.call_id.clone()).collect();
                continue;
            }
            let in_place: Vec<String> = entry
                .content
                .tool_results
                .iter()
                .filter(|result| self.open_calls.remove(&result.call_id))
                .map(|result| result.call_id.clone())
                .collect();
            match self.open_entry {
                Some(assistant) if !in_place.is_empty() => {
                    self.answered.entry(assistant).or_default().extend(in_place.iter().cloned());
                    self.results.insert(entry.id, in_place);
                }
                _ => {
                    self.open_entry = None;
                    self.open_calls.clear();
                }
            }
        }
    }

    /// Whether the call `call_id` of assistant entry `assistant` is answered in place.
    pub fn is_answered(&self, assistant: EntryId, call_id: &str) -> bool {
        self.answered.get(&assistant).is_some_and(|calls| calls.contains(call_id))
    }

    /// Whether later entries can still answer calls of `assistant` in place.
    pub fn is_open(&self, assistant: EntryId) -> bool {
        self.open_entry == Some(assistant)
    }

    /// The calls the tool entry `result` answers in place, in its order (empty: send it as text).
    pub fn answers(&self, result: EntryId) -> &[String] {
        self.results.get(&result).map_or(&[], Vec::as_slice)
    }

    /// The tool name of the call `call_id`, when known.
    pub fn tool_name(&self, call_id: &str) -> Option<&str> {
        self.names.get(call_id).map(String::as_str)
    }
}

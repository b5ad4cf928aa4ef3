//! Every single-bit flip in a journal log is detected with the exact expected outcome.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::Arc;

use strata_core::entry::{Content, EntryDraft, EntryKind, RetentionClass, Role};
use strata_core::journal::sim::SimStorage;
use strata_core::journal::{Journal, JournalError, JournalOptions, Storage};

const DIR: &str = "/data";
const LOG: &str = "/data/gen-000001/journal.log";

fn build() -> SimStorage {
    let sim = SimStorage::new();
    let (mut journal, _) = Journal::open(Arc::new(sim.clone()), DIR, JournalOptions::new("bits", 1)).unwrap();
    for (index, text) in ["hi", "a longer second message", "third"].iter().enumerate() {
        journal
            .append(EntryDraft {
                kind: EntryKind::Message,
                role: Role::User,
                content: Content::text(*text),
                retention: RetentionClass::Working,
                created_at_ms: index as u64,
                tokens: 3,
                artifact_refs: vec![],
            })
            .unwrap();
    }
    sim
}

/// (offset, payload length) of each record, parsed independently of the journal code.
fn records(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut at = 24;
    let mut out = Vec::new();
    while at < bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        out.push((at, len));
        at += 8 + len;
    }
    assert_eq!(at, bytes.len());
    out
}

#[derive(Debug, PartialEq)]
enum Outcome {
    BadHeader,
    Corrupt(u64),
    Torn(u64),
}

#[test]
fn every_bit_flip_is_refused_or_reported_as_torn() {
    let pristine = build().read(Path::new(LOG)).unwrap();
    let layout = records(&pristine);
    assert_eq!(layout.len(), 3);
    let (last_offset, last_len) = *layout.last().unwrap();
    let mut checked = 0;
    for bit in 0..(pristine.len() as u64 * 8) {
        let byte = (bit / 8) as usize;
        let expected = if byte < 24 {
            Outcome::BadHeader
        } else if byte < last_offset {
            let (offset, _) = layout.iter().rev().find(|(offset, _)| *offset <= byte).unwrap();
            Outcome::Corrupt(*offset as u64)
        } else if byte < last_offset + 4 {
            let flipped = last_len ^ (1usize << (bit - last_offset as u64 * 8));
            if flipped < last_len {
                Outcome::Corrupt(last_offset as u64)
            } else {
                Outcome::Torn(last_offset as u64)
            }
        } else {
            Outcome::Torn(last_offset as u64)
        };
        let sim = build();
        sim.flip_bit(Path::new(LOG), bit).unwrap();
        let actual = match Journal::open(Arc::new(sim.clone()), DIR, JournalOptions::new("bits", 1)) {
            Ok((journal, report)) => {
                let truncated = report.truncated.expect("a flip must not go unnoticed");
                assert_eq!(truncated.bytes, (pristine.len() - last_offset) as u64);
                assert_eq!(journal.entries().len(), 2);
                assert_eq!(sim.read(Path::new(LOG)).unwrap(), pristine[..last_offset].to_vec());
                Outcome::Torn(truncated.offset)
            }
            Err(JournalError::BadHeader { path, .. }) => {
                assert_eq!(path, Path::new(LOG));
                Outcome::BadHeader
            }
            Err(JournalError::CorruptRecord { path, offset, .. }) => {
                assert_eq!(path, Path::new(LOG));
                Outcome::Corrupt(offset)
            }
            Err(other) => panic!("bit {bit}: unexpected error {other}"),
        };
        assert_eq!(actual, expected, "bit {bit} (byte {byte})");
        checked += 1;
    }
    assert_eq!(checked, pristine.len() * 8);
}

#[test]
fn corruption_error_names_file_and_offset() {
    let sim = build();
    let pristine = sim.read(Path::new(LOG)).unwrap();
    let (second, _) = records(&pristine)[1];
    sim.flip_bit(Path::new(LOG), (second as u64 + 10) * 8).unwrap();
    let error = Journal::open(Arc::new(sim), DIR, JournalOptions::new("bits", 1)).unwrap_err();
    let message = error.to_string();
    assert!(message.contains(LOG), "{message}");
    assert!(message.contains(&format!("byte offset {second}")), "{message}");
}

#[test]
fn reader_reports_torn_tail_without_repairing() {
    let sim = build();
    let pristine = sim.read(Path::new(LOG)).unwrap();
    let cut = pristine.len() - 5;
    sim.write_file(Path::new(LOG), &pristine[..cut]).unwrap();
    let view = strata_core::journal::read_current_generation(&sim, Path::new(DIR)).unwrap();
    assert_eq!(view.entries.len(), 2);
    let torn = view.torn_tail.unwrap();
    assert_eq!(torn.bytes as usize, cut - torn.offset as usize);
    assert_eq!(sim.read(Path::new(LOG)).unwrap().len(), cut, "reader must not truncate");
}

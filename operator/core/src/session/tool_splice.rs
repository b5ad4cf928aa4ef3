//! A tool block that a body carries unchanged since the last request, found by its bytes and
//! stood in for by `[]`, so that splitting the body reads around the block instead of scanning it.
//!
//! A coding agent resends the same tool block, tens of kilobytes of JSON schemas, with every
//! request. Finding where it ends cost the split more than the rest of a Stateful body. Searching
//! for the known bytes and comparing them is several times cheaper than parsing past them.

use std::ops::Range;

use memchr::memmem;

/// What stands in for the block while the rest of the body is parsed.
const STAND_IN: &[u8] = b"[]";

/// Blocks shorter than this are parsed through: finding them would save less than it costs.
pub const SPLICED_FROM_BYTES: usize = 4096;

/// How much of the block's opening is searched for.
const SEARCHED_OPENING_BYTES: usize = 64;

/// How many places with the block's opening are compared with the block at most.
const CANDIDATES_COMPARED: usize = 8;

/// Where a known block lies in a body: from `at`, `len` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Splice {
    at: usize,
    len: usize,
}

impl Splice {
    /// Where `block` first lies in `input`, counted from `offset` (where `input` starts in the
    /// body). None when the block is short or absent.
    pub fn find(input: &[u8], block: Option<&[u8]>, offset: usize) -> Option<Self> {
        let block = block.filter(|block| block.len() >= SPLICED_FROM_BYTES)?;
        // A searcher for the whole block takes longer to build than parsing the block does, so
        // candidates are found by the block's opening and the rest is compared where they lie.
        let opening = &block[..SEARCHED_OPENING_BYTES.min(block.len())];
        // At most a few: a body that repeats the opening many times is parsed instead, so the
        // comparisons never cost more than a parse.
        memmem::find_iter(input, opening)
            .take(CANDIDATES_COMPARED)
            .find(|&start| input[start..].starts_with(block))
            .map(|found| Self { at: offset + found, len: block.len() })
    }

    /// Appends `input` (which starts at `offset` in the body) to `out` with the block replaced
    /// by its stand-in.
    pub fn write_spliced(&self, input: &[u8], offset: usize, out: &mut Vec<u8>) {
        let start = self.at - offset;
        out.reserve(input.len() - self.len + STAND_IN.len());
        out.extend_from_slice(&input[..start]);
        out.extend_from_slice(STAND_IN);
        out.extend_from_slice(&input[start + self.len..]);
    }

    /// Where the stand-in lies, in the spliced body.
    pub fn stand_in(&self) -> Range<usize> {
        self.at..self.at + STAND_IN.len()
    }

    /// Where `range` of the spliced body lies in the body. The stand-in's range becomes the
    /// block's; a range after it moves by the block's length less the stand-in's.
    pub fn restore(&self, range: Range<usize>) -> Range<usize> {
        let grown = self.len - STAND_IN.len();
        let place = |position: usize, is_end: bool| {
            let after = if is_end { position > self.at } else { position >= self.at + STAND_IN.len() };
            if after { position + grown } else { position }
        };
        place(range.start, false)..place(range.end, true)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_spliced_body_maps_back_to_the_body() {
        let block = format!("[{}]", "1,".repeat(SPLICED_FROM_BYTES).trim_end_matches(','));
        let body = format!(r#"{{"messages":[{{"a":1}}],"tools":{block},"stream":true}}"#);
        let splice = Splice::find(body.as_bytes(), Some(block.as_bytes()), 0).unwrap();
        let mut spliced = Vec::new();
        splice.write_spliced(body.as_bytes(), 0, &mut spliced);
        assert_eq!(spliced, br#"{"messages":[{"a":1}],"tools":[],"stream":true}"#);
        assert_eq!(&spliced[splice.stand_in()], b"[]");
        assert_eq!(&body.as_bytes()[splice.restore(splice.stand_in())], block.as_bytes());
        let message = 13..20;
        assert_eq!(splice.restore(message.clone()), message, "before the block: unchanged");
        let stream = spliced.len() - 5..spliced.len() - 1;
        assert_eq!(&body.as_bytes()[splice.restore(stream)], b"true", "after it: moved");
        // Found in a part of the body that starts later: positions count from the body's start.
        let tail = &body.as_bytes()[10..];
        let later = Splice::find(tail, Some(block.as_bytes()), 10).unwrap();
        assert_eq!(later, splice);
        let mut resumed = body.as_bytes()[..10].to_vec();
        later.write_spliced(tail, 10, &mut resumed);
        assert_eq!(resumed, spliced);
    }

    #[test]
    fn the_block_is_found_after_places_that_only_open_like_it_but_not_after_many() {
        let block = format!("[{}]", "7".repeat(SPLICED_FROM_BYTES));
        let near_miss = &block[..block.len() - 1];
        let body = |misses: usize| format!("{}{block}", format!("{near_miss},").repeat(misses));
        let found = Splice::find(body(3).as_bytes(), Some(block.as_bytes()), 0).unwrap();
        assert_eq!(found.at, 3 * block.len(), "the first full match, after three near misses");
        assert_eq!(Splice::find(body(CANDIDATES_COMPARED).as_bytes(), Some(block.as_bytes()), 0), None);
    }

    #[test]
    fn short_or_absent_blocks_are_not_spliced() {
        let body = br#"{"messages":[],"tools":[1]}"#;
        assert_eq!(Splice::find(body, Some(b"[1]"), 0), None, "too short to be worth it");
        let block = vec![b' '; SPLICED_FROM_BYTES];
        assert_eq!(Splice::find(body, Some(&block), 0), None);
        assert_eq!(Splice::find(body, None, 0), None);
    }
}

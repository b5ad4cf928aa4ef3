//! One large request-body buffer kept from one request to the next, so a transparent client's
//! whole history (about 1.4 MB at a 200k-token journal) is not read into freshly faulted pages on
//! every call, and is compared with the history it resends rather than copied.
//!
//! The shipped allocator setting (`dirty_decay_ms:0`) gives freed pages back to the system at
//! once, which keeps the sidecar's memory low but makes every large buffer cost its page faults
//! again, and its release a `madvise` with a TLB flush across the CPUs.
//!
//! The kept buffer still holds the last body's bytes. A body read into it is compared with them as
//! it arrives: the bytes it shares are left in place and only the ones after the first difference
//! are written. Each body is numbered, and what the reading found is handed to the message memo as
//! a [`BodyOrigin`], so a resent history is known unchanged without being digested.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use bytes::{Bytes, BytesMut};
use strata_core::session::message_memo::BodyOrigin;

/// Bodies shorter than this are read into a fresh buffer and not kept: a buffer up to 14 KiB
/// comes from the allocator's small size classes, whose pages stay mapped. A larger one is a
/// large allocation whose release is a `madvise` and a TLB flush, even at 16 KiB, so every
/// body past that size is read into the kept buffer. A transparent client's history is larger
/// than this after its first few turns.
pub const KEPT_FROM_BYTES: usize = 14 * 1024 + 1;

/// The largest buffer kept: a body of a million-token history (about 7 MB) still fits, while one
/// odd request near the body limit (32 MiB by default) is not held for the sidecar's lifetime.
pub const KEPT_UP_TO_BYTES: usize = 8 * 1024 * 1024;

/// Bytes compared at a time when looking for where two bodies first differ.
const COMPARED_BLOCK_BYTES: usize = 4096;

/// The spare buffer with the last body it held, and the numbers given to bodies.
#[derive(Debug, Default)]
pub struct BodyBuffers {
    spare: Mutex<Option<KeptBody>>,
    /// The number the next body gets.
    next_id: AtomicU64,
}

/// A kept buffer and the number of the body it holds.
#[derive(Debug)]
struct KeptBody {
    buffer: BytesMut,
    id: u64,
}

/// A body being read: into the kept buffer, over the earlier body's bytes, or into a new one.
/// The buffer's length is the earlier body's until the new one grows past it: the bytes in it
/// past `read` are the earlier body's still to be compared.
#[derive(Debug)]
pub struct BodyFill {
    buffer: BytesMut,
    id: u64,
    /// The number of the body the buffer held, if it held one.
    earlier: Option<u64>,
    /// Bytes of this body read so far.
    read: usize,
    /// How many leading bytes of this body were found equal to the earlier one's: `read`, over
    /// the earlier body's bytes, until a difference is found.
    shared: usize,
}

impl BodyBuffers {
    /// A buffer for a body of `length` bytes: the spare one, with the last body still in it, when
    /// `length` is large and it is big enough, else a new one. A new large buffer gets an eighth
    /// more room, since a client that resends its history sends a little more each time.
    pub fn take(&self, length: usize) -> BodyFill {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let spare = if length < KEPT_FROM_BYTES {
            None
        } else {
            self.spare.lock().unwrap_or_else(PoisonError::into_inner).take()
        };
        let (buffer, earlier) = match spare {
            Some(KeptBody { buffer, id: earlier }) if buffer.capacity() >= length => (buffer, Some(earlier)),
            _ if length < KEPT_FROM_BYTES => (BytesMut::with_capacity(length), None),
            _ => (BytesMut::with_capacity(length.saturating_add(length / 8)), None),
        };
        BodyFill { buffer, id, earlier, read: 0, shared: 0 }
    }

    /// Keeps `body`'s buffer, with its bytes, for the next request, if it is large, at most
    /// [`KEPT_UP_TO_BYTES`], and nothing else holds it (a blocked request's copy, for one).
    /// `origin` is what [`BodyFill::finish`] said of it.
    pub fn give_back(&self, body: Bytes, origin: BodyOrigin) {
        if body.len() < KEPT_FROM_BYTES {
            return;
        }
        let Ok(buffer) = body.try_into_mut() else { return };
        if buffer.capacity() > KEPT_UP_TO_BYTES {
            return;
        }
        *self.spare.lock().unwrap_or_else(PoisonError::into_inner) = Some(KeptBody { buffer, id: origin.id });
    }
}

impl BodyFill {
    /// Bytes read so far.
    pub fn len(&self) -> usize {
        self.read
    }

    /// Adds the body's next `chunk`: compared with the earlier body's bytes where it falls on
    /// them, until the first difference, written from there on, and appended past their end.
    pub fn push(&mut self, chunk: &[u8]) {
        let over_earlier = (self.buffer.len() - self.read).min(chunk.len());
        let (over, after) = chunk.split_at(over_earlier);
        if !over.is_empty() {
            let place = &mut self.buffer[self.read..self.read + over.len()];
            if self.shared < self.read {
                // A difference was found before: written without comparing.
                place.copy_from_slice(over);
            } else if let Some(at) = first_difference(place, over) {
                self.shared += at;
                place[at..].copy_from_slice(&over[at..]);
            } else {
                self.shared += over.len();
            }
            self.read += over.len();
        }
        if !after.is_empty() {
            // Past the earlier body's end the buffer's length is what was read.
            self.buffer.extend_from_slice(after);
            self.read += after.len();
        }
    }

    /// The body read, and where it came from for the message memo.
    pub fn finish(mut self) -> (Bytes, BodyOrigin) {
        self.buffer.truncate(self.read);
        let origin = BodyOrigin {
            id: self.id,
            shares_opening_with: self.earlier.map(|earlier| (earlier, self.shared)),
        };
        (self.buffer.freeze(), origin)
    }
}

/// Where `a` and `b`, of the same length, first differ: compared a block at a time, then byte by
/// byte in the first block that differs.
fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    if a == b {
        return None;
    }
    a.chunks(COMPARED_BLOCK_BYTES).zip(b.chunks(COMPARED_BLOCK_BYTES)).enumerate().find_map(
        |(block, (left, right))| {
            (left != right).then(|| {
                let within = left.iter().zip(right).position(|(x, y)| x != y).unwrap_or(left.len());
                block * COMPARED_BLOCK_BYTES + within
            })
        },
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use proptest::prelude::*;

    use super::*;

    /// `body` read in `chunks` of the given sizes (the last one takes the rest).
    fn read_in(buffers: &BodyBuffers, body: &[u8], chunks: &[usize]) -> (Bytes, BodyOrigin) {
        let mut fill = buffers.take(body.len());
        let mut rest = body;
        for &size in chunks {
            let (chunk, after) = rest.split_at(size.min(rest.len()));
            fill.push(chunk);
            rest = after;
        }
        fill.push(rest);
        assert_eq!(fill.len(), body.len());
        fill.finish()
    }

    fn filled(buffers: &BodyBuffers, length: usize) -> Bytes {
        read_in(buffers, &vec![b'x'; length], &[]).0
    }

    fn give_back_filled(buffers: &BodyBuffers, length: usize) {
        let (body, origin) = read_in(buffers, &vec![b'x'; length], &[]);
        buffers.give_back(body, origin);
    }

    #[test]
    fn a_large_body_is_read_into_the_buffer_the_last_one_left() {
        let buffers = BodyBuffers::default();
        let (first, origin) = read_in(&buffers, &vec![b'x'; 1_000_000], &[]);
        let address = first.as_ptr();
        buffers.give_back(first, origin);
        let next = buffers.take(1_050_000);
        assert_eq!(next.buffer.as_ptr(), address, "the spare buffer is reused");
        assert_eq!(next.len(), 0);
        assert!(buffers.take(1_000_000).buffer.as_ptr() != address, "and taken once");
    }

    #[test]
    fn a_body_past_the_small_size_classes_is_kept() {
        let buffers = BodyBuffers::default();
        let (first, origin) = read_in(&buffers, &vec![b'x'; 14 * 1024 + 1], &[]);
        let address = first.as_ptr();
        buffers.give_back(first, origin);
        assert!(buffers.spare.lock().unwrap().is_some(), "the buffer is kept");
        assert_eq!(
            buffers.take(15 * 1024).buffer.as_ptr(),
            address,
            "a 15 KiB body reuses the buffer of one byte over 14 KiB"
        );
    }

    #[test]
    fn small_shared_oversized_or_outgrown_buffers_are_not_kept() {
        let buffers = BodyBuffers::default();
        give_back_filled(&buffers, 1_000);
        assert!(buffers.spare.lock().unwrap().is_none(), "a small body");
        give_back_filled(&buffers, 14 * 1024);
        assert!(buffers.spare.lock().unwrap().is_none(), "a body in the allocator's small classes");

        let (shared, origin) = read_in(&buffers, &vec![b'x'; 100_000], &[]);
        let held = shared.clone();
        buffers.give_back(shared, origin);
        assert!(buffers.spare.lock().unwrap().is_none(), "a body another holder still reads");
        drop(held);

        give_back_filled(&buffers, KEPT_UP_TO_BYTES);
        assert!(buffers.spare.lock().unwrap().is_none(), "a buffer over the limit");

        let small = filled(&buffers, 100_000);
        let address = small.as_ptr();
        buffers.give_back(small, BodyOrigin::default());
        assert!(
            buffers.take(200_000).buffer.as_ptr() != address,
            "a spare too small for the body is dropped"
        );
        assert!(buffers.spare.lock().unwrap().is_none());
    }

    /// A body read over the last one says which body that was and how many leading bytes they
    /// share; a body read into a new buffer names none.
    #[test]
    fn a_body_read_over_the_last_one_says_how_much_it_shares_with_it() {
        let buffers = BodyBuffers::default();
        let first: Vec<u8> = (0..40_000u32).map(|i| (i % 251) as u8).collect();
        let (body, first_origin) = read_in(&buffers, &first, &[5_000]);
        assert_eq!(first_origin.shares_opening_with, None);
        buffers.give_back(body, first_origin);

        let mut resent = first.clone();
        resent.extend_from_slice(b"and the new message");
        let (body, origin) = read_in(&buffers, &resent, &[100, 39_000]);
        assert_eq!(body.as_ref(), resent.as_slice());
        assert_eq!(origin.shares_opening_with, Some((first_origin.id, first.len())));
        assert_ne!(origin.id, first_origin.id);
        buffers.give_back(body, origin);

        let mut edited = resent.clone();
        edited[12_345] ^= 1;
        let (body, edited_origin) = read_in(&buffers, &edited, &[]);
        assert_eq!(body.as_ref(), edited.as_slice());
        assert_eq!(edited_origin.shares_opening_with, Some((origin.id, 12_345)));
        assert_eq!(buffers.take(1_000).earlier, None, "a small body is read into a new buffer");
    }

    proptest! {
        /// Whatever the earlier body, the new one and the chunking, the buffer ends up holding
        /// exactly the new body, and the shared opening is the longest common prefix.
        #[test]
        fn the_buffer_holds_the_new_body_and_its_common_prefix_with_the_last(
            earlier in proptest::collection::vec(0u8..4, 15_000..30_000),
            keep in 0usize..30_000,
            tail in proptest::collection::vec(0u8..4, 0..20_000),
            chunks in proptest::collection::vec(1usize..9_000, 0..8),
        ) {
            let buffers = BodyBuffers::default();
            let (body, origin) = read_in(&buffers, &earlier, &[]);
            buffers.give_back(body, origin);
            let mut next = earlier[..keep.min(earlier.len())].to_vec();
            next.extend_from_slice(&tail);
            next.resize(next.len().max(KEPT_FROM_BYTES), 7);
            // Within the kept buffer's room (a larger body is read into a new buffer).
            next.truncate(earlier.len() + earlier.len() / 8);
            let (body, read) = read_in(&buffers, &next, &chunks);
            prop_assert_eq!(body.as_ref(), next.as_slice());
            let common = earlier.iter().zip(&next).take_while(|(a, b)| a == b).count();
            prop_assert_eq!(read.shares_opening_with, Some((origin.id, common)));
        }
    }
}

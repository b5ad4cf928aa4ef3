//! One large request-body buffer kept from one request to the next, so a transparent client's
//! whole history (about 1.4 MB at a 200k-token journal) is not read into freshly faulted pages on
//! every call.
//!
//! The shipped allocator setting (`dirty_decay_ms:0`) gives freed pages back to the system at
//! once, which keeps the sidecar's memory low but makes every large buffer cost its page faults
//! again, and its release a `madvise` with a TLB flush across the CPUs.

use std::sync::{Mutex, PoisonError};

use bytes::{Bytes, BytesMut};

/// Bodies shorter than this are read into a fresh buffer and not kept: a buffer up to 14 KiB
/// comes from the allocator's small size classes, whose pages stay mapped. A larger one is a
/// large allocation whose release is a `madvise` and a TLB flush, even at 16 KiB, so every
/// body past that size is read into the kept buffer. A transparent client's history is larger
/// than this after its first few turns.
pub const KEPT_FROM_BYTES: usize = 14 * 1024 + 1;

/// The largest buffer kept: a body of a million-token history (about 7 MB) still fits, while one
/// odd request near the body limit (32 MiB by default) is not held for the sidecar's lifetime.
pub const KEPT_UP_TO_BYTES: usize = 8 * 1024 * 1024;

/// The spare buffer, empty between requests.
#[derive(Debug, Default)]
pub struct BodyBuffers {
    spare: Mutex<Option<BytesMut>>,
}

impl BodyBuffers {
    /// An empty buffer with room for `length` bytes: the spare one when `length` is large and it
    /// is big enough, else a new one. A new large buffer gets an eighth more room, since a client
    /// that resends its history sends a little more each time.
    pub fn take(&self, length: usize) -> BytesMut {
        if length < KEPT_FROM_BYTES {
            return BytesMut::with_capacity(length);
        }
        let spare = self.spare.lock().unwrap_or_else(PoisonError::into_inner).take();
        match spare {
            Some(buffer) if buffer.capacity() >= length => buffer,
            _ => BytesMut::with_capacity(length.saturating_add(length / 8)),
        }
    }

    /// Keeps `body`'s buffer for the next request, if it is large, at most
    /// [`KEPT_UP_TO_BYTES`], and nothing else holds it (a blocked request's copy, for one).
    pub fn give_back(&self, body: Bytes) {
        if body.len() < KEPT_FROM_BYTES {
            return;
        }
        let Ok(mut buffer) = body.try_into_mut() else { return };
        if buffer.capacity() > KEPT_UP_TO_BYTES {
            return;
        }
        buffer.clear();
        *self.spare.lock().unwrap_or_else(PoisonError::into_inner) = Some(buffer);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn filled(buffers: &BodyBuffers, length: usize) -> Bytes {
        let mut buffer = buffers.take(length);
        buffer.extend_from_slice(&vec![b'x'; length]);
        buffer.freeze()
    }

    #[test]
    fn a_large_body_is_read_into_the_buffer_the_last_one_left() {
        let buffers = BodyBuffers::default();
        let first = filled(&buffers, 1_000_000);
        let address = first.as_ptr();
        buffers.give_back(first);
        let next = buffers.take(1_050_000);
        assert_eq!(next.as_ptr(), address, "the spare buffer is reused");
        assert!(next.is_empty());
        assert!(buffers.take(1_000_000).as_ptr() != address, "and taken once");
    }

    #[test]
    fn a_body_past_the_small_size_classes_is_kept() {
        let buffers = BodyBuffers::default();
        let first = filled(&buffers, 14 * 1024 + 1);
        let address = first.as_ptr();
        buffers.give_back(first);
        assert!(buffers.spare.lock().unwrap().is_some(), "the buffer is kept");
        assert_eq!(
            buffers.take(15 * 1024).as_ptr(),
            address,
            "a 15 KiB body reuses the buffer of one byte over 14 KiB"
        );
    }

    #[test]
    fn small_shared_oversized_or_outgrown_buffers_are_not_kept() {
        let buffers = BodyBuffers::default();
        buffers.give_back(filled(&buffers, 1_000));
        assert!(buffers.spare.lock().unwrap().is_none(), "a small body");
        buffers.give_back(filled(&buffers, 14 * 1024));
        assert!(buffers.spare.lock().unwrap().is_none(), "a body in the allocator's small classes");

        let shared = filled(&buffers, 100_000);
        let held = shared.clone();
        buffers.give_back(shared);
        assert!(buffers.spare.lock().unwrap().is_none(), "a body another holder still reads");
        drop(held);

        buffers.give_back(filled(&buffers, KEPT_UP_TO_BYTES));
        assert!(buffers.spare.lock().unwrap().is_none(), "a buffer over the limit");

        let small = filled(&buffers, 100_000);
        let address = small.as_ptr();
        buffers.give_back(small);
        assert!(buffers.take(200_000).as_ptr() != address, "a spare too small for the body is dropped");
        assert!(buffers.spare.lock().unwrap().is_none());
    }
}

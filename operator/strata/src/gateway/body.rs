//! An upstream request body as a list of shared byte chunks, so cached fragments are referenced
//! rather than copied: a request over a 200k-token history allocates pointers, not megabytes.

use bytes::Bytes;

/// Chunks in order, with their total length.
#[derive(Debug, Default)]
pub struct ChunkedBody {
    chunks: Vec<Bytes>,
    len: usize,
}

impl ChunkedBody {
    /// An empty body with room for `capacity` chunks.
    pub fn with_capacity(capacity: usize) -> Self {
        Self { chunks: Vec::with_capacity(capacity), len: 0 }
    }

    /// Appends a chunk.
    pub fn push(&mut self, bytes: Bytes) {
        self.len += bytes.len();
        self.chunks.push(bytes);
    }

    /// Appends a constant.
    pub fn push_static(&mut self, bytes: &'static [u8]) {
        self.push(Bytes::from_static(bytes));
    }

    /// Total length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The chunks, for sending.
    pub fn into_chunks(self) -> Vec<Bytes> {
        self.chunks
    }
}

//! An upstream request body as a list of byte chunks: large shared pieces (frozen Tier 2, big
//! fragments, Tier 1) are referenced, small ones are coalesced into copied chunks, so a request over
//! a 200k-token history neither copies megabytes nor hands the HTTP stack thousands of tiny chunks.

use bytes::Bytes;

/// Pieces shorter than this are copied into the current chunk instead of referenced.
const COALESCE_BELOW: usize = 4 * 1024;

/// Where serialised JSON goes.
pub trait Sink {
    /// Appends bytes by copying.
    fn put(&mut self, bytes: &[u8]);
    /// Appends a shared piece (referenced when large).
    fn put_shared(&mut self, bytes: &Bytes);
}

/// Chunks in order, with their total length.
#[derive(Debug, Default)]
pub struct ChunkedBody {
    chunks: Vec<Bytes>,
    pending: Vec<u8>,
    len: usize,
}

impl ChunkedBody {
    /// A body that opens the JSON object with `head`'s fields, ready for more fields: `{"model":…,`
    /// (or just `{` when `head` is empty).
    pub fn open_object(head: serde_json::Map<String, serde_json::Value>) -> Self {
        let has_fields = !head.is_empty();
        let mut text = serde_json::Value::Object(head).to_string();
        text.pop();
        let mut body = ChunkedBody::default();
        body.put(text.as_bytes());
        if has_fields {
            body.put(b",");
        }
        body
    }

    fn flush(&mut self) {
        if !self.pending.is_empty() {
            self.chunks.push(Bytes::from(std::mem::take(&mut self.pending)));
        }
    }

    /// Total length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the body has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The whole body as one byte string (tests, replay).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len);
        for chunk in &self.chunks {
            out.extend_from_slice(chunk);
        }
        out.extend_from_slice(&self.pending);
        out
    }

    /// The chunks, for sending.
    pub fn into_chunks(mut self) -> Vec<Bytes> {
        self.flush();
        self.chunks
    }
}

impl Sink for ChunkedBody {
    fn put(&mut self, bytes: &[u8]) {
        self.len += bytes.len();
        self.pending.extend_from_slice(bytes);
    }

    fn put_shared(&mut self, bytes: &Bytes) {
        if bytes.len() < COALESCE_BELOW {
            self.put(bytes);
            return;
        }
        self.flush();
        self.len += bytes.len();
        self.chunks.push(bytes.clone());
    }
}

/// Frozen chunks are cut at this size.
const FREEZE_AT: usize = 64 * 1024;

/// The serialised Tier 2 kept between requests: entries whose JSON can no longer change, frozen
/// into shared chunks, so a request serialises only the entries added since the previous one. It is
/// dropped whenever the engine's Tier-2 epoch changes (generation switch, treatments, placement).
#[derive(Debug, Default)]
pub struct Assembly {
    epoch: u64,
    upto: usize,
    frozen: Vec<Bytes>,
    tail: Vec<u8>,
    /// Anthropic: the side of the message group open after the assembled entries.
    pub side: Option<bool>,
}

impl Assembly {
    /// Starts over unless the assembly was built in `epoch`.
    pub fn check_epoch(&mut self, epoch: u64) {
        if self.epoch != epoch {
            *self = Assembly { epoch, ..Assembly::default() };
        }
    }

    /// Entries `0..upto` are assembled.
    pub fn upto(&self) -> usize {
        self.upto
    }

    /// Marks entries up to `upto` as assembled.
    pub fn advance(&mut self, upto: usize) {
        self.upto = upto;
        if self.tail.len() >= FREEZE_AT {
            self.frozen.push(Bytes::from(std::mem::take(&mut self.tail)));
        }
    }

    /// Appends the assembled bytes to `out`: frozen chunks by reference, the tail by copy.
    pub fn write_to(&self, out: &mut ChunkedBody) {
        for chunk in &self.frozen {
            out.put_shared(chunk);
        }
        out.put(&self.tail);
    }
}

impl Sink for Assembly {
    fn put(&mut self, bytes: &[u8]) {
        self.tail.extend_from_slice(bytes);
    }

    fn put_shared(&mut self, bytes: &Bytes) {
        self.tail.extend_from_slice(bytes);
    }
}

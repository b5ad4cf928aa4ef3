//! An upstream request body as a list of byte chunks: large shared pieces (Tier 2's assembled
//! pieces, big fragments, Tier 1) are referenced, small ones are coalesced into copied chunks, so a
//! request over a 200k-token history neither copies megabytes nor hands the HTTP stack thousands of
//! tiny chunks.

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

    /// The whole body as one buffer, for sending small bodies at once: a body of one chunk is
    /// not copied.
    pub fn into_bytes(mut self) -> Bytes {
        self.flush();
        if self.chunks.len() == 1 {
            return self.chunks.pop().unwrap_or_default();
        }
        let mut whole = Vec::with_capacity(self.len);
        for chunk in &self.chunks {
            whole.extend_from_slice(chunk);
        }
        Bytes::from(whole)
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

/// A piece of the assembly this large is final: it is never merged into a larger one.
const FREEZE_AT: usize = 64 * 1024;

/// The serialised Tier 2 kept between requests: entries whose JSON can no longer change, as shared
/// pieces, so a request serialises only the entries added since the previous one and copies almost
/// none of the rest. It is dropped whenever the engine's Tier-2 epoch changes (generation switch,
/// treatments, placement).
///
/// The entries a request adds are sealed into one new piece. Whenever a piece is not at least twice
/// as long as the piece after it, the two are merged, like the carries of a binary counter, until a
/// piece reaches [`FREEZE_AT`] and stays as it is. So the pieces shrink geometrically from the oldest
/// to the newest: a request refers to the large ones, copies only the few small ones (a few KiB in
/// all), and no request builds a large buffer. Each byte is copied a logarithmic number of times over
/// its life, in merges that are rare for large pieces.
#[derive(Debug, Default)]
pub struct Assembly {
    epoch: u64,
    upto: usize,
    pieces: Vec<Bytes>,
    open: Vec<u8>,
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
    }

    /// Seals the bytes added since the last call into a piece and merges pieces that are not
    /// geometrically decreasing any more.
    fn seal(&mut self) {
        if self.open.is_empty() {
            return;
        }
        let mut sealed = std::mem::take(&mut self.open);
        // A shared piece keeps its whole allocation: return the growth slack of a large one.
        if sealed.capacity() - sealed.len() > sealed.len() / 8 {
            sealed.shrink_to_fit();
        }
        self.pieces.push(Bytes::from(sealed));
        while let [.., older, newer] = self.pieces.as_slice()
            && older.len() < FREEZE_AT
            && older.len() < 2 * newer.len()
        {
            let mut merged = Vec::with_capacity(older.len() + newer.len());
            merged.extend_from_slice(older);
            merged.extend_from_slice(newer);
            self.pieces.truncate(self.pieces.len() - 2);
            self.pieces.push(Bytes::from(merged));
        }
    }

    /// Appends the assembled bytes to `out`, the large pieces by reference.
    pub fn write_to(&mut self, out: &mut ChunkedBody) {
        self.seal();
        for piece in &self.pieces {
            out.put_shared(piece);
        }
    }

    /// The pieces' lengths, oldest first (for tests).
    #[cfg(test)]
    fn piece_lengths(&self) -> Vec<usize> {
        self.pieces.iter().map(Bytes::len).collect()
    }
}

impl Sink for Assembly {
    fn put(&mut self, bytes: &[u8]) {
        self.open.extend_from_slice(bytes);
    }

    fn put_shared(&mut self, bytes: &Bytes) {
        self.open.extend_from_slice(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Appends `count` requests' worth of `size`-byte entries to the assembly, writing a body after
    /// each, and returns the last body.
    fn grow(assembly: &mut Assembly, count: usize, size: usize, expected: &mut Vec<u8>) -> ChunkedBody {
        let mut body = ChunkedBody::default();
        for request in 0..count {
            let entry = vec![b'a' + (request % 26) as u8; size];
            assembly.put(&entry);
            expected.extend_from_slice(&entry);
            assembly.advance(assembly.upto() + 1);
            body = ChunkedBody::default();
            assembly.write_to(&mut body);
        }
        body
    }

    #[test]
    fn the_assembled_bytes_are_written_in_order_whatever_the_pieces() {
        let mut assembly = Assembly::default();
        let mut expected = Vec::new();
        for (count, size) in [(1, 10), (300, 150), (3, 70_000), (50, 3_000), (1, 1)] {
            let body = grow(&mut assembly, count, size, &mut expected);
            assert_eq!(body.to_vec(), expected);
            assert_eq!(body.len(), expected.len());
        }
    }

    #[test]
    fn pieces_shrink_geometrically_so_a_request_copies_little() {
        let mut assembly = Assembly::default();
        let mut expected = Vec::new();
        // About 1.4 MB of small entries, a 200k-token journal's worth.
        let body = grow(&mut assembly, 10_000, 140, &mut expected);
        let lengths = assembly.piece_lengths();
        for pair in lengths.windows(2) {
            assert!(
                pair[0] >= FREEZE_AT || pair[0] >= 2 * pair[1],
                "pieces must shrink geometrically until frozen: {lengths:?}"
            );
        }
        let small: usize = lengths.iter().filter(|&&len| len < COALESCE_BELOW).sum();
        assert!(small < 2 * COALESCE_BELOW, "at most a few KiB are copied per request: {lengths:?}");
        assert!(lengths.len() < 64, "{} pieces", lengths.len());
        let copied: usize =
            body.chunks.iter().filter(|chunk| chunk.len() < COALESCE_BELOW).map(Bytes::len).sum();
        assert!(copied + body.pending.len() < 2 * COALESCE_BELOW, "the body copied {copied} bytes");
        assert_eq!(body.to_vec(), expected);
    }

    #[test]
    fn a_body_joined_into_one_buffer_has_the_same_bytes_and_a_single_chunk_is_not_copied() {
        let mut assembly = Assembly::default();
        let mut expected = Vec::new();
        let body = grow(&mut assembly, 3, 70_000, &mut expected);
        assert!(body.chunks.len() > 1, "the test needs a body of several chunks");
        assert_eq!(body.into_bytes(), expected);

        let mut single = ChunkedBody::default();
        single.put(b"{\"model\":\"m\"}");
        let chunks = ChunkedBody { chunks: Vec::new(), ..single }.into_chunks();
        let shared = chunks[0].clone();
        let whole = ChunkedBody { chunks, pending: Vec::new(), len: shared.len() }.into_bytes();
        assert_eq!(whole.as_ptr(), shared.as_ptr(), "one chunk is handed over, not copied");
    }

    #[test]
    fn a_new_epoch_starts_over() {
        let mut assembly = Assembly::default();
        let mut expected = Vec::new();
        grow(&mut assembly, 5, 100, &mut expected);
        assembly.check_epoch(0);
        assert_eq!(assembly.upto(), 5);
        assembly.check_epoch(1);
        assert_eq!(assembly.upto(), 0);
        let mut body = ChunkedBody::default();
        assembly.write_to(&mut body);
        assert!(body.is_empty());
    }
}

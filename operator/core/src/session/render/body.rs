//! An upstream request body as a list of byte chunks: large shared pieces (Tier 2's assembled
//! pieces, big fragments, Tier 1) are referenced, small ones are coalesced into copied chunks, so a
//! request over a 200k-token history neither copies megabytes nor hands the HTTP stack thousands of
//! tiny chunks.

use bytes::{BufMut, Bytes, BytesMut};

use super::json_write::write_json;

/// Pieces shorter than this are copied into the current chunk instead of referenced.
const COALESCE_BELOW: usize = 4 * 1024;

/// Where serialised JSON goes.
pub trait Sink {
    /// Appends bytes by copying.
    fn put(&mut self, bytes: &[u8]);
    /// Appends a shared piece (referenced when large).
    fn put_shared(&mut self, bytes: &Bytes);
}

/// Room reserved for a body's copied bytes at most (a request that copies more grows it): the end
/// of jemalloc's small size classes, since a larger buffer comes from fresh pages on every request.
const COPIED_ROOM_MAX: usize = 14 * 1024;

/// Chunks in order, with their total length. The copied bytes of the whole body go into one
/// buffer sized from the last request's, and each chunk of them is split off it, so building a
/// body grows no buffer by doubling.
#[derive(Debug, Default)]
pub struct ChunkedBody {
    chunks: Vec<Bytes>,
    pending: BytesMut,
    len: usize,
    copied: usize,
}

impl ChunkedBody {
    /// A body that opens the JSON object with `head`'s fields, ready for more fields: `{"model":…,`
    /// (or just `{` when `head` is empty). Room for `copied_hint` copied bytes is reserved (the
    /// last body's [`ChunkedBody::copied_len`]), with an eighth more for growth.
    pub fn open_object(head: serde_json::Map<String, serde_json::Value>, copied_hint: usize) -> Self {
        let room = (copied_hint + copied_hint / 8).min(COPIED_ROOM_MAX);
        let mut pending = BytesMut::with_capacity(room.max(64));
        write_json((&mut pending).writer(), &head);
        pending.truncate(pending.len().saturating_sub(1));
        if !head.is_empty() {
            pending.extend_from_slice(b",");
        }
        let len = pending.len();
        ChunkedBody { chunks: Vec::new(), pending, len, copied: len }
    }

    fn flush(&mut self) {
        if !self.pending.is_empty() {
            self.chunks.push(self.pending.split().freeze());
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

    /// Bytes copied into the body rather than referenced: the hint for the next body's room.
    pub fn copied_len(&self) -> usize {
        self.copied
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
        self.copied += bytes.len();
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
    /// Bytes the last request's body copied ([`ChunkedBody::copied_len`]): the next one's room.
    pub copied_hint: usize,
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
        let whole =
            ChunkedBody { chunks, pending: BytesMut::new(), len: shared.len(), copied: 0 }.into_bytes();
        assert_eq!(whole.as_ptr(), shared.as_ptr(), "one chunk is handed over, not copied");
    }

    #[test]
    fn the_copied_runs_of_a_body_are_split_off_one_buffer_sized_from_the_hint() {
        let mut head = serde_json::Map::new();
        head.insert("model".into(), "m".into());
        let large = Bytes::from(vec![b'x'; COALESCE_BELOW]);
        let build = |hint: usize| {
            let mut body = ChunkedBody::open_object(head.clone(), hint);
            body.put(b"\"messages\":[");
            body.put_shared(&large);
            body.put(b",{\"role\":\"user\"}]}");
            body
        };
        let first = build(0);
        let copied = first.copied_len();
        assert_eq!(copied, first.len() - large.len());
        let expected = first.to_vec();
        assert!(expected.starts_with(b"{\"model\":\"m\",\"messages\":[x"));

        let chunks = build(copied).into_chunks();
        assert_eq!(chunks.concat(), expected);
        let [before, shared, after] = chunks.as_slice() else { panic!("three chunks: {}", chunks.len()) };
        assert_eq!(shared.as_ptr(), large.as_ptr(), "the large piece is referenced");
        // The run after the shared piece continues in the buffer the first run was split from.
        assert_eq!(before.as_ptr().wrapping_add(before.len()), after.as_ptr());
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

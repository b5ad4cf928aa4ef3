//! Journal log framing: file header, `[len][crc32c][payload]` records, and the recovery scan.

use std::ops::Range;

/// Magic bytes at the start of every `journal.log`.
pub const MAGIC: [u8; 8] = *b"STRJRNL\0";
/// Current on-disk format version.
pub const FORMAT_VERSION: u32 = 1;
/// Header size: magic, version (u32 LE), generation (u64 LE), CRC32C of the preceding 20 bytes.
pub const HEADER_LEN: usize = 24;
/// Record frame prefix: payload length (u32 LE) and CRC32C of the payload (u32 LE).
pub const FRAME_PREFIX_LEN: usize = 8;
/// Largest payload a record may carry.
pub const MAX_PAYLOAD_LEN: usize = 64 * 1024 * 1024;

/// Encodes the header of a generation's log.
pub fn encode_header(generation: u64) -> [u8; HEADER_LEN] {
    let mut header = [0u8; HEADER_LEN];
    header[..8].copy_from_slice(&MAGIC);
    header[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    header[12..20].copy_from_slice(&generation.to_le_bytes());
    let crc = crc32c::crc32c(&header[..20]);
    header[20..].copy_from_slice(&crc.to_le_bytes());
    header
}

/// Appends one framed record to `out`.
pub fn encode_frame(payload: &[u8], out: &mut Vec<u8>) {
    // Callers check MAX_PAYLOAD_LEN, which fits in u32.
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    out.extend_from_slice(payload);
}

/// Starts a frame in `out` (emptied first): room for its prefix, which [`seal_frame`] fills once
/// the payload has been written after it.
pub fn start_frame(out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&[0; FRAME_PREFIX_LEN]);
}

/// Fills the prefix of a frame begun with [`start_frame`] whose payload now follows it; the bytes
/// then equal [`encode_frame`]'s for that payload.
pub fn seal_frame(frame: &mut [u8]) {
    let Some((prefix, payload)) = frame.split_at_mut_checked(FRAME_PREFIX_LEN) else { return };
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    prefix[..4].copy_from_slice(&len.to_le_bytes());
    prefix[4..].copy_from_slice(&crc32c::crc32c(payload).to_le_bytes());
}

/// An incomplete final record found at the end of a log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TornTail {
    /// Byte offset where the torn record starts (the log's valid length).
    pub offset: u64,
    /// Bytes from `offset` to the end of the file.
    pub bytes: u64,
}

/// A successfully scanned log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScannedLog {
    /// Byte ranges of the payload of each intact record, in order.
    pub payloads: Vec<Range<usize>>,
    /// Byte offset of each record's frame.
    pub offsets: Vec<u64>,
    /// The torn final record, if any.
    pub torn: Option<TornTail>,
}

/// Why a log cannot be trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScanError {
    /// The header is short, has the wrong magic, version, generation or checksum.
    BadHeader(String),
    /// A record that is not the final one is damaged.
    Corrupt {
        /// Byte offset of the damaged record's frame.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
}

fn read_u32(bytes: &[u8], at: usize) -> Option<u32> {
    let raw: [u8; 4] = bytes.get(at..at.checked_add(4)?)?.try_into().ok()?;
    Some(u32::from_le_bytes(raw))
}

fn read_u64(bytes: &[u8], at: usize) -> Option<u64> {
    let raw: [u8; 8] = bytes.get(at..at.checked_add(8)?)?.try_into().ok()?;
    Some(u64::from_le_bytes(raw))
}

/// Whether a complete, checksum-valid, non-empty JSON-object record starts at `at`.
fn valid_frame_at(bytes: &[u8], at: usize) -> bool {
    let (Some(len), Some(crc)) = (read_u32(bytes, at), read_u32(bytes, at + 4)) else {
        return false;
    };
    let len = len as usize;
    if len == 0 || len > MAX_PAYLOAD_LEN {
        return false;
    }
    let start = at + FRAME_PREFIX_LEN;
    match bytes.get(start..start + len) {
        Some(payload) => payload[0] == b'{' && crc32c::crc32c(payload) == crc,
        None => false,
    }
}

/// A record at `offset` looks torn; it really is the final record only if no intact record
/// starts anywhere after its frame prefix (a torn write leaves a prefix of one frame, so a later
/// intact frame means the damage is corruption, e.g. a flipped length bit).
fn intact_record_follows(bytes: &[u8], offset: usize) -> bool {
    (offset + 1..bytes.len().saturating_sub(FRAME_PREFIX_LEN))
        .any(|candidate| valid_frame_at(bytes, candidate))
}

/// Validates the header and walks every record. A damaged final record that runs to the end of
/// the file is reported as torn; any other damage is an error naming the record's offset.
pub fn scan(bytes: &[u8], expected_generation: u64) -> Result<ScannedLog, ScanError> {
    let header = bytes.get(..HEADER_LEN).ok_or_else(|| {
        ScanError::BadHeader(format!("file is {} bytes, shorter than the header", bytes.len()))
    })?;
    if header[..8] != MAGIC {
        return Err(ScanError::BadHeader("wrong magic".into()));
    }
    let stored_crc = read_u32(header, 20).unwrap_or_default();
    if crc32c::crc32c(&header[..20]) != stored_crc {
        return Err(ScanError::BadHeader("header checksum mismatch".into()));
    }
    let version = read_u32(header, 8).unwrap_or_default();
    if version != FORMAT_VERSION {
        return Err(ScanError::BadHeader(format!("unsupported format version {version}")));
    }
    let generation = read_u64(header, 12).unwrap_or_default();
    if generation != expected_generation {
        return Err(ScanError::BadHeader(format!(
            "header names generation {generation}, expected {expected_generation}"
        )));
    }
    let mut scanned = ScannedLog { payloads: Vec::new(), offsets: Vec::new(), torn: None };
    let mut at = HEADER_LEN;
    while at < bytes.len() {
        let torn = || TornTail { offset: at as u64, bytes: (bytes.len() - at) as u64 };
        let corrupt = |reason: String| ScanError::Corrupt { offset: at as u64, reason };
        let (Some(len), Some(crc)) = (read_u32(bytes, at), read_u32(bytes, at + 4)) else {
            scanned.torn = Some(torn());
            break;
        };
        let start = at + FRAME_PREFIX_LEN;
        let end = start.saturating_add(len as usize);
        if end > bytes.len() {
            if intact_record_follows(bytes, at) {
                return Err(corrupt(format!(
                    "length {len} runs past the end of the file but intact records follow"
                )));
            }
            scanned.torn = Some(torn());
            break;
        }
        let payload = &bytes[start..end];
        if crc32c::crc32c(payload) != crc {
            if end == bytes.len() && !intact_record_follows(bytes, at) {
                scanned.torn = Some(torn());
                break;
            }
            return Err(corrupt("payload checksum mismatch".into()));
        }
        if len == 0 || len as usize > MAX_PAYLOAD_LEN {
            return Err(corrupt(format!("invalid payload length {len}")));
        }
        scanned.payloads.push(start..end);
        scanned.offsets.push(at as u64);
        at = end;
    }
    Ok(scanned)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn log_with(payloads: &[&str]) -> Vec<u8> {
        let mut bytes = encode_header(7).to_vec();
        for payload in payloads {
            encode_frame(payload.as_bytes(), &mut bytes);
        }
        bytes
    }

    #[test]
    fn a_frame_sealed_in_place_equals_the_encoded_frame() {
        let mut frame = b"left over from the last record".to_vec();
        for payload in ["{}", "{\"text\":\"a longer payload, é\"}", ""] {
            start_frame(&mut frame);
            frame.extend_from_slice(payload.as_bytes());
            seal_frame(&mut frame);
            let mut encoded = Vec::new();
            encode_frame(payload.as_bytes(), &mut encoded);
            assert_eq!(frame, encoded, "payload {payload:?}");
        }
    }

    #[test]
    fn scan_returns_every_record() {
        let bytes = log_with(&["{\"a\":1}", "{\"b\":22}"]);
        let scanned = scan(&bytes, 7).unwrap();
        assert_eq!(scanned.payloads.len(), 2);
        assert_eq!(&bytes[scanned.payloads[1].clone()], b"{\"b\":22}");
        assert_eq!(scanned.offsets[0], HEADER_LEN as u64);
        assert_eq!(scanned.torn, None);
    }

    #[test]
    fn every_truncation_of_the_last_record_is_torn_at_its_offset() {
        let bytes = log_with(&["{\"a\":1}", "{\"b\":22}"]);
        let last = HEADER_LEN + FRAME_PREFIX_LEN + 7;
        for cut in last + 1..bytes.len() {
            let scanned = scan(&bytes[..cut], 7).unwrap();
            assert_eq!(scanned.payloads.len(), 1, "cut {cut}");
            assert_eq!(scanned.torn, Some(TornTail { offset: last as u64, bytes: (cut - last) as u64 }));
        }
    }

    #[test]
    fn wrong_generation_or_short_header_is_refused() {
        let bytes = log_with(&[]);
        assert!(matches!(scan(&bytes, 8), Err(ScanError::BadHeader(_))));
        assert!(matches!(scan(&bytes[..10], 7), Err(ScanError::BadHeader(_))));
    }
}

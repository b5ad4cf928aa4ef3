//! Lower-case hex text of digests, written a buffer at a time (`hex::encode` collects its text a
//! char at a time, which cost more than hashing a short message).

/// Appends the lower-case hex of `bytes` to `out`.
pub fn push_lower_hex(out: &mut String, bytes: &[u8]) {
    out.reserve(bytes.len() * 2);
    for chunk in bytes.chunks(32) {
        let mut buffer = [0u8; 64];
        let text = &mut buffer[..chunk.len() * 2];
        match hex::encode_to_slice(chunk, text).map(|()| std::str::from_utf8(text)) {
            Ok(Ok(text)) => out.push_str(text),
            // Unreachable (the buffer is twice the chunk, and hex digits are ASCII); the same text.
            _ => out.push_str(&hex::encode(chunk)),
        }
    }
}

/// The lower-case hex of `bytes`.
pub fn lower_hex(bytes: &[u8]) -> String {
    let mut out = String::new();
    push_lower_hex(&mut out, bytes);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_is_what_hex_encode_writes() {
        let bytes: Vec<u8> = (0..=255).collect();
        for length in [0, 1, 16, 31, 32, 33, 64, 100, 256] {
            assert_eq!(lower_hex(&bytes[..length]), hex::encode(&bytes[..length]), "{length} bytes");
        }
        let mut out = String::from("op_");
        push_lower_hex(&mut out, &[0xab, 0x01]);
        assert_eq!(out, "op_ab01");
    }
}

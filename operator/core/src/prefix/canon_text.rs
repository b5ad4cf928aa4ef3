//! Text canonicalisation for stable-prefix material (policy `strata.canon/v1`).
//!
//! Steps, in order:
//! 1. every U+FEFF (byte-order mark / deprecated zero-width no-break space) is removed;
//! 2. Unicode NFC;
//! 3. line endings: CRLF and lone CR become LF;
//! 4. trailing whitespace (any Unicode `White_Space` character) is stripped from every line;
//!    leading indentation is kept because it is meaningful in code and Markdown;
//! 5. runs of blank lines collapse to a single blank line;
//! 6. leading and trailing blank lines are removed, and the text has no final newline.
//!
//! The result is idempotent: `canonicalize_text(canonicalize_text(x)) == canonicalize_text(x)`.

use unicode_normalization::UnicodeNormalization;

/// Canonical form of free text (system prompts, constant values).
pub fn canonicalize_text(raw: &str) -> String {
    let normalized = normalize_line_endings(
        &raw.chars().filter(|character| *character != '\u{FEFF}').nfc().collect::<String>(),
    );
    let mut canonical = String::with_capacity(normalized.len());
    let mut pending_blank_line = false;
    for line in normalized.split('\n') {
        let line = line.trim_end_matches(char::is_whitespace);
        if line.is_empty() {
            pending_blank_line = !canonical.is_empty();
            continue;
        }
        if !canonical.is_empty() {
            canonical.push('\n');
            if pending_blank_line {
                canonical.push('\n');
            }
        }
        pending_blank_line = false;
        canonical.push_str(line);
    }
    canonical
}

/// NFC plus LF line endings, without whitespace changes: used for strings inside JSON values,
/// where whitespace may be significant.
pub fn normalize_string(raw: &str) -> String {
    normalize_line_endings(&raw.nfc().collect::<String>())
}

fn normalize_line_endings(text: &str) -> String {
    if !text.contains('\r') {
        return text.to_owned();
    }
    text.replace("\r\n", "\n").replace('\r', "\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_line_endings() {
        assert_eq!(canonicalize_text("a\r\nb\rc\n"), "a\nb\nc");
    }

    #[test]
    fn strips_trailing_whitespace_and_keeps_indentation() {
        assert_eq!(canonicalize_text("fn main() {  \n    body();\t\n}"), "fn main() {\n    body();\n}");
    }

    #[test]
    fn collapses_blank_line_runs_and_trims_ends() {
        assert_eq!(canonicalize_text("\n\n a\n\n\n\nb\n \n"), " a\n\nb");
    }

    #[test]
    fn applies_nfc_and_drops_bom() {
        assert_eq!(canonicalize_text("\u{FEFF}cafe\u{301}"), "caf\u{E9}");
    }

    #[test]
    fn json_strings_keep_whitespace() {
        assert_eq!(normalize_string("  a \r\n"), "  a \n");
    }
}

//! Character-boundary text helpers shared by spill, read and elide.

/// The byte index just after the first `max_chars` characters of `text` (its length if shorter).
pub(crate) fn char_boundary(text: &str, max_chars: usize) -> usize {
    text.char_indices().nth(max_chars).map_or(text.len(), |(index, _)| index)
}

/// The longest prefix of `text` with at most `max_lines` lines and at most `max_chars` characters.
/// When the character limit cuts a line, the cut moves back to the end of the last whole line if
/// there is one; otherwise the partial first line is kept.
pub(crate) fn prefix_within(text: &str, max_lines: usize, max_chars: usize) -> &str {
    let mut end = 0;
    for line in text.split_inclusive('\n').take(max_lines) {
        end += line.len();
    }
    let by_lines = &text[..end];
    let cut = char_boundary(by_lines, max_chars);
    if cut == by_lines.len() {
        return by_lines;
    }
    match by_lines[..cut].rfind('\n') {
        Some(newline) => &by_lines[..=newline],
        None => &by_lines[..cut],
    }
}

/// Number of lines in `text`, counting a final unterminated line.
pub(crate) fn line_count(text: &str) -> usize {
    text.lines().count()
}

/// `n` with `,` thousands separators (`48213` → `48,213`), as the Tier-3 telemetry writes numbers.
pub(crate) fn grouped(n: usize) -> String {
    crate::budget::with_thousands_separators(n as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grouped_inserts_separators() {
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(1_000), "1,000");
        assert_eq!(grouped(48_213), "48,213");
        assert_eq!(grouped(1_234_567), "1,234,567");
    }

    #[test]
    fn prefix_prefers_line_boundaries_and_respects_chars() {
        assert_eq!(prefix_within("ab\ncd\nef\n", 2, 100), "ab\ncd\n");
        assert_eq!(prefix_within("ab\ncd\nef\n", 10, 4), "ab\n");
        assert_eq!(prefix_within("abcdef", 10, 3), "abc");
        assert_eq!(prefix_within("ééé\n", 10, 2), "éé");
        assert_eq!(char_boundary("héllo", 2), 3);
    }
}

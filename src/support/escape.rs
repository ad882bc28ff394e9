//! Text from outside claimgate (a producer's award id or field name, a dead letter's reason)
//! made safe to print on one line of an operator's terminal or log.
//!
//! **Invariant:** what comes out holds no character that moves the cursor, ends a line,
//! rewrites the screen or reorders what is shown; text without such characters comes out
//! unchanged (borrowed, not copied).

use std::borrow::Cow;

/// Whether `c` must be escaped: C0, DEL and C1 controls (escape sequences, newlines), the
/// Unicode line and paragraph separators some viewers break lines at, and the invisible
/// formatting characters that reorder or hide text (bidirectional overrides and isolates, zero
/// width spaces and joiners, the byte order mark): an award id with U+202E in it displays its
/// line's end backwards.
fn escaped(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{2028}' | '\u{2029}' | '\u{061C}' | '\u{FEFF}'
            | '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// `text` with every such character escaped: `\n`, `\r` and `\t` as those two characters, any
/// other as `\u{..}`. A backslash is left alone: text with a literal `\n` in it still reads as
/// one line, which is what matters, and doubling every backslash would garble the many log
/// messages that quote Debug-formatted text.
pub fn controls(text: &str) -> Cow<'_, str> {
    if !text.chars().any(escaped) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if escaped(c) => out.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_moves_ends_or_reorders_a_line_is_escaped_and_nothing_else_is() {
        assert!(matches!(controls("plain \\n text é"), Cow::Borrowed(_)));
        assert_eq!(
            controls("a\nb\r\t\u{1b}[2J\u{7f}\u{85}\u{2028}c"),
            "a\\nb\\r\\t\\u{1b}[2J\\u{7f}\\u{85}\\u{2028}c"
        );
        assert_eq!(
            controls("A-1\u{202e}9-A\u{2066}x\u{200b}y\u{feff}"),
            "A-1\\u{202e}9-A\\u{2066}x\\u{200b}y\\u{feff}"
        );
    }
}

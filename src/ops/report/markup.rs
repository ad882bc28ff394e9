//! Text made safe to put in the report's HTML: the one place anything from the ledger, the
//! anchors file or the command line becomes markup.
//!
//! **Invariant:** whatever a producer wrote (an award id, a field name, a reason) reaches the
//! page as text, never as markup: `&`, `<`, `>`, `"` and `'` are escaped, so it can close no
//! element and no attribute, and the characters that move, hide or reorder text are shown as
//! escapes first (`support::escape::controls`), so it cannot disguise itself either.

use crate::support::escape::controls;

/// `s` as HTML text or a quoted attribute value.
pub fn text(s: &str) -> String {
    let s = controls(s);
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_in_producer_text_comes_out_as_text() {
        assert_eq!(
            text(r#""><img src=x onerror=alert(1)>"#),
            "&quot;&gt;&lt;img src=x onerror=alert(1)&gt;"
        );
        assert_eq!(
            text("<script>alert('x')</script>"),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;"
        );
        assert_eq!(text("A-1 &amp;"), "A-1 &amp;amp;");
        // A right-to-left override would display the rest of its cell backwards.
        assert_eq!(text("A-\u{202e}1"), "A-\\u{202e}1");
        assert_eq!(text("plain A-2026-014"), "plain A-2026-014");
    }
}

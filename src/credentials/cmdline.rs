//! A credential program's command line cut into words, as AWS
//! `credential_process` reads it on every platform: no shell, so no
//! variables, globs, `~` or single quotes; ASCII whitespace separates
//! words and double quotes group them. Pure.
//!
//! - `"a b"` is one word, and quotes may sit inside one (`--x="a b"` is
//!   `--x=a b`); `""` is an empty word.
//! - Within quotes, `\"` is a quote and `\\` a backslash. Any other
//!   backslash is itself, so `C:\tools\x.exe` needs no escaping.
//!
//! Errors say where, never what: the line may hold a secret beside the
//! program's name.

/// The words of `line`: the program first, then its arguments.
pub fn split(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut word = String::new();
    // A word has started (it may still be empty: `""`).
    let mut in_word = false;
    // Where the open quote is, while inside one.
    let mut quote_at: Option<usize> = None;
    let mut chars = line.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        match (quote_at, c) {
            (Some(_), '"') => quote_at = None,
            (Some(_), '\\') => match chars.peek() {
                Some(&(_, escaped @ ('"' | '\\'))) => {
                    word.push(escaped);
                    chars.next();
                }
                _ => word.push('\\'),
            },
            (Some(_), c) => word.push(c),
            (None, '"') => {
                quote_at = Some(at);
                in_word = true;
            }
            (None, c) if c.is_ascii_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if let Some(at) = quote_at {
        return Err(format!(
            "unterminated quote: the quote at byte {at} of the command line is never closed"
        ));
    }
    if in_word {
        words.push(word);
    }
    match words.first() {
        None => Err("empty command line".to_string()),
        Some(program) if program.is_empty() => Err("the command line's program name is empty".to_string()),
        Some(_) => Ok(words),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words() {
        let cases: &[(&str, &[&str])] = &[
            ("prog", &["prog"]),
            ("  prog  ", &["prog"]),
            ("prog a b", &["prog", "a", "b"]),
            ("prog\ta\n b\r\n", &["prog", "a", "b"]),
            ("prog \"a b\"", &["prog", "a b"]),
            ("prog \"  \"", &["prog", "  "]),
            ("prog --x=\"a b\"", &["prog", "--x=a b"]),
            ("prog a\"b c\"d", &["prog", "ab cd"]),
            ("prog \"a\"\"b\"", &["prog", "ab"]),
            ("prog \"\"", &["prog", ""]),
            ("prog \"\" x", &["prog", "", "x"]),
            ("prog x\"\"", &["prog", "x"]),
            ("\"C:\\Program Files\\x.exe\" --p", &["C:\\Program Files\\x.exe", "--p"]),
            ("C:\\tools\\x.exe a", &["C:\\tools\\x.exe", "a"]),
            // Escapes within quotes only.
            ("prog \"a\\\"b\"", &["prog", "a\"b"]),
            ("prog \"a\\\\b\"", &["prog", "a\\b"]),
            ("prog \"a\\\\\"", &["prog", "a\\"]),
            ("prog \"a\\nb\"", &["prog", "a\\nb"]),
            ("prog \"\\\\\\\"\"", &["prog", "\\\""]),
            ("prog a\\\\b", &["prog", "a\\\\b"]),
            ("prog \\", &["prog", "\\"]),
            // Single quotes are characters, as in `credential_process`.
            ("prog 'a b'", &["prog", "'a", "b'"]),
            ("prog $HOME ~ *", &["prog", "$HOME", "~", "*"]),
            ("prog é\u{a0}x", &["prog", "é\u{a0}x"]),
            ("prog \u{c}x", &["prog", "x"]),
        ];
        for (line, want) in cases {
            let want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
            assert_eq!(split(line), Ok(want), "{line:?}");
        }
    }

    #[test]
    fn errors_name_the_place_not_the_text() {
        let cases: &[(&str, &str)] = &[
            ("", "empty command line"),
            (" \t\r\n", "empty command line"),
            ("\"\"", "the command line's program name is empty"),
            ("\"\" x", "the command line's program name is empty"),
            ("prog \"tok3n", "unterminated quote: the quote at byte 5 of the command line is never closed"),
            ("\"", "unterminated quote: the quote at byte 0 of the command line is never closed"),
            ("prog \"a\\\"", "unterminated quote: the quote at byte 5 of the command line is never closed"),
            ("prog \"a\" \"b", "unterminated quote: the quote at byte 9 of the command line is never closed"),
            // Outside quotes a backslash escapes nothing: this quote opens.
            ("prog a\\\"", "unterminated quote: the quote at byte 7 of the command line is never closed"),
            ("é \"", "unterminated quote: the quote at byte 3 of the command line is never closed"),
        ];
        for (line, want) in cases {
            assert_eq!(split(line), Err(want.to_string()), "{line:?}");
        }
    }

    /// Quotes a word so that `split` gives it back.
    fn quote(word: &str) -> String {
        let mut out = String::from("\"");
        for c in word.chars() {
            if matches!(c, '"' | '\\') {
                out.push('\\');
            }
            out.push(c);
        }
        out.push('"');
        out
    }

    #[test]
    fn quoted_words_round_trip() {
        use crate::test_rng::Rng;
        let pieces = ["a", "\"", "\\", " ", "\t", "\n", "é", "=", "'", "\\\"", "x y"];
        let mut r = Rng(0x5EED_C0DE);
        for _ in 0..2_000 {
            let mut words = vec!["prog".to_string()];
            for _ in 0..r.below(4) {
                let mut w = String::new();
                for _ in 0..r.below(5) {
                    w.push_str(r.pick(&pieces));
                }
                words.push(w);
            }
            let line = words.iter().map(|w| quote(w)).collect::<Vec<_>>().join(r.pick(&[" ", "\t", "  \n"]));
            assert_eq!(split(&line), Ok(words), "{line:?}");
        }
    }
}

//! Defends the reading of what a credential program printed
//! (`credentials::output::parse`) and of its command line
//! (`credentials::cmdline::split`): fed any bytes, neither panics; an
//! accepted token is non-empty visible ASCII within `MAX_TOKEN_LEN`, and
//! read again as a bare line it is the same secret; the words of a command
//! line, each quoted, split back to themselves; and every error message is
//! one of the fixed messages (numbers aside), so it never holds the input
//! or a token in it.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use mcp_identity_proxy::credentials::output::{self, OutputError, MAX_TOKEN_LEN};
use mcp_identity_proxy::credentials::{cmdline, Scheme};
use mcp_identity_proxy::mcp::json::ScanError;

const NOW: u64 = 1_796_600_000;

/// The field names `OutputError` may carry.
const FIELDS: &[&str] = &[
    "kind",
    "apiVersion",
    "status",
    "status.token",
    "status.expirationTimestamp",
    "access_token",
    "expires_in",
    "token_type",
    "error",
];

/// A message's fixed text: each run of digits becomes one `#`.
fn shape(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if !c.is_ascii_digit() {
            out.push(c);
        } else if !out.ends_with('#') {
            out.push('#');
        }
    }
    out
}

/// Does not compile when a variant is added: `fixed_messages` must list it.
fn listed(e: OutputError) {
    use OutputError::*;
    match e {
        Empty
        | Json(_)
        | UnknownObject
        | ErrorResponse
        | ApiVersion
        | Missing { .. }
        | WrongType { .. }
        | NotText { .. }
        | Duplicate { .. }
        | Timestamp
        | ExpiresIn
        | TokenType
        | Lines
        | EmptyToken
        | TooLong { .. }
        | TokenByte { .. } => {}
    }
}

/// The shapes of every message `parse` and `split` can give.
fn fixed_messages() -> &'static [String] {
    static ALL: OnceLock<Vec<String>> = OnceLock::new();
    ALL.get_or_init(|| {
        use OutputError::*;
        let mut errors = vec![
            Empty,
            UnknownObject,
            ErrorResponse,
            ApiVersion,
            Timestamp,
            ExpiresIn,
            TokenType,
            Lines,
            EmptyToken,
            TooLong { len: 0 },
            TokenByte { offset: 0 },
            Json(ScanError::Syntax { offset: 0 }),
            Json(ScanError::InvalidUtf8 { offset: 0 }),
            Json(ScanError::TooDeep { offset: 0 }),
        ];
        for &field in FIELDS {
            errors.extend([Missing { field }, WrongType { field }, NotText { field }, Duplicate { field }]);
        }
        errors.iter().for_each(|&e| listed(e));
        let mut all: Vec<String> = errors.iter().map(|e| shape(&e.to_string())).collect();
        for line in ["", "\"\"", "\""] {
            if let Err(e) = cmdline::split(line) {
                all.push(shape(&e));
            }
        }
        all
    })
}

/// Checks that `message` is fixed text and carries no token-like piece of
/// `input` (whole, trimmed, or a run of token bytes between JSON's
/// punctuation) of 8 bytes or more, unless that piece is fixed text too.
fn check_message(message: &str, input: &str) {
    let fixed = fixed_messages();
    let message_shape = shape(message);
    assert!(fixed.contains(&message_shape), "not a fixed message: {message:?}");
    let is_piece_byte = |c: char| c.is_ascii_graphic() && !"\"{}[]:,".contains(c);
    let pieces = input.split(|c: char| !is_piece_byte(c)).chain([input, input.trim()]);
    for piece in pieces.filter(|p| p.len() >= 8) {
        if message.contains(piece) {
            let piece_shape = shape(piece);
            assert!(
                fixed.iter().any(|m| m.contains(&piece_shape)),
                "the message {message:?} holds input {piece:?}"
            );
        }
    }
}

/// A word quoted so that `split` gives it back.
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

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    match output::parse(data, NOW) {
        Ok(token) => {
            let secret = token.secret.expose();
            assert!(!secret.is_empty() && secret.len() <= MAX_TOKEN_LEN);
            assert!(secret.bytes().all(|b| (0x21..=0x7e).contains(&b)), "not visible ASCII");
            if !secret.starts_with('{') {
                let again = output::parse(format!("{secret}\n").as_bytes(), NOW)
                    .expect("a token reads as a bare line");
                assert_eq!(again.secret, token.secret);
                assert_eq!(again.scheme, Scheme::Bearer);
            }
            // The time read only moves the expiry.
            let later = output::parse(data, u64::MAX).expect("accepted at any time");
            assert_eq!((later.secret, later.scheme), (token.secret, token.scheme));
        }
        Err(e) => {
            check_message(&e.to_string(), &text);
            assert_eq!(output::parse(data, u64::MAX).err(), Some(e), "refused at any time");
        }
    }
    match cmdline::split(&text) {
        Ok(words) => {
            assert!(words.first().is_some_and(|w| !w.is_empty()), "a program name");
            let line = words.iter().map(|w| quote(w)).collect::<Vec<_>>().join(" ");
            assert_eq!(cmdline::split(&line).as_ref(), Ok(&words), "round trip through {line:?}");
        }
        Err(e) => check_message(&e, &text),
    }
});

//! Defends the one JSON grammar (`mcp::lex`): any bytes, lexed whole, in the pieces two cuts make and byte by byte, give the same tokens or are refused alike; the whole text is accepted exactly when serde_json accepts it (beside Python's NaN and Infinity and lone surrogate escapes, which the proxy's grammar takes, and numbers past a double's range, serde_json's own limit); the first bad byte is named at the same offset whatever the split; and the whole-body scanner (`json::parse_value`) accepts the same texts and spans the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_identity_proxy::mcp::json::{self, ScanError};
use mcp_identity_proxy::mcp::lex::{Lexer, Tok, Token};

// The same reading in pieces as the unit tests'.
#[path = "../../src/mcp/lex_pieces.rs"]
mod pieces;

fn lex(text: &[u8], cuts: &[usize]) -> Option<Vec<(Tok, Vec<u8>)>> {
    pieces::lex(text, cuts).ok()
}

fuzz_target!(|data: &[u8]| {
    let Some((&k, text)) = data.split_first() else {
        return;
    };
    let whole = lex(text, &[]);
    let n = text.len();
    let (a, b) = (usize::from(k) * 7919 % (n + 1), usize::from(k) * 104_729 % (n + 1));
    let cuts = [a.min(b), a.max(b)];
    assert_eq!(lex(text, &cuts), whole, "cut at {cuts:?}");
    // The answer reader names the same first bad byte whatever the split.
    let bad = pieces::error_at(text, &[]);
    assert_eq!(pieces::error_at(text, &cuts), bad, "error at, cut at {cuts:?}");
    if n <= 512 {
        let bytes: Vec<usize> = (1..n).collect();
        assert_eq!(lex(text, &bytes), whole, "byte by byte");
        assert_eq!(pieces::error_at(text, &bytes), bad, "error at, byte by byte");
    }
    let serde = serde_json::from_slice::<serde_json::Value>(text);
    let skip = match &serde {
        Err(e) => {
            let e = e.to_string();
            e.contains("surrogate") || e.contains("end of hex escape") || e.contains("number out of range")
        }
        Ok(_) => false,
    };
    let python = text.windows(3).any(|w| w == b"NaN") || text.windows(8).any(|w| w == b"Infinity");
    // serde_json's own nesting limit is 128, as the proxy's: not compared
    // near it.
    let deep = text.iter().filter(|&&c| c == b'[' || c == b'{').count() >= 120;
    if !skip && !python && !deep {
        assert_eq!(whole.is_some(), serde.is_ok(), "serde_json: {serde:?}");
    }
    let scanned = json::parse_value(text);
    assert_eq!(scanned.is_ok(), whole.is_some(), "whole-body scanner: {scanned:?}");
    if let (Ok(v), Some(tokens)) = (scanned, &whole) {
        // The value's span begins with its first token's and ends with its
        // last token's bytes.
        let (first, last) = (tokens.first().map(|t| &t.1), tokens.last().map(|t| &t.1));
        let span = v.bytes(text);
        assert!(first.is_some_and(|f| span.starts_with(f)) && last.is_some_and(|l| span.ends_with(l)));
    }
});

//! The tokens of a text given to `lex::Lexer` whole or in pieces, each
//! token's parts joined, with the order of parts checked: what `lex.rs`'s
//! tests and the `json_lexer` fuzz target hold every split to. Test and fuzz
//! builds only (the fuzz target includes this file; its parent names
//! `Lexer`, `Tok`, `Token` and `ScanError`).

use super::{Lexer, ScanError, Tok, Token};

pub type Lexed = Result<Vec<(Tok, Vec<u8>)>, ScanError>;

/// The tokens of `text` given in the pieces `cuts` makes of it (none:
/// whole), each token's parts joined: what it is as its last part says,
/// and its bytes; or the error. Whitespace only may follow the value.
pub fn lex(text: &[u8], cuts: &[usize]) -> Lexed {
    let whole = cuts.is_empty();
    let mut lx = if whole { Lexer::whole() } else { Lexer::pieces() };
    let mut out: Vec<(Tok, Vec<u8>)> = Vec::new();
    let mut open = false;
    let mut bounds = vec![0];
    bounds.extend_from_slice(cuts);
    bounds.push(text.len());
    let mut take = |t: Token, piece: &[u8], out: &mut Vec<(Tok, Vec<u8>)>| {
        assert_eq!(t.first, !open, "a part after the last, or a first part missing: {t:?}");
        if t.first {
            out.push((t.tok, Vec::new()));
        }
        let last = out.last_mut().unwrap();
        last.0 = t.tok;
        last.1.extend_from_slice(&piece[t.start..t.end]);
        open = !t.last;
    };
    for w in bounds.windows(2) {
        let piece = &text[w[0]..w[1]];
        let mut pos = 0;
        while let Some(t) = lx.next(piece, &mut pos)? {
            take(t, piece, &mut out);
        }
        assert_eq!(pos, piece.len(), "a piece not read to its end");
    }
    if !whole {
        if let Some(t) = lx.finish(text.len())? {
            take(t, &[], &mut out);
        }
    }
    if !lx.done() {
        return Err(ScanError::Syntax { offset: text.len() });
    }
    Ok(out)
}

/// Where a lexer given `text` in the pieces `cuts` makes (none: one piece)
/// finds that it is not one JSON value, as an offset in `text`; `None` when
/// it is one.
pub fn error_at(text: &[u8], cuts: &[usize]) -> Option<usize> {
    let at = |e: ScanError| match e {
        ScanError::Syntax { offset } | ScanError::InvalidUtf8 { offset } | ScanError::TooDeep { offset } => {
            offset
        }
    };
    let mut lx = Lexer::pieces();
    let mut bounds = vec![0];
    bounds.extend_from_slice(cuts);
    bounds.push(text.len());
    for w in bounds.windows(2) {
        let piece = &text[w[0]..w[1]];
        let mut pos = 0;
        loop {
            match lx.next(piece, &mut pos) {
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(e) => return Some(w[0] + at(e)),
            }
        }
    }
    match lx.finish(text.len()) {
        Err(e) => Some(at(e)),
        Ok(_) => (!lx.done()).then_some(text.len()),
    }
}

//! Defends the chunk tracker: the same verdict, body end and byte
//! classification whether the input arrives whole or split at an offset
//! chosen by the input, and data + framing + trailer account for every
//! consumed byte.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_identity_proxy::http::chunked::{ChunkTracker, Piece};

type Walk = Result<(Vec<u8>, Vec<u8>, Vec<u8>, bool, usize), ()>;

fn walk(parts: &[&[u8]]) -> Walk {
    let mut t = ChunkTracker::new();
    let (mut data, mut framing, mut trailer) = (Vec::new(), Vec::new(), Vec::new());
    let mut consumed = 0;
    for part in parts {
        let mut rest = *part;
        while let Some(step) = t.step(rest).map_err(|_| ())? {
            assert!(step.len > 0 && step.len <= rest.len());
            let (run, tail) = rest.split_at(step.len);
            match step.piece {
                Piece::Data => data.extend_from_slice(run),
                Piece::Framing => framing.extend_from_slice(run),
                Piece::Trailer => trailer.extend_from_slice(run),
            }
            consumed += step.len;
            rest = tail;
        }
        if t.is_done() {
            break;
        }
    }
    Ok((data, framing, trailer, t.is_done(), consumed))
}

fuzz_target!(|input: &[u8]| {
    let Some((&cut, data)) = input.split_first() else { return };
    let whole = walk(&[data]);
    let at = usize::from(cut) % (data.len() + 1);
    let split = walk(&[&data[..at], &data[at..]]);
    match (&whole, &split) {
        (Ok(w), Ok(s)) => {
            assert_eq!(w, s);
            assert_eq!(w.0.len() + w.1.len() + w.2.len(), w.4);
        }
        // An error may surface in either run only if the other also fails
        // or stopped before the bad byte (the body ended first).
        (Err(()), Ok(s)) | (Ok(s), Err(())) => assert!(!s.3, "done in one run, error in the other"),
        (Err(()), Err(())) => {}
    }
});

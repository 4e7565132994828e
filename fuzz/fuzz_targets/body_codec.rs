//! Defends the body codec: whatever the framing and wherever the input is
//! split, decoding a body and re-encoding its payload as the proxy does
//! (passed through, re-chunked, or close-delimited) gives a valid framing
//! of the same payload, and the decoder's verdict does not depend on the
//! split.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_identity_proxy::http::body::{Decoder, Encoder};
use mcp_identity_proxy::http::chunked::Piece;
use mcp_identity_proxy::http::framing::Framing;

/// (payload, passed bytes for `enc`, done), or Err on a framing error.
fn decode(framing: Framing, enc: Encoder, parts: &[&[u8]]) -> Result<(Vec<u8>, Vec<u8>, bool), ()> {
    let mut d = Decoder::new(framing);
    let (mut payload, mut passed) = (Vec::new(), Vec::new());
    for part in parts {
        let mut rest = *part;
        while let Some((n, piece)) = d.step(rest).map_err(|_| ())? {
            assert!(n > 0 && n <= rest.len(), "step of {n} from {} bytes", rest.len());
            let run = &rest[..n];
            if piece == Piece::Data {
                payload.extend_from_slice(run);
            }
            if enc.passes(piece) {
                passed.extend_from_slice(run);
            } else if enc.copies() && piece == Piece::Data {
                enc.frame(run, &mut passed);
            }
            rest = &rest[n..];
        }
        if d.is_done() {
            break;
        }
    }
    Ok((payload, passed, d.is_done()))
}

/// The payload of a complete chunked body, or None if it is not one.
fn dechunk(bytes: &[u8]) -> Option<Vec<u8>> {
    let (payload, _, done) = decode(Framing::Chunked, Encoder::CloseDelimited, &[bytes]).ok()?;
    done.then_some(payload)
}

fuzz_target!(|input: &[u8]| {
    let Some((&[sel, cut], body)) = input.split_first_chunk::<2>() else { return };
    let framing = match sel % 4 {
        0 => Framing::Length(u64::from(sel / 4)),
        1 => Framing::Chunked,
        2 => Framing::UntilClose,
        _ => Framing::None,
    };
    let http10 = sel & 0x40 != 0;
    let reframe = sel & 0x80 != 0;
    let enc = Encoder::for_response(framing, http10, reframe);
    let whole = decode(framing, enc, &[body]);
    let at = usize::from(cut) % (body.len() + 1);
    let split = decode(framing, enc, &[&body[..at], &body[at..]]);
    match (&whole, &split) {
        // Re-chunked output follows how the payload arrived; the payload
        // and the verdict do not.
        (Ok(w), Ok(s)) => assert_eq!((&w.0, w.2), (&s.0, s.2), "split at {at}"),
        (Err(()), Ok(s)) | (Ok(s), Err(())) => assert!(!s.2, "done in one run, error in the other"),
        (Err(()), Err(())) => {}
    }
    for (payload, mut out, done) in [whole, split].into_iter().flatten() {
        if framing == Framing::Length(0) || framing == Framing::None {
            assert!(payload.is_empty() && done);
        }
        if !done && framing != Framing::UntilClose {
            continue; // an incomplete body is never finished by the proxy
        }
        match enc {
            // Passed as it came: framing kept (the upstream's last chunk with
            // it), trailers dropped.
            Encoder::PassThrough { chunked: true } => {
                assert_eq!(dechunk(&out).as_deref(), Some(payload.as_slice()))
            }
            // Re-framed by the proxy, which writes the last chunk.
            Encoder::Chunked => {
                enc.finish(&mut out);
                assert_eq!(dechunk(&out).as_deref(), Some(payload.as_slice()));
            }
            Encoder::PassThrough { chunked: false } | Encoder::CloseDelimited => {
                enc.finish(&mut out);
                assert_eq!(out, payload);
            }
        }
    }
});

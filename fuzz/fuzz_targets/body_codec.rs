//! Defends the body codec and the relay's classification step: whatever the
//! framing and wherever the input is split, a body run through
//! `ClientOut::classify` (the step `conn` runs, not a copy of it), passed
//! through, re-chunked or close-delimited, gives the client a valid framing
//! of the same payload, and the decoder's verdict does not depend on the
//! split.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_identity_proxy::conn::client_out::ClientOut;
use mcp_identity_proxy::http::body::{Decoder, Encoder};
use mcp_identity_proxy::http::framing::Framing;

/// Runs the parts through the relay's own classification step
/// (`ClientOut::classify`) as the relay does: each part appended to the
/// buffer, classified, and everything owed "written" (proxy-made bytes,
/// then passed ones; skipped ones dropped once those are out). Returns
/// (payload seen, bytes the client got, done), or Err on a framing error.
fn decode(framing: Framing, enc: Encoder, parts: &[&[u8]]) -> Result<(Vec<u8>, Vec<u8>, bool), ()> {
    let mut d = Decoder::new(framing);
    let mut co = ClientOut::default();
    let (mut payload, mut client, mut buffer) = (Vec::new(), Vec::new(), Vec::<u8>::new());
    for part in parts {
        buffer.extend_from_slice(part);
        loop {
            let before = buffer.len();
            let c = co.classify(&buffer, &mut d, enc, &mut None, |run| payload.extend_from_slice(run));
            if c.error.is_some() {
                return Err(());
            }
            assert!(c.consumed <= before, "consumed {} of {before}", c.consumed);
            buffer.drain(..c.consumed);
            let own = co.own().clone();
            client.extend_from_slice(&own);
            assert!(co.passed() <= buffer.len(), "owes {} of {} buffered bytes", co.passed(), buffer.len());
            let passed = co.written(own.len() + co.passed());
            client.extend_from_slice(&buffer[..passed]);
            buffer.drain(..passed);
            let skipped = co.settle();
            buffer.drain(..skipped);
            assert!(!co.pending(), "owed bytes left after writing all of them");
            if !c.progressed && skipped == 0 {
                break;
            }
        }
        if d.is_done() {
            break;
        }
    }
    Ok((payload, client, d.is_done()))
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

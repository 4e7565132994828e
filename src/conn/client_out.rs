//! What is owed to the client, and the relay's classification of upstream
//! body bytes into it: pass them as they are, copy them re-framed (or
//! rewritten), or drop them (framing or trailers the client must not see).
//! Socket-free and `Buf`-free: bytes in, a decision out, so the step the
//! relay runs is the step the unit tests and the `body_codec` fuzz target
//! drive (`response.rs` writes the result to the socket).

pub use super::rewrite::{BodyRewriter, Stage};
use crate::http::body::{Decoder, Encoder};
use crate::http::chunked::{ChunkError, Piece};
use crate::limits::IO_BUF_SIZE;

/// The bytes owed to the client, in order: `own[pos..]`, made by the proxy
/// (heads, 100 Continue, re-framed chunks, answers), then the first `pass`
/// bytes of the upstream buffer as they are. Once those are written, the
/// `skip` bytes right after them (framing or trailers the client must not
/// see) are dropped.
///
/// Invariant: `pos <= own.len()`; `pass + skip <=` the upstream buffer's
/// length; `own` is emptied (and `pos` reset) as soon as it is all written.
#[derive(Debug, Default)]
pub struct ClientOut {
    pub(crate) own: Vec<u8>,
    pub(crate) pos: usize,
    pub(crate) pass: usize,
    pub(crate) skip: usize,
    /// Payload made by the proxy (rewritten SSE) before it is framed.
    pub(crate) scratch: Vec<u8>,
}

/// What one classification did.
#[derive(Debug, Default)]
pub struct Classified {
    /// Bytes to drop from the front of the upstream buffer: copied or
    /// dropped while nothing was owed from it (they precede `pass`).
    pub consumed: usize,
    /// Payload bytes queued as the proxy's own (copied or rewritten): the
    /// exchange's byte count, since passed bytes are counted when written.
    pub own_payload: u64,
    /// Any run was classified.
    pub progressed: bool,
    /// The body's framing is broken (the relay cuts the response).
    pub error: Option<ChunkError>,
    /// The rewriter, once it had nothing more to do (its outcome is the
    /// caller's to read).
    pub finished: Option<Box<BodyRewriter>>,
}

impl ClientOut {
    /// Anything left to write.
    pub fn pending(&self) -> bool {
        self.pos < self.own.len() || self.pass > 0
    }

    /// Proxy-made bytes to append to.
    pub fn own(&mut self) -> &mut Vec<u8> {
        &mut self.own
    }

    /// Bytes at the front of the upstream buffer owed as they are.
    pub fn passed(&self) -> usize {
        self.pass
    }

    /// Nothing of the upstream buffer is owed: it may be released.
    pub fn holds_no_upstream_bytes(&self) -> bool {
        self.pass == 0 && self.skip == 0
    }

    /// Forget the upstream bytes owed (the upstream buffer is being cleared).
    pub fn drop_upstream_bytes(&mut self) {
        self.pass = 0;
        self.skip = 0;
    }

    /// `n` bytes were written: first of `own[pos..]`, then of the passed
    /// bytes; returns how many of them were passed bytes (to consume from
    /// the upstream buffer).
    #[inline]
    pub fn written(&mut self, n: usize) -> usize {
        let own_n = n.min(self.own.len() - self.pos);
        self.pos += own_n;
        let pass_n = (n - own_n).min(self.pass);
        self.pass -= pass_n;
        if self.pos == self.own.len() {
            self.own.clear();
            self.pos = 0;
        }
        pass_n
    }

    /// The skipped bytes once everything before them is written: how many
    /// to drop from the upstream buffer now (0: none, or not yet).
    #[inline]
    pub fn settle(&mut self) -> usize {
        if self.pass == 0 && self.skip > 0 {
            return std::mem::take(&mut self.skip);
        }
        0
    }

    /// Ends a rewritten body that had no payload at all (an empty body):
    /// what the rewriter makes of nothing, then the proxy's last chunk.
    pub fn finish_empty(
        &mut self,
        out: Encoder,
        rewriter: Option<Box<BodyRewriter>>,
    ) -> (u64, Option<Box<BodyRewriter>>) {
        let mut n = 0;
        let finished = rewriter.map(|mut rw| {
            rw.finish(&mut self.scratch);
            n = self.emit(out);
            rw
        });
        out.finish(&mut self.own);
        (n, finished)
    }

    /// Frames the proxy-made payload in `scratch` as one chunk (or as it is
    /// for a close-delimited body) into `own`; returns its length.
    fn emit(&mut self, out: Encoder) -> u64 {
        out.frame(&self.scratch, &mut self.own);
        let n = self.scratch.len() as u64;
        self.scratch.clear();
        n
    }

    /// Classifies the unclassified bytes of `buffered` (the upstream
    /// buffer's data: its first `pass` bytes are already owed) with the
    /// body's decoder: each run is passed, copied re-framed (through the
    /// rewriter when there is one) or dropped, and `on_data` sees each
    /// payload run (the initialize answer's version capture). Stops when the
    /// body is done, more bytes are needed, a dropped run must wait for the
    /// bytes before it to be written, or enough proxy-made bytes are queued.
    /// The rewriter is dropped once it has nothing more to do; the last
    /// chunk of a body the proxy frames is queued when the body is done.
    pub fn classify(
        &mut self,
        buffered: &[u8],
        input: &mut Decoder,
        out: Encoder,
        rewriter: &mut Option<Box<BodyRewriter>>,
        mut on_data: impl FnMut(&[u8]),
    ) -> Classified {
        let mut c = Classified::default();
        let full = |co: &ClientOut, rw: &Option<Box<BodyRewriter>>| {
            (out.copies() || rw.is_some()) && co.own.len() > IO_BUF_SIZE
        };
        if self.skip > 0 || full(self, rewriter) {
            return c;
        }
        let unclassified = buffered.get(self.pass..).unwrap_or_default();
        let (_, error) = input.walk(unclassified, |run, piece, input| {
            let len = run.len();
            let done = input.is_done();
            c.progressed = true;
            if piece == Piece::Data {
                on_data(run);
            }
            if let Some(rw) = rewriter.as_mut() {
                // Nothing is passed while rewriting (pass == 0): payload goes
                // through the rewriter, upstream framing is replaced by ours.
                if piece == Piece::Data {
                    rw.feed(run, &mut self.scratch);
                }
                c.consumed += len;
                if done {
                    rw.finish(&mut self.scratch);
                }
                c.own_payload += self.emit(out);
                if done {
                    // Ours: the upstream's last chunk (if any) was dropped
                    // with its framing.
                    out.finish(&mut self.own);
                }
                if done || (rw.is_done() && input.at_chunk_boundary()) {
                    c.finished = rewriter.take();
                }
            } else if out.passes(piece) {
                self.pass += len;
            } else if out.copies() && piece == Piece::Data {
                // Re-framing copies everything: nothing is passed before it.
                out.frame(run, &mut self.own);
                c.own_payload += len as u64;
                c.consumed += len;
                if done {
                    out.finish(&mut self.own);
                }
            } else if self.pass == 0 {
                c.consumed += len;
            } else {
                // Dropped once the bytes before it are written.
                self.skip = len;
            }
            // A dropped run waits for a write; so does a full queue.
            self.skip == 0 && !full(self, rewriter)
        });
        c.error = error;
        c
    }

    /// No upstream bytes: what a legacy stream owes its client now (the
    /// proxy's events, between the upstream's), framed; its length.
    pub fn idle(&mut self, out: Encoder, rewriter: &mut Option<Box<BodyRewriter>>) -> u64 {
        let Some(rw) = rewriter.as_deref_mut() else { return 0 };
        rw.idle(&mut self.scratch);
        if self.scratch.is_empty() {
            return 0;
        }
        self.emit(out)
    }

    /// A close-delimited body ended (the upstream closed): what the
    /// rewriter holds, then the proxy's last chunk.
    pub fn finish_until_close(
        &mut self,
        out: Encoder,
        rewriter: &mut Option<Box<BodyRewriter>>,
    ) -> (u64, Option<Box<BodyRewriter>>) {
        let mut n = 0;
        let finished = rewriter.take().map(|mut rw| {
            rw.finish(&mut self.scratch);
            n = self.emit(out);
            rw
        });
        out.finish(&mut self.own);
        (n, finished)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::framing::Framing;
    use crate::mcp::sse::EndpointRewriter;

    /// Runs a body through `classify` as the relay does, its bytes arriving
    /// in the given pieces, and "writes" everything owed after each: the
    /// bytes the client gets, the payload `on_data` saw, and whether the
    /// body was done.
    fn relay(
        framing: Framing,
        out: Encoder,
        rewrite: bool,
        pieces: &[&[u8]],
        until_close_ends: bool,
    ) -> (Vec<u8>, Vec<u8>, bool) {
        let mut co = ClientOut::default();
        let mut input = Decoder::new(framing);
        let endpoint = || Stage::Endpoint(EndpointRewriter::new(b"up.example:9000", b"127.0.0.1:4000"));
        let mut rewriter = rewrite.then(|| Box::new(BodyRewriter::of([endpoint()]).unwrap()));
        let mut buffer: Vec<u8> = Vec::new();
        let (mut client, mut seen) = (Vec::new(), Vec::new());
        let drain = |co: &mut ClientOut, buffer: &mut Vec<u8>, client: &mut Vec<u8>| loop {
            // Write in small pieces, as a socket might take them.
            let owed = co.own.len() - co.pos + co.pass;
            if owed == 0 {
                let s = co.settle();
                buffer.drain(..s);
                if s == 0 {
                    break;
                }
                continue;
            }
            let n = owed.min(7);
            let own_n = n.min(co.own.len() - co.pos);
            client.extend_from_slice(&co.own[co.pos..co.pos + own_n]);
            client.extend_from_slice(&buffer[..n - own_n]);
            let passed = co.written(n);
            assert_eq!(passed, n - own_n);
            buffer.drain(..passed);
        };
        for piece in pieces {
            buffer.extend_from_slice(piece);
            loop {
                let c = co.classify(&buffer, &mut input, out, &mut rewriter, |d| seen.extend_from_slice(d));
                assert!(c.error.is_none());
                buffer.drain(..c.consumed);
                drain(&mut co, &mut buffer, &mut client);
                if !c.progressed {
                    break;
                }
            }
        }
        if until_close_ends && input.until_close() {
            co.finish_until_close(out, &mut rewriter);
            drain(&mut co, &mut buffer, &mut client);
        }
        (client, seen, input.is_done())
    }

    fn dechunk(mut b: &[u8]) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        loop {
            let line = b.iter().position(|&c| c == b'\n')?;
            let text = std::str::from_utf8(&b[..line]).ok()?.trim_end();
            let size = usize::from_str_radix(text.split(';').next()?, 16).ok()?;
            b = &b[line + 1..];
            if size == 0 {
                return (b == b"\r\n").then_some(out);
            }
            out.extend_from_slice(b.get(..size)?);
            b = b.get(size + 2..)?;
        }
    }

    fn chunked(payload: &[u8], sizes: &[usize]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut rest = payload;
        let mut i = 0;
        while !rest.is_empty() {
            let n = sizes[i % sizes.len()].min(rest.len());
            out.extend_from_slice(format!("{n:x};ext=1\r\n").as_bytes());
            out.extend_from_slice(&rest[..n]);
            out.extend_from_slice(b"\r\n");
            rest = &rest[n..];
            i += 1;
        }
        out.extend_from_slice(b"0\r\nx-trailer: t\r\n\r\n");
        out
    }

    #[test]
    fn bytes_out_are_the_encoders_framing_of_the_payload_at_every_split() {
        let payload = b"event: endpoint\r\ndata: http://up.example:9000/messages/?session_id=abc\r\n\r\nevent: message\r\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"x\"}\r\n\r\n";
        let rewritten = {
            let mut rw = EndpointRewriter::new(b"up.example:9000", b"127.0.0.1:4000");
            let mut o = Vec::new();
            rw.feed(payload, &mut o);
            rw.finish(&mut o);
            o
        };
        assert_ne!(rewritten, payload.to_vec(), "the rewriter must change something here");
        let bodies: Vec<(Framing, Vec<u8>)> = vec![
            (Framing::Length(payload.len() as u64), payload.to_vec()),
            (Framing::Chunked, chunked(payload, &[5, 40, 1])),
            (Framing::UntilClose, payload.to_vec()),
        ];
        for (framing, body) in &bodies {
            for (http10, reframe) in [(false, false), (true, false), (false, true)] {
                let out = Encoder::for_response(*framing, http10, reframe);
                for rewrite in [false, true] {
                    if rewrite
                        && !matches!(
                            out,
                            Encoder::Chunked
                                | Encoder::PassThrough { chunked: true }
                                | Encoder::CloseDelimited
                        )
                    {
                        continue; // the relay rewrites only bodies it frames itself
                    }
                    let want_payload: &[u8] = if rewrite { &rewritten } else { payload };
                    for at in 0..=body.len() {
                        let (client, seen, done) =
                            relay(*framing, out, rewrite, &[&body[..at], &body[at..]], true);
                        let what = format!("{framing:?} {out:?} rewrite {rewrite} split {at}");
                        assert_eq!(seen, payload.to_vec(), "{what}: payload seen");
                        assert!(done || *framing == Framing::UntilClose, "{what}");
                        match out {
                            Encoder::PassThrough { chunked: true } | Encoder::Chunked => {
                                assert_eq!(dechunk(&client).as_deref(), Some(want_payload), "{what}")
                            }
                            _ => assert_eq!(client, want_payload, "{what}"),
                        }
                        if out == (Encoder::PassThrough { chunked: true }) && !rewrite {
                            // Passed as it came, trailers dropped.
                            let cut = find(body, b"0\r\n").unwrap();
                            assert_eq!(&client[..cut], &body[..cut], "{what}");
                        }
                    }
                }
            }
        }
    }

    fn find(h: &[u8], n: &[u8]) -> Option<usize> {
        h.windows(n.len()).rposition(|w| w == n)
    }

    #[test]
    fn a_broken_chunk_is_an_error_and_a_trailer_waits_for_the_bytes_before_it() {
        let mut co = ClientOut::default();
        let mut input = Decoder::new(Framing::Chunked);
        let c = co.classify(b"zz\r\n", &mut input, Encoder::PassThrough { chunked: true }, &mut None, |_| {});
        assert!(c.error.is_some());

        let mut co = ClientOut::default();
        let mut input = Decoder::new(Framing::Chunked);
        let body = b"3\r\nabc\r\n0\r\nt: 1\r\n\r\n";
        let c = co.classify(body, &mut input, Encoder::PassThrough { chunked: true }, &mut None, |_| {});
        assert_eq!(c.consumed, 0);
        // The trailer is dropped only once what precedes it is written.
        assert!(co.skip > 0 && co.pass > 0);
        assert_eq!(co.settle(), 0);
        let passed = co.pass;
        assert_eq!(&body[..passed], b"3\r\nabc\r\n0\r\n");
        assert_eq!(co.written(passed), passed);
        let skipped = co.settle();
        assert_eq!(&body[passed..passed + skipped], b"t: 1\r\n");
        // Then the body's last CRLF passes, and the body is done.
        let rest = &body[passed + skipped..];
        let c = co.classify(rest, &mut input, Encoder::PassThrough { chunked: true }, &mut None, |_| {});
        assert_eq!((c.consumed, co.pass, input.is_done()), (0, 2, true));
    }
}

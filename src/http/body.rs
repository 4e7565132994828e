//! Body framing in both directions, without a socket.
//!
//! `Decoder` walks a body of any framing (none, Content-Length, chunked,
//! until close: RFC 9112 §6.3) in bytes that arrive in any split and says
//! what each run is (`Piece`); the relay uses it on responses, and
//! `read_bounded` gathers a request body whole and de-chunked, refusing a
//! size that would pass the bound as soon as it is known: a Content-Length
//! at once (by the caller, from the head), a chunk as soon as its size line
//! is read, before any of its data.
//!
//! `Encoder` is how a body leaves for the client: passed through as it came,
//! re-framed as chunks by the proxy, or close-delimited (payload only, for
//! an HTTP/1.0 client, RFC 9112 §6.3 item 8). It owns the framing field of
//! the head and the last chunk `0\r\n\r\n`, written in `finish` and
//! nowhere else. Pure.

use crate::http::chunked::{ChunkError, ChunkTracker, Piece};
use crate::http::framing::Framing;
use crate::http::write::{push_hex, BodyField};

/// Why a request body is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyError {
    /// Invalid chunked framing: 400.
    Malformed(ChunkError),
    /// The body (read or announced) passes the bound: 413.
    TooLarge,
}

/// Where the current body ends.
#[derive(Clone, Debug)]
pub enum Decoder {
    /// No body.
    None,
    /// This many payload bytes remain.
    Length { remaining: u64 },
    /// Chunked: the tracker walks sizes, data, framing and trailers.
    Chunked(ChunkTracker),
    /// The body ends when the sender closes (responses only).
    UntilClose,
}

impl Decoder {
    pub fn new(framing: Framing) -> Decoder {
        match framing {
            Framing::None => Decoder::None,
            Framing::Length(n) => Decoder::Length { remaining: n },
            Framing::Chunked => Decoder::Chunked(ChunkTracker::new()),
            Framing::UntilClose => Decoder::UntilClose,
        }
    }

    /// A decoder for a request body with bytes to read; `None` when the
    /// framing delimits none (no body, or `Content-Length: 0`). `UntilClose`
    /// cannot frame a request (RFC 9112 §6.3 item 7) and has none either.
    pub fn for_request(framing: Framing) -> Option<Decoder> {
        match framing {
            Framing::Length(n) if n > 0 => Some(Decoder::Length { remaining: n }),
            Framing::Chunked => Some(Decoder::Chunked(ChunkTracker::new())),
            _ => None,
        }
    }

    /// The last byte of the body has been seen (never for `UntilClose`:
    /// only the sender's close ends it).
    pub fn is_done(&self) -> bool {
        match self {
            Decoder::None => true,
            Decoder::Length { remaining } => *remaining == 0,
            Decoder::Chunked(t) => t.is_done(),
            Decoder::UntilClose => false,
        }
    }

    /// Between chunks (or not chunked): a rewrite of the payload may stop
    /// here and let the rest pass as it comes.
    pub fn at_chunk_boundary(&self) -> bool {
        match self {
            Decoder::Chunked(t) => t.at_chunk_boundary(),
            _ => true,
        }
    }

    /// The body ends when the sender closes.
    pub fn until_close(&self) -> bool {
        matches!(self, Decoder::UntilClose)
    }

    /// Classifies the run of bytes at the front of `data`: `(len, piece)`
    /// with `0 < len <= data.len()`, or `None` when more bytes are needed,
    /// `data` is empty, or the body is over.
    pub fn step(&mut self, data: &[u8]) -> Result<Option<(usize, Piece)>, ChunkError> {
        if data.is_empty() {
            return Ok(None);
        }
        Ok(match self {
            Decoder::None => None,
            Decoder::Length { remaining } => {
                let n = (*remaining).min(data.len() as u64);
                *remaining -= n;
                (n > 0).then_some((n as usize, Piece::Data))
            }
            Decoder::Chunked(t) => t.step(data)?.map(|s| (s.len, s.piece)),
            Decoder::UntilClose => Some((data.len(), Piece::Data)),
        })
    }

    /// Walks the runs at the front of `data` in order, calling `f(run,
    /// piece, decoder)` for each (the decoder as it stands after the run)
    /// while it returns true, until the body is done or more bytes are
    /// needed. Returns the bytes walked and the framing
    /// error that stopped the walk, if one did (the bytes before it were
    /// walked). The one loop over `step` that the relay's classification
    /// and a re-initialisation's collected answers share.
    pub fn walk(
        &mut self,
        data: &[u8],
        mut f: impl FnMut(&[u8], Piece, &Decoder) -> bool,
    ) -> (usize, Option<ChunkError>) {
        let mut at = 0;
        while !self.is_done() {
            let rest = data.get(at..).unwrap_or_default();
            match self.step(rest) {
                Ok(Some((len, piece))) => {
                    at += len;
                    if !f(rest.get(..len).unwrap_or_default(), piece, self) {
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) => return (at, Some(e)),
            }
        }
        (at, None)
    }

    /// Payload bytes the current chunk announces and that have not been
    /// seen yet (see `ChunkTracker::announced`); 0 for other framings.
    fn announced(&self) -> u64 {
        match self {
            Decoder::Chunked(t) => t.announced(),
            _ => 0,
        }
    }

    /// Takes body bytes from the front of `data`, appending the payload to
    /// `body`; returns how many bytes of `data` belong to the body (the
    /// rest is the next request). Stops at the end of the body; refuses a
    /// body whose payload so far plus what the current chunk announces
    /// passes `limit`.
    pub fn read_bounded(
        &mut self,
        data: &[u8],
        body: &mut Vec<u8>,
        limit: usize,
    ) -> Result<usize, BodyError> {
        let mut used = 0;
        while used < data.len() && !self.is_done() {
            let rest = &data[used..];
            let Some((n, piece)) = self.step(rest).map_err(BodyError::Malformed)? else {
                break;
            };
            if piece == Piece::Data {
                body.extend_from_slice(&rest[..n]);
            }
            used += n;
            if (body.len() as u64).saturating_add(self.announced()) > limit as u64 {
                return Err(BodyError::TooLarge);
            }
        }
        Ok(used)
    }
}

/// How a body is written to the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoder {
    /// The bytes pass as they came: payload, and for a chunked body its
    /// framing too (trailers are dropped). Proxy-made payload inserted in
    /// a chunked body is framed as chunks of its own.
    PassThrough { chunked: bool },
    /// The proxy frames the payload as chunks and writes the last chunk.
    Chunked,
    /// Payload only; the connection's close ends the body.
    CloseDelimited,
}

impl Encoder {
    /// How a response body of this framing goes to the client: close-
    /// delimited for an HTTP/1.0 client (it cannot read chunks), chunked
    /// when the proxy rewrites the payload (`reframe`: its length changes)
    /// or the upstream closes to end it (an HTTP/1.1 client then keeps its
    /// connection), else as it came.
    pub fn for_response(framing: Framing, http10_client: bool, reframe: bool) -> Encoder {
        match framing {
            Framing::None => Encoder::PassThrough { chunked: false },
            _ if http10_client => Encoder::CloseDelimited,
            Framing::Length(_) if reframe => Encoder::Chunked,
            Framing::Length(_) => Encoder::PassThrough { chunked: false },
            Framing::Chunked => Encoder::PassThrough { chunked: true },
            Framing::UntilClose => Encoder::Chunked,
        }
    }

    /// The framing field of the head: the upstream's for a body passed as
    /// it came (`advertised` is a bodiless response's Content-Length, as
    /// for HEAD or 304), none for a close-delimited body.
    pub fn field(self, framing: Framing, advertised: Option<u64>) -> BodyField {
        match (self, framing) {
            (Encoder::PassThrough { .. }, Framing::Length(n)) => BodyField::Length(n),
            (Encoder::PassThrough { .. }, Framing::Chunked) | (Encoder::Chunked, _) => BodyField::Chunked,
            (Encoder::PassThrough { .. }, _) => advertised.map_or(BodyField::Omitted, BodyField::Length),
            (Encoder::CloseDelimited, _) => BodyField::Omitted,
        }
    }

    /// A run of this kind is passed to the client as it is.
    pub fn passes(self, piece: Piece) -> bool {
        match self {
            Encoder::PassThrough { .. } => matches!(piece, Piece::Data | Piece::Framing),
            Encoder::CloseDelimited => piece == Piece::Data,
            Encoder::Chunked => false,
        }
    }

    /// Payload is copied and re-framed by the proxy (nothing passes).
    pub fn copies(self) -> bool {
        self == Encoder::Chunked
    }

    fn frames_chunks(self) -> bool {
        matches!(self, Encoder::Chunked | Encoder::PassThrough { chunked: true })
    }

    /// Appends payload made or copied by the proxy, framed as one chunk in
    /// a chunked body (an empty payload writes nothing: an empty chunk
    /// would end the body).
    pub fn frame(self, payload: &[u8], out: &mut Vec<u8>) {
        if payload.is_empty() {
            return;
        }
        if self.frames_chunks() {
            push_hex(out, payload.len() as u64);
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(payload);
            out.extend_from_slice(b"\r\n");
        } else {
            out.extend_from_slice(payload);
        }
    }

    /// Ends a body the proxy frames: the last chunk (RFC 9112 §7.1), when
    /// the upstream's own was not passed. Nothing for a close-delimited
    /// body.
    pub fn finish(self, out: &mut Vec<u8>) {
        if self.frames_chunks() {
            out.extend_from_slice(b"0\r\n\r\n");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feed `input` split at `at`; returns (payload, consumed, done) or the error.
    fn read_split(
        framing: Framing,
        input: &[u8],
        at: usize,
        limit: usize,
    ) -> Result<(Vec<u8>, usize, bool), BodyError> {
        let mut r = Decoder::for_request(framing).expect("framing with a body");
        let mut body = Vec::new();
        let first = r.read_bounded(&input[..at], &mut body, limit)?;
        let second = if r.is_done() { 0 } else { r.read_bounded(&input[first..], &mut body, limit)? };
        Ok((body, first + second, r.is_done()))
    }

    #[test]
    fn request_body_same_payload_and_end_at_every_split() {
        let cases: &[(Framing, &[u8], &[u8], usize)] = &[
            (Framing::Length(5), b"hello", b"hello", 5),
            (Framing::Length(5), b"helloGET / HTTP/1.1", b"hello", 5),
            (Framing::Chunked, b"5\r\nhello\r\n0\r\n\r\n", b"hello", 15),
            (Framing::Chunked, b"2;x=y\r\nhe\r\n3\r\nllo\r\n0\r\nT: v\r\n\r\nNEXT", b"hello", 30),
            (Framing::Chunked, b"0\r\n\r\n", b"", 5),
        ];
        for (framing, input, payload, used) in cases {
            for at in 0..=input.len() {
                let (body, n, done) = read_split(*framing, input, at, 1024).unwrap();
                assert_eq!((body.as_slice(), n, done), (*payload, *used, true), "split at {at} of {input:?}");
            }
        }
    }

    #[test]
    fn chunk_announcing_more_than_the_limit_is_refused_before_its_data() {
        let mut r = Decoder::for_request(Framing::Chunked).unwrap();
        let mut body = Vec::new();
        assert_eq!(r.read_bounded(b"4\r\nabcd\r\n", &mut body, 8), Ok(9));
        // 4 + 5 > 8: refused on the size line, with no data byte taken.
        assert_eq!(r.read_bounded(b"5\r\n", &mut body, 8), Err(BodyError::TooLarge));
        assert_eq!(body, b"abcd");
        // A size line still arriving is refused once its digits pass the bound.
        let mut r = Decoder::for_request(Framing::Chunked).unwrap();
        assert_eq!(r.read_bounded(b"1000000", &mut Vec::new(), 8 * 1024 * 1024), Err(BodyError::TooLarge));
        // Exactly the limit is fine.
        let mut r = Decoder::for_request(Framing::Chunked).unwrap();
        assert_eq!(r.read_bounded(b"4\r\nabcd\r\n0\r\n\r\n", &mut Vec::new(), 4), Ok(14));
        assert!(r.is_done());
    }

    #[test]
    fn malformed_chunks_and_bodiless_framings() {
        let mut r = Decoder::for_request(Framing::Chunked).unwrap();
        assert!(matches!(r.read_bounded(b"zz\r\n", &mut Vec::new(), 100), Err(BodyError::Malformed(_))));
        assert!(Decoder::for_request(Framing::None).is_none());
        assert!(Decoder::for_request(Framing::Length(0)).is_none());
        assert!(Decoder::for_request(Framing::UntilClose).is_none());
    }

    /// Decodes `parts` in order; returns (data, framing + trailer bytes, done).
    fn decode(framing: Framing, parts: &[&[u8]]) -> (Vec<u8>, usize, bool) {
        let mut d = Decoder::new(framing);
        let (mut data, mut other) = (Vec::new(), 0);
        for part in parts {
            let mut rest = *part;
            while let Some((n, piece)) = d.step(rest).unwrap() {
                assert!(n > 0 && n <= rest.len());
                if piece == Piece::Data {
                    data.extend_from_slice(&rest[..n]);
                } else {
                    other += n;
                }
                rest = &rest[n..];
            }
        }
        (data, other, d.is_done())
    }

    #[test]
    fn response_decoder_same_payload_and_end_at_every_split() {
        let cases: &[(Framing, &[u8], &[u8], bool)] = &[
            (Framing::Length(5), b"hello", b"hello", true),
            (Framing::Length(3), b"hello", b"hel", true),
            (Framing::Chunked, b"2\r\nhe\r\n3;e\r\nllo\r\n0\r\nX: y\r\n\r\n", b"hello", true),
            (Framing::UntilClose, b"event: x\n\n", b"event: x\n\n", false),
            (Framing::None, b"junk", b"", true),
        ];
        for (framing, input, payload, done) in cases {
            let whole = decode(*framing, &[input]);
            assert_eq!((whole.0.as_slice(), whole.2), (*payload, *done), "{input:?}");
            for at in 0..=input.len() {
                assert_eq!(
                    decode(*framing, &[&input[..at], &input[at..]]),
                    whole,
                    "split at {at} of {input:?}"
                );
            }
        }
    }

    /// Encodes `payload` split at `at` with `enc` as the proxy does for
    /// copied payload, then ends the body.
    fn encode_split(enc: Encoder, payload: &[u8], at: usize) -> Vec<u8> {
        let mut out = Vec::new();
        enc.frame(&payload[..at], &mut out);
        enc.frame(&payload[at..], &mut out);
        enc.finish(&mut out);
        out
    }

    #[test]
    fn encoder_gives_a_valid_framing_of_the_payload_at_every_split() {
        let payload = b"data: {\"jsonrpc\":\"2.0\"}\n\n";
        for at in 0..=payload.len() {
            let chunked = encode_split(Encoder::Chunked, payload, at);
            assert_eq!(
                decode(Framing::Chunked, &[&chunked]),
                (payload.to_vec(), chunked.len() - payload.len(), true)
            );
            assert!(chunked.ends_with(b"0\r\n\r\n"));
            assert_eq!(encode_split(Encoder::CloseDelimited, payload, at), payload);
        }
        assert_eq!(encode_split(Encoder::Chunked, b"", 0), b"0\r\n\r\n");
    }

    #[test]
    fn encoder_choice_and_framing_field() {
        use Encoder::*;
        let cases = [
            (Framing::None, false, false, Some(7), PassThrough { chunked: false }, BodyField::Length(7)),
            (Framing::None, true, false, None, PassThrough { chunked: false }, BodyField::Omitted),
            (Framing::Length(9), false, false, None, PassThrough { chunked: false }, BodyField::Length(9)),
            (Framing::Length(9), false, true, None, Chunked, BodyField::Chunked),
            (Framing::Length(9), true, true, None, CloseDelimited, BodyField::Omitted),
            (Framing::Chunked, false, true, None, PassThrough { chunked: true }, BodyField::Chunked),
            (Framing::Chunked, true, false, None, CloseDelimited, BodyField::Omitted),
            (Framing::UntilClose, false, false, None, Chunked, BodyField::Chunked),
            (Framing::UntilClose, true, false, None, CloseDelimited, BodyField::Omitted),
        ];
        for (framing, http10, reframe, advertised, enc, field) in cases {
            let e = Encoder::for_response(framing, http10, reframe);
            assert_eq!(
                (e, e.field(framing, advertised)),
                (enc, field),
                "{framing:?} http10={http10} reframe={reframe}"
            );
        }
        assert!(PassThrough { chunked: true }.passes(Piece::Framing));
        assert!(!PassThrough { chunked: true }.passes(Piece::Trailer));
        assert!(!CloseDelimited.passes(Piece::Framing));
        assert!(!Chunked.passes(Piece::Data) && Chunked.copies());
    }
}

//! `BodyReader`: gathers a request body whole, within a bound, from bytes
//! that arrive in any split: a Content-Length body as it is, a chunked body
//! de-chunked (its framing and trailers dropped). A size that would pass the
//! bound is refused as soon as it is known: a Content-Length at once (by the
//! caller, from the head), a chunk as soon as its size line is read, before
//! any of its data. Pure.

use crate::http::chunked::{ChunkError, ChunkTracker, Piece};
use crate::http::framing::Framing;

/// Why a body is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyError {
    /// Invalid chunked framing: 400.
    Malformed(ChunkError),
    /// The body (read or announced) passes the bound: 413.
    TooLarge,
}

#[derive(Clone, Debug)]
enum Reading {
    Length { remaining: u64 },
    Chunked(ChunkTracker),
}

/// Incremental reader of one request body.
#[derive(Clone, Debug)]
pub struct BodyReader {
    reading: Reading,
    limit: u64,
}

impl BodyReader {
    /// A reader for a body of this framing bounded by `limit` bytes of
    /// payload; `None` when the framing delimits no body bytes (no body, or
    /// `Content-Length: 0`). `UntilClose` cannot frame a request (RFC 9112
    /// §6.3 item 7) and has no reader.
    pub fn new(framing: Framing, limit: usize) -> Option<BodyReader> {
        let reading = match framing {
            Framing::Length(n) if n > 0 => Reading::Length { remaining: n },
            Framing::Chunked => Reading::Chunked(ChunkTracker::new()),
            _ => return None,
        };
        Some(BodyReader { reading, limit: limit as u64 })
    }

    /// The last byte of the body has been read.
    pub fn is_done(&self) -> bool {
        match &self.reading {
            Reading::Length { remaining } => *remaining == 0,
            Reading::Chunked(t) => t.is_done(),
        }
    }

    /// Takes body bytes from the front of `data`, appending the payload to
    /// `body`; returns how many bytes of `data` belong to the body (the
    /// rest is the next request). Stops at the end of the body.
    pub fn feed(&mut self, data: &[u8], body: &mut Vec<u8>) -> Result<usize, BodyError> {
        let mut used = 0;
        while used < data.len() && !self.is_done() {
            let rest = &data[used..];
            let n = match &mut self.reading {
                Reading::Length { remaining } => {
                    let n = (*remaining).min(rest.len() as u64) as usize;
                    body.extend_from_slice(&rest[..n]);
                    *remaining -= n as u64;
                    n
                }
                Reading::Chunked(t) => match t.step(rest).map_err(BodyError::Malformed)? {
                    Some(step) => {
                        if step.piece == Piece::Data {
                            body.extend_from_slice(&rest[..step.len]);
                        }
                        step.len
                    }
                    None => break,
                },
            };
            used += n;
            let announced = match &self.reading {
                Reading::Chunked(t) => t.announced(),
                Reading::Length { .. } => 0,
            };
            if (body.len() as u64).saturating_add(announced) > self.limit {
                return Err(BodyError::TooLarge);
            }
        }
        Ok(used)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feed `input` split at `at`; returns (payload, consumed) or the error.
    fn read_split(
        framing: Framing,
        input: &[u8],
        at: usize,
        limit: usize,
    ) -> Result<(Vec<u8>, usize, bool), BodyError> {
        let mut r = BodyReader::new(framing, limit).expect("framing with a body");
        let mut body = Vec::new();
        let first = r.feed(&input[..at], &mut body)?;
        let second = if r.is_done() { 0 } else { r.feed(&input[first..], &mut body)? };
        Ok((body, first + second, r.is_done()))
    }

    #[test]
    fn same_payload_and_end_at_every_split() {
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
        let mut r = BodyReader::new(Framing::Chunked, 8).unwrap();
        let mut body = Vec::new();
        assert_eq!(r.feed(b"4\r\nabcd\r\n", &mut body), Ok(9));
        // 4 + 5 > 8: refused on the size line, with no data byte taken.
        assert_eq!(r.feed(b"5\r\n", &mut body), Err(BodyError::TooLarge));
        assert_eq!(body, b"abcd");
        // A size line still arriving is refused once its digits pass the bound.
        let mut r = BodyReader::new(Framing::Chunked, 8 * 1024 * 1024).unwrap();
        assert_eq!(r.feed(b"1000000", &mut Vec::new()), Err(BodyError::TooLarge));
        // Exactly the limit is fine.
        let mut r = BodyReader::new(Framing::Chunked, 4).unwrap();
        assert_eq!(r.feed(b"4\r\nabcd\r\n0\r\n\r\n", &mut Vec::new()), Ok(14));
        assert!(r.is_done());
    }

    #[test]
    fn malformed_chunks_and_bodiless_framings() {
        let mut r = BodyReader::new(Framing::Chunked, 100).unwrap();
        assert!(matches!(r.feed(b"zz\r\n", &mut Vec::new()), Err(BodyError::Malformed(_))));
        assert!(BodyReader::new(Framing::None, 100).is_none());
        assert!(BodyReader::new(Framing::Length(0), 100).is_none());
        assert!(BodyReader::new(Framing::UntilClose, 100).is_none());
    }
}

//! `ChunkTracker`: walks a chunked body (RFC 9112 §7.1) in place to find its
//! end, classifying each byte as data, framing or trailer. It never
//! re-encodes: the relay passes data and framing through byte for byte and
//! drops trailers; the request path keeps only data (de-chunking). Pure.

use crate::limits::{MAX_CHUNK_LINE, MAX_TRAILER};
use std::fmt;

/// What a run of bytes is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Piece {
    /// Chunk payload.
    Data,
    /// Chunk-size lines, the CRLF after each chunk and the final CRLF.
    Framing,
    /// Trailer field lines (dropped by the proxy, RFC 9112 §7.1.2).
    Trailer,
}

/// A run of `len` bytes at the front of the input, all of one kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    pub len: usize,
    pub piece: Piece,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkError {
    /// Not a hex digit where a chunk size must start.
    InvalidSize,
    /// The size does not fit in 64 bits.
    SizeOverflow,
    /// Chunk-size line or extensions longer than `MAX_CHUNK_LINE`.
    LineTooLong,
    /// Missing CRLF after a size line or chunk data.
    MissingCrlf,
    /// Invalid byte in a chunk extension or trailer.
    InvalidByte,
    /// Trailer section longer than `MAX_TRAILER`.
    TrailerTooLong,
}

impl fmt::Display for ChunkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ChunkError::InvalidSize => "invalid chunk size",
            ChunkError::SizeOverflow => "chunk size overflow",
            ChunkError::LineTooLong => "chunk size line too long",
            ChunkError::MissingCrlf => "missing CRLF in chunked body",
            ChunkError::InvalidByte => "invalid byte in chunked body",
            ChunkError::TrailerTooLong => "trailer section too long",
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// At the start of a chunk-size line: a hex digit must follow.
    SizeStart,
    /// In the hex digits.
    Size {
        value: u64,
    },
    /// After the digits: only whitespace, then `;` or CR.
    SizeWs {
        value: u64,
    },
    /// In `;ext` until CR.
    Ext {
        value: u64,
    },
    /// CR of the size line seen.
    SizeLf {
        value: u64,
    },
    Data {
        remaining: u64,
    },
    DataCr,
    DataLf,
    /// At the start of a trailer line or the final CRLF.
    TrailerStart,
    TrailerLine,
    TrailerLf,
    /// CR of the final empty line seen.
    EndLf,
    Done,
}

/// Incremental chunked-body walker; feed it bytes in any split.
#[derive(Clone, Debug)]
pub struct ChunkTracker {
    state: State,
    /// Bytes of the current size line, or of the whole trailer section.
    line_len: usize,
}

impl Default for ChunkTracker {
    fn default() -> Self {
        Self::new()
    }
}

fn hex(b: u8) -> Option<u64> {
    (b as char).to_digit(16).map(u64::from)
}

impl ChunkTracker {
    pub fn new() -> Self {
        ChunkTracker { state: State::SizeStart, line_len: 0 }
    }

    /// True between chunks: the next byte starts a chunk-size line.
    pub fn at_chunk_boundary(&self) -> bool {
        self.state == State::SizeStart
    }

    /// True once the final CRLF of the body has been seen.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Payload bytes the current chunk announces that have not been seen yet:
    /// its size as far as the size line has been read (a lower bound while
    /// digits still arrive, since more digits only make it larger), or what
    /// remains of its data. A bounded reader refuses a body as soon as
    /// `payload so far + announced` passes the bound, before reading it.
    pub fn announced(&self) -> u64 {
        match self.state {
            State::Size { value }
            | State::SizeWs { value }
            | State::Ext { value }
            | State::SizeLf { value } => value,
            State::Data { remaining } => remaining,
            _ => 0,
        }
    }

    fn piece_for(&self, b: u8) -> Piece {
        match self.state {
            State::Data { .. } => Piece::Data,
            State::TrailerStart if b != b'\r' => Piece::Trailer,
            State::TrailerLine | State::TrailerLf => Piece::Trailer,
            _ => Piece::Framing,
        }
    }

    /// Classify the longest run of same-kind bytes at the front of `input`.
    /// `Ok(None)` when `input` is empty or the body is already complete;
    /// bytes after the end belong to the next message and are not consumed.
    pub fn step(&mut self, input: &[u8]) -> Result<Option<Step>, ChunkError> {
        let Some(&first) = input.first() else {
            return Ok(None);
        };
        if self.is_done() {
            return Ok(None);
        }
        let piece = self.piece_for(first);
        let mut i = 0;
        while let Some(&b) = input.get(i) {
            if self.is_done() || self.piece_for(b) != piece {
                break;
            }
            if let State::Data { remaining } = self.state {
                let avail = (input.len() - i) as u64;
                let n = remaining.min(avail);
                i += n as usize;
                self.state =
                    if n == remaining { State::DataCr } else { State::Data { remaining: remaining - n } };
                continue;
            }
            self.byte(b)?;
            i += 1;
            if self.state == State::SizeStart {
                // A run ends at each chunk boundary, so a caller can switch
                // between re-framing and pass-through there.
                break;
            }
        }
        Ok(Some(Step { len: i, piece }))
    }

    fn byte(&mut self, b: u8) -> Result<(), ChunkError> {
        if matches!(
            self.state,
            State::SizeStart
                | State::Size { .. }
                | State::SizeWs { .. }
                | State::Ext { .. }
                | State::SizeLf { .. }
        ) {
            self.line_len += 1;
            if self.line_len > MAX_CHUNK_LINE {
                return Err(ChunkError::LineTooLong);
            }
        }
        if matches!(self.state, State::TrailerStart | State::TrailerLine | State::TrailerLf | State::EndLf) {
            self.line_len += 1;
            if self.line_len > MAX_TRAILER {
                return Err(ChunkError::TrailerTooLong);
            }
        }
        self.state = match self.state {
            State::SizeStart => State::Size { value: hex(b).ok_or(ChunkError::InvalidSize)? },
            State::Size { value } => match hex(b) {
                Some(d) => {
                    let v = value.checked_mul(16).and_then(|v| v.checked_add(d));
                    State::Size { value: v.ok_or(ChunkError::SizeOverflow)? }
                }
                None => return self.after_size(value, b),
            },
            State::SizeWs { value } => return self.after_size(value, b),
            State::Ext { value } => return self.ext_byte(value, b),
            State::SizeLf { value } => {
                if b != b'\n' {
                    return Err(ChunkError::MissingCrlf);
                }
                self.line_len = 0;
                if value == 0 {
                    State::TrailerStart
                } else {
                    State::Data { remaining: value }
                }
            }
            State::Data { .. } => unreachable_data(),
            State::DataCr if b == b'\r' => State::DataLf,
            State::DataLf if b == b'\n' => State::SizeStart,
            State::DataCr | State::DataLf => return Err(ChunkError::MissingCrlf),
            State::TrailerStart if b == b'\r' => State::EndLf,
            State::TrailerStart | State::TrailerLine => match b {
                b'\r' => State::TrailerLf,
                b'\t' | 0x20..=0x7e | 0x80..=0xff => State::TrailerLine,
                _ => return Err(ChunkError::InvalidByte),
            },
            State::TrailerLf if b == b'\n' => State::TrailerStart,
            State::EndLf if b == b'\n' => State::Done,
            State::TrailerLf | State::EndLf => return Err(ChunkError::MissingCrlf),
            State::Done => State::Done,
        };
        Ok(())
    }

    /// After the size digits: `BWS` then `;` (an extension) or CR
    /// (RFC 9112 §7.1, §7.1.1). Anything else (`0x5`, `5 5`, `5zz`) is not
    /// a chunk size: read leniently it would end the body early and turn
    /// the rest into trailers, a smuggling vector.
    fn after_size(&mut self, value: u64, b: u8) -> Result<(), ChunkError> {
        self.state = match b {
            b' ' | b'\t' => State::SizeWs { value },
            b';' => State::Ext { value },
            b'\r' => State::SizeLf { value },
            _ => return Err(ChunkError::InvalidSize),
        };
        Ok(())
    }

    /// In `*( OWS ";" OWS ext-name [ "=" ext-val ] )`, which the proxy
    /// ignores but passes through.
    fn ext_byte(&mut self, value: u64, b: u8) -> Result<(), ChunkError> {
        self.state = match b {
            b'\r' => State::SizeLf { value },
            b'\t' | 0x20..=0x7e | 0x80..=0xff => State::Ext { value },
            _ => return Err(ChunkError::InvalidByte),
        };
        Ok(())
    }
}

/// `step` consumes data runs itself and never hands a data byte to `byte`.
fn unreachable_data() -> State {
    debug_assert!(false, "data bytes are consumed in step()");
    State::Done
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Run the tracker over `chunks` (each fed as one read); return
    /// (data, framing, trailer, done, consumed).
    fn walk(chunks: &[&[u8]]) -> Result<(Vec<u8>, Vec<u8>, Vec<u8>, bool, usize), ChunkError> {
        let mut t = ChunkTracker::new();
        let (mut data, mut framing, mut trailer) = (Vec::new(), Vec::new(), Vec::new());
        let mut consumed = 0;
        for chunk in chunks {
            let mut rest: &[u8] = chunk;
            while let Some(step) = t.step(rest)? {
                let (run, tail) = rest.split_at(step.len);
                match step.piece {
                    Piece::Data => data.extend_from_slice(run),
                    Piece::Framing => framing.extend_from_slice(run),
                    Piece::Trailer => trailer.extend_from_slice(run),
                }
                consumed += step.len;
                rest = tail;
            }
        }
        Ok((data, framing, trailer, t.is_done(), consumed))
    }

    const BODY: &[u8] =
        b"5;ext=1\r\nhello\r\n1A\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nX-T: 1\r\nY: 2\r\n\r\nNEXT";

    #[test]
    fn whole_body() {
        let (data, framing, trailer, done, consumed) = walk(&[BODY]).unwrap();
        assert_eq!(data, b"helloabcdefghijklmnopqrstuvwxyz");
        assert_eq!(framing, b"5;ext=1\r\n\r\n1A\r\n\r\n0\r\n\r\n");
        assert_eq!(trailer, b"X-T: 1\r\nY: 2\r\n");
        assert!(done);
        assert_eq!(&BODY[consumed..], b"NEXT");
    }

    #[test]
    fn split_at_every_offset_gives_the_same_result() {
        let whole = walk(&[BODY]).unwrap();
        for i in 0..=BODY.len() {
            let (a, b) = BODY.split_at(i);
            assert_eq!(walk(&[a, b]).unwrap(), whole, "split at {i}");
        }
        let bytes: Vec<&[u8]> = BODY.chunks(1).collect();
        assert_eq!(walk(&bytes).unwrap(), whole);
    }

    #[test]
    fn partial_body_is_not_done() {
        for i in 0..BODY.len() - 4 {
            let (_, _, _, done, consumed) = walk(&[&BODY[..i]]).unwrap();
            assert!(!done, "done after {i} bytes");
            assert_eq!(consumed, i);
        }
    }

    #[test]
    fn errors() {
        let cases: &[(&[u8], ChunkError)] = &[
            (b"x\r\n", ChunkError::InvalidSize),
            (b"\r\n", ChunkError::InvalidSize),
            (b"-1\r\n", ChunkError::InvalidSize),
            (b"10000000000000000\r\n", ChunkError::SizeOverflow),
            (b"5\nhello", ChunkError::InvalidSize),
            (b"0x5\r\nhello\r\n0\r\n\r\n", ChunkError::InvalidSize),
            (b"5 5\r\nhello", ChunkError::InvalidSize),
            (b"5zz\r\nhello", ChunkError::InvalidSize),
            (b"1 1\r\n", ChunkError::InvalidSize),
            (b"5\rXhello", ChunkError::MissingCrlf),
            (b"2\r\nabX", ChunkError::MissingCrlf),
            (b"2\r\nab\rX", ChunkError::MissingCrlf),
            (b"0\r\n\rX", ChunkError::MissingCrlf),
            (b"1;\0\r\n", ChunkError::InvalidByte),
            (b"1 ;\0\r\n", ChunkError::InvalidByte),
            (b"1 \0\r\n", ChunkError::InvalidSize),
        ];
        for (input, want) in cases {
            assert_eq!(walk(&[input]).map(|_| ()), Err(*want), "{input:?}");
        }
        let long = [b"1;".as_slice(), &[b'a'; MAX_CHUNK_LINE]].concat();
        assert_eq!(walk(&[&long]).map(|_| ()), Err(ChunkError::LineTooLong));
        let trailer = [b"0\r\n".as_slice(), &[b'a'; MAX_TRAILER + 1]].concat();
        assert_eq!(walk(&[&trailer]).map(|_| ()), Err(ChunkError::TrailerTooLong));
    }

    #[test]
    fn leading_zeros_and_uppercase_hex() {
        let (data, _, _, done, _) = walk(&[b"0003\r\nabc\r\n00\r\n\r\n"]).unwrap();
        assert_eq!(data, b"abc");
        assert!(done);
        let (data, ..) = walk(&[b"B\r\nhello world\r\n0\r\n\r\n"]).unwrap();
        assert_eq!(data, b"hello world");
    }

    #[test]
    fn announced_size_is_known_before_any_data_byte() {
        let mut t = ChunkTracker::new();
        // 16 MiB announced; the tracker says so once the size line is read,
        // with no data byte consumed.
        let input = b"1000000\r\nxyz";
        let step = t.step(input).unwrap().unwrap();
        assert_eq!(step, Step { len: 9, piece: Piece::Framing });
        assert_eq!(t.announced(), 16 * 1024 * 1024);
        // Partial digits are a lower bound that only grows.
        let mut t = ChunkTracker::new();
        t.step(b"10").unwrap();
        assert_eq!(t.announced(), 0x10);
        t.step(b"00").unwrap();
        assert_eq!(t.announced(), 0x1000);
        // Data read so far is subtracted; a finished chunk announces nothing.
        let mut t = ChunkTracker::new();
        t.step(b"5\r\n").unwrap();
        t.step(b"ab").unwrap();
        assert_eq!(t.announced(), 3);
        t.step(b"cde").unwrap();
        assert_eq!(t.announced(), 0);
    }
}

//! How long a message body is: the RFC 9112 §6.3 decision, for requests and
//! responses. Numbers are digits only and overflow-checked. Pure.

use super::headers::{list_elements, Class, HeaderList};
use std::fmt;

/// The body length rule that applies to one message.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Framing {
    /// No body at all (HEAD responses, 1xx/204/304, requests without CL/TE).
    #[default]
    None,
    /// Exactly this many bytes.
    Length(u64),
    /// Chunked transfer coding.
    Chunked,
    /// Until the upstream closes the connection (responses only).
    UntilClose,
}

/// Why a message's framing is unusable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FramingError {
    /// Both Transfer-Encoding and Content-Length (RFC 9112 §6.1: smuggling).
    BothLengthAndChunked,
    /// Content-Length not digits, or a list of differing values.
    InvalidLength,
    /// Transfer-Encoding whose final coding is not `chunked`, or `chunked`
    /// applied twice.
    TransferNotChunked,
    /// A transfer coding other than `chunked` (gzip, deflate, ...): the proxy
    /// does not decode them.
    UnsupportedCoding,
    /// Transfer-Encoding in an HTTP/1.0 message.
    TransferOnHttp10,
}

impl fmt::Display for FramingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FramingError::BothLengthAndChunked => "both Transfer-Encoding and Content-Length",
            FramingError::InvalidLength => "invalid Content-Length",
            FramingError::TransferNotChunked => "Transfer-Encoding does not end in chunked",
            FramingError::UnsupportedCoding => "unsupported transfer coding",
            FramingError::TransferOnHttp10 => "Transfer-Encoding in HTTP/1.0",
        })
    }
}

/// Digits only, overflow-checked: `str::parse` would accept a `+` sign.
pub fn parse_digits(v: &[u8]) -> Option<u64> {
    if v.is_empty() {
        return None;
    }
    v.iter().try_fold(0u64, |acc, b| {
        let d = b.checked_sub(b'0').filter(|d| *d <= 9)?;
        acc.checked_mul(10)?.checked_add(u64::from(d))
    })
}

/// Content-Length, where identical comma-separated values may be collapsed
/// (RFC 9112 §6.3 item 5).
fn content_length(v: &[u8]) -> Result<u64, FramingError> {
    // The common case, one number, without splitting a list.
    if let Some(n) = parse_digits(v) {
        return Ok(n);
    }
    let mut found = None;
    for e in list_elements(v) {
        let n = parse_digits(e).ok_or(FramingError::InvalidLength)?;
        if found.is_some_and(|f| f != n) {
            return Err(FramingError::InvalidLength);
        }
        found = Some(n);
    }
    found.ok_or(FramingError::InvalidLength)
}

/// Transfer-Encoding: Ok(true) for exactly `chunked` as the only coding.
fn transfer_is_chunked(v: &[u8]) -> Result<(), FramingError> {
    let mut codings = list_elements(v);
    let mut chunked_seen = 0;
    let mut other = false;
    let mut last_chunked = false;
    for c in codings.by_ref() {
        let c = c.split(|b| *b == b';').next().unwrap_or(c);
        last_chunked = super::headers::trim_ows(c).eq_ignore_ascii_case(b"chunked");
        if last_chunked {
            chunked_seen += 1;
        } else {
            other = true;
        }
    }
    if !last_chunked || chunked_seen > 1 {
        return Err(FramingError::TransferNotChunked);
    }
    if other {
        return Err(FramingError::UnsupportedCoding);
    }
    Ok(())
}

/// Framing of a request (RFC 9112 §6.3 items 3, 4, 6, 8): requests are never
/// close-delimited; CL together with TE is refused outright.
pub fn request_framing(headers: &HeaderList, http10: bool) -> Result<Framing, FramingError> {
    let te = headers.get_class(Class::TransferEncoding);
    let cl = headers.get_class(Class::ContentLength);
    match (te, cl) {
        (Some(_), Some(_)) => Err(FramingError::BothLengthAndChunked),
        (Some(_), None) if http10 => Err(FramingError::TransferOnHttp10),
        (Some(te), None) => transfer_is_chunked(te).map(|()| Framing::Chunked),
        (None, Some(cl)) => match content_length(cl)? {
            0 => Ok(Framing::None),
            n => Ok(Framing::Length(n)),
        },
        (None, None) => Ok(Framing::None),
    }
}

/// Framing of a response to a request with method `head_request`
/// (RFC 9112 §6.3 items 1-7).
pub fn response_framing(
    headers: &HeaderList,
    status: u16,
    head_request: bool,
) -> Result<Framing, FramingError> {
    // Item 1: never a body, whatever the fields say.
    if head_request || (100..200).contains(&status) || status == 204 || status == 304 {
        return Ok(Framing::None);
    }
    let te = headers.get_class(Class::TransferEncoding);
    let cl = headers.get_class(Class::ContentLength);
    match (te, cl) {
        // Item 3: a proxy must not guess; we treat it as invalid upstream
        // framing and answer 502.
        (Some(_), Some(_)) => Err(FramingError::BothLengthAndChunked),
        (Some(te), None) => match transfer_is_chunked(te) {
            Ok(()) => Ok(Framing::Chunked),
            // A response whose final coding is not chunked is read until
            // close (item 4), but we could not relay its codings faithfully.
            Err(e) => Err(e),
        },
        (None, Some(cl)) => content_length(cl).map(Framing::Length),
        (None, None) => Ok(Framing::UntilClose),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(lines: &[(&str, &str)]) -> HeaderList {
        let mut l = HeaderList::new();
        for (n, v) in lines {
            l.merge_line(n.as_bytes(), v.as_bytes()).unwrap();
        }
        l
    }

    #[test]
    fn digits() {
        assert_eq!(parse_digits(b"0"), Some(0));
        assert_eq!(parse_digits(b"0042"), Some(42));
        assert_eq!(parse_digits(b"18446744073709551615"), Some(u64::MAX));
        for bad in [&b""[..], b"+1", b"-1", b"1 ", b"0x1", b"18446744073709551616", b"1.0"] {
            assert_eq!(parse_digits(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn request_table() {
        use Framing::*;
        use FramingError::*;
        let cases: &[(&[(&str, &str)], bool, Result<Framing, FramingError>)] = &[
            (&[], false, Ok(None)),
            (&[("Content-Length", "0")], false, Ok(None)),
            (&[("Content-Length", "12")], false, Ok(Length(12))),
            (&[("Content-Length", "12, 12")], false, Ok(Length(12))),
            (&[("Content-Length", "12, 13")], false, Err(InvalidLength)),
            (&[("Content-Length", "+12")], false, Err(InvalidLength)),
            (&[("Content-Length", "")], false, Err(InvalidLength)),
            (&[("Transfer-Encoding", "chunked")], false, Ok(Chunked)),
            (&[("Transfer-Encoding", "Chunked")], false, Ok(Chunked)),
            (&[("Transfer-Encoding", "chunked")], true, Err(TransferOnHttp10)),
            (&[("Transfer-Encoding", "chunked, gzip")], false, Err(TransferNotChunked)),
            (&[("Transfer-Encoding", "gzip, chunked")], false, Err(UnsupportedCoding)),
            (&[("Transfer-Encoding", "chunked, chunked")], false, Err(TransferNotChunked)),
            (&[("Transfer-Encoding", "gzip")], false, Err(TransferNotChunked)),
            (&[("Transfer-Encoding", "chunked"), ("Content-Length", "3")], false, Err(BothLengthAndChunked)),
        ];
        for (lines, http10, want) in cases {
            assert_eq!(request_framing(&headers(lines), *http10), *want, "{lines:?}");
        }
    }

    #[test]
    fn response_table() {
        use Framing::*;
        let cl = [("Content-Length", "5")];
        assert_eq!(response_framing(&headers(&cl), 200, true), Ok(None));
        for s in [101, 204, 304] {
            assert_eq!(response_framing(&headers(&cl), s, false), Ok(None));
        }
        assert_eq!(response_framing(&headers(&cl), 200, false), Ok(Length(5)));
        assert_eq!(response_framing(&headers(&[]), 200, false), Ok(UntilClose));
        assert_eq!(response_framing(&headers(&[("Transfer-Encoding", "chunked")]), 200, false), Ok(Chunked));
        assert!(response_framing(&headers(&[("Content-Length", "x")]), 200, false).is_err());
    }
}

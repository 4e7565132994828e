//! The two head writers: a request head for the upstream and a response
//! head for the client, appended to a buffer the caller reuses. Numbers go
//! through `push_decimal` (no `core::fmt`, nothing to ignore); the framing
//! field is written from one `BodyField` value, so a head never carries
//! both a length and `transfer-encoding`. Pure.

use crate::http::headers::HeaderList;

/// The body-framing field a head announces (RFC 9112 §6: a message carries
/// `Content-Length` or `Transfer-Encoding: chunked`, never both).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyField {
    /// No framing field: no body, or a close-delimited one (RFC 9112 §6.3
    /// item 8 for a response to an HTTP/1.0 client).
    Omitted,
    /// `content-length: n`.
    Length(u64),
    /// `transfer-encoding: chunked`.
    Chunked,
}

/// Appends `METHOD target HTTP/1.1`, the fields, the framing field and the
/// empty line to `out`.
pub fn request_head(out: &mut Vec<u8>, method: &[u8], target: &[u8], headers: &HeaderList, body: BodyField) {
    out.extend_from_slice(method);
    out.push(b' ');
    out.extend_from_slice(target);
    out.extend_from_slice(b" HTTP/1.1\r\n");
    headers.write_to(out);
    body_field(out, body);
    out.extend_from_slice(b"\r\n");
}

/// Appends `HTTP/1.1 status reason`, the fields, the framing field, then
/// `connection: close` when `close`, and the empty line to `out`.
pub fn response_head(
    out: &mut Vec<u8>,
    status: u16,
    reason: &[u8],
    headers: &HeaderList,
    body: BodyField,
    close: bool,
) {
    out.extend_from_slice(b"HTTP/1.1 ");
    push_decimal(out, u64::from(status));
    out.push(b' ');
    out.extend_from_slice(reason);
    out.extend_from_slice(b"\r\n");
    headers.write_to(out);
    body_field(out, body);
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

fn body_field(out: &mut Vec<u8>, body: BodyField) {
    match body {
        BodyField::Omitted => {}
        BodyField::Length(n) => {
            out.extend_from_slice(b"content-length: ");
            push_decimal(out, n);
            out.extend_from_slice(b"\r\n");
        }
        BodyField::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
    }
}

/// The reason phrase of a status the proxy answers with itself (RFC 9110
/// §15); its one table, for the MCP listener and the metrics listener
/// (and a forward proxy's refusal in a log line: 407).
/// A client must not rely on it (RFC 9112 §4): other codes get `Error`.
pub fn reason_phrase(status: u16) -> &'static [u8] {
    match status {
        200 => b"OK",
        202 => b"Accepted",
        400 => b"Bad Request",
        401 => b"Unauthorized",
        403 => b"Forbidden",
        404 => b"Not Found",
        405 => b"Method Not Allowed",
        407 => b"Proxy Authentication Required",
        408 => b"Request Timeout",
        413 => b"Content Too Large",
        431 => b"Request Header Fields Too Large",
        501 => b"Not Implemented",
        502 => b"Bad Gateway",
        503 => b"Service Unavailable",
        504 => b"Gateway Timeout",
        _ => b"Error",
    }
}

/// Appends `n` in decimal, without `core::fmt`.
pub fn push_decimal(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// Appends `n` in lower-case hexadecimal (a chunk size, RFC 9112 §7.1).
pub fn push_hex(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 16];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b"0123456789abcdef"[(n & 0xf) as usize];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields() -> HeaderList {
        let mut h = HeaderList::new();
        h.set(b"content-type", b"application/json").unwrap();
        h
    }

    #[test]
    fn request_head_has_line_fields_framing_and_end() {
        let mut out = b"stale".to_vec();
        out.clear();
        request_head(&mut out, b"POST", b"/mcp", &fields(), BodyField::Length(12));
        assert_eq!(
            out,
            b"POST /mcp HTTP/1.1\r\ncontent-type: application/json\r\ncontent-length: 12\r\n\r\n"
        );
        out.clear();
        request_head(&mut out, b"GET", b"/", &HeaderList::new(), BodyField::Omitted);
        assert_eq!(out, b"GET / HTTP/1.1\r\n\r\n");
    }

    #[test]
    fn response_head_appends_and_says_close_last() {
        let mut out = b"HTTP/1.1 100 Continue\r\n\r\n".to_vec();
        response_head(&mut out, 502, b"Bad Gateway", &fields(), BodyField::Length(0), true);
        assert_eq!(
            out,
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 502 Bad Gateway\r\ncontent-type: application/json\r\n\
              content-length: 0\r\nconnection: close\r\n\r\n"
                .as_slice()
        );
        let mut out = Vec::new();
        response_head(&mut out, 200, b"OK", &HeaderList::new(), BodyField::Chunked, false);
        assert_eq!(out, b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n");
        let mut out = Vec::new();
        response_head(&mut out, 204, b"", &HeaderList::new(), BodyField::Omitted, false);
        assert_eq!(out, b"HTTP/1.1 204 \r\n\r\n");
    }

    #[test]
    fn reason_phrases_are_rfc_9110s() {
        let got: Vec<(u16, &[u8])> = [200, 404, 413, 431, 503, 299].map(|s| (s, reason_phrase(s))).to_vec();
        let want: [(u16, &[u8]); 6] = [
            (200, b"OK"),
            (404, b"Not Found"),
            (413, b"Content Too Large"),
            (431, b"Request Header Fields Too Large"),
            (503, b"Service Unavailable"),
            (299, b"Error"),
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn numbers_match_core_fmt() {
        for n in [0u64, 1, 9, 10, 15, 16, 255, 4096, 8143, 1 << 40, u64::MAX] {
            let (mut d, mut x) = (Vec::new(), Vec::new());
            push_decimal(&mut d, n);
            push_hex(&mut x, n);
            assert_eq!(d, n.to_string().as_bytes());
            assert_eq!(x, format!("{n:x}").as_bytes());
        }
    }
}

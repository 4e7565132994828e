//! Request and response heads: httparse in place, then merged into a
//! `HeaderList` with the framing decided (RFC 9112 §6.3) and the hop-by-hop
//! fields removed. The results own their bytes, so nothing borrows the
//! connection buffer past one call. Pure.

use super::framing::{parse_digits, request_framing, response_framing, Framing, FramingError};
use super::headers::{list_elements, Class, FieldError, HeaderList};
use crate::limits::{MAX_FIELDS, MAX_REQUEST_HEAD, MAX_RESPONSE_HEAD};
use smallvec::SmallVec;
use std::fmt;
use std::mem::MaybeUninit;

/// Why a head was refused. The caller picks the status by side: a client's
/// error is 400 or 431, an upstream's is 502.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParseError {
    /// The head grew past its size limit before it was complete.
    TooLarge,
    /// More than `MAX_FIELDS` field lines.
    TooManyFields,
    /// httparse refused the syntax (request line, status line, field line,
    /// obs-fold, whitespace before the colon, bare CR).
    Syntax(&'static str),
    /// A field line that cannot be kept (conflicting singleton, bad value).
    Field(FieldError),
    /// No Host, or more than one Host line (RFC 9112 §3.2).
    Host,
    /// Unusable body framing.
    Framing(FramingError),
    /// A protocol version other than HTTP/1.0 or HTTP/1.1.
    Version,
}

impl ParseError {
    /// Status for a client whose request head failed this way.
    pub fn client_status(&self) -> u16 {
        match self {
            ParseError::TooLarge | ParseError::TooManyFields => 431,
            ParseError::Framing(FramingError::UnsupportedCoding) => 501,
            _ => 400,
        }
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::TooLarge => f.write_str("head too large"),
            ParseError::TooManyFields => f.write_str("too many header fields"),
            ParseError::Syntax(what) => write!(f, "malformed head: {what}"),
            ParseError::Field(e) => write!(f, "{e}"),
            ParseError::Host => f.write_str("missing or repeated Host"),
            ParseError::Framing(e) => write!(f, "{e}"),
            ParseError::Version => f.write_str("unsupported HTTP version"),
        }
    }
}

impl From<FieldError> for ParseError {
    fn from(e: FieldError) -> Self {
        match e {
            FieldError::TooMany => ParseError::TooManyFields,
            e => ParseError::Field(e),
        }
    }
}

fn syntax(e: httparse::Error) -> ParseError {
    match e {
        httparse::Error::TooManyHeaders => ParseError::TooManyFields,
        httparse::Error::Version => ParseError::Version,
        e => ParseError::Syntax(match e {
            httparse::Error::HeaderName => "field name",
            httparse::Error::HeaderValue => "field value",
            httparse::Error::NewLine => "line ending",
            httparse::Error::Status => "status",
            httparse::Error::Token => "method or token",
            _ => "head",
        }),
    }
}

/// Where the blank line that ends a head may be: only worth calling httparse
/// again once the bytes from `from` contain `\n\r\n` or `\n\n`. Keeps a
/// slowloris head from costing quadratic parsing.
pub fn may_be_complete(buf: &[u8], from: usize) -> bool {
    let start = from.saturating_sub(3);
    let tail = buf.get(start..).unwrap_or(&[]);
    // Each line's `\n`, found by memchr; a head has a few lines, and this
    // costs less than setting up a substring search for each needle.
    memchr::memchr_iter(b'\n', tail)
        .any(|i| matches!(tail.get(i + 1..), Some([b'\n', ..] | [b'\r', b'\n', ..])))
}

/// httparse's field slots, left uninitialised: it writes the ones it fills,
/// so the 100 slots are not zeroed for every head.
type RawFields<'b> = [MaybeUninit<httparse::Header<'b>>; MAX_FIELDS];

/// Merges the parsed field lines into `headers` (emptied first); returns
/// the number of `Host` and of `Transfer-Encoding` lines. Those are counted
/// on the raw lines, since merging collapses identical values into one.
fn merge_fields(
    head: &[u8],
    lines: &[httparse::Header<'_>],
    headers: &mut HeaderList,
) -> Result<(usize, usize), ParseError> {
    headers.clear();
    // The lines as received, from the first name on, copied in one piece:
    // most lines are then taken where they lie.
    let block = lines.first().and_then(|first| {
        let from = (first.name.as_ptr() as usize).checked_sub(head.as_ptr() as usize)?;
        headers.take_block(head.get(from..)?)
    });
    let (mut hosts, mut codings) = (0, 0);
    for h in lines {
        let merged = match &block {
            Some(block) => headers.merge_parsed_in(block, h.name.as_bytes(), h.value),
            None => headers.merge_parsed(h.name.as_bytes(), h.value),
        };
        match merged? {
            Class::Host => hosts += 1,
            Class::TransferEncoding => codings += 1,
            _ => {}
        }
    }
    // Two Transfer-Encoding lines mean either `chunked` applied twice or a
    // coding besides chunked: both refused (RFC 9112 §6.1).
    if codings > 1 {
        return Err(ParseError::Framing(FramingError::TransferNotChunked));
    }
    Ok((hosts, codings))
}

/// Whether the list value of the field of class `class` has `token`.
fn has_token(headers: &HeaderList, class: Class, token: &[u8]) -> bool {
    headers.get_class(class).is_some_and(|v| list_elements(v).any(|e| e.eq_ignore_ascii_case(token)))
}

/// A parsed client request head.
#[derive(Clone, Debug, Default)]
pub struct RequestHead {
    pub method: SmallVec<[u8; 16]>,
    /// Request target exactly as sent (path and query, byte for byte).
    pub target: SmallVec<[u8; 64]>,
    pub http10: bool,
    /// End-to-end fields only: hop-by-hop, `content-length` and `expect`
    /// are removed; the writer re-derives framing.
    pub headers: HeaderList,
    pub framing: Framing,
    /// Bytes of the head, blank line included.
    pub len: usize,
    /// Whether the client allows the connection to be reused.
    pub keep_alive: bool,
    /// `Expect: 100-continue` was sent.
    pub expect_continue: bool,
}

impl RequestHead {
    pub fn is_method(&self, m: &[u8]) -> bool {
        self.method.as_slice() == m
    }
}

/// Parse a request head at the front of `buf`. `Ok(None)`: incomplete.
pub fn parse_request(buf: &[u8]) -> Result<Option<RequestHead>, ParseError> {
    let mut head = RequestHead::default();
    Ok(parse_request_into(buf, &mut head)?.then_some(head))
}

/// `parse_request` into a head kept by the caller, reused from one request
/// to the next: no 1 KiB field arena is zeroed and no head is moved.
/// `Ok(true)`: `head` is the request's, every part of it replaced;
/// `Ok(false)`: incomplete, `head` untouched; on an error `head` is left
/// partly replaced.
pub fn parse_request_into(buf: &[u8], head: &mut RequestHead) -> Result<bool, ParseError> {
    let mut raw: RawFields<'_> = [const { MaybeUninit::uninit() }; MAX_FIELDS];
    let mut req = httparse::Request::new(&mut []);
    let len = match req.parse_with_uninit_headers(buf, &mut raw) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() >= MAX_REQUEST_HEAD => return Err(ParseError::TooLarge),
        Ok(httparse::Status::Partial) => return Ok(false),
        Err(e) => return Err(syntax(e)),
    };
    if len > MAX_REQUEST_HEAD {
        return Err(ParseError::TooLarge);
    }
    let (Some(method), Some(path), Some(version)) = (req.method, req.path, req.version) else {
        return Err(ParseError::Syntax("request line"));
    };
    let http10 = version == 0;
    let headers = &mut head.headers;
    let (hosts, _) = merge_fields(buf.get(..len).unwrap_or_default(), req.headers, headers)?;
    // RFC 9112 §3.2: a server MUST answer 400 to no Host (1.1) or several.
    if hosts > 1 || (hosts == 0 && !http10) {
        return Err(ParseError::Host);
    }
    let framing = request_framing(headers, http10).map_err(ParseError::Framing)?;
    let keep_alive = !http10 && !has_token(headers, Class::Connection, b"close");
    let expect_continue =
        headers.get_class(Class::Expect).is_some_and(|v| v.eq_ignore_ascii_case(b"100-continue"));
    headers.strip_for_forwarding(&[Class::ContentLength, Class::Expect]);
    head.method.clear();
    head.method.extend_from_slice(method.as_bytes());
    head.target.clear();
    head.target.extend_from_slice(path.as_bytes());
    head.http10 = http10;
    head.framing = framing;
    head.len = len;
    head.keep_alive = keep_alive;
    head.expect_continue = expect_continue;
    Ok(true)
}

/// A parsed upstream response head.
#[derive(Clone, Debug, Default)]
pub struct ResponseHead {
    pub status: u16,
    pub reason: SmallVec<[u8; 32]>,
    pub http10: bool,
    /// End-to-end fields only (hop-by-hop and `content-length` removed).
    pub headers: HeaderList,
    pub framing: Framing,
    /// For bodiless responses (HEAD, 304): the Content-Length the upstream
    /// announced, relayed as information.
    pub advertised_length: Option<u64>,
    pub len: usize,
    /// Whether the upstream allows the connection to be reused.
    pub keep_alive: bool,
}

impl ResponseHead {
    pub fn is_interim(&self) -> bool {
        (100..200).contains(&self.status)
    }
}

/// Parse a response head at the front of `buf`, for a request whose method
/// was HEAD if `head_request`. `Ok(None)`: incomplete.
pub fn parse_response(buf: &[u8], head_request: bool) -> Result<Option<ResponseHead>, ParseError> {
    let mut head = ResponseHead::default();
    Ok(parse_response_into(buf, head_request, &mut head)?.then_some(head))
}

/// `parse_response` into a head kept by the caller, as `parse_request_into`.
pub fn parse_response_into(
    buf: &[u8],
    head_request: bool,
    head: &mut ResponseHead,
) -> Result<bool, ParseError> {
    let mut raw: RawFields<'_> = [const { MaybeUninit::uninit() }; MAX_FIELDS];
    let mut resp = httparse::Response::new(&mut []);
    let config = httparse::ParserConfig::default();
    let len = match config.parse_response_with_uninit_headers(&mut resp, buf, &mut raw) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() >= MAX_RESPONSE_HEAD => return Err(ParseError::TooLarge),
        Ok(httparse::Status::Partial) => return Ok(false),
        Err(e) => return Err(syntax(e)),
    };
    if len > MAX_RESPONSE_HEAD {
        return Err(ParseError::TooLarge);
    }
    let (Some(status), Some(version)) = (resp.code, resp.version) else {
        return Err(ParseError::Syntax("status line"));
    };
    // httparse takes any three digits; RFC 9110 §15 defines 100-599 only.
    if !(100..=599).contains(&status) {
        return Err(ParseError::Syntax("status code"));
    }
    let headers = &mut head.headers;
    merge_fields(buf.get(..len).unwrap_or_default(), resp.headers, headers)?;
    let framing = response_framing(headers, status, head_request).map_err(ParseError::Framing)?;
    let advertised_length = match framing {
        Framing::None => headers.get_class(Class::ContentLength).and_then(parse_digits),
        _ => None,
    };
    let http10 = version == 0;
    let keep_alive = if http10 {
        has_token(headers, Class::Connection, b"keep-alive")
    } else {
        !has_token(headers, Class::Connection, b"close")
    } && framing != Framing::UntilClose;
    headers.strip_for_forwarding(&[Class::ContentLength]);
    head.status = status;
    head.reason.clear();
    head.reason.extend_from_slice(resp.reason.unwrap_or("").as_bytes());
    head.http10 = http10;
    head.framing = framing;
    head.advertised_length = advertised_length;
    head.len = len;
    head.keep_alive = keep_alive;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    const REQ: &[u8] = b"POST /mcp?x=1 HTTP/1.1\r\nHost: 127.0.0.1:1\r\nContent-Type: application/json\r\nMcp-Session-Id: abc\r\nmcp-session-id: abc\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\nContent-Length: 2\r\n\r\n{}";

    #[test]
    fn request_parsed_and_cleaned() {
        let h = parse_request(REQ).unwrap().unwrap();
        assert_eq!(h.method.as_slice(), b"POST");
        assert_eq!(h.target.as_slice(), b"/mcp?x=1");
        assert_eq!(h.framing, Framing::Length(2));
        assert_eq!(h.len, REQ.len() - 2);
        assert!(h.keep_alive && !h.http10 && !h.expect_continue);
        let mut out = Vec::new();
        h.headers.write_to(&mut out);
        assert_eq!(out, b"host: 127.0.0.1:1\r\ncontent-type: application/json\r\nmcp-session-id: abc\r\n");
    }

    #[test]
    fn a_reused_head_is_the_fresh_parse() {
        let mut big =
            b"POST /big HTTP/1.1\r\nHost: b\r\nConnection: close\r\nExpect: 100-continue\r\nX-Big: ".to_vec();
        big.resize(big.len() + 2000, b'a');
        big.extend_from_slice(b"\r\nContent-Length: 1\r\n\r\n");
        let small = &b"GET / HTTP/1.0\r\nX-A: 1\r\n\r\n"[..];
        let mut reused = RequestHead::default();
        for raw in [&big[..], REQ, small, REQ, &big[..]] {
            assert!(parse_request_into(raw, &mut reused).unwrap());
            let fresh = parse_request(raw).unwrap().unwrap();
            assert_eq!(format!("{reused:?}"), format!("{fresh:?}"));
            assert!(reused.headers.iter().eq(fresh.headers.iter()));
            let (mut a, mut b) = (Vec::new(), Vec::new());
            reused.headers.write_to(&mut a);
            fresh.headers.write_to(&mut b);
            assert_eq!(a, b);
        }
        // Incomplete: the head is left as it was.
        assert!(!parse_request_into(&REQ[..10], &mut reused).unwrap());
        assert_eq!(reused.target.as_slice(), b"/big");

        let mut resp = ResponseHead::default();
        for raw in [RESP, &b"HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\n\r\n"[..], RESP] {
            assert!(parse_response_into(raw, false, &mut resp).unwrap());
            let fresh = parse_response(raw, false).unwrap().unwrap();
            assert_eq!(format!("{resp:?}"), format!("{fresh:?}"));
            assert!(resp.headers.iter().eq(fresh.headers.iter()));
        }
    }

    #[test]
    fn request_split_at_every_offset() {
        let head_len = REQ.len() - 2;
        for i in 0..head_len {
            assert!(parse_request(&REQ[..i]).unwrap().is_none(), "complete at {i}");
        }
        for i in head_len..=REQ.len() {
            assert_eq!(parse_request(&REQ[..i]).unwrap().unwrap().len, head_len);
        }
    }

    macro_rules! bad_req {
        ($($name:ident: $bytes:expr => $want:expr;)*) => {
            #[test]
            fn bad_requests() {
                $(
                    let got = parse_request($bytes).map(|h| h.map(|h| h.len));
                    assert_eq!(got.map_err(|e| e.client_status()), Err($want), stringify!($name));
                )*
            }
        };
    }

    bad_req! {
        cl_and_te: b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n" => 400;
        two_cls: b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n" => 400;
        cl_list_differs: b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3, 4\r\n\r\n" => 400;
        te_not_chunked: b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n" => 400;
        te_gzip_chunked: b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n" => 501;
        obs_fold: b"GET / HTTP/1.1\r\nHost: a\r\nX-A: b\r\n c\r\n\r\n" => 400;
        space_before_colon: b"GET / HTTP/1.1\r\nHost : a\r\n\r\n" => 400;
        nul_in_value: b"GET / HTTP/1.1\r\nHost: a\r\nX-A: b\0c\r\n\r\n" => 400;
        cr_in_value: b"GET / HTTP/1.1\r\nHost: a\r\nX-A: b\rc\r\n\r\n" => 400;
        no_host: b"GET / HTTP/1.1\r\nX-A: b\r\n\r\n" => 400;
        two_hosts_same: b"GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n" => 400;
        two_hosts_differ: b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n" => 400;
        two_session_ids: b"GET / HTTP/1.1\r\nHost: a\r\nMcp-Session-Id: a\r\nmcp-session-id: b\r\n\r\n" => 400;
        bad_method: b"G(T / HTTP/1.1\r\nHost: a\r\n\r\n" => 400;
        space_in_target: b"GET /a b HTTP/1.1\r\nHost: a\r\n\r\n" => 400;
        http2: b"GET / HTTP/2.0\r\nHost: a\r\n\r\n" => 400;
        te_on_http10: b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n" => 400;
        te_chunked_on_two_lines: b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n" => 400;
    }

    #[test]
    fn limits() {
        let mut many = b"GET / HTTP/1.1\r\nHost: a\r\n".to_vec();
        for i in 0..MAX_FIELDS {
            many.extend_from_slice(format!("X-{i}: v\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        assert_eq!(parse_request(&many).unwrap_err(), ParseError::TooManyFields);
        let mut big = b"GET / HTTP/1.1\r\nHost: a\r\nX-Big: ".to_vec();
        big.resize(MAX_REQUEST_HEAD + 10, b'a');
        assert_eq!(parse_request(&big).unwrap_err(), ParseError::TooLarge);
    }

    #[test]
    fn expect_and_http10() {
        let h =
            parse_request(b"POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-Continue\r\nContent-Length: 1\r\n\r\n")
                .unwrap()
                .unwrap();
        assert!(h.expect_continue);
        assert!(h.headers.get(b"expect").is_none());
        let h = parse_request(b"GET / HTTP/1.0\r\n\r\n").unwrap().unwrap();
        assert!(h.http10 && !h.keep_alive);
        let h = parse_request(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").unwrap().unwrap();
        assert!(!h.keep_alive);
    }

    const RESP: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nMCP-SESSION-ID: s1\r\nMcp-Session-Id: s1\r\nTransfer-Encoding: chunked\r\nKeep-Alive: timeout=5\r\n\r\n5\r\nhello\r\n";

    #[test]
    fn response_parsed_and_cleaned() {
        let h = parse_response(RESP, false).unwrap().unwrap();
        assert_eq!(h.status, 200);
        assert_eq!(h.framing, Framing::Chunked);
        assert!(h.keep_alive);
        let mut out = Vec::new();
        h.headers.write_to(&mut out);
        assert_eq!(out, b"content-type: text/event-stream\r\nmcp-session-id: s1\r\n");
        for i in 0..h.len {
            assert!(parse_response(&RESP[..i], false).unwrap().is_none());
        }
    }

    #[test]
    fn response_errors_and_bodiless() {
        let bad: &[&[u8]] = &[
            b"HTTP/1.1 200 OK\r\nMcp-Session-Id: a\r\nmcp-session-id: b\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"HTTP/1.1 2000 OK\r\n\r\n",
            b"HTTQ/1.1 200 OK\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nX-A: b\r\n c\r\n\r\n",
        ];
        for b in bad {
            assert!(parse_response(b, false).is_err(), "{:?}", String::from_utf8_lossy(b));
        }
        let h = parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 42\r\n\r\n", true).unwrap().unwrap();
        assert_eq!((h.framing, h.advertised_length), (Framing::None, Some(42)));
        let h = parse_response(b"HTTP/1.1 204 No Content\r\n\r\n", false).unwrap().unwrap();
        assert_eq!(h.framing, Framing::None);
        let h = parse_response(b"HTTP/1.0 200 OK\r\n\r\n", false).unwrap().unwrap();
        assert_eq!(h.framing, Framing::UntilClose);
        assert!(!h.keep_alive);
        let h = parse_response(b"HTTP/1.1 100 Continue\r\n\r\n", false).unwrap().unwrap();
        assert!(h.is_interim());
    }

    // Found by the response_head fuzz target (corpus file
    // crash-status-below-100): status 020 was taken as a final response
    // with a body.
    #[test]
    fn regression_status_code_outside_100_599_is_refused() {
        for bad in [&b"HTTP/1.1 020 OK\r\n\r\n"[..], b"HTTP/1.1 000 X\r\n\r\n", b"HTTP/1.1 600 X\r\n\r\n"] {
            assert_eq!(parse_response(bad, false).unwrap_err(), ParseError::Syntax("status code"));
        }
        assert!(parse_response(b"HTTP/1.1 599 X\r\n\r\n", false).unwrap().is_some());
    }

    #[test]
    fn blank_line_detector() {
        assert!(!may_be_complete(b"GET / HTTP/1.1\r\nHost: a\r\n", 0));
        assert!(may_be_complete(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n", 25));
        assert!(may_be_complete(b"GET / HTTP/1.1\nHost: a\n\n", 24));
        // Every prefix of a head and every scanned mark in it: a blank
        // line that ends at or after the mark (the last three scanned
        // bytes may begin it) is found, and nothing else is.
        for head in [
            &b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"[..],
            b"GET / HTTP/1.1\nHost: a\n\n",
            b"GET / HTTP/1.1\r\nA: b\n\r\n",
            b"\n\n\r\n\r\r\n\n",
        ] {
            for end in 0..=head.len() {
                let buf = &head[..end];
                for from in 0..=end {
                    let tail = &buf[from.saturating_sub(3)..];
                    let want =
                        tail.windows(3).any(|w| w == b"\n\r\n") || tail.windows(2).any(|w| w == b"\n\n");
                    assert_eq!(may_be_complete(buf, from), want, "{buf:?} from {from}");
                }
            }
        }
    }

    /// Lines taken where they lie (`take_block`, `merge_parsed_in`) give
    /// the list merging each line on its own gives: whatever the spacing
    /// around the value, the line ends, the case, repeats of a name, and
    /// heads too large for the block or growing past the inline bytes while
    /// merged.
    #[test]
    fn lines_taken_in_place_are_the_lines_merged_one_by_one() {
        let mut rng = crate::test_rng::Rng(0xB10C_4EAD);
        let names: Vec<&str> = "Host host HOST Accept accept X-List x-list Mcp-Session-Id Set-Cookie \
             Content-Type Connection X-Hop Origin X-Long-Field-Name-Of-Some-Length a Ab"
            .split_whitespace()
            .collect();
        let values: &[&str] = &["", "1", "a, b", "keep-alive, X-Hop", "text/plain", "v"];
        let mut in_place = RequestHead::default();
        let (mut same, mut refused) = (0, 0);
        for round in 0..4000 {
            let mut raw = String::from("GET / HTTP/1.1\r\n");
            let eol = if rng.below(8) == 0 { "\n" } else { "\r\n" };
            raw.push_str(&format!("Host: h{eol}"));
            for _ in 0..rng.below(12) {
                let name = rng.pick(&names);
                let value = if rng.below(10) == 0 {
                    "x".repeat(rng.below(600))
                } else {
                    rng.pick(values).to_string()
                };
                let before = rng.pick(&[": ", ":", ":  ", ":\t", ": "]);
                let after = rng.pick(&["", "", "", " ", "\t"]);
                raw.push_str(&format!("{name}{before}{value}{after}{eol}"));
            }
            raw.push_str(eol);
            // The line-by-line merge of what httparse read.
            let mut fields = [httparse::EMPTY_HEADER; MAX_FIELDS];
            let mut req = httparse::Request::new(&mut fields);
            let Ok(httparse::Status::Complete(_)) = req.parse(raw.as_bytes()) else { continue };
            let mut one_by_one = HeaderList::new();
            let merged: Result<(), FieldError> =
                req.headers.iter().try_for_each(|h| one_by_one.merge_line(h.name.as_bytes(), h.value));
            // The head kept from round to round, as a connection keeps it.
            let parsed = parse_request_into(raw.as_bytes(), &mut in_place);
            match (merged, parsed) {
                (Ok(()), Ok(true)) => {
                    one_by_one.strip_for_forwarding(&[Class::ContentLength, Class::Expect]);
                    let (mut a, mut b) = (Vec::new(), Vec::new());
                    one_by_one.write_to(&mut a);
                    in_place.headers.write_to(&mut b);
                    assert_eq!(
                        String::from_utf8_lossy(&a),
                        String::from_utf8_lossy(&b),
                        "round {round}: {raw:?}"
                    );
                    for name in &names {
                        assert_eq!(one_by_one.get(name.as_bytes()), in_place.headers.get(name.as_bytes()));
                    }
                    assert_eq!(in_place.headers.get_name(super::super::headers::name::HOST), Some(&b"h"[..]));
                    same += 1;
                }
                (Err(_), Err(_)) => refused += 1,
                (m, p) => panic!("round {round}: merged {m:?}, parsed {p:?}: {raw:?}"),
            }
        }
        assert!(same > 1000 && refused > 100, "{same} compared, {refused} refused by both");
        // Joined values grow the list past its inline bytes in the middle
        // of the block: the lines after are still lowercased where they are.
        let part = "p".repeat(300);
        let raw = format!(
            "GET / HTTP/1.1\r\nHost: h\r\nX-List: {part}1\r\nX-List: {part}2\r\nX-List: {part}3\r\nAccept: x\r\n\r\n"
        );
        let head = parse_request(raw.as_bytes()).unwrap().unwrap();
        let mut out = Vec::new();
        head.headers.write_to(&mut out);
        let want = format!("host: h\r\nx-list: {part}1, {part}2, {part}3\r\naccept: x\r\n");
        assert_eq!(String::from_utf8_lossy(&out), want);
    }
}

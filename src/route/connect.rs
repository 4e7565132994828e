//! The `CONNECT` exchange that opens a tunnel through a forward proxy
//! (RFC 9110 §9.3.6): the request written once at start, and the reading
//! of the proxy's answer head with `http::head` (the one response-head
//! grammar). Any 2xx opens the tunnel; after it the upstream's bytes
//! follow, so a proxy that sends bytes of its own after the 2xx (before
//! the client has spoken) is refused. Pure.

use crate::http::head::{parse_response, ParseError};
use crate::limits::MAX_PROXY_ANSWER_HEAD;
use std::fmt;

/// What every tunnel through the proxy starts with.
#[derive(Clone)]
pub struct ConnectSetup {
    /// The proxy's `host:port` (the log lines' name for it).
    pub proxy: String,
    /// The upstream's `host:port` as the `CONNECT` target.
    pub target: String,
    /// The request, `Proxy-Authorization` in it when credentials were
    /// given: never logged.
    request: Box<[u8]>,
}

impl fmt::Debug for ConnectSetup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectSetup").field("proxy", &self.proxy).field("target", &self.target).finish()
    }
}

impl ConnectSetup {
    /// `target`: `host:port` of the upstream (an IPv6 address in
    /// brackets), the request target in authority-form (RFC 9112 §3.2.3)
    /// and the `Host` field; `authorization`: the `Proxy-Authorization`
    /// value.
    pub fn new(proxy: String, target: String, authorization: Option<&str>) -> ConnectSetup {
        let mut r = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
        if let Some(auth) = authorization {
            r.push_str("Proxy-Authorization: ");
            r.push_str(auth);
            r.push_str("\r\n");
        }
        r.push_str("\r\n");
        ConnectSetup { proxy, target, request: r.into_bytes().into_boxed_slice() }
    }

    pub fn request(&self) -> &[u8] {
        &self.request
    }
}

/// Where the proxy's answer stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply {
    /// Not a whole head yet: read on.
    Partial,
    /// A 2xx: the tunnel is open.
    Open,
    /// Another final status: the proxy refused (407, 403, 502, ...).
    Refused(u16),
    /// Not an answer the tunnel can go on with.
    Invalid(Invalid),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Invalid {
    /// The head did not parse.
    Head(ParseError),
    /// The head passed `MAX_PROXY_ANSWER_HEAD`.
    TooLarge,
    /// A 1xx: no interim answer belongs to a CONNECT here.
    Interim(u16),
    /// Bytes after the 2xx head, before the client spoke.
    Trailing,
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Invalid::Head(e) => write!(f, "an invalid answer to CONNECT ({e})"),
            Invalid::TooLarge => write!(f, "an answer head to CONNECT over {MAX_PROXY_ANSWER_HEAD} bytes"),
            Invalid::Interim(s) => write!(f, "an interim {s} answer to CONNECT"),
            Invalid::Trailing => f.write_str("bytes of its own after its 2xx answer to CONNECT"),
        }
    }
}

/// Reads the proxy's answer from what arrived so far (`buf`, from the
/// first byte the proxy sent).
pub fn read_reply(buf: &[u8]) -> Reply {
    match parse_response(buf, false) {
        Ok(None) if buf.len() >= MAX_PROXY_ANSWER_HEAD => Reply::Invalid(Invalid::TooLarge),
        Ok(None) => Reply::Partial,
        Ok(Some(head)) if head.len > MAX_PROXY_ANSWER_HEAD => Reply::Invalid(Invalid::TooLarge),
        Ok(Some(head)) if head.is_interim() => Reply::Invalid(Invalid::Interim(head.status)),
        Ok(Some(head)) if (200..300).contains(&head.status) => match buf.len() > head.len {
            true => Reply::Invalid(Invalid::Trailing),
            false => Reply::Open,
        },
        Ok(Some(head)) => Reply::Refused(head.status),
        Err(ParseError::TooLarge) => Reply::Invalid(Invalid::TooLarge),
        Err(e) => Reply::Invalid(Invalid::Head(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_names_the_upstream_and_carries_the_credentials() {
        let s = ConnectSetup::new("p:3128".into(), "mcp.example.com:443".into(), None);
        assert_eq!(s.request(), b"CONNECT mcp.example.com:443 HTTP/1.1\r\nHost: mcp.example.com:443\r\n\r\n");
        let s = ConnectSetup::new("p:3128".into(), "[::1]:8443".into(), Some("Basic dTpw"));
        assert_eq!(
            s.request(),
            b"CONNECT [::1]:8443 HTTP/1.1\r\nHost: [::1]:8443\r\nProxy-Authorization: Basic dTpw\r\n\r\n"
        );
        assert!(!format!("{s:?}").contains("dTpw"));
    }

    const CASES: &[(&[u8], Reply)] = &[
        (b"HTTP/1.1 200 Connection established\r\n\r\n", Reply::Open),
        (b"HTTP/1.0 200 Connection established\r\nProxy-agent: tinyproxy/1.11.1\r\n\r\n", Reply::Open),
        (b"HTTP/1.1 204 OK\r\n\r\n", Reply::Open),
        (b"HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"x\"\r\nContent-Length: 3\r\n\r\n", Reply::Refused(407)),
        (b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n", Reply::Refused(403)),
        (b"HTTP/1.0 502 Bad Gateway\r\n\r\n<html>", Reply::Refused(502)),
        (b"HTTP/1.1 200 OK\r\n\r\nX", Reply::Invalid(Invalid::Trailing)),
        (b"HTTP/1.1 100 Continue\r\n\r\n", Reply::Invalid(Invalid::Interim(100))),
        (b"HTTP/1.1 200", Reply::Partial),
        (b"", Reply::Partial),
    ];

    #[test]
    fn answers_whole_and_split_at_every_offset() {
        for &(bytes, want) in CASES {
            assert_eq!(read_reply(bytes), want, "{:?}", String::from_utf8_lossy(bytes));
            // A prefix is Partial, or already the verdict (a refusal's
            // body, trailing bytes), never something else.
            for i in 0..bytes.len() {
                let got = read_reply(&bytes[..i]);
                let head_end = bytes.windows(4).position(|w| w == b"\r\n\r\n").map_or(usize::MAX, |p| p + 4);
                if i < head_end {
                    assert_eq!(got, Reply::Partial, "{:?} at {i}", String::from_utf8_lossy(bytes));
                }
            }
        }
    }

    #[test]
    fn garbage_and_floods_are_invalid() {
        assert!(matches!(read_reply(b"SSH-2.0-OpenSSH_9.2\r\n\r\n"), Reply::Invalid(Invalid::Head(_))));
        assert!(matches!(read_reply(b"\x16\x03\x01\x00\x05hello\r\n\r\n"), Reply::Invalid(Invalid::Head(_))));
        let flood = vec![b'a'; MAX_PROXY_ANSWER_HEAD];
        assert!(matches!(read_reply(&flood), Reply::Invalid(_)));
        let mut long = b"HTTP/1.1 200 OK\r\n".to_vec();
        while long.len() < MAX_PROXY_ANSWER_HEAD + 10 {
            long.extend_from_slice(b"X-Pad: aaaaaaaaaaaaaaaaaaaaaaaa\r\n");
        }
        assert!(matches!(read_reply(&long), Reply::Invalid(_)));
    }
}

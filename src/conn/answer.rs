//! Every response the proxy makes itself, as one `Answer`: its status, its
//! JSON-RPC error code, whether the connection closes after it, the reason
//! logged when it does, and its message. The client's side of a failure
//! gets a 4xx, the upstream's a 502 or 504 (RFC 9110 §15.6.3, §15.6.5: a
//! gateway that got an invalid response or none in time). Pure.

use super::CloseReason;
use crate::http::guard::Refusal;
use crate::http::head::ParseError;
use crate::http::headers::HeaderList;
use crate::http::write::{self, BodyField};
use crate::mcp::stamp::StampError;
use std::borrow::Cow;
use std::fmt;

/// JSON-RPC 2.0 §5.1: the request is not a valid Request object.
const INVALID_REQUEST: i32 = -32600;
/// JSON-RPC 2.0 §5.1: -32000 to -32099 are reserved for server errors.
const SERVER_ERROR: i32 = -32000;

/// A response made by the proxy instead of the upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The request head could not be parsed (400, 431 or 501).
    BadHead(ParseError),
    /// Admission refused the request (400, 401 or 403).
    Refused(Refusal),
    /// The request body, announced or read, passes the bound (413).
    BodyTooLarge,
    /// The request's chunked framing is invalid (400).
    MalformedBody,
    /// The body could not be scanned or stamped: never forwarded (400).
    BodyRefused(StampError),
    /// The request head or body did not arrive in time (408).
    RequestTimeout,
    /// No upstream connection could be made (502).
    UpstreamUnreachable,
    /// The upstream connect did not complete in time (504).
    ConnectTimeout,
    /// The upstream closed without a response (502).
    UpstreamClosed,
    /// The upstream's response head was invalid or too large (502).
    BadUpstream,
    /// No response head from the upstream in time (504).
    UpstreamTimeout,
}

impl Answer {
    pub fn status(self) -> u16 {
        match self {
            Answer::BadHead(e) => e.client_status(),
            Answer::Refused(r) => r.status(),
            Answer::BodyTooLarge => 413,
            Answer::MalformedBody | Answer::BodyRefused(_) => 400,
            Answer::RequestTimeout => 408,
            Answer::UpstreamUnreachable | Answer::UpstreamClosed | Answer::BadUpstream => 502,
            Answer::ConnectTimeout | Answer::UpstreamTimeout => 504,
        }
    }

    pub fn jsonrpc_code(self) -> i32 {
        match self {
            Answer::BodyRefused(e) => e.jsonrpc_code(),
            Answer::BadHead(_)
            | Answer::Refused(_)
            | Answer::BodyTooLarge
            | Answer::MalformedBody
            | Answer::RequestTimeout => INVALID_REQUEST,
            Answer::UpstreamUnreachable
            | Answer::ConnectTimeout
            | Answer::UpstreamClosed
            | Answer::BadUpstream
            | Answer::UpstreamTimeout => SERVER_ERROR,
        }
    }

    /// The client's connection closes after this answer: its request
    /// stream can no longer be trusted (a head or body not read to its
    /// end, or a client that is not admitted).
    pub fn closes(self) -> bool {
        matches!(
            self,
            Answer::BadHead(_)
                | Answer::Refused(_)
                | Answer::BodyTooLarge
                | Answer::MalformedBody
                | Answer::RequestTimeout
        )
    }

    /// Logged when the connection closes after this answer.
    pub fn close_reason(self) -> CloseReason {
        match self.status() {
            408 => CloseReason::RequestTimeout,
            502 => CloseReason::UpstreamFailed,
            504 => CloseReason::UpstreamTimeout,
            _ => CloseReason::BadRequest,
        }
    }

    /// The JSON-RPC error message; it carries no byte of the request.
    pub fn message(self) -> Cow<'static, str> {
        Cow::Borrowed(match self {
            Answer::BadHead(e) => return Cow::Owned(e.to_string()),
            Answer::BodyRefused(e) => return Cow::Owned(e.to_string()),
            Answer::Refused(r) => r.message(),
            Answer::BodyTooLarge => "request body too large",
            Answer::MalformedBody => "malformed chunked body",
            Answer::RequestTimeout => "request not received in time",
            Answer::UpstreamUnreachable => "upstream unreachable",
            Answer::ConnectTimeout => "upstream connect timed out",
            Answer::UpstreamClosed => "upstream closed the connection without a response",
            Answer::BadUpstream => "invalid upstream response",
            Answer::UpstreamTimeout => "upstream did not answer in time",
        })
    }

    /// The JSON-RPC error body. It has no `id` yet: it answers the HTTP
    /// request; this is the one place that writes it.
    pub fn write_body(self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"error\":{\"code\":");
        let code = self.jsonrpc_code();
        if code < 0 {
            out.push(b'-');
        }
        write::push_decimal(out, u64::from(code.unsigned_abs()));
        out.extend_from_slice(b",\"message\":");
        crate::mcp::json::write_json_string(&self.message(), out);
        out.extend_from_slice(b"}}");
    }

    /// Appends the whole response (head and body) to `out`, with
    /// `connection: close` when `close`; returns the body's length. `body`
    /// is scratch space, cleared first.
    pub fn write(self, close: bool, body: &mut Vec<u8>, out: &mut Vec<u8>) -> usize {
        body.clear();
        self.write_body(body);
        let mut fields = HeaderList::new();
        // A constant, valid field: `set` cannot fail here.
        let _ = fields.set(b"content-type", b"application/json");
        let status = self.status();
        write::response_head(
            out,
            status,
            reason_phrase(status),
            &fields,
            BodyField::Length(body.len() as u64),
            close,
        );
        out.extend_from_slice(body);
        body.len()
    }
}

impl fmt::Display for Answer {
    /// How the exchange ended, for its log line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message())
    }
}

fn reason_phrase(status: u16) -> &'static [u8] {
    match status {
        400 => b"Bad Request",
        401 => b"Unauthorized",
        403 => b"Forbidden",
        408 => b"Request Timeout",
        413 => b"Content Too Large",
        431 => b"Request Header Fields Too Large",
        501 => b"Not Implemented",
        502 => b"Bad Gateway",
        504 => b"Gateway Timeout",
        _ => b"Error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_answer_is_a_complete_json_response() {
        let all = [
            Answer::BadHead(ParseError::TooLarge),
            Answer::BadHead(ParseError::Host),
            Answer::Refused(Refusal::ClientToken),
            Answer::Refused(Refusal::Origin),
            Answer::BodyTooLarge,
            Answer::MalformedBody,
            Answer::RequestTimeout,
            Answer::UpstreamUnreachable,
            Answer::ConnectTimeout,
            Answer::UpstreamClosed,
            Answer::BadUpstream,
            Answer::UpstreamTimeout,
        ];
        for a in all {
            let (mut body, mut out) = (Vec::new(), Vec::new());
            let n = a.write(a.closes(), &mut body, &mut out);
            let text = String::from_utf8(out).unwrap();
            let (head, json) = text.split_once("\r\n\r\n").unwrap();
            assert_eq!(json.len(), n, "{a:?}");
            assert!(head.starts_with(&format!("HTTP/1.1 {} ", a.status())), "{head}");
            assert!(head.contains(&format!("\r\ncontent-length: {n}")), "{head}");
            assert_eq!(head.ends_with("connection: close"), a.closes(), "{head}");
            let v: serde_json::Value = serde_json::from_str(json).unwrap();
            assert_eq!(v["jsonrpc"], "2.0");
            assert_eq!(v["error"]["code"], a.jsonrpc_code());
            assert_eq!(v["error"]["message"], a.to_string());
        }
    }

    #[test]
    fn the_side_at_fault_chooses_the_status() {
        let cases = [
            (Answer::BadHead(ParseError::TooLarge), 431, -32600, true, CloseReason::BadRequest),
            (Answer::Refused(Refusal::Host), 403, -32600, true, CloseReason::BadRequest),
            (Answer::BodyTooLarge, 413, -32600, true, CloseReason::BadRequest),
            (Answer::RequestTimeout, 408, -32600, true, CloseReason::RequestTimeout),
            (Answer::UpstreamUnreachable, 502, -32000, false, CloseReason::UpstreamFailed),
            (Answer::BadUpstream, 502, -32000, false, CloseReason::UpstreamFailed),
            (Answer::UpstreamTimeout, 504, -32000, false, CloseReason::UpstreamTimeout),
            (Answer::ConnectTimeout, 504, -32000, false, CloseReason::UpstreamTimeout),
        ];
        for (a, status, code, closes, reason) in cases {
            assert_eq!(
                (a.status(), a.jsonrpc_code(), a.closes(), a.close_reason()),
                (status, code, closes, reason)
            );
        }
    }
}

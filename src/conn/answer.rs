//! Every response the proxy makes itself, as one `Answer`: its status, its
//! JSON-RPC error code, whether the connection closes after it, the reason
//! logged when it does, and its message. The client's side of a failure
//! gets a 4xx, the upstream's a 502 or 504 (RFC 9110 §15.6.3, §15.6.5: a
//! gateway that got an invalid response or none in time). `Answer` and its
//! writers are pure; the `impl Conn` below queues one on a connection (or,
//! while a reopen replays or a stream is held, hands the failure to them).

use super::{Conn, Ctx, Phase};
use crate::http::guard::Refusal;
use crate::http::head::ParseError;
use crate::http::headers::{name, HeaderList};
use crate::http::write::{self, BodyField};
use crate::mcp::rpc::{self, INVALID_REQUEST, SERVER_ERROR};
use crate::mcp::stamp::StampError;
use log::warn;
use std::borrow::Cow;
use std::fmt;

/// Why a connection ended; logged once at debug.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseReason {
    ClientClosed,
    ClientError,
    ClientIdle,
    RequestTimeout,
    BadRequest,
    UpstreamFailed,
    UpstreamTruncated,
    UpstreamTimeout,
    IdleTimeout,
    Done,
    Shutdown,
    /// A phase taken out to be worked on was not put back (a bug).
    PhaseLost,
}

impl fmt::Display for CloseReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CloseReason::ClientClosed => "client closed",
            CloseReason::ClientError => "client socket error",
            CloseReason::ClientIdle => "idle keep-alive timeout",
            CloseReason::RequestTimeout => "request head or body not received in time",
            CloseReason::BadRequest => "bad request answered",
            CloseReason::UpstreamFailed => "upstream failed",
            CloseReason::UpstreamTruncated => "upstream closed mid-body",
            CloseReason::UpstreamTimeout => "upstream timeout",
            CloseReason::IdleTimeout => "exchange idle timeout",
            CloseReason::Done => "exchange done, connection not reusable",
            CloseReason::Shutdown => "shutting down",
            CloseReason::PhaseLost => "internal error: phase not put back",
        })
    }
}

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
    /// The TLS connection to the upstream failed: handshake refused or not
    /// done within the connect timeout, an alert, a bad record (502).
    UpstreamTls,
    /// The forward proxy refused the tunnel to the upstream (407, 403,
    /// 502, ...), closed, stalled or answered garbage (502).
    UpstreamProxy,
    /// The upstream closed without a response (502).
    UpstreamClosed,
    /// The upstream's response head was invalid or too large (502).
    BadUpstream,
    /// No response head from the upstream in time (504).
    UpstreamTimeout,
    /// The upstream could not be reached for a request in a recorded MCP
    /// session, through the restart grace (502 for GET and DELETE; a POST
    /// gets 200 or 202 from `Conn::answer_outage`).
    UpstreamUnavailable,
    /// The credential source's token has expired and no renewal replaced
    /// it: the request is not sent with it (502; a POST gets 200 or 202
    /// from `Conn::answer_outage`).
    CredentialExpired,
    /// A `tools/call` of a tool the policy hides (200 with JSON-RPC error
    /// -32602 and the request's id, as MCP answers an unknown tool); never
    /// forwarded.
    HiddenTool,
    /// A legacy SSE `POST /messages/` calling a tool the policy hides, for a
    /// session whose GET stream this proxy does not relay (where it does,
    /// the error goes on that stream and the POST gets 202): refused (403)
    /// with the error in its body; never forwarded.
    HiddenToolLegacy,
    /// A legacy SSE `tools/list` while the policy hides something, for a
    /// session whose GET stream this proxy does not relay (so it cannot
    /// filter the answer): refused (403) with the error; never forwarded.
    ListUnfiltered,
}

impl Answer {
    pub fn status(self) -> u16 {
        match self {
            Answer::BadHead(e) => e.client_status(),
            Answer::Refused(r) => r.status(),
            Answer::BodyTooLarge => 413,
            Answer::MalformedBody | Answer::BodyRefused(_) => 400,
            Answer::RequestTimeout => 408,
            Answer::UpstreamUnreachable
            | Answer::UpstreamTls
            | Answer::UpstreamProxy
            | Answer::UpstreamClosed
            | Answer::BadUpstream
            | Answer::UpstreamUnavailable
            | Answer::CredentialExpired => 502,
            Answer::ConnectTimeout | Answer::UpstreamTimeout => 504,
            Answer::HiddenTool => 200,
            Answer::HiddenToolLegacy | Answer::ListUnfiltered => 403,
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
            | Answer::UpstreamTls
            | Answer::UpstreamProxy
            | Answer::ConnectTimeout
            | Answer::UpstreamClosed
            | Answer::BadUpstream
            | Answer::UpstreamTimeout
            | Answer::UpstreamUnavailable
            | Answer::CredentialExpired => SERVER_ERROR,
            Answer::HiddenTool | Answer::HiddenToolLegacy => rpc::INVALID_PARAMS,
            Answer::ListUnfiltered => rpc::INTERNAL_ERROR,
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

    /// The upstream failure this answer reports, for the metrics.
    pub fn failure(self) -> Option<crate::obs::metrics::Failure> {
        use crate::obs::metrics::Failure;
        Some(match self {
            Answer::UpstreamUnreachable | Answer::UpstreamUnavailable => Failure::ConnectRefused,
            Answer::ConnectTimeout => Failure::ConnectTimeout,
            Answer::UpstreamTls => Failure::Tls,
            Answer::UpstreamProxy => Failure::Proxy,
            Answer::UpstreamTimeout => Failure::ResponseTimeout,
            Answer::BadUpstream | Answer::UpstreamClosed => Failure::BadAnswer,
            _ => return None,
        })
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
            Answer::UpstreamTls => "upstream unreachable: TLS failure",
            Answer::UpstreamProxy => "upstream unreachable: the forward proxy failed the tunnel",
            Answer::UpstreamClosed => "upstream closed the connection without a response",
            Answer::BadUpstream => "invalid upstream response",
            Answer::UpstreamTimeout => "upstream did not answer in time",
            Answer::UpstreamUnavailable => "upstream unavailable",
            Answer::CredentialExpired => {
                "the agent's token expired and was not renewed: the request was not sent"
            }
            Answer::HiddenTool | Answer::HiddenToolLegacy => "Unknown tool",
            Answer::ListUnfiltered => {
                "the tool list cannot be filtered: this session's SSE stream is not relayed by this proxy"
            }
        })
    }

    /// The JSON-RPC errors answering `answered` (JSON-RPC 2.0 §5): one per
    /// request in it that expects an answer, with that request's `id`, an
    /// array for a batch; one with a null id when the body could not be
    /// read (`None`). Returns how many were written: 0 when `answered`
    /// holds only notifications or responses. rmcp clients (Codex) wait
    /// for an answer to their id and ignore an error without it.
    pub fn write_errors(self, answered: Option<&rpc::Body<'_>>, out: &mut Vec<u8>) -> usize {
        rpc::write_error(out, answered, self.jsonrpc_code(), &self.message())
    }

    /// The error body of an HTTP error: `write_errors`, or one error with a
    /// null id when nothing in `answered` has an id to carry (an HTTP error
    /// still needs a body that says what happened).
    pub fn write_body(self, answered: Option<&rpc::Body<'_>>, out: &mut Vec<u8>) {
        if self.write_errors(answered, out) == 0 {
            self.write_errors(None, out);
        }
    }
}

/// Appends a proxy-made response with `body` (JSON, or empty) to `out`.
pub fn write_response(status: u16, body: &[u8], close: bool, out: &mut Vec<u8>) {
    let mut fields = HeaderList::new();
    if !body.is_empty() {
        // A constant, valid field: `set` cannot fail here.
        let _ = fields.set_name(name::CONTENT_TYPE, b"application/json");
    }
    write::response_head(
        out,
        status,
        write::reason_phrase(status),
        &fields,
        BodyField::Length(body.len() as u64),
        close,
    );
    out.extend_from_slice(body);
}

impl fmt::Display for Answer {
    /// How the exchange ended, for its log line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message())
    }
}

impl Conn {
    /// Queue a proxy-made error response and stop the exchange. Its
    /// JSON-RPC errors carry the ids of the requests they answer once the
    /// body has been read whole (JSON-RPC 2.0 §5: null only when the id
    /// cannot be read).
    pub(super) fn reply_error(&mut self, ctx: &Ctx, answer: Answer) {
        let mut body = Vec::new();
        {
            let parsed = if self.ex.body_read { self.ex.request_body() } else { None };
            answer.write_body(parsed.as_ref(), &mut body);
        }
        self.queue_answer(ctx, answer.status(), &body, answer);
    }

    /// The upstream cannot be reached for a request in a recorded MCP
    /// session, through the restart grace: it is restarting, and the
    /// client's session must survive the answer. Python SDK 1.x sessions
    /// die on any 5xx, even to a notification; a 200 carrying a JSON-RPC
    /// error with the request's id fails only that call, for every client.
    /// Notifications alone get 202 (dropped). Never 404: that would tell
    /// the client its session is gone (MCP Session Management). GET and
    /// DELETE, and a body that is not JSON-RPC, get 502.
    ///
    /// `answer` says why (the log, the audit record and the metric); the
    /// TLS failure's caller has logged its own warn line.
    pub(super) fn answer_outage(&mut self, ctx: &Ctx, answer: Answer) {
        if matches!(answer, Answer::UpstreamUnavailable) {
            warn!("conn {}: upstream unavailable for a request in a recorded session", self.id);
        }
        if self.ex.req.method.as_slice() == b"POST" {
            let mut body = Vec::new();
            let written = self.ex.request_body().map(|parsed| answer.write_errors(Some(&parsed), &mut body));
            if let Some(n) = written {
                let status = if n == 0 {
                    warn!("conn {}: notification dropped: upstream unavailable", self.id);
                    202
                } else {
                    200
                };
                self.queue_answer(ctx, status, &body, answer);
                return;
            }
        }
        self.reply_error(ctx, answer);
    }

    /// Queue a proxy-made response with `body` (JSON, or empty) and stop
    /// the exchange; `answer` says why, for the log and the close.
    pub(super) fn queue_answer(&mut self, ctx: &Ctx, status: u16, body: &[u8], answer: Answer) {
        if self.ex.recovery.reopen.as_deref().is_some_and(|r| r.replaying()) {
            // A request of the proxy's own failed: the client gets the
            // upstream's 404 it was recovering from, not this answer.
            self.own_request_failed(ctx, answer.message());
            return;
        }
        if self.ex.reattaching() {
            // A held stream's head is out: it ends instead.
            self.end_held_stream(ctx, &answer.message());
            return;
        }
        let now = ctx.now;
        if let Some(kind) = answer.failure() {
            let mut obs = ctx.obs.borrow_mut();
            obs.metrics.upstream_failure(kind);
            if kind == crate::obs::metrics::Failure::ConnectTimeout {
                obs.health.unreachable(now);
            }
        }
        self.upstream.release(now);
        let close = answer.closes() || self.close_after || self.ex.req.http10;
        write_response(status, body, close, self.out.own());
        self.ex.meter.status = status;
        self.ex.meter.bytes_out = body.len() as u64;
        if self.ex.meter.start.is_none() {
            self.ex.meter.start = Some(now);
        }
        self.log_exchange(now, &answer, super::filter::audit::End::Proxy(answer));
        self.out.drop_upstream_bytes();
        self.upstream_buf.clear();
        self.set_phase(Phase::Reply { close, reason: answer.close_reason() });
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
            Answer::UpstreamTls,
            Answer::UpstreamProxy,
            Answer::ConnectTimeout,
            Answer::UpstreamClosed,
            Answer::BadUpstream,
            Answer::UpstreamTimeout,
            Answer::CredentialExpired,
            Answer::UpstreamUnavailable,
            Answer::HiddenTool,
            Answer::HiddenToolLegacy,
            Answer::ListUnfiltered,
        ];
        for a in all {
            let (mut body, mut out) = (Vec::new(), Vec::new());
            a.write_body(None, &mut body);
            write_response(a.status(), &body, a.closes(), &mut out);
            let n = body.len();
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
            assert_eq!(v["id"], serde_json::Value::Null);
        }
    }

    #[test]
    fn errors_carry_the_ids_they_answer() {
        let cases: [(&[u8], &str); 5] = [
            (br#"{"jsonrpc":"2.0","id":7,"method":"tools/call"}"#, r#"{"jsonrpc":"2.0","id":7,"#),
            (br#"{"jsonrpc":"2.0","id":"a\"b","method":"x"}"#, r#"{"jsonrpc":"2.0","id":"a\"b","#),
            (br#"[{"jsonrpc":"2.0","id":1,"method":"x"},{"jsonrpc":"2.0","method":"n"},{"jsonrpc":"2.0","id":2,"method":"y"}]"#, "[{"),
            // Only a notification: no id to carry, the HTTP error still says why.
            (br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#, r#"{"jsonrpc":"2.0","id":null,"#),
            (b"[]", r#"{"jsonrpc":"2.0","id":null,"#),
        ];
        for (request, starts) in cases {
            let parsed = rpc::parse(request).unwrap();
            let mut body = Vec::new();
            Answer::UpstreamClosed.write_body(Some(&parsed), &mut body);
            let text = String::from_utf8(body).unwrap();
            assert!(text.starts_with(starts), "{text}");
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            if let Some(batch) = v.as_array() {
                let ids: Vec<_> = batch.iter().map(|e| e["id"].clone()).collect();
                assert_eq!(ids, [serde_json::json!(1), serde_json::json!(2)]);
            }
        }
    }

    #[test]
    fn an_empty_body_has_no_content_type() {
        let mut out = Vec::new();
        write_response(202, b"", false, &mut out);
        assert_eq!(out, b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n");
    }

    #[test]
    fn the_side_at_fault_chooses_the_status() {
        let cases = [
            (Answer::BadHead(ParseError::TooLarge), 431, -32600, true, CloseReason::BadRequest),
            (Answer::Refused(Refusal::Host), 403, -32600, true, CloseReason::BadRequest),
            (Answer::BodyTooLarge, 413, -32600, true, CloseReason::BadRequest),
            (Answer::RequestTimeout, 408, -32600, true, CloseReason::RequestTimeout),
            (Answer::UpstreamUnreachable, 502, -32000, false, CloseReason::UpstreamFailed),
            (Answer::UpstreamTls, 502, -32000, false, CloseReason::UpstreamFailed),
            (Answer::UpstreamProxy, 502, -32000, false, CloseReason::UpstreamFailed),
            (Answer::BadUpstream, 502, -32000, false, CloseReason::UpstreamFailed),
            (Answer::UpstreamTimeout, 504, -32000, false, CloseReason::UpstreamTimeout),
            (Answer::ConnectTimeout, 504, -32000, false, CloseReason::UpstreamTimeout),
            (Answer::UpstreamUnavailable, 502, -32000, false, CloseReason::UpstreamFailed),
            (Answer::CredentialExpired, 502, -32000, false, CloseReason::UpstreamFailed),
            // A hidden tool is the client's call: MCP's unknown-tool error,
            // and the connection goes on.
            (Answer::HiddenTool, 200, -32602, false, CloseReason::BadRequest),
            (Answer::HiddenToolLegacy, 403, -32602, false, CloseReason::BadRequest),
            (Answer::ListUnfiltered, 403, -32603, false, CloseReason::BadRequest),
        ];
        for (a, status, code, closes, reason) in cases {
            assert_eq!(
                (a.status(), a.jsonrpc_code(), a.closes(), a.close_reason()),
                (status, code, closes, reason)
            );
        }
    }
}

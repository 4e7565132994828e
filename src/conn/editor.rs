//! The request that goes upstream, decided without a socket: the body rule
//! (every body scanned, then stamped or refused), the identity and
//! credentials, Host and the other header edits, and the head written from
//! them. Pure: values in, bytes out; `Conn` only moves the bytes.

use crate::http::body::BodyError;
use crate::http::body::Decoder;
use crate::http::framing::Framing;
use crate::http::head;
use crate::http::headers::{name, HeaderList};
use crate::http::write::{self, BodyField};
use crate::limits::MAX_STAMP_BODY;
use crate::mcp::stamp::{self, Plan, StampError, StampMap};

/// The identity in force for one request. Name, token and stamp come from
/// one value, so no request mixes two identities.
#[derive(Clone, Copy)]
pub struct Credentials<'a> {
    /// Stamped into tools/call arguments.
    pub agent: &'a str,
    /// `Bearer <token>`, set as `authorization`.
    pub bearer: &'a [u8],
    /// The token alone, set as `x-agent-token` (empty: none is set, and
    /// the client's is removed).
    pub token: &'a [u8],
    /// A DPoP-bound token (`--dpop`): each request gets a proof of its own.
    pub dpop: Option<&'a dyn Proof>,
}

/// Makes the DPoP proof (RFC 9449 §4) of one request to the upstream.
pub trait Proof {
    /// The `DPoP` field's value for `method` to the upstream's `target`;
    /// `None` when none can be made (the request then goes without one and
    /// the server refuses it, which is logged).
    fn proof(&self, method: &[u8], target: &[u8]) -> Option<String>;
}

/// Where the request goes and what is stamped.
#[derive(Clone, Copy)]
pub struct Route<'a> {
    /// `host:port` of the upstream: the Host sent to it.
    pub authority: &'a [u8],
    pub stamps: &'a StampMap,
}

/// The request line and the client's end-to-end fields (hop-by-hop and
/// framing fields already removed by the parser).
pub struct Outgoing<'a> {
    pub method: &'a [u8],
    pub target: &'a [u8],
    /// The client delimited a body (Content-Length or chunked), even an
    /// empty one: a `content-length: 0` is sent for it.
    pub framed: bool,
}

/// Plans the upstream request: scans `body` into `plan` (whatever it held),
/// applies the credentials to `headers`, and writes the head into `head`
/// (cleared first). The bytes that go upstream are then `head` followed by
/// `plan.apply(body)`, written as splices without copying the body.
///
/// The fail-closed rule, decided here and nowhere else: **every request
/// body is scanned, whatever its method, path, Content-Type or framing.**
/// `body` is every byte the client's framing delimited (a Content-Length or
/// a de-chunked body); the head written below frames exactly the scanned
/// and spliced bytes with a Content-Length of its own, so no byte reaches
/// the upstream as body without having been scanned here. No header the
/// client controls (Content-Type, Accept, the method, the path) is
/// consulted to decide whether to scan: a `tools/call` labelled
/// `text/plain`, or not labelled at all, is stamped like any other. A
/// non-empty body that is not JSON, or JSON the scanner refuses (an
/// ambiguous or non-object `tools/call`), is an error and is never
/// forwarded; MCP only ever sends JSON bodies, so nothing legitimate is
/// lost. An empty body carries nothing to stamp.
pub fn plan_request(
    req: &Outgoing,
    headers: &mut HeaderList,
    body: &[u8],
    who: &Credentials,
    route: &Route,
    head: &mut Vec<u8>,
    plan: &mut Plan,
) -> Result<(), StampError> {
    match body.is_empty() {
        true => plan.clear(),
        false => stamp::plan_into(plan, body, who.agent, route.stamps)?,
    }
    // An argument mirrored into `Mcp-Param-<key>` (the `x-mcp-header`
    // mechanism of protocol 2026-07-28) must carry the stamped value too:
    // a server may route or authorise on the header.
    for key in plan.stamped_keys() {
        // On the stack: a tools/call costs no allocation for this.
        let mut name: smallvec::SmallVec<[u8; 64]> = smallvec::SmallVec::from_slice(b"mcp-param-");
        name.extend_from_slice(key.as_bytes());
        if headers.get(&name).is_some() {
            let _ = headers.set(&name, &stamp::mcp_param_value(who.agent));
        }
    }
    apply_credentials(headers, who, route.authority);
    // A client's own proof never passes (its token was replaced); a
    // DPoP-bound token gets a proof of this request. (DPoP is an OAuth
    // source's, in TLS builds; the minimal build leaves the field alone.)
    if cfg!(feature = "tls") {
        headers.remove_name(name::DPOP);
        if let Some(proof) = who.dpop.and_then(|d| d.proof(req.method, req.target)) {
            let _ = headers.set_name(name::DPOP, proof.as_bytes());
        }
    }
    // RFC 9110 §8.6: a length for every body, and for a method that defines
    // content even when it has none.
    let defines_content = matches!(req.method, b"POST" | b"PUT" | b"PATCH");
    let length = if req.framed || !body.is_empty() || defines_content {
        BodyField::Length(plan.new_len(body.len()) as u64)
    } else {
        BodyField::Omitted
    };
    head.clear();
    write::request_head(head, req.method, req.target, headers, length);
    Ok(())
}

/// Replace the client's credentials and Host. `set` replaces, so whatever
/// the client sent under these names cannot survive.
pub fn apply_credentials(headers: &mut HeaderList, who: &Credentials, authority: &[u8]) {
    let _ = headers.set_name(name::HOST, authority);
    // The Origin was checked at admission; the upstream sees the proxy's
    // request, not a browser's.
    headers.remove_name(name::ORIGIN);
    // Identity coding only: SSE lines must stay readable for the endpoint
    // rewrite and for the client.
    headers.remove_name(name::ACCEPT_ENCODING);
    // An empty `token`: the token goes in Authorization only (a
    // `--token-command` token); the client's `X-Agent-Token` goes too.
    let agent_header = match who.token.is_empty() {
        true => {
            headers.remove_name(name::X_AGENT_TOKEN);
            Ok(())
        }
        false => headers.set_name(name::X_AGENT_TOKEN, who.token),
    };
    if headers.set_name(name::AUTHORIZATION, who.bearer).is_err() || agent_header.is_err() {
        // Tokens are checked at load time, so this cannot happen; but a
        // request must never go out with the client's credentials.
        headers.remove_name(name::AUTHORIZATION);
        headers.remove_name(name::X_AGENT_TOKEN);
    }
}

/// The response is an SSE stream (`text/event-stream`, any parameters).
pub fn is_event_stream(headers: &HeaderList) -> bool {
    headers
        .get_name(name::CONTENT_TYPE)
        .is_some_and(|v| v.len() >= 17 && v[..17].eq_ignore_ascii_case(b"text/event-stream"))
}

/// The edits to a response head on its way to the client (hop-by-hop
/// fields are already gone: the parser drops them). A `Location` naming the
/// upstream is made to name the proxy as the client called it, so that a
/// redirect does not lead the client around the proxy; an SSE stream gets
/// `x-accel-buffering: no` unless the upstream chose, so that a buffering
/// intermediary after us (nginx honours it) passes each event on as it
/// comes.
pub fn edit_response(headers: &mut HeaderList, upstream_authority: &[u8], client_host: &[u8]) {
    edit_response_from(false, headers, upstream_authority, client_host)
}

/// `edit_response` for an upstream reached over `https` when `https`.
pub fn edit_response_from(
    https: bool,
    headers: &mut HeaderList,
    upstream_authority: &[u8],
    client_host: &[u8],
) {
    if let Some(loc) = headers.get_name(name::LOCATION) {
        if let Some(new) = crate::mcp::sse::rewrite_location_from(https, loc, upstream_authority, client_host)
        {
            let _ = headers.set_name(name::LOCATION, &new);
        }
    }
    if is_event_stream(headers) && headers.get_name(name::X_ACCEL_BUFFERING).is_none() {
        let _ = headers.set_name(name::X_ACCEL_BUFFERING, b"no");
    }
}

/// What `forward_whole` decided for one raw request.
#[derive(Debug, PartialEq, Eq)]
pub enum Forwarded {
    /// More bytes are needed for the head or the body.
    Incomplete,
    /// Answered by the proxy, nothing sent upstream (the status).
    Refused(u16),
    /// These bytes go upstream; `body` is the payload the client framed.
    Upstream { bytes: Vec<u8>, body: Vec<u8> },
}

/// The request path without sockets, for fuzzing and tests: the raw bytes
/// of one request go through the same parser, body reader and
/// `plan_request` as in `Conn`, and the bytes that would go upstream come
/// out. (Admission, which looks only at the head, is not part of it.)
#[doc(hidden)]
pub fn forward_whole(raw: &[u8], who: &Credentials, route: &Route) -> Forwarded {
    let req = match head::parse_request(raw) {
        Ok(Some(req)) => req,
        Ok(None) => return Forwarded::Incomplete,
        Err(e) => return Forwarded::Refused(e.client_status()),
    };
    let mut body = Vec::new();
    if let Framing::Length(n) = req.framing {
        if n > MAX_STAMP_BODY as u64 {
            return Forwarded::Refused(413);
        }
    }
    if let Some(mut decoder) = Decoder::for_request(req.framing) {
        match decoder.read_bounded(raw.get(req.len..).unwrap_or_default(), &mut body, MAX_STAMP_BODY) {
            Ok(_) if decoder.is_done() => {}
            Ok(_) => return Forwarded::Incomplete,
            Err(BodyError::TooLarge) => return Forwarded::Refused(413),
            Err(BodyError::Malformed(_)) => return Forwarded::Refused(400),
        }
    }
    let out = Outgoing { method: &req.method, target: &req.target, framed: req.framing != Framing::None };
    let mut headers = req.headers;
    let (mut bytes, mut plan) = (Vec::new(), Plan::default());
    match plan_request(&out, &mut headers, &body, who, route, &mut bytes, &mut plan) {
        Ok(()) => {
            bytes.extend_from_slice(&plan.apply(&body));
            Forwarded::Upstream { bytes, body }
        }
        Err(_) => Forwarded::Refused(400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(pairs: &[(&[u8], &[u8])]) -> HeaderList {
        let mut h = HeaderList::new();
        for (n, v) in pairs {
            h.set(n, v).unwrap();
        }
        h
    }

    #[test]
    fn response_edits_rewrite_location_and_unbuffer_event_streams() {
        let up: &[u8] = b"127.0.0.1:8200";
        let me: &[u8] = b"localhost:8300";
        let cases: &[(&[(&[u8], &[u8])], Option<&[u8]>, Option<&[u8]>)] = &[
            // (fields in, location out, x-accel-buffering out)
            (
                &[(b"location", b"http://127.0.0.1:8200/mcp?s=1")],
                Some(b"http://localhost:8300/mcp?s=1"),
                None,
            ),
            (&[(b"location", b"http://elsewhere:8200/mcp")], Some(b"http://elsewhere:8200/mcp"), None),
            (&[(b"location", b"/relative")], Some(b"/relative"), None),
            (&[(b"content-type", b"text/event-stream; charset=utf-8")], None, Some(b"no")),
            (&[(b"content-type", b"Text/Event-Stream")], None, Some(b"no")),
            (&[(b"content-type", b"text/event-stream"), (b"x-accel-buffering", b"yes")], None, Some(b"yes")),
            (&[(b"content-type", b"application/json")], None, None),
        ];
        for (input, location, accel) in cases {
            let mut h = fields(input);
            edit_response(&mut h, up, me);
            assert_eq!(h.get(b"location"), *location, "{input:?}");
            assert_eq!(h.get(b"x-accel-buffering"), *accel, "{input:?}");
        }
    }
    use crate::conn::upstream_invariant::{check, Expect};
    use crate::test_rng::Rng;

    const AGENT: &str = "claude-prime";
    const BEARER: &str = "Bearer tok-1";
    const TOKEN: &str = "tok-1";

    fn run(raw: &[u8]) -> Forwarded {
        let stamps = StampMap::agentchattr();
        let who =
            Credentials { agent: AGENT, bearer: BEARER.as_bytes(), token: TOKEN.as_bytes(), dpop: None };
        let route = Route { authority: b"127.0.0.1:8200", stamps: &stamps };
        forward_whole(raw, &who, &route)
    }

    fn expect() -> Expect<'static> {
        static PARAM: fn(&str) -> Option<&'static str> = |tool| {
            let map = StampMap::agentchattr();
            map.param_for(tool.as_bytes()).map(|p| if p == "name" { "name" } else { "sender" })
        };
        Expect { agent: AGENT, bearer: BEARER, token: TOKEN, param_for: &PARAM }
    }

    fn request(method: &str, content_type: Option<&str>, body: &[u8]) -> Vec<u8> {
        let mut raw =
            format!("{method} /mcp HTTP/1.1\r\nHost: 127.0.0.1:9\r\nAuthorization: Bearer mallory\r\n");
        if let Some(ct) = content_type {
            raw.push_str(&format!("Content-Type: {ct}\r\n"));
        }
        raw.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
        let mut raw = raw.into_bytes();
        raw.extend_from_slice(body);
        raw
    }

    const SPOOF: &[u8] =
        br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"chat_send","arguments":{"sender":"mallory","message":"hi"}}}"#;

    #[test]
    fn spoofed_sender_is_stamped_whatever_the_content_type_or_method() {
        for ct in
            [None, Some("text/plain"), Some("application/json"), Some("application/x-www-form-urlencoded")]
        {
            for method in ["POST", "PUT", "GET", "DELETE", "PATCH"] {
                let Forwarded::Upstream { bytes, body } = run(&request(method, ct, SPOOF)) else {
                    panic!("{method} {ct:?}: not forwarded");
                };
                check(&body, &bytes, &expect());
                let text = String::from_utf8_lossy(&bytes);
                assert!(text.contains(r#""sender":"claude-prime""#), "{method} {ct:?}: {text}");
                assert!(!text.contains("mallory"), "{method} {ct:?}: {text}");
            }
        }
    }

    #[test]
    fn bodies_that_are_not_json_are_refused_whatever_the_label() {
        for body in [&b"sender=mallory"[..], b"{\"method\":", b"\xff\xfe{}", b"{} {}"] {
            for ct in [None, Some("text/plain"), Some("application/json")] {
                assert_eq!(run(&request("POST", ct, body)), Forwarded::Refused(400), "{body:?} as {ct:?}");
            }
        }
    }

    #[test]
    fn chunked_body_is_dechunked_scanned_and_sent_with_a_length() {
        let mut raw =
            b"POST /messages/?session_id=1 HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                .to_vec();
        for part in SPOOF.chunks(7) {
            raw.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
            raw.extend_from_slice(part);
            raw.extend_from_slice(b"\r\n");
        }
        raw.extend_from_slice(b"0\r\n\r\n");
        let Forwarded::Upstream { bytes, body } = run(&raw) else { panic!("not forwarded") };
        assert_eq!(body, SPOOF);
        check(&body, &bytes, &expect());
    }

    #[test]
    fn empty_bodies_pass_and_keep_a_zero_length() {
        let Forwarded::Upstream { bytes, .. } = run(&request("POST", Some("text/plain"), b"")) else {
            panic!("not forwarded")
        };
        assert!(String::from_utf8_lossy(&bytes).contains("content-length: 0\r\n"));
        let Forwarded::Upstream { bytes, .. } = run(b"GET /mcp HTTP/1.1\r\nHost: h\r\n\r\n") else {
            panic!("not forwarded")
        };
        assert!(!String::from_utf8_lossy(&bytes).contains("content-length"));
    }

    /// Generated requests over the whole path: every forwarded request
    /// holds the upstream invariant.
    #[test]
    fn generated_requests_hold_the_upstream_invariant() {
        const METHODS: &[&str] = &["POST", "GET", "PUT", "DELETE", "PATCH", "OPTIONS"];
        const TYPES: &[Option<&str>] = &[
            None,
            Some("application/json"),
            Some("text/plain"),
            Some("application/json; charset=utf-8"),
            Some(""),
        ];
        const TOOLS: &[&str] =
            &["chat_send", "chat_join", "chat_read", "chat_claim", "other", "ch\\u0061t_send"];
        const METHOD_NAMES: &[&str] = &["tools/call", "tools\\/call", "ping", "initialize", "tools/list"];
        const ARGS: &[&str] = &[
            "",
            r#","arguments":null"#,
            r#","arguments":{}"#,
            r#","arguments":{"sender":"mallory"}"#,
            r#","arguments":{"name":"mallory","sender":7}"#,
            r#","arguments":{"s\u0065nder":"mallory","message":"x"}"#,
            r#","arguments":{"message":{"sender":"nested"},"sender":"m"}"#,
            r#","arguments":[1]"#,
        ];
        let mut rng = Rng(0x5EED_0F1D_E717);
        let (mut forwarded, mut refused) = (0, 0);
        for _ in 0..3000 {
            let message = |rng: &mut Rng| {
                let params = if rng.below(8) == 0 {
                    String::from(r#""params":"x""#)
                } else {
                    let arg = rng.pick(ARGS);
                    let name = format!(r#""name":"{}""#, rng.pick(TOOLS));
                    if rng.below(2) == 0 {
                        format!(r#""params":{{{name}{arg}}}"#)
                    } else if arg.is_empty() {
                        format!(r#""params":{{{name}}}"#)
                    } else {
                        format!(r#""params":{{{}, {name}}}"#, &arg[1..])
                    }
                };
                format!(
                    r#"{{"jsonrpc":"2.0","id":{},"method":"{}",{params}}}"#,
                    rng.below(100),
                    rng.pick(METHOD_NAMES)
                )
            };
            let mut body = match rng.below(6) {
                0 => format!("[{},{}]", message(&mut rng), message(&mut rng)),
                1 => String::new(),
                _ => message(&mut rng),
            }
            .into_bytes();
            if rng.below(10) == 0 && !body.is_empty() {
                // A damaged body: truncated, or with a stray byte.
                let at = rng.below(body.len());
                if rng.below(2) == 0 {
                    body.truncate(at);
                } else {
                    body.insert(at, b'\'');
                }
            }
            let raw = request(rng.pick(METHODS), rng.pick(TYPES), &body);
            match run(&raw) {
                Forwarded::Upstream { bytes, body: seen } => {
                    assert_eq!(seen, body);
                    check(&seen, &bytes, &expect());
                    forwarded += 1;
                }
                Forwarded::Refused(400) => refused += 1,
                other => panic!("{other:?} for {:?}", String::from_utf8_lossy(&raw)),
            }
        }
        // Both outcomes were exercised.
        assert!(forwarded > 1000 && refused > 100, "forwarded {forwarded}, refused {refused}");
    }
}

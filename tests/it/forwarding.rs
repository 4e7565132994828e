//! What the proxy changes on the way through and what it leaves alone: the
//! client's credentials replaced by exactly one token pair, Host rewritten to
//! the upstream authority, method, path and query byte-exact, repeated field
//! lines merged or refused, hop-by-hop fields stripped both ways, `Location`
//! rewritten, and upstream statuses relayed with their fields and body.

use std::io::Write;
use std::time::Duration;

use crate::support::exchange::{assert_healthy, client, exchange, host, ok_upstream, OK_JSON, PING};
use crate::support::proxy_process::ProxyProcess;
use crate::support::setup::{assert_credentials, assert_lowercase_names, post, start, AGENT, SESSION};
use crate::support::wire::{contains, request, response, Next, StubUpstream};

#[test]
fn client_credentials_are_replaced_by_exactly_one_token_pair() {
    let up = ok_upstream();
    let p = start(&up);
    let mut c = client(&p);
    let creds = [("Authorization", "Bearer OLD"), ("Authorization", "Bearer OLD"), ("X-Agent-Token", "x")];
    c.send(&post(&p, &creds, PING));
    assert_eq!(c.read_response("POST").status, 200);
    c.send(&request(
        "GET",
        "/mcp",
        &host(&p),
        &[("Accept", "text/event-stream"), ("x-agent-token", "y")],
        b"",
    ));
    assert_eq!(c.read_response("GET").status, 200);
    c.send(&request("DELETE", "/mcp", &host(&p), &[("authorization", "Basic b2xkOm9sZA==")], b""));
    assert_eq!(c.read_response("DELETE").status, 200);
    for req in up.wait_requests(3, Duration::from_secs(5)) {
        assert_credentials(&req);
        assert!(!contains(&req.raw, b"OLD") && !contains(&req.raw, b"b2xkOm9sZA=="), "{}", req.raw_text());
    }
}

#[test]
fn token_from_environment_is_used_when_no_token_file_is_given() {
    let up = ok_upstream();
    let p = ProxyProcess::builder(up.url()).agent(AGENT).env("MCP_PROXY_TOKEN", "env-token-123").start();
    assert_eq!(exchange(&p, &post(&p, &[], PING)).status, 200);
    let req = up.only_request();
    assert_eq!(req.head.all("authorization"), vec!["Bearer env-token-123"]);
    assert_eq!(req.head.all("x-agent-token"), vec!["env-token-123"]);
}

#[test]
fn host_is_rewritten_to_the_upstream_authority() {
    let up = ok_upstream();
    let p = start(&up);
    let mut c = client(&p);
    c.send(&post(&p, &[], PING));
    assert_eq!(c.read_response("POST").status, 200);
    c.send(&request("GET", "/mcp", &format!("localhost:{}", p.port), &[], b""));
    assert_eq!(c.read_response("GET").status, 200);
    for req in up.wait_requests(2, Duration::from_secs(5)) {
        assert_eq!(req.head.all("host"), vec![up.authority()], "{}", req.raw_text());
    }
}

#[test]
fn method_path_and_query_reach_upstream_byte_exact() {
    let up = ok_upstream();
    let p = start(&up);
    let targets = [
        ("POST", "/mcp"),
        ("POST", "/mcp/"),
        ("POST", "/messages/?session_id=0123abcdEF&x=%2F%20y+z"),
        ("GET", "/.well-known/oauth-authorization-server"),
        ("GET", "/a/b;c=d/%7Euser?q=%E2%9C%93&empty=&&flag"),
        ("PUT", "/mcp?x=1"),
        ("PATCH", "/mcp"),
        ("OPTIONS", "/mcp"),
        ("DELETE", "/mcp?session=1"),
    ];
    let mut c = client(&p);
    for (method, target) in targets {
        let body: &[u8] = if method == "POST" { PING } else { b"" };
        let fields: &[(&str, &str)] =
            if method == "POST" { &[("Content-Type", "application/json")] } else { &[] };
        c.send(&request(method, target, &host(&p), fields, body));
        let resp = c.read_response(method);
        assert_eq!(resp.status, 200, "{method} {target}: {:?}", resp.raw_text());
    }
    let reqs = up.wait_requests(targets.len(), Duration::from_secs(5));
    for (req, (method, target)) in reqs.iter().zip(targets) {
        assert_eq!(req.head.start, format!("{method} {target} HTTP/1.1"), "{}", req.raw_text());
    }
}

#[test]
fn protocol_version_header_is_not_duplicated_upstream() {
    let up = ok_upstream();
    let p = start(&up);
    let mut c = client(&p);
    c.send(&post(&p, &[("MCP-Protocol-Version", "2025-11-25"), ("Mcp-Session-Id", SESSION)], PING));
    assert_eq!(c.read_response("POST").status, 200);
    // The same value twice (different case) collapses to one line, never "v, v".
    c.send(&post(
        &p,
        &[("MCP-Protocol-Version", "2025-11-25"), ("mcp-protocol-version", "2025-11-25")],
        PING,
    ));
    assert_eq!(c.read_response("POST").status, 200);
    for req in up.wait_requests(2, Duration::from_secs(5)) {
        assert_eq!(req.head.all("mcp-protocol-version"), vec!["2025-11-25"], "{}", req.raw_text());
    }
}

#[test]
fn end_to_end_request_fields_reach_upstream_once_and_unchanged() {
    let up = ok_upstream();
    let p = start(&up);
    let fields = [
        ("Last-Event-ID", "evt-42"),
        ("Mcp-Method", "ping"),
        ("Mcp-Param-Region", "=?base64?ZXUtd2VzdA==?="),
        ("User-Agent", "node"),
        ("X-Unknown-Thing", "Keep  This  Exactly"),
    ];
    assert_eq!(exchange(&p, &post(&p, &fields, PING)).status, 200);
    let req = up.only_request();
    for (name, value) in fields {
        assert_eq!(req.head.all(name), vec![value], "{name}: {}", req.raw_text());
    }
    assert_eq!(req.head.all("content-type"), vec!["application/json"]);
    assert_eq!(req.head.all("accept"), vec!["application/json, text/event-stream"]);
}

#[test]
fn repeated_list_field_lines_are_joined_and_identical_ones_collapsed() {
    let up = ok_upstream();
    let p = start(&up);
    let raw = request(
        "GET",
        "/mcp",
        &host(&p),
        &[
            ("Accept", "application/json"),
            ("accept", "text/event-stream"),
            ("X-Same", "one"),
            ("X-SAME", "one"),
        ],
        b"",
    );
    assert_eq!(exchange(&p, &raw).status, 200);
    let req = up.only_request();
    assert_eq!(req.head.all("accept"), vec!["application/json, text/event-stream"], "{}", req.raw_text());
    assert_eq!(req.head.all("x-same"), vec!["one"], "{}", req.raw_text());
}

#[test]
fn conflicting_lines_of_a_singleton_field_get_400_and_never_reach_the_upstream() {
    // Fields with one value only (RFC 9110 §5.3): two different lines leave
    // the proxy no value to forward, and joining them would make the very
    // `abc, abc` this proxy exists to prevent. (Host and Content-Length are
    // in the framing table; Origin in the rebinding guard's tests.)
    let up = ok_upstream();
    let p = start(&up);
    let cases = [
        ("Content-Type", "application/json", "text/plain"),
        ("Mcp-Session-Id", "aaa", "bbb"),
        ("Mcp-Protocol-Version", "2025-06-18", "2025-03-26"),
        ("Last-Event-ID", "1", "2"),
        ("Authorization", "Bearer a", "Bearer b"),
    ];
    for (name, first, second) in cases {
        let raw =
            request("POST", "/mcp", &host(&p), &[(name, first), (&name.to_ascii_lowercase(), second)], PING);
        let resp = exchange(&p, &raw);
        assert_eq!(resp.status, 400, "{name}: {:?}", resp.raw_text());
        assert_eq!(up.request_count(), 0, "{name} reached the upstream");
    }
    assert_healthy(&p, &up);
}

#[test]
fn field_names_are_written_lowercase_both_ways() {
    let up = StubUpstream::fixed(response(
        "200 OK",
        &[("Content-Type", "application/json"), ("X-Upstream-Thing", "2"), ("Cache-Control", "no-store")],
        OK_JSON,
    ));
    let p = start(&up);
    let resp = exchange(&p, &post(&p, &[("X-Client-Thing", "1"), ("User-Agent", "it")], PING));
    assert_eq!(resp.status, 200);
    assert_lowercase_names(&resp.head, "response");
    assert_eq!(resp.all("x-upstream-thing"), vec!["2"]);
    let req = up.only_request();
    assert_lowercase_names(&req.head, "upstream request");
    assert_eq!(req.head.all("x-client-thing"), vec!["1"]);
}

#[test]
fn hop_by_hop_request_fields_are_stripped_including_those_named_in_connection() {
    let up = ok_upstream();
    let p = start(&up);
    let raw = request(
        "POST",
        "/mcp",
        &host(&p),
        &[
            ("Content-Type", "application/json"),
            ("Connection", "keep-alive, X-Private"),
            ("X-Private", "secret-hop"),
            ("Keep-Alive", "timeout=5"),
            ("Proxy-Connection", "keep-alive"),
            ("TE", "trailers"),
            ("Trailer", "X-Checksum"),
            ("Upgrade", "h2c"),
            ("Proxy-Authorization", "Basic cHJveHk6cHc="),
            ("X-End-To-End", "kept"),
        ],
        PING,
    );
    assert_eq!(exchange(&p, &raw).status, 200);
    let req = up.only_request();
    for name in
        ["x-private", "keep-alive", "proxy-connection", "te", "trailer", "upgrade", "proxy-authorization"]
    {
        assert!(!req.head.has(name), "hop-by-hop {name:?} reached upstream: {}", req.raw_text());
    }
    for v in req.head.all("connection") {
        assert!(!v.to_ascii_lowercase().contains("x-private"), "{}", req.raw_text());
    }
    assert!(!contains(&req.raw, b"secret-hop"), "{}", req.raw_text());
    assert_eq!(req.head.all("x-end-to-end"), vec!["kept"]);
    assert_eq!(req.body, PING);
}

#[test]
fn hop_by_hop_response_fields_are_stripped_including_those_named_in_connection() {
    let up = StubUpstream::fixed(response(
        "200 OK",
        &[
            ("Content-Type", "application/json"),
            ("Connection", "keep-alive, X-Up-Private"),
            ("X-Up-Private", "secret-hop"),
            ("Keep-Alive", "timeout=5, max=100"),
            ("Proxy-Authenticate", "Basic realm=x"),
            ("Proxy-Connection", "keep-alive"),
            ("Upgrade", "h2c"),
            ("Trailer", "X-Checksum"),
            ("TE", "trailers"),
            ("WWW-Authenticate", "Bearer realm=mcp"),
            ("X-Accel-Buffering", "no"),
            ("Retry-After", "3"),
            ("Vary", "Accept"),
        ],
        OK_JSON,
    ));
    let p = start(&up);
    let resp = exchange(&p, &post(&p, &[], PING));
    assert_eq!(resp.status, 200, "{:?}", resp.raw_text());
    for name in
        ["x-up-private", "keep-alive", "proxy-authenticate", "proxy-connection", "upgrade", "trailer", "te"]
    {
        assert!(!resp.has(name), "hop-by-hop {name:?} reached the client: {:?}", resp.raw_text());
    }
    assert!(!contains(&resp.raw, b"secret-hop"), "{:?}", resp.raw_text());
    for (name, value) in [
        ("www-authenticate", "Bearer realm=mcp"),
        ("x-accel-buffering", "no"),
        ("retry-after", "3"),
        ("vary", "Accept"),
    ] {
        assert_eq!(resp.all(name), vec![value], "{:?}", resp.raw_text());
    }
    assert_eq!(resp.body, OK_JSON);
}

#[test]
fn upstream_statuses_are_relayed_with_headers_and_body() {
    let up = StubUpstream::start(|req, s| {
        let code = req.target.trim_start_matches("/s/");
        let out = match code {
            "202" => b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n".to_vec(),
            "405" => response(
                "405 Method Not Allowed",
                &[("Allow", "GET, POST, DELETE"), ("Content-Type", "text/plain")],
                b"Method Not Allowed",
            ),
            "404" => response(
                "404 Not Found",
                &[("Content-Type", "application/json")],
                br#"{"error":"not_found","code":404}"#,
            ),
            other => response(
                &format!("{other} Whatever"),
                &[("Content-Type", "application/json")],
                format!(r#"{{"jsonrpc":"2.0","error":{{"code":-32000,"message":"status {other}"}}}}"#)
                    .as_bytes(),
            ),
        };
        let _ = s.write_all(&out);
        Next::KeepAlive
    });
    let p = start(&up);
    for (method, code) in [
        ("POST", "202"),
        ("POST", "400"),
        ("GET", "404"),
        ("PUT", "405"),
        ("GET", "409"),
        ("POST", "413"),
        ("POST", "421"),
        ("POST", "500"),
        ("DELETE", "404"),
    ] {
        let target = format!("/s/{code}");
        let (fields, body): (&[(&str, &str)], &[u8]) =
            if method == "POST" { (&[("Content-Type", "application/json")], PING) } else { (&[], b"") };
        let resp = exchange(&p, &request(method, &target, &host(&p), fields, body));
        assert_eq!(resp.status.to_string(), code, "{method} {target}: {:?}", resp.raw_text());
        match code {
            "202" => assert!(resp.body.is_empty()),
            "405" => {
                assert_eq!(resp.all("allow"), vec!["GET, POST, DELETE"], "{:?}", resp.raw_text());
                assert_eq!(resp.text(), "Method Not Allowed");
            }
            "404" => assert_eq!(resp.text(), r#"{"error":"not_found","code":404}"#, "{:?}", resp.raw_text()),
            _ => assert_eq!(
                resp.text(),
                format!(r#"{{"jsonrpc":"2.0","error":{{"code":-32000,"message":"status {code}"}}}}"#)
            ),
        }
    }
}

#[test]
fn location_pointing_at_upstream_is_rewritten_to_the_client_host() {
    let up = StubUpstream::start(|req, s| {
        let location = if req.target == "/external" {
            "https://example.com/elsewhere".to_string()
        } else {
            format!("http://{}/mcp", req.head.one("host"))
        };
        let _ = s.write_all(&response("307 Temporary Redirect", &[("Location", &location)], b""));
        Next::KeepAlive
    });
    let p = start(&up);
    for client_host in [host(&p), format!("localhost:{}", p.port)] {
        let resp = exchange(
            &p,
            &request("POST", "/mcp/", &client_host, &[("Content-Type", "application/json")], PING),
        );
        assert_eq!(resp.status, 307, "{:?}", resp.raw_text());
        assert_eq!(resp.all("location"), vec![format!("http://{client_host}/mcp")], "{:?}", resp.raw_text());
    }
    let resp = exchange(&p, &request("GET", "/external", &host(&p), &[], b""));
    assert_eq!(resp.all("location"), vec!["https://example.com/elsewhere"], "{:?}", resp.raw_text());
}

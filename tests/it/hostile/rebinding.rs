//! DNS rebinding (MCP 2025-11-25 transports: servers validate Origin): Host and Origin checks.

use std::time::Duration;

use super::{assert_refused, start, start_with, TOKEN};
use crate::support::exchange::{
    assert_healthy, assert_jsonrpc_error, exchange, host, json_post as post, ok_upstream, PING,
};
use crate::support::wire::{contains, request};

#[test]
fn rebinding_hosts_get_403_before_any_upstream_contact() {
    let up = ok_upstream();
    let p = start(&up);
    let port = p.port;
    let other = if port == 65535 { port - 1 } else { port + 1 };
    for h in [
        format!("evil.com:{port}"),
        format!("127.0.0.1:{other}"),
        "127.0.0.1".to_string(),
        "localhost".to_string(),
        format!("localhost.evil:{port}"),
        format!("localhost.:{port}"),
        format!("127.0.0.1.nip.io:{port}"),
        format!("127.0.0.1:0{port}"),
        format!("127.0.0.2:{port}"),
        format!("[::1]:{other}"),
        format!("user@127.0.0.1:{port}"),
        format!("127.0.0.1:{port}/x"),
        format!("127.0.0.1:{port}:{port}"),
    ] {
        let raw = request("GET", "/mcp", &h, &[], b"");
        let resp = assert_refused(&p, &up, &raw, 403, false);
        assert!(!contains(&resp.raw, TOKEN.as_bytes()));
    }
}

#[test]
fn loopback_hosts_with_the_proxy_port_are_relayed() {
    let up = ok_upstream();
    let p = start(&up);
    let port = p.port;
    for h in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("LocalHost:{port}"),
        format!("[::1]:{port}"),
    ] {
        let resp = exchange(&p, &request("GET", "/mcp", &h, &[], b""));
        assert_eq!(resp.status, 200, "Host {h}: {:?}", resp.raw_text());
    }
    assert_eq!(up.request_count(), 4);
}

#[test]
fn rebinding_origins_get_403_before_any_upstream_contact() {
    let up = ok_upstream();
    let p = start_with(&up, &["--allow-origin", "https://app.example"], &[]);
    for origin in [
        "http://evil.com",
        "null",
        "http://localhost:3000/path",
        "http://localhost:3000/",
        "http://user@localhost",
        "http://user:pw@localhost:3000",
        "file://",
        "ftp://localhost",
        "http://localhost.evil.com",
        "http://127.0.0.1.nip.io",
        "http://localhost:3000?x",
        "http://localhost#x",
        "https://app.example.evil",
        "https://app.example:8443",
        "http://app.example",
        "",
        "http://localhost, http://evil.com",
    ] {
        let raw = request("GET", "/mcp", &host(&p), &[("Origin", origin)], b"");
        assert_refused(&p, &up, &raw, 403, false);
    }
}

#[test]
fn loopback_and_listed_origins_are_relayed_and_not_forwarded() {
    let up = ok_upstream();
    let p = start_with(&up, &["--allow-origin", "https://app.example"], &[]);
    let origins = ["http://localhost:5173", "https://[::1]", "http://127.0.0.1:8080", "https://app.example"];
    for origin in origins {
        let resp = exchange(&p, &post(&host(&p), &[("Origin", origin)], PING));
        assert_eq!(resp.status, 200, "Origin {origin}: {:?}", resp.raw_text());
    }
    for req in up.wait_requests(origins.len(), Duration::from_secs(5)) {
        assert!(!req.head.has("origin"), "Origin forwarded upstream: {}", req.raw_text());
    }
}

#[test]
fn listed_origin_is_refused_without_allow_origin() {
    let up = ok_upstream();
    let p = start(&up);
    let raw = request("GET", "/mcp", &host(&p), &[("Origin", "https://app.example")], b"");
    assert_refused(&p, &up, &raw, 403, false);
}

#[test]
fn two_origin_lines_are_refused() {
    let up = ok_upstream();
    let p = start(&up);
    let raw = request(
        "GET",
        "/mcp",
        &host(&p),
        &[("Origin", "http://localhost:5173"), ("Origin", "http://evil.com")],
        b"",
    );
    let (reqs, conns) = (up.request_count(), up.connections());
    let resp = exchange(&p, &raw);
    assert!(resp.status == 400 || resp.status == 403, "{:?}", resp.raw_text());
    assert_jsonrpc_error(&resp, resp.status);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!((up.request_count(), up.connections()), (reqs, conns));
    assert_healthy(&p, &up);
}

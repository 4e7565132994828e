//! Secrets: neither the agent token nor the client secret in trace logs, argv or any answer.

use std::time::Duration;

use super::exposed::client_token_file;
use super::upstream_faults::faulty_upstream;
use super::{start_with, write_ignoring_errors, CLIENT_SECRET, TOKEN};
use crate::support::exchange::{client, host, json_post as post, PING};
use crate::support::wire::{contains, request};

fn join<'a>(a: &[(&'a str, &'a str)], b: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut f = a.to_vec();
    f.extend_from_slice(b);
    f
}

/// The hostile sequence at RUST_LOG=trace, against a loopback proxy and an
/// exposed one with a client secret: neither the agent token nor the client
/// secret appears in stderr or in any response the client receives.
#[test]
fn token_and_client_secret_never_appear_in_trace_logs_or_error_bodies() {
    let (up, _) =
        faulty_upstream(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}x".to_vec());
    let ct = client_token_file();
    let trace = [("RUST_LOG", "trace")];
    let mut plain = start_with(&up, &["--response-timeout", "1"], &trace);
    let mut exposed = start_with(
        &up,
        &["--listen", "0.0.0.0:0", "--client-token-file", ct.to_str().unwrap(), "--response-timeout", "1"],
        &trace,
    );
    let big = "a".repeat(70 * 1024);
    let many: Vec<String> = (0..150).map(|i| format!("X-F{i}")).collect();
    let many_fields: Vec<(&str, &str)> = many.iter().map(|n| (n.as_str(), "v")).collect();
    let mut seen: Vec<u8> = Vec::new();
    for (p, auth) in [(&plain, None), (&exposed, Some(format!("Bearer {CLIENT_SECRET}")))] {
        let h = host(p);
        let mut base: Vec<(&str, &str)> = Vec::new();
        if let Some(a) = &auth {
            base.push(("Authorization", a.as_str()));
        }
        let hostile: Vec<Vec<u8>> = vec![
            post(&h, &join(&base, &[]), PING),
            request("GET", "/fault", &h, &join(&base, &[]), b""),
            request("GET", "/mcp", &format!("evil.com:{}", p.port), &join(&base, &[]), b""),
            request("GET", "/mcp", &h, &join(&base, &[("Origin", "http://evil.com")]), b""),
            request("GET", "/mcp", &h, &join(&base, &[("X-Big", &big)]), b""),
            request("GET", "/mcp", &h, &join(&base, &many_fields), b""),
            request("POST", "/mcp", &h, &join(&base, &[("Content-Length", "99999999")]), b""),
            request("POST", "/mcp", &h, &join(&base, &[("Content-Length", "2"), ("Transfer-Encoding", "chunked")]), b"{}"),
            request("GET", "http://evil.com/", &h, &join(&base, &[]), b""),
            post(&h, &join(&base, &[("Content-Type", "application/json")]), br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"chat_send","arguments":{"sender":"a","sender":"b"}}}"#),
            post(&h, &join(&base, &[]), b"{not json"),
            post(&h, &[("Authorization", &format!("Bearer {}", &CLIENT_SECRET[..10]))], PING),
            b"\x16\x03\x01garbage\r\n\r\n".to_vec(),
        ];
        for raw in hostile {
            let method = if raw.starts_with(b"POST") { "POST" } else { "GET" };
            let mut c = client(p);
            write_ignoring_errors(&mut c.stream, &raw);
            seen.extend(c.read_response(method).raw);
        }
    }
    for p in [&mut plain, &mut exposed] {
        p.stop();
    }
    std::thread::sleep(Duration::from_millis(500));
    for (name, p) in [("loopback", &plain), ("exposed", &exposed)] {
        let stderr = p.stderr_text();
        assert!(stderr.contains("TRACE") || stderr.contains("DEBUG"), "{name}: nothing logged at trace");
        for (what, secret) in [("token", TOKEN), ("client secret", CLIENT_SECRET)] {
            assert!(!stderr.contains(secret), "{name}: {what} in stderr:\n{stderr}");
            // Fragments too: a log line may cut a value.
            assert!(!stderr.contains(&secret[..12]), "{name}: part of the {what} in stderr:\n{stderr}");
        }
        // Linux shows argv in /proc; elsewhere the read fails and checks nothing.
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", p.pid())).unwrap_or_default();
        assert!(!contains(&cmdline, TOKEN.as_bytes()), "token in argv");
    }
    assert!(!contains(&seen, TOKEN.as_bytes()), "token in a response: {:?}", String::from_utf8_lossy(&seen));
    assert!(!contains(&seen, CLIENT_SECRET.as_bytes()), "client secret in a response");
    for status in [b"403".as_slice(), b"401", b"431", b"413", b"400", b"502"] {
        assert!(contains(&seen, status), "the sequence never produced {}", String::from_utf8_lossy(status));
    }
}

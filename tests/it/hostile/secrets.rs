//! Secrets: neither the agent token nor the client secret in trace logs, argv, any answer, the audit log,
//! `/metrics` or `/healthz`.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::exposed::client_token_file;
use super::upstream_faults::faulty_upstream;
use super::{start_with, write_ignoring_errors, AGENT, CLIENT_SECRET, TOKEN};
use crate::support::exchange::{client, exchange, host, json_post as post, PING};
use crate::support::proxy_process::{scratch_dir, ProxyProcess};
use crate::support::wire::{contains, request, response, Next, StubUpstream};

/// The token the identity change hands the proxy.
const NEW_TOKEN: &str = "tok-HOSTILE-NEXT-77c2e0d4-SECRET";

/// What the proxy shows an operator besides stderr: the audit file, `/metrics` and `/healthz`.
#[track_caller]
fn observed(p: &ProxyProcess, audit: &Path) -> Vec<(&'static str, String)> {
    let (status, metrics) = p.metrics_get("/metrics");
    assert_eq!(status, 200, "/metrics: {metrics}");
    let (_, health) = p.metrics_get("/healthz");
    vec![
        ("audit log", std::fs::read_to_string(audit).unwrap_or_default()),
        ("/metrics", metrics),
        ("/healthz", health),
    ]
}

/// Neither `secrets` nor their first 12 bytes (a cut value) in `text`.
#[track_caller]
fn assert_none_in(what: &str, text: &str, secrets: &[(&str, &str)]) {
    for (name, secret) in secrets {
        assert!(!text.contains(secret), "{what}: the {name} in it:\n{text}");
        assert!(!text.contains(&secret[..12]), "{what}: part of the {name} in it:\n{text}");
    }
}

fn join<'a>(a: &[(&'a str, &'a str)], b: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut f = a.to_vec();
    f.extend_from_slice(b);
    f
}

/// The hostile sequence at RUST_LOG=trace, against a loopback proxy and an
/// exposed one with a client secret, both with the audit log and the metrics
/// listener on: neither the agent token nor the client secret appears in
/// stderr, in any response the client receives, in the audit log, in
/// `/metrics` or in `/healthz`.
#[test]
fn token_and_client_secret_never_appear_in_trace_logs_or_error_bodies() {
    let (up, _) =
        faulty_upstream(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}x".to_vec());
    let ct = client_token_file();
    let trace = [("RUST_LOG", "trace")];
    // Observed too: the audit log and the metrics listener (on loopback: no client token asked there).
    let dir = scratch_dir("secrets-audit");
    let (plain_audit, exposed_audit) = (dir.join("plain.jsonl"), dir.join("exposed.jsonl"));
    let observe = |audit: &Path, args: &[&str]| -> Vec<String> {
        let path = audit.to_str().expect("a UTF-8 scratch path").to_string();
        let observing = [String::from("--audit-log"), path, "--metrics-listen".into(), "127.0.0.1:0".into()];
        args.iter().map(|a| a.to_string()).chain(observing).collect()
    };
    let plain_args = observe(&plain_audit, &["--response-timeout", "1"]);
    let exposed_args = observe(
        &exposed_audit,
        &["--listen", "0.0.0.0:0", "--client-token-file", ct.to_str().unwrap(), "--response-timeout", "1"],
    );
    fn as_strs(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }
    let mut plain = start_with(&up, &as_strs(&plain_args), &trace);
    let mut exposed = start_with(&up, &as_strs(&exposed_args), &trace);
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
    let secrets = [("token", TOKEN), ("client secret", CLIENT_SECRET)];
    for (name, p, audit) in [("loopback", &plain, &plain_audit), ("exposed", &exposed, &exposed_audit)] {
        let texts = observed(p, audit);
        assert!(texts[0].1.contains("\"event\":\"request\""), "{name}: no request recorded: {}", texts[0].1);
        for (what, text) in &texts {
            assert_none_in(&format!("{name}: {what}"), text, &secrets);
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

/// An upstream that puts the credentials it got into every answer: the tool
/// result's text, an error's message, a header. Whatever it echoes, the
/// proxy's records must not carry it on.
fn echoing_upstream() -> StubUpstream {
    StubUpstream::start(|req, s| {
        let auth = req.head.all("authorization").join(" ");
        let v: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
        let body = match (v["method"].as_str(), v["params"]["name"].as_str()) {
            (Some("initialize"), _) => json!({"jsonrpc": "2.0", "id": v["id"], "result": {
                "protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                "serverInfo": {"name": auth, "version": "1"}}}),
            (_, Some("fail")) => {
                json!({"jsonrpc": "2.0", "id": v["id"], "error": {"code": -32000, "message": auth}})
            }
            (Some(_), _) if v.get("id").is_some() => json!({"jsonrpc": "2.0", "id": v["id"], "result": {
                "content": [{"type": "text", "text": auth}], "isError": false}}),
            _ => Value::Null,
        };
        let answer = if req.method == "DELETE" || body.is_null() {
            response(if req.method == "DELETE" { "200 OK" } else { "202 Accepted" }, &[], b"")
        } else {
            let fields =
                [("Content-Type", "application/json"), ("Mcp-Session-Id", "sess-echo"), ("X-Echo", &auth)];
            response("200 OK", &fields, body.to_string().as_bytes())
        };
        let _ = s.write_all(&answer);
        Next::KeepAlive
    })
}

/// A session at RUST_LOG=trace with the audit log and the metrics listener on,
/// against an upstream that echoes the credentials into its answers: an
/// initialize, an impersonating call, an upstream error, a hidden tool's call,
/// a call the proxy refuses (two identities), an identity change to a new name and token on the
/// control stdin, a call under it, the DELETE. Neither token, whole or cut,
/// appears in the audit log, `/metrics`, `/healthz` or stderr, though every
/// record kind was written and the client was shown both.
#[test]
fn tokens_never_appear_in_the_audit_log_metrics_or_healthz_whatever_the_upstream_echoes() {
    let up = echoing_upstream();
    let audit = scratch_dir("secrets-audit-session").join("audit.jsonl");
    let mut p = ProxyProcess::builder(up.url())
        .agent(AGENT)
        .token(TOKEN)
        .arg("--audit-log", &audit)
        .arg("--metrics-listen", "127.0.0.1:0")
        .arg("--deny-tool", "secret_*")
        .flag("--control-stdin")
        .stdin_piped()
        .env("RUST_LOG", "trace")
        .start();
    let h = host(&p);
    let session = [("Mcp-Session-Id", "sess-echo")];
    let call = |id: u32, tool: &str, sender: &str| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
               "params": {"name": tool, "arguments": {"sender": sender, "message": "m"}}})
        .to_string()
    };
    let mut seen = Vec::new();
    let mut send = |p: &ProxyProcess, raw: Vec<u8>| seen.extend(exchange(p, &raw).raw);
    let init = br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"it","version":"1"}}}"#;
    send(&p, post(&h, &[], init));
    send(&p, post(&h, &session, br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#));
    send(&p, post(&h, &session, call(2, "chat_send", "mallory").as_bytes()));
    send(&p, post(&h, &session, call(3, "fail", AGENT).as_bytes()));
    send(&p, post(&h, &session, call(4, "secret_tool", AGENT).as_bytes()));
    // Two identities in one call: a body the proxy cannot vouch for.
    let twice = br#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"chat_send","arguments":{"sender":"a","sender":"b"}}}"#;
    send(&p, post(&h, &session, twice));
    let line = json!({"agent": "agent-next", "token": NEW_TOKEN}).to_string() + "\n";
    p.stdin().expect("piped stdin").write_all(line.as_bytes()).expect("write the identity line");
    let t0 = Instant::now();
    while !p.stderr_text().contains("identity updated") && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    send(&p, post(&h, &session, call(5, "chat_send", AGENT).as_bytes()));
    send(&p, request("DELETE", "/mcp", &h, &session, b""));
    let t0 = Instant::now();
    while !std::fs::read_to_string(&audit).unwrap_or_default().contains("session.deleted")
        && t0.elapsed() < Duration::from_secs(5)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let texts = observed(&p, &audit);
    let secrets = [("token", TOKEN), ("new token", NEW_TOKEN)];
    // The test means something: the upstream's answers showed the client both tokens, and the
    // audit log holds every kind of record this session makes.
    for (name, secret) in secrets {
        assert!(contains(&seen, secret.as_bytes()), "the upstream never echoed the {name}");
    }
    let log = &texts[0].1;
    for want in [
        "\"event\":\"session.created\"",
        "\"claimed\":\"mallory\"",
        "\"error.type\":\"-32000\"",
        "\"reason\":\"hidden_tool\"",
        "\"reason\":\"refused_body\"",
        "\"event\":\"identity.changed\"",
        "\"claimed\":\"claude-prime\"",
        "\"event\":\"session.deleted\"",
    ] {
        assert!(log.contains(want), "no {want} in the audit log:\n{log}");
    }
    for (what, text) in &texts {
        assert_none_in(what, text, &secrets);
    }
    p.stop();
    let status = p.wait_exit(Duration::from_secs(10));
    assert!(status.is_some_and(|s| s.success()), "exit {status:?}");
    let stderr = p.stderr_text();
    assert!(stderr.contains("TRACE"), "nothing logged at trace");
    assert_none_in("stderr", &stderr, &secrets);
}

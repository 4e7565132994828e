//! The exposed listener: a client token required off loopback, and replaced by the agent token upstream.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{start_with, AGENT, CLIENT_SECRET, TOKEN};
use crate::support::exchange::{assert_jsonrpc_error, exchange, host, json_post as post, ok_upstream, PING};
use crate::support::proxy_process::{scratch_dir, token_file, ProxyProcess, BIN};
use crate::support::wire::contains;

#[test]
fn listening_on_all_interfaces_without_client_token_exits_2() {
    let up = ok_upstream();
    let tf = token_file(TOKEN);
    let mut cmd = Command::new(BIN);
    cmd.args(["--upstream", &up.url(), "--agent", AGENT, "--token-file", tf.to_str().unwrap()])
        .args(["--listen", "0.0.0.0:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = crate::support::proxy_process::spawn(&mut cmd).unwrap();
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > Duration::from_secs(5) {
            let _ = child.kill();
            panic!("proxy still running 5 s after --listen 0.0.0.0:0 without --client-token-file");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert_eq!(status.code(), Some(2), "stdout {out:?} stderr {err:?}");
    assert!(!out.contains("MCP proxy: port"), "it listened anyway: {out:?}");
    assert!(err.contains("client-token"), "stderr does not say why: {err:?}");
    assert_eq!(up.connections(), 0);
}

pub(super) fn client_token_file() -> std::path::PathBuf {
    let path = scratch_dir("client-token").join("secret");
    std::fs::write(&path, format!("{CLIENT_SECRET}\n")).unwrap();
    path
}

#[test]
fn exposed_listener_requires_the_client_secret_and_replaces_it_upstream() {
    let up = ok_upstream();
    let ct = client_token_file();
    let p = start_with(&up, &["--listen", "0.0.0.0:0", "--client-token-file", ct.to_str().unwrap()], &[]);
    let h = host(&p);
    let wrong_same_len: String = CLIENT_SECRET.chars().rev().collect();
    let near = format!("{CLIENT_SECRET}x");
    let cases: Vec<Vec<(&str, String)>> = vec![
        vec![],
        vec![("Authorization", "Bearer".to_string())],
        vec![("Authorization", "Bearer ".to_string())],
        vec![("Authorization", format!("Bearer {wrong_same_len}"))],
        vec![("Authorization", format!("Bearer {near}"))],
        vec![("Authorization", format!("Bearer {}", &CLIENT_SECRET[..CLIENT_SECRET.len() - 1]))],
        vec![("Authorization", format!("Basic {CLIENT_SECRET}"))],
        vec![("Authorization", CLIENT_SECRET.to_string())],
        vec![("X-Agent-Token", CLIENT_SECRET.to_string())],
        vec![("Authorization", format!("Bearer\t{CLIENT_SECRET}"))],
        vec![("Proxy-Authorization", format!("Bearer {CLIENT_SECRET}"))],
    ];
    let good = [("Authorization", format!("Bearer {CLIENT_SECRET}"))];
    let healthy = |p: &ProxyProcess| {
        let fields: Vec<(&str, &str)> = good.iter().map(|(n, v)| (*n, v.as_str())).collect();
        let before = up.request_count();
        let resp = exchange(p, &post(&h, &fields, PING));
        assert_eq!(resp.status, 200, "{:?}", resp.raw_text());
        assert_eq!(up.request_count(), before + 1);
    };
    for fields in &cases {
        let fields: Vec<(&str, &str)> = fields.iter().map(|(n, v)| (*n, v.as_str())).collect();
        let (reqs, conns) = (up.request_count(), up.connections());
        let resp = exchange(&p, &post(&h, &fields, PING));
        assert_jsonrpc_error(&resp, 401);
        assert!(!contains(&resp.raw, CLIENT_SECRET.as_bytes()), "secret echoed: {:?}", resp.raw_text());
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!((up.request_count(), up.connections()), (reqs, conns), "{fields:?} reached upstream");
        healthy(&p);
    }
    // Right secret, other Host and lowercase scheme: relayed (the secret, not
    // the Host, is the guard here).
    let resp = exchange(
        &p,
        &post("mcp.example:1234", &[("Authorization", &format!("bearer  {CLIENT_SECRET}"))], PING),
    );
    assert_eq!(resp.status, 200, "{:?}", resp.raw_text());
    // Right secret but a foreign Origin: still 403.
    let resp = exchange(
        &p,
        &post(
            &h,
            &[("Authorization", &format!("Bearer {CLIENT_SECRET}")), ("Origin", "http://evil.com")],
            PING,
        ),
    );
    assert_jsonrpc_error(&resp, 403);
    healthy(&p);
    for req in up.requests() {
        assert_eq!(req.head.all("authorization"), vec![format!("Bearer {TOKEN}")], "{}", req.raw_text());
        assert_eq!(req.head.all("x-agent-token"), vec![TOKEN], "{}", req.raw_text());
        assert!(!contains(&req.raw, CLIENT_SECRET.as_bytes()), "client secret forwarded: {}", req.raw_text());
    }
}

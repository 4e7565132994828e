//! Identity stamping through the real binary against a recording upstream:
//! mapped tools/call arguments carry the agent's name, fail-closed refusals,
//! and live identity changes (identity file rename, in-place write, SIGHUP,
//! control stdin, an identity file given with the flags, existing or created
//! later) while a GET stream stays open.

use std::io::Write;
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::exchange::{exchange, host, json_post};
use crate::support::proxy_process::{scratch_dir, ProxyProcess};
use crate::support::wire::{contains, request, response, Next, RawClient, Req, StubUpstream};

const TOKEN: &str = "tok-1111-SECRET";
const AGENT: &str = "claude-prime";

fn call(tool: &str, arguments: &str) -> Vec<u8> {
    format!(
        r#"{{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{{"name":"{tool}","arguments":{arguments}}}}}"#
    )
    .into_bytes()
}

/// JSON POSTs get an OK JSON answer; GET gets an SSE stream with an event
/// every 100 ms for 20 s.
fn recording_upstream() -> StubUpstream {
    StubUpstream::start(|req: &Req, s: &mut TcpStream| {
        if req.method == "GET" {
            let _ = s.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
            );
            for i in 0..200 {
                let event = format!("event: message\r\ndata: {i}\r\n\r\n");
                if s.write_all(format!("{:x}\r\n{event}\r\n", event.len()).as_bytes()).is_err() {
                    return Next::Close;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = s.write_all(b"0\r\n\r\n");
            return Next::Close;
        }
        let body = br#"{"jsonrpc":"2.0","id":3,"result":{}}"#;
        let _ = s.write_all(&response("200 OK", &[("Content-Type", "application/json")], body));
        Next::KeepAlive
    })
}

fn post(p: &ProxyProcess, fields: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    json_post(&host(p), fields, body)
}

/// The last request the upstream saw, parsed as JSON.
#[track_caller]
fn last_json(up: &StubUpstream, n: usize) -> (Req, serde_json::Value) {
    let reqs = up.wait_requests(n, Duration::from_secs(5));
    let req = reqs.last().cloned().expect("a request");
    let v = serde_json::from_slice(&req.body)
        .unwrap_or_else(|e| panic!("upstream got invalid JSON ({e}): {}", req.raw_text()));
    (req, v)
}

#[test]
fn spoofed_sender_is_stamped_and_credentials_replaced() {
    let up = recording_upstream();
    let p = ProxyProcess::builder(up.url()).agent(AGENT).token(TOKEN).start();
    let body = call(
        "chat_send",
        r#"{"sender":"mallory","message":"hi \u00e9 1e400 12345678901234567890123456789012345678901","_meta":{"k":[1,2.50]}}"#,
    );
    let resp =
        exchange(&p, &post(&p, &[("Authorization", "Bearer spoof"), ("X-Agent-Token", "spoof")], &body));
    assert_eq!(resp.status, 200);
    let (req, v) = last_json(&up, 1);
    assert_eq!(v["params"]["arguments"]["sender"], AGENT);
    assert_eq!(req.head.all("authorization"), vec![format!("Bearer {TOKEN}")]);
    assert_eq!(req.head.all("x-agent-token"), vec![TOKEN]);
    // Bytes outside the stamp are untouched: the big numbers and escapes
    // survive exactly.
    let expected = String::from_utf8(body).unwrap().replace("\"mallory\"", &format!("\"{AGENT}\""));
    assert_eq!(String::from_utf8_lossy(&req.body), expected);
    assert_eq!(req.head.one("content-length"), expected.len().to_string());
}

#[test]
fn chat_join_name_is_stamped_and_missing_arguments_created() {
    let up = recording_upstream();
    let p = ProxyProcess::builder(up.url()).agent(AGENT).token(TOKEN).start();
    let body = br#"{"jsonrpc":"2.0","id":"x","method":"tools/call","params":{"name":"chat_join"}}"#;
    assert_eq!(exchange(&p, &post(&p, &[], body)).status, 200);
    let (_, v) = last_json(&up, 1);
    assert_eq!(v["params"]["arguments"]["name"], AGENT);
    assert_eq!(v["id"], "x");
    let body = call("chat_claim", r#"{"sender":"x","name":"old-identity"}"#);
    assert_eq!(exchange(&p, &post(&p, &[], &body)).status, 200);
    let (_, v) = last_json(&up, 2);
    assert_eq!(v["params"]["arguments"]["sender"], AGENT);
    assert_eq!(v["params"]["arguments"]["name"], "old-identity", "chat_claim's name is never touched");
}

#[test]
fn non_stamped_messages_pass_byte_for_byte() {
    let up = recording_upstream();
    let p = ProxyProcess::builder(up.url()).agent(AGENT).token(TOKEN).start();
    let bodies: [&[u8]; 3] = [
        br#"{ "jsonrpc" : "2.0", "id" : 1, "method" : "tools/list" }"#,
        br#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"chat_who","arguments":{"sender":"mallory"}}}"#,
        br#"{"jsonrpc":"2.0","method":"notifications/initialized","params":{"x":NaN}}"#,
    ];
    for (i, body) in bodies.iter().enumerate() {
        assert_eq!(exchange(&p, &post(&p, &[], body)).status, 200);
        let reqs = up.wait_requests(i + 1, Duration::from_secs(5));
        assert_eq!(reqs[i].body, *body);
    }
}

#[test]
fn hostile_bodies_are_refused_and_never_forwarded() {
    let up = recording_upstream();
    let p = ProxyProcess::builder(up.url()).agent(AGENT).token(TOKEN).start();
    let cases: &[(&[u8], i64)] = &[
        (br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"chat_send","arguments":{"sender":"a","sender":"b"}}}"#, -32600),
        (br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"chat_send","arguments":{"sender":"a","\u0073ender":"b"}}}"#, -32600),
        (br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","method":"tools/call","params":{"name":"chat_send"}}"#, -32600),
        (br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"chat_send","arguments":"sender=x"}}"#, -32600),
        (br#"{"jsonrpc":"2.0","id":1,"method":"tools/call""#, -32700),
        (b"not json", -32700),
    ];
    for (body, code) in cases {
        let resp = exchange(&p, &post(&p, &[], body));
        assert_eq!(resp.status, 400, "{}", String::from_utf8_lossy(body));
        assert_eq!(resp.one("content-type"), "application/json");
        let v: serde_json::Value = serde_json::from_slice(&resp.body).expect("JSON error body");
        assert_eq!(v["error"]["code"], *code);
        // The refused request's id when the body is JSON, null when not.
        let id = if *code == -32600 { serde_json::json!(1) } else { serde_json::Value::Null };
        assert_eq!(v["id"], id, "{v}");
    }
    // A batch with a tools/call inside is stamped, not refused.
    let batch = br#"[{"jsonrpc":"2.0","id":1,"method":"tools/list"},{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"chat_send","arguments":{"sender":"mallory"}}}]"#;
    assert_eq!(exchange(&p, &post(&p, &[], batch)).status, 200);
    let (_, v) = last_json(&up, 1);
    assert_eq!(v[1]["params"]["arguments"]["sender"], AGENT);
    assert_eq!(up.request_count(), 1, "refused bodies reached the upstream");
}

#[test]
fn non_ascii_agent_name_and_mcp_param_header_are_stamped() {
    let up = recording_upstream();
    let dir = scratch_dir("ident-nonascii");
    let file = dir.join("id.json");
    std::fs::write(&file, r#"{"agent":"zoë \"q\"","token":"tok-x"}"#).unwrap();
    let p = ProxyProcess::builder(up.url()).arg("--identity-file", &file).start();
    let body = call("chat_read", r#"{"sender":"mallory"}"#);
    let resp =
        exchange(&p, &post(&p, &[("Mcp-Param-Sender", "mallory"), ("Mcp-Method", "tools/call")], &body));
    assert_eq!(resp.status, 200);
    let (req, v) = last_json(&up, 1);
    assert_eq!(v["params"]["arguments"]["sender"], "zoë \"q\"");
    // Not plain ASCII: the 2026-07-28 Base64 sentinel.
    let param = req.head.one("mcp-param-sender");
    assert!(param.starts_with("=?base64?") && param.ends_with("?="), "{param}");
    assert_eq!(req.head.one("mcp-method"), "tools/call");
}

#[test]
fn custom_stamp_map() {
    let up = recording_upstream();
    let p = ProxyProcess::builder(up.url())
        .agent(AGENT)
        .token(TOKEN)
        .flag("--no-default-stamps")
        .arg("--stamp", "my_tool=author")
        .start();
    assert_eq!(exchange(&p, &post(&p, &[], &call("chat_send", r#"{"sender":"mallory"}"#))).status, 200);
    let (_, v) = last_json(&up, 1);
    assert_eq!(v["params"]["arguments"]["sender"], "mallory", "defaults dropped");
    assert_eq!(exchange(&p, &post(&p, &[], &call("my_tool", "{}"))).status, 200);
    let (_, v) = last_json(&up, 2);
    assert_eq!(v["params"]["arguments"]["author"], AGENT);
}

/// Open a GET stream through the proxy and read its first event.
fn open_stream(p: &ProxyProcess) -> RawClient {
    let mut c = RawClient::new(p.connect());
    c.send(&request(
        "GET",
        "/mcp",
        &format!("127.0.0.1:{}", p.port),
        &[("Accept", "text/event-stream")],
        b"",
    ));
    let (got, _) = c.read_until(b"data: 0", Duration::from_secs(5));
    assert!(got.is_some(), "no first event on the GET stream");
    c
}

/// The stream is still open: a later event arrives.
#[track_caller]
fn assert_stream_alive(c: &mut RawClient, n: usize) {
    let (got, seen) = c.read_until(format!("data: {n}\r\n").as_bytes(), Duration::from_secs(5));
    assert!(got.is_some(), "GET stream interrupted: {:?}", String::from_utf8_lossy(&seen));
}

fn write_identity(path: &Path, agent: &str, token: &str) {
    std::fs::write(path, format!("{{\"agent\": \"{agent}\", \"token\": \"{token}\"}}\n")).unwrap();
}

/// Poll (bounded) until a tools/call is stamped with `agent` and `token`.
#[track_caller]
fn wait_identity(p: &ProxyProcess, up: &StubUpstream, agent: &str, token: &str, limit: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let before = up.request_count();
        assert_eq!(exchange(p, &post(p, &[], &call("chat_send", r#"{"sender":"x"}"#))).status, 200);
        let (req, v) = last_json(up, before + 1);
        let seen_agent = v["params"]["arguments"]["sender"].as_str().unwrap_or("").to_string();
        let seen_token = req.head.one("x-agent-token").to_string();
        // Never half of one identity and half of another.
        let auth = req.head.one("authorization").to_string();
        assert_eq!(auth, format!("Bearer {seen_token}"));
        if seen_agent == agent && seen_token == token {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < limit,
            "identity {agent} not applied within {limit:?} (still {seen_agent})"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn identity_file_rename_write_and_sighup_switch_the_next_call_while_a_stream_stays_open() {
    let up = recording_upstream();
    let dir = scratch_dir("ident-file");
    let file = dir.join("identity.json");
    write_identity(&file, "agent-one", "tok-one");
    let p = ProxyProcess::builder(up.url()).arg("--identity-file", &file).start();
    wait_identity(&p, &up, "agent-one", "tok-one", Duration::ZERO);
    let mut stream = open_stream(&p);

    // 1. Atomic rename, as editors and agentchattr-style writers do.
    let tmp = dir.join("identity.json.tmp");
    write_identity(&tmp, "agent-two", "tok-two");
    std::fs::rename(&tmp, &file).unwrap();
    let took = wait_identity(&p, &up, "agent-two", "tok-two", Duration::from_secs(2));
    assert!(took < Duration::from_millis(1500), "rename noticed after {took:?}");
    assert_stream_alive(&mut stream, 3);

    // 2. In-place write (same inode).
    std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&file)
        .and_then(|mut f| f.write_all(br#"{"agent": "agent-three", "token": "tok-three"}"#))
        .unwrap();
    wait_identity(&p, &up, "agent-three", "tok-three", Duration::from_secs(2));
    assert_stream_alive(&mut stream, 6);

    // 3. SIGHUP (Unix only: Windows has no such signal): a write the poll
    // cannot see (same size, inode and mtime) is picked up at once.
    #[cfg(unix)]
    sighup_rereads_an_unchanged_looking_file(&p, &up, &file);
    #[cfg(unix)]
    assert_stream_alive(&mut stream, 9);

    // A bad file keeps the old identity, and the token never reaches the log.
    let current = if cfg!(unix) { ("agent-FOUR!", "tok-FOUR!") } else { ("agent-three", "tok-three") };
    std::fs::write(&file, r#"{"agent": "x", "token": "tok-bad-SECRET"#).unwrap();
    std::thread::sleep(Duration::from_millis(700));
    wait_identity(&p, &up, current.0, current.1, Duration::ZERO);
    let log = p.stderr_text();
    assert!(log.contains("keeping the current identity"), "{log}");
    for secret in ["tok-one", "tok-two", "tok-three", "tok-FOUR!", "tok-bad-SECRET"] {
        assert!(!log.contains(secret), "token {secret} in the log");
    }
}

#[cfg(unix)]
fn sighup_rereads_an_unchanged_looking_file(p: &ProxyProcess, up: &StubUpstream, file: &Path) {
    let meta = std::fs::metadata(file).unwrap();
    let mtime = meta.modified().unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(file).unwrap();
    (&f).write_all(br#"{"agent": "agent-FOUR!", "token": "tok-FOUR!"}"#).unwrap();
    f.set_modified(mtime).unwrap();
    drop(f);
    assert_eq!(std::fs::metadata(file).unwrap().len(), meta.len());
    std::thread::sleep(Duration::from_millis(600));
    wait_identity(p, up, "agent-three", "tok-three", Duration::ZERO);
    p.signal("HUP");
    wait_identity(p, up, "agent-FOUR!", "tok-FOUR!", Duration::from_secs(1));
}

#[test]
fn control_stdin_switches_identity_and_eof_exits_zero() {
    let up = recording_upstream();
    let mut p = ProxyProcess::builder(up.url())
        .agent(AGENT)
        .flag("--control-stdin")
        .env("MCP_PROXY_TOKEN", TOKEN)
        .stdin_piped()
        .start();
    wait_identity(&p, &up, AGENT, TOKEN, Duration::ZERO);
    let mut stream = open_stream(&p);
    let stdin = p.stdin().expect("piped stdin");
    stdin.write_all(b"{\"agent\": \"renamed\", \"token\": \"tok-new\"}\n").unwrap();
    stdin.flush().unwrap();
    wait_identity(&p, &up, "renamed", "tok-new", Duration::from_secs(1));
    // A bad line is ignored; a line split across writes still counts.
    let stdin = p.stdin().expect("piped stdin");
    stdin.write_all(b"{\"agent\": 5}\n{\"agent\": \"again\",").unwrap();
    stdin.flush().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    stdin.write_all(b" \"token\": \"tok-again\"}\n").unwrap();
    stdin.flush().unwrap();
    wait_identity(&p, &up, "again", "tok-again", Duration::from_secs(1));
    assert_stream_alive(&mut stream, 3);
    drop(p.take_stdin());
    let status = p.wait_exit(Duration::from_secs(7)).expect("proxy exits at stdin EOF");
    assert!(status.success(), "{status:?}");
    assert!(!contains(p.stderr_text().as_bytes(), b"tok-again"));
}

/// Poll (bounded) until the proxy's stderr holds `needle`.
#[track_caller]
fn wait_log(p: &ProxyProcess, needle: &str, limit: Duration) -> String {
    let start = Instant::now();
    loop {
        let log = p.stderr_text();
        if log.contains(needle) {
            return log;
        }
        assert!(start.elapsed() < limit, "no {needle:?} in the log within {limit:?}:\n{log}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn identity_file_given_with_flags_rules_from_the_start_when_it_exists() {
    let up = recording_upstream();
    let dir = scratch_dir("ident-flags-file");
    let file = dir.join("identity.json");
    write_identity(&file, "file-agent", "tok-file-1");
    let p = ProxyProcess::builder(up.url()).agent(AGENT).token(TOKEN).arg("--identity-file", &file).start();
    // The very first call already carries the file's identity.
    wait_identity(&p, &up, "file-agent", "tok-file-1", Duration::ZERO);
    // Its later changes apply as with the file alone.
    let tmp = dir.join("identity.json.tmp");
    write_identity(&tmp, "file-agent-2", "tok-file-2");
    std::fs::rename(&tmp, &file).unwrap();
    wait_identity(&p, &up, "file-agent-2", "tok-file-2", Duration::from_secs(3));
    let log = p.stderr_text();
    for secret in [TOKEN, "tok-file-1", "tok-file-2"] {
        assert!(!log.contains(secret), "token {secret} in the log");
    }
}

#[test]
fn missing_identity_file_given_with_flags_is_waited_for_and_rules_once_valid() {
    let up = recording_upstream();
    let dir = scratch_dir("ident-flags-missing");
    let file = dir.join("identity.json");
    let p = ProxyProcess::builder(up.url()).agent(AGENT).token(TOKEN).arg("--identity-file", &file).start();
    wait_log(&p, "does not exist yet", Duration::from_secs(5));
    wait_identity(&p, &up, AGENT, TOKEN, Duration::ZERO);
    let mut stream = open_stream(&p);

    // An invalid file appearing keeps the flags' identity.
    std::fs::write(&file, r#"{"agent": "half", "token": "tok-half-SECRET"#).unwrap();
    wait_log(&p, "keeping the current identity", Duration::from_secs(5));
    wait_identity(&p, &up, AGENT, TOKEN, Duration::ZERO);

    // A valid one rules from then on.
    let tmp = dir.join("identity.json.tmp");
    write_identity(&tmp, "file-agent", "tok-file");
    std::fs::rename(&tmp, &file).unwrap();
    wait_identity(&p, &up, "file-agent", "tok-file", Duration::from_secs(3));
    assert_stream_alive(&mut stream, 3);
    let log = p.stderr_text();
    for secret in [TOKEN, "tok-half-SECRET", "tok-file"] {
        assert!(!log.contains(secret), "token {secret} in the log:\n{log}");
    }
}

/// Voluntary context switches of a process's main thread so far.
#[cfg(target_os = "linux")]
fn voluntary_switches(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("voluntary_ctxt_switches in /proc status")
}

/// Make calls back to back until one is stamped with `agent`; how long it took.
#[cfg(target_os = "linux")]
#[track_caller]
fn time_until_identity(p: &ProxyProcess, up: &StubUpstream, agent: &str, limit: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let before = up.request_count();
        assert_eq!(exchange(p, &post(p, &[], &call("chat_send", r#"{"sender":"x"}"#))).status, 200);
        let (_, v) = last_json(up, before + 1);
        if v["params"]["arguments"]["sender"] == agent {
            return start.elapsed();
        }
        assert!(start.elapsed() < limit, "identity {agent} not applied within {limit:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

// Linux only: `/proc` tells the context switches, and inotify is the
// notification wired there (elsewhere the file is polled).
#[cfg(target_os = "linux")]
#[test]
fn idle_proxy_watching_an_identity_file_never_wakes_and_sees_each_change_at_once() {
    let up = recording_upstream();
    let dir = scratch_dir("ident-inotify");
    let file = dir.join("identity.json");
    let p = ProxyProcess::builder(up.url()).agent(AGENT).token(TOKEN).arg("--identity-file", &file).start();
    wait_identity(&p, &up, AGENT, TOKEN, Duration::ZERO);

    // Idle: not one wake-up in 5 s (a 250 ms poll would make about 20).
    // First the upstream connection pooled by the call above expires (2 s).
    std::thread::sleep(Duration::from_millis(2500));
    let before = voluntary_switches(p.pid());
    std::thread::sleep(Duration::from_secs(5));
    let after = voluntary_switches(p.pid());
    assert_eq!(after, before, "the idle proxy woke up {} times in 5 s", after - before);

    // A file created later, an atomic rename over it, an in-place write:
    // each is in force within 100 ms.
    let t0 = Instant::now();
    write_identity(&file, "agent-created", "tok-created");
    let created = time_until_identity(&p, &up, "agent-created", Duration::from_secs(2));
    assert!(
        created < Duration::from_millis(100),
        "new file applied after {created:?} ({:?} since the write)",
        t0.elapsed()
    );

    let tmp = dir.join("identity.json.tmp");
    write_identity(&tmp, "agent-renamed", "tok-renamed");
    std::fs::rename(&tmp, &file).unwrap();
    let renamed = time_until_identity(&p, &up, "agent-renamed", Duration::from_secs(2));
    assert!(renamed < Duration::from_millis(100), "rename applied after {renamed:?}");

    std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&file)
        .and_then(|mut f| f.write_all(br#"{"agent": "agent-written", "token": "tok-written"}"#))
        .unwrap();
    let written = time_until_identity(&p, &up, "agent-written", Duration::from_secs(2));
    assert!(written < Duration::from_millis(100), "in-place write applied after {written:?}");
    eprintln!("identity applied after: created {created:?}, renamed {renamed:?}, written {written:?}");
    // Idle again after the changes (and the pool's expiry): no wake-ups.
    std::thread::sleep(Duration::from_millis(2500));
    let before = voluntary_switches(p.pid());
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(voluntary_switches(p.pid()), before, "woke up while idle after the changes");
}

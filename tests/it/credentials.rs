//! `--token-command`: the program that prints the agent's token, against a
//! recording upstream. Each program is a shell script in a scratch
//! directory (Unix: `/bin/sh`), which counts its runs in a file, so each
//! test can say what each run printed and when it ran.

use std::io::Write;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::support::exchange::{host, json_post};
use crate::support::proxy_process::{self, scratch_dir, ProxyProcess};
use crate::support::wire::{response, Next, Req, StubUpstream};

const AGENT: &str = "claude-prime";

/// Writes an executable script `body` (after `#!/bin/sh` and `set -e`); its
/// runs are counted in `runs` beside it (`$N` is this run's number, from 1).
fn script(name: &str, body: &str) -> (PathBuf, PathBuf) {
    let dir = scratch_dir(name);
    let runs = dir.join("runs");
    let path = dir.join("token.sh");
    let text = format!(
        "#!/bin/sh\nset -e\nN=$(( $(cat '{runs}' 2>/dev/null || echo 0) + 1 ))\necho $N > '{runs}'\n{body}\n",
        runs = runs.display()
    );
    std::fs::write(&path, text).expect("write the script");
    let _ = Command::new("chmod").arg("+x").arg(&path).status();
    (path, runs)
}

fn runs(path: &Path) -> usize {
    std::fs::read_to_string(path).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
}

/// An upstream answering every POST with an OK JSON-RPC result.
fn upstream() -> StubUpstream {
    StubUpstream::start(|_req: &Req, s: &mut TcpStream| {
        let body = br#"{"jsonrpc":"2.0","id":3,"result":{}}"#;
        let _ = s.write_all(&response("200 OK", &[("Content-Type", "application/json")], body));
        Next::KeepAlive
    })
}

fn start(up: &StubUpstream, command: &Path, extra: &[&str]) -> ProxyProcess {
    ProxyProcess::builder(up.url())
        .agent(AGENT)
        .arg("--token-command", command)
        .args(extra)
        .env("RUST_LOG", "trace")
        .start()
}

/// One `tools/call` through the proxy; the upstream's copy of it.
#[track_caller]
fn call(p: &ProxyProcess, up: &StubUpstream) -> Req {
    let n = up.request_count();
    let body =
        br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"chat_send","arguments":{}}}"#;
    let mut s = TcpStream::connect(host(p)).expect("connect");
    s.write_all(&json_post(&host(p), &[("Authorization", "Bearer the-clients-own")], body)).expect("send");
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("\"result\"") {
        match std::io::Read::read(&mut s, &mut buf) {
            Ok(0) | Err(_) => {
                panic!("no answer: {:?}; stderr {}", String::from_utf8_lossy(&got), p.stderr_text())
            }
            Ok(k) => got.extend_from_slice(&buf[..k]),
        }
    }
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"), "{}", String::from_utf8_lossy(&got));
    up.wait_requests(n + 1, Duration::from_secs(5)).pop().expect("the upstream's request")
}

fn bearer(req: &Req) -> String {
    let all = req.head.all("authorization");
    assert_eq!(all.len(), 1, "one Authorization: {all:?}");
    all[0].to_string()
}

/// Runs the binary to its end (`proxy_process::run_to_exit`): its output.
fn run_to_exit(args: &[&str]) -> Output {
    proxy_process::run_to_exit(args).0
}

#[test]
fn a_bare_token_goes_in_authorization_only_and_the_program_is_told_why_it_runs() {
    let up = upstream();
    let dir = scratch_dir("token-command-info");
    let info = dir.join("info");
    let (cmd, runs_file) = script(
        "token-command-bare",
        &format!("printf '%s' \"$MCP_PROXY_EXEC_INFO\" > '{}'\necho tok-bare-SECRET", info.display()),
    );
    let p = start(&up, &cmd, &[]);
    let req = call(&p, &up);
    assert_eq!(bearer(&req), "Bearer tok-bare-SECRET");
    assert!(req.head.all("x-agent-token").is_empty(), "a command's token goes in Authorization only");
    assert_eq!(runs(&runs_file), 1);
    let info: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&info).unwrap()).unwrap();
    assert_eq!(info["reason"], "start", "{info}");
    assert_eq!(info["agent"], AGENT, "{info}");
    assert_eq!(info["upstream"], up.url(), "{info}");
    assert!(!p.stderr_text().contains("tok-bare-SECRET"), "the token reached the log");
}

#[test]
fn each_output_form_is_read_and_a_json_object_of_neither_form_is_refused() {
    let up = upstream();
    let forms = [
        (
            "exec-credential",
            r#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"tok-k8s","expirationTimestamp":"2099-01-01T00:00:00Z"}}"#,
            "tok-k8s",
        ),
        (
            "token-response",
            r#"{"access_token":"tok-oauth","expires_in":3600,"token_type":"Bearer"}"#,
            "tok-oauth",
        ),
    ];
    for (name, output, token) in forms {
        let (cmd, _) = script(&format!("token-command-{name}"), &format!("echo '{output}'"));
        let p = start(&up, &cmd, &[]);
        assert_eq!(bearer(&call(&p, &up)), format!("Bearer {token}"), "{name}");
    }
    let (cmd, _) = script("token-command-other-json", r#"echo '{"token":"tok-not-a-form"}'"#);
    let out =
        run_to_exit(&["--upstream", &up.url(), "--agent", AGENT, "--token-command", cmd.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--token-command gave no token at start"), "{stderr}");
    assert!(!stderr.contains("tok-not-a-form"), "the output reached the log: {stderr}");
}

#[test]
fn a_program_that_fails_at_start_is_exit_2_saying_why_never_what_it_printed() {
    let up = upstream();
    let cases = [
        ("exit-1", "echo tok-SECRET-exit; exit 1", "exited with"),
        ("garbage", "printf 'two words\\n'", "its output"),
        ("two-lines", "printf 'tok-SECRET-a\\ntok-SECRET-b\\n'", "its output"),
        ("ten-mib", "head -c 10485760 /dev/zero | tr '\\0' 'x'", "more than 64 KiB"),
        ("empty", "true", "its output"),
        ("expired", r#"echo '{"access_token":"tok-SECRET-old","expires_in":0}'"#, "expired"),
    ];
    for (name, body, why) in cases {
        let (cmd, _) = script(&format!("token-command-fail-{name}"), body);
        let out = run_to_exit(&[
            "--upstream",
            &up.url(),
            "--agent",
            AGENT,
            "--token-command",
            cmd.to_str().unwrap(),
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {stderr}");
        assert!(out.stdout.is_empty(), "{name}: no port line");
        assert!(stderr.contains(why), "{name}: want {why:?} in {stderr}");
        assert!(!stderr.contains("tok-SECRET"), "{name}: the output reached the log: {stderr}");
    }
    let (cmd, _) = script("token-command-missing", "true");
    let missing = cmd.with_file_name("no-such-program");
    let out = run_to_exit(&[
        "--upstream",
        &up.url(),
        "--agent",
        AGENT,
        "--token-command",
        missing.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot start"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_program_that_hangs_is_killed_after_30_s() {
    let up = upstream();
    let (cmd, _) = script("token-command-hang", "sleep 300");
    let t0 = Instant::now();
    let out =
        run_to_exit(&["--upstream", &up.url(), "--agent", AGENT, "--token-command", cmd.to_str().unwrap()]);
    let took = t0.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("did not finish within 30s"), "{stderr}");
    assert!(took >= Duration::from_secs(29) && took < Duration::from_secs(45), "took {took:?}");
}

#[test]
fn a_token_that_expires_every_3_s_is_renewed_ahead_under_a_stream_of_calls() {
    let up = upstream();
    // Each run's token lives 3 s; runs take 0.2 s (one at a time: a second
    // run while one is going would be seen in `overlap`). Expiry is kept in
    // whole unix seconds, so a run may have as little as 0.8 s; a call that
    // finds the token expired while the run is under way waits for it
    // (`a_request_that_finds_the_token_expired_waits_for_the_renewal_in_flight`).
    let dir = scratch_dir("token-command-renew");
    let lock = dir.join("running");
    let body = format!(
        "if [ -e '{lock}' ]; then echo overlap >> '{lock}.seen'; fi\ntouch '{lock}'\nsleep 0.2\nrm -f '{lock}'\necho \"{{\\\"access_token\\\":\\\"tok-$N\\\",\\\"expires_in\\\":3}}\"",
        lock = lock.display()
    );
    let (cmd, runs_file) = script("token-command-renew-script", &body);
    let audit = dir.join("audit.jsonl");
    let p = start(&up, &cmd, &["--audit-log", audit.to_str().unwrap()]);
    let t0 = Instant::now();
    let mut seen = Vec::new();
    while t0.elapsed() < Duration::from_secs(12) {
        let token = bearer(&call(&p, &up));
        if seen.last() != Some(&token) {
            seen.push(token);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let n = runs(&runs_file);
    eprintln!("token renewals: {n} runs in 12 s; the calls saw {seen:?}");
    // Renewed at half its 3 s life: about 8 runs in 12 s, never back to back.
    assert!((5..=16).contains(&n), "{n} runs in 12 s");
    assert!(seen.len() >= 4, "the calls saw {} tokens: {seen:?}", seen.len());
    for pair in seen.windows(2) {
        let num = |t: &str| t.trim_start_matches("Bearer tok-").parse::<usize>().unwrap_or(0);
        assert!(num(&pair[1]) > num(&pair[0]), "tokens went back: {seen:?}");
    }
    assert!(!dir.join("running.seen").exists(), "two runs at once");
    let text = std::fs::read_to_string(&audit).unwrap_or_default();
    let renewed = text.lines().filter(|l| l.contains("\"credential.renewed\"")).count();
    assert!(renewed >= n - 1, "{renewed} credential.renewed records for {n} runs: {text}");
    assert!(!text.contains("tok-"), "a token in the audit log");
    assert!(!p.stderr_text().contains("tok-1"), "a token in the log");
}

#[test]
fn a_renewal_that_fails_keeps_the_token_in_force_and_is_tried_again_later() {
    let up = upstream();
    let dir = scratch_dir("token-command-renew-fail");
    let audit = dir.join("audit.jsonl");
    // The first run gives a token of 5 s (renewed at 2.5 s); every later
    // run fails.
    let (cmd, runs_file) = script(
        "token-command-renew-fail-script",
        "if [ $N -gt 1 ]; then echo 'the issuer is down' >&2; exit 3; fi\necho '{\"access_token\":\"tok-first\",\"expires_in\":5}'",
    );
    let p = start(&up, &cmd, &["--audit-log", audit.to_str().unwrap(), "--metrics-listen", "127.0.0.1:0"]);
    std::thread::sleep(Duration::from_millis(3500));
    assert_eq!(bearer(&call(&p, &up)), "Bearer tok-first");
    // One failed run at about 2.5 s; the next not before 10 s later.
    assert_eq!(runs(&runs_file), 2, "runs after 3 s");
    let stderr = p.stderr_text();
    assert!(stderr.contains("the issuer is down"), "the program's stderr is logged: {stderr}");
    assert!(stderr.contains("exited with"), "{stderr}");
    let text = std::fs::read_to_string(&audit).unwrap_or_default();
    assert!(text.contains("\"credential.failed\""), "{text}");
    assert!(text.contains("\"credential.renewed\""), "{text}");
    let (_, metrics) = p.metrics_get("/metrics");
    assert!(metrics.contains("mcp_proxy_credential_renewals_total{result=\"ok\"} 1"), "{metrics}");
    assert!(metrics.contains("mcp_proxy_credential_renewals_total{result=\"failed\"} 1"), "{metrics}");
    assert!(metrics.contains("mcp_proxy_credential_expiry_seconds "), "{metrics}");
    assert!(!metrics.contains("tok-first") && !text.contains("tok-first"), "a token in the metrics or audit");
}

#[test]
fn token_command_refuses_a_second_token_source() {
    let up = upstream();
    let (cmd, _) = script("token-command-conflict", "echo tok");
    let token = crate::support::proxy_process::token_file("tok-file");
    for (flag, value) in
        [("--token-file", token.to_str().unwrap()), ("--identity-file", "/nonexistent/id.json")]
    {
        let out = run_to_exit(&[
            "--upstream",
            &up.url(),
            "--agent",
            AGENT,
            "--token-command",
            cmd.to_str().unwrap(),
            flag,
            value,
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag}: {stderr}");
        assert!(stderr.contains("give one token source"), "{flag}: {stderr}");
    }
    let out = run_to_exit(&["--upstream", &up.url(), "--agent", AGENT, "--token-command", "\"unterminated"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--token-command"));
}

/// An upstream that takes only the token named in the file `valid` (a
/// server that revoked the others, as agentchattr does when its registry is
/// wiped), over POST and over a GET stream.
fn revoking_upstream(valid: PathBuf) -> StubUpstream {
    StubUpstream::start(move |req: &Req, s: &mut TcpStream| {
        let want = format!("Bearer {}", std::fs::read_to_string(&valid).unwrap_or_default().trim());
        if req.head.all("authorization") != [want.as_str()] {
            let _ = s.write_all(&response(
                "401 Unauthorized",
                &[
                    ("WWW-Authenticate", "Bearer error=\"invalid_token\""),
                    ("Content-Type", "application/json"),
                ],
                br#"{"error":"invalid_token"}"#,
            ));
            return Next::KeepAlive;
        }
        if req.method == "GET" {
            let event = b"event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/ping\"}\n\n";
            let mut head =
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                    .to_vec();
            head.extend_from_slice(format!("{:x}\r\n", event.len()).as_bytes());
            head.extend_from_slice(event);
            head.extend_from_slice(b"\r\n0\r\n\r\n");
            let _ = s.write_all(&head);
            return Next::Close;
        }
        let body = br#"{"jsonrpc":"2.0","id":3,"result":{}}"#;
        let _ = s.write_all(&response("200 OK", &[("Content-Type", "application/json")], body));
        Next::KeepAlive
    })
}

#[test]
fn a_401_is_never_seen_by_the_client_the_request_goes_again_under_the_new_token() {
    let dir = scratch_dir("token-command-401");
    let valid = dir.join("valid");
    std::fs::write(&valid, "tok-1").unwrap();
    let reasons = dir.join("reasons");
    let (cmd, runs_file) = script(
        "token-command-401-script",
        &format!("printf '%s\\n' \"$MCP_PROXY_EXEC_INFO\" >> '{}'\necho tok-$N", reasons.display()),
    );
    let up = revoking_upstream(valid.clone());
    let p = start(&up, &cmd, &[]);
    assert_eq!(bearer(&call(&p, &up)), "Bearer tok-1");
    // The server revokes tok-1: the next call is refused upstream, the
    // program runs again (told why), and the call goes again under tok-2;
    // the client sees only that answer.
    std::fs::write(&valid, "tok-2").unwrap();
    let n = up.request_count();
    let req = call(&p, &up);
    assert_eq!(bearer(&req), "Bearer tok-2");
    let sent: Vec<String> = up.requests()[n..].iter().map(bearer).collect();
    assert_eq!(sent, ["Bearer tok-1", "Bearer tok-2"], "one refused, one replayed");
    assert_eq!(runs(&runs_file), 2);
    // A GET stream refused with 401 opens under the new token too.
    std::fs::write(&valid, "tok-3").unwrap();
    std::thread::sleep(Duration::from_secs(10));
    let mut s = TcpStream::connect(host(&p)).expect("connect");
    let get = format!(
        "GET /mcp HTTP/1.1\r\nHost: {}\r\nAccept: text/event-stream\r\nConnection: close\r\n\r\n",
        host(&p)
    );
    s.write_all(get.as_bytes()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let mut got = Vec::new();
    let _ = std::io::Read::read_to_end(&mut s, &mut got);
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("notifications/ping"), "{text}");
    assert_eq!(runs(&runs_file), 3);
    let why: Vec<String> = std::fs::read_to_string(&reasons)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["reason"].as_str().unwrap_or("").to_string()
        })
        .collect();
    assert_eq!(why, ["start", "unauthorized", "unauthorized"]);
}

#[test]
fn a_server_that_refuses_every_token_gets_one_run_and_its_401_relayed_at_once_after() {
    let dir = scratch_dir("token-command-401-always");
    let valid = dir.join("valid");
    std::fs::write(&valid, "tok-1").unwrap();
    let (cmd, runs_file) = script("token-command-401-always-script", "echo tok-$N");
    let up = revoking_upstream(valid.clone());
    let p = start(&up, &cmd, &[]);
    assert_eq!(bearer(&call(&p, &up)), "Bearer tok-1");
    std::fs::write(&valid, "tok-never").unwrap();
    // The first 401: one run, the request sent again under tok-2, refused
    // again: that second 401 is the answer.
    let t0 = Instant::now();
    assert_eq!(raw_status(&p), 401);
    assert_eq!(runs(&runs_file), 2);
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    // Within 10 s of that run, a 401 is relayed at once: no run per request.
    for _ in 0..5 {
        let t0 = Instant::now();
        assert_eq!(raw_status(&p), 401);
        assert!(t0.elapsed() < Duration::from_secs(1), "a 401 waited {:?}", t0.elapsed());
    }
    assert_eq!(runs(&runs_file), 2, "a run for 401s within 10 s of the last");
}

/// The status of one `tools/call` through the proxy.
fn raw_status(p: &ProxyProcess) -> u16 {
    let body =
        br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"chat_send","arguments":{}}}"#;
    let mut s = TcpStream::connect(host(p)).expect("connect");
    s.write_all(&json_post(&host(p), &[], body)).expect("send");
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let mut got = [0u8; 12];
    std::io::Read::read_exact(&mut s, &mut got).expect("a status line");
    String::from_utf8_lossy(&got[9..12]).parse().unwrap_or(0)
}

#[test]
fn over_stdio_the_token_is_the_programs_and_is_renewed_ahead_of_expiry() {
    let up = upstream();
    let (cmd, runs_file) = script(
        "token-command-stdio",
        "echo \"{\\\"access_token\\\":\\\"tok-stdio-$N\\\",\\\"expires_in\\\":2}\"",
    );
    let mut p = ProxyProcess::builder(up.url())
        .agent(AGENT)
        .arg("--token-command", &cmd)
        .env("RUST_LOG", "trace")
        .start_stdio();
    let call = serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "chat_send", "arguments": {}}});
    let mut seen = Vec::new();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(4) {
        let n = up.request_count();
        let answer = p.call(&call);
        assert!(answer["result"].is_object(), "{answer}");
        let req = up.wait_requests(n + 1, Duration::from_secs(5)).pop().expect("the upstream's request");
        let token = bearer(&req);
        assert!(req.head.all("x-agent-token").is_empty(), "a command's token goes in Authorization only");
        if seen.last() != Some(&token) {
            seen.push(token);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(seen.first().map(String::as_str), Some("Bearer tok-stdio-1"), "{seen:?}");
    assert!(seen.len() >= 3, "renewed every second of a 2 s life: {seen:?}");
    assert!(runs(&runs_file) >= 3);
    p.assert_stdout_clean();
    p.end_session(Duration::from_secs(5));
}

#[test]
fn a_token_past_its_expiry_is_never_sent_the_request_gets_the_outage_answer_with_its_id() {
    let up = upstream();
    // A token of 2 s (renewed at 1 s); every later run fails.
    let (cmd, _) = script(
        "token-command-expired",
        "if [ $N -gt 1 ]; then exit 3; fi\necho '{\"access_token\":\"tok-short\",\"expires_in\":2}'",
    );
    let p = start(&up, &cmd, &["--metrics-listen", "127.0.0.1:0"]);
    assert_eq!(bearer(&call(&p, &up)), "Bearer tok-short");
    let (status, health) = p.metrics_get("/healthz");
    assert_eq!(status, 200, "{health}");
    assert!(health.contains("\"token_valid\":true"), "{health}");
    std::thread::sleep(Duration::from_millis(3200));
    let (status, health) = p.metrics_get("/healthz");
    assert_eq!(status, 503, "no valid token: unhealthy: {health}");
    assert!(health.contains("\"token_valid\":false"), "{health}");
    assert!(!health.contains("tok-short"), "{health}");
    let n = up.request_count();
    let body = br#"{"jsonrpc":"2.0","id":"late-7","method":"tools/call","params":{"name":"chat_send","arguments":{}}}"#;
    let mut s = TcpStream::connect(host(&p)).expect("connect");
    s.write_all(&json_post(&host(&p), &[], body)).expect("send");
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("}}") {
        match std::io::Read::read(&mut s, &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(k) => got.extend_from_slice(&buf[..k]),
        }
    }
    let text = String::from_utf8_lossy(&got);
    let json = text.split("\r\n\r\n").nth(1).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(v["id"], "late-7", "{text}");
    assert!(v["error"]["message"].as_str().unwrap_or("").contains("expired"), "{text}");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(up.request_count(), n, "a request went out under an expired token");
}

#[test]
fn a_request_that_finds_the_token_expired_waits_for_the_renewal_in_flight() {
    let up = upstream();
    // The first token lives 2 s; the renewal (due at half its life) takes
    // 3 s, so the token expires while it runs.
    let (cmd, runs_file) = script(
        "token-command-slow-renewal",
        "if [ $N -gt 1 ]; then sleep 3; fi\necho \"{\\\"access_token\\\":\\\"tok-$N\\\",\\\"expires_in\\\":2}\"",
    );
    let p = start(&up, &cmd, &["--connect-timeout", "6"]);
    let t0 = Instant::now();
    assert_eq!(bearer(&call(&p, &up)), "Bearer tok-1");
    // Past the first token's expiry (at most 2 s), before the renewal's end (at least 3 s after it began).
    std::thread::sleep(Duration::from_millis(2300).saturating_sub(t0.elapsed()));
    assert_eq!(runs(&runs_file), 2, "the renewal is under way");
    let n = up.request_count();
    let asked = Instant::now();
    let req = call(&p, &up);
    let waited = asked.elapsed();
    assert_eq!(bearer(&req), "Bearer tok-2", "sent under the renewed token");
    assert!(waited > Duration::from_millis(200), "answered after {waited:?}: it did not wait");
    let sent: Vec<String> = up.requests()[n..].iter().map(bearer).collect();
    assert_eq!(sent, ["Bearer tok-2"], "nothing went out under the expired token");
    assert!(p.stderr_text().contains("the request waits for the renewal"), "{}", p.stderr_text());
}

//! Command-line contract: arguments, exit codes, the port
//! line, signals, and the token never printed.

use std::io::Write;
use std::net::TcpListener;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::support::proxy_process::{scratch_dir, token_file, ProxyProcess, BIN};
use crate::support::wire::{request, response, Next, RawClient, StubUpstream};

const TOKEN: &str = "cli-tok-9b8c7d-SECRET";

/// Run the binary to completion (10 s bound) with a clean environment for
/// the variables it reads.
#[track_caller]
fn run(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env_remove("MCP_PROXY_TOKEN")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn proxy");
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if start.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{args:?} still running after 10 s; stdout {:?} stderr {:?}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Exit status 2, nothing on stdout, exactly one non-empty line on stderr.
#[track_caller]
fn assert_bad_arguments(args: &[&str], envs: &[(&str, &str)]) -> String {
    let out = run(args, envs);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{args:?}: status {:?}, stderr {stderr:?}", out.status);
    assert!(out.stdout.is_empty(), "{args:?}: stdout {:?}", String::from_utf8_lossy(&out.stdout));
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{args:?}: want a one-line error, got {stderr:?}");
    stderr
}

fn tf() -> String {
    token_file(TOKEN).to_str().unwrap().to_string()
}

const UP: &str = "http://127.0.0.1:9/mcp";

#[test]
fn unknown_flag_exits_2_with_one_line() {
    let t = tf();
    let err = assert_bad_arguments(&["--upstream", UP, "--agent", "a", "--token-file", &t, "--bogus"], &[]);
    assert!(err.contains("--bogus"), "message does not name the flag: {err:?}");
}

#[test]
fn unreadable_token_file_exits_2() {
    let missing = scratch_dir("cli").join("no-such-token");
    assert_bad_arguments(&["--upstream", UP, "--agent", "a", "--token-file", missing.to_str().unwrap()], &[]);
}

#[test]
fn empty_token_file_exits_2() {
    let path = scratch_dir("cli").join("empty");
    std::fs::write(&path, "\n").unwrap();
    assert_bad_arguments(&["--upstream", UP, "--agent", "a", "--token-file", path.to_str().unwrap()], &[]);
}

#[test]
fn empty_token_in_environment_exits_2() {
    assert_bad_arguments(&["--upstream", UP, "--agent", "a"], &[("MCP_PROXY_TOKEN", "")]);
}

#[test]
fn https_upstream_exits_2_and_says_why() {
    let t = tf();
    let err = assert_bad_arguments(
        &["--upstream", "https://127.0.0.1:8200/mcp", "--agent", "a", "--token-file", &t],
        &[],
    );
    let lower = err.to_ascii_lowercase();
    assert!(
        lower.contains("https") || lower.contains("tls"),
        "message does not say https is refused: {err:?}"
    );
}

#[test]
fn unparsable_upstream_exits_2() {
    let t = tf();
    assert_bad_arguments(&["--upstream", "not a url", "--agent", "a", "--token-file", &t], &[]);
}

#[test]
fn unparsable_listen_address_exits_2() {
    let t = tf();
    for addr in ["nonsense", "127.0.0.1", "127.0.0.1:99999"] {
        assert_bad_arguments(&["--upstream", UP, "--agent", "a", "--token-file", &t, "--listen", addr], &[]);
    }
}

#[test]
fn unparsable_timeout_exits_2() {
    let t = tf();
    for flag in ["--connect-timeout", "--response-timeout", "--idle-timeout"] {
        assert_bad_arguments(&["--upstream", UP, "--agent", "a", "--token-file", &t, flag, "abc"], &[]);
    }
}

#[test]
fn missing_upstream_exits_2() {
    let t = tf();
    assert_bad_arguments(&["--agent", "a", "--token-file", &t], &[]);
}

#[test]
fn missing_agent_exits_2() {
    let t = tf();
    assert_bad_arguments(&["--upstream", UP, "--token-file", &t], &[]);
}

#[test]
fn missing_token_exits_2() {
    assert_bad_arguments(&["--upstream", UP, "--agent", "a"], &[]);
}

#[test]
fn flag_without_value_exits_2() {
    let t = tf();
    assert_bad_arguments(&["--upstream", UP, "--token-file", &t, "--agent"], &[]);
}

#[test]
fn invalid_identity_file_with_flags_exits_2_naming_the_file_never_the_token() {
    let file = scratch_dir("cli").join("identity.json");
    std::fs::write(&file, r#"{"agent": "x", "token": "file-tok-SECRET"#).unwrap();
    let f = file.to_str().unwrap();
    let t = tf();
    for (args, envs) in [
        (vec!["--upstream", UP, "--agent", "a", "--token-file", t.as_str(), "--identity-file", f], vec![]),
        (vec!["--upstream", UP, "--agent", "a", "--identity-file", f], vec![("MCP_PROXY_TOKEN", TOKEN)]),
    ] {
        let err = assert_bad_arguments(&args, &envs);
        assert!(err.contains(f), "the line does not name the file: {err:?}");
        assert!(err.contains("JSON"), "the line does not say what is wrong: {err:?}");
        assert!(!err.contains(TOKEN) && !err.contains("SECRET"), "a token in {err:?}");
    }
}

#[test]
fn half_a_flag_identity_with_identity_file_exits_2_saying_what_is_missing() {
    let dir = scratch_dir("cli");
    let file = dir.join("identity.json");
    std::fs::write(&file, r#"{"agent": "x", "token": "file-tok-SECRET"}"#).unwrap();
    let missing = dir.join("later.json");
    let t = tf();
    for f in [file.to_str().unwrap(), missing.to_str().unwrap()] {
        let err = assert_bad_arguments(&["--upstream", UP, "--agent", "a", "--identity-file", f], &[]);
        assert!(err.contains("MCP_PROXY_TOKEN"), "{err:?}");
        let err = assert_bad_arguments(&["--upstream", UP, "--token-file", &t, "--identity-file", f], &[]);
        assert!(err.contains("needs --agent"), "{err:?}");
        assert!(!err.contains(TOKEN) && !err.contains("SECRET"), "a token in {err:?}");
    }
}

#[test]
fn taken_fixed_port_prints_in_use_line_and_exits_3() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let t = tf();
    let listen = format!("127.0.0.1:{port}");
    let out = run(&["--upstream", UP, "--agent", "a", "--token-file", &t, "--listen", &listen], &[]);
    assert_eq!(out.status.code(), Some(3), "stderr {:?}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("  MCP proxy: port {port} in use (shared with another instance)\n")
    );
    drop(taken);
}

#[test]
fn free_fixed_port_is_used_and_printed() {
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let p = ProxyProcess::builder(UP)
        .agent("a")
        .token(TOKEN)
        .arg("--listen", format!("127.0.0.1:{port}"))
        .start();
    assert_eq!(p.port, port);
}

#[test]
fn help_exits_0_and_mentions_every_flag() {
    let out = run(&["--help"], &[]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--upstream",
        "--agent",
        "--token-file",
        "MCP_PROXY_TOKEN",
        "--listen",
        "--connect-timeout",
        "--response-timeout",
        "--idle-timeout",
        "--help",
        "--version",
    ] {
        assert!(text.contains(flag), "--help does not mention {flag}: {text}");
    }
}

#[test]
fn help_states_how_identity_file_and_flags_combine() {
    let out = run(&["--help"], &[]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    for rule in [
        "Given alone, it must exist and be valid at start.",
        "Given with --agent and a token (--token-file or MCP_PROXY_TOKEN), the flags give the starting identity",
        "a file that exists at start must be valid (else exit 2) and rules from the start",
        "a file that does not exist yet is waited for (logged at info) and rules as soon as it appears and is valid",
        "--agent without a token, or --token-file without --agent, is refused (exit 2)",
    ] {
        assert!(flat.contains(rule), "--help does not say {rule:?}:\n{text}");
    }
}

#[test]
fn version_exits_0_and_prints_the_version() {
    let out = run(&["--version"], &[]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(env!("CARGO_PKG_VERSION")), "{text:?}");
}

#[test]
fn fractional_timeouts_are_accepted() {
    // Each fraction must take effect as written: 1.25 s read as 1, 12.5 or
    // 125, or 0.4 read as 0 or 4, falls outside the bounds below.
    let silent = StubUpstream::silent();
    let p = ProxyProcess::builder(silent.url())
        .agent("a")
        .token(TOKEN)
        .arg("--connect-timeout", "0.5")
        .arg("--response-timeout", "1.25")
        .arg("--idle-timeout", "2.5")
        .arg("--keepalive-timeout", "0.4")
        .start();
    let body = br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    let fields = [("Content-Type", "application/json"), ("Accept", "application/json, text/event-stream")];
    let mut c = RawClient::new(p.connect());
    let t0 = Instant::now();
    c.send(&request("POST", "/mcp", &p.addr().to_string(), &fields, body));
    let resp = c.read_response("POST");
    let waited = t0.elapsed();
    assert_eq!(resp.status, 504, "{}", resp.raw_text());
    assert!(
        waited >= Duration::from_millis(1200) && waited < Duration::from_millis(2500),
        "--response-timeout 1.25 answered after {waited:?}"
    );
    // An idle keep-alive connection is closed after 0.4 s.
    let mut idle = p.connect();
    idle.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let t0 = Instant::now();
    let mut buf = [0u8; 16];
    let n = std::io::Read::read(&mut idle, &mut buf).unwrap_or(0);
    let closed = t0.elapsed();
    assert_eq!(n, 0, "an idle connection got bytes");
    assert!(
        closed >= Duration::from_millis(350) && closed < Duration::from_millis(1500),
        "--keepalive-timeout 0.4 closed after {closed:?}"
    );
}

// Signals sent with kill(1) exist on Unix only; Windows' console events are
// covered by the wine smoke run (.ci/wine_smoke.py).
#[cfg(unix)]
#[track_caller]
fn assert_signal_exits_0(sig: &str) {
    let mut p = ProxyProcess::builder(UP).agent("a").token(TOKEN).start();
    let t0 = Instant::now();
    p.signal(sig);
    let status = p.wait_exit(Duration::from_secs(6)).unwrap_or_else(|| panic!("no exit 6 s after SIG{sig}"));
    assert_eq!(status.code(), Some(0), "SIG{sig}: {status:?}; stderr {}", p.stderr_text());
    assert!(t0.elapsed() < Duration::from_secs(6));
}

#[cfg(unix)]
#[test]
fn sigterm_exits_0() {
    assert_signal_exits_0("TERM");
}

#[cfg(unix)]
#[test]
fn sigint_exits_0() {
    assert_signal_exits_0("INT");
}

/// A graceful stop (`stop` on the started proxy) lets an exchange already
/// sent upstream finish, then exits 0.
#[track_caller]
fn assert_stop_lets_an_in_flight_exchange_finish(control_stdin: bool, stop: fn(&mut ProxyProcess)) {
    let up = StubUpstream::start(|_, s| {
        std::thread::sleep(Duration::from_millis(800));
        let _ = s.write_all(&response("200 OK", &[("Content-Type", "text/plain")], b"finished"));
        Next::KeepAlive
    });
    let mut proxy = ProxyProcess::builder(up.url()).agent("a").token(TOKEN);
    if control_stdin {
        proxy = proxy.flag("--control-stdin").stdin_piped();
    }
    let mut p = proxy.start();
    let mut c = RawClient::new(p.connect());
    c.send(&request("GET", "/slow", &format!("127.0.0.1:{}", p.port), &[], b""));
    up.wait_requests(1, Duration::from_secs(5));
    stop(&mut p);
    let resp = c.read_response("GET");
    assert_eq!(resp.status, 200, "{:?}", resp.raw_text());
    assert_eq!(resp.text(), "finished");
    let status = p.wait_exit(Duration::from_secs(6)).expect("no exit 6 s after the stop");
    assert_eq!(status.code(), Some(0));
}

#[cfg(unix)]
#[test]
fn sigterm_lets_an_in_flight_exchange_finish() {
    assert_stop_lets_an_in_flight_exchange_finish(false, |p| p.signal("TERM"));
}

#[test]
fn stdin_eof_lets_an_in_flight_exchange_finish() {
    assert_stop_lets_an_in_flight_exchange_finish(true, ProxyProcess::stop);
}

#[test]
fn token_never_appears_in_logs_at_trace() {
    let up = StubUpstream::fixed(response("200 OK", &[("Content-Type", "application/json")], b"{}"));
    let mut p = ProxyProcess::builder(up.url())
        .agent("a")
        .token(TOKEN)
        .flag("--control-stdin")
        .env("RUST_LOG", "trace")
        .stdin_piped()
        .start();
    let h = format!("127.0.0.1:{}", p.port);
    let mut c = RawClient::new(p.connect());
    for (method, body) in
        [("POST", &br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#[..]), ("GET", b""), ("DELETE", b"")]
    {
        c.send(&request(
            method,
            "/mcp",
            &h,
            &[("Content-Type", "application/json"), ("Authorization", "Bearer client")],
            body,
        ));
        assert_eq!(c.read_response(method).status, 200);
    }
    // A request the proxy rejects, and one whose upstream is gone.
    let mut bad = RawClient::new(p.connect());
    bad.send(b"GET /mcp HTTP/1.1\r\n\r\n");
    let _ = bad.read_response("GET");
    p.stop();
    p.wait_exit(Duration::from_secs(6)).expect("no exit after stdin EOF");
    std::thread::sleep(Duration::from_millis(100));
    let stderr = p.stderr_text();
    assert!(!stderr.trim().is_empty(), "nothing logged at RUST_LOG=trace");
    assert!(!stderr.contains(TOKEN), "token in stderr:\n{stderr}");
}

#[test]
fn token_never_appears_in_logs_when_upstream_is_unreachable() {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}/mcp");
    let mut p = ProxyProcess::builder(&url)
        .agent("a")
        .token(TOKEN)
        .flag("--control-stdin")
        .env("RUST_LOG", "trace")
        .stdin_piped()
        .start();
    let mut c = RawClient::new(p.connect());
    c.send(&request(
        "POST",
        "/mcp",
        &format!("127.0.0.1:{}", p.port),
        &[("Content-Type", "application/json")],
        b"{}",
    ));
    let resp = c.read_response("POST");
    assert_eq!(resp.status, 502);
    p.stop();
    p.wait_exit(Duration::from_secs(6)).expect("no exit after stdin EOF");
    std::thread::sleep(Duration::from_millis(100));
    assert!(!p.stderr_text().contains(TOKEN), "token in stderr:\n{}", p.stderr_text());
}

/// `--control-stdin` on something that is not a stream (a regular file, the
/// null device) would end at once: refused with exit 2 and one clear line.
#[test]
fn control_stdin_on_a_regular_file_or_the_null_device_exits_2() {
    let t = tf();
    let file = scratch_dir("stdin-file").join("stdin.txt");
    std::fs::write(&file, "{\"agent\": \"a\", \"token\": \"t\"}\n").unwrap();
    let args = ["--upstream", UP, "--agent", "a", "--token-file", &t, "--control-stdin"];
    for (what, stdin) in
        [("a regular file", Stdio::from(std::fs::File::open(&file).unwrap())), ("null", Stdio::null())]
    {
        let out = Command::new(BIN)
            .args(args)
            .env_remove("RUST_LOG")
            .stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .expect("run proxy");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "stdin {what}: {:?}, stderr {stderr}", out.status);
        assert!(stderr.contains("--control-stdin: stdin must be"), "stdin {what}: {stderr}");
        assert!(out.stdout.is_empty(), "stdin {what}: the port line was printed");
    }
}

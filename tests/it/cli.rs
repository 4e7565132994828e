//! Command-line contract: arguments, exit codes, the port
//! line, signals, the token never printed, and `--probe`.

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::support::proxy_process::{scratch_dir, spawn, token_file, ProxyProcess, BIN};
use crate::support::wire::{request, response, Next, RawClient, StubUpstream};

const TOKEN: &str = "cli-tok-9b8c7d-SECRET";
const RUN_BOUND: Duration = Duration::from_secs(60);

/// Run the binary to completion with a clean environment for the variables
/// it reads. The bound is a gross one against a hang (60 s): under wine a
/// process start alone has been seen to take seconds on a busy machine.
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
    let mut child = spawn(&mut cmd).expect("spawn proxy");
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if start.elapsed() > RUN_BOUND {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{args:?} still running after {RUN_BOUND:?}; stdout {:?} stderr {:?}",
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

/// The minimal build (`--no-default-features`) has no TLS: it says so.
#[cfg(not(feature = "tls"))]
#[test]
fn https_upstream_exits_2_and_says_why() {
    let t = tf();
    let err = assert_bad_arguments(
        &["--upstream", "https://127.0.0.1:8200/mcp", "--agent", "a", "--token-file", &t],
        &[],
    );
    assert!(err.contains("built without TLS"), "message does not say the binary has no TLS: {err:?}");
}

/// The default build takes https://, and a TLS setup it cannot make exits
/// 2 naming the file (never its bytes); TLS flags beside http:// too.
#[cfg(feature = "tls")]
#[test]
fn https_upstream_with_a_bad_ca_file_exits_2_and_names_it() {
    let t = tf();
    let up = "https://127.0.0.1:8200/mcp";
    let err = assert_bad_arguments(
        &["--upstream", up, "--agent", "a", "--token-file", &t, "--ca-file", "/nonexistent/ca.pem"],
        &[],
    );
    assert!(err.contains("/nonexistent/ca.pem"), "{err:?}");
    let err = assert_bad_arguments(
        &["--upstream", up, "--agent", "a", "--token-file", &t, "--tls-client-cert", "/c.pem"],
        &[],
    );
    assert!(err.contains("both or neither"), "{err:?}");
    let err =
        assert_bad_arguments(&["--upstream", UP, "--agent", "a", "--token-file", &t, "--ca-file", "/a"], &[]);
    assert!(err.contains("only for an https:// upstream"), "{err:?}");
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
        "--no-proxy-env",
        "--upstream-proxy-http",
        "HTTPS_PROXY",
        "NO_PROXY",
        "--agent",
        "--token-file",
        "--token-command",
        "MCP_PROXY_EXEC_INFO",
        "MCP_PROXY_TOKEN",
        "--listen",
        "--connect-timeout",
        "--response-timeout",
        "--idle-timeout",
        "--help",
        "--version",
        "--probe",
        "--allow-tool",
        "--deny-tool",
        "--show-identity-params",
        "--identity-param",
        "--audit-log",
        "--audit-max-bytes",
        "--metrics-listen",
        "SIGUSR1",
        "--ca-file",
        "SSL_CERT_FILE",
        "--tls-client-cert",
        "--tls-client-key",
        "--oauth-client-id",
        "--oauth-client-secret-file",
        "--oauth-client-key-file",
        "--oauth-assertion-file",
        "--oauth-token-endpoint",
        "--oauth-scope",
        "--oauth-no-resource",
        "--dpop",
        "--dpop-key-file",
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
        let mut cmd = Command::new(BIN);
        cmd.args(args).env_remove("RUST_LOG").stdin(stdin).stdout(Stdio::piped()).stderr(Stdio::piped());
        let out = spawn(&mut cmd).and_then(|c| c.wait_with_output()).expect("run proxy");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "stdin {what}: {:?}, stderr {stderr}", out.status);
        assert!(stderr.contains("--control-stdin: stdin must be"), "stdin {what}: {stderr}");
        assert!(out.stdout.is_empty(), "stdin {what}: the port line was printed");
    }
}

/// `--probe URL` run to completion: its exit status and stderr, and how
/// long it took. It never writes to stdout.
#[track_caller]
fn probe(url: &str, envs: &[(&str, &str)]) -> (Option<i32>, String, Duration) {
    let t0 = Instant::now();
    let out = run(&["--probe", url], envs);
    let took = t0.elapsed();
    assert!(out.stdout.is_empty(), "--probe {url}: stdout {:?}", String::from_utf8_lossy(&out.stdout));
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned(), took)
}

/// Exit status 1 and one short line on stderr, which names the URL; the line.
#[track_caller]
fn assert_probe_fails(url: &str) -> String {
    let (code, stderr, _) = probe(url, &[]);
    assert_eq!(code, Some(1), "--probe {url}: stderr {stderr:?}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "--probe {url}: want one line, got {stderr:?}");
    assert!(lines[0].len() < 300, "--probe {url}: a long line {stderr:?}");
    assert!(lines[0].contains(url), "--probe {url}: the line does not name the URL: {stderr:?}");
    assert!(!stderr.contains('\x1b'), "--probe {url}: a raw control byte reached stderr: {stderr:?}");
    lines[0].to_string()
}

/// A health endpoint that answers every request with `answer` and closes.
fn health(answer: impl Into<Vec<u8>>) -> (StubUpstream, String) {
    let up = StubUpstream::fixed_then_close(answer);
    let url = format!("http://127.0.0.1:{}/healthz", up.port);
    (up, url)
}

#[test]
fn probe_exits_0_on_a_200_printing_nothing() {
    let (up, url) = health(response("200 OK", &[("Content-Type", "text/plain")], b"ok"));
    // The container's environment carries the token and a log filter: ignored.
    let (code, stderr, _) = probe(&url, &[("MCP_PROXY_TOKEN", TOKEN), ("RUST_LOG", "trace")]);
    assert_eq!((code, stderr.as_str()), (Some(0), ""));
    let req = up.only_request();
    assert_eq!(
        (req.method.as_str(), req.target.as_str(), req.version.as_str()),
        ("GET", "/healthz", "HTTP/1.1")
    );
    assert_eq!(req.head.one("host"), up.authority());
    assert_eq!(req.head.one("connection"), "close");
    assert!(!req.head.has("authorization") && !req.raw_text().contains(TOKEN), "{}", req.raw_text());
    // localhost needs no resolver; no path is "/".
    let (code, stderr, _) = probe(&format!("http://localhost:{}", up.port), &[]);
    assert_eq!((code, stderr.as_str()), (Some(0), ""));
    assert_eq!(up.wait_requests(2, Duration::from_secs(5))[1].target, "/");
}

#[test]
fn probe_reads_a_status_line_that_arrives_byte_by_byte() {
    let up = StubUpstream::start(|_, s| {
        let _ = s.set_nodelay(true);
        for b in response("200 OK", &[], b"ok") {
            let _ = s.write_all(&[b]);
            std::thread::sleep(Duration::from_millis(5));
        }
        Next::Close
    });
    let (code, stderr, _) = probe(&format!("http://127.0.0.1:{}/healthz", up.port), &[]);
    assert_eq!((code, stderr.as_str()), (Some(0), ""));
}

#[test]
fn probe_exits_1_on_another_status_naming_it_never_the_body() {
    for (status, code) in
        [("503 Service Unavailable", "503"), ("204 No Content", "204"), ("404 Not Found", "404")]
    {
        let (_up, url) = health(response(status, &[], b"down: BODY-NOT-SHOWN"));
        let line = assert_probe_fails(&url);
        assert!(line.contains(code), "{line}");
        assert!(!line.contains("BODY-NOT-SHOWN"), "{line}");
    }
}

#[test]
fn probe_exits_1_on_garbage_showing_a_short_escaped_excerpt() {
    let mut junk = b"SSH-2.0-OpenSSH_9.6\r\n\x1b[2J".to_vec();
    junk.resize(64 * 1024, b'x');
    let (_up, url) = health(junk);
    let line = assert_probe_fails(&url);
    assert!(line.contains("SSH-2.0-OpenSSH_9.6\\r\\n"), "{line}");
    // A status line that never ends, and an HTTP/2 one.
    let mut endless = b"HTTP/1.1 200 ".to_vec();
    endless.resize(64 * 1024, b'x');
    let (_up, url) = health(endless);
    assert!(assert_probe_fails(&url).contains("no line end"));
    let (_up, url) = health(&b"HTTP/2 200\r\n\r\n"[..]);
    assert_probe_fails(&url);
}

/// A listener that takes one connection and closes it at once, unread;
/// and one that sends half a status line, then closes.
#[test]
fn probe_exits_1_when_the_connection_closes_before_a_status_line() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://127.0.0.1:{}/healthz", listener.local_addr().unwrap().port());
    let closer = std::thread::spawn(move || drop(listener.accept()));
    assert_probe_fails(&url);
    closer.join().unwrap();
    let (_up, url) = health(&b"HTTP/1.1 20"[..]);
    let line = assert_probe_fails(&url);
    assert!(line.contains("closed") && line.contains("HTTP/1.1 20"), "{line}");
}

#[test]
fn probe_exits_1_within_its_bound_when_nothing_answers() {
    let silent = StubUpstream::silent();
    let url = format!("http://127.0.0.1:{}/healthz", silent.port);
    let t0 = Instant::now();
    let line = assert_probe_fails(&url);
    let took = t0.elapsed();
    assert!(line.contains("no answer within"), "{line}");
    // The bound is 3 s for the whole probe: gross limits either side.
    assert!(took >= Duration::from_secs(2) && took < Duration::from_secs(8), "gave up after {took:?}");
    silent.wait_requests(1, Duration::from_secs(1));
}

#[test]
fn probe_exits_1_on_a_refused_port() {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}/healthz");
    let (code, stderr, took) = probe(&url, &[]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.to_ascii_lowercase().contains("refused"), "{stderr}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    // Nothing listens on it now, and nothing was started to.
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
}

#[test]
fn probe_bad_urls_exit_2_with_one_line() {
    for (url, why) in [
        ("https://127.0.0.1:9100/healthz", "https"),
        ("127.0.0.1:9100/healthz", "http://"),
        ("http://", "host"),
        ("http://:9100/healthz", "host"),
        ("http://127.0.0.1:0/healthz", "port"),
        ("http://127.0.0.1:65536/healthz", "port"),
        ("http://127.0.0.1:x/healthz", "port"),
        ("http://::1/healthz", "brackets"),
        ("http://[::1/healthz", "]"),
        ("http://user:pw@127.0.0.1:9100/healthz", "user info"),
        ("http://127.0.0.1:9100/a b", "ASCII"),
    ] {
        let err = assert_bad_arguments(&["--probe", url], &[]);
        assert!(err.contains("--probe") && err.contains(why), "{url}: {err:?}");
        assert!(!err.contains("pw@"), "{url}: {err:?}");
    }
    assert_bad_arguments(&["--probe"], &[]);
}

#[test]
fn probe_with_any_other_argument_exits_2_and_starts_nothing() {
    let (up, url) = health(response("200 OK", &[], b"ok"));
    let t = tf();
    for args in [
        vec!["--probe", url.as_str(), "--upstream", UP, "--agent", "a", "--token-file", &t],
        vec!["--upstream", UP, "--agent", "a", "--token-file", &t, "--probe", url.as_str()],
        vec!["--probe", url.as_str(), "--connect-timeout", "1"],
        vec!["--probe", url.as_str(), "--probe", url.as_str()],
    ] {
        let err = assert_bad_arguments(&args, &[]);
        assert!(err.contains("--probe") && err.contains("no other argument"), "{args:?}: {err:?}");
    }
    assert_eq!(up.request_count(), 0, "a refused probe still probed");
    // --help still wins, as everywhere.
    let out = run(&["--probe", &url, "--help"], &[]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("--probe URL"));
}

//! https:// upstreams against stand-in TLS servers (tests/support/tls_upstream.py, Python's ssl) with
//! certificates made by the openssl command at test time (tests/support/make_tls_certs.sh): the success
//! path (JSON, an event stream record by record, keep-alive without a second handshake, the legacy
//! endpoint rewritten), and every failure answered as an unreachable upstream within its bound.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime};

use crate::support::exchange::{client, host, json_post};
use crate::support::proxy_process::{scratch_dir, ProxyProcess};
use crate::support::setup::{AGENT, TOKEN};
use crate::support::wire::{request, Resp};

/// The test certificates, made once per test process (openssl must be there: this never skips).
pub(crate) fn certs() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = scratch_dir("tls-certs");
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/make_tls_certs.sh");
        let out = Command::new("bash").arg(script).arg(&dir).output().expect("run bash");
        assert!(
            out.status.success(),
            "make_tls_certs.sh failed (is the openssl command installed?): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        dir
    })
}

pub(crate) fn cert(name: &str) -> String {
    certs().join(name).display().to_string()
}

/// A stand-in TLS upstream (killed on drop).
struct Upstream {
    child: Child,
    port: u16,
}

impl Upstream {
    #[track_caller]
    fn start(mode: &str, args: &[&str]) -> Upstream {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/tls_upstream.py");
        let mut child = Command::new("python3")
            .arg(script)
            .arg(mode)
            .arg(certs())
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn python3 (needed by the TLS tests)");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let port = line.trim().strip_prefix("port ").and_then(|p| p.parse().ok()).expect("port line");
        Upstream { child, port }
    }

    fn url(&self, host: &str) -> String {
        format!("https://{host}:{}/mcp", self.port)
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn proxy(url: &str, extra: &[&str]) -> ProxyProcess {
    ProxyProcess::builder(url).agent(AGENT).token(TOKEN).args(extra).start()
}

fn call(id: u32, method: &str) -> Vec<u8> {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{{}}}}"#).into_bytes()
}

fn post(p: &ProxyProcess, extra: &[(&str, &str)], id: u32, method: &str) -> Resp {
    let mut c = client(p);
    c.send(&json_post(&host(p), extra, &call(id, method)));
    c.read_response("POST")
}

#[track_caller]
fn json(resp: &Resp) -> serde_json::Value {
    serde_json::from_slice(&resp.body).unwrap_or_else(|e| panic!("{e}: {}", resp.raw_text()))
}

/// The upstream's counters, read through the proxy.
fn stats(p: &ProxyProcess) -> serde_json::Value {
    let mut c = client(p);
    c.send(&request("GET", "/stats", &host(p), &[], b""));
    let r = c.read_response("GET");
    assert_eq!(r.status, 200, "{}", r.raw_text());
    json(&r)
}

/// A TLS failure: the unreachable answer (502) with the request's id, one warn line naming the host and
/// `reason`, within `bound`; the metric counts it.
#[track_caller]
fn assert_tls_failure(p: &ProxyProcess, id: u32, reason: &str, bound: Duration) {
    let t0 = Instant::now();
    let r = post(p, &[], id, "tools/call");
    let took = t0.elapsed();
    assert_eq!(r.status, 502, "{}", r.raw_text());
    let v = json(&r);
    assert_eq!(v["id"], id, "{v}");
    assert_eq!(v["error"]["code"], -32000, "{v}");
    assert!(took < bound, "answered after {took:?}, over {bound:?}");
    let line = p.stderr_once("TLS with upstream");
    let warn = line.lines().find(|l| l.contains("TLS with upstream")).unwrap_or_default().to_string();
    let named = warn.to_ascii_lowercase().contains(&reason.to_ascii_lowercase());
    assert!(warn.contains("WARN") && named, "no warn line naming {reason:?}: {line}");
    assert!(warn.contains("localhost") || warn.contains("127.0.0.1"), "the warn line names no host: {warn}");
}

#[test]
fn json_answers_and_keep_alive_reuse_one_handshake() {
    let up = Upstream::start("tls", &[]);
    let p = proxy(&up.url("localhost"), &["--ca-file", &cert("root.pem")]);
    // On one client connection, then on a new one each time (the pool).
    let mut c = client(&p);
    for id in 1..=3 {
        c.send(&json_post(&host(&p), &[], &call(id, "tools/list")));
        let r = c.read_response("POST");
        assert_eq!(r.status, 200, "{}", r.raw_text());
        assert_eq!(json(&r)["id"], id);
    }
    drop(c);
    for id in 4..=6 {
        let r = post(&p, &[], id, "ping");
        assert_eq!((r.status, json(&r)["id"].as_u64()), (200, Some(u64::from(id))), "{}", r.raw_text());
    }
    let s = stats(&p);
    assert_eq!(
        s["handshakes"], 1,
        "a kept-alive or pooled TLS connection is reused without a handshake: {s}"
    );
    assert_eq!(s["connections"], 1, "{s}");
    assert_eq!(s["requests"], 7, "{s}");
    // The credentials went in over TLS.
    assert!(s["agents"].as_array().unwrap().iter().all(|a| a == TOKEN), "{s}");
}

#[test]
fn an_event_stream_reaches_the_client_event_by_event() {
    let up = Upstream::start("tls", &[]);
    let p = proxy(&up.url("localhost"), &["--ca-file", &cert("root.pem")]);
    let mut c = client(&p);
    c.send(&json_post(&host(&p), &[], &call(1, "stream")));
    let mut arrivals = Vec::new();
    for i in 0..5 {
        let (seen, got) = c.read_until(format!("data: {i} ").as_bytes(), Duration::from_secs(5));
        assert!(seen.is_some(), "event {i} did not come: {}", String::from_utf8_lossy(&got));
        arrivals.push(SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs_f64());
    }
    let (_, all) = c.read_until(b"\r\n0\r\n\r\n", Duration::from_secs(5));
    let text = String::from_utf8_lossy(&all).into_owned();
    let sent: Vec<f64> = (0..5)
        .map(|i| {
            let at = text.find(&format!("data: {i} ")).unwrap() + format!("data: {i} ").len();
            text[at..].split_whitespace().next().unwrap().parse().unwrap()
        })
        .collect();
    for i in 0..4 {
        assert!(
            arrivals[i] < sent[i + 1],
            "event {i} reached the client at {} after event {} was sent at {}: buffered",
            arrivals[i],
            i + 1,
            sent[i + 1]
        );
    }
}

#[test]
fn a_legacy_endpoint_naming_the_https_upstream_is_rewritten_to_the_proxy() {
    let up = Upstream::start("tls", &[]);
    let p = proxy(&format!("https://localhost:{}/sse", up.port), &["--ca-file", &cert("root.pem")]);
    let mut c = client(&p);
    c.send(&request("GET", "/sse", &host(&p), &[("Accept", "text/event-stream")], b""));
    let (seen, got) = c.read_until(b"session_id=x", Duration::from_secs(5));
    let text = String::from_utf8_lossy(&got);
    assert!(seen.is_some(), "{text}");
    assert!(text.contains(&format!("data: http://{}/messages/?session_id=x", host(&p))), "{text}");
    assert!(!text.contains("https://"), "{text}");
}

#[test]
fn certificate_failures_are_the_unreachable_answer() {
    for (certificate, url_host, reason) in [
        ("unknown", "localhost", "UnknownIssuer"),
        ("other-name", "localhost", "not valid for name"),
        ("expired", "localhost", "certificate expired"),
        // An IP upstream is checked against the IP SANs.
        ("dns-only", "127.0.0.1", "not valid for name"),
    ] {
        let up = Upstream::start("tls", &[certificate]);
        let audit = scratch_dir("tls-audit").join("audit.log");
        let audit_arg = audit.display().to_string();
        let args =
            ["--ca-file", &cert("root.pem"), "--metrics-listen", "127.0.0.1:0", "--audit-log", &audit_arg];
        let p = proxy(&up.url(url_host), &args);
        assert_tls_failure(&p, 41, reason, Duration::from_secs(3));
        let (_, metrics) = p.metrics_get("/metrics");
        assert!(
            metrics.contains("mcp_proxy_upstream_failures_total{kind=\"tls\"} 1"),
            "{certificate}: {metrics}"
        );
        let t0 = Instant::now();
        let mut record = String::new();
        while t0.elapsed() < Duration::from_secs(3) && !record.contains("tools/call") {
            std::thread::sleep(Duration::from_millis(20));
            record = std::fs::read_to_string(&audit).unwrap_or_default();
        }
        assert!(record.contains(r#""error.type":"tls""#), "{certificate}: {record}");
    }
}

#[test]
fn an_ip_upstream_with_an_ip_san_and_a_chain_through_an_intermediate_pass() {
    for certificate in ["localhost", "chain"] {
        let up = Upstream::start("tls", &[certificate]);
        for url_host in ["127.0.0.1", "localhost"] {
            let p = proxy(&up.url(url_host), &["--ca-file", &cert("root.pem")]);
            let r = post(&p, &[], 5, "ping");
            assert_eq!(r.status, 200, "{certificate} at {url_host}: {}", r.raw_text());
            assert_eq!(json(&r)["id"], 5);
        }
    }
    // Without --ca-file the built-in roots do not know the test CA.
    let up = Upstream::start("tls", &[]);
    let p = proxy(&up.url("localhost"), &[]);
    assert_tls_failure(&p, 6, "UnknownIssuer", Duration::from_secs(3));
    // SSL_CERT_FILE is trusted as --ca-file is.
    let p = ProxyProcess::builder(up.url("localhost"))
        .agent(AGENT)
        .token(TOKEN)
        .env("SSL_CERT_FILE", cert("root.pem"))
        .start();
    assert_eq!(post(&p, &[], 7, "ping").status, 200);
}

#[test]
fn no_protocol_version_in_common_is_a_tls_failure() {
    let up = Upstream::start("tls", &["localhost", "--tls1.1"]);
    let p = proxy(&up.url("localhost"), &["--ca-file", &cert("root.pem")]);
    assert_tls_failure(&p, 12, "ProtocolVersion", Duration::from_secs(3));
}

#[test]
fn a_plain_http_server_and_a_cut_record_are_tls_failures() {
    for (mode, reason) in
        [("plain", "corrupt message"), ("cut", "closed the connection during the handshake")]
    {
        let up = Upstream::start(mode, &[]);
        let p = proxy(&up.url("localhost"), &["--ca-file", &cert("root.pem")]);
        assert_tls_failure(&p, 8, reason, Duration::from_secs(3));
    }
}

#[test]
fn a_stalled_handshake_is_bounded_and_does_not_delay_others() {
    let up = Upstream::start("stall", &[]);
    let p = proxy(
        &up.url("localhost"),
        &["--ca-file", &cert("root.pem"), "--connect-timeout", "1.5", "--metrics-listen", "127.0.0.1:0"],
    );
    let stalled = {
        let mut c = client(&p);
        c.send(&json_post(&host(&p), &[], &call(9, "tools/call")));
        c
    };
    // Meanwhile the loop answers others: the metrics listener, and a request refused at once.
    std::thread::sleep(Duration::from_millis(200));
    let t0 = Instant::now();
    let (status, _) = p.metrics_get("/healthz");
    assert!(status == 200 || status == 503, "{status}");
    let mut other = client(&p);
    other.send(b"POST /mcp HTTP/1.1\r\nHost: evil.example\r\nContent-Length: 2\r\n\r\n{}");
    assert_eq!(other.read_response("POST").status, 403);
    assert!(t0.elapsed() < Duration::from_millis(500), "others waited {:?}", t0.elapsed());
    let mut stalled = stalled;
    let t0 = Instant::now();
    let r = stalled.read_response("POST");
    assert_eq!(r.status, 502, "{}", r.raw_text());
    assert_eq!(json(&r)["id"], 9);
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    assert!(p.stderr_once("TLS with upstream").contains("did not complete within --connect-timeout"));
}

#[test]
fn mutual_tls_with_and_without_the_client_certificate() {
    let up = Upstream::start("tls", &["localhost", "--client-ca"]);
    // TLS 1.3: the server refuses the missing certificate after the client's handshake is done; the alert
    // comes on the first read, and is the same failure.
    let p = proxy(&up.url("localhost"), &["--ca-file", &cert("root.pem")]);
    assert_tls_failure(&p, 10, "alert", Duration::from_secs(3));
    let p = proxy(
        &up.url("localhost"),
        &[
            "--ca-file",
            &cert("root.pem"),
            "--tls-client-cert",
            &cert("client.pem"),
            "--tls-client-key",
            &cert("client.key"),
        ],
    );
    let r = post(&p, &[], 11, "ping");
    assert_eq!(r.status, 200, "{}", r.raw_text());
    assert!(!p.stderr_text().contains("BEGIN"), "key material in the log");
}

#[test]
fn a_certificate_gone_bad_fails_the_session_s_next_call_then_it_works_again() {
    let flag = scratch_dir("tls-bad").join("bad");
    let up = Upstream::start("tls", &["localhost", "--bad-flag", flag.to_str().unwrap()]);
    let p = proxy(&up.url("localhost"), &["--ca-file", &cert("root.pem"), "--restart-grace", "1"]);
    let init = post(&p, &[], 1, "initialize");
    assert_eq!(init.status, 200, "{}", init.raw_text());
    let sid = init.one("mcp-session-id").to_string();
    let in_session = [("Mcp-Session-Id", sid.as_str())];
    assert_eq!(post(&p, &in_session, 2, "tools/list").status, 200);
    std::fs::write(&flag, b"").unwrap();
    // The server closes its idle connections; new ones get the expired certificate.
    std::thread::sleep(Duration::from_millis(400));
    let r = post(&p, &in_session, 3, "tools/call");
    // In a recorded session: the outage answer, 200 with the call's id and an error.
    assert_eq!(r.status, 200, "{}", r.raw_text());
    let v = json(&r);
    assert_eq!((v["id"].as_u64(), v["error"]["code"].as_i64()), (Some(3), Some(-32000)), "{v}");
    assert!(p.stderr_once("TLS with upstream").contains("certificate expired"), "{}", p.stderr_text());
    std::fs::remove_file(&flag).unwrap();
    let r = post(&p, &in_session, 4, "tools/call");
    assert_eq!(r.status, 200, "{}", r.raw_text());
    assert_eq!(json(&r)["result"]["method"], "tools/call");
}

/// Debian's nginx terminating TLS (`localhost.pem`, by the test CA) in front of loopback HTTP ports, one TLS
/// port for each; killed on drop. nginx is required: a missing one fails the test (`.ci/run` installs it).
pub(crate) struct Nginx {
    child: Child,
    /// The TLS port in front of each upstream port, in order.
    pub(crate) ports: Vec<u16>,
}

impl Nginx {
    #[track_caller]
    pub(crate) fn start(upstreams: &[u16]) -> Nginx {
        Nginx::start_as("localhost", "$http_host", upstreams)
    }

    /// `start` with the certificate `NAME.pem` (`certs`) and the `Host` sent on to each upstream (an nginx
    /// expression: `$http_host` is the client's).
    #[track_caller]
    pub(crate) fn start_as(name: &str, host: &str, upstreams: &[u16]) -> Nginx {
        let bin = ["/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/bin/nginx"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .expect("nginx is not installed (apt-get install -y nginx; .ci/run does)");
        let dir = scratch_dir("nginx-tls");
        let d = dir.display();
        let ports: Vec<u16> = upstreams
            .iter()
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port())
            .collect();
        let servers: String = ports
            .iter()
            .zip(upstreams)
            .map(|(port, upstream)| {
                format!(
                    "server {{ listen 127.0.0.1:{port} ssl; ssl_certificate {}; ssl_certificate_key {};\n\
                     location / {{ proxy_pass http://127.0.0.1:{upstream}; proxy_http_version 1.1;\n\
                     proxy_set_header Connection \"\"; proxy_set_header Host {host}; proxy_buffering off;\n\
                     proxy_request_buffering off; proxy_read_timeout 3600s; }} }}\n",
                    cert(&format!("{name}.pem")),
                    cert(&format!("{name}.key")),
                )
            })
            .collect();
        let conf = format!(
            "worker_processes 1;\ndaemon off;\nmaster_process off;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
             events {{ worker_connections 256; }}\nhttp {{ access_log off;\n\
             client_body_temp_path {d}/body; proxy_temp_path {d}/proxy; fastcgi_temp_path {d}/fastcgi;\n\
             uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;\n{servers}}}\n"
        );
        std::fs::write(dir.join("nginx.conf"), conf).unwrap();
        let child = Command::new(bin)
            .args(["-p", &d.to_string(), "-c", "nginx.conf", "-e", &format!("{d}/error.log")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn nginx");
        let t0 = Instant::now();
        for port in &ports {
            while std::net::TcpStream::connect(("127.0.0.1", *port)).is_err() {
                let log = std::fs::read_to_string(dir.join("error.log")).unwrap_or_default();
                assert!(t0.elapsed() < Duration::from_secs(10), "nginx did not listen: {log}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Nginx { child, ports }
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

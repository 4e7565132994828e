//! A recorded session's GET stream across an upstream restart: held open to
//! the client (nothing written, no error) while the upstream is away, then
//! reattached on the re-initialised session without a second head, so the
//! notifications the new server sends reach the same client response; past
//! `--restart-grace` plus the restart allowance (10 s) it ends as a cut
//! stream does; a GET outside a recorded session ends at once, as before.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::proxy_process::ProxyProcess;
use crate::support::restarting::RestartingUpstream;
use crate::support::wire::{find, Next};

const TOKEN: &str = "tok-HOLD-1";

/// FastMCP's shape: sessions live in one server generation; a GET stream
/// sends one notification naming its generation at once and then stays
/// open, quiet, until the server dies; a request on an unknown session is
/// 404.
fn upstream() -> RestartingUpstream {
    upstream_with(false)
}

/// `comments_first`: the first generation's GET stream carries only a
/// comment before it dies (agentchattr's: sse-starlette's `: ping`).
fn upstream_with(comments_first: bool) -> RestartingUpstream {
    RestartingUpstream::start(move |req, s, gen| {
        let v: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
        let own = format!("gen{}-sess", gen.number);
        let sid = req.head.all("mcp-session-id").first().map(|s| s.to_string());
        let reply = |s: &mut TcpStream, status: &str, extra: &str, body: &str| {
            let resp = format!(
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\n{extra}Content-Length: {}\r\n\r\n{body}",
                body.len()
            );
            if s.write_all(resp.as_bytes()).is_ok() {
                Next::KeepAlive
            } else {
                Next::Close
            }
        };
        if req.method == "POST" && v["method"] == "initialize" {
            let body = json!({"jsonrpc":"2.0","id":v["id"],"result":{"protocolVersion":"2025-06-18","capabilities":{},"serverInfo":{"name":"stub","version":"1"}}});
            return reply(s, "200 OK", &format!("Mcp-Session-Id: {own}\r\n"), &body.to_string());
        }
        if sid.as_deref() != Some(own.as_str()) {
            let body = r#"{"jsonrpc":"2.0","id":"server-error","error":{"code":-32600,"message":"Session not found"}}"#;
            return reply(s, "404 Not Found", "", body);
        }
        match req.method.as_str() {
            "GET" => {
                let mut event = format!(
                    "event: message\r\ndata: {}\r\n\r\n",
                    json!({"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":{"gen":gen.number}}})
                );
                if comments_first && gen.number == 1 {
                    event = format!(": ping - gen {}\r\n\r\n", gen.number);
                }
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nMcp-Session-Id: {own}\r\n\
                     Transfer-Encoding: chunked\r\n\r\n{:x}\r\n{event}\r\n",
                    event.len()
                );
                if s.write_all(head.as_bytes()).is_err() {
                    return Next::Close;
                }
                // Quiet until the server dies (`stop` shuts the socket).
                while gen.is_alive() {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Next::Close
            }
            _ if v.get("id").is_none() => reply(s, "202 Accepted", "", ""),
            _ => reply(
                s,
                "200 OK",
                "",
                &json!({"jsonrpc":"2.0","id":v["id"],"result":{"gen":gen.number}}).to_string(),
            ),
        }
    })
}

/// One POST on its own connection; the response's session id and body.
fn post(p: &ProxyProcess, session: Option<&str>, body: &Value) -> (Option<String>, String) {
    let mut s = p.connect();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let extra = session.map(|id| format!("Mcp-Session-Id: {id}\r\n")).unwrap_or_default();
    let body = body.to_string();
    let req = format!(
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         {extra}Connection: close\r\nContent-Length: {}\r\n\r\n{body}",
        p.addr(),
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let sid = text
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("mcp-session-id: ").map(|v| v.trim().to_string()));
    (sid, text)
}

fn open_session(p: &ProxyProcess) -> String {
    let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}});
    let (sid, text) = post(p, None, &init);
    let sid = sid.unwrap_or_else(|| panic!("no session id: {text}"));
    let (_, text) = post(p, Some(&sid), &json!({"jsonrpc":"2.0","method":"notifications/initialized"}));
    assert!(text.starts_with("HTTP/1.1 202"), "{text}");
    sid
}

/// A client's GET stream, read as raw bytes.
struct Stream {
    s: TcpStream,
    got: Vec<u8>,
    closed: bool,
}

impl Stream {
    fn open(p: &ProxyProcess, sid: &str) -> Stream {
        let mut s = p.connect();
        s.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
        let req = format!(
            "GET /mcp HTTP/1.1\r\nHost: {}\r\nAccept: text/event-stream\r\nMcp-Session-Id: {sid}\r\nLast-Event-ID: 7\r\n\r\n",
            p.addr()
        );
        s.write_all(req.as_bytes()).unwrap();
        Stream { s, got: Vec::new(), closed: false }
    }

    /// Reads until `needle` has arrived, the stream closed, or `limit`.
    fn read_until(&mut self, needle: &[u8], limit: Duration) -> bool {
        let end = Instant::now() + limit;
        while Instant::now() < end && !self.closed {
            if find(&self.got, needle).is_some() {
                return true;
            }
            self.read_some();
        }
        find(&self.got, needle).is_some()
    }

    fn read_some(&mut self) {
        let mut buf = [0u8; 4096];
        match self.s.read(&mut buf) {
            Ok(0) => self.closed = true,
            Ok(n) => self.got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => self.closed = true,
        }
    }

    /// Reads for `d`; returns how many bytes arrived.
    fn quiet_for(&mut self, d: Duration) -> usize {
        let before = self.got.len();
        let end = Instant::now() + d;
        while Instant::now() < end && !self.closed {
            self.read_some();
        }
        self.got.len() - before
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.got).into_owned()
    }
}

fn count(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).filter(|w| *w == needle).count()
}

#[test]
fn a_session_get_stream_is_held_through_a_restart_and_reattached_on_the_new_session() {
    let mut up = upstream();
    let p = ProxyProcess::builder(up.url())
        .agent("a")
        .token(TOKEN)
        .arg("--restart-grace", "5")
        .env("RUST_LOG", "info")
        .start();
    let sid = open_session(&p);
    assert_eq!(sid, "gen1-sess");
    let mut stream = Stream::open(&p, &sid);
    assert!(stream.read_until(br#""gen":1"#, Duration::from_secs(5)), "first event: {}", stream.text());

    up.stop();
    // Held: nothing written, no error, not closed, while the server is down.
    assert_eq!(stream.quiet_for(Duration::from_millis(1500)), 0, "{}", stream.text());
    assert!(!stream.closed, "the stream was ended while the upstream was down");
    up.restart();

    assert!(
        stream.read_until(br#""gen":2"#, Duration::from_secs(10)),
        "no event from the restarted server reached the held stream: {}\n--- proxy log:\n{}",
        stream.text(),
        p.stderr_text()
    );
    assert!(!stream.closed);
    let got = &stream.got;
    assert_eq!(count(got, b"HTTP/1.1 "), 1, "one head only: {}", stream.text());
    assert_eq!(count(&got.to_ascii_lowercase(), b"mcp-session-id: gen1-sess"), 1, "{}", stream.text());
    assert!(find(got, b"gen2-sess").is_none(), "the new upstream id leaked: {}", stream.text());
    assert!(find(got, b"\r\n0\r\n\r\n").is_none(), "the body was ended: {}", stream.text());
    // The events are whole chunks of one chunked body.
    let body_start = find(got, b"\r\n\r\n").unwrap() + 4;
    let body = &got[body_start..];
    let mut at = 0;
    let mut events = 0;
    while at < body.len() {
        let line_end = find(&body[at..], b"\r\n").expect("a whole chunk-size line") + at;
        let size = usize::from_str_radix(std::str::from_utf8(&body[at..line_end]).unwrap(), 16).unwrap();
        assert!(size > 0, "a last chunk: {}", stream.text());
        let data = &body[line_end + 2..line_end + 2 + size];
        assert!(data.starts_with(b"event: message\r\n") && data.ends_with(b"\r\n\r\n"));
        at = line_end + 2 + size + 2;
        events += 1;
    }
    assert_eq!(events, 2);

    // The session goes on for calls too, under the client's id.
    let call = json!({"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"x","arguments":{}}});
    let (_, text) = post(&p, Some(&sid), &call);
    assert!(text.starts_with("HTTP/1.1 200") && text.contains(r#""gen":2"#), "{text}");
    let log = p.stderr_text();
    assert!(log.contains("held open"), "{log}");
    assert!(log.contains("reattached after"), "{log}");
    assert!(
        log.contains("MCP session re-initialised"),
        "the GET sent again re-initialised the session: {log}"
    );
}

#[test]
fn a_held_stream_ends_as_a_cut_one_once_the_hold_is_over() {
    let mut up = upstream();
    let p = ProxyProcess::builder(up.url())
        .agent("a")
        .token(TOKEN)
        .arg("--restart-grace", "0.5")
        .env("RUST_LOG", "info")
        .start();
    let sid = open_session(&p);
    let mut stream = Stream::open(&p, &sid);
    assert!(stream.read_until(br#""gen":1"#, Duration::from_secs(5)), "{}", stream.text());
    let lost = Instant::now();
    up.stop();
    assert_eq!(stream.quiet_for(Duration::from_secs(2)), 0);
    assert!(!stream.closed, "ended before --restart-grace plus the allowance");
    // 0.5 s of grace plus the 10 s allowance; a gross bound past it.
    stream.read_until(b"never", Duration::from_secs(20));
    assert!(stream.closed, "the held stream was never ended");
    let held = lost.elapsed();
    assert!(held >= Duration::from_secs(10) && held < Duration::from_secs(20), "held {held:?}");
    assert!(
        find(&stream.got, b"\r\n0\r\n\r\n").is_none(),
        "a cut stream has no last chunk: {}",
        stream.text()
    );
    // The log reaches the pipe a moment after the socket closes.
    let t0 = Instant::now();
    while !p.stderr_text().contains("not reattached") && t0.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(p.stderr_text().contains("not reattached"), "{}", p.stderr_text());
}

#[test]
fn a_get_stream_outside_a_recorded_session_ends_at_once_when_cut() {
    let mut up = upstream();
    let p = ProxyProcess::builder(up.url())
        .agent("a")
        .token(TOKEN)
        .arg("--restart-grace", "5")
        .env("RUST_LOG", "info")
        .start();
    // A session the proxy did not see created (the client brought its id).
    let (sid, _) = post(
        &p,
        None,
        &json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}),
    );
    assert_eq!(sid.as_deref(), Some("gen1-sess"));
    let mut s = p.connect();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // Delete it: the proxy forgets it, the stub keeps serving the id.
    let del = format!(
        "DELETE /mcp HTTP/1.1\r\nHost: {}\r\nMcp-Session-Id: gen1-sess\r\nConnection: close\r\n\r\n",
        p.addr()
    );
    s.write_all(del.as_bytes()).unwrap();
    let mut sink = Vec::new();
    let _ = s.read_to_end(&mut sink);
    let mut stream = Stream::open(&p, "gen1-sess");
    assert!(stream.read_until(br#""gen":1"#, Duration::from_secs(5)), "{}", stream.text());
    let t0 = Instant::now();
    up.stop();
    stream.read_until(b"never", Duration::from_secs(5));
    assert!(stream.closed, "an untracked stream must end when cut");
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    up.restart();
}

#[test]
fn a_stream_that_carried_only_comments_is_held_and_reattached_too() {
    let mut up = upstream_with(true);
    let p = ProxyProcess::builder(up.url())
        .agent("a")
        .token(TOKEN)
        .arg("--restart-grace", "5")
        .env("RUST_LOG", "info")
        .start();
    let sid = open_session(&p);
    let mut stream = Stream::open(&p, &sid);
    assert!(stream.read_until(b": ping - gen 1", Duration::from_secs(5)), "{}", stream.text());
    up.stop();
    assert_eq!(stream.quiet_for(Duration::from_millis(800)), 0, "{}", stream.text());
    assert!(!stream.closed, "a comment-only stream was ended when its upstream went away");
    up.restart();
    assert!(
        stream.read_until(br#""gen":2"#, Duration::from_secs(10)),
        "{}\n--- proxy log:\n{}",
        stream.text(),
        p.stderr_text()
    );
    assert_eq!(count(&stream.got, b"HTTP/1.1 "), 1, "{}", stream.text());
}

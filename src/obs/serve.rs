//! The metrics listener's side of an exchange, without its sockets: one
//! `Client` per connection takes the bytes read, reads the head with
//! `http::head` (the MCP listener's parser), applies the loopback, Host and
//! client-token rules, and holds the answer owed (`GET /metrics`,
//! `GET /healthz`, or a refusal) until it is written. A `/healthz` whose
//! knowledge is stale waits for the loop's probe connect. Pure: the event
//! loop reads and writes the sockets and keeps the time.

use super::metrics::Gauges;
use super::Observer;
use crate::http::guard::{bearer_matches, host_allowed};
use crate::http::head::{parse_request, ParseError};
use crate::http::headers::name;
use crate::http::write;
use crate::limits::{MAX_METRICS_HEAD, METRICS_REQUEST_TIMEOUT};
use std::io::Write;
use std::time::{Duration, Instant};

/// What the listener needs from the loop to answer.
pub struct View<'a> {
    /// The listener's own port (the Host check).
    pub port: u16,
    /// `--client-token`: required off loopback.
    pub client_token: Option<&'a str>,
    pub restart_grace: Duration,
    pub agent: &'a str,
    /// Whether the credential source's token is valid (`None`: a static
    /// token, which does not expire).
    pub token_valid: Option<bool>,
    pub gauges: Gauges,
    pub now: Instant,
}

/// One client of the metrics listener: its request head as read so far,
/// then the answer it is owed.
#[derive(Debug)]
pub struct Client {
    loopback: bool,
    head: Vec<u8>,
    out: Vec<u8>,
    written: usize,
    /// The request must be whole by then; the answer written one
    /// `METRICS_REQUEST_TIMEOUT` later.
    deadline: Instant,
    /// A `/healthz` waiting for the probe connect.
    awaits_probe: bool,
}

impl Client {
    pub fn new(loopback: bool, now: Instant) -> Client {
        Client {
            loopback,
            head: Vec::new(),
            out: Vec::new(),
            written: 0,
            deadline: now + METRICS_REQUEST_TIMEOUT,
            awaits_probe: false,
        }
    }

    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The request is still being read: nothing is owed yet.
    pub fn reading(&self) -> bool {
        self.out.is_empty() && !self.awaits_probe
    }

    /// Whether to read more: not past the head's bound.
    pub fn wants_bytes(&self) -> bool {
        self.reading() && self.head.len() <= MAX_METRICS_HEAD
    }

    pub fn received(&mut self, bytes: &[u8]) {
        self.head.extend_from_slice(bytes);
    }

    pub fn awaits_probe(&self) -> bool {
        self.awaits_probe
    }

    /// After a read: the answer, if the bytes so far decide it. `ended`:
    /// the client will send no more (it closed its side, or its socket
    /// failed). A stale `/healthz` starts waiting for the probe instead.
    pub fn decide(&mut self, ended: bool, obs: &Observer, view: &View) {
        if !self.reading() {
            return;
        }
        match route(&self.head, self.loopback, view.port, view.client_token) {
            Route::Incomplete if self.head.len() > MAX_METRICS_HEAD => {
                self.out = response(431, "text/plain", b"head too large\n")
            }
            Route::Incomplete if ended || view.now >= self.deadline => self.out = timed_out(),
            Route::Incomplete => {}
            Route::Answer(status, body) => self.out = response(status, "text/plain", body.as_bytes()),
            Route::Metrics => {
                let mut text = String::new();
                obs.metrics.render(view.gauges, &mut text);
                self.out = response(200, "text/plain; version=0.0.4; charset=utf-8", text.as_bytes());
            }
            Route::Health if obs.health.stale(view.now) => self.awaits_probe = true,
            Route::Health => self.out = health(obs, view),
        }
    }

    /// The probe has settled the upstream's health: a waiting `/healthz`
    /// gets its answer.
    pub fn probe_settled(&mut self, obs: &Observer, view: &View) {
        if std::mem::take(&mut self.awaits_probe) {
            self.out = health(obs, view);
        }
    }

    /// The deadline passed with nothing owed: the request did not come in
    /// time. Returns whether the time to write the answer is over too (the
    /// connection closes at once).
    pub fn expire(&mut self, now: Instant) -> bool {
        if self.reading() {
            self.out = timed_out();
        }
        now >= self.deadline + METRICS_REQUEST_TIMEOUT
    }

    /// The part of the answer not yet written.
    pub fn unwritten(&self) -> &[u8] {
        self.out.get(self.written..).unwrap_or_default()
    }

    pub fn wrote(&mut self, n: usize) {
        self.written = (self.written + n).min(self.out.len());
    }

    /// Whether the connection is done: its answer written whole, or the
    /// time to write it over.
    pub fn finished(&self, now: Instant) -> bool {
        (!self.out.is_empty() && self.written >= self.out.len())
            || now >= self.deadline + METRICS_REQUEST_TIMEOUT
    }
}

fn timed_out() -> Vec<u8> {
    response(408, "text/plain", b"request not received in time\n")
}

#[derive(Debug, PartialEq, Eq)]
enum Route {
    Incomplete,
    Metrics,
    Health,
    Answer(u16, &'static str),
}

/// What a request head asks for.
fn route(head: &[u8], loopback: bool, port: u16, client_token: Option<&str>) -> Route {
    let req = match parse_request(head) {
        Ok(Some(h)) => h,
        Ok(None) => return Route::Incomplete,
        Err(e) => return Route::Answer(e.client_status(), refusal_body(e)),
    };
    // The parser takes every request-target form; a route is a path.
    if !req.target.starts_with(b"/") {
        return Route::Answer(400, "bad request\n");
    }
    // On loopback, a Host that is not loopback is a browser page rebound to
    // it (as on the MCP listener); off loopback, the client token is required.
    if loopback && !req.headers.get_name(name::HOST).is_some_and(|h| host_allowed(h, port)) {
        return Route::Answer(403, "Host not allowed\n");
    }
    if let (false, Some(secret)) = (loopback, client_token) {
        let authorization = req.headers.get_name(name::AUTHORIZATION);
        if !authorization.is_some_and(|v| bearer_matches(v, secret.as_bytes())) {
            return Route::Answer(401, "client token required\n");
        }
    }
    let path = req.target.split(|&b| b == b'?').next().unwrap_or_default();
    match (req.method.as_slice(), path) {
        (b"GET", b"/metrics") => Route::Metrics,
        (b"GET", b"/healthz") => Route::Health,
        (_, b"/metrics" | b"/healthz") => Route::Answer(405, "only GET\n"),
        _ => Route::Answer(404, "only /metrics and /healthz here\n"),
    }
}

/// The body of the answer to a head `http::head` refused (its status is
/// `client_status`, as on the MCP listener); it names nothing the client sent.
fn refusal_body(e: ParseError) -> &'static str {
    match e {
        ParseError::TooLarge => "head too large\n",
        ParseError::TooManyFields => "too many header fields\n",
        _ if e.client_status() == 501 => "transfer coding not implemented\n",
        _ => "bad request\n",
    }
}

/// A whole answer: the head (the one reason-phrase table), then `body`;
/// the connection closes after it.
fn response(status: u16, content_type: &str, body: &[u8]) -> Vec<u8> {
    let mut out = b"HTTP/1.1 ".to_vec();
    write::push_decimal(&mut out, u64::from(status));
    out.push(b' ');
    out.extend_from_slice(write::reason_phrase(status));
    out.extend_from_slice(b"\r\nContent-Type: ");
    out.extend_from_slice(content_type.as_bytes());
    out.extend_from_slice(b"\r\nContent-Length: ");
    write::push_decimal(&mut out, body.len() as u64);
    out.extend_from_slice(b"\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n");
    out.extend_from_slice(body);
    out
}

/// `/healthz`: 200 while the upstream answers, 503 once it has been
/// unreachable for longer than the restart grace, or while no valid token
/// is held (`View::token_valid`).
fn health(obs: &Observer, view: &View) -> Vec<u8> {
    let mut r = obs.health.report(view.now, view.restart_grace);
    r.healthy &= view.token_valid != Some(false);
    let mut body = Vec::new();
    body.extend_from_slice(b"{\"status\":");
    body.extend_from_slice(if r.healthy { b"\"ok\"" } else { b"\"unavailable\"" });
    body.extend_from_slice(b",\"agent\":");
    crate::mcp::json::write_json_string(view.agent, &mut body);
    body.extend_from_slice(b",\"upstream_reachable\":");
    body.extend_from_slice(match r.reachable {
        Some(true) => b"true",
        Some(false) => b"false",
        None => b"null",
    });
    match view.token_valid {
        Some(true) => body.extend_from_slice(b",\"token_valid\":true"),
        Some(false) => body.extend_from_slice(b",\"token_valid\":false"),
        None => {}
    }
    let _ = write!(body, ",\"sessions\":{}", view.gauges.sessions);
    body.extend_from_slice(b",\"seconds_since_last_answer\":");
    match r.since_answer {
        Some(d) => {
            let _ = write!(body, "{:.3}", d.as_secs_f64());
        }
        None => body.extend_from_slice(b"null"),
    }
    body.extend_from_slice(b"}\n");
    response(if r.healthy { 200 } else { 503 }, "application/json", &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_its_head_then_its_body() {
        let got = response(405, "text/plain", b"only GET\n");
        let want = "HTTP/1.1 405 Method Not Allowed\r\nContent-Type: text/plain\r\nContent-Length: 9\r\n\
                    Cache-Control: no-store\r\nConnection: close\r\n\r\nonly GET\n";
        assert_eq!(String::from_utf8_lossy(&got), want);
    }

    fn routed(head: &str, loopback: bool, client_token: Option<&str>) -> String {
        match route(head.as_bytes(), loopback, 9464, client_token) {
            Route::Incomplete => "incomplete".into(),
            Route::Metrics => "metrics".into(),
            Route::Health => "health".into(),
            Route::Answer(status, _) => status.to_string(),
        }
    }

    #[test]
    fn routes_by_method_path_host_and_client_token() {
        let (open, guarded) = (None, Some("s3cret"));
        let get = |path: &str, host: &str, extra: &str| {
            format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}\r\n")
        };
        let cases = [
            (get("/metrics", "127.0.0.1:9464", ""), true, open, "metrics"),
            (get("/healthz?x", "localhost:9464", ""), true, open, "health"),
            (get("/metrics", "evil.example", ""), true, open, "403"),
            (get("/metrics", "127.0.0.1:9465", ""), true, open, "403"),
            (get("/mcp", "127.0.0.1:9464", ""), true, open, "404"),
            (get("/metrics", "127.0.0.1:9464", "").replacen("GET", "POST", 1), true, open, "405"),
            // Off loopback: the client token, whatever the Host.
            (get("/metrics", "192.0.2.2:9464", ""), false, guarded, "401"),
            (get("/metrics", "192.0.2.2:9464", "Authorization: Bearer nope\r\n"), false, guarded, "401"),
            (
                get("/metrics", "192.0.2.2:9464", "authorization: Bearer s3cret\r\n"),
                false,
                guarded,
                "metrics",
            ),
            ("GET /metrics HTTP/1.1\r\nHost: x\r\n".to_string(), true, open, "incomplete"),
            ("GET /metrics HTTP/2\r\n\r\n".to_string(), true, open, "400"),
            ("GET metrics HTTP/1.1\r\n\r\n".to_string(), true, open, "400"),
            ("GET /metrics HTTP/1.1\r\nno colon\r\n\r\n".to_string(), true, open, "400"),
        ];
        for (head, loopback, token, want) in cases {
            assert_eq!(routed(&head, loopback, token), want, "{head:?} loopback {loopback}");
        }
    }

    /// What the project's head parser refuses, the metrics listener
    /// refuses too, with the MCP listener's status.
    #[test]
    fn heads_the_parser_refuses_are_refused() {
        let many: String = (0..crate::limits::MAX_FIELDS).map(|i| format!("X-{i}: v\r\n")).collect();
        let cases = [
            // The request line.
            ("GET /metrics\r\nHost: 127.0.0.1:9464\r\n\r\n", "400"),
            ("G(T /metrics HTTP/1.1\r\nHost: 127.0.0.1:9464\r\n\r\n", "400"),
            ("GET  /metrics HTTP/1.1\r\nHost: 127.0.0.1:9464\r\n\r\n", "400"),
            ("GET /met rics HTTP/1.1\r\nHost: 127.0.0.1:9464\r\n\r\n", "400"),
            ("GET /metrics HTTP/1.2\r\nHost: 127.0.0.1:9464\r\n\r\n", "400"),
            // A target that is not a path.
            ("GET http://127.0.0.1:9464/metrics HTTP/1.1\r\nHost: 127.0.0.1:9464\r\n\r\n", "400"),
            ("OPTIONS * HTTP/1.1\r\nHost: 127.0.0.1:9464\r\n\r\n", "400"),
            // Field lines.
            ("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:9464\r\nX-A: b\r\n c\r\n\r\n", "400"),
            ("GET /metrics HTTP/1.1\r\nHost : 127.0.0.1:9464\r\n\r\n", "400"),
            ("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:9464\r\nAuthorization: a\r\nAuthorization: b\r\n\r\n", "400"),
            // Host (RFC 9112 §3.2: 400 for none in HTTP/1.1, or several).
            ("GET /metrics HTTP/1.1\r\n\r\n", "400"),
            ("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:9464\r\nHost: 127.0.0.1:9464\r\n\r\n", "400"),
            ("GET /metrics HTTP/1.1\r\nHost: evil.example\r\nHost: 127.0.0.1:9464\r\n\r\n", "400"),
            // HTTP/1.0 may leave Host out; loopback still wants its own.
            ("GET /metrics HTTP/1.0\r\n\r\n", "403"),
            // Framing the parser cannot use.
            ("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:9464\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", "400"),
            ("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:9464\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", "501"),
        ];
        for (head, want) in cases {
            assert_eq!(routed(head, true, None), want, "{head:?}");
        }
        let too_many = format!("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:9464\r\n{many}\r\n");
        assert_eq!(
            route(too_many.as_bytes(), true, 9464, None),
            Route::Answer(431, "too many header fields\n")
        );
        // Line ends of a lone LF are read as the MCP listener reads them.
        assert_eq!(routed("GET /metrics HTTP/1.1\nHost: 127.0.0.1:9464\n\n", true, None), "metrics");
        // Off loopback with the token, HTTP/1.0 without Host is answered.
        let ten = "GET /healthz HTTP/1.0\r\nAuthorization: Bearer s3cret\r\n\r\n";
        assert_eq!(routed(ten, false, Some("s3cret")), "health");
    }

    fn view(now: Instant) -> View<'static> {
        View {
            port: 9464,
            client_token: None,
            restart_grace: Duration::from_secs(1),
            agent: "a\"gent",
            token_valid: None,
            gauges: Gauges::default(),
            now,
        }
    }

    fn status_line(c: &Client) -> String {
        let text = String::from_utf8_lossy(c.unwritten()).into_owned();
        text.lines().next().unwrap_or_default().to_string()
    }

    #[test]
    fn a_head_is_answered_once_whole_and_the_connection_ends_once_written() {
        let now = Instant::now();
        let obs = Observer::default();
        let mut c = Client::new(true, now);
        let head = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:9464\r\n\r\n";
        let (first, rest) = head.split_at(20);
        c.received(first);
        c.decide(false, &obs, &view(now));
        assert!(c.reading() && c.unwritten().is_empty() && !c.finished(now));
        c.received(rest);
        c.decide(false, &obs, &view(now));
        assert_eq!(status_line(&c), "HTTP/1.1 200 OK");
        assert!(!c.wants_bytes());
        let len = c.unwritten().len();
        c.wrote(len - 1);
        assert_eq!(c.unwritten(), b"\n".as_slice());
        assert!(!c.finished(now));
        c.wrote(1);
        assert!(c.finished(now) && c.unwritten().is_empty());
    }

    #[test]
    fn an_over_long_head_gets_431_and_nothing_more_is_read() {
        let now = Instant::now();
        let obs = Observer::default();
        let mut c = Client::new(true, now);
        c.received(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:9464\r\nX-Long: ");
        while c.wants_bytes() {
            c.received(&[b'a'; 1000]);
        }
        assert!(c.reading());
        c.decide(false, &obs, &view(now));
        assert_eq!(status_line(&c), "HTTP/1.1 431 Request Header Fields Too Large");
        assert!(String::from_utf8_lossy(c.unwritten()).ends_with("\r\n\r\nhead too large\n"));
    }

    #[test]
    fn a_head_not_whole_in_time_or_before_the_end_gets_408_then_closes() {
        let now = Instant::now();
        let obs = Observer::default();
        let partial = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:9464\r\n";
        // The client ended its side.
        let mut ended = Client::new(true, now);
        ended.received(partial);
        ended.decide(true, &obs, &view(now));
        assert_eq!(status_line(&ended), "HTTP/1.1 408 Request Timeout");
        // The deadline passed, read or not.
        let mut late = Client::new(true, now);
        late.received(partial);
        let due = late.deadline();
        late.decide(false, &obs, &view(due));
        assert_eq!(status_line(&late), "HTTP/1.1 408 Request Timeout");
        let mut silent = Client::new(true, now);
        assert!(!silent.expire(due));
        assert_eq!(status_line(&silent), "HTTP/1.1 408 Request Timeout");
        // One more timeout to write it, then the connection closes.
        let over = due + METRICS_REQUEST_TIMEOUT;
        assert!(!silent.finished(due) && silent.finished(over));
        assert!(silent.expire(over));
    }

    #[test]
    fn a_stale_healthz_waits_for_the_probe_then_answers() {
        let now = Instant::now();
        let mut obs = Observer::default();
        let mut c = Client::new(true, now);
        c.received(b"GET /healthz HTTP/1.1\r\nHost: localhost:9464\r\n\r\n");
        assert!(obs.health.stale(now));
        c.decide(false, &obs, &view(now));
        assert!(c.awaits_probe() && !c.reading() && c.unwritten().is_empty());
        // A deadline while it waits owes no 408: the probe answers it.
        assert!(!c.expire(c.deadline()));
        assert!(c.unwritten().is_empty());
        obs.health.reached(now);
        c.probe_settled(&obs, &view(now));
        assert!(!c.awaits_probe());
        assert_eq!(status_line(&c), "HTTP/1.1 200 OK");
        let text = String::from_utf8_lossy(c.unwritten()).into_owned();
        assert!(text.contains("Content-Type: application/json\r\n"), "{text}");
        assert!(text.contains(r#""status":"ok","agent":"a\"gent","upstream_reachable":true"#), "{text}");
    }
}

//! The clients: callers and GET-stream holders, the outcome of each request counted and checked.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::json;

use super::client_wire::{
    answer_to, is_server_404, messages, plain_outcome, proxy_error, take_events, Chunk, Got, Wire,
};
use super::fake_fastmcp::fnv1a;
use super::state::{Failures, Outages, PanicGuard, Rng};
use super::{CALLERS, DEADLINE, PROTOCOL, STREAMERS};
use crate::support::wire::{request, Head};

/// One phase of client threads (the warm-up, then the soak).
pub(super) struct Run {
    pub(super) port: u16,
    pub(super) stop: AtomicBool,
    pub(super) failures: Arc<Failures>,
    pub(super) outages: Arc<Outages>,
    /// Every session id a client got from an initialize answer, and which.
    pub(super) issued: Arc<Mutex<HashMap<String, String>>>,
    /// (request kind, outcome label) -> how many.
    pub(super) counts: Mutex<BTreeMap<(&'static str, String), u64>>,
    pub(super) longest_wait: Mutex<Duration>,
    /// The outcome of every tools/call, by tag.
    pub(super) calls: Mutex<HashMap<String, String>>,
}

impl Run {
    fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst) || self.failures.any()
    }

    fn count(&self, kind: &'static str, outcome: impl Into<String>) {
        *self.counts.lock().unwrap().entry((kind, outcome.into())).or_default() += 1;
    }

    /// How many `kind` requests had an outcome whose label starts with `outcome`.
    pub(super) fn get(&self, kind: &'static str, outcome: &str) -> u64 {
        let counts = self.counts.lock().unwrap();
        counts.iter().filter(|((k, o), _)| *k == kind && o.starts_with(outcome)).map(|(_, n)| n).sum()
    }

    pub(super) fn summary(&self) -> String {
        let counts = self.counts.lock().unwrap();
        let mut out = String::new();
        let mut last = "";
        for ((kind, outcome), n) in counts.iter() {
            if *kind != last {
                out.push_str(if last.is_empty() { "" } else { "; " });
                out.push_str(kind);
                out.push(':');
                last = kind;
            } else {
                out.push(',');
            }
            out.push_str(&format!(" {n} {outcome}"));
        }
        out
    }
}

struct Client<'r> {
    run: &'r Run,
    name: String,
    wire: Wire,
    session: Option<String>,
    next_id: u64,
    rng: Rng,
}

impl<'r> Client<'r> {
    fn new(run: &'r Run, name: String, seed: u64) -> Client<'r> {
        let rng = Rng::new(seed ^ fnv1a(name.as_bytes()));
        Client { run, wire: Wire::new(run.port), name, session: None, next_id: 1, rng }
    }

    fn pause(&mut self, lo: u64, hi: u64) {
        std::thread::sleep(self.rng.millis(lo, hi));
    }

    fn request(&self, method: &str, body: &[u8], accept: &str) -> Vec<u8> {
        let host = format!("127.0.0.1:{}", self.run.port);
        let mut fields = vec![("Accept", accept)];
        if !body.is_empty() {
            fields.push(("Content-Type", "application/json"));
        }
        if let Some(sid) = &self.session {
            fields.push(("Mcp-Session-Id", sid));
            fields.push(("MCP-Protocol-Version", PROTOCOL));
        }
        request(method, "/mcp", &host, &fields, body)
    }

    /// Send on the keep-alive connection and read the response; checks the
    /// wait and every session id in the head.
    fn exchange(&mut self, method: &str, body: &[u8], what: &str) -> Result<(Got, Instant), String> {
        let bytes = self.request(method, body, "application/json, text/event-stream");
        let t0 = Instant::now();
        let got = if self.wire.send(&bytes)? {
            self.wire.read_response(t0 + DEADLINE).map_err(|e| format!("{what}: {e}"))?
        } else {
            Got::Cut { head: None }
        };
        self.waited(t0, what)?;
        match &got {
            Got::Complete(r) => self.check_session_ids(&r.head, what)?,
            Got::Cut { head: Some(head) } => self.check_session_ids(head, what)?,
            Got::Cut { head: None } => {}
        }
        Ok((got, t0))
    }

    fn waited(&self, t0: Instant, what: &str) -> Result<(), String> {
        let waited = t0.elapsed();
        if waited > DEADLINE {
            return Err(format!("{what} waited {waited:?} for its outcome"));
        }
        let mut longest = self.run.longest_wait.lock().unwrap();
        *longest = (*longest).max(waited);
        Ok(())
    }

    /// Every session id in a head must be the client's own (in an initialize
    /// answer: one never handed to another client).
    fn check_session_ids(&self, head: &Head, what: &str) -> Result<(), String> {
        for sid in head.all("mcp-session-id") {
            if self.session.as_deref() == Some(sid) {
                continue;
            }
            let issued = self.run.issued.lock().unwrap();
            match issued.get(sid) {
                Some(other) if *other != self.name => {
                    return Err(format!(
                        "{what}: got session id {sid:?}, which was handed to {other}; its own is {:?}",
                        self.session
                    ))
                }
                _ if self.session.is_some() => {
                    return Err(format!("{what}: got session id {sid:?}; its own is {:?}", self.session))
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// A cut or a proxy error must meet a dying or down upstream: one that
    /// overlaps the time since `since` (when the request began, or when its
    /// stream last spoke).
    fn explained(&self, since: Instant, what: &str, outcome: &str) -> Result<(), String> {
        if !self.run.outages.since(since) {
            return Err(format!(
                "{what}: {outcome} {:?} after it began, with the upstream up all along",
                since.elapsed()
            ));
        }
        Ok(())
    }

    /// Count a plain outcome (see `plain_outcome`) and act on it: a 404 ends
    /// the session, a proxy error must be explained.
    fn plain(
        &mut self,
        kind: &'static str,
        got: Got,
        ok: u16,
        t0: Instant,
        what: &str,
    ) -> Result<(), String> {
        let outcome = match got {
            Got::Cut { .. } => "cut".to_string(),
            Got::Complete(r) => {
                plain_outcome(&r, ok).ok_or_else(|| format!("{what}: not an outcome: {}", r.text()))?
            }
        };
        if outcome == "404" {
            self.session = None;
        } else if outcome != "answered" {
            self.explained(t0, what, &outcome)?;
        }
        self.run.count(kind, outcome);
        Ok(())
    }

    /// initialize, then notifications/initialized; whether a session opened.
    fn open_session(&mut self) -> Result<bool, String> {
        let id = self.next_id;
        self.next_id += 1;
        let what = format!("initialize #{id}");
        let body = json!({"jsonrpc":"2.0","id":id,"method":"initialize","params":{"protocolVersion":PROTOCOL,"capabilities":{},"clientInfo":{"name":self.name,"version":"1"}}});
        let (got, t0) = self.exchange("POST", body.to_string().as_bytes(), &what)?;
        let r = match got {
            Got::Cut { .. } => {
                self.run.count("initialize", "cut");
                self.explained(t0, &what, "cut")?;
                return Ok(false);
            }
            Got::Complete(r) => r,
        };
        if let Some(label) = proxy_error(&r, &json!(id)) {
            self.explained(t0, &what, &label)?;
            self.run.count("initialize", label);
            return Ok(false);
        }
        let msgs = messages(&r).map_err(|e| format!("{what}: {e}"))?;
        let sids = r.head.all("mcp-session-id");
        let ok = r.status == 200
            && sids.len() == 1
            && msgs.len() == 1
            && msgs[0]["id"] == id
            && msgs[0]["result"]["protocolVersion"] == PROTOCOL;
        if !ok {
            return Err(format!("{what}: not the answer: {}", r.text()));
        }
        let sid = sids[0].to_string();
        if let Some(other) = self.run.issued.lock().unwrap().insert(sid.clone(), self.name.clone()) {
            return Err(format!("{what}: got session id {sid:?}, which was handed to {other} before"));
        }
        self.run.count("initialize", "answered");
        self.session = Some(sid);

        let what = format!("notifications/initialized in {:?}", self.session);
        let body = br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
        let (got, t0) = self.exchange("POST", body, &what)?;
        self.plain("initialized", got, 202, t0, &what)?;
        Ok(true)
    }

    fn call_tool(&mut self) -> Result<(), String> {
        let id = self.next_id;
        self.next_id += 1;
        let tag = format!("{}-{id}", self.name);
        let what = format!("tools/call {tag} in {:?}", self.session);
        let body = json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":"chat_send","arguments":{"n":tag,"message":"soak","sender":"someone-else"}}});
        let (got, t0) = self.exchange("POST", body.to_string().as_bytes(), &what)?;
        let outcome = match got {
            Got::Cut { .. } => {
                self.explained(t0, &what, "cut")?;
                "cut".to_string()
            }
            Got::Complete(r) if is_server_404(&r) => {
                self.session = None;
                "404".to_string()
            }
            Got::Complete(r) => match proxy_error(&r, &json!(id)) {
                Some(label) => {
                    self.explained(t0, &what, &label)?;
                    label
                }
                None => answer_to(&r, id, &tag).map_err(|e| format!("{what}: {e}"))?,
            },
        };
        self.run.count("call", outcome.clone());
        if let Some(first) = self.run.calls.lock().unwrap().insert(tag, outcome) {
            return Err(format!("{what}: a second outcome (the first was {first})"));
        }
        Ok(())
    }

    fn delete(&mut self) -> Result<(), String> {
        let what = format!("DELETE {:?}", self.session);
        let (got, t0) = self.exchange("DELETE", b"", &what)?;
        self.plain("delete", got, 200, t0, &what)?;
        // Ended from the client's side whatever the answer.
        self.session = None;
        Ok(())
    }

    /// Hold a GET stream on the session until it ends or the run stops.
    fn hold_stream(&mut self) -> Result<(), String> {
        let what = format!("GET stream of {:?}", self.session);
        let mut wire = Wire::new(self.run.port);
        let t0 = Instant::now();
        let head = if wire.send(&self.request("GET", b"", "text/event-stream"))? {
            wire.read_head(t0 + DEADLINE).map_err(|e| format!("{what}: {e}"))?
        } else {
            None
        };
        self.waited(t0, &what)?;
        let Some((status, head)) = head else {
            self.run.count("stream", "cut before head");
            self.explained(t0, &what, "cut")?;
            return Ok(());
        };
        self.check_session_ids(&head, &what)?;
        if status != 200 {
            // A complete answer instead of a stream.
            let got = wire.read_body(status, head, t0 + DEADLINE).map_err(|e| format!("{what}: {e}"))?;
            self.plain("stream", got, 200, t0, &what)?;
            if self.session.is_some() {
                self.pause(150, 250);
            }
            return Ok(());
        }
        let sse = head.all("content-type").first().is_some_and(|ct| ct.starts_with("text/event-stream"));
        if !sse || head.all("transfer-encoding") != ["chunked"] {
            return Err(format!("{what}: a 200 that is not a chunked SSE stream: {:?}", head.fields));
        }
        self.run.count("stream", "opened");
        let mut events = Vec::new();
        let mut spoke = Instant::now();
        while !self.run.stopping() {
            match wire.read_chunk(Instant::now() + DEADLINE).map_err(|e| format!("{what}: {e}"))? {
                Chunk::Data(data) => {
                    if self.run.outages.since(spoke) {
                        // The upstream died since the stream last spoke,
                        // and the stream goes on: the proxy held it and
                        // reattached it on the restarted server.
                        self.run.count("stream", "held through a restart");
                    }
                    spoke = Instant::now();
                    events.extend_from_slice(&data);
                    for m in take_events(&mut events).map_err(|e| format!("{what}: {e}"))? {
                        let owner = &m["params"]["data"]["owner"];
                        if m["method"] != "notifications/message" || *owner != self.name.as_str() {
                            return Err(format!("{what}: an event that is not for {}: {m}", self.name));
                        }
                        self.run.count("stream", "events");
                    }
                }
                Chunk::Last => {
                    return Err(format!(
                        "{what}: ended with the last chunk: the upstream never ends a stream, so a cut was framed complete"
                    ))
                }
                Chunk::Cut => {
                    self.run.count("stream", "cut");
                    self.explained(spoke, &what, "cut")?;
                    return Ok(());
                }
            }
        }
        Ok(())
    }
}

/// A client's life until the soak ends: a session (tried again after a
/// pause when refused), then `act` on it; its session deleted at the end.
fn live<'r>(
    run: &'r Run,
    name: String,
    seed: u64,
    mut act: impl FnMut(&mut Client<'r>) -> Result<(), String>,
) -> Result<(), String> {
    let mut c = Client::new(run, name, seed);
    while !run.stopping() {
        if c.session.is_none() {
            if !c.open_session()? {
                c.pause(100, 200);
            }
            continue;
        }
        act(&mut c)?;
    }
    if c.session.is_some() {
        c.delete()?;
    }
    Ok(())
}

/// A caller: tool calls 20 to 50 ms apart; a new session after a 404 (and
/// now and then on its own, after a DELETE).
fn caller(run: &Run, name: String, seed: u64) -> Result<(), String> {
    live(run, name, seed, |c| {
        c.call_tool()?;
        if c.session.is_some() && c.rng.below(40) == 0 {
            c.delete()?;
        }
        c.pause(20, 50);
        Ok(())
    })
}

/// A streamer: a GET stream on its session (held through restarts by the
/// proxy), opened again when cut.
fn streamer(run: &Run, name: String, seed: u64) -> Result<(), String> {
    live(run, name, seed, Client::hold_stream)
}

/// The clients of one phase, named `{phase}.c{k}` (callers) and
/// `{phase}.g{k}` (GET streams): names and call tags are unique in the test.
pub(super) fn spawn_clients(run: &Arc<Run>, phase: &str, seed: u64) -> Vec<JoinHandle<()>> {
    let callers = (0..CALLERS).map(|k| (format!("{phase}.c{k}"), true));
    let roles = callers.chain((0..STREAMERS).map(|k| (format!("{phase}.g{k}"), false)));
    roles
        .map(|(name, calls)| {
            let run = run.clone();
            std::thread::spawn(move || {
                let _guard = PanicGuard(&run.failures, name.clone());
                let result =
                    if calls { caller(&run, name.clone(), seed) } else { streamer(&run, name.clone(), seed) };
                if let Err(e) = result {
                    run.failures.add(&name, e);
                }
            })
        })
        .collect()
}

pub(super) fn stop_clients(run: &Run, clients: Vec<JoinHandle<()>>) {
    run.stop.store(true, Ordering::SeqCst);
    for c in clients {
        let _ = c.join();
    }
}

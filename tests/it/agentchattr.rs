//! The real agentchattr in front of which the proxy runs for real users: its `run.py` (FastAPI web API, and
//! FastMCP from the Python SDK 1.30 on streamable HTTP and on legacy SSE) unpacked from the snapshot in
//! `../shared/agentchattr/` at test time, driven as its `wrapper.py` drives it, the proxy started by the
//! project's drop-in (`python/mcp_identity_proxy`) where the wrapper starts its own.
//!
//! Each test starts its own `run.py` (free loopback ports, a data dir of its own) and its own wrapper
//! (`tests/support/agentchattr_wrapper.py`: register, `McpIdentityProxy(...).start()`, a heartbeat every 0.5 s,
//! a rename followed, re-registration on 409 handed to the proxy), then runs one MCP session of a real client
//! (`tests/support/agentchattr_client.py` with the Python SDK 1.x or 2.x, `agentchattr_client.cjs` with the
//! TypeScript SDK) through the proxy, step by step, the test acting at the client's pauses: SIGKILL and
//! restart `run.py` on the same ports and data dir, with or without its `registry.json`; a rename from the
//! web UI. What is asserted is what agentchattr itself stored (`GET /api/messages`) and what the client
//! received (its results, the session id it kept, every HTTP exchange and GET stream it saw).
//!
//! Facts these tests rely on (measured, see `../shared/agentchattr/README.md`): agentchattr decides a
//! message's sender from the token (a known one wins over any `sender` argument; an unknown one gets the
//! tool result "Error: stale or unknown authenticated agent session"), so a message stored under the agent's
//! current name after a restart shows the proxy carried the current token into the new session. It answers
//! `initialize` with about 6 KB (its `instructions`), one SSE event in a chunked body. It sends nothing on
//! the standalone GET stream but sse-starlette's `: ping` comment every 15 s, so a GET stream delivering
//! after a restart is observed as that comment arriving from the restarted server.
//!
//! The SDKs and agentchattr's requirements are installed on first use by `realenv`; a missing snapshot,
//! interpreter or package fails the test, never skips it.

use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::agentchattr::{Agentchattr, On409, Wrapper, TOOLS};
use crate::support::cases;
use crate::support::checks::{http, step, Checks};
use crate::support::realenv::{self, ScriptRun};

/// The same sessions over https:// through nginx as a TLS terminator.
mod over_tls;

/// The same sessions through a real forward proxy (squid) to agentchattr behind nginx TLS.
mod forward_proxy;

/// Bound on one client run, pauses included (the scripts bound themselves at 60 s).
const SCRIPT_LIMIT: Duration = Duration::from_secs(90);
/// What the client claims to be; the proxy stamps the agent's name instead (agentchattr uses the token's).
const SPOOF_SENDER: &str = "mallory";
/// The proxy's `--restart-grace` default (the drop-in passes none).
const GRACE: Duration = Duration::from_secs(5);
/// How long the wrapper may take to see the restarted server (heartbeat every 0.5 s) and act on it.
const WRAPPER_LIMIT: Duration = Duration::from_secs(10);
/// The restarted server's first `: ping` on a GET stream comes 15 s after the stream opened on it.
const PING_WAIT_S: u32 = 20;

#[derive(Clone, Copy, Debug)]
enum Sdk {
    /// Python SDK 1.x: `streamable_http_client` + `ClientSession`.
    Py1,
    /// Python SDK 1.x: the legacy `sse_client` + `ClientSession`.
    Py1Sse,
    /// Python SDK 2.x: `mcp.Client`, mode "auto", which falls back to a session against FastMCP 1.x.
    Py2,
    /// TypeScript SDK: `StreamableHTTPClientTransport` on Node's fetch.
    Ts,
}

impl Sdk {
    fn command(self, url: &str, steps: &str) -> Command {
        let args = [url, "--steps", steps, "--sender", SPOOF_SENDER];
        match self {
            Sdk::Py1 => realenv::python_script(realenv::py1(), "agentchattr_client.py", &args),
            Sdk::Py1Sse => {
                let mut cmd = realenv::python_script(realenv::py1(), "agentchattr_client.py", &args);
                cmd.args(["--transport", "sse"]);
                cmd
            }
            Sdk::Py2 => realenv::python_script(realenv::py2(), "agentchattr_client.py", &args),
            Sdk::Ts => realenv::node_script("agentchattr_client.cjs", &args),
        }
    }
}

/// Run `steps` with `sdk` against `url`; `at_pause(name)` runs at each `pause:NAME` step.
#[track_caller]
fn run_client(sdk: Sdk, url: &str, steps: &str, at_pause: impl FnMut(&str)) -> ScriptRun {
    realenv::run_paused(&format!("{sdk:?} client"), sdk.command(url, steps), SCRIPT_LIMIT, at_pause)
}

// ---------------------------------------------------------------------------------------------------------
// Reading the client's record and agentchattr's history.

/// The messages agentchattr stored with `text`.
fn stored<'a>(messages: &'a [Value], text: &str) -> Vec<&'a Value> {
    messages.iter().filter(|m| m["text"] == text).collect()
}

pub(crate) fn senders(messages: &[Value]) -> String {
    let lines: Vec<String> = messages
        .iter()
        .map(|m| format!("#{} {} {:?} in {}", m["id"], m["sender"], m["text"], m["channel"]))
        .collect();
    format!("[{}]", lines.join("; "))
}

/// What this suite adds to the shared `Checks` (the stdio suite's real hosts use them too).
impl Checks {
    /// The client script itself failed (an exception outside any recorded step).
    pub(crate) fn script_ran(&mut self, out: &Value) {
        if let Some(err) = out["error"].as_str() {
            let lines: Vec<&str> = err.trim_end().lines().collect();
            let first = lines.first().copied().unwrap_or("");
            let last = lines.last().copied().unwrap_or("");
            self.failures.push(format!("the client failed: {first} ... {last}"));
        }
    }

    /// A `list` step: agentchattr's twelve tools.
    pub(crate) fn listed(&mut self, what: &str, rec: &Value) {
        if rec.is_null() {
            self.failures.push(format!("{what}: never made"));
            return;
        }
        let got: Vec<&str> =
            rec["tools"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        let mut want = TOOLS.to_vec();
        let mut sorted = got.clone();
        sorted.sort_unstable();
        want.sort_unstable();
        self.check(
            sorted == want,
            format!("{what}: tools {got:?} (error {}), want agentchattr's {TOOLS:?}", rec["error"]),
        );
    }

    /// A `call` step (chat_send): answered "Sent (id=N)" by agentchattr, not an error; returns N.
    pub(crate) fn sent(&mut self, what: &str, rec: &Value) -> Option<u64> {
        if rec.is_null() {
            self.failures.push(format!("{what}: never made"));
            return None;
        }
        if !rec["error"].is_null() {
            self.failures.push(format!(
                "{what}: failed with {} after {:.0} ms",
                rec["error"],
                rec["elapsed_ms"].as_f64().unwrap_or(0.0)
            ));
            return None;
        }
        let text = rec["result"].as_str().unwrap_or("");
        let id =
            text.strip_prefix("Sent (id=").and_then(|t| t.strip_suffix(')')).and_then(|n| n.parse().ok());
        if id.is_none() || rec["is_error"] != json!(false) {
            self.failures.push(format!(
                "{what}: agentchattr answered {} (is_error {})",
                rec["result"], rec["is_error"]
            ));
        }
        id
    }

    /// agentchattr stored the message `text` exactly once, in #general, under `sender`, with the id its answer
    /// gave (when it gave one).
    pub(crate) fn stored_as(&mut self, messages: &[Value], text: &str, sender: &str, id: Option<u64>) {
        let found = stored(messages, text);
        if found.len() != 1 {
            self.failures.push(format!(
                "agentchattr stored {} messages {text:?}, want 1; its history: {}",
                found.len(),
                senders(messages)
            ));
            return;
        }
        let m = found[0];
        self.eq(&format!("message {text:?}: sender as agentchattr stored it"), &m["sender"], &json!(sender));
        self.eq(&format!("message {text:?}: channel"), &m["channel"], &json!("general"));
        if let Some(id) = id {
            self.eq(&format!("message {text:?}: id"), &m["id"], &json!(id));
        }
    }

    /// One session throughout: one initialize (the client's own), the same id at every step and on every
    /// request after it, never a 404.
    fn one_session(&mut self, out: &Value) {
        let client_id = out["session_id_at_start"].as_str().unwrap_or("").to_string();
        self.check(!client_id.is_empty(), "the client has no session id after connecting");
        for s in out["steps"].as_array().into_iter().flatten() {
            if let Some(id) = s.get("session_id") {
                self.eq(
                    &format!("client's session id at step {}:{}", s["step"], s["label"]),
                    id,
                    &json!(client_id),
                );
            }
        }
        self.eq("client's session id at the end", &out["session_id_at_end"], &json!(client_id));
        let http = http(out);
        let inits = http.iter().filter(|h| h["rpc_method"] == "initialize").count();
        self.check(inits == 1, format!("the client sent {inits} initialize requests, want 1"));
        let mut lost = Vec::new();
        for h in &http {
            let probe_or_init = h["rpc_method"] == "initialize" || h["rpc_method"] == "server/discover";
            if !probe_or_init && h["method"] != "GET" && !h["sent_session_id"].is_null() {
                self.eq(
                    &format!("{} {} {}: Mcp-Session-Id sent", h["method"], h["rpc_method"], h["status"]),
                    &h["sent_session_id"],
                    &json!(client_id),
                );
            }
            if h["status"] == 404 {
                lost.push(format!("{} {} {}", h["method"], h["rpc_method"], h["body_text"]));
            }
        }
        self.check(
            lost.is_empty(),
            format!("the client was told its session is gone (404): {}", lost.join("; ")),
        );
    }

    /// A `stream` step after a restart: the GET stream the client had open when the restart began is still
    /// open, never ended or errored (the client did not notice the restart), no GET the client opened since
    /// was refused, and with `want_bytes`, bytes (the restarted server's `: ping`) arrived on a GET stream
    /// after the restart.
    fn stream_held(&mut self, what: &str, rec: &Value, want_bytes: bool) {
        if rec.is_null() {
            self.failures.push(format!("{what}: never made"));
            return;
        }
        let gets = rec["gets"].as_array().cloned().unwrap_or_default();
        let before: Vec<&Value> =
            gets.iter().filter(|g| g["opened_before_pause"] == json!(true) && g["status"] == 200).collect();
        match before.last() {
            None => {
                self.failures.push(format!("{what}: no GET stream was open before the restart: {gets:?}"))
            }
            Some(g) => self.check(
                g["ended"].is_null(),
                format!(
                    "{what}: the GET stream open before the restart ended ({}) {:+.2} s from the restart",
                    g["end"],
                    secs(g["ended"].as_f64(), rec["pause"].as_f64())
                ),
            ),
        }
        let refused: Vec<String> = gets
            .iter()
            .filter(|g| g["opened_before_pause"] == json!(false) && g["status"] != 200)
            .map(|g| format!("{} {}", g["status"], g["body_text"]))
            .collect();
        self.check(
            refused.is_empty(),
            format!("{what}: GET streams refused since the restart began: {}", refused.join("; ")),
        );
        let open = gets.iter().any(|g| g["status"] == 200 && g["ended"].is_null());
        self.check(open, format!("{what}: no GET stream open after the restart"));
        if want_bytes {
            let after: Vec<&Value> =
                gets.iter().filter(|g| g["bytes_after_mark"].as_u64() > Some(0)).collect();
            self.check(
                !after.is_empty(),
                format!("{what}: nothing arrived on a GET stream in the {:.1} s after the restart (agentchattr's `: ping` is due 15 s after the stream reached it)", rec["waited_ms"].as_f64().unwrap_or(0.0) / 1000.0),
            );
        }
    }
}

fn secs(a: Option<f64>, b: Option<f64>) -> f64 {
    a.zip(b).map_or(f64::NAN, |(a, b)| a - b)
}

/// `Checks::finish` with the test's wall time.
#[track_caller]
fn finish(c: Checks, test: &str, started: Instant, evidence: &[(&str, String)]) {
    eprintln!("{test}: {:.2}s wall", started.elapsed().as_secs_f64());
    c.finish(test, evidence);
}

fn evidence(
    run: &ScriptRun,
    w: &Wrapper,
    ac: &Agentchattr,
    messages: &[Value],
) -> Vec<(&'static str, String)> {
    vec![
        ("client JSON", serde_json::to_string_pretty(&run.json).unwrap_or_default()),
        ("client stderr", run.stderr.clone()),
        ("wrapper events", w.events_text()),
        ("wrapper stderr (the proxy's log)", w.stderr_text()),
        ("agentchattr output (every generation)", ac.log_text()),
        ("agentchattr's history", senders(messages)),
    ]
}

/// The size of the initialize answer the client received (through the proxy), and of the tools/list answer.
fn report_sizes(test: &str, out: &Value) {
    if out["transport"] == "sse" {
        return;
    }
    for method in ["initialize", "tools/list"] {
        if let Some(h) = http(out).iter().find(|h| h["rpc_method"] == method) {
            eprintln!("{test}: {method} answer: {} bytes ({})", h["bytes"], h["content_type"]);
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// 1. Each SDK's session survives a SIGKILL and restart of run.py: the next chat_send, in the same session and
//    without a second initialize, is stored under the agent's current name, and the GET stream goes on.

#[derive(Clone, Copy, Debug, PartialEq)]
enum Registry {
    /// registry.json kept: the wrapper's token is still valid (heartbeat 200).
    Kept,
    /// registry.json removed before the restart: heartbeat 409, the wrapper registers again and hands the new
    /// name and token to the proxy.
    Lost,
}

fn session_survives_a_restart_of_run_py(test: &str, sdk: Sdk, registry: Registry, on_409: On409) {
    let started = Instant::now();
    let mut ac = Agentchattr::start();
    let w = Wrapper::start(&ac, "/mcp", on_409);
    let want_bytes = registry == Registry::Lost;
    let steps = format!(
        "list:before,call:before,stream:before:0,pause:restart,call:after,stream:after:{},list:after",
        if want_bytes { PING_WAIT_S } else { 0 }
    );
    let mut restart_took = Duration::ZERO;
    let mut wrapper_saw = None;
    let mut restarted_at = None;
    let run = run_client(sdk, &w.url, &steps, |_| {
        let t = realenv_now();
        restart_took = ac.restart(registry == Registry::Lost);
        restarted_at = Some(t);
        // Act only once the wrapper has seen the restarted server (and, its registry lost, handed the
        // proxy a new identity), as an agent's next call would come after the wrapper's next heartbeat.
        wrapper_saw = w.wait_for("the restarted server", WRAPPER_LIMIT, |e| {
            e["t"].as_f64() > Some(t)
                && match registry {
                    Registry::Kept => e["event"] == "heartbeat" && e["status"] == 200,
                    Registry::Lost => e["event"] == "reregistered",
                }
        });
    });
    let out = &run.json;
    let messages = ac.messages();
    let (name_now, token_now) = w.current();
    eprintln!(
        "{test}: run.py restart (SIGKILL to its three ports answering): {:.2}s; starts {:?}",
        restart_took.as_secs_f64(),
        ac.starts
    );
    report_sizes(test, out);

    let mut c = Checks::default();
    c.script_ran(out);
    match registry {
        Registry::Kept => c.check(
            wrapper_saw.is_some(),
            format!("no heartbeat answered 200 within {WRAPPER_LIMIT:?} of the restart (registry kept)"),
        ),
        Registry::Lost => {
            c.check(
                wrapper_saw.is_some(),
                format!(
                    "the wrapper did not re-register within {WRAPPER_LIMIT:?} of the restart (registry lost)"
                ),
            );
            let stale = w.events().iter().any(|e| e["event"] == "stale" && e["t"].as_f64() > restarted_at);
            c.check(stale, "no heartbeat got 409 after the restart without registry.json");
            c.check(token_now != w.token, "the re-registration kept the old token");
        }
    }
    c.listed("tools/list before the restart", step(out, "list", "before"));
    let before = c.sent("chat_send before the restart", step(out, "call", "before"));
    let after = c.sent("chat_send after the restart", step(out, "call", "after"));
    c.listed("tools/list after the restart", step(out, "list", "after"));
    c.stored_as(&messages, "before", &w.name, before);
    c.stored_as(&messages, "after", &name_now, after);
    c.one_session(out);
    let s = step(out, "stream", "before");
    c.check(
        s["gets"].as_array().is_some_and(|g| g.iter().any(|g| g["status"] == 200 && g["ended"].is_null())),
        format!("no GET stream open before the restart: {}", s["gets"]),
    );
    c.stream_held("the GET stream after the restart", step(out, "stream", "after"), want_bytes);
    if let Some(g) = step(out, "stream", "after")["gets"].as_array() {
        for g in g {
            eprintln!(
                "{test}: GET {} opened {:+.2}s from the kill, ended {:?} ({}), bytes after the restart {} (first: {})",
                g["status"],
                secs(g["opened"].as_f64(), restarted_at),
                g["ended"].as_f64().map(|e| e - restarted_at.unwrap_or(0.0)),
                g["end"],
                g["bytes_after_mark"],
                g["first_after_mark"]
            );
        }
    }
    finish(c, test, started, &evidence(&run, &w, &ac, &messages));
}

/// Seconds since the epoch, as the scripts' `time.time()` / `Date.now() / 1000`.
fn realenv_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

// Scenario 1 for each SDK and registry fate.
cases! { session_survives_a_restart_of_run_py;
    python_sdk_1x_session_survives_a_restart_of_run_py_registry_kept => Sdk::Py1, Registry::Kept, On409::SetIdentity;
    python_sdk_1x_session_survives_a_restart_of_run_py_registry_lost => Sdk::Py1, Registry::Lost, On409::Setters;
    python_sdk_2x_session_survives_a_restart_of_run_py_registry_kept => Sdk::Py2, Registry::Kept, On409::SetIdentity;
    python_sdk_2x_session_survives_a_restart_of_run_py_registry_lost => Sdk::Py2, Registry::Lost, On409::SetIdentity;
    typescript_sdk_session_survives_a_restart_of_run_py_registry_kept => Sdk::Ts, Registry::Kept, On409::SetIdentity;
    typescript_sdk_session_survives_a_restart_of_run_py_registry_lost => Sdk::Ts, Registry::Lost, On409::SetIdentity;
}

// ---------------------------------------------------------------------------------------------------------
// 2. A legacy SSE session (agentchattr's SSE port, as its Gemini configuration uses) end to end.

#[test]
fn legacy_sse_session_through_the_proxy_is_stored_under_the_agents_name() {
    const TEST: &str = "legacy_sse_session_through_the_proxy_is_stored_under_the_agents_name";
    let started = Instant::now();
    let ac = Agentchattr::start();
    let w = Wrapper::start(&ac, "/sse", On409::SetIdentity);
    let run = run_client(Sdk::Py1Sse, &w.url, "list:sse,call:over-sse", |_| {});
    let out = &run.json;
    let messages = ac.messages();
    report_sizes(TEST, out);

    let mut c = Checks::default();
    c.script_ran(out);
    c.check(w.url.ends_with("/sse"), format!("the wrapper's URL {} is not the proxy's /sse", w.url));
    c.listed("tools/list over SSE", step(out, "list", "sse"));
    let id = c.sent("chat_send over SSE", step(out, "call", "over-sse"));
    c.stored_as(&messages, "over-sse", &w.name, id);
    let http = http(out);
    let streams: Vec<&Value> = http.iter().filter(|h| h["method"] == "GET").collect();
    c.check(
        streams.len() == 1 && streams[0]["status"] == 200 && streams[0]["path"] == "/sse",
        format!("the client's SSE stream: want one GET /sse answered 200, got {streams:?}"),
    );
    // Every POST went to the endpoint the stream announced, rewritten to the proxy, in one session.
    let session = out["session_id_at_start"].as_str().unwrap_or("");
    c.check(!session.is_empty(), "the client has no SSE session id (no POST to /messages/?session_id=...)");
    for h in http.iter().filter(|h| h["method"] == "POST") {
        c.check(
            h["path"] == json!(format!("/messages/?session_id={session}")) && h["status"] == 202,
            format!(
                "POST {} {}: {} (want 202 on /messages/?session_id={session})",
                h["rpc_method"], h["path"], h["status"]
            ),
        );
    }
    finish(c, TEST, started, &evidence(&run, &w, &ac, &messages));
}

// ---------------------------------------------------------------------------------------------------------
// 3. A rename from the web UI reaches the next call: the wrapper's heartbeat sees the new name and renames the
//    proxy; the next chat_send is stored under it.

#[test]
fn a_rename_from_the_web_ui_reaches_the_next_call() {
    const TEST: &str = "a_rename_from_the_web_ui_reaches_the_next_call";
    const LABEL: &str = "Claude Renamed";
    const NEW_NAME: &str = "claude-renamed";
    let started = Instant::now();
    let ac = Agentchattr::start();
    let w = Wrapper::start(&ac, "/mcp", On409::SetIdentity);
    let mut answer = Value::Null;
    let mut renamed = None;
    let mut proxy_renamed = false;
    let run = run_client(Sdk::Py1, &w.url, "call:before,pause:rename,call:after", |_| {
        answer = ac.rename(&w.name, LABEL);
        renamed =
            w.wait_for("the rename", WRAPPER_LIMIT, |e| e["event"] == "renamed" && e["new"] == NEW_NAME);
        // The wrapper goes on under the new name: its next heartbeat is sent for it.
        let _ = w.wait_for("a heartbeat under the new name", WRAPPER_LIMIT, |e| {
            e["event"] == "heartbeat" && e["sent_as"] == NEW_NAME
        });
        let t0 = Instant::now();
        while !proxy_renamed && t0.elapsed() < Duration::from_secs(5) {
            proxy_renamed = w
                .stderr_text()
                .lines()
                .any(|l| l.contains("identity updated") && l.contains(&format!("\"{NEW_NAME}\"")));
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    let out = &run.json;
    let messages = ac.messages();

    let mut c = Checks::default();
    c.script_ran(out);
    c.eq("the web UI's rename answer", &answer, &json!({"ok": true, "new_name": NEW_NAME}));
    c.check(
        renamed.is_some(),
        format!("the wrapper's heartbeat did not see the new name {NEW_NAME:?} within {WRAPPER_LIMIT:?}"),
    );
    c.check(
        proxy_renamed,
        format!(
            "the proxy did not log `identity updated ... {NEW_NAME:?}` within 5 s of the wrapper's rename"
        ),
    );
    let beats_after: Vec<Value> = w
        .events()
        .into_iter()
        .filter(|e| {
            e["event"] == "heartbeat" && renamed.as_ref().is_some_and(|r| e["t"].as_f64() > r["t"].as_f64())
        })
        .collect();
    c.check(
        beats_after.iter().any(|e| e["sent_as"] == NEW_NAME && e["status"] == 200),
        format!("no heartbeat for {NEW_NAME:?} answered 200 after the rename: {beats_after:?}"),
    );
    c.sent("chat_send before the rename", step(out, "call", "before"));
    let after = c.sent("chat_send after the rename", step(out, "call", "after"));
    c.stored_as(&messages, "after", NEW_NAME, after);
    // agentchattr renames the sender of earlier messages too.
    c.stored_as(&messages, "before", NEW_NAME, None);
    c.one_session(out);
    finish(c, TEST, started, &evidence(&run, &w, &ac, &messages));
}

// ---------------------------------------------------------------------------------------------------------
// 4. A call while run.py is down (killed, started again 1.5 s later, within the proxy's default 5 s
//    --restart-grace) is answered with its id within the grace, and the session works once it is back.

#[test]
fn a_call_while_run_py_is_down_is_answered_within_the_grace_and_the_session_works_once_it_is_back() {
    const TEST: &str =
        "a_call_while_run_py_is_down_is_answered_within_the_grace_and_the_session_works_once_it_is_back";
    /// Gross: the grace, plus the answer's own way back on a loaded machine.
    const SLACK: Duration = Duration::from_secs(2);
    const DOWN_FOR: Duration = Duration::from_millis(1500);
    let started = Instant::now();
    let ac = Mutex::new(Agentchattr::start());
    let w = Wrapper::start(&ac.lock().unwrap(), "/mcp", On409::SetIdentity);
    let mut killed_at = None;
    let back_at: Mutex<Option<f64>> = Mutex::new(None);
    let run = std::thread::scope(|s| {
        run_client(Sdk::Py1, &w.url, "call:before,pause:down,call:down,call:after", |_| {
            ac.lock().unwrap().kill();
            killed_at = Some(realenv_now());
            s.spawn(|| {
                std::thread::sleep(DOWN_FOR);
                ac.lock().unwrap().start_again(false);
                *back_at.lock().unwrap() = Some(realenv_now());
            });
        })
    });
    let ac = ac.into_inner().unwrap();
    let back_at = back_at.into_inner().unwrap();
    let out = &run.json;
    let messages = ac.messages();

    let mut c = Checks::default();
    c.script_ran(out);
    let before = c.sent("chat_send before the kill", step(out, "call", "before"));
    c.stored_as(&messages, "before", &w.name, before);

    let down = step(out, "call", "down");
    let took =
        Duration::from_secs_f64(down["elapsed_ms"].as_f64().unwrap_or(f64::INFINITY).min(1e9) / 1000.0);
    let back_after = secs(back_at, down["started"].as_f64());
    eprintln!(
        "{TEST}: run.py back {back_after:.2}s after the call while down was sent ({:.2}s after the kill); the call was answered after {:.2}s: {} {}",
        secs(back_at, killed_at),
        took.as_secs_f64(),
        down["result"],
        down["error"]
    );
    c.check(
        took <= GRACE + SLACK,
        format!("the call while run.py was down was answered after {took:?}, want within the {GRACE:?} grace (+{SLACK:?})"),
    );
    // Answered with its own id: the SDK matched the answer to its request (no timeout), and the answer on the
    // wire carried the request's id.
    let posts = down["posts"].as_array().cloned().unwrap_or_default();
    let carried = posts.last().is_some_and(|p| {
        p["answers"]
            .as_array()
            .is_some_and(|a| a.iter().any(|m| m["id"] == p["rpc_id"] && !p["rpc_id"].is_null()))
    });
    c.check(carried, format!("the answer to the call while down did not carry its request's id: {posts:?}"));
    if down["error"].is_null() {
        let id = c.sent("the call while run.py was down", down);
        c.stored_as(&messages, "down", &w.name, id);
    } else {
        // The error answer is the proxy's only when run.py was not back in time for the retry to fit.
        c.eq("the call while down: error code", &down["error"]["code"], &json!(-32000));
        c.check(
            back_after > GRACE.as_secs_f64() - 1.0,
            format!("run.py was back {back_after:.2}s after the call was sent, well within the grace, yet the call failed: {}", down["error"]),
        );
        c.check(stored(&messages, "down").is_empty(), "a call answered with an error was stored");
    }
    let after = c.sent("chat_send once run.py is back", step(out, "call", "after"));
    c.stored_as(&messages, "after", &w.name, after);
    c.one_session(out);
    finish(c, TEST, started, &evidence(&run, &w, &ac, &messages));
}

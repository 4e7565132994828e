//! The audit log (`--audit-log`) and the metrics listener (`--metrics-listen`) against the real agentchattr
//! and a real client, the Python SDK 1.x (`tests/support/audit_client.py`): one session through a SIGKILL and
//! restart of `run.py` is recorded request by request, with the session's events in their places, an
//! impersonation attempt recorded (`claimed`), said at warn and counted, and `GET /metrics` agreeing with the
//! records. What agentchattr stored shows the identity the proxy stamped. A stand-in upstream covers what the
//! real pair does only by chance: a client that leaves once it has its answer, before the body's end.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::agentchattr::Agentchattr;
use crate::support::checks::Checks;
use crate::support::exchange::{client, host, json_post};
use crate::support::proxy_process::{scratch_dir, ProxyProcess};
use crate::support::realenv;
use crate::support::wire::{Next, StubUpstream};

/// Bound on one client run, the restart included (the script bounds itself at 60 s).
const SCRIPT_LIMIT: Duration = Duration::from_secs(90);
/// Bound on the last record reaching the file (the loop writes what it has before it waits).
const RECORDS_LIMIT: Duration = Duration::from_secs(5);
/// The metric families a request or session record moves.
const COUNTED: [&str; 4] = [
    "mcp_proxy_requests_total",
    "mcp_proxy_tool_calls_total",
    "mcp_proxy_impersonation_attempts_total",
    "mcp_proxy_session_reinitialisations_total",
];

/// The file's records, one JSON object a line; every line that is not one is a failure.
fn read_records(path: &Path, c: &mut Checks) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut records = Vec::new();
    for (n, line) in text.lines().enumerate() {
        match serde_json::from_str::<Value>(line) {
            Ok(v) if v.is_object() => records.push(v),
            _ => c.failures.push(format!("audit line {}: not a JSON object: {line:?}", n + 1)),
        }
    }
    c.check(text.is_empty() || text.ends_with('\n'), "the audit file does not end with a line feed");
    records
}

/// Waits (up to `RECORDS_LIMIT`) for the file's last line to be `event`.
fn wait_for_last(path: &Path, event: &str) {
    let t0 = Instant::now();
    while t0.elapsed() < RECORDS_LIMIT {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let last = text.lines().last().and_then(|l| serde_json::from_str::<Value>(l).ok());
        if last.is_some_and(|v| v["event"] == event) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The file's records once it holds `n` (or after `RECORDS_LIMIT`); a line that is not JSON is a null.
fn wait_records(path: &Path, n: usize) -> Vec<Value> {
    let t0 = Instant::now();
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let records: Vec<Value> =
            text.lines().map(|l| serde_json::from_str(l).unwrap_or(Value::Null)).collect();
        if records.len() >= n || t0.elapsed() > RECORDS_LIMIT {
            return records;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The samples of the exposition text: `name{labels}` to value.
fn samples(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.rsplit_once(' '))
        .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
        .collect()
}

/// The samples of `COUNTED` that the records move, counted from the records alone (no zero values).
fn counted_from(records: &[Value]) -> BTreeMap<String, u64> {
    let mut want = BTreeMap::new();
    let mut add = |k: String| *want.entry(k).or_insert(0) += 1;
    for r in records {
        match r["event"].as_str() {
            Some("request") => {
                let (method, outcome) = (r["mcp.method.name"].as_str(), r["outcome"].as_str());
                let (method, outcome) = (method.unwrap_or("?"), outcome.unwrap_or("?"));
                add(format!("mcp_proxy_requests_total{{method=\"{method}\",outcome=\"{outcome}\"}}"));
                if let Some(tool) = r["gen_ai.tool.name"].as_str() {
                    add(format!("mcp_proxy_tool_calls_total{{tool=\"{tool}\",outcome=\"{outcome}\"}}"));
                    if r.get("claimed").is_some() {
                        add(format!("mcp_proxy_impersonation_attempts_total{{tool=\"{tool}\"}}"));
                    }
                }
            }
            Some("session.reinitialised") => add(format!(
                "mcp_proxy_session_reinitialisations_total{{result=\"{}\"}}",
                r["result"].as_str().unwrap_or("?")
            )),
            _ => {}
        }
    }
    want
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ`.
fn is_rfc3339_millis(ts: &str) -> bool {
    let b = ts.as_bytes();
    let digits = |r: std::ops::Range<usize>| b.get(r).is_some_and(|d| d.iter().all(u8::is_ascii_digit));
    b.len() == 24
        && [(4, b'-'), (7, b'-'), (10, b'T'), (13, b':'), (16, b':'), (19, b'.'), (23, b'Z')]
            .iter()
            .all(|&(i, c)| b[i] == c)
        && [0..4, 5..7, 8..10, 11..13, 14..16, 17..19, 20..23].into_iter().all(digits)
}

/// A record without what varies from run to run (time, sizes, duration) and what is checked across all
/// records at once (agent, session id).
fn shape(r: &Value) -> Value {
    let mut r = r.clone();
    if let Some(o) = r.as_object_mut() {
        for k in ["ts", "agent", "mcp.session.id", "duration_ms", "bytes_in", "bytes_out"] {
            o.remove(k);
        }
    }
    r
}

fn answered(id: &Value, method: &str, tool: Option<&str>, claimed: Option<&str>) -> Value {
    let mut r = json!({
        "event": "request",
        "jsonrpc.request.id": id,
        "mcp.method.name": method,
        "http.response.status_code": 200,
        "outcome": "ok",
        "answered_by": "upstream",
    });
    if let Some(t) = tool {
        r["gen_ai.tool.name"] = json!(t);
    }
    if let Some(c) = claimed {
        r["claimed"] = json!(c);
    }
    r
}

fn lines(values: &[Value]) -> String {
    values.iter().map(|v| format!("  {v}\n")).collect()
}

/// The session: initialize (and notifications/initialized, and the SDK's standalone GET stream), tools/list,
/// chat_send claiming to be the other agent, chat_read, a SIGKILL and restart of run.py (registry kept: the
/// token stays valid), chat_send without a sender (the proxy re-initialises the session on the 404 and
/// retries), then the SDK's closing DELETE.
#[test]
fn a_real_session_through_a_restart_is_audited_request_by_request_and_the_counters_agree() {
    const TEST: &str =
        "a_real_session_through_a_restart_is_audited_request_by_request_and_the_counters_agree";
    let started = Instant::now();
    let mut ac = Agentchattr::start();
    let (name, token) = ac.register("claude");
    let (other, _) = ac.register("codex");
    assert_ne!(name, other, "two agents registered under one name");
    let audit = scratch_dir("audit-real").join("audit.jsonl");
    let mut p = ProxyProcess::builder(format!("{}/mcp", ac.mcp_base()))
        .agent(&name)
        .token(&token)
        .arg("--audit-log", &audit)
        .arg("--metrics-listen", "127.0.0.1:0")
        .start();
    let steps = format!("list,send:impersonated:{other},read,pause:restart,send:after");
    let cmd = realenv::python_script(realenv::py1(), "audit_client.py", &[&p.url("/mcp"), "--steps", &steps]);
    let mut restart_took = Duration::ZERO;
    let run = realenv::run_paused("audit client", cmd, SCRIPT_LIMIT, |_| restart_took = ac.restart(false));
    wait_for_last(&audit, "session.deleted");
    let (metrics_status, metrics) = p.metrics_get("/metrics");
    let (health_status, health) = p.metrics_get("/healthz");
    let messages = ac.messages();
    let out = &run.json;

    let mut c = Checks::default();
    c.check(out["error"].is_null(), format!("the client failed: {}", out["error"]));
    for s in out["steps"].as_array().into_iter().flatten() {
        c.check(s.get("error").is_none() && s["is_error"] != json!(true), format!("client step failed: {s}"));
    }
    let session = out["session_id"].as_str().unwrap_or("").to_string();
    c.check(!session.is_empty(), "the client has no session id");
    c.eq("the client's session id at the end", &out["session_id_at_end"], &json!(session));

    // The client's own account: the JSON-RPC requests it sent, in order. The SDK also sent its
    // notifications/initialized and opened its standalone GET stream (neither is a request: no record), and
    // made no request beyond the steps' (no ping; no implicit tools/list before a call_tool, the tools being
    // listed first).
    let http = out["http"].as_array().cloned().unwrap_or_default();
    let requests: Vec<&Value> =
        http.iter().filter(|h| h["method"] == "POST" && !h["rpc_id"].is_null()).collect();
    let methods: Vec<&str> = requests.iter().map(|h| h["rpc_method"].as_str().unwrap_or("?")).collect();
    c.check(
        methods == ["initialize", "tools/list", "tools/call", "tools/call", "tools/call"],
        format!("the client's JSON-RPC requests: {methods:?}"),
    );
    c.check(
        http.iter().any(|h| h["rpc_method"] == "notifications/initialized" && h["status"] == 202),
        "the client sent no notifications/initialized answered 202",
    );
    c.check(
        http.iter().any(|h| h["method"] == "GET" && h["status"] == 200),
        "the client opened no GET stream",
    );
    c.check(
        http.iter().any(|h| h["method"] == "DELETE" && h["status"] == 200),
        "the client's closing DELETE was not answered 200",
    );
    let id = |i: usize| requests.get(i).map_or(Value::Null, |h| h["rpc_id"].clone());

    let records = read_records(&audit, &mut c);
    let want = vec![
        json!({"event": "session.created"}),
        answered(&id(0), "initialize", None, None),
        answered(&id(1), "tools/list", None, None),
        answered(&id(2), "tools/call", Some("chat_send"), Some(&other)),
        answered(&id(3), "tools/call", Some("chat_read"), None),
        // Before the retried call's own record: the re-initialisation happened within its exchange.
        json!({"event": "session.reinitialised", "result": "ok"}),
        answered(&id(4), "tools/call", Some("chat_send"), None),
        json!({"event": "session.deleted"}),
    ];
    let got: Vec<Value> = records.iter().map(shape).collect();
    c.check(got == want, format!("the records:\n{}want:\n{}", lines(&got), lines(&want)));
    let mut last_ts = String::new();
    for (i, r) in records.iter().enumerate() {
        c.eq(&format!("record {i}: agent"), &r["agent"], &json!(name));
        let ts = r["ts"].as_str().unwrap_or("");
        c.check(is_rfc3339_millis(ts) && *ts >= *last_ts, format!("record {i}: ts {ts:?} after {last_ts:?}"));
        last_ts = ts.to_string();
        // The initialize is sent outside any session (the client holds none yet): its record has no session
        // id; the session.created record just before it names the new one.
        let initialize = r["mcp.method.name"] == "initialize";
        let want_session = if initialize { Value::Null } else { json!(session) };
        c.eq(&format!("record {i} ({}): mcp.session.id", r["event"]), &r["mcp.session.id"], &want_session);
        if r["event"] == "request" {
            for k in ["duration_ms", "bytes_in", "bytes_out"] {
                c.check(r[k].is_u64(), format!("record {i}: {k} is not a count: {r}"));
            }
            c.check(
                r["bytes_in"].as_u64() > Some(0) && r["bytes_out"].as_u64() > Some(0),
                format!("record {i}: no bytes counted: {r}"),
            );
        }
    }

    // Said at warn once, naming both.
    let stderr = p.stderr_once("claims to be");
    let warned = format!(
        "tools/call of \"chat_send\" claims to be \"{other}\", not \"{name}\": stamped as \"{name}\""
    );
    let warns: Vec<&str> = stderr.lines().filter(|l| l.contains("claims to be")).collect();
    c.check(
        warns.len() == 1 && warns[0].contains(&warned) && warns[0].contains("WARN"),
        format!("the impersonation warn lines {warns:?}, want one with {warned:?}"),
    );

    // The counters agree with the records, and say what the session did.
    c.check(metrics_status == 200, format!("GET /metrics: {metrics_status}"));
    let have = samples(&metrics);
    let counted: BTreeMap<String, u64> = have
        .iter()
        .filter(|(k, v)| **v > 0 && COUNTED.iter().any(|f| k.starts_with(&format!("{f}{{"))))
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    c.check(
        counted == counted_from(&records),
        format!("/metrics counters {counted:#?}\nthe records count {:#?}", counted_from(&records)),
    );
    for (sample, n) in [
        ("mcp_proxy_requests_total{method=\"initialize\",outcome=\"ok\"}", 1),
        ("mcp_proxy_requests_total{method=\"tools/list\",outcome=\"ok\"}", 1),
        ("mcp_proxy_requests_total{method=\"tools/call\",outcome=\"ok\"}", 3),
        ("mcp_proxy_tool_calls_total{tool=\"chat_send\",outcome=\"ok\"}", 2),
        ("mcp_proxy_tool_calls_total{tool=\"chat_read\",outcome=\"ok\"}", 1),
        ("mcp_proxy_impersonation_attempts_total{tool=\"chat_send\"}", 1),
        ("mcp_proxy_session_reinitialisations_total{result=\"ok\"}", 1),
        ("mcp_proxy_session_reinitialisations_total{result=\"failed\"}", 0),
        ("mcp_proxy_audit_records_dropped_total", 0),
        // The DELETE forgot the session.
        ("mcp_proxy_sessions", 0),
    ] {
        c.check(have.get(sample) == Some(&n), format!("{sample}: {:?}, want {n}", have.get(sample)));
    }
    let health_json: Value = serde_json::from_str(&health).unwrap_or(Value::Null);
    c.check(
        health_status == 200 && health_json["status"] == "ok" && health_json["agent"] == json!(name),
        format!("GET /healthz: {health_status} {health}"),
    );

    // agentchattr stored both messages under the agent's real name (the token's), none under the claimed one.
    for text in ["impersonated", "after"] {
        let found: Vec<&Value> = messages.iter().filter(|m| m["text"] == text).collect();
        c.check(
            found.len() == 1 && found[0]["sender"] == json!(name),
            format!("agentchattr stored {text:?} as {found:?}, want once from {name:?}"),
        );
    }
    c.check(
        !messages.iter().any(|m| m["sender"] == json!(other)),
        format!("agentchattr stored a message from {other:?}"),
    );

    // A clean stop adds no record.
    let before_stop = std::fs::read_to_string(&audit).unwrap_or_default();
    p.stop();
    let status = p.wait_exit(Duration::from_secs(10));
    c.check(status.is_some_and(|s| s.success()), format!("the proxy's exit after SIGTERM: {status:?}"));
    let after_stop = std::fs::read_to_string(&audit).unwrap_or_default();
    c.check(
        after_stop == before_stop,
        format!("records written at shutdown: {:?}", &after_stop[before_stop.len().min(after_stop.len())..]),
    );

    eprintln!(
        "{TEST}: run.py restart {:.2}s, client {:.2}s, test {:.2}s wall",
        restart_took.as_secs_f64(),
        run.elapsed.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    c.finish(
        TEST,
        &[
            ("audit log", after_stop),
            ("/metrics", metrics),
            ("client JSON", serde_json::to_string_pretty(out).unwrap_or_default()),
            ("client stderr", run.stderr.clone()),
            ("proxy stderr", p.stderr_text()),
            ("agentchattr output", ac.log_text()),
        ],
    );
}

/// A stand-in answering each POST with one `message` event in a chunked event stream, as FastMCP does; for
/// the tool `hold` it then holds the body open (its last chunk comes 3 s later), for the rest it ends it.
fn event_upstream() -> StubUpstream {
    StubUpstream::start(|req, s| {
        let v: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
        let answer = match v["params"]["name"].as_str() {
            Some("hold") => {
                json!({"jsonrpc": "2.0", "id": v["id"], "result": {"content": [], "isError": true}})
            }
            _ => {
                json!({"jsonrpc": "2.0", "id": v["id"], "error": {"code": -32601, "message": "no such tool"}})
            }
        };
        let event = format!("event: message\r\ndata: {answer}\r\n\r\n");
        let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";
        let _ = std::io::Write::write_all(s, format!("{head}{:x}\r\n{event}\r\n", event.len()).as_bytes());
        if v["params"]["name"] == "hold" {
            std::thread::sleep(Duration::from_secs(3));
        }
        let _ = std::io::Write::write_all(s, b"0\r\n\r\n");
        Next::KeepAlive
    })
}

/// A client that closes once it has read its answer's event, the body not over (the SDKs do: they stop reading
/// at the answer), was answered: its record has the status it was sent (not the log's 499) and the outcome
/// the event said; an answer read whole is recorded the same way.
#[test]
fn a_client_that_leaves_after_its_answer_is_recorded_with_the_status_and_outcome_it_was_answered() {
    let up = event_upstream();
    let audit = scratch_dir("audit-leaves").join("audit.jsonl");
    let p = ProxyProcess::builder(up.url())
        .agent("agent-a")
        .token("tok-AUDIT-1")
        .arg("--audit-log", &audit)
        .arg("--metrics-listen", "127.0.0.1:0")
        .start();
    let call = |id: u32, tool: &str| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": tool, "arguments": {}}})
            .to_string()
    };
    let mut c = client(&p);
    c.send(&json_post(&host(&p), &[], call(5, "hold").as_bytes()));
    let (got, seen) = c.read_until(b"\"isError\":true}}\r\n\r\n", Duration::from_secs(5));
    assert!(got.is_some(), "the answer's event did not arrive: {:?}", String::from_utf8_lossy(&seen));
    drop(c);
    // Its record is made when the proxy sees the client leave: before the next exchange starts.
    wait_records(&audit, 1);
    let mut c = client(&p);
    c.send(&json_post(&host(&p), &[], call(6, "missing").as_bytes()));
    let resp = c.read_response("POST");
    assert_eq!(resp.status, 200, "{}", resp.raw_text());
    let records = wait_records(&audit, 2);
    let got: Vec<Value> = records.iter().map(shape).collect();
    let mut error = answered(&json!(6), "tools/call", Some("missing"), None);
    error["outcome"] = json!("error");
    error["error.type"] = json!("-32601");
    let mut tool_error = answered(&json!(5), "tools/call", Some("hold"), None);
    tool_error["outcome"] = json!("tool_error");
    assert_eq!(got, [tool_error, error], "records:\n{}stderr:\n{}", lines(&records), p.stderr_text());
    let (_, metrics) = p.metrics_get("/metrics");
    let have = samples(&metrics);
    for (sample, n) in &counted_from(&records) {
        assert_eq!(have.get(sample), Some(n), "{sample} in\n{metrics}");
    }
}

/// The calls the proxy answers itself are recorded as its answers: a hidden tool's (the policy) and one whose
/// body it cannot vouch for (two identities: refused, never forwarded); `/metrics` counts both refusals.
#[test]
fn calls_the_proxy_answers_itself_are_recorded_as_answered_by_the_proxy() {
    let up = event_upstream();
    let audit = scratch_dir("audit-refused").join("audit.jsonl");
    let p = ProxyProcess::builder(up.url())
        .agent("agent-a")
        .token("tok-AUDIT-2")
        .arg("--audit-log", &audit)
        .arg("--metrics-listen", "127.0.0.1:0")
        .arg("--deny-tool", "secret_*")
        .start();
    let hidden =
        br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"secret_tool","arguments":{}}}"#;
    let twice = br#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"chat_send","arguments":{"sender":"a","sender":"b"}}}"#;
    let mut answers = Vec::new();
    for body in [hidden.as_slice(), twice] {
        let mut c = client(&p);
        c.send(&json_post(&host(&p), &[], body));
        let resp = c.read_response("POST");
        let v: Value = serde_json::from_slice(&resp.body).unwrap_or(Value::Null);
        answers.push((resp.status, v["error"]["code"].clone()));
    }
    assert_eq!(answers[0], (200, json!(-32602)), "the hidden tool's call");
    assert_eq!(answers[1].0, 400, "the call with two identities: {answers:?}");
    assert_eq!(up.request_count(), 0, "a refused call reached the upstream");
    let records = wait_records(&audit, 2);
    let evidence = format!("records:\n{}stderr:\n{}", lines(&records), p.stderr_text());
    let mut want = answered(&json!(7), "tools/call", Some("secret_tool"), None);
    for (k, v) in [
        ("outcome", "refused"),
        ("error.type", "-32602"),
        ("answered_by", "proxy"),
        ("reason", "hidden_tool"),
    ] {
        want[k] = json!(v);
    }
    assert_eq!(records.first().map(shape), Some(want), "{evidence}");
    // The refused body's record: what the client was answered. No tool and no claim: they are read from the
    // stamp scan's plan, which a refused body does not get.
    let want = json!({
        "event": "request",
        "jsonrpc.request.id": 8,
        "mcp.method.name": "tools/call",
        "http.response.status_code": 400,
        "outcome": "refused",
        "error.type": answers[1].1.to_string(),
        "answered_by": "proxy",
        "reason": "refused_body",
    });
    assert_eq!(records.get(1).map(shape), Some(want), "{evidence}");
    assert_eq!(records.len(), 2, "{evidence}");
    let (_, metrics) = p.metrics_get("/metrics");
    let have = samples(&metrics);
    for reason in ["hidden_tool", "refused_body"] {
        let sample = format!("mcp_proxy_refusals_total{{reason=\"{reason}\"}}");
        assert_eq!(have.get(&sample), Some(&1), "{sample} in\n{metrics}");
    }
}

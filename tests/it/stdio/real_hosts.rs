//! Real hosts, a real server: the Python SDK's `stdio_client` (1.x, and 2.x
//! through `mcp.Client`) and the TypeScript SDK's `StdioClientTransport`
//! spawn the proxy with `--stdio` as their MCP server, in front of the real
//! agentchattr (`support::agentchattr`), driven step by step by
//! `tests/support/agentchattr_client.{py,cjs} --transport stdio`. The
//! session lists the tools, sends a `chat_send` claiming to be "mallory" and
//! reads the channel; then `run.py` is SIGKILLed and started again, its
//! registry kept or lost (the test then registers the agent again and
//! rewrites the proxy's `--identity-file`, as a wrapper would), a peer agent
//! posts a message through the web API, and the same session, never started
//! again, reads (the peer's message: agentchattr's read cursor skips the
//! reader's own, and a send moves it past what came before), sends and lists
//! once more.
//!
//! Asserted: what agentchattr stored (each message once, under the agent's
//! name of the moment), what the host read back, and in the proxy's audit
//! log that its one session was re-initialised upstream with no second
//! `initialize` from the host. Unix only: the venvs' bin/python.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::agentchattr::senders;
use crate::support::agentchattr::Agentchattr;
use crate::support::cases;
use crate::support::checks::{step, Checks};
use crate::support::proxy_process::{scratch_dir, BIN};
use crate::support::realenv::{self, ScriptRun};

/// Bound on one client run, pauses included (the script bounds itself at 60 s).
const SCRIPT_LIMIT: Duration = Duration::from_secs(90);
/// What the host claims to be; agentchattr stores the token's name.
const SPOOF_SENDER: &str = "mallory";
/// What a peer agent posts after the restart, for the host's next read.
const PEER_TEXT: &str = "from the peer, after the restart";
/// How long the proxy may take to read a rewritten identity file.
const IDENTITY_LIMIT: Duration = Duration::from_secs(10);
const STEPS: &str = "list:before,call:before,read:before,pause:restart,read:after,call:after,list:after";

#[derive(Clone, Copy, Debug)]
enum Host {
    /// Python SDK 1.x: `stdio_client` + `ClientSession`.
    Py1,
    /// Python SDK 2.x: `mcp.Client` on `StdioServerParameters`, mode "auto" (its `server/discover` is
    /// refused by agentchattr, under the id "server-error", and it falls back to `initialize`).
    Py2,
    /// TypeScript SDK: `StdioClientTransport`.
    Ts,
}

impl Host {
    fn command(self, proxy_argv: &str) -> std::process::Command {
        let args = [proxy_argv, "--steps", STEPS, "--sender", SPOOF_SENDER, "--transport", "stdio"];
        match self {
            Host::Py1 => realenv::python_script(realenv::py1(), "agentchattr_client.py", &args),
            Host::Py2 => realenv::python_script(realenv::py2(), "agentchattr_client.py", &args),
            Host::Ts => realenv::node_script("agentchattr_client.cjs", &args),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Registry {
    /// registry.json kept: the agent's token is still valid.
    Kept,
    /// registry.json removed: the agent registers again, and its new identity goes into the identity file.
    Lost,
}

/// `{"agent", "token"}` into `path` by an atomic rename, as a wrapper writes it.
fn write_identity(path: &Path, agent: &str, token: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, json!({"agent": agent, "token": token}).to_string()).expect("write identity");
    std::fs::rename(&tmp, path).expect("rename identity");
}

fn audit_records(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

/// The host's `read` step showed the message `text` from `sender`.
fn read_shows(c: &mut Checks, what: &str, rec: &Value, text: &str, sender: &str) {
    if rec.is_null() {
        c.failures.push(format!("{what}: never made"));
        return;
    }
    let messages = rec["result"].as_array().cloned().unwrap_or_default();
    let found = messages.iter().any(|m| m["text"] == text && m["sender"] == sender);
    c.check(
        found && rec["is_error"] == json!(false),
        format!("{what}: no message {text:?} from {sender} in {} (error {})", rec["result"], rec["error"]),
    );
}

fn stdio_session_survives_a_restart_of_run_py(test: &str, host: Host, registry: Registry) {
    let started = Instant::now();
    let mut ac = Agentchattr::start();
    let (name, token) = ac.register("claude");
    let dir = scratch_dir("stdio-host");
    let identity = dir.join("identity.json");
    let audit = dir.join("audit.jsonl");
    write_identity(&identity, &name, &token);
    let argv = json!([
        BIN,
        "--upstream",
        format!("{}/mcp", ac.mcp_base()),
        "--identity-file",
        identity,
        "--audit-log",
        audit,
        "--stdio",
    ]);
    let mut now_named = (name.clone(), token.clone());
    let mut identity_seen = None;
    let mut peer = String::new();
    let run: ScriptRun = realenv::run_paused(
        &format!("{host:?} stdio client"),
        host.command(&argv.to_string()),
        SCRIPT_LIMIT,
        |_| {
            let took = ac.restart(registry == Registry::Lost);
            eprintln!("{test}: run.py restarted in {:.2}s", took.as_secs_f64());
            if registry == Registry::Lost {
                now_named = ac.register("claude");
                write_identity(&identity, &now_named.0, &now_named.1);
                let deadline = Instant::now() + IDENTITY_LIMIT;
                while identity_seen.is_none() && Instant::now() < deadline {
                    identity_seen = audit_records(&audit)
                        .into_iter()
                        .find(|r| r["event"] == "identity.changed" && r["agent"] == now_named.0.as_str());
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            let (peer_name, peer_token) = ac.register("codex");
            let body = json!({"text": PEER_TEXT, "channel": "general"}).to_string();
            let auth = format!("Bearer {peer_token}");
            let fields = [("Authorization", auth.as_str()), ("Content-Type", "application/json")];
            let (status, answer) = ac.api("POST", "/api/send", &fields, body.as_bytes());
            assert_eq!(status, 200, "the peer's POST /api/send: {answer}");
            peer = peer_name;
        },
    );
    let out = &run.json;
    let messages = ac.messages();
    let records = audit_records(&audit);
    let (name_now, token_now) = now_named;

    let mut c = Checks::default();
    c.script_ran(out);
    if registry == Registry::Lost {
        c.check(token_now != token, "the second registration kept the old token");
        c.check(
            identity_seen.is_some(),
            format!("the proxy did not take the new identity in {IDENTITY_LIMIT:?}"),
        );
    }
    c.listed("tools/list before the restart", step(out, "list", "before"));
    let before = c.sent("chat_send before the restart", step(out, "call", "before"));
    read_shows(&mut c, "chat_read before the restart", step(out, "read", "before"), "before", &name);
    let after = c.sent("chat_send after the restart", step(out, "call", "after"));
    read_shows(&mut c, "chat_read after the restart", step(out, "read", "after"), PEER_TEXT, &peer);
    c.listed("tools/list after the restart", step(out, "list", "after"));
    c.stored_as(&messages, "before", &name, before);
    c.stored_as(&messages, "after", &name_now, after);
    let count = |event: &str| records.iter().filter(|r| r["event"] == event).count();
    c.check(
        count("session.created") == 1,
        format!("{} sessions created, want the host's one", count("session.created")),
    );
    let reinit: Vec<&Value> = records.iter().filter(|r| r["event"] == "session.reinitialised").collect();
    c.check(
        reinit.iter().any(|r| r["result"] == "ok"),
        format!("the proxy did not re-initialise the session after the restart: {reinit:?}"),
    );
    if matches!(host, Host::Py2) {
        // Its probe got agentchattr's 400 under the id "server-error", relayed under the probe's id.
        let probe = records.iter().find(|r| r["mcp.method.name"] == "server/discover");
        c.check(
            probe.is_some_and(|r| r["http.response.status_code"] == 400),
            format!("no server/discover answered 400 before initialize: {probe:?}"),
        );
    }
    let inits =
        records.iter().filter(|r| r["event"] == "request" && r["mcp.method.name"] == "initialize").count();
    c.check(inits == 1, format!("the host sent {inits} initialize requests, want 1"));
    let audit_text = std::fs::read_to_string(&audit).unwrap_or_default();
    eprintln!("{test}: {:.2}s wall", started.elapsed().as_secs_f64());
    c.finish(
        test,
        &[
            ("client JSON", serde_json::to_string_pretty(out).unwrap_or_default()),
            ("client stderr (the proxy's log)", run.stderr.clone()),
            ("the proxy's audit log", audit_text),
            ("agentchattr output (every generation)", ac.log_text()),
            ("agentchattr's history", senders(&messages)),
        ],
    );
}

cases! { stdio_session_survives_a_restart_of_run_py;
    python_sdk_1x_stdio_session_survives_a_restart_of_run_py_registry_kept => Host::Py1, Registry::Kept;
    python_sdk_1x_stdio_session_survives_a_restart_of_run_py_registry_lost => Host::Py1, Registry::Lost;
    python_sdk_2x_stdio_session_survives_a_restart_of_run_py_registry_kept => Host::Py2, Registry::Kept;
    python_sdk_2x_stdio_session_survives_a_restart_of_run_py_registry_lost => Host::Py2, Registry::Lost;
    typescript_sdk_stdio_session_survives_a_restart_of_run_py_registry_kept => Host::Ts, Registry::Kept;
    typescript_sdk_stdio_session_survives_a_restart_of_run_py_registry_lost => Host::Ts, Registry::Lost;
}

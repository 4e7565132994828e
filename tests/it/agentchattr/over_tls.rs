//! The real agentchattr behind a real TLS terminator: Debian's nginx serving agentchattr's MCP ports over
//! TLS with a certificate of a CA made by the openssl command at test time (`tls::certs`), the proxy in front
//! with `--upstream https://localhost:PORT/...` and `--ca-file`. Each real client's session goes through it;
//! each `chat_send` is read back from agentchattr under the agent's name. nginx is required: a missing one
//! fails the test, never skips it (`.ci/run` installs it).

use std::time::{Duration, Instant};

use super::*;
use crate::support::proxy_process::{token_file, ProxyProcess};
use crate::tls::{cert, Nginx};

/// One client session through the proxy and nginx to agentchattr: tools listed, a chat_send stored under
/// the registered agent's name.
fn session_over_tls(test: &str, sdk: Sdk, path: &str) {
    let started = Instant::now();
    let ac = Agentchattr::start();
    let nginx = Nginx::start(&[ac.http, ac.sse]);
    let (name, token) = ac.register("claude");
    let port = if path == "/sse" { nginx.ports[1] } else { nginx.ports[0] };
    let p = ProxyProcess::builder(format!("https://localhost:{port}{path}"))
        .agent(&name)
        .arg("--token-file", token_file(&token))
        .arg("--ca-file", cert("root.pem"))
        .start();
    let run = run_client(sdk, &p.url(path), "list:tls,call:over-tls", |_| {});
    let out = &run.json;
    let messages = ac.messages();
    let mut c = Checks::default();
    c.script_ran(out);
    c.listed("tools/list over TLS", step(out, "list", "tls"));
    let id = c.sent("chat_send over TLS", step(out, "call", "over-tls"));
    c.stored_as(&messages, "over-tls", &name, id);
    if path != "/sse" {
        c.one_session(out);
    }
    let log = p.stderr_text();
    c.check(!log.contains("TLS with upstream"), "a TLS failure was logged");
    eprintln!("{test}: {:.2}s wall", started.elapsed().as_secs_f64());
    c.finish(
        test,
        &[
            ("client JSON", serde_json::to_string_pretty(out).unwrap_or_default()),
            ("client stderr", run.stderr.clone()),
            ("proxy log", log),
            ("agentchattr output", ac.log_text()),
            ("agentchattr's history", senders(&messages)),
        ],
    );
}

#[test]
fn python_sdk_1x_session_over_https_through_nginx() {
    session_over_tls("python_sdk_1x_session_over_https_through_nginx", Sdk::Py1, "/mcp");
}

#[test]
fn python_sdk_2x_session_over_https_through_nginx() {
    session_over_tls("python_sdk_2x_session_over_https_through_nginx", Sdk::Py2, "/mcp");
}

#[test]
fn typescript_sdk_session_over_https_through_nginx() {
    session_over_tls("typescript_sdk_session_over_https_through_nginx", Sdk::Ts, "/mcp");
}

#[test]
fn legacy_sse_session_over_https_through_nginx() {
    session_over_tls("legacy_sse_session_over_https_through_nginx", Sdk::Py1Sse, "/sse");
}

/// run.py SIGKILLed and restarted under an open session, behind nginx: the next chat_send, in the client's same
/// session, reaches the restarted server through TLS (the proxy re-initialises the session agentchattr lost)
/// and is stored under the agent's name. (What nginx answers while run.py is down, 502, is nginx's: this
/// client calls only once the server is back.)
#[test]
fn python_sdk_1x_session_over_https_survives_a_restart_of_run_py() {
    const TEST: &str = "python_sdk_1x_session_over_https_survives_a_restart_of_run_py";
    let started = Instant::now();
    let mut ac = Agentchattr::start();
    let nginx = Nginx::start(&[ac.http]);
    let (name, token) = ac.register("claude");
    let p = ProxyProcess::builder(format!("https://localhost:{}/mcp", nginx.ports[0]))
        .agent(&name)
        .arg("--token-file", token_file(&token))
        .arg("--ca-file", cert("root.pem"))
        .start();
    let mut took = Duration::ZERO;
    let run =
        run_client(Sdk::Py1, &p.url("/mcp"), "call:before-restart,pause:restart,call:after-restart", |_| {
            took = ac.restart(false);
        });
    let out = &run.json;
    let messages = ac.messages();
    eprintln!("{TEST}: run.py restart {:.2}s", took.as_secs_f64());
    let mut c = Checks::default();
    c.script_ran(out);
    let before = c.sent("chat_send before the restart", step(out, "call", "before-restart"));
    let after = c.sent("chat_send after the restart", step(out, "call", "after-restart"));
    c.stored_as(&messages, "before-restart", &name, before);
    c.stored_as(&messages, "after-restart", &name, after);
    c.one_session(out);
    let log = p.stderr_text();
    c.check(
        log.contains("MCP session re-initialised on the upstream"),
        "the session was not re-initialised through TLS",
    );
    c.check(!log.contains("TLS with upstream"), "a TLS failure was logged");
    eprintln!("{TEST}: {:.2}s wall", started.elapsed().as_secs_f64());
    c.finish(
        TEST,
        &[
            ("client JSON", serde_json::to_string_pretty(out).unwrap_or_default()),
            ("client stderr", run.stderr.clone()),
            ("proxy log", log),
            ("agentchattr output", ac.log_text()),
            ("agentchattr's history", senders(&messages)),
        ],
    );
}

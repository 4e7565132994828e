//! The real agentchattr behind nginx TLS, reached through a real forward proxy: Debian's squid on loopback
//! (`forward_proxy::Squid`, its hosts file mapping `mcp.proxied.test` to 127.0.0.1), named by
//! `HTTPS_PROXY`; the proxy opens a CONNECT tunnel and checks nginx's certificate (`proxied.pem`, for
//! `mcp.proxied.test`) inside it. Each real client's session goes through it; each `chat_send` is read back
//! from agentchattr under the agent's name; squid's access log shows the tunnels and never the agent's token.
//! squid and nginx are required: a missing one fails the test, never skips it (`.ci/run` installs both).

use std::time::Instant;

use super::*;
use crate::forward_proxy::{through, Squid, AGENTCHATTR_HOST, PROXIED_HOST};
use crate::support::proxy_process::{token_file, ProxyProcess};
use crate::tls::{cert, Nginx};

/// The proxy in front of `https://mcp.proxied.test:PORT/mcp` through `squid`.
fn proxy_through(squid: &Squid, port: u16, name: &str, token: &str) -> ProxyProcess {
    ProxyProcess::builder(format!("https://{PROXIED_HOST}:{port}/mcp"))
        .agent(name)
        .arg("--token-file", token_file(token))
        .arg("--ca-file", cert("root.pem"))
        .envs(&through(squid).each_ref().map(|(k, v)| (*k, v.as_str())))
        .start()
}

/// What squid's access log must show once the proxy is gone: CONNECT lines to the upstream, and never the
/// agent's token (an https upstream: the proxy sees only the tunnel).
fn check_access_log(c: &mut Checks, squid: &Squid, port: u16, token: &str) -> String {
    let connect = format!("CONNECT {PROXIED_HOST}:{port}");
    let log = squid.access_log_once(&connect);
    c.check(log.contains(&connect), "squid's access log shows no CONNECT to the upstream");
    c.check(!log.contains(token), "the agent's token is in squid's access log");
    log
}

fn session_through_squid(test: &str, sdk: Sdk) {
    let started = Instant::now();
    let ac = Agentchattr::start();
    let nginx = Nginx::start_as("proxied", AGENTCHATTR_HOST, &[ac.http]);
    let squid = Squid::start();
    let (name, token) = ac.register("claude");
    let mut p = proxy_through(&squid, nginx.ports[0], &name, &token);
    let run = run_client(sdk, &p.url("/mcp"), "list:proxied,call:through-squid", |_| {});
    let out = &run.json;
    let messages = ac.messages();
    let mut c = Checks::default();
    c.script_ran(out);
    c.listed("tools/list through squid", step(out, "list", "proxied"));
    let id = c.sent("chat_send through squid", step(out, "call", "through-squid"));
    c.stored_as(&messages, "through-squid", &name, id);
    c.one_session(out);
    let log = p.stderr_text();
    c.check(log.contains("through the forward proxy 127.0.0.1:"), "the start's route line is missing");
    let failed = log.lines().any(|l| l.contains("WARN") && l.contains("forward proxy"));
    c.check(!failed, "a proxy failure was logged");
    c.check(!log.contains("TLS with upstream"), "a TLS failure was logged");
    p.stop();
    let access = check_access_log(&mut c, &squid, nginx.ports[0], &token);
    eprintln!("{test}: {:.2}s wall", started.elapsed().as_secs_f64());
    c.finish(
        test,
        &[
            ("client JSON", serde_json::to_string_pretty(out).unwrap_or_default()),
            ("client stderr", run.stderr.clone()),
            ("proxy log", log),
            ("squid's access log", access),
            ("agentchattr output", ac.log_text()),
            ("agentchattr's history", senders(&messages)),
        ],
    );
}

#[test]
fn python_sdk_1x_session_through_a_forward_proxy() {
    session_through_squid("python_sdk_1x_session_through_a_forward_proxy", Sdk::Py1);
}

#[test]
fn python_sdk_2x_session_through_a_forward_proxy() {
    session_through_squid("python_sdk_2x_session_through_a_forward_proxy", Sdk::Py2);
}

#[test]
fn typescript_sdk_session_through_a_forward_proxy() {
    session_through_squid("typescript_sdk_session_through_a_forward_proxy", Sdk::Ts);
}

/// run.py SIGKILLed and restarted under an open session, behind nginx and squid: the next chat_send, in the
/// client's same session, reaches the restarted server through the tunnel and is stored under the agent's
/// name (the proxy re-initialises the session agentchattr lost).
#[test]
fn python_sdk_1x_session_through_a_forward_proxy_survives_a_restart_of_run_py() {
    const TEST: &str = "python_sdk_1x_session_through_a_forward_proxy_survives_a_restart_of_run_py";
    let started = Instant::now();
    let mut ac = Agentchattr::start();
    let nginx = Nginx::start_as("proxied", AGENTCHATTR_HOST, &[ac.http]);
    let squid = Squid::start();
    let (name, token) = ac.register("claude");
    let mut p = proxy_through(&squid, nginx.ports[0], &name, &token);
    let steps = "call:before-restart,pause:restart,call:after-restart";
    let run = run_client(Sdk::Py1, &p.url("/mcp"), steps, |_| {
        ac.restart(false);
    });
    let out = &run.json;
    let messages = ac.messages();
    let mut c = Checks::default();
    c.script_ran(out);
    let before = c.sent("chat_send before the restart", step(out, "call", "before-restart"));
    let after = c.sent("chat_send after the restart", step(out, "call", "after-restart"));
    c.stored_as(&messages, "before-restart", &name, before);
    c.stored_as(&messages, "after-restart", &name, after);
    c.one_session(out);
    let log = p.stderr_text();
    c.check(log.contains("MCP session re-initialised on the upstream"), "the session was not re-initialised");
    p.stop();
    let access = check_access_log(&mut c, &squid, nginx.ports[0], &token);
    eprintln!("{TEST}: {:.2}s wall", started.elapsed().as_secs_f64());
    c.finish(
        TEST,
        &[
            ("client JSON", serde_json::to_string_pretty(out).unwrap_or_default()),
            ("client stderr", run.stderr.clone()),
            ("proxy log", log),
            ("squid's access log", access),
            ("agentchattr output", ac.log_text()),
            ("agentchattr's history", senders(&messages)),
        ],
    );
}

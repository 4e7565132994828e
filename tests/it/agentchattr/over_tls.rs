//! The real agentchattr behind a real TLS terminator: Debian's nginx serving agentchattr's MCP ports over
//! TLS with a certificate of a CA made by the openssl command at test time (`tls::certs`), the proxy in front
//! with `--upstream https://localhost:PORT/...` and `--ca-file`. Each real client's session goes through it;
//! each `chat_send` is read back from agentchattr under the agent's name. nginx is required: a missing one
//! fails the test, never skips it (`.ci/run` installs it).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::*;
use crate::support::agentchattr::free_port;
use crate::support::proxy_process::{scratch_dir, token_file, ProxyProcess};
use crate::tls::cert;

/// nginx terminating TLS for agentchattr's streamable HTTP and SSE ports (killed on drop).
struct Nginx {
    child: Child,
    /// TLS in front of `/mcp` and of `/sse`.
    mcp: u16,
    sse: u16,
}

impl Nginx {
    #[track_caller]
    fn start(ac: &Agentchattr) -> Nginx {
        let bin = ["/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/bin/nginx"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .expect("nginx is not installed (apt-get install -y nginx; .ci/run does)");
        let dir = scratch_dir("nginx-tls");
        let (mcp, sse) = (free_port(), free_port());
        let d = dir.display();
        let server = |port: u16, upstream: u16| {
            format!(
                "server {{ listen 127.0.0.1:{port} ssl; ssl_certificate {cert}; ssl_certificate_key {key};\n\
                 location / {{ proxy_pass http://127.0.0.1:{upstream}; proxy_http_version 1.1;\n\
                 proxy_set_header Connection \"\"; proxy_set_header Host $http_host; proxy_buffering off;\n\
                 proxy_request_buffering off; proxy_read_timeout 3600s; }} }}\n",
                cert = cert("localhost.pem"),
                key = cert("localhost.key"),
            )
        };
        let conf = format!(
            "worker_processes 1;\ndaemon off;\nmaster_process off;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
             events {{ worker_connections 256; }}\nhttp {{ access_log off;\n\
             client_body_temp_path {d}/body; proxy_temp_path {d}/proxy; fastcgi_temp_path {d}/fastcgi;\n\
             uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;\n{}{}}}\n",
            server(mcp, ac.http),
            server(sse, ac.sse),
        );
        std::fs::write(dir.join("nginx.conf"), conf).unwrap();
        let child = Command::new(bin)
            .args(["-p", &d.to_string(), "-c", "nginx.conf", "-e", &format!("{d}/error.log")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn nginx");
        let t0 = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", sse)).is_err() {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "nginx did not listen: {:?}",
                std::fs::read_to_string(dir.join("error.log"))
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Nginx { child, mcp, sse }
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One client session through the proxy and nginx to agentchattr: tools listed, a chat_send stored under
/// the registered agent's name.
fn session_over_tls(test: &str, sdk: Sdk, path: &str) {
    let started = Instant::now();
    let ac = Agentchattr::start();
    let nginx = Nginx::start(&ac);
    let (name, token) = ac.register("claude");
    let port = if path == "/sse" { nginx.sse } else { nginx.mcp };
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
    let nginx = Nginx::start(&ac);
    let (name, token) = ac.register("claude");
    let p = ProxyProcess::builder(format!("https://localhost:{}/mcp", nginx.mcp))
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

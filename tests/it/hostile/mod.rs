//! The adversarial suite: hostile clients (slowloris, floods, oversized or
//! smuggling requests), hostile upstreams (faults, floods, garbage), DNS
//! rebinding (Host and Origin checked), the exposed listener's client token,
//! limits, and secrets never leaking to logs or answers, against the real
//! binary. Every hostile exchange is followed by a healthy request on a new
//! connection that must succeed (sozu `h1_security_tests`).
//! The malformed-request table in `framing.rs` (CL+TE, two CLs, TE
//! `chunked, gzip`, obs-fold, space before colon, NUL, Host) is not
//! repeated here.

mod exposed;
mod limits;
mod pipelining;
mod policy;
mod rebinding;
mod secrets;
mod slowloris;
mod upstream_faults;

use std::io::{ErrorKind, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::support::exchange::{assert_healthy, assert_jsonrpc_error, client};
use crate::support::proxy_process::ProxyProcess;
use crate::support::wire::{Resp, StubUpstream};

const TOKEN: &str = "tok-HOSTILE-5e1f0c9a-SECRET";
const CLIENT_SECRET: &str = "client-secret-9b7d3e21-CLIENTSIDE";
const AGENT: &str = "claude-prime";

const SSE_HEAD: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache, no-transform\r\nTransfer-Encoding: chunked\r\n\r\n";

// ---------------------------------------------------------------- helpers

#[track_caller]
fn start_with(up: &StubUpstream, extra: &[&str], envs: &[(&str, &str)]) -> ProxyProcess {
    start_url(&up.url(), extra, envs)
}

/// This suite's identity (its own secret token) in front of `url`.
#[track_caller]
fn start_url(url: &str, extra: &[&str], envs: &[(&str, &str)]) -> ProxyProcess {
    ProxyProcess::builder(url).agent(AGENT).token(TOKEN).args(extra).envs(envs).start()
}

#[track_caller]
fn start(up: &StubUpstream) -> ProxyProcess {
    start_with(up, &[], &[])
}

/// Write all of `bytes`, ignoring a peer that stops reading or closes: a
/// hostile client keeps going whatever the proxy does.
fn write_ignoring_errors(s: &mut TcpStream, bytes: &[u8]) -> usize {
    let mut done = 0;
    while done < bytes.len() {
        match s.write(&bytes[done..]) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    done
}

/// Send `raw`, expect a JSON error with `status`, nothing upstream, a closed
/// connection (for 4xx that end the connection), then a healthy request.
#[track_caller]
fn assert_refused(p: &ProxyProcess, up: &StubUpstream, raw: &[u8], status: u16, must_close: bool) -> Resp {
    let (reqs, conns) = (up.request_count(), up.connections());
    let mut c = client(p);
    write_ignoring_errors(&mut c.stream, raw);
    let resp = c.read_response("GET");
    let shown = String::from_utf8_lossy(&raw[..raw.len().min(200)]).into_owned();
    assert_jsonrpc_error(&resp, status);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(up.request_count(), reqs, "refused request {shown:?} reached upstream: {:#?}", up.requests());
    assert_eq!(up.connections(), conns, "refused request {shown:?} made the proxy connect upstream");
    if must_close {
        assert!(
            c.closed_within(Duration::from_secs(3)),
            "connection still open after {status} for {shown:?}"
        );
    }
    assert_healthy(p, up);
    resp
}

// The descriptor-limit helpers are Linux-only (prlimit), and so are the
// tests built on them and on the /proc readers.

#[track_caller]
fn assert_alive(p: &mut ProxyProcess) {
    assert!(p.is_running(), "proxy died; stderr:\n{}", p.stderr_text());
}

/// Raise this process's soft RLIMIT_NOFILE to its hard limit (children
/// inherit it); returns the new soft limit.
#[cfg(target_os = "linux")]
fn raise_fd_limit() -> libc::rlim_t {
    let mut rl = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: plain getrlimit/setrlimit on a valid struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) != 0 {
            return 0;
        }
        if rl.rlim_cur < rl.rlim_max {
            let want = libc::rlimit { rlim_cur: rl.rlim_max, rlim_max: rl.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                rl.rlim_cur = rl.rlim_max;
            }
        }
    }
    rl.rlim_cur
}

/// Set another process's soft RLIMIT_NOFILE (hard limit unchanged).
#[cfg(target_os = "linux")]
fn set_fd_soft_limit(pid: u32, soft: libc::rlim_t) {
    let mut old = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: prlimit on a child of ours with valid structs.
    unsafe {
        assert_eq!(libc::prlimit(pid as libc::pid_t, libc::RLIMIT_NOFILE, std::ptr::null(), &mut old), 0);
        let new = libc::rlimit { rlim_cur: soft, rlim_max: old.rlim_max };
        assert_eq!(
            libc::prlimit(pid as libc::pid_t, libc::RLIMIT_NOFILE, &new, std::ptr::null_mut()),
            0,
            "prlimit: {}",
            std::io::Error::last_os_error()
        );
    }
}

//! A soak under faults: 16 clients calling a tool and 4 holding GET streams
//! through the proxy for a minute, while the upstream (a fake FastMCP server
//! whose sessions live in the memory of one process) is killed and restarted
//! on the same port every 2 to 5 s, sometimes staying down for 2 s first.
//!
//! Every request gets exactly one of these outcomes, each checked strictly:
//!
//! - answered: framed complete, for its id, with the result for its call;
//! - the server's 404: the restarted server lost the session, and the client
//!   initialises a new one (what the MCP specification asks of a client);
//! - a clean proxy error: 200 with a JSON-RPC error carrying the request's id
//!   (a request in a recorded session), 202 for a notification, or 502/504
//!   with a JSON-RPC error body;
//! - a visible cut: the connection closed before the response was complete,
//!   while the upstream was dying or down.
//!
//! Anything else fails the test: a wait past 10 s, an answer to another id or
//! with another result, a cut response framed as complete, a session id that
//! is not the client's own, a tools/call the upstream processed reaching it
//! again, an answer for a call the upstream never processed. Afterwards the
//! proxy's descriptors and RSS are back to their level before the soak.
//!
//! The fault schedule (intervals, and which restarts wait 2 s) is
//! pseudo-random from a seed printed at the start; `MCP_SOAK_SEED=0x...
//! cargo test --test it soak::` repeats it. The timing of the requests around
//! it varies from run to run, and so may whether a last restart fits in the
//! minute.

mod client_wire;
mod clients;
mod fake_fastmcp;
mod state;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[cfg(target_os = "linux")]
use crate::support::procfs::{fd_count, proc_stat, rss_kib};
use crate::support::proxy_process::{scratch_dir, ProxyProcess};
use crate::support::restarting::RestartingUpstream;
use clients::{spawn_clients, stop_clients, Run};
use fake_fastmcp::FakeFastMcp;
use state::{Failures, Outages, PanicGuard, Rng};

const CALLERS: usize = 16;
const STREAMERS: usize = 4;
/// The same load without faults before the soak, so that the "before"
/// figures include the proxy's working set at this concurrency (its slab,
/// buffer free list, session table) and the comparison measures only what
/// the faults leave behind.
const WARM_UP: Duration = Duration::from_secs(2);
const SOAK: Duration = Duration::from_secs(60);
const MIN_RESTARTS: u32 = 10;
/// The longest a request may wait for its outcome: clients give up after
/// 10 s, which is why `--restart-grace` defaults to 5.
const DEADLINE: Duration = Duration::from_secs(10);
/// Time for the proxy's idle timers to run down after the clients close:
/// above its 2 s upstream pool expiry.
const RUNDOWN: Duration = Duration::from_secs(3);
/// How long after an outage ended it still explains a request's cut or
/// proxy error: slack for the proxy learning a little late, on a loaded
/// machine, that a connection to the dead generation is closed.
const OUTAGE_MARGIN: Duration = Duration::from_millis(250);
/// Between two notifications on a GET stream.
const STREAM_EVERY: Duration = Duration::from_millis(400);
const DEFAULT_SEED: u64 = 0x5eed_50ac;

const AGENT: &str = "soak-agent";
const TOKEN: &str = "tok-SOAK-3c1d-SECRET";
const PROTOCOL: &str = "2025-06-18";

/// Sleep `d`, or less once a failure is recorded.
fn sleep_unless_failed(failures: &Failures, d: Duration) {
    let end = Instant::now() + d;
    while !failures.any() {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::sleep(left.min(Duration::from_millis(100)));
    }
}

/// The fault driver: kill the upstream every 2 to 5 s (one time in three it
/// stays down 2 s before it binds again) until `SOAK` has passed, with at
/// least `MIN_RESTARTS`; returns (restarts, restarts after 2 s down).
fn restart_now_and_then(
    up: &mut RestartingUpstream,
    outages: &Outages,
    failures: &Failures,
    seed: u64,
) -> (u32, u32) {
    let mut rng = Rng::new(seed);
    let start = Instant::now();
    let (mut restarts, mut long_stops) = (0, 0);
    while !failures.any() {
        let wait = rng.millis(2000, 5000);
        let down_for = if rng.below(3) == 0 { Duration::from_secs(2) } else { Duration::ZERO };
        if start.elapsed() + wait + down_for > SOAK && restarts >= MIN_RESTARTS {
            sleep_unless_failed(failures, SOAK.saturating_sub(start.elapsed()));
            break;
        }
        sleep_unless_failed(failures, wait);
        if failures.any() {
            break;
        }
        outages.begin();
        up.stop();
        std::thread::sleep(down_for);
        up.restart();
        outages.end();
        restarts += 1;
        long_stops += u32::from(!down_for.is_zero());
        eprintln!(
            "soak: restart {restarts} at {:.1} s (down {down_for:?}), generation {}",
            start.elapsed().as_secs_f64(),
            up.generations()
        );
    }
    (restarts, long_stops)
}

/// The proxy's open descriptors, VmRSS (KiB) and CPU time (s).
#[cfg(target_os = "linux")]
fn usage(p: &ProxyProcess) -> (usize, u64, f64) {
    (fd_count(p.pid()), rss_kib(p.pid()), proc_stat(p.pid()).1)
}

/// Fail with the failures, the summary and where the proxy's log went.
#[track_caller]
fn fail_with(p: &ProxyProcess, failures: &[String], summary: &str) -> ! {
    let log = scratch_dir("soak").join("proxy-stderr.log");
    let stderr = p.stderr_text();
    let _ = std::fs::write(&log, &stderr);
    let tail: Vec<&str> = stderr.lines().rev().take(40).collect();
    panic!(
        "{} failure(s), the first ones:\n  {}\n{summary}\nproxy log (RUST_LOG=debug) in {}; its last lines:\n{}",
        failures.len(),
        failures.iter().take(10).cloned().collect::<Vec<_>>().join("\n  "),
        log.display(),
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn every_request_gets_one_clean_outcome_through_a_minute_of_upstream_restarts() {
    let seed = std::env::var("MCP_SOAK_SEED")
        .ok()
        .and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok())
        .unwrap_or(DEFAULT_SEED);
    eprintln!("soak: seed {seed:#x} (MCP_SOAK_SEED={seed:#x} repeats the fault schedule)");
    let started = Instant::now();
    let failures = Arc::new(Failures::default());
    let server = Arc::new(FakeFastMcp::new(failures.clone()));
    let mut up = RestartingUpstream::start({
        let server = server.clone();
        move |req, s, gen| {
            let _guard = PanicGuard(&server.failures, "upstream".into());
            server.handle(req, s, gen)
        }
    });
    let mut p = ProxyProcess::builder(up.url()).agent(AGENT).token(TOKEN).arg("--restart-grace", "5").start();
    let outages = Arc::new(Outages::default());
    let issued = Arc::new(Mutex::default());
    let new_run = || {
        Arc::new(Run {
            port: p.port,
            stop: AtomicBool::new(false),
            failures: failures.clone(),
            outages: outages.clone(),
            issued: issued.clone(),
            counts: Mutex::default(),
            longest_wait: Mutex::default(),
            calls: Mutex::default(),
        })
    };

    let warm = new_run();
    let clients = spawn_clients(&warm, "warm", seed);
    sleep_unless_failed(&failures, WARM_UP);
    stop_clients(&warm, clients);
    if failures.any() {
        fail_with(&p, &failures.list(), &format!("warm-up: {}", warm.summary()));
    }
    std::thread::sleep(RUNDOWN);
    #[cfg(target_os = "linux")]
    let before = usage(&p);

    let soak = new_run();
    let clients = spawn_clients(&soak, "soak", seed);
    let soak_start = Instant::now();
    let (restarts, long_stops) = restart_now_and_then(&mut up, &outages, &failures, seed);
    // A last quiet second: the clients end in a healthy upstream.
    sleep_unless_failed(&failures, Duration::from_secs(1));
    stop_clients(&soak, clients);
    let soak_time = soak_start.elapsed();

    let processed = server.processed.lock().unwrap().clone();
    let longest = *soak.longest_wait.lock().unwrap();
    // Calls of the soak the upstream processed whose answer never came back
    // whole: each must have been cut or answered by the proxy, never resent.
    let unanswered = soak
        .calls
        .lock()
        .unwrap()
        .iter()
        .filter(|(tag, outcome)| processed.contains_key(*tag) && !outcome.starts_with("answered"))
        .count();
    let summary = format!(
        "soak summary: seed {seed:#x}, {:.1} s, {restarts} restarts ({long_stops} after 2 s down); {}; \
         longest wait {:.2} s; the upstream processed {} calls ({unanswered} of the soak's without an \
         answer back), {} delivered again",
        soak_time.as_secs_f64(),
        soak.summary(),
        longest.as_secs_f64(),
        processed.len(),
        server.again.load(Ordering::SeqCst)
    );
    eprintln!("{summary}");
    if failures.any() {
        fail_with(&p, &failures.list(), &summary);
    }
    // The calls seen from both ends: an answer is the upstream's, never
    // invented; a 404 means it was not processed; a call processed and not
    // answered was cut or answered by the proxy's outage error.
    for run in [&warm, &soak] {
        for (tag, outcome) in run.calls.lock().unwrap().iter() {
            let was_processed = processed.contains_key(tag);
            let consistent = match outcome.as_str() {
                "404" => !was_processed,
                o if o.starts_with("answered") => was_processed,
                _ => true,
            };
            assert!(consistent, "{tag}: {outcome}, processed upstream: {was_processed}\n{summary}");
        }
    }
    for tag in processed.keys() {
        let known =
            warm.calls.lock().unwrap().contains_key(tag) || soak.calls.lock().unwrap().contains_key(tag);
        assert!(known, "{tag} was processed upstream, but its client saw no outcome\n{summary}");
    }
    assert!(p.is_running(), "the proxy died; stderr:\n{}", p.stderr_text());

    // Not vacuous: the faults happened, bit, and the load went on through them.
    // No 404 is required: once the proxy reopens sessions itself they become rare.
    assert!(restarts >= MIN_RESTARTS && long_stops >= 1, "{summary}");
    assert!(soak.get("call", "answered json") > 0 && soak.get("call", "answered sse") > 0, "{summary}");
    let bitten = ["cut", "proxy error", "404"].iter().map(|o| soak.get("call", o)).sum::<u64>();
    assert!(bitten > 0, "no call met a restart: {summary}");
    assert!(soak.get("stream", "events") > 0, "{summary}");
    // The proxy holds a session's GET stream through a restart and
    // reattaches it: streams live on across outages instead of being cut.
    assert!(soak.get("stream", "held through a restart") > 0, "no GET stream outlived a restart: {summary}");
    assert!(soak.get("stream", "opened") >= STREAMERS as u64, "{summary}");

    std::thread::sleep(RUNDOWN);
    // Descriptors and memory from /proc: Linux only (the suite also runs
    // under wine, where the proxy is a Windows process).
    #[cfg(target_os = "linux")]
    {
        let after = usage(&p);
        eprintln!(
            "soak: proxy descriptors {} before, {} after; VmRSS {} KiB before, {} KiB after; \
             CPU {:.1} s during the soak",
            before.0,
            after.0,
            before.1,
            after.1,
            after.2 - before.2
        );
        // Slack of 2: an upstream connection pooled by a request that ended
        // just before the clients closed lives until the pool's 2 s expiry,
        // which RUNDOWN outlasts; the slack covers a late expiry on a loaded
        // machine, and is far below one leaked descriptor per restart (>= 10)
        // or per failed request (hundreds).
        assert!(
            after.0 <= before.0 + 2,
            "descriptors {} before the soak, {} after\n{summary}",
            before.0,
            after.0
        );
        // 2 MiB: the warm-up already took the working set to this load's
        // size, so what remains is allocator slack (a relay buffer grows to
        // 256 KiB while busy and a freed one may stay mapped), while a leak
        // of even 200 bytes per request over the ~12,000 requests of the
        // soak would pass it.
        assert!(
            after.1 <= before.1 + 2048,
            "VmRSS {} KiB before the soak, {} KiB after\n{summary}",
            before.1,
            after.1
        );
    }
    p.stop();
    eprintln!("soak: whole test {:.1} s", started.elapsed().as_secs_f64());
}

//! Is the proxy's user-space work per request small next to the kernel's?
//! Runs the pure path of one exchange N times, as `conn` runs it: parse the
//! client's head, read and stamp the body, edit the fields and write the
//! upstream head; parse the upstream's response head and write the client's
//! head. Counts heap allocations per exchange with a counting allocator, and
//! checks every written head against the expected bytes.
//!
//! The figure that matters is instructions per exchange, load-independent:
//! `valgrind --tool=callgrind --toggle-collect='head_path::exchange'
//! target/release/deps/head_path-* 10000` and divide the total by 10000
//! (`callgrind_annotate --inclusive=yes` splits it into request head,
//! body and response head). Without valgrind it prints ns per exchange,
//! which on a shared machine is only indicative.
//!
//! `cargo bench --bench head_path [-- N]`; exits 1 when a check fails or an
//! exchange allocates in steady state.

#[path = "util/body.rs"]
mod body;
use body::tools_call_body;
use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use mcp_identity_proxy::conn::editor::{self, Credentials, Outgoing, Route};
use mcp_identity_proxy::http::body::Decoder;
use mcp_identity_proxy::http::framing::Framing;
use mcp_identity_proxy::http::head::{parse_request_into, parse_response_into, RequestHead, ResponseHead};
use mcp_identity_proxy::http::write::{self, BodyField};
use mcp_identity_proxy::mcp::stamp::{Plan, StampMap};

/// The proxy's request body bound (`limits::MAX_STAMP_BODY`, crate-private).
const MAX_BODY: usize = 8 * 1024 * 1024;

/// Counts allocations (not frees) made through the global allocator.
struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards every call to `System` unchanged; only counts.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const AGENT: &str = "bench";
const BEARER: &[u8] = b"Bearer bench-token-0123456789abcdef";
const TOKEN: &[u8] = b"bench-token-0123456789abcdef";
const AUTHORITY: &[u8] = b"127.0.0.1:8200";

/// The request as the TypeScript SDK (undici fetch) sends it through the
/// proxy: the fields a real client sends, its credentials included.
fn request(body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "POST /mcp HTTP/1.1\r\nhost: 127.0.0.1:8100\r\nconnection: keep-alive\r\n\
         content-type: application/json\r\naccept: application/json, text/event-stream\r\n\
         mcp-session-id: 4f1c2a9e0b7d4e3f8a6c5d2e1f0a9b8c\r\nmcp-protocol-version: 2025-06-18\r\n\
         authorization: Bearer client-token-not-forwarded\r\naccept-language: *\r\n\
         sec-fetch-mode: cors\r\nuser-agent: node\r\naccept-encoding: gzip, deflate\r\n\
         content-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

/// The response head of a FastMCP (uvicorn) server in JSON-response mode.
const RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\ndate: Tue, 01 Dec 2026 00:00:00 GMT\r\nserver: uvicorn\r\n\
content-type: application/json\r\nmcp-session-id: 4f1c2a9e0b7d4e3f8a6c5d2e1f0a9b8c\r\n\
content-length: 200\r\n\r\n";

const WANT_REQUEST_HEAD: &[u8] = b"POST /mcp HTTP/1.1\r\nhost: 127.0.0.1:8200\r\n\
content-type: application/json\r\naccept: application/json, text/event-stream\r\n\
mcp-session-id: 4f1c2a9e0b7d4e3f8a6c5d2e1f0a9b8c\r\nmcp-protocol-version: 2025-06-18\r\n\
authorization: Bearer bench-token-0123456789abcdef\r\naccept-language: *\r\n\
sec-fetch-mode: cors\r\nuser-agent: node\r\nx-agent-token: bench-token-0123456789abcdef\r\n\
content-length: 317\r\n\r\n";

const WANT_RESPONSE_HEAD: &[u8] = b"HTTP/1.1 200 OK\r\ndate: Tue, 01 Dec 2026 00:00:00 GMT\r\n\
server: uvicorn\r\ncontent-type: application/json\r\n\
mcp-session-id: 4f1c2a9e0b7d4e3f8a6c5d2e1f0a9b8c\r\ncontent-length: 200\r\n\r\n";

/// What one exchange keeps across calls in `conn`: reused buffers and
/// heads.
struct Reused {
    req: RequestHead,
    resp: ResponseHead,
    body: Vec<u8>,
    head_out: Vec<u8>,
    to_client: Vec<u8>,
    plan: Plan,
}

/// Request side, as `Conn::parse_head`, `start_exchange`, `admission`,
/// `read_body` and `finish_request_head` do it (the head parsed into the
/// one the connection keeps).
#[inline(never)]
fn request_path(raw: &[u8], r: &mut Reused, stamps: &StampMap) -> usize {
    let Ok(true) = parse_request_into(raw, &mut r.req) else { return 0 };
    let req = &mut r.req;
    // start_exchange and admission read these.
    let client_host: smallvec::SmallVec<[u8; 32]> =
        req.headers.get(b"host").map(smallvec::SmallVec::from_slice).unwrap_or_default();
    black_box(req.headers.get(b"authorization"));
    black_box(req.headers.get(b"origin"));
    let method = req.method.clone();
    let target = req.target.clone();
    let framed = req.framing != Framing::None;
    let headers = &mut req.headers;
    r.body.clear();
    if let Some(mut decoder) = Decoder::for_request(req.framing) {
        let rest = raw.get(req.len..).unwrap_or_default();
        if decoder.read_bounded(rest, &mut r.body, MAX_BODY).is_err() || !decoder.is_done() {
            return 0;
        }
    }
    let out = Outgoing { method: &method, target: &target, framed };
    let who = Credentials { agent: AGENT, bearer: BEARER, token: TOKEN, dpop: None };
    let route = Route { authority: AUTHORITY, stamps };
    if editor::plan_request(&out, headers, &r.body, &who, &route, &mut r.head_out, &mut r.plan).is_err() {
        return 0;
    }
    black_box(&client_host);
    r.head_out.len()
}

/// Response side, as `Conn::read_response_head` does it for a
/// Content-Length response to a keep-alive HTTP/1.1 client: parse, the
/// response edits, the head written by `write::response_head`.
#[inline(never)]
fn response_path(raw: &[u8], r: &mut Reused) -> usize {
    let Ok(true) = parse_response_into(raw, false, &mut r.resp) else { return 0 };
    let resp = &mut r.resp;
    editor::edit_response(&mut resp.headers, AUTHORITY, b"127.0.0.1:8100");
    let field = match resp.framing {
        Framing::Length(n) => BodyField::Length(n),
        _ => BodyField::Chunked,
    };
    let t = &mut r.to_client;
    t.clear();
    write::response_head(t, resp.status, &resp.reason, &resp.headers, field, false);
    t.len()
}

#[inline(never)]
fn exchange(req: &[u8], resp: &[u8], r: &mut Reused, stamps: &StampMap) -> usize {
    request_path(black_box(req), r, stamps) + response_path(black_box(resp), r)
}

fn main() -> ExitCode {
    let n: u64 = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(200_000);
    let stamps = StampMap::agentchattr();
    let body = tools_call_body();
    let req = request(&body);
    let mut r = Reused {
        req: RequestHead::default(),
        resp: ResponseHead::default(),
        body: Vec::with_capacity(4096),
        head_out: Vec::with_capacity(4096),
        to_client: Vec::with_capacity(4096),
        plan: Plan::default(),
    };
    // Warm up, then check the answer once.
    exchange(&req, RESPONSE, &mut r, &stamps);
    let mut failed = false;
    if r.head_out != WANT_REQUEST_HEAD {
        println!("CHECK FAILED: upstream head\n{}", String::from_utf8_lossy(&r.head_out));
        failed = true;
    }
    if r.to_client != WANT_RESPONSE_HEAD {
        println!("CHECK FAILED: client head\n{}", String::from_utf8_lossy(&r.to_client));
        failed = true;
    }
    let stamped = r.plan.apply(&r.body);
    if !stamped.windows(16).any(|w| w == br#""sender":"bench""#) {
        println!("CHECK FAILED: body not stamped");
        failed = true;
    }
    let want = r.head_out.len() + r.to_client.len();
    let before = ALLOCS.load(Ordering::Relaxed);
    let t0 = Instant::now();
    for _ in 0..n {
        if exchange(&req, RESPONSE, &mut r, &stamps) != want {
            failed = true;
        }
    }
    let elapsed = t0.elapsed();
    let allocs = ALLOCS.load(Ordering::Relaxed) - before;
    println!(
        "head_path: {n} exchanges ({} B request, {} B response head): {:.0} ns/exchange (wall clock, indicative), \
         {:.2} allocations/exchange",
        req.len(),
        RESPONSE.len(),
        elapsed.as_nanos() as f64 / n.max(1) as f64,
        allocs as f64 / n.max(1) as f64
    );
    if failed {
        println!("CHECK FAILED: an exchange wrote other bytes");
        return ExitCode::FAILURE;
    }
    if allocs > 0 {
        println!("CHECK FAILED: {allocs} allocations in {n} exchanges (steady state must allocate nothing)");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

//! Decides whether identity stamping by span scanning and splicing is worth its code over parsing the body with serde_json and re-serialising it (it must be at least 3x faster; the bench exits non-zero below that).
//!
//! Measures scan + plan + apply of `mcp::stamp` on a ~300-byte tools/call
//! and on a 64 KiB one (plus an escape-dense 64 KiB worst case, reported
//! but not gated), against `serde_json::from_slice::<Value>`, setting
//! `arguments.sender`, and `serde_json::to_vec` on the same bodies in the
//! same run. Each loop checks its answer. Exits 1 when a ratio is below 3.
//!
//! Run: `cargo bench --bench stamp`.

use std::hint::black_box;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use mcp_identity_proxy::mcp::stamp::{plan, StampMap};

const AGENT: &str = "claude-prime";
const MIN_RATIO: f64 = 3.0;
const RUN_FOR: Duration = Duration::from_millis(1500);

fn small_body() -> Vec<u8> {
    br#"{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"name":"chat_send","arguments":{"sender":"spoofed-agent","message":"Reviewed the patch: two nits in conn.rs, otherwise good to merge.","choices":[],"channel":"general","reply_to":1187},"_meta":{"progressToken":42}}}"#.to_vec()
}

/// Wraps a chat message of about 64 KiB made of `lines` in a chat_send.
fn chat_send_of(lines: &[&str]) -> Vec<u8> {
    let mut message = String::new();
    for line in lines.iter().cycle() {
        if message.len() + line.len() > 64 * 1024 - 200 {
            break;
        }
        message.push_str(line);
    }
    format!(
        r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"chat_send","arguments":{{"sender":"spoofed-agent","message":"{message}","channel":"general"}}}}}}"#
    )
    .into_bytes()
}

/// A 64 KiB agent report as an LLM writes it: markdown lines, a newline
/// escape each, quotes and non-ASCII now and then, a code block.
fn report_body() -> Vec<u8> {
    chat_send_of(&[
        r#"## Review of the relay phase\n\n"#,
        r#"- The \"Relay\" phase keeps one buffer per direction and never copies a body twice.\n"#,
        r#"- Backpressure lives in interest alone: a full buffer stops reading on one side.\n"#,
        r#"- Naïve question — why does `drive(now)` return a verdict instead of closing itself?\n"#,
        r#"- Timeouts: connect 5 s, response 300 s, idle 300 s; all three are configurable.\n"#,
        r#"```rust\nlet n = buf.fill(&mut sock)?;\nif n == 0 { return Verdict::Close(\"eof\"); }\n```\n"#,
        r#"The tests pass on my machine (17 integration, 212 unit); the bench is at 1.4x nginx.\n"#,
    ])
}

/// The worst case found: an escape or a CJK character every ~10 bytes.
/// Reported, not gated: it shows where splicing stops paying.
fn dense_body() -> Vec<u8> {
    chat_send_of(&[
        r#"Line of the report: \"quoted\" path C:\\tmp, caf\u00e9, 日本語 ✓, tab\there, value 1.5e3.\n"#,
    ])
}

/// Runs `f` repeatedly for `RUN_FOR` and returns MB/s over `len` bytes.
fn throughput(len: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..10 {
        f();
    }
    let start = Instant::now();
    let mut iters = 0u64;
    while start.elapsed() < RUN_FOR {
        for _ in 0..16 {
            f();
        }
        iters += 16;
    }
    (len as f64 * iters as f64) / start.elapsed().as_secs_f64() / 1e6
}

fn splice_path(body: &[u8], map: &StampMap) -> f64 {
    let mut quoted = Vec::new();
    mcp_identity_proxy::mcp::json::write_json_string(AGENT, &mut quoted);
    throughput(body.len(), || {
        let p = plan(black_box(body), black_box(AGENT), map).expect("bench body stamps");
        let out = p.apply(body);
        let s = &p.splices()[0];
        assert_eq!(&out[s.start..s.start + s.insert.len()], &quoted[..]);
        black_box(out);
    })
}

fn serde_path(body: &[u8]) -> f64 {
    throughput(body.len(), || {
        let mut v: serde_json::Value = serde_json::from_slice(black_box(body)).expect("bench body parses");
        v["params"]["arguments"]["sender"] = serde_json::Value::from(black_box(AGENT));
        let out = serde_json::to_vec(&v).expect("serialises");
        assert!(out.len() > body.len() / 2);
        black_box(out);
    })
}

fn main() -> ExitCode {
    let map = StampMap::agentchattr();
    let mut ok = true;
    let bodies = [
        ("300 B", small_body(), true),
        ("64 KiB", report_body(), true),
        ("64 KiB dense", dense_body(), false),
    ];
    for (name, body, gated) in bodies {
        // The two paths must agree before their speed means anything.
        let stamped = plan(&body, AGENT, &map).expect("stamps").apply(&body);
        let ours: serde_json::Value = serde_json::from_slice(&stamped).expect("valid");
        let mut theirs: serde_json::Value = serde_json::from_slice(&body).expect("valid");
        theirs["params"]["arguments"]["sender"] = AGENT.into();
        assert_eq!(ours, theirs);

        let splice = splice_path(&body, &map);
        let serde = serde_path(&body);
        let ratio = splice / serde;
        let need = if gated { format!("need >= {MIN_RATIO}x") } else { "not gated".to_owned() };
        println!(
            "stamp {name:>12} ({:5} bytes): splice {splice:7.1} MB/s | serde_json {serde:6.1} MB/s | ratio {ratio:4.2}x ({need})",
            body.len()
        );
        ok &= !gated || ratio >= MIN_RATIO;
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        eprintln!("stamp: splicing is less than {MIN_RATIO}x faster than serde_json");
        ExitCode::FAILURE
    }
}

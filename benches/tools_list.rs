//! What rewriting a `tools/list` answer costs. Splicing is not a speed choice here (the rewrite must keep every
//! other byte as the server sent it, which re-serialising cannot), so the bench only checks that it is not
//! slower than parsing with serde_json, filtering the tree and re-serialising it (at least 1.2x faster; it exits
//! non-zero below that), and gives the instruction figure.
//!
//! Rewrites agentchattr's answer (12 tools, about 10 KB, as agentchattr
//! sends it) and one with a renamed copy of each tool (24 tools, about
//! 20 KB, the copies learned as new stamps) for the policy:
//! `--deny-tool '*chat_rules' --deny-tool '*chat_decision'`, the default
//! stamp map, `sender` learned, identity parameters hidden. Each loop
//! checks its answer. `scan_once` (one `json::parse_value` of the list) is
//! the floor: what one validating pass over the bytes costs.
//!
//! The figure that matters is instructions per rewrite, load-independent:
//! `valgrind --tool=callgrind --toggle-collect='*rewrite_list*'
//! target/release/deps/tools_list-* 1000 10k` (built with
//! `CARGO_PROFILE_RELEASE_STRIP=false` so the symbol is there), then the
//! total divided by 1002 (the loop and two checks); `20k` for the other
//! list, `--toggle-collect='*scan_once*'` for the floor. Without valgrind it
//! prints ns per rewrite and the ratio to serde_json, which on a shared
//! machine is only indicative.
//!
//! `cargo bench --bench tools_list [-- N [10k|20k]]`.

#[path = "util/tools_list.rs"]
mod fixture;

use std::hint::black_box;
use std::process::ExitCode;
use std::time::Instant;

use mcp_identity_proxy::mcp::json;
use mcp_identity_proxy::mcp::stamp::StampMap;
use mcp_identity_proxy::mcp::tools::{rewrite_list, ListOptions, Policy, ToolFlags};

const MIN_RATIO: f64 = 1.2;

fn policy() -> Policy {
    Policy::from_flags(&ToolFlags {
        allow: None,
        deny: vec!["*chat_rules".into(), "*chat_decision".into()],
        show_identity_params: false,
        identity_params: vec!["sender".into()],
    })
}

const OPTIONS: ListOptions = ListOptions { learn_room: 256, insert_cache_scope: false };

/// The rewrite as the proxy runs it: the edits, then the rewritten bytes.
/// Returns the output's length and the number of stamps learned.
fn rewrite_once(list: &[u8], policy: &Policy, map: &StampMap) -> (usize, usize) {
    let edit = rewrite_list(black_box(list), policy, map, OPTIONS).expect("bench list rewrites");
    let out = edit.apply(list);
    (black_box(out).len(), edit.learned().len())
}

/// One validating pass over the list: the floor of any rewrite.
#[inline(never)]
fn scan_once(list: &[u8]) -> usize {
    json::parse_value(black_box(list)).expect("bench list is JSON").end
}

/// The same rules on a serde_json tree (learning left out: it only makes
/// serde_json look better).
fn serde_once(list: &[u8], policy: &Policy, map: &StampMap) -> usize {
    let mut v: serde_json::Value = serde_json::from_slice(black_box(list)).expect("bench list parses");
    let tools = v["result"]["tools"].as_array_mut().expect("tools");
    tools.retain(|t| policy.allows(t["name"].as_str().unwrap_or_default()));
    for t in tools.iter_mut() {
        let name = t["name"].as_str().unwrap_or_default().to_owned();
        let param = map.param_for(name.as_bytes()).unwrap_or("sender").to_owned();
        let schema = &mut t["inputSchema"];
        if let Some(props) = schema["properties"].as_object_mut() {
            props.remove(&param);
        }
        if let Some(req) = schema["required"].as_array_mut() {
            req.retain(|e| e.as_str() != Some(&param));
        }
    }
    serde_json::to_vec(&v).expect("serialises").len()
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2000);
    let only = args.next();
    let map = StampMap::agentchattr();
    let policy = policy();
    let mut ok = true;
    for (label, copies, learned) in [("10k", 1, 0), ("20k", 2, 9)] {
        if only.as_deref().is_some_and(|o| o != label) {
            continue;
        }
        let list = fixture::agentchattr_tools_list(2, copies);
        // The answer every loop must give.
        let want = rewrite_once(&list, &policy, &map);
        assert_eq!(want.1, learned);
        let out = rewrite_list(&list, &policy, &map, OPTIONS).expect("rewrites").apply(&list);
        assert!(!out.windows(8).any(|w| w == b"\"sender\""), "a sender property is left");

        let start = Instant::now();
        for _ in 0..n {
            assert_eq!(rewrite_once(&list, &policy, &map), want);
        }
        let splice = start.elapsed().as_nanos() as f64 / n as f64;
        let start = Instant::now();
        for _ in 0..n {
            assert_eq!(scan_once(&list), list.len());
        }
        let scan = start.elapsed().as_nanos() as f64 / n as f64;
        let start = Instant::now();
        for _ in 0..n.div_ceil(4) {
            assert!(serde_once(&list, &policy, &map) > out.len() / 2);
        }
        let serde = start.elapsed().as_nanos() as f64 / n.div_ceil(4) as f64;
        let ratio = serde / splice;
        println!(
            "tools_list {label} ({} -> {} bytes, {learned} learned): splice {splice:7.0} ns | one scan {scan:6.0} ns | serde_json {serde:7.0} ns | ratio {ratio:4.2}x (need >= {MIN_RATIO}x)",
            list.len(),
            out.len(),
        );
        ok &= ratio >= MIN_RATIO;
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        eprintln!("tools_list: splicing is less than {MIN_RATIO}x faster than serde_json");
        ExitCode::FAILURE
    }
}

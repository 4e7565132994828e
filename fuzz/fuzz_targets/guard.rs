//! Defends the DNS-rebinding guard (Host and Origin must name this proxy;
//! MCP 2025-11-25 transports require servers to validate Origin) and the
//! client-token check: no
//! panic on any value, `host_allowed` and `origin_allowed` agree with naive
//! twins built from `format!`, and a `Bearer <secret>` built from the input
//! matches that secret. The first two bytes are the listening port.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_identity_proxy::http::guard::{bearer_matches, host_allowed, origin_allowed};

const HOSTS: [&str; 3] = ["127.0.0.1", "localhost", "[::1]"];

fn naive_host_allowed(host: &[u8], port: u16) -> bool {
    // Port 0 is never a listening port, so no Host may name it.
    port != 0 && HOSTS.iter().any(|h| format!("{h}:{port}").as_bytes().eq_ignore_ascii_case(host))
}

fn naive_origin_allowed(origin: &[u8]) -> bool {
    for scheme in ["http", "https"] {
        for host in HOSTS {
            let base = format!("{scheme}://{host}");
            if base.as_bytes().eq_ignore_ascii_case(origin) {
                return true;
            }
            let Some(head) = origin.get(..base.len() + 1) else {
                continue;
            };
            if !head.eq_ignore_ascii_case(format!("{base}:").as_bytes()) {
                continue;
            }
            let digits = String::from_utf8_lossy(&origin[base.len() + 1..]);
            if let Ok(port) = digits.parse::<u16>() {
                if port != 0 && port.to_string() == digits {
                    return true;
                }
            }
        }
    }
    false
}

fuzz_target!(|data: &[u8]| {
    let (port, value) = match data {
        [hi, lo, rest @ ..] => (u16::from_be_bytes([*hi, *lo]), rest),
        _ => return,
    };
    assert_eq!(host_allowed(value, port), naive_host_allowed(value, port));
    assert_eq!(origin_allowed(value, &[]), naive_origin_allowed(value));
    assert!(origin_allowed(value, &[value]) || value.is_empty());

    let _ = bearer_matches(value, b"s3cret");
    let header = [&b"Bearer "[..], value].concat();
    let plain = matches!(value.first(), Some(b) if *b != b' ')
        && matches!(value.last(), Some(b) if *b != b' ' && *b != b'\t');
    assert_eq!(bearer_matches(&header, value), plain);
});

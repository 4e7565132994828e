//! Defends the NO_PROXY reader and matcher: no panic on any list and host;
//! `*` alone matches every host; a list matches exactly when one of its
//! entries, alone, does (order and the other entries change nothing); case
//! never matters.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_identity_proxy::route::no_proxy::NoProxy;
use mcp_identity_proxy::url::Host;

fuzz_target!(|data: &[u8]| {
    let [split, p0, p1, rest @ ..] = data else { return };
    let at = usize::from(*split).min(rest.len());
    let (list, host) = rest.split_at(at);
    let (Ok(list), Ok(host)) = (std::str::from_utf8(list), std::str::from_utf8(host)) else { return };
    let port = u16::from_be_bytes([*p0, *p1]);
    let host = match host.trim_start_matches('[').trim_end_matches(']').parse() {
        Ok(ip) => Host::Ip(ip),
        Err(_) => Host::Name(host.to_string()),
    };
    let all = NoProxy::parse(list).matches(&host, port);
    if list.trim_matches([' ', '\t']) == "*" {
        assert!(all);
        return;
    }
    let any_entry = list
        .split(',')
        .filter(|e| e.trim_matches([' ', '\t']) != "*")
        .any(|e| NoProxy::parse(e).matches(&host, port));
    assert_eq!(all, any_entry, "{list:?} {host:?}:{port}");
    let reversed: Vec<&str> = list.split(',').rev().collect();
    assert_eq!(NoProxy::parse(&reversed.join(",")).matches(&host, port), all);
    assert_eq!(NoProxy::parse(&list.to_ascii_uppercase()).matches(&host, port), all);
});

//! `NO_PROXY` as curl reads it: a comma-separated list (blanks around
//! entries tolerated), `*` alone for every host; a name entry matches that
//! name and its subdomains (`example.com` matches `www.example.com`, never
//! `www.badexample.com`), a leading `.` or `*.` changes nothing, trailing
//! dots are ignored, case never matters; an IP entry (IPv4 or IPv6, with or
//! without brackets) matches that address, a CIDR entry (`10.0.0.0/8`,
//! `fd00::/8`) the addresses in its range. An entry may end in `:PORT`
//! (`[::1]:8443`, `example.com:443`): it then matches that port only.
//! Names are never resolved: an IP entry matches an upstream given as an
//! IP address, a name entry one given as a name. Entries that fit none of
//! these forms never match. Pure.

use crate::url::Host;
use std::net::IpAddr;

/// A parsed `NO_PROXY` value.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NoProxy {
    /// `*` alone: every host goes direct.
    all: bool,
    entries: Vec<Entry>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    pattern: Pattern,
    /// `:PORT` given: only that port matches.
    port: Option<u16>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Pattern {
    /// Lowercase, without leading `.`/`*.` or trailing dots.
    Name(String),
    /// An address and how many leading bits must agree (32 or 128 for a
    /// bare address).
    Net(IpAddr, u8),
}

impl NoProxy {
    /// Reads a `NO_PROXY` value; never fails (an entry that fits no form
    /// is kept out).
    pub fn parse(value: &str) -> NoProxy {
        if value.trim_matches(is_blank) == "*" {
            return NoProxy { all: true, entries: Vec::new() };
        }
        let entries = value.split(',').map(|e| e.trim_matches(is_blank)).filter_map(entry).collect();
        NoProxy { all: false, entries }
    }

    /// Whether `host:port` goes direct.
    pub fn matches(&self, host: &Host, port: u16) -> bool {
        self.all
            || self.entries.iter().any(|e| {
                e.port.map_or(true, |p| p == port)
                    && match (&e.pattern, host) {
                        (Pattern::Name(pattern), Host::Name(name)) => name_matches(pattern, name),
                        (Pattern::Net(net, bits), Host::Ip(ip)) => in_net(*ip, *net, *bits),
                        _ => false,
                    }
            })
    }

    /// Nothing in it (unset, empty, or only entries that fit no form).
    pub fn is_empty(&self) -> bool {
        !self.all && self.entries.is_empty()
    }
}

fn is_blank(c: char) -> bool {
    c == ' ' || c == '\t'
}

/// One list entry, or `None` when it fits no form.
fn entry(text: &str) -> Option<Entry> {
    if text.is_empty() {
        return None;
    }
    // `[v6]`, `[v6]:port`, `[v6]/bits`, `[v6/bits]`, with `:port` last.
    if let Some(inner) = text.strip_prefix('[') {
        let (inside, after) = inner.split_once(']')?;
        let (after_bits, port) = match after.split_once(':') {
            Some((a, p)) => (a, Some(port_number(p)?)),
            None => (after, None),
        };
        let (addr, bits) = match (inside.split_once('/'), after_bits.strip_prefix('/')) {
            (Some((a, b)), None) if after_bits.is_empty() => (a, Some(prefix_len(b)?)),
            (None, Some(b)) => (inside, Some(prefix_len(b)?)),
            (None, None) if after_bits.is_empty() => (inside, None),
            _ => return None,
        };
        let ip: IpAddr = addr.parse().ok()?;
        return Some(Entry { pattern: net(ip, bits)?, port });
    }
    // A bare IPv6 address or range (several colons: no port possible).
    if text.matches(':').count() > 1 {
        let (addr, bits) = match text.split_once('/') {
            Some((a, b)) => (a, Some(prefix_len(b)?)),
            None => (text, None),
        };
        let ip: IpAddr = addr.parse().ok()?;
        return Some(Entry { pattern: net(ip, bits)?, port: None });
    }
    let (rest, port) = match text.rsplit_once(':') {
        Some((rest, p)) => (rest, Some(port_number(p)?)),
        None => (text, None),
    };
    // IPv4, with `/bits` maybe.
    let (addr, bits) = match rest.split_once('/') {
        Some((a, b)) => (a, Some(prefix_len(b)?)),
        None => (rest, None),
    };
    if let Ok(ip) = addr.parse::<IpAddr>() {
        return Some(Entry { pattern: net(ip, bits)?, port });
    }
    if bits.is_some() {
        return None;
    }
    let name = rest.strip_prefix("*.").or_else(|| rest.strip_prefix('.')).unwrap_or(rest);
    let name = name.trim_end_matches('.');
    // What a host name may hold (as `url` takes it): a `*` elsewhere, a
    // blank inside, is no pattern.
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b)) {
        return None;
    }
    Some(Entry { pattern: Pattern::Name(name.to_ascii_lowercase()), port })
}

/// The prefix length of a CIDR entry: decimal digits only, at most 3.
fn prefix_len(digits: &str) -> Option<u8> {
    if digits.is_empty() || digits.len() > 3 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// A port of an entry: decimal digits only, 1-65535.
fn port_number(digits: &str) -> Option<u16> {
    if digits.is_empty() || digits.len() > 5 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().filter(|&p| p != 0)
}

/// `ip/bits` (the whole address when no prefix); a prefix past the
/// address's width fits no form.
fn net(ip: IpAddr, bits: Option<u8>) -> Option<Pattern> {
    let width = if ip.is_ipv4() { 32 } else { 128 };
    let bits = bits.unwrap_or(width);
    (bits <= width).then_some(Pattern::Net(ip, bits))
}

/// `name` (as in the URL) is `pattern` or a subdomain of it; a trailing
/// dot of the name is ignored, and case.
fn name_matches(pattern: &str, name: &str) -> bool {
    let name = name.trim_end_matches('.');
    if name.len() == pattern.len() {
        return name.eq_ignore_ascii_case(pattern);
    }
    // A subdomain: `.pattern` at its end.
    name.len() > pattern.len()
        && name.get(name.len() - pattern.len() - 1..).is_some_and(|tail| {
            tail.as_bytes().first() == Some(&b'.')
                && tail.get(1..).is_some_and(|t| t.eq_ignore_ascii_case(pattern))
        })
}

/// `ip` is in `net/bits` (same family only).
fn in_net(ip: IpAddr, net: IpAddr, bits: u8) -> bool {
    let mask = |bits: u8, width: u8| -> u128 {
        match bits {
            0 => 0,
            b => u128::MAX << (width - b.min(width)),
        }
    };
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            let m = mask(bits, 32) as u32;
            u32::from(a) & m == u32::from(b) & m
        }
        (IpAddr::V6(a), IpAddr::V6(b)) => {
            let m = mask(bits, 128);
            u128::from(a) & m == u128::from(b) & m
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(s: &str) -> Host {
        match s.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
            Ok(ip) => Host::Ip(ip),
            Err(_) => Host::Name(s.to_string()),
        }
    }

    /// (NO_PROXY, host, port, direct?)
    const CASES: &[(&str, &str, u16, bool)] = &[
        // curl's own examples (its man page and tests 1614/1631-style):
        ("example.com", "example.com", 443, true),
        ("example.com", "www.example.com", 443, true),
        ("example.com", "www.badexample.com", 443, false),
        ("example.com", "badexample.com", 443, false),
        ("example.com", "example.com.org", 443, false),
        (".example.com", "example.com", 443, true),
        (".example.com", "www.example.com", 443, true),
        ("*.example.com", "www.example.com", 443, true),
        ("*.example.com", "example.com", 443, true),
        ("example.com.", "www.example.com", 443, true),
        ("example.com", "www.example.com.", 443, true),
        ("localhost,127.0.0.1", "127.0.0.1", 80, true),
        ("localhost", "localhost.", 80, true),
        ("*", "anything.example", 443, true),
        (" * ", "10.1.2.3", 443, true),
        // `*` is all only alone.
        ("*,example.com", "other.example", 443, false),
        ("", "example.com", 443, false),
        (",,", "example.com", 443, false),
        // Lists: commas, blanks tolerated, any entry may match.
        ("foo.com, example.com ,bar.com", "api.example.com", 443, true),
        ("foo.com,\texample.com", "example.com", 443, true),
        ("foo.com,,bar.com", "example.com", 443, false),
        // Case never matters.
        ("EXAMPLE.com", "www.Example.COM", 443, true),
        ("example.com", "WWW.EXAMPLE.COM", 443, true),
        // IPv4 and CIDR.
        ("10.0.0.0/8", "10.20.30.40", 443, true),
        ("10.0.0.0/8", "11.0.0.1", 443, false),
        ("192.168.1.0/24", "192.168.1.255", 443, true),
        ("192.168.1.0/24", "192.168.2.1", 443, false),
        ("192.168.1.7", "192.168.1.7", 443, true),
        ("192.168.1.7", "192.168.1.8", 443, false),
        ("0.0.0.0/0", "8.8.8.8", 443, true),
        ("10.0.0.0/33", "10.0.0.1", 443, false),
        ("10.0.0.0/x", "10.0.0.1", 443, false),
        // An IP entry never matches a name, nor a name an IP (no lookups).
        ("10.0.0.0/8", "ten.example", 443, false),
        ("example.com", "93.184.216.34", 443, false),
        // IPv6, with and without brackets, and ranges.
        ("::1", "[::1]", 443, true),
        ("[::1]", "[::1]", 443, true),
        ("[::1]", "[::2]", 443, false),
        ("fd00::/8", "[fd12:3456::1]", 443, true),
        ("[fd00::]/8", "[fd12::1]", 443, true),
        ("[fd00::/8]", "[fd12::1]", 443, true),
        ("fd00::/8", "[fe80::1]", 443, false),
        ("2001:DB8::/32", "[2001:db8:1::5]", 443, true),
        ("::/0", "[2001:db8::1]", 443, true),
        // A family never matches the other.
        ("0.0.0.0/0", "[::1]", 443, false),
        ("::/0", "10.0.0.1", 443, false),
        // Ports: an entry with one matches only that port.
        ("example.com:443", "example.com", 443, true),
        ("example.com:443", "example.com", 8443, false),
        ("example.com:443", "www.example.com", 443, true),
        ("10.0.0.1:8443", "10.0.0.1", 8443, true),
        ("10.0.0.1:8443", "10.0.0.1", 443, false),
        ("10.0.0.0/8:8443", "10.9.9.9", 8443, true),
        ("[::1]:8443", "[::1]", 8443, true),
        ("[::1]:8443", "[::1]", 443, false),
        ("[fd00::]/8:443", "[fd00::5]", 443, true),
        ("example.com:0", "example.com", 443, false),
        ("example.com:http", "example.com", 80, false),
        // Forms that fit nothing never match.
        ("[::1", "[::1]", 443, false),
        ("[zz]", "[::1]", 443, false),
        (".", "example.com", 443, false),
        // `*` inside a list, or inside a name, is no pattern.
        (",*", "x.*", 443, false),
        ("a*.example.com", "a*.example.com", 443, false),
        ("exa mple.com", "mple.com", 443, false),
        ("*.", "example.com", 443, false),
    ];

    #[test]
    fn no_proxy_as_curl_reads_it() {
        for &(list, h, port, direct) in CASES {
            assert_eq!(
                NoProxy::parse(list).matches(&host(h), port),
                direct,
                "NO_PROXY={list:?} host {h}:{port}"
            );
        }
    }

    #[test]
    fn empty_lists_say_so() {
        for (list, empty) in [("", true), (" , ", true), ("[zz]", true), ("*", false), ("a", false)] {
            assert_eq!(NoProxy::parse(list).is_empty(), empty, "{list:?}");
        }
    }
}

//! Who may talk to the proxy: the DNS-rebinding guard on `Host` and `Origin`
//! (MCP specification 2025-11-25, Basic > Transports > Streamable HTTP,
//! "Security Warning": a server must validate the `Origin` header of every
//! incoming connection against DNS rebinding and, running locally, should
//! bind to localhost only) and the
//! `--client-token` bearer check (RFC 6750 §2.1). `admission` decides a
//! request head from a small `Policy`. Pure: values in, verdicts out.
//!
//! The proxy adds the agent's credentials to everything it forwards, and it
//! rewrites `Host` upstream, so the upstream can no longer see a rebound
//! name: these checks run before any upstream contact.

use crate::http::head::RequestHead;
use crate::http::headers::{name, trim_ows};

/// What admission needs to know of the configuration.
#[derive(Clone, Copy, Debug)]
pub struct Policy<'a> {
    /// The port the proxy listens on (the Host check).
    pub listen_port: u16,
    /// `--client-token`: when set, it replaces the Host check.
    pub client_token: Option<&'a [u8]>,
    /// `--allow-origin` values, allowed besides the loopback origins.
    pub allow_origins: &'a [String],
}

/// Why a request was refused at admission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// An absolute-form or authority-form target (400).
    TargetNotPath,
    /// A Host other than a loopback name with the proxy's port (403).
    Host,
    /// No or the wrong `--client-token` bearer (401).
    ClientToken,
    /// An Origin other than a loopback or listed one (403).
    Origin,
}

impl Refusal {
    /// The status the client is answered with.
    pub fn status(self) -> u16 {
        match self {
            Refusal::TargetNotPath => 400,
            Refusal::Host | Refusal::Origin => 403,
            Refusal::ClientToken => 401,
        }
    }

    /// The message of the answer; it names no value the client sent.
    pub fn message(self) -> &'static str {
        match self {
            Refusal::TargetNotPath => "request target must be a path",
            Refusal::Host => "Host not allowed",
            Refusal::ClientToken => "client token required",
            Refusal::Origin => "Origin not allowed",
        }
    }
}

/// Who may use the proxy: before any upstream contact, the request must name
/// the proxy by a loopback Host (a DNS-rebound name cannot) or carry the
/// client token, and any Origin must be a loopback or listed one. Only
/// origin-form targets are relayed (RFC 9112 §3.2.1; `*` for OPTIONS,
/// §3.2.4): an absolute-form target would name an authority other than the
/// one checked.
pub fn admission(req: &RequestHead, policy: &Policy) -> Result<(), Refusal> {
    let target = req.target.as_slice();
    if !(target.starts_with(b"/") || (target == b"*" && req.is_method(b"OPTIONS"))) {
        return Err(Refusal::TargetNotPath);
    }
    match policy.client_token {
        None => {
            let host = req.headers.get_name(name::HOST).unwrap_or_default();
            if !host_allowed(host, policy.listen_port) {
                return Err(Refusal::Host);
            }
        }
        Some(secret) => {
            let presented = req.headers.get_name(name::AUTHORIZATION).unwrap_or_default();
            if !bearer_matches(presented, secret) {
                return Err(Refusal::ClientToken);
            }
        }
    }
    if let Some(origin) = req.headers.get_name(name::ORIGIN) {
        let extra: smallvec::SmallVec<[&[u8]; 4]> =
            policy.allow_origins.iter().map(|o| o.as_bytes()).collect();
        if !origin_allowed(origin, &extra) {
            return Err(Refusal::Origin);
        }
    }
    Ok(())
}

/// The loopback hosts a client may name, as they appear in `Host` and in a
/// serialised origin (RFC 6454 §6.1).
const LOOPBACK_HOSTS: [&[u8]; 3] = [b"127.0.0.1", b"localhost", b"[::1]"];

/// True only for `127.0.0.1:<port>`, `localhost:<port>` (ASCII
/// case-insensitive) and `[::1]:<port>`, `port` being the proxy's listening
/// port written canonically (no leading zero). `host` is the request's
/// `Host` value, already trimmed of surrounding whitespace.
#[inline]
pub fn host_allowed(host: &[u8], port: u16) -> bool {
    match split_host_port(host) {
        Some((name, Some(p))) => is_loopback_host(name) && p == port,
        _ => false,
    }
}

/// `origin` is the request's single `Origin` value. Allowed: `http://` or
/// `https://`, then `127.0.0.1`, `localhost` or `[::1]`, then an optional
/// `:<port>`, and nothing else (no path, not even a lone `/`, no userinfo,
/// no query: browsers serialise an origin without them, RFC 6454 §6.1); or
/// an ASCII case-insensitive match of one of `extra` (`--allow-origin`).
/// `null`, empty, other schemes and other hosts are refused.
pub fn origin_allowed(origin: &[u8], extra: &[&[u8]]) -> bool {
    if origin.is_empty() {
        return false;
    }
    if extra.iter().any(|e| e.eq_ignore_ascii_case(origin)) {
        return true;
    }
    let Some(authority) = strip_prefix_ignore_case(origin, b"http://")
        .or_else(|| strip_prefix_ignore_case(origin, b"https://"))
    else {
        return false;
    };
    match split_host_port(authority) {
        Some((name, _)) => is_loopback_host(name),
        None => false,
    }
}

/// Checks an `Authorization` value against `Bearer <expected_secret>`. The
/// scheme name is case-insensitive (RFC 9110 §11.1) and is followed by one
/// or more spaces (§11.4). The secret is compared in constant time for a
/// given length: no early exit on the first differing byte (the length may
/// leak). An empty secret never matches.
pub fn bearer_matches(authorization_value: &[u8], expected_secret: &[u8]) -> bool {
    if expected_secret.is_empty() {
        return false;
    }
    let value = trim_ows(authorization_value);
    let Some(after_scheme) = strip_prefix_ignore_case(value, b"bearer") else {
        return false;
    };
    if after_scheme.first() != Some(&b' ') {
        return false; // `Bearerx`, a tab, or no credentials at all
    }
    let Some(start) = after_scheme.iter().position(|&b| b != b' ') else {
        return false;
    };
    let presented = after_scheme.get(start..).unwrap_or_default();
    constant_time_eq(presented, expected_secret)
}

/// Equality that reads every byte of equal-length inputs whatever they
/// contain, so the time taken does not reveal the first difference.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    // Keep the optimiser from turning the fold into an early-exit compare.
    std::hint::black_box(diff) == 0
}

/// Splits `host[:port]` into the host and its port: `None` if the port is
/// present but not 1..=5 digits without leading zero and at most 65535, or
/// if a bracketed IPv6 literal is not closed.
fn split_host_port(authority: &[u8]) -> Option<(&[u8], Option<u16>)> {
    // A `:` inside an IPv6 literal is not the port separator.
    let host_end = if authority.first() == Some(&b'[') {
        authority.iter().position(|&b| b == b']')? + 1
    } else {
        authority.iter().position(|&b| b == b':').unwrap_or(authority.len())
    };
    let (host, rest) = authority.split_at(host_end);
    match rest.split_first() {
        None => Some((host, None)),
        Some((b':', digits)) => Some((host, Some(parse_port(digits)?))),
        Some(_) => None,
    }
}

/// A port as a browser or client serialises it: decimal digits only, no sign,
/// no leading zero, at most 65535 (port 0 is never a listening port).
fn parse_port(digits: &[u8]) -> Option<u16> {
    if digits.is_empty() || digits.len() > 5 || digits.first() == Some(&b'0') {
        return None;
    }
    let mut port: u16 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        port = port.checked_mul(10)?.checked_add(u16::from(d - b'0'))?;
    }
    Some(port)
}

fn is_loopback_host(name: &[u8]) -> bool {
    LOOPBACK_HOSTS.iter().any(|h| h.eq_ignore_ascii_case(name))
}

fn strip_prefix_ignore_case<'a>(value: &'a [u8], prefix: &[u8]) -> Option<&'a [u8]> {
    let head = value.get(..prefix.len())?;
    if head.eq_ignore_ascii_case(prefix) {
        value.get(prefix.len()..)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(raw: &[u8]) -> RequestHead {
        crate::http::head::parse_request(raw).unwrap().unwrap()
    }

    #[test]
    fn admission_checks_target_host_token_and_origin() {
        let origins = ["https://app.example".to_string()];
        let open = Policy { listen_port: 8300, client_token: None, allow_origins: &origins };
        let tokened = Policy { client_token: Some(b"s3cret"), ..open };
        let cases: &[(&Policy, &[u8], Result<(), Refusal>)] = &[
            (&open, b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:8300\r\n\r\n", Ok(())),
            (&open, b"OPTIONS * HTTP/1.1\r\nHost: localhost:8300\r\n\r\n", Ok(())),
            (&open, b"GET * HTTP/1.1\r\nHost: localhost:8300\r\n\r\n", Err(Refusal::TargetNotPath)),
            (&open, b"GET http://x/ HTTP/1.1\r\nHost: localhost:8300\r\n\r\n", Err(Refusal::TargetNotPath)),
            (&open, b"POST /mcp HTTP/1.1\r\nHost: evil.example:8300\r\n\r\n", Err(Refusal::Host)),
            (&open, b"POST /mcp HTTP/1.1\r\nHost: [::1]:8301\r\n\r\n", Err(Refusal::Host)),
            (
                &tokened,
                b"POST /mcp HTTP/1.1\r\nHost: evil.example\r\nAuthorization: Bearer s3cret\r\n\r\n",
                Ok(()),
            ),
            (&tokened, b"POST /mcp HTTP/1.1\r\nHost: localhost:8300\r\n\r\n", Err(Refusal::ClientToken)),
            (
                &open,
                b"POST /mcp HTTP/1.1\r\nHost: localhost:8300\r\nOrigin: https://app.example\r\n\r\n",
                Ok(()),
            ),
            (
                &open,
                b"POST /mcp HTTP/1.1\r\nHost: localhost:8300\r\nOrigin: http://evil\r\n\r\n",
                Err(Refusal::Origin),
            ),
        ];
        for (policy, raw, want) in cases {
            assert_eq!(admission(&head(raw), policy), *want, "{}", String::from_utf8_lossy(raw));
        }
        assert_eq!(
            [Refusal::TargetNotPath, Refusal::Host, Refusal::ClientToken, Refusal::Origin]
                .map(Refusal::status),
            [400, 403, 401, 403]
        );
    }

    /// Obviously-right twin of `host_allowed`: build the three allowed
    /// strings and compare.
    fn naive_host_allowed(host: &[u8], port: u16) -> bool {
        ["127.0.0.1", "localhost", "[::1]"]
            .iter()
            .any(|h| format!("{h}:{port}").as_bytes().eq_ignore_ascii_case(host))
    }

    #[test]
    fn host_table() {
        let cases: &[(&str, bool)] = &[
            ("127.0.0.1:40123", true),
            ("localhost:40123", true),
            ("LOCALHOST:40123", true),
            ("LocalHost:40123", true),
            ("[::1]:40123", true),
            ("127.0.0.1:40124", false),
            ("127.0.0.1:4012", false),
            ("127.0.0.1:401230", false),
            ("127.0.0.1:040123", false),
            ("127.0.0.1:+40123", false),
            ("127.0.0.1", false),
            ("localhost", false),
            ("[::1]", false),
            ("::1:40123", false),
            ("[::1:40123", false),
            ("[0:0:0:0:0:0:0:1]:40123", false),
            ("127.0.0.1.evil.com:40123", false),
            ("evil.com:40123", false),
            ("localhost.:40123", false),
            ("127.1:40123", false),
            ("127.0.0.2:40123", false),
            ("0.0.0.0:40123", false),
            ("127.0.0.1:40123:40123", false),
            ("127.0.0.1:40123/", false),
            ("user@127.0.0.1:40123", false),
            (" 127.0.0.1:40123", false),
            ("127.0.0.1: 40123", false),
            ("127.0.0.1:", false),
            (":40123", false),
            ("", false),
            ("127.0.0.1:99999", false),
        ];
        for &(host, want) in cases {
            assert_eq!(host_allowed(host.as_bytes(), 40123), want, "{host}");
            assert_eq!(naive_host_allowed(host.as_bytes(), 40123), want, "naive {host}");
        }
        assert!(host_allowed(b"localhost:65535", 65535));
        assert!(host_allowed(b"localhost:1", 1));
        assert!(!host_allowed(b"localhost:0", 0), "port 0 never listens");
    }

    #[test]
    fn host_agrees_with_naive_twin() {
        let parts: &[&[u8]] = &[
            b"127.0.0.1",
            b"localhost",
            b"LOCALHOST",
            b"[::1]",
            b"[",
            b"]",
            b":",
            b"8",
            b"80",
            b"0",
            b"65535",
            b"65536",
            b"evil",
            b".",
            b"",
        ];
        for a in parts {
            for b in parts {
                for c in parts {
                    let host = [*a, *b, *c].concat();
                    for port in [80, 8, 65535, 1] {
                        assert_eq!(
                            host_allowed(&host, port),
                            naive_host_allowed(&host, port),
                            "{} {port}",
                            String::from_utf8_lossy(&host)
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn origin_table() {
        let extra: &[&[u8]] = &[b"https://app.example.com", b"http://10.0.0.5:3000"];
        let cases: &[(&str, bool)] = &[
            ("http://127.0.0.1", true),
            ("http://127.0.0.1:1234", true),
            ("https://127.0.0.1:443", true),
            ("http://localhost", true),
            ("http://LOCALHOST:5173", true),
            ("HTTP://localhost:5173", true),
            ("https://localhost", true),
            ("http://[::1]", true),
            ("http://[::1]:8080", true),
            ("https://app.example.com", true),
            ("HTTPS://APP.example.com", true),
            ("http://10.0.0.5:3000", true),
            ("http://127.0.0.1:1234/path", false),
            ("http://127.0.0.1/", false),
            ("http://localhost:1234/", false),
            ("http://user@localhost", false),
            ("http://localhost@evil.com", false),
            ("http://localhost?x", false),
            ("http://localhost#f", false),
            ("http://localhost:", false),
            ("http://localhost:0", false),
            ("http://localhost:65536", false),
            ("http://localhost:08080", false),
            ("http://localhost.evil.com", false),
            ("http://127.0.0.1.evil.com", false),
            ("http://[::1", false),
            ("http://[::1]x", false),
            ("http://evil.com", false),
            ("http://10.0.0.5:3001", false),
            ("https://app.example.com/", false),
            ("http://", false),
            ("null", false),
            ("NULL", false),
            ("", false),
            ("file://", false),
            ("file:///etc/passwd", false),
            ("ws://localhost", false),
            ("chrome-extension://abcdef", false),
            ("localhost", false),
            ("//localhost", false),
            (" http://localhost", false),
            ("http://localhost ", false),
            ("http://localhost, http://evil.com", false),
        ];
        for &(origin, want) in cases {
            assert_eq!(origin_allowed(origin.as_bytes(), extra), want, "{origin}");
        }
        assert!(!origin_allowed(b"https://app.example.com", &[]));
        assert!(!origin_allowed(b"", &[b""]), "empty is refused even if listed");
    }

    #[test]
    fn bearer_table() {
        let secret = b"s3cr3t-Token_0123";
        let cases: &[(&str, bool)] = &[
            ("Bearer s3cr3t-Token_0123", true),
            ("bearer s3cr3t-Token_0123", true),
            ("BEARER s3cr3t-Token_0123", true),
            ("Bearer   s3cr3t-Token_0123", true),
            ("  Bearer s3cr3t-Token_0123  ", true),
            ("Bearer s3cr3t-Token_0124", false),
            ("Bearer S3CR3T-TOKEN_0123", false),
            ("Bearer s3cr3t-Token_012", false),
            ("Bearer s3cr3t-Token_01234", false),
            ("Bearer s3cr3t-Token_0123 x", false),
            ("Bearers3cr3t-Token_0123", false),
            ("Bearer\ts3cr3t-Token_0123", false),
            ("Basic s3cr3t-Token_0123", false),
            ("Token s3cr3t-Token_0123", false),
            ("s3cr3t-Token_0123", false),
            ("Bearer", false),
            ("Bearer ", false),
            ("", false),
        ];
        for &(value, want) in cases {
            assert_eq!(bearer_matches(value.as_bytes(), secret), want, "{value:?}");
        }
        assert!(!bearer_matches(b"Bearer ", b""), "empty secret never matches");
        assert!(!bearer_matches(b"Bearer", b""));
    }

    #[test]
    fn constant_time_eq_is_equality() {
        let values: &[&[u8]] = &[b"", b"a", b"b", b"ab", b"ba", b"abc"];
        for a in values {
            for b in values {
                assert_eq!(constant_time_eq(a, b), a == b);
            }
        }
    }
}

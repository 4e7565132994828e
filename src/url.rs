//! `http://HOST[:PORT][/PATH]` and `https://...`: the one URL parser, for
//! `--upstream` (`config`) and `--probe` (`probe`). RFC 3986 §3 with the
//! `http` and `https` schemes of RFC 9110 §4.2: HOST an IPv4 address, an
//! IPv6 address in brackets or a DNS name; PORT 1-65535 (80, or 443 for
//! https, when absent); the path and query become the request target. And
//! the one loopback rule: an IP address or `localhost` needs no resolver
//! (a `FROM scratch` image has no `/etc/hosts`). Pure: nothing is resolved.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// A URL, checked but not resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Url {
    pub https: bool,
    pub host: Host,
    pub port: u16,
    /// The request target: path and query as written, `/` when there is
    /// no path.
    pub target: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Host {
    Ip(IpAddr),
    /// A DNS name, resolved when it is used (`localhost` excepted: see
    /// `Url::fixed_addrs`).
    Name(String),
}

impl Url {
    /// The host as the `Host` field and an authority write it: an IPv6
    /// address in brackets.
    pub fn host_text(&self) -> String {
        match &self.host {
            Host::Ip(IpAddr::V6(ip)) => format!("[{ip}]"),
            Host::Ip(IpAddr::V4(ip)) => ip.to_string(),
            Host::Name(name) => name.clone(),
        }
    }

    /// `host:port` as the `Host` field wants it (RFC 9110 §7.2).
    pub fn authority(&self) -> String {
        format!("{}:{}", self.host_text(), self.port)
    }

    /// The addresses that need no resolver: an IP address's, and
    /// `localhost`'s two loopbacks; `None` for another name.
    pub fn fixed_addrs(&self) -> Option<Vec<SocketAddr>> {
        match &self.host {
            Host::Ip(ip) => Some(vec![SocketAddr::new(*ip, self.port)]),
            Host::Name(name) if name.eq_ignore_ascii_case("localhost") => Some(vec![
                SocketAddr::from((Ipv4Addr::LOCALHOST, self.port)),
                SocketAddr::from((Ipv6Addr::LOCALHOST, self.port)),
            ]),
            Host::Name(_) => None,
        }
    }
}

impl fmt::Display for Url {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.https { "https" } else { "http" };
        write!(f, "{scheme}://{}{}", self.authority(), self.target)
    }
}

const EXPECTED: &str = "expected http://HOST[:PORT][/PATH] (or https://)";
const BAD_PORT: &str = "the port must be a number from 1 to 65535";

/// Parses `url`; the error says what is wrong in words (the caller names
/// the flag).
pub fn parse(url: &str) -> Result<Url, &'static str> {
    let scheme = |s: &str| url.get(..s.len()).is_some_and(|p| p.eq_ignore_ascii_case(s));
    let (https, rest) = if scheme("https://") {
        (true, url.get(8..))
    } else if scheme("http://") {
        (false, url.get(7..))
    } else {
        (false, None)
    };
    let rest = rest.ok_or(EXPECTED)?;
    // The authority ends at the first '/', '?' or '#' (RFC 3986 §3.2).
    let (authority, target) = match rest.find(['/', '?', '#']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    if authority.contains('@') {
        return Err("user info (USER@) is not supported");
    }
    let (host, port) = split_authority(authority, if https { 443 } else { 80 })?;
    Ok(Url { https, host, port, target: request_target(target)? })
}

pub(crate) fn split_authority(authority: &str, default_port: u16) -> Result<(Host, u16), &'static str> {
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => {
            let (inside, after) = v6.split_once(']').ok_or("an IPv6 address needs its closing ]")?;
            let ip: Ipv6Addr = inside.parse().map_err(|_| "expected an IPv6 address inside [ ]")?;
            let port = match after {
                "" => None,
                after => Some(after.strip_prefix(':').ok_or("expected :PORT after ]")?),
            };
            (Host::Ip(IpAddr::V6(ip)), port)
        }
        None if authority.matches(':').count() > 1 => {
            return Err("an IPv6 address goes in brackets: http://[::1]:PORT/");
        }
        None => {
            let (name, port) = match authority.split_once(':') {
                Some((name, port)) => (name, Some(port)),
                None => (authority, None),
            };
            (host_name(name)?, port)
        }
    };
    let port = match port {
        None => default_port,
        Some(digits) => parse_port(digits).ok_or(BAD_PORT)?,
    };
    Ok((host, port))
}

fn host_name(name: &str) -> Result<Host, &'static str> {
    if name.is_empty() {
        return Err("missing host");
    }
    if let Ok(ip) = name.parse::<Ipv4Addr>() {
        return Ok(Host::Ip(IpAddr::V4(ip)));
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_') {
        return Err("the host must be an IP address or a DNS name (letters, digits, '-', '.')");
    }
    Ok(Host::Name(name.to_string()))
}

/// 1-65535 from decimal digits only (no sign, no spaces), at most five.
fn parse_port(digits: &str) -> Option<u16> {
    if digits.is_empty() || digits.len() > 5 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n = digits.bytes().fold(0u32, |n, b| n * 10 + u32::from(b - b'0'));
    u16::try_from(n).ok().filter(|&p| p != 0)
}

/// The path and query as the request target (RFC 9112 §3.2.1: origin-form,
/// `/` for an empty path). Only visible ASCII goes into the request line;
/// a fragment is never sent, so one in the URL is refused rather than
/// silently dropped.
fn request_target(target: &str) -> Result<String, &'static str> {
    if target.contains('#') {
        return Err("a fragment (#...) is never sent; remove it");
    }
    if !target.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("the path must be visible ASCII without spaces (percent-encode the rest)");
    }
    Ok(match target.strip_prefix('?') {
        _ if target.is_empty() => "/".to_string(),
        Some(_) => format!("/{target}"),
        None => target.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Host {
        Host::Ip(s.parse().unwrap())
    }

    #[test]
    fn url_forms_that_parse() {
        let name = |s: &str| Host::Name(s.to_string());
        let cases = [
            ("http://127.0.0.1:9100/healthz", ip("127.0.0.1"), 9100, "/healthz"),
            ("HTTP://127.0.0.1/healthz", ip("127.0.0.1"), 80, "/healthz"),
            ("http://127.0.0.1:9100", ip("127.0.0.1"), 9100, "/"),
            ("http://127.0.0.1", ip("127.0.0.1"), 80, "/"),
            ("http://[::1]:9100/healthz", ip("::1"), 9100, "/healthz"),
            ("http://[::1]/", ip("::1"), 80, "/"),
            ("http://[fe80::1:2]:1", ip("fe80::1:2"), 1, "/"),
            ("http://localhost:65535/h?x=1&y", name("localhost"), 65535, "/h?x=1&y"),
            ("http://metrics_1.local:00080/a/b", name("metrics_1.local"), 80, "/a/b"),
            ("http://h:1?ready", name("h"), 1, "/?ready"),
            ("http://h:1/a@b", name("h"), 1, "/a@b"),
        ];
        for (url, host, port, target) in cases {
            let want = Url { https: false, host, port, target: target.to_string() };
            assert_eq!(parse(url), Ok(want), "{url}");
        }
        let u = parse("http://[::1]:7/healthz").unwrap();
        assert_eq!((u.authority().as_str(), u.to_string().as_str()), ("[::1]:7", "http://[::1]:7/healthz"));
        assert_eq!(parse("http://h/x").unwrap().authority(), "h:80");
        // https: port 443 by default.
        let u = parse("HTTPS://[::1]/sse").unwrap();
        assert_eq!((u.https, u.port, u.to_string().as_str()), (true, 443, "https://[::1]:443/sse"));
        assert_eq!(parse("https://h:8443").unwrap().port, 8443);
        // The loopback rule: no resolver for an IP address or localhost.
        let fixed = |s: &str| parse(s).unwrap().fixed_addrs();
        assert_eq!(fixed("http://LocalHost:5").map(|a| a.len()), Some(2));
        assert_eq!(fixed("http://127.0.0.1:5"), Some(vec!["127.0.0.1:5".parse().unwrap()]));
        assert_eq!(fixed("http://example.com/"), None);
    }

    #[test]
    fn url_forms_that_are_refused_say_why() {
        let cases = [
            ("127.0.0.1:9100/healthz", "expected http://"),
            ("https://", "missing host"),
            ("", "expected http://"),
            ("http:/127.0.0.1/", "expected http://"),
            ("ftp://127.0.0.1/", "expected http://"),
            ("http://", "missing host"),
            ("http:///healthz", "missing host"),
            ("http://:9100/healthz", "missing host"),
            ("http://h:/", "port"),
            ("http://h:0/", "port"),
            ("http://h:65536/", "port"),
            ("http://h:123456/", "port"),
            ("http://h:+80/", "port"),
            ("http://h:8 0/", "port"),
            ("http://h:x/", "port"),
            ("http://::1/", "brackets"),
            ("http://[::1/", "closing ]"),
            ("http://[::1]x/", ":PORT after ]"),
            ("http://[127.0.0.1]/", "IPv6 address inside"),
            ("http://[]:1/", "IPv6 address inside"),
            ("http://[::1]:0/", "port"),
            ("http://user@h/", "user info"),
            ("http://user:pw@h:1/", "user info"),
            ("http://h%41/", "DNS name"),
            ("http://h/a b", "visible ASCII"),
            ("http://h/a\r\nX: y", "visible ASCII"),
            ("http://h/é", "visible ASCII"),
            ("http://h/healthz#top", "fragment"),
        ];
        for (url, why) in cases {
            match parse(url) {
                Err(e) => assert!(e.contains(why), "{url:?}: {e:?} does not say {why:?}"),
                Ok(u) => panic!("{url:?} parsed: {u:?}"),
            }
        }
    }
}

//! Which route the upstream takes: directly, or through an HTTP forward
//! proxy's `CONNECT` tunnel, decided once at start from the proxy variables
//! as curl reads them. `https_proxy`, else `HTTPS_PROXY`, else `all_proxy`,
//! else `ALL_PROXY` (lowercase first; an empty value is unset); `no_proxy`,
//! else `NO_PROXY` (`no_proxy` module). A loopback upstream never goes
//! through a proxy, a plain `http://` one only when asked
//! (`--upstream-proxy-http`: the proxy would read the agent's token), and
//! `--no-proxy-env` ignores every variable. The proxy URL is
//! `http://[USER[:PASSWORD]@]HOST[:PORT]` (percent-decoded credentials, sent
//! as `Proxy-Authorization: Basic`; port 1080 when absent, as curl); an
//! `https://` proxy URL is refused for now. Pure: the variables are an
//! input (`ProxyEnv`), nothing is resolved, and no message carries a
//! variable's value (it may hold a password).

pub mod connect;
pub mod no_proxy;

use crate::url::Host;
use no_proxy::NoProxy;
use std::fmt;

/// The variables that name a proxy for an `https://` (or tunnelled
/// `http://`) upstream, in the order they are looked at, pairs of spellings.
pub const PROXY_VARS: [[&str; 2]; 2] = [["https_proxy", "HTTPS_PROXY"], ["all_proxy", "ALL_PROXY"]];
/// The exceptions, lowercase first.
pub const NO_PROXY_VARS: [&str; 2] = ["no_proxy", "NO_PROXY"];

/// curl's port for a proxy URL without one.
pub const DEFAULT_PROXY_PORT: u16 = 1080;

/// The proxy variables, read once at start.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ProxyEnv {
    /// (name, value) of each variable that is set and not empty.
    vars: Vec<(&'static str, String)>,
}

impl fmt::Debug for ProxyEnv {
    /// Names only: a proxy URL may carry a password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.vars.iter().map(|(n, _)| n)).finish()
    }
}

impl ProxyEnv {
    /// The variables as `get` gives them (tests pass a table).
    pub fn read(get: impl Fn(&str) -> Option<String>) -> ProxyEnv {
        let names = PROXY_VARS.iter().flatten().chain(NO_PROXY_VARS.iter());
        let vars = names.filter_map(|&n| get(n).filter(|v| !v.is_empty()).map(|v| (n, v))).collect();
        ProxyEnv { vars }
    }

    /// The process environment's (a value that is not UTF-8 counts as unset).
    pub fn from_process() -> ProxyEnv {
        ProxyEnv::read(|name| std::env::var(name).ok())
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.vars.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
    }

    /// The first of a pair of spellings that is set, warning when both are
    /// and they differ (the values are never shown).
    fn pick(
        &self,
        [lower, upper]: [&'static str; 2],
        warnings: &mut Vec<String>,
    ) -> Option<(&'static str, &str)> {
        match (self.get(lower), self.get(upper)) {
            (Some(l), Some(u)) => {
                if l != u {
                    warnings.push(format!("both {lower} and {upper} are set and differ: {lower} is used"));
                }
                Some((lower, l))
            }
            (Some(l), None) => Some((lower, l)),
            (None, Some(u)) => Some((upper, u)),
            (None, None) => None,
        }
    }
}

/// The flags that bear on the route.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RouteFlags {
    /// `--no-proxy-env`: every proxy variable is ignored.
    pub ignore_env: bool,
    /// `--upstream-proxy-http`: a plain `http://` upstream goes through
    /// the proxy too.
    pub proxy_http: bool,
}

/// An HTTP forward proxy, from a proxy variable.
#[derive(Clone, PartialEq, Eq)]
pub struct ProxyUrl {
    pub host: Host,
    pub port: u16,
    /// `USER:PASSWORD`, percent-decoded (a password may be absent: empty).
    credentials: Option<Vec<u8>>,
}

impl fmt::Debug for ProxyUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProxyUrl")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("credentials", &self.credentials.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl ProxyUrl {
    /// `host:port` (an IPv6 address in brackets): the log lines' name of
    /// the proxy, and where to connect.
    pub fn authority(&self) -> String {
        let url =
            crate::url::Url { https: false, host: self.host.clone(), port: self.port, target: String::new() };
        url.authority()
    }

    /// The host as looked up (no brackets).
    pub fn lookup_host(&self) -> String {
        match &self.host {
            Host::Ip(ip) => ip.to_string(),
            Host::Name(n) => n.clone(),
        }
    }

    /// The `Proxy-Authorization` value (RFC 9110 §11.7.1 with the Basic
    /// scheme of RFC 7617 §2), when the URL carries credentials.
    pub fn authorization(&self) -> Option<String> {
        self.credentials.as_ref().map(|c| format!("Basic {}", crate::credentials::b64::encode(c)))
    }
}

/// Why a proxy URL was refused; it never quotes the value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyUrlError {
    /// `https://`: TLS to the proxy itself is not supported yet.
    Https,
    /// Another scheme (`socks5://`, ...).
    Scheme,
    /// A `%` not followed by two hex digits in the user or password.
    Escape,
    /// The host or port (`url`'s words).
    Authority(&'static str),
}

impl fmt::Display for ProxyUrlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProxyUrlError::Https => f.write_str(
                "an https:// proxy (TLS to the proxy itself) is not supported yet: give an http:// proxy URL \
                 (the tunnel to an https:// upstream is TLS end to end either way), or --no-proxy-env",
            ),
            ProxyUrlError::Scheme => {
                f.write_str("only http:// proxies are supported (expected http://[USER:PASSWORD@]HOST[:PORT])")
            }
            ProxyUrlError::Escape => f.write_str("a % in the user or password must be followed by two hex digits"),
            ProxyUrlError::Authority(why) => write!(f, "expected http://[USER:PASSWORD@]HOST[:PORT]: {why}"),
        }
    }
}

/// Parses a proxy variable's value: `[http://][USER[:PASSWORD]@]HOST[:PORT][/]`
/// (a path is ignored, as curl does).
pub fn parse_proxy_url(value: &str) -> Result<ProxyUrl, ProxyUrlError> {
    let value = value.trim();
    let rest = match value.find("://") {
        Some(i) => {
            let scheme = value.get(..i).unwrap_or_default();
            if scheme.eq_ignore_ascii_case("https") {
                return Err(ProxyUrlError::Https);
            }
            if !scheme.eq_ignore_ascii_case("http") {
                return Err(ProxyUrlError::Scheme);
            }
            value.get(i + 3..).unwrap_or_default()
        }
        // curl takes a bare `host:port` as http://.
        None => value,
    };
    let authority = match rest.find(['/', '?', '#']) {
        Some(i) => rest.get(..i).unwrap_or_default(),
        None => rest,
    };
    // The last `@`: a password with an unencoded `@` still parses.
    let (credentials, host_port) = match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let (user, pass) = userinfo.split_once(':').unwrap_or((userinfo, ""));
            let mut c = percent_decode(user)?;
            c.push(b':');
            c.extend(percent_decode(pass)?);
            (Some(c), host)
        }
        None => (None, authority),
    };
    let (host, port) =
        crate::url::split_authority(host_port, DEFAULT_PROXY_PORT).map_err(ProxyUrlError::Authority)?;
    Ok(ProxyUrl { host, port, credentials })
}

fn percent_decode(s: &str) -> Result<Vec<u8>, ProxyUrlError> {
    let hex = |b: u8| (b as char).to_digit(16);
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        if b != b'%' {
            out.push(b);
            continue;
        }
        match (bytes.next().and_then(hex), bytes.next().and_then(hex)) {
            (Some(h), Some(l)) => out.push((h * 16 + l) as u8),
            _ => return Err(ProxyUrlError::Escape),
        }
    }
    Ok(out)
}

/// How the upstream is reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    Direct(Direct),
    /// Through the proxy `url`, named by the variable `var`.
    Proxy {
        url: ProxyUrl,
        var: &'static str,
    },
}

/// Why the upstream is reached directly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direct {
    /// `--no-proxy-env`.
    EnvIgnored,
    /// No proxy variable is set.
    NoVariable,
    /// A loopback upstream (an IP loopback address or `localhost`).
    Loopback,
    /// A plain `http://` upstream, without `--upstream-proxy-http`.
    PlainHttp,
    /// The `NO_PROXY` variable (this spelling) lists the host.
    NoProxy(&'static str),
    /// A build without forward proxies (the minimal one, without TLS).
    NotBuilt,
}

/// The route and the warnings for the start's log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub route: Route,
    pub warnings: Vec<String>,
}

/// A proxy variable's value refused (exit 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouteError {
    pub var: &'static str,
    pub why: ProxyUrlError,
}

impl fmt::Display for RouteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.var, self.why)
    }
}

/// Whether `host` is a loopback host: no proxy is ever between.
pub fn is_loopback(host: &Host) -> bool {
    match host {
        Host::Ip(ip) => ip.to_canonical().is_loopback(),
        Host::Name(name) => name.trim_end_matches('.').eq_ignore_ascii_case("localhost"),
    }
}

/// The route to the upstream `host:port` (`https`: an `https://` upstream).
pub fn decide(
    host: &Host,
    port: u16,
    https: bool,
    env: &ProxyEnv,
    flags: RouteFlags,
) -> Result<Decision, RouteError> {
    let mut warnings = Vec::new();
    let direct = |why, warnings| Ok(Decision { route: Route::Direct(why), warnings });
    if flags.ignore_env {
        return direct(Direct::EnvIgnored, warnings);
    }
    if is_loopback(host) {
        return direct(Direct::Loopback, warnings);
    }
    let Some((var, value)) = PROXY_VARS.iter().find_map(|&pair| env.pick(pair, &mut warnings)) else {
        return direct(Direct::NoVariable, warnings);
    };
    if !https && !flags.proxy_http {
        return direct(Direct::PlainHttp, warnings);
    }
    if let Some((no_var, list)) = env.pick(NO_PROXY_VARS, &mut warnings) {
        if NoProxy::parse(list).matches(host, port) {
            return direct(Direct::NoProxy(no_var), warnings);
        }
    }
    let url = parse_proxy_url(value).map_err(|why| RouteError { var, why })?;
    Ok(Decision { route: Route::Proxy { url, var }, warnings })
}

impl fmt::Display for Route {
    /// The start's info line about the route (never a credential).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Route::Proxy { url, var } => {
                write!(f, "through the forward proxy {} (from {var}), a CONNECT tunnel", url.authority())
            }
            Route::Direct(why) => f.write_str(match why {
                Direct::EnvIgnored => "direct (--no-proxy-env: proxy variables ignored)",
                Direct::NoVariable => "direct (no proxy variable set)",
                Direct::Loopback => "direct (a loopback upstream never goes through a proxy)",
                Direct::PlainHttp => {
                    "direct (a plain http:// upstream goes through a proxy only with --upstream-proxy-http)"
                }
                Direct::NoProxy("no_proxy") => "direct (listed in no_proxy)",
                Direct::NotBuilt => "direct (a build without TLS has no forward proxies)",
                Direct::NoProxy(_) => "direct (listed in NO_PROXY)",
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> ProxyEnv {
        let vars: Vec<(String, String)> = vars.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
        ProxyEnv::read(|name| vars.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone()))
    }

    fn name(s: &str) -> Host {
        Host::Name(s.to_string())
    }

    fn proxied(d: &Decision) -> Option<(String, &'static str)> {
        match &d.route {
            Route::Proxy { url, var } => Some((url.authority(), *var)),
            Route::Direct(_) => None,
        }
    }

    #[test]
    fn which_variable_names_the_proxy() {
        let h = name("mcp.example.com");
        let flags = RouteFlags::default();
        // (variables, proxy authority or None, variable, warnings)
        let cases: &[(&[(&str, &str)], Option<&str>, usize)] = &[
            (&[], None, 0),
            (&[("HTTPS_PROXY", "http://p:3128")], Some("p:3128"), 0),
            (&[("https_proxy", "http://l:1"), ("HTTPS_PROXY", "http://u:2")], Some("l:1"), 1),
            (&[("https_proxy", "http://l:1"), ("HTTPS_PROXY", "http://l:1")], Some("l:1"), 0),
            (&[("ALL_PROXY", "http://a:3")], Some("a:3"), 0),
            (&[("all_proxy", "http://a:3"), ("ALL_PROXY", "http://b:4")], Some("a:3"), 1),
            (&[("HTTPS_PROXY", "http://h:1"), ("all_proxy", "http://a:3")], Some("h:1"), 0),
            // Empty is unset.
            (&[("https_proxy", ""), ("HTTPS_PROXY", "http://u:2")], Some("u:2"), 0),
            // http_proxy is for plain http and never used here.
            (&[("http_proxy", "http://x:1"), ("HTTP_PROXY", "http://x:1")], None, 0),
        ];
        for &(vars, want, warnings) in cases {
            let d = decide(&h, 443, true, &env(vars), flags).unwrap();
            assert_eq!(proxied(&d).map(|(a, _)| a), want.map(String::from), "{vars:?}");
            assert_eq!(d.warnings.len(), warnings, "{vars:?}: {:?}", d.warnings);
            for w in &d.warnings {
                assert!(!w.contains("http://"), "a warning shows a value: {w}");
            }
        }
        let d = decide(&h, 443, true, &env(&[("https_proxy", "http://p:1")]), flags).unwrap();
        assert_eq!(proxied(&d), Some(("p:1".into(), "https_proxy")));
    }

    #[test]
    fn loopback_plain_http_no_proxy_and_the_flag_go_direct() {
        let vars = [("HTTPS_PROXY", "http://p:3128"), ("NO_PROXY", "internal.example,10.0.0.0/8")];
        let e = env(&vars);
        let f = RouteFlags::default();
        let route = |h: &Host, port, https, flags| decide(h, port, https, &e, flags).unwrap().route;
        let ip = |s: &str| Host::Ip(s.parse().unwrap());
        assert_eq!(route(&ip("127.0.0.1"), 443, true, f), Route::Direct(Direct::Loopback));
        assert_eq!(route(&ip("127.9.9.9"), 443, true, f), Route::Direct(Direct::Loopback));
        assert_eq!(route(&ip("::1"), 443, true, f), Route::Direct(Direct::Loopback));
        assert_eq!(route(&ip("::ffff:127.0.0.1"), 443, true, f), Route::Direct(Direct::Loopback));
        assert_eq!(route(&name("LocalHost"), 443, true, f), Route::Direct(Direct::Loopback));
        assert_eq!(route(&name("a.example"), 80, false, f), Route::Direct(Direct::PlainHttp));
        let http = RouteFlags { proxy_http: true, ..f };
        assert!(matches!(route(&name("a.example"), 80, false, http), Route::Proxy { .. }));
        // Loopback even with the flag.
        assert_eq!(route(&ip("127.0.0.1"), 80, false, http), Route::Direct(Direct::Loopback));
        assert_eq!(
            route(&name("api.internal.example"), 443, true, f),
            Route::Direct(Direct::NoProxy("NO_PROXY"))
        );
        assert_eq!(route(&ip("10.1.1.1"), 443, true, f), Route::Direct(Direct::NoProxy("NO_PROXY")));
        assert!(matches!(route(&ip("11.1.1.1"), 443, true, f), Route::Proxy { .. }));
        let ignore = RouteFlags { ignore_env: true, ..f };
        assert_eq!(route(&name("a.example"), 443, true, ignore), Route::Direct(Direct::EnvIgnored));
        // no_proxy first, as curl.
        let e2 = env(&[("HTTPS_PROXY", "http://p:1"), ("no_proxy", "a.example"), ("NO_PROXY", "b.example")]);
        let d = decide(&name("a.example"), 443, true, &e2, f).unwrap();
        assert_eq!((d.route, d.warnings.len()), (Route::Direct(Direct::NoProxy("no_proxy")), 1));
        assert!(matches!(decide(&name("b.example"), 443, true, &e2, f).unwrap().route, Route::Proxy { .. }));
        // A bad proxy URL that is not used is not an error.
        let bad = env(&[("HTTPS_PROXY", "https://p:1"), ("NO_PROXY", "*")]);
        assert!(decide(&name("a.example"), 443, true, &bad, f).is_ok());
    }

    #[test]
    fn proxy_urls() {
        let cases: &[(&str, &str, Option<&str>)] = &[
            ("http://proxy.corp:3128", "proxy.corp:3128", None),
            ("HTTP://proxy.corp:3128/", "proxy.corp:3128", None),
            ("proxy.corp:3128", "proxy.corp:3128", None),
            ("http://proxy.corp", "proxy.corp:1080", None),
            ("http://10.0.0.1:8080", "10.0.0.1:8080", None),
            ("http://[fd00::1]:8080", "[fd00::1]:8080", None),
            // Basic of "user:pass", "us er:p@ss:w", "user:" (RFC 7617 §2).
            ("http://user:pass@p:1", "p:1", Some("Basic dXNlcjpwYXNz")),
            ("http://us%20er:p%40ss%3aw@p:1", "p:1", Some("Basic dXMgZXI6cEBzczp3")),
            ("http://us%20er:p@ss:w@p:1", "p:1", Some("Basic dXMgZXI6cEBzczp3")),
            ("http://user@p:1", "p:1", Some("Basic dXNlcjo=")),
        ];
        for &(value, authority, auth) in cases {
            let u = parse_proxy_url(value).unwrap_or_else(|e| panic!("{value}: {e}"));
            assert_eq!((u.authority().as_str(), u.authorization().as_deref()), (authority, auth), "{value}");
            assert!(!format!("{u:?}").contains("pass"), "Debug shows the password");
        }
        let refused: &[(&str, ProxyUrlError)] = &[
            ("https://p:3128", ProxyUrlError::Https),
            ("HTTPS://user:secret@p:3128", ProxyUrlError::Https),
            ("socks5://p:1080", ProxyUrlError::Scheme),
            ("http://u:%zz@p:1", ProxyUrlError::Escape),
            ("http://u:%4@p:1", ProxyUrlError::Escape),
        ];
        for &(value, want) in refused {
            assert_eq!(parse_proxy_url(value), Err(want), "{value}");
        }
        for value in ["http://", "http://p:0", "http://p:99999", "http://::1:3128", "http://user:secret@"] {
            let e = parse_proxy_url(value).unwrap_err();
            assert!(matches!(e, ProxyUrlError::Authority(_)), "{value}: {e:?}");
            assert!(!e.to_string().contains("secret"));
        }
        let e = decide(
            &name("a.example"),
            443,
            true,
            &env(&[("HTTPS_PROXY", "https://user:secret@p:1")]),
            RouteFlags::default(),
        )
        .unwrap_err();
        assert!(e.to_string().starts_with("HTTPS_PROXY: an https:// proxy"), "{e}");
        assert!(!e.to_string().contains("secret"), "{e}");
    }

    #[test]
    fn the_info_line_names_the_proxy_never_its_credentials() {
        let e = env(&[("HTTPS_PROXY", "http://alice:s3cret@proxy.corp:3128")]);
        let d = decide(&name("a.example"), 443, true, &e, RouteFlags::default()).unwrap();
        let line = d.route.to_string();
        assert!(line.contains("proxy.corp:3128") && line.contains("HTTPS_PROXY"), "{line}");
        assert!(!line.contains("s3cret") && !line.contains("alice"), "{line}");
        assert!(!format!("{e:?}").contains("s3cret"));
    }
}

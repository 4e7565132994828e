//! Command line and environment -> `Config`. Hand-written (no clap): the
//! command-line contract (USAGE below) is small and wrappers depend on its
//! exact shape.
//! The token is read from a file or `MCP_PROXY_TOKEN`, never from argv, and
//! never appears in an error message.

use crate::limits;
use crate::mcp::identity::{self, Identity, IdentityError};
use crate::mcp::stamp::{parse_stamp_arg, StampMap};
use crate::mcp::tools::ToolFlags;
use crate::probe;
use std::fmt;
use std::net::{Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Environment variable holding the token when `--token-file` is absent.
pub const TOKEN_ENV: &str = "MCP_PROXY_TOKEN";

/// The upstream MCP server, from `--upstream http[s]://HOST[:PORT][/PATH]`.
#[derive(Clone, Debug)]
pub struct Upstream {
    /// Resolved addresses, tried in turn when a connect is refused.
    pub addrs: Vec<SocketAddr>,
    /// `host:port` as written (port filled in; for https the default port
    /// 443 left out, as browsers send it), the Host sent upstream and the
    /// authority recognised in `Location` and SSE endpoint URLs.
    pub authority: String,
    /// The path the proxy announces (`/mcp`, `/sse`).
    pub path: String,
    /// The host as written (brackets of an IPv6 address kept), and the port.
    pub host: String,
    pub port: u16,
    /// `https://`: the upstream is reached over TLS.
    pub https: bool,
    /// How every TLS connection is made (`https://` only).
    #[cfg(feature = "tls")]
    pub tls: Option<std::sync::Arc<crate::tls::TlsSetup>>,
    /// Direct, or through a forward proxy (`addrs` are then the proxy's).
    pub route: crate::route::Route,
    /// The `CONNECT` every connection starts with, through a proxy.
    pub tunnel: Option<std::sync::Arc<crate::route::connect::ConnectSetup>>,
    /// What the start's log warns about the proxy variables.
    pub route_warnings: Vec<String>,
}

impl Upstream {
    /// The host and port a connection goes to (the proxy's, through one):
    /// the ones looked up again.
    pub fn connect_host(&self) -> (String, u16) {
        match &self.route {
            crate::route::Route::Proxy { url, .. } => (url.lookup_host(), url.port),
            crate::route::Route::Direct(_) => (self.host.clone(), self.port),
        }
    }
}

/// The TLS options: `--ca-file` (repeatable), `SSL_CERT_FILE`,
/// `--tls-client-cert` with `--tls-client-key`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsFlags {
    pub ca_files: Vec<PathBuf>,
    /// `SSL_CERT_FILE`: a bundle; certificates rustls cannot parse in it
    /// are skipped (system bundles carry some), unlike `--ca-file`'s.
    pub env_ca_file: Option<PathBuf>,
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
}

/// Everything the proxy needs to run.
#[derive(Clone)]
pub struct Config {
    pub upstream: Upstream,
    pub listen: SocketAddr,
    /// The identity at start (agent name and token; the token is never
    /// logged): the identity file's when it exists at start, else the
    /// flags'. `--identity-file` and `--control-stdin` replace it live.
    pub identity: Identity,
    /// `{"agent": "...", "token": "..."}`, re-read on change and on SIGHUP.
    /// Given with `--agent` and a token it may not exist yet: it is waited
    /// for and rules once it appears and is valid.
    pub identity_file: Option<PathBuf>,
    /// Identity objects, one per line, on stdin; EOF shuts down.
    pub control_stdin: bool,
    /// `--stdio`: JSON-RPC lines on stdin and stdout; no listener.
    pub stdio: bool,
    /// Which argument of which tool is stamped with the agent name.
    pub stamps: StampMap,
    /// The tool policy's flags (`--allow-tool`, `--deny-tool`,
    /// `--show-identity-params`, `--identity-param`); the identity file's
    /// lists combine with them (`Policy::for_identity`).
    pub tools: ToolFlags,
    pub connect_timeout: Duration,
    pub response_timeout: Duration,
    pub idle_timeout: Duration,
    /// How long a request in a recorded MCP session waits for a restarting
    /// upstream before it gets an outage answer.
    pub restart_grace: Duration,
    /// A request's head and body must arrive within this of its first byte.
    pub request_timeout: Duration,
    /// An idle keep-alive client connection between requests is closed after this.
    pub keepalive_timeout: Duration,
    /// Extra browser origins allowed besides the loopback ones (`--allow-origin`).
    pub allow_origins: Vec<String>,
    /// Secret clients must present as `Authorization: Bearer` (required
    /// when listening on a non-loopback address). Never logged.
    pub client_token: Option<String>,
    /// `--audit-log PATH` (`-`: stderr): one JSON line per request and
    /// session event.
    pub audit_log: Option<AuditLog>,
    /// `--metrics-listen ADDR:PORT`: `/metrics` and `/healthz`.
    pub metrics_listen: Option<SocketAddr>,
    /// `--token-command`: the program (and its arguments) that prints the
    /// token; the identity's token is then empty until its first run.
    pub token_command: Option<Vec<String>>,
    /// The OAuth token source (`--oauth-*`), checked; the identity's token
    /// is then empty until the first token request.
    pub oauth: Option<OAuthSource>,
}

/// The OAuth client the `--oauth-*` flags make (TLS builds only: it
/// signs with ring and talks to https authorization servers).
#[cfg(feature = "tls")]
pub type OAuthSource = std::sync::Arc<crate::oauth::Client>;
/// Never made: a build without TLS refuses the `--oauth-*` flags.
#[cfg(not(feature = "tls"))]
pub type OAuthSource = std::convert::Infallible;

/// A build without TLS keeps no `--oauth-*` flag: the walk refuses them.
#[cfg(not(feature = "tls"))]
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OAuthFlags {}

#[cfg(not(feature = "tls"))]
impl OAuthFlags {
    pub fn first_given(&self) -> Option<&'static str> {
        None
    }
}

/// The `--oauth-*` flags as given.
#[cfg(feature = "tls")]
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OAuthFlags {
    pub client_id: Option<String>,
    pub client_secret_file: Option<PathBuf>,
    pub client_key_file: Option<PathBuf>,
    pub assertion_file: Option<PathBuf>,
    pub token_endpoint: Option<String>,
    pub scope: Option<String>,
    pub no_resource: bool,
    /// `--dpop`: bind tokens to a P-256 key made at start.
    pub dpop: bool,
    /// `--dpop-key-file PATH`: bind them to this key instead.
    pub dpop_key_file: Option<PathBuf>,
}

#[cfg(feature = "tls")]
impl OAuthFlags {
    /// The first `--oauth-*` or `--dpop*` flag given, by name; `None` when
    /// none was.
    pub fn first_given(&self) -> Option<&'static str> {
        [
            (self.client_id.is_some(), "--oauth-client-id"),
            (self.client_secret_file.is_some(), "--oauth-client-secret-file"),
            (self.client_key_file.is_some(), "--oauth-client-key-file"),
            (self.assertion_file.is_some(), "--oauth-assertion-file"),
            (self.token_endpoint.is_some(), "--oauth-token-endpoint"),
            (self.scope.is_some(), "--oauth-scope"),
            (self.no_resource, "--oauth-no-resource"),
            (self.dpop, "--dpop"),
            (self.dpop_key_file.is_some(), "--dpop-key-file"),
        ]
        .into_iter()
        .find_map(|(given, name)| given.then_some(name))
    }
}

/// Where the audit log goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditLog {
    /// `None`: stderr.
    pub path: Option<PathBuf>,
    /// `--audit-max-bytes`: past this the file is rotated to `PATH.1`.
    pub max_bytes: Option<u64>,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("upstream", &self.upstream)
            .field("listen", &self.listen)
            .field("identity", &self.identity)
            .field("identity_file", &self.identity_file)
            .field("control_stdin", &self.control_stdin)
            .field("stamps", &self.stamps)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("idle_timeout", &self.idle_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("restart_grace", &self.restart_grace)
            .field("keepalive_timeout", &self.keepalive_timeout)
            .field("allow_origins", &self.allow_origins)
            .field("client_token", &self.client_token.as_ref().map(|_| "<redacted>"))
            .field("token_command", &self.token_command)
            .field("oauth", &self.oauth.is_some())
            .finish()
    }
}

/// What parsing asked for instead of a config, or why it failed.
#[derive(Debug, PartialEq, Eq)]
pub enum ConfigError {
    Help,
    Version,
    UnknownFlag(String),
    MissingValue(&'static str),
    Missing(&'static str),
    Invalid {
        flag: &'static str,
        why: &'static str,
    },
    /// A token file could not be read (the kind, never the contents).
    TokenFile(PathBuf, std::io::ErrorKind),
    /// A non-loopback `--listen` without `--client-token-file`.
    ExposedWithoutClientToken,
    /// A non-loopback `--metrics-listen` without `--client-token-file`.
    MetricsExposedWithoutClientToken,
    EmptyToken,
    InvalidToken,
    /// Two flags that cannot be given together.
    Conflict {
        flag: &'static str,
        other: &'static str,
    },
    /// `--agent` refused.
    InvalidAgent(IdentityError),
    /// The identity file at start: unreadable or invalid (never its contents).
    IdentityFile(PathBuf, String),
    /// `--identity-file` with only half of a flag identity: `given` is the
    /// flag present, `missing` what the starting identity still lacks.
    PartialIdentity {
        given: &'static str,
        missing: &'static str,
    },
    /// `https://` in a binary built without the `tls` feature.
    Https,
    /// The TLS setup failed (a file named, never its bytes).
    Tls(String),
    /// A proxy variable refused, or its host not resolved (never its value).
    Proxy(String),
    Resolve(String),
    /// `--probe` with another argument (named, never its value).
    ProbeNotAlone(String),
    /// An `--oauth-*` flag in a binary built without the `tls` feature.
    OAuthWithoutTls(&'static str),
    /// The OAuth token source cannot be set up (a flag or file named,
    /// never a secret).
    #[cfg(feature = "tls")]
    OAuth(String),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Help => f.write_str("help requested"),
            ConfigError::Version => f.write_str("version requested"),
            ConfigError::UnknownFlag(s) => write!(f, "unknown argument '{s}' (see --help)"),
            ConfigError::MissingValue(flag) => write!(f, "{flag} needs a value"),
            ConfigError::Missing(what) => write!(f, "missing {what} (see --help)"),
            ConfigError::Invalid { flag, why } => write!(f, "invalid {flag}: {why}"),
            ConfigError::TokenFile(p, kind) => {
                write!(f, "cannot read token file {}: {kind}", p.display())
            }
            ConfigError::ExposedWithoutClientToken => f.write_str(
                "--listen on a non-loopback address needs --client-token-file: anything that reaches the port could act as the agent",
            ),
            ConfigError::MetricsExposedWithoutClientToken => f.write_str(
                "--metrics-listen on a non-loopback address needs --client-token-file, as --listen does",
            ),
            ConfigError::EmptyToken => f.write_str("the token is empty"),
            ConfigError::Conflict { flag, other } => {
                write!(f, "{flag} cannot be given with {other}: give one token source")
            }
            ConfigError::InvalidToken => {
                f.write_str("the token must be visible ASCII without spaces (it is sent in a header)")
            }
            ConfigError::Https => f.write_str(
                "--upstream: https:// is not supported: this binary was built without TLS (the `tls` feature); \
                 use the default build, or http://",
            ),
            ConfigError::Tls(why) => write!(f, "TLS: {why}"),
            ConfigError::Proxy(why) => write!(f, "{why}"),
            ConfigError::InvalidAgent(e) => write!(f, "invalid --agent: {e}"),
            ConfigError::IdentityFile(p, why) => write!(f, "identity file {}: {why}", p.display()),
            ConfigError::PartialIdentity { given, missing } => write!(
                f,
                "--identity-file with {given} needs {missing} too: the flags give the starting identity \
                 until the file exists (or give --identity-file alone)"
            ),
            ConfigError::Resolve(host) => write!(f, "--upstream: cannot resolve host '{host}'"),
            ConfigError::OAuthWithoutTls(flag) => write!(
                f,
                "{flag}: this binary was built without TLS (the `tls` feature), which OAuth needs \
                 (signing, https authorization servers); use the default build"
            ),
            #[cfg(feature = "tls")]
            ConfigError::OAuth(why) => write!(f, "OAuth: {why}"),
            ConfigError::ProbeNotAlone(flag) => write!(
                f,
                "--probe URL takes no other argument (got {flag}): it probes the URL and exits"
            ),
        }
    }
}

pub const USAGE: &str = r#"mcp-identity-proxy: a local identity proxy for one MCP agent.

Relays MCP streamable HTTP (POST/GET/DELETE) and legacy SSE (GET /sse,
POST /messages/) to one upstream server, path and query unchanged. Replaces
whatever credentials the client sent with the agent's token (Authorization:
Bearer, X-Agent-Token), stamps the agent's name into tools/call arguments
(overwriting what the client sent; a body that cannot be stamped safely is
refused with 400), and sends exactly one Mcp-Session-Id line back.

USAGE (the identity comes from the flags, an identity file, or both):
    MCP_PROXY_TOKEN=TOKEN mcp-identity-proxy --upstream URL --agent NAME [OPTIONS]
    mcp-identity-proxy --upstream URL --agent NAME --token-file PATH [OPTIONS]
    mcp-identity-proxy --upstream URL --identity-file PATH [OPTIONS]
    mcp-identity-proxy --upstream URL --agent NAME --token-file PATH \
        --identity-file PATH [OPTIONS]
    mcp-identity-proxy --probe http://127.0.0.1:PORT/healthz

    Point the client at http://127.0.0.1:PORT plus the upstream's path
    (e.g. /mcp). Everything but the port line goes to stderr.

    With --stdio instead, the host spawns the proxy as its MCP server:
    JSON-RPC messages, one per line, on stdin and stdout (nothing else on
    stdout; logs on stderr); no port is opened. stdin's end lets answers in
    flight finish (5 s at most), DELETEs the session and exits 0.

UPSTREAM AND IDENTITY:
    --upstream URL          http://HOST[:PORT][/PATH] (port 80 by default)
                            or https://HOST[:PORT][/PATH] (port 443): TLS
                            1.2 or 1.3, ALPN http/1.1, the certificate
                            checked against HOST (DNS name or IP address)
                            with the Mozilla roots built in, plus
                            --ca-file and SSL_CERT_FILE; no way to turn
                            the check off. A HOST name is resolved at start
                            and again, off the event loop, after a failed
                            connect and every 60 s (an IP or localhost
                            never is; the minimal build, without TLS,
                            resolves once)
    --ca-file PATH          also trust the CA certificates in this PEM
                            file (repeatable; SSL_CERT_FILE adds one more)
    --tls-client-cert PATH  mutual TLS: the client certificate chain (PEM),
    --tls-client-key PATH   and its private key (PEM); both or neither
    --agent NAME            the agent's name: 1-256 bytes, no control
                            characters
    --token-file PATH       file holding the token (surrounding whitespace
                            trimmed; visible ASCII, at most 4096 bytes);
                            wins over MCP_PROXY_TOKEN. Never give the token
                            in argv.
    --token-command CMDLINE a program (no shell; double quotes group words)
                            that prints the token: a Kubernetes
                            ExecCredential, an OAuth token response
                            (access_token, expires_in) or one bare line.
                            Run at start (the proxy starts once it has a
                            token; a failure is exit 2), again when 20 % of
                            the token's lifetime is left (expires_in, the
                            expirationTimestamp or the JWT's exp), and again
                            after a failure (10 s, doubling, at most 5 min;
                            the token in force is kept) and after a 401 (at
                            most once per 10 s; the refused request waits
                            for the new token, up to --connect-timeout, and
                            is sent again under it once). MCP_PROXY_EXEC_INFO
                            tells it {"upstream", "agent", "reason"}; 30 s
                            at most a run, 64 KiB of stdout, stderr logged.
                            Its token goes in Authorization only. Not with
                            --token-file, --identity-file, --control-stdin.
    --identity-file PATH    a JSON file {"agent": "NAME", "token": "TOKEN"},
                            re-read at once on a change (atomic rename,
                            in-place write, or the file created; inotify
                            on Linux, else polled every 250 ms) and on
                            SIGHUP. Given alone, it must
                            exist and be valid at start. Given with --agent
                            and a token (--token-file or MCP_PROXY_TOKEN),
                            the flags give the starting identity: a file
                            that exists at start must be valid (else exit
                            2) and rules from the start; a file that does
                            not exist yet is waited for (logged at info)
                            and rules as soon as it appears and is valid.
                            --agent without a token, or --token-file
                            without --agent, is refused (exit 2). Later, a
                            bad file is logged (never the token) and the
                            current identity kept. Windows has no SIGHUP:
                            there the file is only polled (or use
                            --control-stdin).
    --stdio                 speak MCP over stdin/stdout instead of
                            listening (not with --listen or
                            --control-stdin); the upstream is reached as
                            streamable HTTP, or as legacy SSE when its
                            path ends in /sse or initialize gets a 4xx
                            and a GET of the URL offers an endpoint
    --control-stdin         read identity objects, one JSON per line with
                            both fields, from stdin (a pipe or terminal);
                            shut down gracefully at EOF, so the proxy never
                            outlives the wrapper that started it
    --stamp TOOL=PARAM      stamp the agent name into argument PARAM of tool
                            TOOL (repeatable; adds to or overrides defaults)
    --no-default-stamps     drop the default map: 'sender' for chat_send,
                            chat_read, chat_resync, chat_decision,
                            chat_set_hat, chat_claim, chat_rules,
                            chat_summary, chat_propose_job; 'name' for
                            chat_join (chat_claim's own 'name' is never
                            touched)

TOOL POLICY:
    --allow-tool GLOB       only tools matching a GLOB (* and ? match) are
                            listed and may be called (repeatable; an allow
                            list, once given, is exhaustive)
    --deny-tool GLOB        tools matching GLOB are neither listed nor
                            callable (repeatable; deny wins over allow).
                            A hidden tool's tools/call is answered by the
                            proxy with JSON-RPC error -32602 and its id,
                            and never reaches the upstream
    --show-identity-params  keep the stamped parameters (sender, ...) in
                            the tools/list schemas; by default they are
                            removed, so the model never sees or fills them
                            (the proxy stamps them on every call anyway)
    --identity-param NAME   a listed tool with a top-level string parameter
                            NAME is stamped from then on, as if in the map
                            (repeatable) [default: sender, unless
                            --no-default-stamps]
    The identity file may carry "allow_tools" and "deny_tools" (arrays of
    globs) beside agent and token: allow_tools replaces the flags' allow
    list (an empty one allows nothing), deny_tools adds to the flags'.

LISTENER AND LIMITS:
    --listen ADDR:PORT      address to listen on; port 0: the OS picks one
                            [default: 127.0.0.1:0]; localhost:PORT allowed;
                            a non-loopback address needs --client-token-file
    --client-token-file PATH
                            secret clients must send as 'Authorization:
                            Bearer <secret>' (401 otherwise; replaced
                            upstream like any client credential)
    --allow-origin ORIGIN   also accept this browser Origin, e.g.
                            https://app.example (repeatable) [default: only
                            http(s) origins on localhost, 127.0.0.1, [::1]]
    --connect-timeout SECS  upstream connect, then 504 [default: 5]
    --response-timeout SECS
                            request sent -> response head, then 504
                            [default: 300]
    --idle-timeout SECS     no byte either way on an open response or
                            stream, then it closes [default: 300]
    --request-timeout SECS  a request's head and body must arrive within
                            SECS of its first byte (a byte does not extend
                            it), else 408 and close [default: 10]
    --keepalive-timeout SECS
                            an idle client connection (before its first
                            request or between requests) is closed
                            [default: 75]
    --restart-grace SECS    a request in an MCP session the proxy saw
                            created waits this long for an unreachable
                            upstream (a restart), then gets an outage
                            answer: 200 with a JSON-RPC error carrying its
                            id, 202 for notifications, 502 for GET and
                            DELETE [default: 5]
                            (every SECS may have a fraction: 0.5)

FORWARD PROXY (read once at start):
    An https:// upstream goes through https_proxy, else HTTPS_PROXY, else
    all_proxy, else ALL_PROXY (lowercase first, as curl): http://[USER:
    PASSWORD@]HOST[:PORT] (port 1080 when absent, as curl; USER and
    PASSWORD percent-decoded, sent as Proxy-Authorization: Basic). A
    CONNECT tunnel is opened within --connect-timeout, then TLS inside it
    checked against the upstream host. An https:// proxy URL is refused
    (exit 2). A proxy that refuses, closes, stalls or answers garbage gets
    the unreachable-upstream answer. no_proxy, else NO_PROXY: a comma
    list; * alone for all; a name matches itself and its subdomains (a
    leading . or *. the same); IPv4/IPv6 addresses and CIDR ranges, in
    brackets or not; an entry with :PORT matches that port only. A
    loopback upstream never goes through a proxy. Not in the minimal build
    (without TLS).
    --no-proxy-env          ignore all of these variables
    --upstream-proxy-http   send a plain http:// upstream through the proxy
                            too (the proxy can read the agent's token)

AUDIT AND HEALTH:
    --audit-log PATH        one JSON line per JSON-RPC request and per
                            session or identity event (README lists the
                            keys); - for stderr. Never a token or an
                            argument value other than a claimed identity.
                            SIGUSR1 reopens PATH (after logrotate moves it)
    --audit-max-bytes N     rotate PATH to PATH.1 before it would pass N
                            bytes (at least 4096)
    --metrics-listen ADDR:PORT
                            a second listener answering only GET /metrics
                            (Prometheus text) and GET /healthz (200 while
                            the upstream answers, 503 once unreachable for
                            longer than --restart-grace); a non-loopback
                            address needs --client-token-file, which its
                            clients must then send. Prints
                            '  metrics: port N' after the MCP port line

    -h, --help              print this help
    -V, --version           print the version

HEALTH PROBE (for a HEALTHCHECK in an image without curl):
    --probe URL             GET URL, http://HOST[:PORT][/PATH] (plain http
                            only: https is refused), and exit: 0 on a 200, 1 on
                            anything else (another status, a refused or
                            closed connection, garbage, no status line
                            within 3 s, a host name that does not
                            resolve), 2 for a bad URL. Prints nothing on
                            a 200, else one line on stderr saying why.
                            Nothing else starts: any other argument with
                            it is refused (exit 2); MCP_PROXY_TOKEN and
                            RUST_LOG are ignored.

OUTPUT:
    Once listening, prints exactly '  MCP proxy: port N' on stdout.

ENVIRONMENT:
    MCP_PROXY_TOKEN         the token, when --token-file is not given
                            (ignored with --identity-file and no --agent)
    RUST_LOG                log filter on stderr (error, warn, info, debug,
                            trace) [default: warn]; info logs one line per
                            exchange. Tokens are never logged.
    https_proxy HTTPS_PROXY all_proxy ALL_PROXY no_proxy NO_PROXY
                            the forward proxy (see FORWARD PROXY)

EXIT STATUS:
    0  clean shutdown: SIGINT, SIGTERM (Windows: Ctrl-C, Ctrl-Break,
       console close), or stdin EOF with --control-stdin (in-flight
       exchanges get up to 5 s)
    1  the event loop failed
    2  bad arguments or configuration (unreadable token file, identity
       file unreadable or invalid at start, or missing when given alone,
       unresolvable upstream host, --control-stdin on a file or /dev/null
       or NUL)
    3  cannot bind the listen address (a fixed port in use prints
       '  MCP proxy: port N in use (shared with another instance)')
    With --probe: 0 a 200, 1 anything else, 2 a bad URL or argument.

EXAMPLE:
    $ mcp-identity-proxy --upstream http://127.0.0.1:8200/mcp \
          --agent claude-prime --token-file ~/.agentchattr/claude.token
      MCP proxy: port 40123
    $ claude mcp add --transport http chat http://127.0.0.1:40123/mcp

    Live identity: write the new file next to the old one, then rename it:
    $ printf '{"agent": "claude-2", "token": "%s"}\n' "$TOKEN" > id.json.new
    $ mv id.json.new id.json
"#;

/// The `--help` section of the OAuth token source (TLS builds: it signs
/// with ring and talks to https authorization servers).
#[cfg(feature = "tls")]
pub const USAGE_OAUTH: &str = r#"
OAUTH TOKEN SOURCE (instead of --token-file and the others):
    --oauth-client-id ID    OAuth 2.0 client credentials (RFC 6749 4.4):
    --oauth-client-secret-file PATH
                            with the client's secret (client_secret_basic
                            or _post, as the server's metadata says), or
    --oauth-client-key-file PATH
                            with its private key (PEM, EC P-256 or RSA:
                            private_key_jwt, ES256/RS256)
    --oauth-assertion-file PATH
                            a workload's JWT (a Kubernetes projected token,
                            a SPIFFE JWT-SVID), re-read at every token
                            request: the RFC 7523 jwt-bearer grant
    --oauth-token-endpoint URL
                            skip discovery [default: found from the 401's
                            WWW-Authenticate, the protected-resource and
                            the authorization-server metadata]
    --oauth-scope "A B"     [default: the 401's scope, else
                            scopes_supported, else none]
    --oauth-no-resource     no RFC 8707 resource in token requests (for
                            servers that refuse it)
    --dpop                  bind the OAuth tokens to a P-256 key made at
                            start (RFC 9449): a proof on every request and
                            token request, the server's DPoP-Nonce used
    --dpop-key-file PATH    the same with this key (PEM, P-256 or RSA)
                            The token is fetched at start, renewed and
                            replayed after a 401 as --token-command's; it
                            goes in Authorization only; token endpoints
                            must be https (or loopback); redirects are not
                            followed. Not with the other token sources.
"#;

/// The minimal build has no OAuth client.
#[cfg(not(feature = "tls"))]
pub const USAGE_OAUTH: &str = r#"
OAUTH TOKEN SOURCE:
    --oauth-*, --dpop*      not in this build: it was built without TLS
"#;

/// What the command line says, flag by flag, before anything is read,
/// resolved or checked against anything else: the argv walk's output
/// (ripgrep's low-level arguments). Each field is the flag of its name;
/// values that need no other flag to be checked (a listen address, a
/// duration, an origin, a stamp pair) are checked here.
#[derive(Clone, Debug, PartialEq)]
pub struct Flags {
    pub upstream: Option<String>,
    pub agent: Option<String>,
    pub token_file: Option<PathBuf>,
    /// `--token-command CMDLINE`, split (`credentials::cmdline`).
    pub token_command: Option<Vec<String>>,
    /// The `--oauth-*` flags.
    pub oauth: OAuthFlags,
    pub listen: SocketAddr,
    pub connect_timeout: Duration,
    pub response_timeout: Duration,
    pub idle_timeout: Duration,
    pub request_timeout: Duration,
    pub restart_grace: Duration,
    pub keepalive_timeout: Duration,
    pub allow_origins: Vec<String>,
    pub identity_file: Option<PathBuf>,
    pub control_stdin: bool,
    pub stdio: bool,
    /// `--listen` was given (refused beside `--stdio`).
    pub listen_given: bool,
    pub extra_stamps: Vec<(String, String)>,
    pub default_stamps: bool,
    pub client_token_file: Option<PathBuf>,
    /// `--allow-tool GLOB`s; `None` when none was given (all allowed).
    pub allow_tools: Option<Vec<String>>,
    pub deny_tools: Vec<String>,
    pub show_identity_params: bool,
    /// `--identity-param NAME`s as given (the default is decided by
    /// `Config::from_flags`).
    pub identity_params: Vec<String>,
    pub audit_log: Option<String>,
    pub audit_max_bytes: Option<u64>,
    pub metrics_listen: Option<SocketAddr>,
    /// `--probe URL`, syntax checked: a mode of its own (`Mode::Probe`),
    /// so the walk refuses it beside any other argument.
    pub probe: Option<probe::Url>,
    /// `--ca-file`, `--tls-client-cert`, `--tls-client-key` (`SSL_CERT_FILE`
    /// is added by `Config::from_flags`).
    pub tls: TlsFlags,
    /// `--no-proxy-env` and `--upstream-proxy-http`.
    pub route: crate::route::RouteFlags,
}

impl Default for Flags {
    fn default() -> Flags {
        Flags {
            upstream: None,
            agent: None,
            token_file: None,
            token_command: None,
            oauth: OAuthFlags::default(),
            listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            connect_timeout: limits::CONNECT_TIMEOUT,
            response_timeout: limits::RESPONSE_TIMEOUT,
            idle_timeout: limits::IDLE_TIMEOUT,
            request_timeout: limits::REQUEST_TIMEOUT,
            restart_grace: limits::RESTART_GRACE,
            keepalive_timeout: limits::KEEPALIVE_TIMEOUT,
            allow_origins: Vec::new(),
            identity_file: None,
            control_stdin: false,
            stdio: false,
            listen_given: false,
            extra_stamps: Vec::new(),
            default_stamps: true,
            client_token_file: None,
            allow_tools: None,
            deny_tools: Vec::new(),
            show_identity_params: false,
            identity_params: Vec::new(),
            audit_log: None,
            audit_max_bytes: None,
            metrics_listen: None,
            probe: None,
            tls: TlsFlags::default(),
            route: crate::route::RouteFlags::default(),
        }
    }
}

impl Flags {
    /// Walks argv (without the program name): `--flag value` or
    /// `--flag=value`; `--help` and `--version` stop the walk, wherever
    /// they are (with `--probe` too).
    pub fn parse<I>(args: I) -> Result<Flags, ConfigError>
    where
        I: IntoIterator<Item = String>,
    {
        let mut f = Flags::default();
        let mut args = args.into_iter();
        // The first argument other than one `--probe`: refused with it.
        let mut beside_probe: Option<String> = None;
        while let Some(arg) = args.next() {
            let (flag, inline) = match arg.split_once('=') {
                Some((name, v)) if name.starts_with("--") => (name.to_string(), Some(v.to_string())),
                _ => (arg.clone(), None),
            };
            if flag != "--probe" || f.probe.is_some() {
                beside_probe.get_or_insert_with(|| flag.clone());
            }
            let mut value = |name: &'static str| -> Result<String, ConfigError> {
                match inline.clone() {
                    Some(v) => Ok(v),
                    None => args.next().ok_or(ConfigError::MissingValue(name)),
                }
            };
            let secs = |name: &'static str, v: Result<String, ConfigError>| parse_secs(name, &v?);
            match flag.as_str() {
                "-h" | "--help" => return Err(ConfigError::Help),
                "-V" | "--version" => return Err(ConfigError::Version),
                "--upstream" => f.upstream = Some(value("--upstream")?),
                "--agent" => f.agent = Some(value("--agent")?),
                "--token-file" => f.token_file = Some(PathBuf::from(value("--token-file")?)),
                "--token-command" => {
                    let argv =
                        crate::credentials::cmdline::split(&value("--token-command")?).map_err(|_| {
                            ConfigError::Invalid {
                            flag: "--token-command",
                            why: "expected a program and its arguments (double quotes group words; no shell)",
                        }
                        })?;
                    f.token_command = Some(argv);
                }
                name if OAUTH_FLAGS.contains(&name) => oauth_flag(&mut f.oauth, name, &mut value)?,
                "--listen" => {
                    f.listen = parse_listen(&value("--listen")?)?;
                    f.listen_given = true;
                }
                "--stdio" => f.stdio = true,
                "--connect-timeout" => {
                    f.connect_timeout = secs("--connect-timeout", value("--connect-timeout"))?
                }
                "--response-timeout" => {
                    f.response_timeout = secs("--response-timeout", value("--response-timeout"))?
                }
                "--idle-timeout" => f.idle_timeout = secs("--idle-timeout", value("--idle-timeout"))?,
                "--restart-grace" => f.restart_grace = secs("--restart-grace", value("--restart-grace"))?,
                "--request-timeout" => {
                    f.request_timeout = secs("--request-timeout", value("--request-timeout"))?
                }
                "--keepalive-timeout" => {
                    f.keepalive_timeout = secs("--keepalive-timeout", value("--keepalive-timeout"))?
                }
                "--allow-origin" => {
                    let origin = value("--allow-origin")?;
                    let origin = origin.trim_end_matches('/');
                    if !(origin.starts_with("http://") || origin.starts_with("https://")) || origin.len() < 9
                    {
                        return Err(ConfigError::Invalid {
                            flag: "--allow-origin",
                            why: "expected http(s)://HOST[:PORT]",
                        });
                    }
                    f.allow_origins.push(origin.to_ascii_lowercase());
                }
                "--identity-file" => f.identity_file = Some(PathBuf::from(value("--identity-file")?)),
                "--control-stdin" => f.control_stdin = true,
                "--no-default-stamps" => f.default_stamps = false,
                "--stamp" => {
                    let v = value("--stamp")?;
                    let pair =
                        parse_stamp_arg(&v).map_err(|why| ConfigError::Invalid { flag: "--stamp", why })?;
                    f.extra_stamps.push(pair);
                }
                "--client-token-file" => {
                    f.client_token_file = Some(PathBuf::from(value("--client-token-file")?))
                }
                "--allow-tool" => {
                    let glob = tool_glob("--allow-tool", value("--allow-tool")?)?;
                    f.allow_tools.get_or_insert_with(Vec::new).push(glob);
                }
                "--deny-tool" => f.deny_tools.push(tool_glob("--deny-tool", value("--deny-tool")?)?),
                "--show-identity-params" => f.show_identity_params = true,
                "--identity-param" => {
                    let name = value("--identity-param")?;
                    if name.is_empty() || name.chars().any(char::is_control) {
                        return Err(ConfigError::Invalid {
                            flag: "--identity-param",
                            why: "expected a parameter name without control characters",
                        });
                    }
                    f.identity_params.push(name);
                }
                "--audit-log" => {
                    let path = value("--audit-log")?;
                    if path.is_empty() {
                        return Err(ConfigError::Invalid {
                            flag: "--audit-log",
                            why: "expected a path, or - for stderr",
                        });
                    }
                    f.audit_log = Some(path);
                }
                "--audit-max-bytes" => {
                    let n = value("--audit-max-bytes")?.parse::<u64>().ok().filter(|&n| n >= 4096);
                    let why = "expected a size in bytes, at least 4096";
                    f.audit_max_bytes =
                        Some(n.ok_or(ConfigError::Invalid { flag: "--audit-max-bytes", why })?);
                }
                "--metrics-listen" => {
                    let addr =
                        parse_listen(&value("--metrics-listen")?).map_err(|_| ConfigError::Invalid {
                            flag: "--metrics-listen",
                            why: "expected ADDR:PORT, e.g. 127.0.0.1:9464",
                        })?;
                    f.metrics_listen = Some(addr);
                }
                "--ca-file" => f.tls.ca_files.push(PathBuf::from(value("--ca-file")?)),
                "--tls-client-cert" => f.tls.client_cert = Some(PathBuf::from(value("--tls-client-cert")?)),
                "--tls-client-key" => f.tls.client_key = Some(PathBuf::from(value("--tls-client-key")?)),
                "--no-proxy-env" => f.route.ignore_env = true,
                "--upstream-proxy-http" => f.route.proxy_http = true,
                "--probe" => {
                    let url = probe::parse_url(&value("--probe")?)
                        .map_err(|why| ConfigError::Invalid { flag: "--probe", why })?;
                    f.probe = Some(url);
                }
                _ => return Err(ConfigError::UnknownFlag(arg)),
            }
        }
        if let (Some(_), Some(flag)) = (&f.probe, beside_probe) {
            return Err(ConfigError::ProbeNotAlone(flag));
        }
        if f.stdio && f.listen_given {
            let why = "a stdio server opens no port: drop --listen (or --stdio)";
            return Err(ConfigError::Invalid { flag: "--stdio", why });
        }
        if f.stdio && f.control_stdin {
            let why = "stdin carries JSON-RPC: give a live identity with --identity-file instead of --control-stdin";
            return Err(ConfigError::Invalid { flag: "--stdio", why });
        }
        Ok(f)
    }
}

/// What the command line asks for.
#[derive(Debug)]
pub enum Mode {
    /// Run the proxy.
    Proxy(Box<Config>),
    /// `--probe URL`: GET the URL, exit by its status; nothing else starts
    /// and the environment (`MCP_PROXY_TOKEN`) is not read.
    Probe(probe::Url),
}

/// Parse argv (without the program name) and the environment into what
/// to run (`main`'s entry).
pub fn parse_mode<I>(args: I, env_token: Option<String>) -> Result<Mode, ConfigError>
where
    I: IntoIterator<Item = String>,
{
    let mut flags = Flags::parse(args)?;
    match flags.probe.take() {
        Some(url) => Ok(Mode::Probe(url)),
        None => Config::from_flags(flags, env_token).map(|c| Mode::Proxy(Box::new(c))),
    }
}

/// The OAuth token source's flags (all of them take the walk to
/// `oauth_flag`).
const OAUTH_FLAGS: [&str; 9] = [
    "--oauth-client-id",
    "--oauth-client-secret-file",
    "--oauth-client-key-file",
    "--oauth-assertion-file",
    "--oauth-token-endpoint",
    "--oauth-scope",
    "--oauth-no-resource",
    "--dpop",
    "--dpop-key-file",
];

/// One of `OAUTH_FLAGS` into `o`; `value` takes its value.
#[cfg(feature = "tls")]
fn oauth_flag(
    o: &mut OAuthFlags,
    name: &str,
    value: &mut dyn FnMut(&'static str) -> Result<String, ConfigError>,
) -> Result<(), ConfigError> {
    match name {
        "--oauth-client-id" => o.client_id = Some(value("--oauth-client-id")?),
        "--oauth-client-secret-file" => {
            o.client_secret_file = Some(PathBuf::from(value("--oauth-client-secret-file")?))
        }
        "--oauth-client-key-file" => {
            o.client_key_file = Some(PathBuf::from(value("--oauth-client-key-file")?))
        }
        "--oauth-assertion-file" => o.assertion_file = Some(PathBuf::from(value("--oauth-assertion-file")?)),
        "--oauth-token-endpoint" => o.token_endpoint = Some(value("--oauth-token-endpoint")?),
        "--oauth-scope" => o.scope = Some(value("--oauth-scope")?),
        "--oauth-no-resource" => o.no_resource = true,
        "--dpop" => o.dpop = true,
        "--dpop-key-file" => o.dpop_key_file = Some(PathBuf::from(value("--dpop-key-file")?)),
        _ => {}
    }
    Ok(())
}

/// A build without TLS has no OAuth client: each of `OAUTH_FLAGS` is exit 2
/// at once (the flags are not even kept).
#[cfg(not(feature = "tls"))]
fn oauth_flag(
    _: &mut OAuthFlags,
    name: &str,
    _: &mut dyn FnMut(&'static str) -> Result<String, ConfigError>,
) -> Result<(), ConfigError> {
    let flag = OAUTH_FLAGS.iter().find(|f| **f == name).copied().unwrap_or("--oauth-*");
    Err(ConfigError::OAuthWithoutTls(flag))
}

/// Parse argv (without the program name) and the environment into the
/// proxy's `Config` (`--probe` alone, no proxy setting, gets
/// `Missing("--upstream")`).
pub fn parse<I>(args: I, env_token: Option<String>) -> Result<Config, ConfigError>
where
    I: IntoIterator<Item = String>,
{
    Config::from_flags(Flags::parse(args)?, env_token)
}

impl Config {
    /// Turns the flags into a checked `Config` (ripgrep's high-level
    /// arguments): reads the token and identity files, resolves the
    /// upstream, builds the stamp map, and checks what depends on more than
    /// one flag (the identity's halves, a non-loopback listener's client
    /// token). `env_token` is `MCP_PROXY_TOKEN`.
    pub fn from_flags(flags: Flags, env_token: Option<String>) -> Result<Config, ConfigError> {
        let Flags {
            upstream,
            agent,
            token_file,
            token_command,
            oauth,
            listen,
            connect_timeout,
            response_timeout,
            idle_timeout,
            request_timeout,
            restart_grace,
            keepalive_timeout,
            allow_origins,
            identity_file,
            control_stdin,
            stdio,
            listen_given: _,
            extra_stamps,
            default_stamps,
            client_token_file,
            allow_tools,
            deny_tools,
            show_identity_params,
            identity_params,
            audit_log,
            audit_max_bytes,
            metrics_listen,
            // Alone by `Flags::parse`: `--upstream` is missing beside it.
            probe: _,
            mut tls,
            route,
        } = flags;
        tls.env_ca_file = std::env::var_os("SSL_CERT_FILE").filter(|v| !v.is_empty()).map(PathBuf::from);
        // The proxy variables, read once (not at all with --no-proxy-env).
        let proxy_env = if route.ignore_env {
            crate::route::ProxyEnv::default()
        } else {
            crate::route::ProxyEnv::from_process()
        };
        let upstream = upstream.ok_or(ConfigError::Missing("--upstream"))?;
        let upstream = routed_upstream(&upstream, &tls, &proxy_env, route)?;
        let renewed = match (&token_command, oauth.first_given()) {
            (Some(_), Some(other)) => return Err(ConfigError::Conflict { flag: "--token-command", other }),
            (Some(_), None) => Some("--token-command"),
            (None, oauth) => oauth,
        };
        let identity = match renewed {
            // One token source: a renewed one replaces the others.
            Some(flag) => {
                let beside = match (&token_file, &identity_file, control_stdin) {
                    (Some(_), _, _) => Some("--token-file"),
                    (_, Some(_), _) => Some("--identity-file"),
                    (_, _, true) => Some("--control-stdin"),
                    _ => None,
                };
                if let Some(other) = beside {
                    return Err(ConfigError::Conflict { flag, other });
                }
                let agent = agent.ok_or(ConfigError::Missing("--agent"))?;
                identity::validate_agent(&agent).map_err(ConfigError::InvalidAgent)?;
                Identity::new(agent, String::new())
            }
            None => start_identity(agent, token_file, env_token, identity_file.as_deref())?,
        };
        let oauth = oauth_source(oauth, &upstream, &tls, connect_timeout)?;
        let mut stamps = if default_stamps { StampMap::agentchattr() } else { StampMap::empty() };
        for (tool, param) in &extra_stamps {
            stamps.set(tool, param);
        }
        // `sender` is learned by default while the default map is in force.
        let identity_params = match (identity_params.is_empty(), default_stamps) {
            (true, true) => vec!["sender".to_string()],
            _ => identity_params,
        };
        let tools = ToolFlags { allow: allow_tools, deny: deny_tools, show_identity_params, identity_params };
        let client_token = match client_token_file {
            Some(path) => {
                let t = read_token_file(&path)?.trim().to_string();
                check_token(&t)?;
                Some(t)
            }
            None => None,
        };
        if !listen.ip().is_loopback() && client_token.is_none() {
            return Err(ConfigError::ExposedWithoutClientToken);
        }
        // The same rule as --listen: what /healthz says (the agent's name)
        // is not for any host that can reach the port.
        if metrics_listen.is_some_and(|a| !a.ip().is_loopback()) && client_token.is_none() {
            return Err(ConfigError::MetricsExposedWithoutClientToken);
        }
        let audit_log = match (audit_log, audit_max_bytes) {
            (None, Some(_)) => {
                return Err(ConfigError::Invalid { flag: "--audit-max-bytes", why: "needs --audit-log PATH" })
            }
            (Some(p), Some(_)) if p == "-" => {
                return Err(ConfigError::Invalid {
                    flag: "--audit-max-bytes",
                    why: "stderr (-) is not rotated",
                })
            }
            (None, None) => None,
            (Some(p), max_bytes) => Some(AuditLog { path: (p != "-").then(|| PathBuf::from(p)), max_bytes }),
        };
        Ok(Config {
            upstream,
            listen,
            identity,
            identity_file,
            control_stdin,
            stdio,
            stamps,
            tools,
            connect_timeout,
            response_timeout,
            idle_timeout,
            request_timeout,
            keepalive_timeout,
            restart_grace,
            allow_origins,
            client_token,
            audit_log,
            metrics_listen,
            token_command,
            oauth,
        })
    }
}

/// The OAuth client the `--oauth-*` flags describe, checked now so that a
/// wrong flag or an unreadable file is exit 2 at start: which client
/// authentication (a secret or a key, not both; a client id beside
/// either), the key parsed, the files readable, the token endpoint https
/// or loopback. `None` when no `--oauth-*` flag was given.
#[cfg(feature = "tls")]
fn oauth_source(
    flags: OAuthFlags,
    upstream: &Upstream,
    tls: &TlsFlags,
    connect_timeout: Duration,
) -> Result<Option<OAuthSource>, ConfigError> {
    use crate::oauth::{read_secret, ClientAuth, Settings};
    if flags.first_given().is_none() {
        return Ok(None);
    }
    let err = |why: String| ConfigError::OAuth(why);
    let auth = match (&flags.client_secret_file, &flags.client_key_file) {
        (Some(_), Some(_)) => {
            return Err(ConfigError::Conflict {
                flag: "--oauth-client-secret-file",
                other: "--oauth-client-key-file",
            })
        }
        (Some(path), None) => {
            read_secret(path, "--oauth-client-secret-file").map_err(err)?;
            ClientAuth::Secret(path.clone())
        }
        (None, Some(path)) => {
            let pem = std::fs::read(path)
                .map_err(|e| err(format!("--oauth-client-key-file {}: {}", path.display(), e.kind())))?;
            let key = crate::credentials::jws::SigningKey::from_pem(&pem)
                .map_err(|e| err(format!("--oauth-client-key-file {}: {e}", path.display())))?;
            ClientAuth::Key(Box::new(key))
        }
        (None, None) => ClientAuth::Nothing,
    };
    match (&auth, &flags.assertion_file, &flags.client_id) {
        (ClientAuth::Nothing, None, _) => {
            return Err(err("give --oauth-client-secret-file, --oauth-client-key-file or \
                            --oauth-assertion-file: the OAuth flags need a credential"
                .into()))
        }
        (ClientAuth::Secret(_) | ClientAuth::Key(_), _, None) => {
            return Err(ConfigError::Missing(
                "--oauth-client-id (a client secret or key belongs to a client)",
            ))
        }
        _ => {}
    }
    if let Some(path) = &flags.assertion_file {
        read_secret(path, "--oauth-assertion-file").map_err(err)?;
    }
    if let Some(endpoint) = &flags.token_endpoint {
        crate::credentials::oauth::check_endpoint(endpoint)
            .map_err(|e| err(format!("--oauth-token-endpoint: {e}")))?;
    }
    let dpop = match (&flags.dpop_key_file, flags.dpop) {
        (Some(path), _) => {
            let pem = std::fs::read(path)
                .map_err(|e| err(format!("--dpop-key-file {}: {}", path.display(), e.kind())))?;
            let key = crate::credentials::jws::SigningKey::from_pem(&pem)
                .map_err(|e| err(format!("--dpop-key-file {}: {e}", path.display())))?;
            Some(std::sync::Arc::new(key))
        }
        (None, true) => Some(std::sync::Arc::new(
            crate::credentials::jws::SigningKey::generate_p256().map_err(|e| err(format!("--dpop: {e}")))?,
        )),
        (None, false) => None,
    };
    let scheme = if upstream.https { "https" } else { "http" };
    let parsed = crate::url::parse(&format!("{scheme}://{}{}", upstream.authority, upstream.path))
        .map_err(|why| err(format!("--upstream: {why}")))?;
    let settings = Settings {
        upstream: parsed,
        client_id: flags.client_id,
        auth,
        assertion_file: flags.assertion_file,
        token_endpoint: flags.token_endpoint,
        scope: flags.scope,
        send_resource: !flags.no_resource,
        dpop,
        tls: crate::tls::client_config(tls).map_err(ConfigError::Tls)?,
        connect_timeout,
    };
    Ok(Some(std::sync::Arc::new(crate::oauth::Client::new(settings))))
}

/// A build without TLS has no OAuth client (the walk refused its flags).
#[cfg(not(feature = "tls"))]
fn oauth_source(
    _: OAuthFlags,
    _upstream: &Upstream,
    _tls: &TlsFlags,
    _connect_timeout: Duration,
) -> Result<Option<OAuthSource>, ConfigError> {
    Ok(None)
}

/// A tool-name glob (`*` and `?`): not empty, no control characters.
fn tool_glob(flag: &'static str, glob: String) -> Result<String, ConfigError> {
    if glob.is_empty() || glob.chars().any(char::is_control) {
        return Err(ConfigError::Invalid { flag, why: "expected a tool-name glob (* and ? match)" });
    }
    Ok(glob)
}

/// The identity at start, from `--agent` with a token (`--token-file`, else
/// `MCP_PROXY_TOKEN`) and/or `--identity-file`.
fn start_identity(
    agent: Option<String>,
    token_file: Option<PathBuf>,
    env_token: Option<String>,
    identity_file: Option<&Path>,
) -> Result<Identity, ConfigError> {
    let flag_token_file = token_file.is_some();
    let flag_token = match token_file {
        Some(path) => Some(read_token_file(&path)?),
        None => env_token,
    };
    let Some(path) = identity_file else {
        let agent = agent.ok_or(ConfigError::Missing("--agent (or --identity-file)"))?;
        return flag_identity(agent, flag_token);
    };
    // With `--identity-file`, the flags are a starting identity only
    // when both halves are given; `MCP_PROXY_TOKEN` without `--agent`
    // is ignored, so a wrapper's environment cannot make it half.
    let from_flags = match (agent, flag_token) {
        (Some(agent), token @ Some(_)) => Some(flag_identity(agent, token)?),
        (Some(_), None) => {
            return Err(ConfigError::PartialIdentity {
                given: "--agent",
                missing: "a token (--token-file or MCP_PROXY_TOKEN)",
            })
        }
        (None, _) if flag_token_file => {
            return Err(ConfigError::PartialIdentity { given: "--token-file", missing: "--agent" })
        }
        (None, _) => None,
    };
    match (open_identity_file(path)?, from_flags) {
        // A file that exists at start must be valid, and rules.
        (Some(file), _) => read_identity_from(path, file),
        // Missing, and the flags say who we are until it appears
        // (the event loop logs that it waits for it).
        (None, Some(flags)) => Ok(flags),
        (None, None) => {
            Err(ConfigError::IdentityFile(path.to_path_buf(), std::io::ErrorKind::NotFound.to_string()))
        }
    }
}

/// A token goes into `Authorization: Bearer <t>`: visible ASCII only.
pub fn check_token(token: &str) -> Result<(), ConfigError> {
    match identity::validate_token(token) {
        Ok(()) => Ok(()),
        Err(IdentityError::Empty(_)) => Err(ConfigError::EmptyToken),
        Err(_) => Err(ConfigError::InvalidToken),
    }
}

/// Read and parse an identity file (bounded size). Errors name the path and
/// the reason, never the contents.
pub fn read_identity_file(path: &PathBuf) -> Result<Identity, ConfigError> {
    let file = std::fs::File::open(path)
        .map_err(|e| ConfigError::IdentityFile(path.clone(), e.kind().to_string()))?;
    read_identity_from(path, file)
}

/// The identity file opened, or `None` when it does not exist (yet). One
/// open, so a file created meanwhile is either seen whole or not at all.
fn open_identity_file(path: &Path) -> Result<Option<std::fs::File>, ConfigError> {
    match std::fs::File::open(path) {
        Ok(file) => Ok(Some(file)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ConfigError::IdentityFile(path.to_path_buf(), e.kind().to_string())),
    }
}

fn read_identity_from(path: &Path, file: std::fs::File) -> Result<Identity, ConfigError> {
    use std::io::Read;
    let err = |why: String| ConfigError::IdentityFile(path.to_path_buf(), why);
    let mut bytes = Vec::new();
    file.take(limits::MAX_SECRET_FILE).read_to_end(&mut bytes).map_err(|e| err(e.kind().to_string()))?;
    identity::parse(&bytes).map_err(|e| err(e.to_string()))
}

/// `--agent` and the token (from `--token-file` or `MCP_PROXY_TOKEN`),
/// each checked as it will be sent.
fn flag_identity(agent: String, token: Option<String>) -> Result<Identity, ConfigError> {
    identity::validate_agent(&agent).map_err(ConfigError::InvalidAgent)?;
    let token = token.ok_or(ConfigError::Missing("--token-file or MCP_PROXY_TOKEN"))?;
    let token = token.trim().to_string();
    check_token(&token)?;
    Ok(Identity::new(agent, token))
}

fn read_token_file(path: &PathBuf) -> Result<String, ConfigError> {
    use std::io::Read;
    let err = |e: std::io::Error| ConfigError::TokenFile(path.clone(), e.kind());
    let file = std::fs::File::open(path).map_err(err)?;
    let mut s = String::new();
    file.take(limits::MAX_SECRET_FILE).read_to_string(&mut s).map_err(err)?;
    Ok(s)
}

/// Seconds as `N` or `N.F`, greater than zero.
fn parse_secs(flag: &'static str, v: &str) -> Result<Duration, ConfigError> {
    let bad = ConfigError::Invalid { flag, why: "expected seconds greater than 0, e.g. 5 or 0.5" };
    let ok =
        !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit() || b == b'.') && v.matches('.').count() <= 1;
    let secs: f64 = if ok {
        v.parse().map_err(|_| bad)?
    } else {
        return Err(bad);
    };
    if !(secs > 0.0 && secs <= 1e9) {
        return Err(ConfigError::Invalid { flag, why: "expected seconds greater than 0, e.g. 5 or 0.5" });
    }
    Ok(Duration::from_secs_f64(secs))
}

fn parse_listen(v: &str) -> Result<SocketAddr, ConfigError> {
    let addr = match v.strip_prefix("localhost:") {
        Some(port) => port.parse::<u16>().ok().map(|p| SocketAddr::from((Ipv4Addr::LOCALHOST, p))),
        None => v.parse::<SocketAddr>().ok(),
    };
    let addr =
        addr.ok_or(ConfigError::Invalid { flag: "--listen", why: "expected ADDR:PORT, e.g. 127.0.0.1:0" })?;
    // A non-loopback address needs a client token (checked in `parse`):
    // anyone who can reach it could otherwise speak as the agent.
    Ok(addr)
}

/// `routed_upstream` with no proxy variable set.
#[cfg(test)]
fn parse_upstream(v: &str, tls: &TlsFlags) -> Result<Upstream, ConfigError> {
    routed_upstream(v, tls, &crate::route::ProxyEnv::default(), crate::route::RouteFlags::default())
}

/// `--upstream`, checked and resolved, with its route: through a forward
/// proxy, the proxy's addresses are the ones connected to (the upstream's
/// name is the proxy's to resolve).
fn routed_upstream(
    v: &str,
    tls: &TlsFlags,
    env: &crate::route::ProxyEnv,
    flags: crate::route::RouteFlags,
) -> Result<Upstream, ConfigError> {
    let https = v.get(..8).is_some_and(|s| s.eq_ignore_ascii_case("https://"));
    if https && !cfg!(feature = "tls") {
        return Err(ConfigError::Https);
    }
    let invalid = |why| ConfigError::Invalid { flag: "--upstream", why };
    let url = crate::url::parse(v).map_err(invalid)?;
    let flag_given = if !tls.ca_files.is_empty() {
        Some("--ca-file")
    } else if tls.client_cert.is_some() {
        Some("--tls-client-cert")
    } else if tls.client_key.is_some() {
        Some("--tls-client-key")
    } else {
        None
    };
    if let (Some(flag), false) = (flag_given, https) {
        return Err(ConfigError::Invalid { flag, why: "only for an https:// upstream" });
    }
    if tls.client_cert.is_some() != tls.client_key.is_some() {
        return Err(ConfigError::Invalid {
            flag: if tls.client_cert.is_some() { "--tls-client-cert" } else { "--tls-client-key" },
            why: "--tls-client-cert and --tls-client-key go together (both or neither)",
        });
    }
    let (port, path, host) = (url.port, url.target.clone(), url.host_text());
    // The name looked up, and the one TLS checks: no brackets.
    let lookup_host = host.trim_start_matches('[').trim_end_matches(']');
    #[cfg(feature = "tls")]
    let decision = crate::route::decide(&url.host, port, https, env, flags)
        .map_err(|e| ConfigError::Proxy(format!("{e} (or --no-proxy-env)")))?;
    // The minimal build (no TLS) has no forward proxies: only a plain
    // upstream could go through one, and only when asked.
    #[cfg(not(feature = "tls"))]
    let decision = match flags.proxy_http {
        true => {
            let why = "this binary was built without TLS and forward proxies (the `tls` feature)";
            return Err(ConfigError::Invalid { flag: "--upstream-proxy-http", why });
        }
        false => {
            let _ = env;
            let route = crate::route::Route::Direct(crate::route::Direct::NotBuilt);
            crate::route::Decision { route, warnings: Vec::new() }
        }
    };
    let (addrs, tunnel) = match &decision.route {
        crate::route::Route::Proxy { url: proxy, var } => {
            let proxy_host = proxy.lookup_host();
            let unresolved =
                || ConfigError::Proxy(format!("{var}: cannot resolve the proxy host '{proxy_host}'"));
            let fixed = crate::url::Url {
                https: false,
                host: proxy.host.clone(),
                port: proxy.port,
                target: String::new(),
            };
            let addrs = match fixed.fixed_addrs() {
                Some(addrs) => addrs,
                None => lookup(&proxy_host, proxy.port).map_err(|_| unresolved())?,
            };
            if addrs.is_empty() {
                return Err(unresolved());
            }
            let authorization = proxy.authorization();
            let setup = crate::route::connect::ConnectSetup::new(
                proxy.authority(),
                url.authority(),
                authorization.as_deref(),
            );
            (addrs, Some(std::sync::Arc::new(setup)))
        }
        crate::route::Route::Direct(_) => {
            let addrs = match url.fixed_addrs() {
                Some(addrs) => addrs,
                None => {
                    lookup(lookup_host, port).map_err(|_| ConfigError::Resolve(lookup_host.to_string()))?
                }
            };
            if addrs.is_empty() {
                return Err(ConfigError::Resolve(lookup_host.to_string()));
            }
            (addrs, None)
        }
    };
    let authority = match (https, port) {
        (true, 443) => host.clone(),
        _ => format!("{host}:{port}"),
    };
    #[cfg(feature = "tls")]
    let tls = match https {
        true => {
            Some(std::sync::Arc::new(crate::tls::TlsSetup::new(lookup_host, tls).map_err(ConfigError::Tls)?))
        }
        false => None,
    };
    #[cfg(not(feature = "tls"))]
    let _ = tls;
    Ok(Upstream {
        addrs,
        authority,
        path,
        host,
        port,
        https,
        #[cfg(feature = "tls")]
        tls,
        route: decision.route,
        tunnel,
        route_warnings: decision.warnings,
    })
}

/// `host:port`'s addresses (brackets of an IPv6 literal dropped): at start,
/// and again off the loop (`event_loop::resolve`). Not inlined: one copy.
#[inline(never)]
pub fn lookup(host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
    (host.trim_start_matches('[').trim_end_matches(']'), port).to_socket_addrs().map(Iterator::collect)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn minimal_with_env_token() {
        let c = parse(args("--upstream http://127.0.0.1:8200/mcp --agent a"), Some("tok\n".into())).unwrap();
        assert_eq!(c.upstream.authority, "127.0.0.1:8200");
        assert_eq!(c.upstream.path, "/mcp");
        assert_eq!(c.upstream.addrs, vec!["127.0.0.1:8200".parse().unwrap()]);
        assert_eq!(c.identity.token, "tok");
        assert_eq!(c.identity.agent, "a");
        assert_eq!(c.stamps.param_for(b"chat_join"), Some("name"));
        assert_eq!(c.listen, "127.0.0.1:0".parse().unwrap());
        assert!(!format!("{c:?}").contains("tok\""));
    }

    #[test]
    fn stdio_refuses_a_listener_and_control_stdin_beside_it() {
        let base = "--upstream http://127.0.0.1:1/mcp --agent a --stdio";
        let c = parse(args(base), Some("tok".into())).unwrap();
        assert!(c.stdio);
        for extra in ["--listen 127.0.0.1:0", "--listen 127.0.0.1:9000", "--control-stdin"] {
            let e = parse(args(&format!("{base} {extra}")), Some("tok".into())).unwrap_err();
            assert!(matches!(e, ConfigError::Invalid { flag: "--stdio", .. }), "{extra}: {e}");
        }
        assert!(!parse(args("--upstream http://127.0.0.1:1/mcp --agent a"), Some("t".into())).unwrap().stdio);
    }

    #[test]
    fn flags_alone_are_the_argv_walk() {
        let f = Flags::parse(args(
            "--upstream http://h:1/mcp --agent a --token-file /t --listen 127.0.0.1:7 --connect-timeout 0.5 \
             --response-timeout=2 --idle-timeout 3 --request-timeout 4 --restart-grace 0.25 --keepalive-timeout 6 \
             --allow-origin https://App.example/ --identity-file /id --control-stdin --no-default-stamps \
             --stamp t=p --client-token-file /c",
        ))
        .unwrap();
        let want = Flags {
            upstream: Some("http://h:1/mcp".into()),
            agent: Some("a".into()),
            token_file: Some("/t".into()),
            listen: "127.0.0.1:7".parse().unwrap(),
            listen_given: true,
            connect_timeout: Duration::from_millis(500),
            response_timeout: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(3),
            request_timeout: Duration::from_secs(4),
            restart_grace: Duration::from_millis(250),
            keepalive_timeout: Duration::from_secs(6),
            allow_origins: vec!["https://app.example".into()],
            identity_file: Some("/id".into()),
            control_stdin: true,
            extra_stamps: vec![("t".into(), "p".into())],
            default_stamps: false,
            client_token_file: Some("/c".into()),
            ..Flags::default()
        };
        assert_eq!(f, want);
        // Nothing is read or resolved: files that do not exist, a host
        // that does not resolve, half an identity, all pass the walk.
        assert!(
            Flags::parse(args("--upstream http://no.such.host.invalid/ --token-file /nonexistent")).is_ok()
        );
        assert_eq!(Flags::parse(args("--agent")), Err(ConfigError::MissingValue("--agent")));
        assert_eq!(Flags::parse(args("-V --bogus")), Err(ConfigError::Version));
        assert!(matches!(
            Flags::parse(args("--restart-grace x")),
            Err(ConfigError::Invalid { flag: "--restart-grace", .. })
        ));
        assert_eq!(Flags::parse(Vec::new()), Ok(Flags::default()));
    }

    #[test]
    fn config_from_flags_alone_checks_what_spans_flags() {
        let base = Flags {
            upstream: Some("http://127.0.0.1:9/mcp".into()),
            agent: Some("a".into()),
            ..Flags::default()
        };
        let c = Config::from_flags(base.clone(), Some("tok".into())).unwrap();
        assert_eq!((c.identity.agent.as_str(), c.identity.token.as_str()), ("a", "tok"));
        assert_eq!(c.stamps.param_for(b"chat_send"), Some("sender"));
        let no_defaults =
            Flags { default_stamps: false, extra_stamps: vec![("x".into(), "who".into())], ..base.clone() };
        let c = Config::from_flags(no_defaults, Some("tok".into())).unwrap();
        assert_eq!((c.stamps.param_for(b"chat_send"), c.stamps.param_for(b"x")), (None, Some("who")));
        let exposed = Flags { listen: "0.0.0.0:1".parse().unwrap(), ..base.clone() };
        assert_eq!(
            Config::from_flags(exposed, Some("tok".into())).unwrap_err(),
            ConfigError::ExposedWithoutClientToken
        );
        assert_eq!(
            Config::from_flags(Flags { upstream: None, ..base.clone() }, Some("t".into())).unwrap_err(),
            ConfigError::Missing("--upstream")
        );
        assert_eq!(
            Config::from_flags(base, None).unwrap_err(),
            ConfigError::Missing("--token-file or MCP_PROXY_TOKEN")
        );
    }

    #[test]
    fn upstream_forms() {
        let none = TlsFlags::default();
        let ok = [
            ("http://localhost:8200", "localhost:8200", "/"),
            ("HTTP://127.0.0.1/sse", "127.0.0.1:80", "/sse"),
            ("http://[::1]:9/mcp?x=1", "[::1]:9", "/mcp?x=1"),
        ];
        for (url, authority, path) in ok {
            let u = parse_upstream(url, &none).unwrap();
            assert_eq!((u.authority.as_str(), u.path.as_str()), (authority, path), "{url}");
            assert!(!u.https);
        }
        for bad in
            ["127.0.0.1:1", "http://", "http://a@b:1/", "http://h:x/", "http://h:1#f", "https://", "ftp://h/"]
        {
            assert!(parse_upstream(bad, &none).is_err(), "{bad}");
        }
        // https: port 443 by default, left out of the Host sent (as
        // browsers do); TLS set up with the built-in roots.
        #[cfg(feature = "tls")]
        for (url, authority, addr, path) in [
            ("https://127.0.0.1/mcp", "127.0.0.1", "127.0.0.1:443", "/mcp"),
            ("HTTPS://localhost:8443", "localhost:8443", "127.0.0.1:8443", "/"),
            ("https://[::1]:443/sse", "[::1]", "[::1]:443", "/sse"),
        ] {
            let u = parse_upstream(url, &none).unwrap();
            assert_eq!((u.authority.as_str(), u.path.as_str()), (authority, path), "{url}");
            assert_eq!(u.addrs[0], addr.parse().unwrap(), "{url}");
            assert!(u.https && u.tls.is_some(), "{url}");
        }
        #[cfg(not(feature = "tls"))]
        assert_eq!(parse_upstream("https://127.0.0.1:1/mcp", &none).unwrap_err(), ConfigError::Https);
    }

    // Forward proxies need the `tls` feature (the minimal build goes direct).
    #[cfg(feature = "tls")]
    #[test]
    fn a_proxied_upstream_connects_to_the_proxy_with_its_connect_ready() {
        let f = Flags::parse(args("--upstream http://h:1/ --no-proxy-env --upstream-proxy-http")).unwrap();
        assert_eq!(f.route, crate::route::RouteFlags { ignore_env: true, proxy_http: true });
        let env = |v: &str| {
            let v = v.to_string();
            crate::route::ProxyEnv::read(move |n| (n == "HTTPS_PROXY").then(|| v.clone()))
        };
        let http = crate::route::RouteFlags { proxy_http: true, ..Default::default() };
        let none = TlsFlags::default();
        // A name the proxy resolves, never this host: nothing is looked up but the proxy.
        let u = routed_upstream(
            "http://mcp.no-such-host.invalid:8200/mcp",
            &none,
            &env("http://u:p@10.9.8.7:3128"),
            http,
        )
        .unwrap();
        assert_eq!(u.addrs, vec!["10.9.8.7:3128".parse().unwrap()]);
        assert_eq!(u.connect_host(), ("10.9.8.7".to_string(), 3128));
        let tunnel = u.tunnel.as_deref().unwrap();
        assert_eq!(
            (tunnel.proxy.as_str(), tunnel.target.as_str()),
            ("10.9.8.7:3128", "mcp.no-such-host.invalid:8200")
        );
        assert!(String::from_utf8_lossy(tunnel.request()).contains("Proxy-Authorization: Basic dTpw\r\n"));
        assert!(!format!("{u:?}").contains("dTpw"), "Debug shows the credentials");
        // Without the flag a plain http upstream goes direct (and is resolved).
        let u = routed_upstream(
            "http://10.1.1.1:8200/mcp",
            &none,
            &env("http://10.9.8.7:3128"),
            Default::default(),
        )
        .unwrap();
        assert!(u.tunnel.is_none() && u.addrs == vec!["10.1.1.1:8200".parse().unwrap()]);
        let e = routed_upstream("http://10.1.1.1/", &none, &env("https://u:secret@10.9.8.7:1"), http)
            .unwrap_err();
        assert!(e.to_string().starts_with("HTTPS_PROXY: an https:// proxy"), "{e}");
        assert!(!e.to_string().contains("secret"), "{e}");
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn the_minimal_build_goes_direct_and_refuses_upstream_proxy_http() {
        let env =
            crate::route::ProxyEnv::read(|n| (n == "HTTPS_PROXY").then(|| "http://10.9.8.7:1".to_string()));
        let none = TlsFlags::default();
        let http = crate::route::RouteFlags { proxy_http: true, ..Default::default() };
        let u = routed_upstream("http://10.1.1.1:8200/mcp", &none, &env, Default::default()).unwrap();
        assert!(u.tunnel.is_none() && u.addrs == vec!["10.1.1.1:8200".parse().unwrap()]);
        let e = routed_upstream("http://10.1.1.1:8200/mcp", &none, &env, http).unwrap_err();
        assert!(matches!(e, ConfigError::Invalid { flag: "--upstream-proxy-http", .. }), "{e}");
    }

    #[test]
    fn tls_flags_are_checked() {
        let flags = |s: &str| Flags::parse(args(s)).unwrap().tls;
        let f = flags("--ca-file /a --ca-file=/b --tls-client-cert /c --tls-client-key /k");
        assert_eq!(f.ca_files, vec![PathBuf::from("/a"), PathBuf::from("/b")]);
        assert_eq!((f.client_cert, f.client_key), (Some("/c".into()), Some("/k".into())));
        let https = "https://127.0.0.1:1/mcp";
        // Both or neither.
        for half in ["--tls-client-cert /c", "--tls-client-key /k"] {
            let err = parse_upstream(https, &flags(half)).unwrap_err();
            assert!(err.to_string().contains("both or neither"), "{half}: {err}");
        }
        // TLS flags with an http:// upstream are a mistake, said so.
        let err = parse_upstream("http://127.0.0.1:1/", &flags("--ca-file /a")).unwrap_err();
        assert!(err.to_string().contains("only for an https:// upstream"), "{err}");
        #[cfg(feature = "tls")]
        {
            // A missing or empty file is named, never read out.
            let err = parse_upstream(https, &flags("--ca-file /nonexistent/ca.pem")).unwrap_err();
            assert!(matches!(&err, ConfigError::Tls(w) if w.contains("/nonexistent/ca.pem")), "{err}");
            let empty = scratch("tls-empty").join("empty.pem");
            std::fs::write(&empty, "not pem\n").unwrap();
            let err = parse_upstream(https, &flags(&format!("--ca-file {}", empty.display()))).unwrap_err();
            assert!(err.to_string().contains("no PEM certificate"), "{err}");
            let key = scratch("tls-key").join("key.pem");
            std::fs::write(&key, "-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n-----END PRIVATE KEY-----\n")
                .unwrap();
            let arg = format!("--tls-client-cert {} --tls-client-key {}", key.display(), key.display());
            let err = parse_upstream(https, &flags(&arg)).unwrap_err().to_string();
            assert!(!err.contains("c2VjcmV0") && !err.contains("secret"), "{err}");
        }
    }

    #[test]
    fn errors() {
        let up = "--upstream http://127.0.0.1:1/mcp --agent a";
        let cases: &[(&str, Option<&str>, ConfigError)] = &[
            ("--bogus", Some("t"), ConfigError::UnknownFlag("--bogus".into())),
            ("--upstream", Some("t"), ConfigError::MissingValue("--upstream")),
            ("--agent a", Some("t"), ConfigError::Missing("--upstream")),
            (up, None, ConfigError::Missing("--token-file or MCP_PROXY_TOKEN")),
            (
                "--upstream http://127.0.0.1:1/mcp",
                Some("t"),
                ConfigError::Missing("--agent (or --identity-file)"),
            ),
            (up, Some("  \n"), ConfigError::EmptyToken),
            (up, Some("a b"), ConfigError::InvalidToken),
            #[cfg(not(feature = "tls"))]
            ("--upstream https://x/mcp --agent a", Some("t"), ConfigError::Https),
            ("--help", None, ConfigError::Help),
        ];
        for (a, tok, want) in cases {
            assert_eq!(parse(args(a), tok.map(String::from)).unwrap_err(), *want, "{a}");
        }
        let e = parse(args(&format!("{up} --listen nonsense")), Some("t".into())).unwrap_err();
        assert!(matches!(e, ConfigError::Invalid { flag: "--listen", .. }));
        let e = parse(args(&format!("{up} --listen 0.0.0.0:1")), Some("t".into())).unwrap_err();
        assert_eq!(e, ConfigError::ExposedWithoutClientToken);
        let e = parse(args(&format!("{up} --allow-origin evil")), Some("t".into())).unwrap_err();
        assert!(matches!(e, ConfigError::Invalid { flag: "--allow-origin", .. }));
        let e = parse(args(&format!("{up} --token-file /nonexistent/x")), None).unwrap_err();
        assert!(matches!(e, ConfigError::TokenFile(_, std::io::ErrorKind::NotFound)));
        let e = parse(args(&format!("{up} --idle-timeout -1")), Some("t".into())).unwrap_err();
        assert!(matches!(e, ConfigError::Invalid { flag: "--idle-timeout", .. }));
    }

    /// A fresh scratch directory for one test (tests run in parallel in
    /// one process).
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("cfg-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn agent_token(c: &Config) -> (&str, &str) {
        (c.identity.agent.as_str(), c.identity.token.as_str())
    }

    const UP: &str = "--upstream http://localhost:9/mcp";

    #[test]
    fn identity_file_alone_gives_the_identity_and_the_env_token_is_ignored() {
        let dir = scratch("ident-alone");
        let file = dir.join("id.json");
        std::fs::write(&file, r#"{"agent":"from-file","token":"tok-file"}"#).unwrap();
        let f = file.to_str().unwrap();
        let c = parse(args(&format!("{UP} --identity-file {f}")), Some("env-token".into())).unwrap();
        assert_eq!(agent_token(&c), ("from-file", "tok-file"));
        assert_eq!(c.upstream.addrs[0], "127.0.0.1:9".parse().unwrap(), "localhost needs no resolver");
        std::fs::write(&file, r#"{"agent":"x","token":"tok-SECRET"#).unwrap();
        let e = parse(args(&format!("{UP} --identity-file {f}")), None).unwrap_err();
        assert!(matches!(e, ConfigError::IdentityFile(..)));
        assert!(!e.to_string().contains("tok-SECRET"), "{e}");
        // Alone, a missing file is an error: there is no identity to start with.
        let missing = dir.join("missing.json");
        let e = parse(args(&format!("{UP} --identity-file {}", missing.display())), Some("t".into()));
        let e = e.unwrap_err();
        assert!(matches!(&e, ConfigError::IdentityFile(p, _) if *p == missing), "{e:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn flags_with_an_existing_identity_file_start_from_the_file() {
        let dir = scratch("ident-flags-file");
        let file = dir.join("id.json");
        std::fs::write(&file, r#"{"agent":"from-file","token":"tok-file"}"#).unwrap();
        let tf = dir.join("token");
        std::fs::write(&tf, "tok-flag\n").unwrap();
        let (f, t) = (file.to_str().unwrap(), tf.to_str().unwrap());
        for (argv, env) in [
            (format!("{UP} --agent flag-agent --token-file {t} --identity-file {f}"), None),
            (format!("{UP} --identity-file {f} --agent flag-agent"), Some("tok-env".to_string())),
        ] {
            let c = parse(args(&argv), env).unwrap();
            assert_eq!(agent_token(&c), ("from-file", "tok-file"), "{argv}");
            assert_eq!(c.identity_file.as_deref(), Some(file.as_path()));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn flags_with_a_missing_identity_file_start_from_the_flags() {
        let dir = scratch("ident-flags-missing");
        let tf = dir.join("token");
        std::fs::write(&tf, "tok-flag\n").unwrap();
        let t = tf.to_str().unwrap();
        // Neither the file nor its directory need exist yet.
        for missing in [dir.join("id.json"), dir.join("later").join("id.json")] {
            let m = missing.to_str().unwrap();
            let c =
                parse(args(&format!("{UP} --agent flag-agent --token-file {t} --identity-file {m}")), None)
                    .unwrap();
            assert_eq!(agent_token(&c), ("flag-agent", "tok-flag"));
            assert_eq!(c.identity_file.as_deref(), Some(missing.as_path()));
            let c =
                parse(args(&format!("{UP} --agent flag-agent --identity-file {m}")), Some("tok-env".into()))
                    .unwrap();
            assert_eq!(agent_token(&c), ("flag-agent", "tok-env"));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn flags_with_an_invalid_identity_file_are_refused_naming_the_path_never_the_token() {
        let dir = scratch("ident-flags-invalid");
        let file = dir.join("id.json");
        let tf = dir.join("token");
        std::fs::write(&tf, "tok-flag-SECRET\n").unwrap();
        let (f, t) = (file.to_str().unwrap(), tf.to_str().unwrap());
        for bad in [
            r#"{"agent":"x","token":"tok-file-SECRET"#,
            r#"{"agent":"x"}"#,
            r#"{"agent":"x","token":"tok file SECRET"}"#,
            "",
        ] {
            std::fs::write(&file, bad).unwrap();
            let e = parse(args(&format!("{UP} --agent a --token-file {t} --identity-file {f}")), None)
                .unwrap_err();
            assert!(matches!(&e, ConfigError::IdentityFile(p, _) if *p == file), "{bad}: {e:?}");
            let line = e.to_string();
            assert!(line.contains(f), "{line}");
            assert!(!line.contains("SECRET"), "{line}");
        }
        // A directory exists but is no identity file.
        let e =
            parse(args(&format!("{UP} --agent a --token-file {t} --identity-file {}", dir.display())), None)
                .unwrap_err();
        assert!(matches!(e, ConfigError::IdentityFile(..)), "{e:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn half_a_flag_identity_with_an_identity_file_is_refused() {
        let dir = scratch("ident-flags-half");
        let file = dir.join("id.json");
        std::fs::write(&file, r#"{"agent":"from-file","token":"tok-file"}"#).unwrap();
        let tf = dir.join("token");
        std::fs::write(&tf, "tok-flag\n").unwrap();
        let (f, t) = (file.to_str().unwrap(), tf.to_str().unwrap());
        let missing = dir.join("missing.json");
        let m = missing.to_str().unwrap();
        for path in [f, m] {
            let e = parse(args(&format!("{UP} --agent a --identity-file {path}")), None).unwrap_err();
            assert_eq!(
                e,
                ConfigError::PartialIdentity {
                    given: "--agent",
                    missing: "a token (--token-file or MCP_PROXY_TOKEN)"
                }
            );
            let e = parse(args(&format!("{UP} --token-file {t} --identity-file {path}")), None).unwrap_err();
            assert_eq!(e, ConfigError::PartialIdentity { given: "--token-file", missing: "--agent" });
            assert!(e.to_string().contains("needs --agent"), "{e}");
            // The flags are checked even when the file rules.
            let e = parse(args(&format!("{UP} --agent a --identity-file {path}")), Some(" ".into()));
            assert_eq!(e.unwrap_err(), ConfigError::EmptyToken);
        }
        // MCP_PROXY_TOKEN without --agent is ignored, as with the file alone.
        let e = parse(args(&format!("{UP} --identity-file {m}")), Some("tok-env".into())).unwrap_err();
        assert!(matches!(e, ConfigError::IdentityFile(..)), "{e:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn probe_is_a_mode_of_its_own_and_comes_alone() {
        let url = "http://127.0.0.1:9100/healthz";
        let want = probe::parse_url(url).unwrap();
        for argv in [format!("--probe {url}"), format!("--probe={url}")] {
            // The environment's token, even an invalid one, is not looked at.
            match parse_mode(args(&argv), Some("not a token".into())) {
                Ok(Mode::Probe(u)) => assert_eq!(u, want, "{argv}"),
                other => panic!("{argv}: {other:?}"),
            }
        }
        assert_eq!(Flags::parse(args(&format!("--probe {url}"))).unwrap().probe, Some(want));
        // With anything else, in either order: refused, naming the other flag.
        for (argv, other) in [
            (format!("--probe {url} --upstream http://127.0.0.1:1/mcp"), "--upstream"),
            (format!("--upstream=http://127.0.0.1:1/mcp --probe {url}"), "--upstream"),
            (format!("--connect-timeout 1 --probe {url}"), "--connect-timeout"),
            (format!("--probe {url} --control-stdin"), "--control-stdin"),
            (format!("--probe {url} --probe {url}"), "--probe"),
        ] {
            let e = parse_mode(args(&argv), None).unwrap_err();
            assert_eq!(e, ConfigError::ProbeNotAlone(other.into()), "{argv}");
            assert!(e.to_string().contains(other), "{e}");
        }
        assert_eq!(
            parse_mode(args(&format!("--probe {url} --bogus")), None).unwrap_err(),
            ConfigError::UnknownFlag("--bogus".into())
        );
        // --help and --version still stop the walk.
        assert_eq!(parse_mode(args(&format!("--probe {url} --help")), None).unwrap_err(), ConfigError::Help);
        assert_eq!(parse_mode(args(&format!("-V --probe {url}")), None).unwrap_err(), ConfigError::Version);
        assert_eq!(parse_mode(args("--probe"), None).unwrap_err(), ConfigError::MissingValue("--probe"));
        for bad in ["https://127.0.0.1/healthz", "127.0.0.1:9/healthz", "http://h:0/"] {
            let e = parse_mode(args(&format!("--probe {bad}")), None).unwrap_err();
            assert!(matches!(e, ConfigError::Invalid { flag: "--probe", .. }), "{bad}: {e:?}");
        }
        // The proxy's own parse has nothing to run from a probe.
        assert_eq!(
            parse(args(&format!("--probe {url}")), None).unwrap_err(),
            ConfigError::Missing("--upstream")
        );
        match parse_mode(args("--upstream http://127.0.0.1:1/mcp --agent a"), Some("t".into())) {
            Ok(Mode::Proxy(c)) => assert_eq!(c.upstream.authority, "127.0.0.1:1"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn timeouts_and_inline_values() {
        let c = parse(
            args("--upstream=http://127.0.0.1:1/ --agent=a --response-timeout 0.5 --listen localhost:0"),
            Some("t".into()),
        )
        .unwrap();
        assert_eq!(c.response_timeout, Duration::from_millis(500));
    }

    /// The `--oauth-*` flags: one token source, a credential that belongs to
    /// a client, files readable and keys parsed at start, token endpoints
    /// https or loopback; none of it ever echoes a file's bytes.
    #[test]
    fn oauth_flags_are_checked_at_start() {
        let dir = std::env::temp_dir().join(format!("mcp-config-oauth-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let secret = dir.join("secret");
        std::fs::write(&secret, "s3cr3t-value\n").unwrap();
        let not_a_key = dir.join("key.pem");
        std::fs::write(&not_a_key, "s3cr3t-value").unwrap();
        let (secret, not_a_key) = (secret.display().to_string(), not_a_key.display().to_string());
        let base = "--upstream http://127.0.0.1:9/mcp --agent a";
        let run = |extra: &str| parse(args(&format!("{base} {extra}")), None);
        #[cfg(feature = "tls")]
        {
            let ok = run(&format!("--oauth-client-id c --oauth-client-secret-file {secret}")).unwrap();
            assert!(ok.oauth.is_some() && ok.identity.token.is_empty());
            assert!(!format!("{ok:?}").contains("s3cr3t"));
            let ok = run(&format!("--oauth-assertion-file {secret} --oauth-no-resource")).unwrap();
            assert!(ok.oauth.is_some());
            let cases: Vec<(String, ConfigError)> = vec![
                (
                    "--oauth-client-id c".into(),
                    ConfigError::OAuth(
                        "give --oauth-client-secret-file, --oauth-client-key-file or \
                         --oauth-assertion-file: the OAuth flags need a credential"
                            .into(),
                    ),
                ),
                (
                    format!("--oauth-client-secret-file {secret}"),
                    ConfigError::Missing("--oauth-client-id (a client secret or key belongs to a client)"),
                ),
                (
                    format!("--oauth-client-id c --oauth-client-secret-file {secret} --oauth-client-key-file {secret}"),
                    ConfigError::Conflict {
                        flag: "--oauth-client-secret-file",
                        other: "--oauth-client-key-file",
                    },
                ),
                (
                    format!("--oauth-assertion-file {secret} --token-command x"),
                    ConfigError::Conflict { flag: "--token-command", other: "--oauth-assertion-file" },
                ),
                (
                    format!("--oauth-assertion-file {secret} --token-file {secret}"),
                    ConfigError::Conflict { flag: "--oauth-assertion-file", other: "--token-file" },
                ),
                (
                    format!("--oauth-scope x --oauth-assertion-file {secret} --control-stdin"),
                    ConfigError::Conflict { flag: "--oauth-assertion-file", other: "--control-stdin" },
                ),
            ];
            for (extra, want) in cases {
                assert_eq!(run(&extra).unwrap_err(), want, "{extra}");
            }
            for extra in [
                format!("--oauth-assertion-file {secret} --oauth-token-endpoint http://as.example/token"),
                format!("--oauth-assertion-file {secret} --oauth-token-endpoint not-a-url"),
                format!("--oauth-client-id c --oauth-client-key-file {not_a_key}"),
                format!("--oauth-assertion-file {}/missing", dir.display()),
            ] {
                let e = run(&extra).unwrap_err();
                assert!(matches!(e, ConfigError::OAuth(_)), "{extra}: {e:?}");
                assert!(!e.to_string().contains("s3cr3t"), "{e}");
            }
            // DPoP binds an OAuth source's tokens: alone it is refused; a key file is parsed at start.
            let ok = run(&format!("--oauth-assertion-file {secret} --dpop")).unwrap();
            assert!(ok.oauth.as_ref().is_some_and(|c| c.dpop_key().is_some()));
            assert!(
                matches!(run("--dpop").unwrap_err(), ConfigError::OAuth(w) if w.contains("need a credential"))
            );
            let e = run(&format!("--oauth-assertion-file {secret} --dpop-key-file {not_a_key}")).unwrap_err();
            assert!(matches!(&e, ConfigError::OAuth(w) if w.contains("--dpop-key-file")), "{e:?}");
            assert!(!e.to_string().contains("s3cr3t"), "{e}");
            // Loopback token endpoints may be plain http.
            let ok = run(&format!(
                "--oauth-assertion-file {secret} --oauth-token-endpoint http://127.0.0.1:8/token"
            ));
            assert!(ok.is_ok(), "{ok:?}");
        }
        #[cfg(not(feature = "tls"))]
        {
            let e = run(&format!("--oauth-client-id c --oauth-client-secret-file {secret}")).unwrap_err();
            assert_eq!(e, ConfigError::OAuthWithoutTls("--oauth-client-id"));
            assert!(e.to_string().contains("built without TLS"), "{e}");
            assert_eq!(run("--dpop").unwrap_err(), ConfigError::OAuthWithoutTls("--dpop"));
            let _ = not_a_key;
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

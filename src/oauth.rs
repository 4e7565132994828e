//! The OAuth client of the token sources `--oauth-client-secret-file`,
//! `--oauth-client-key-file` and `--oauth-assertion-file`: discovery as the
//! MCP authorization specification says, then one token request (RFC 6749
//! §4.4 client credentials, or RFC 7523 §2.1 a workload's JWT as the grant).
//! Blocking `std::net` (and rustls's `StreamOwned`), run on the renewal's
//! own thread (`event_loop::credential`), never on the loop; each exchange
//! is bounded by `--connect-timeout` to connect and `EXCHANGE_LIMIT` in all.
//! What the pure parts decide (`credentials::{challenge, metadata, oauth,
//! form}`) is theirs; this module only moves bytes and follows the order:
//!
//! 1. `--oauth-token-endpoint` given: no discovery.
//! 2. Else an unauthenticated `ping` POST to the upstream: a 401's
//!    `WWW-Authenticate` may name the protected-resource metadata and the
//!    scope. The metadata (RFC 9728) from there, else at the path-inserted
//!    then root well-known URL; its `resource` must name the upstream.
//!    Without any, the upstream's origin is the authorization server (the
//!    2025-03-26 fallback).
//! 3. The authorization server's metadata (RFC 8414, then OpenID), whose
//!    `issuer` must be the one the URL was built from.
//!
//! Redirects are never followed (a token request's credentials would go
//! wherever the 3xx says); bodies are capped at `BODY_CAP`. Nothing secret
//! reaches an error string: statuses, URLs and `describe_error`'s words.

use crate::credentials::jws::{self, SigningKey};
use crate::credentials::oauth::{self, Credential, Grant, Method};
use crate::credentials::{challenge, metadata, Secret};
use crate::http::body::Decoder;
use crate::http::head;
use crate::io::timed_out;
use crate::url::{self, Url};
use log::{debug, info};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// A metadata document or token answer longer than this is refused.
pub const BODY_CAP: usize = 64 * 1024;
/// One exchange (connect, send, answer) ends within this.
pub const EXCHANGE_LIMIT: Duration = Duration::from_secs(20);
/// A secret or assertion file longer than this is refused.
const FILE_CAP: u64 = 64 * 1024;

/// How the client authenticates to the authorization server.
pub enum ClientAuth {
    /// `--oauth-client-secret-file`, read at every token request.
    Secret(PathBuf),
    /// `--oauth-client-key-file`, read at start.
    Key(Box<SigningKey>),
    /// A public client (`--oauth-assertion-file` alone).
    Nothing,
}

/// What the flags say, checked at start (`config`).
pub struct Settings {
    /// The MCP endpoint, as `--upstream` gave it.
    pub upstream: Url,
    pub client_id: Option<String>,
    pub auth: ClientAuth,
    /// `--oauth-assertion-file`, re-read at every token request.
    pub assertion_file: Option<PathBuf>,
    pub token_endpoint: Option<String>,
    pub scope: Option<String>,
    /// `resource` on token requests (not `--oauth-no-resource`).
    pub send_resource: bool,
    /// `--dpop`/`--dpop-key-file`: the key tokens are bound to.
    pub dpop: Option<Arc<SigningKey>>,
    pub tls: Arc<rustls::ClientConfig>,
    pub connect_timeout: Duration,
}

/// Where tokens come from, once found.
#[derive(Clone, Debug)]
struct Found {
    token_endpoint: String,
    /// The authorization server's issuer, when metadata named it.
    issuer: Option<String>,
    methods: Vec<String>,
    /// The 401's `scope`, and the resource's `scopes_supported`.
    challenge_scope: Option<String>,
    scopes_supported: Vec<String>,
    /// The protected resource's identifier (its metadata's, else the
    /// upstream's canonical URI).
    resource: String,
}

/// The client: its settings, and what discovery found (found once, then
/// kept for every renewal).
pub struct Client {
    settings: Settings,
    found: Mutex<Option<Found>>,
    /// The authorization server's latest `DPoP-Nonce`.
    nonce: Mutex<Option<String>>,
    /// Scopes a 403 `insufficient_scope` asked for, added to every later
    /// request's (the step-ups so far, at most `STEP_UPS`).
    step_ups: Mutex<(Vec<String>, usize)>,
}

/// At most this many step-ups for more scope (then 403s are relayed).
const STEP_UPS: usize = 3;

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("oauth::Client").field("upstream", &self.settings.upstream.to_string()).finish()
    }
}

impl Client {
    pub fn new(settings: Settings) -> Client {
        Client {
            settings,
            found: Mutex::new(None),
            nonce: Mutex::new(None),
            step_ups: Mutex::new((Vec::new(), 0)),
        }
    }

    /// A 403 asked for `scope`: `true` when it adds a scope not asked for
    /// yet and the step-ups are not used up (the next token request asks
    /// for the union).
    pub fn step_up(&self, scope: &str) -> bool {
        let asked = self.asked_scope();
        let mut held = self.step_ups.lock().unwrap_or_else(PoisonError::into_inner);
        let new: Vec<String> = scope
            .split_ascii_whitespace()
            .filter(|s| !asked.split_ascii_whitespace().any(|a| a == *s) && !held.0.iter().any(|h| h == s))
            .map(str::to_string)
            .collect();
        if new.is_empty() || held.1 >= STEP_UPS {
            return false;
        }
        held.1 += 1;
        held.0.extend(new);
        true
    }

    /// The scope the last token request asked for (before step-ups).
    fn asked_scope(&self) -> String {
        let found = self.found.lock().unwrap_or_else(PoisonError::into_inner);
        let s = &self.settings;
        found
            .as_ref()
            .and_then(|f| {
                oauth::choose_scope(s.scope.as_deref(), f.challenge_scope.as_deref(), &f.scopes_supported)
            })
            .unwrap_or_default()
    }

    /// The DPoP key tokens are bound to, if any.
    pub fn dpop_key(&self) -> Option<&Arc<SigningKey>> {
        self.settings.dpop.as_ref()
    }

    /// The upstream's `scheme://authority` (a DPoP proof's `htu` origin).
    pub fn upstream_origin(&self) -> String {
        origin(&self.settings.upstream)
    }

    /// The grant's name, for the log and the audit record's `source`.
    pub fn source(&self) -> &'static str {
        match self.settings.assertion_file {
            Some(_) => "oauth-jwt-bearer",
            None => "oauth-client-credentials",
        }
    }

    /// One token: discovery when nothing is known yet, then the token
    /// request. `Ok` is the token endpoint's answer (a JSON token response,
    /// read by `credentials::output`).
    pub fn fetch(&self) -> Result<Vec<u8>, String> {
        let known = self.found.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let found = match known {
            Some(found) => found,
            None => {
                let found = self.discover()?;
                *self.found.lock().unwrap_or_else(PoisonError::into_inner) = Some(found.clone());
                found
            }
        };
        self.token(&found)
    }

    fn discover(&self) -> Result<Found, String> {
        let s = &self.settings;
        let canonical = oauth::canonical_resource(&s.upstream);
        if let Some(endpoint) = &s.token_endpoint {
            return Ok(Found {
                token_endpoint: endpoint.clone(),
                issuer: None,
                methods: Vec::new(),
                challenge_scope: None,
                scopes_supported: Vec::new(),
                resource: canonical,
            });
        }
        let (metadata_url, challenge_scope) = self.probe_upstream()?;
        let (resource, servers, scopes_supported) = self.resource_metadata(metadata_url, &canonical)?;
        let resource = resource.unwrap_or(canonical);
        let issuer = match servers.first() {
            Some(issuer) => issuer.clone(),
            // The 2025-03-26 fallback: the MCP server's origin is its
            // authorization server.
            None => origin(&s.upstream),
        };
        let server = self.server_metadata(&issuer)?;
        let token_endpoint = server.token_endpoint.clone().ok_or_else(|| {
            format!("the authorization server {issuer} has no token_endpoint in its metadata")
        })?;
        info!(
            "oauth: authorization server {issuer}, token endpoint {token_endpoint}, methods [{}]",
            server.token_endpoint_auth_methods_supported.join(", ")
        );
        let scopes_supported = match scopes_supported.is_empty() {
            true => server.scopes_supported.clone(),
            false => scopes_supported,
        };
        Ok(Found {
            token_endpoint,
            issuer: Some(server.issuer),
            methods: server.token_endpoint_auth_methods_supported,
            challenge_scope,
            scopes_supported,
            resource,
        })
    }

    /// The unauthenticated request a client begins with: a 401's
    /// challenge may name the resource metadata and the scope.
    fn probe_upstream(&self) -> Result<(Option<String>, Option<String>), String> {
        let s = &self.settings;
        let body = br#"{"jsonrpc":"2.0","id":"mcp-identity-proxy-discovery","method":"ping"}"#;
        let headers =
            [("Content-Type", "application/json"), ("Accept", "application/json, text/event-stream")];
        let answer = exchange(&s.upstream, "POST", &headers, body, &s.tls, s.connect_timeout)
            .map_err(|e| format!("the upstream {}: {e}", s.upstream))?;
        if answer.status != 401 {
            debug!("oauth: the upstream answered {} to an unauthenticated ping", answer.status);
            return Ok((None, None));
        }
        let Some(value) = answer.www_authenticate else { return Ok((None, None)) };
        let challenges = match challenge::parse(&value) {
            Ok(c) => c,
            Err(e) => {
                info!(
                    "oauth: the upstream's WWW-Authenticate is not usable ({e}); using the well-known URLs"
                );
                return Ok((None, None));
            }
        };
        let ours = challenges.iter().find(|c| c.is("Bearer") || c.is("DPoP"));
        let param = |name| ours.and_then(|c| c.param(name)).map(str::to_string);
        Ok((param("resource_metadata"), param("scope")))
    }

    /// The protected resource's metadata: its `resource` (checked against
    /// the upstream), authorization servers and scopes. None found at all
    /// is not an error (the 2025-03-26 fallback follows).
    #[allow(clippy::type_complexity)]
    fn resource_metadata(
        &self,
        named: Option<String>,
        canonical: &str,
    ) -> Result<(Option<String>, Vec<String>, Vec<String>), String> {
        let urls = match named {
            Some(u) => vec![u],
            None => metadata::resource_metadata_urls(canonical),
        };
        for u in urls {
            let Ok(parsed) = url::parse(&u) else {
                info!("oauth: skipping the resource metadata URL {u}: not an http(s) URL");
                continue;
            };
            let body = match self.document(&parsed) {
                Ok(body) => body,
                Err(e) => {
                    info!("oauth: resource metadata {u}: {e}");
                    continue;
                }
            };
            let doc = metadata::parse_resource(&body)
                .map_err(|e| format!("the protected resource metadata at {u}: {e}"))?;
            if let Some(resource) = &doc.resource {
                if !resource_matches(resource, canonical) {
                    return Err(format!(
                        "the protected resource metadata at {u} names the resource {resource}, \
                         not the upstream {canonical}: refused"
                    ));
                }
            }
            return Ok((doc.resource, doc.authorization_servers, doc.scopes_supported));
        }
        info!("oauth: no protected resource metadata; the upstream's origin is taken as its authorization server");
        Ok((None, Vec::new(), Vec::new()))
    }

    /// The authorization server's metadata, from the first well-known URL
    /// that answers with a document whose `issuer` is `issuer`.
    fn server_metadata(&self, issuer: &str) -> Result<metadata::ServerMetadata, String> {
        let urls = metadata::server_metadata_urls(issuer);
        if urls.is_empty() {
            return Err(format!("the authorization server {issuer} is not an http(s) URL"));
        }
        let mut why = Vec::new();
        for u in urls {
            let parsed = oauth::check_endpoint(&u).map_err(|e| format!("{u}: {e}"))?;
            let body = match self.document(&parsed) {
                Ok(body) => body,
                Err(e) => {
                    why.push(format!("{u}: {e}"));
                    continue;
                }
            };
            let doc = match metadata::parse_server(&body) {
                Ok(d) => d,
                Err(e) => {
                    why.push(format!("{u}: {e}"));
                    continue;
                }
            };
            if !metadata::issuer_matches(issuer, &doc) {
                return Err(format!(
                    "the authorization server metadata at {u} names the issuer {}, not {issuer}: refused",
                    doc.issuer
                ));
            }
            return Ok(doc);
        }
        Err(format!("no authorization server metadata for {issuer} ({})", why.join("; ")))
    }

    /// A metadata document: one GET, its body when the answer is a 200.
    fn document(&self, at: &Url) -> Result<Vec<u8>, String> {
        let s = &self.settings;
        let answer = exchange(at, "GET", &[("Accept", "application/json")], b"", &s.tls, s.connect_timeout)?;
        match answer.status {
            200 => Ok(answer.body),
            status => Err(format!("answered {status}")),
        }
    }

    /// The token request and its answer.
    fn token(&self, found: &Found) -> Result<Vec<u8>, String> {
        let s = &self.settings;
        let endpoint = oauth::check_endpoint(&found.token_endpoint)?;
        let credential = match &s.auth {
            ClientAuth::Secret(_) => Credential::Secret,
            ClientAuth::Key(_) => Credential::Key,
            ClientAuth::Nothing => Credential::Nothing,
        };
        let method = oauth::choose_method(credential, &found.methods)?;
        let secret = match &s.auth {
            ClientAuth::Secret(path) => Some(read_secret(path, "--oauth-client-secret-file")?),
            _ => None,
        };
        let assertion = match &s.assertion_file {
            Some(path) => Some(read_secret(path, "--oauth-assertion-file")?),
            None => None,
        };
        let client_assertion = match (&s.auth, method) {
            (ClientAuth::Key(key), Method::PrivateKeyJwt) => Some(sign(key, s, found)?),
            _ => None,
        };
        let scope = oauth::choose_scope(
            s.scope.as_deref(),
            found.challenge_scope.as_deref(),
            &found.scopes_supported,
        );
        // The union with what 403s asked for (SEP-2350), in order, once each.
        let extra = self.step_ups.lock().unwrap_or_else(PoisonError::into_inner).0.clone();
        let scope = match (scope, extra.is_empty()) {
            (scope, true) => scope,
            (Some(base), false) => Some(
                base.split_ascii_whitespace()
                    .map(str::to_string)
                    .chain(extra.into_iter().filter(|e| !base.split_ascii_whitespace().any(|b| b == e)))
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
            (None, false) => Some(extra.join(" ")),
        };
        let grant = Grant {
            client_id: s.client_id.as_deref(),
            method,
            secret: secret.as_ref(),
            client_assertion: client_assertion.as_ref().map(Secret::expose),
            assertion: assertion.as_ref(),
            scope: scope.as_deref(),
            resource: s.send_resource.then_some(found.resource.as_str()),
        };
        let request = oauth::token_request(&grant).map_err(str::to_string)?;
        let authorization = request.authorization.as_ref().map(Secret::expose);
        let mut answer = None;
        // With DPoP, a server that wants its nonce answers 400
        // `use_dpop_nonce` with one: sent again once with it (RFC 9449 §8).
        for _ in 0..2 {
            let proof = match &s.dpop {
                Some(key) => Some(self.token_proof(key, &found.token_endpoint)?),
                None => None,
            };
            let mut headers =
                vec![("Content-Type", "application/x-www-form-urlencoded"), ("Accept", "application/json")];
            if let Some(a) = authorization {
                headers.push(("Authorization", a));
            }
            if let Some(p) = &proof {
                headers.push(("DPoP", p.as_str()));
            }
            let got = exchange(
                &endpoint,
                "POST",
                &headers,
                request.body.expose().as_bytes(),
                &s.tls,
                s.connect_timeout,
            )
            .map_err(|e| format!("the token endpoint {}: {e}", found.token_endpoint))?;
            let fresh_nonce = match &got.dpop_nonce {
                Some(n) => {
                    let mut held = self.nonce.lock().unwrap_or_else(PoisonError::into_inner);
                    let fresh = held.as_deref() != Some(n.as_str());
                    *held = Some(n.clone());
                    fresh
                }
                None => false,
            };
            let wants_nonce =
                got.status == 400 && oauth::error_code(&got.body).as_deref() == Some("use_dpop_nonce");
            answer = Some(got);
            if !(s.dpop.is_some() && wants_nonce && fresh_nonce) {
                break;
            }
            debug!("oauth: the token endpoint asked for its DPoP nonce; sending again with it");
        }
        let answer = answer.ok_or("no token request was made")?;
        match answer.status {
            200 => Ok(answer.body),
            300..=399 => Err(format!(
                "the token endpoint {} answered {} (a redirect, not followed: credentials go only where \
                 the metadata says)",
                found.token_endpoint, answer.status
            )),
            status => Err(oauth::describe_error(status, &answer.body)),
        }
    }
}

impl Client {
    /// A DPoP proof for a token request (no `ath`: there is no token yet).
    fn token_proof(&self, key: &SigningKey, endpoint: &str) -> Result<String, String> {
        let nonce = self.nonce.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let now =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let jti = jws::random_id().map_err(|e| e.to_string())?;
        jws::dpop_proof(key, "POST", endpoint, now, &jti, None, nonce.as_deref())
            .map_err(|e| format!("DPoP: {e}"))
    }
}

/// A `private_key_jwt` assertion for the authorization server: `aud` the
/// issuer and the token endpoint (RFC 7523 §3 allows either; servers
/// differ in which they check).
fn sign(key: &SigningKey, s: &Settings, found: &Found) -> Result<Secret, String> {
    let client_id = s.client_id.as_deref().ok_or("private_key_jwt needs --oauth-client-id")?;
    let mut audiences: Vec<&str> = Vec::with_capacity(2);
    if let Some(issuer) = &found.issuer {
        audiences.push(issuer);
    }
    if !audiences.contains(&found.token_endpoint.as_str()) {
        audiences.push(&found.token_endpoint);
    }
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let jti = jws::random_id().map_err(|e| e.to_string())?;
    let signed = jws::client_assertion(key, client_id, &audiences, now, &jti).map_err(|e| e.to_string())?;
    Ok(Secret::new(signed))
}

/// A secret file's text, surrounding whitespace trimmed; the error names
/// the file and the failure, never a byte of it.
pub fn read_secret(path: &std::path::Path, flag: &str) -> Result<Secret, String> {
    let shown = path.display();
    let file = std::fs::File::open(path).map_err(|e| format!("{flag} {shown}: {}", e.kind()))?;
    let mut text = String::new();
    file.take(FILE_CAP + 1).read_to_string(&mut text).map_err(|e| format!("{flag} {shown}: {}", e.kind()))?;
    if text.len() as u64 > FILE_CAP {
        return Err(format!("{flag} {shown}: longer than 64 KiB"));
    }
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(format!("{flag} {shown}: empty"));
    }
    Ok(Secret::new(trimmed.to_string()))
}

/// RFC 9728 §3.3: the metadata's `resource` is the upstream, compared as
/// canonical URIs; a resource that is a path prefix of the upstream (on a
/// segment boundary) covers it too, as the MCP SDKs allow.
fn resource_matches(resource: &str, canonical: &str) -> bool {
    let Ok(parsed) = url::parse(resource) else { return false };
    let resource = oauth::canonical_resource(&parsed);
    canonical == resource
        || canonical.strip_prefix(resource.trim_end_matches('/')).is_some_and(|rest| rest.starts_with('/'))
}

/// `scheme://authority` of `u`.
fn origin(u: &Url) -> String {
    let scheme = if u.https { "https" } else { "http" };
    format!("{scheme}://{}", u.authority())
}

/// One answer: the status, `WWW-Authenticate`, the body.
pub struct Answer {
    pub status: u16,
    pub www_authenticate: Option<Vec<u8>>,
    /// `DPoP-Nonce`, when it is visible ASCII.
    pub dpop_nonce: Option<String>,
    pub body: Vec<u8>,
}

/// Either side of the exchange's socket.
enum Stream {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Stream {
    fn io(&mut self) -> &mut dyn ReadWrite {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => s.as_mut(),
        }
    }

    fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => s.get_ref(),
        }
    }
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

/// One HTTP/1.1 request and its answer over a connection of its own
/// (`Connection: close`), within `connect_timeout` to connect and
/// `EXCHANGE_LIMIT` in all. Errors are words (a status is an `Answer`).
pub fn exchange(
    target: &Url,
    method: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    tls: &Arc<rustls::ClientConfig>,
    connect_timeout: Duration,
) -> Result<Answer, String> {
    let deadline = Instant::now() + EXCHANGE_LIMIT;
    let left = || {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            Err(format!("no answer within {EXCHANGE_LIMIT:?}"))
        } else {
            Ok(left)
        }
    };
    let tcp = connect(target, connect_timeout.min(EXCHANGE_LIMIT))?;
    let _ = tcp.set_nodelay(true);
    let mut stream = match target.https {
        false => Stream::Plain(tcp),
        true => {
            let host = target.host_text();
            let name = crate::tls::server_name(host.trim_start_matches('[').trim_end_matches(']'))?;
            let conn = rustls::ClientConnection::new(tls.clone(), name).map_err(|e| format!("TLS: {e}"))?;
            Stream::Tls(Box::new(rustls::StreamOwned::new(conn, tcp)))
        }
    };
    let mut out = format!(
        "{method} {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: mcp-identity-proxy/{}\r\nConnection: close\r\n",
        target.target,
        target.authority(),
        env!("CARGO_PKG_VERSION")
    );
    for (name, value) in headers {
        out.push_str(name);
        out.push_str(": ");
        out.push_str(value);
        out.push_str("\r\n");
    }
    if method == "POST" {
        out.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    out.push_str("\r\n");
    let mut bytes = out.into_bytes();
    bytes.extend_from_slice(body);
    stream.tcp().set_write_timeout(Some(left()?)).map_err(|e| e.kind().to_string())?;
    stream.io().write_all(&bytes).map_err(|e| io_words("sending", &e))?;
    stream.io().flush().map_err(|e| io_words("sending", &e))?;
    bytes.fill(0);

    let mut received = Vec::with_capacity(4096);
    let mut buf = [0u8; 8192];
    let mut eof = false;
    let head = loop {
        if let Some(head) = head::parse_response(&received, method == "HEAD")
            .map_err(|e| format!("an answer that is not HTTP/1.1 ({e:?})"))?
        {
            if !head.is_interim() {
                break head;
            }
            received.drain(..head.len);
            continue;
        }
        if eof {
            return Err("the connection closed before an answer".into());
        }
        eof = read_some(&mut stream, &mut buf, &mut received, &left)?;
    };
    let status = head.status;
    let www_authenticate = head.headers.get(b"www-authenticate").map(<[u8]>::to_vec);
    let dpop_nonce = head
        .headers
        .get(b"dpop-nonce")
        .filter(|n| !n.is_empty() && n.len() <= 512 && n.iter().all(u8::is_ascii_graphic))
        .map(|n| String::from_utf8_lossy(n).into_owned());
    let mut decoder = Decoder::new(head.framing);
    let mut answer = Vec::new();
    let mut pending = received.split_off(head.len);
    loop {
        let used = decoder
            .read_bounded(&pending, &mut answer, BODY_CAP)
            .map_err(|_| format!("an answer body that is malformed or over {} KiB", BODY_CAP / 1024))?;
        pending.drain(..used);
        if decoder.is_done() {
            break;
        }
        if eof {
            if decoder.until_close() {
                break;
            }
            return Err("the connection closed inside the answer's body".into());
        }
        eof = read_some(&mut stream, &mut buf, &mut pending, &left)?;
    }
    Ok(Answer { status, www_authenticate, dpop_nonce, body: answer })
}

/// One read into `into`; `Ok(true)` at the end of the stream (a TLS peer
/// that closes without `close_notify` counts as the end: the framing says
/// whether the body was whole).
fn read_some(
    stream: &mut Stream,
    buf: &mut [u8],
    into: &mut Vec<u8>,
    left: &dyn Fn() -> Result<Duration, String>,
) -> Result<bool, String> {
    stream.tcp().set_read_timeout(Some(left()?)).map_err(|e| e.kind().to_string())?;
    loop {
        return match stream.io().read(buf) {
            Ok(0) => Ok(true),
            Ok(n) => {
                into.extend_from_slice(buf.get(..n).unwrap_or_default());
                if into.len() > BODY_CAP + 64 * 1024 {
                    return Err(format!("an answer over {} KiB", BODY_CAP / 1024));
                }
                Ok(false)
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(true),
            Err(e) => Err(io_words("waiting for the answer", &e)),
        };
    }
}

fn io_words(phase: &str, e: &std::io::Error) -> String {
    match timed_out(e.kind()) {
        true => format!("timed out {phase} ({EXCHANGE_LIMIT:?} for the whole exchange)"),
        // rustls's errors (a certificate refused) come as `InvalidData`
        // with rustls's own words, which name no secret.
        false => format!("{phase}: {e}"),
    }
}

/// The first of the host's addresses that accepts within `timeout`.
fn connect(target: &Url, timeout: Duration) -> Result<TcpStream, String> {
    let addrs: Vec<SocketAddr> = match target.fixed_addrs() {
        Some(fixed) => fixed,
        None => (target.host_text().as_str(), target.port)
            .to_socket_addrs()
            .map(Iterator::collect)
            .map_err(|_| format!("cannot resolve {}", target.host_text()))?,
    };
    let mut last = format!("cannot resolve {}", target.host_text());
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, timeout) {
            Ok(s) => return Ok(s),
            Err(e) if timed_out(e.kind()) => {
                last = format!("connecting to {addr} timed out after {timeout:?}")
            }
            Err(e) => last = format!("connecting to {addr}: {}", e.kind()),
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_match_is_canonical_or_a_segment_prefix() {
        let cases: &[(&str, &str, bool)] = &[
            ("http://127.0.0.1:9/mcp", "http://127.0.0.1:9/mcp", true),
            ("HTTP://LOCALHOST:9/mcp", "http://localhost:9/mcp", true),
            ("https://a.example:443/mcp", "https://a.example/mcp", true),
            ("https://a.example/", "https://a.example/mcp", true),
            ("https://a.example", "https://a.example/mcp", true),
            ("https://a.example/mc", "https://a.example/mcp", false),
            ("https://evil.example.com/mcp", "https://a.example/mcp", false),
            ("http://a.example/mcp", "https://a.example/mcp", false),
            ("https://a.example:8443/mcp", "https://a.example/mcp", false),
            ("https://a.example/mcp/deeper", "https://a.example/mcp", false),
            ("not a url", "https://a.example/mcp", false),
        ];
        for (resource, canonical, want) in cases {
            assert_eq!(resource_matches(resource, canonical), *want, "{resource} vs {canonical}");
        }
    }

    #[test]
    fn secret_files_are_trimmed_bounded_and_never_quoted() {
        let dir = std::env::temp_dir().join(format!("mcp-oauth-secret-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("s");
        std::fs::write(&path, "  hunter2-secret\n").unwrap();
        assert_eq!(read_secret(&path, "--f").unwrap().expose(), "hunter2-secret");
        std::fs::write(&path, "\n \t\n").unwrap();
        let e = read_secret(&path, "--f").unwrap_err();
        assert!(e.ends_with("empty"), "{e}");
        std::fs::write(&path, "x".repeat(64 * 1024 + 1)).unwrap();
        let e = read_secret(&path, "--f").unwrap_err();
        assert!(e.contains("64 KiB") && !e.contains("xxx"), "{e}");
        let e = read_secret(&dir.join("missing"), "--f").unwrap_err();
        assert!(e.contains("--f") && e.contains("not found"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

//! The OAuth token sources (`--oauth-*`) against stand-ins for what the conformance suite's servers cannot be
//! made to do (the suite's own scenarios run in `conformance.rs`): one stub is the MCP server, its
//! protected-resource metadata and its authorization server at once, so every request the proxy makes is
//! recorded in order. What is checked: the discovery order and the token request's form, the 401 replay
//! under a renewed token without a second discovery, and every way the authorization server can fail at
//! start (down, 400 `invalid_client`, a redirect, metadata that names another resource or issuer, a stall),
//! each exit 2 within its bound, with a line that says why and never a secret.

use std::io::Write;
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::exchange::{host, json_post};
use crate::support::proxy_process::{run_to_exit, scratch_dir, ProxyProcess};
use crate::support::wire::{response, Next, Req, StubUpstream};

const AGENT: &str = "svc-agent";
const SECRET: &str = "s3cr3t-client-value";

/// How the stand-in authorization server behaves.
#[derive(Clone, Copy, PartialEq, Eq)]
enum As {
    /// Metadata advertising `client_secret_post`; tokens `at-N`.
    Post,
    /// The token endpoint answers 400 invalid_client.
    InvalidClient,
    /// The token endpoint answers 307 to another path.
    Redirect,
    /// The protected-resource metadata names another resource.
    WrongResource,
    /// The authorization-server metadata names another issuer.
    WrongIssuer,
    /// The token endpoint reads the request and never answers.
    Stall,
}

/// The stub: the MCP endpoint (`/mcp`: 401 with a challenge unless the token is the current one), the
/// resource metadata at the path-inserted URL, the AS metadata, and the token endpoint. `valid` is the
/// token the MCP endpoint accepts (`""`: the last one issued).
struct Stand {
    stub: StubUpstream,
    valid: Arc<Mutex<String>>,
    issued: Arc<AtomicUsize>,
}

fn stand(kind: As) -> Stand {
    let valid = Arc::new(Mutex::new(String::new()));
    let issued = Arc::new(AtomicUsize::new(0));
    let (v, n) = (valid.clone(), issued.clone());
    let port = Arc::new(Mutex::new(0u16));
    let p = port.clone();
    let stub = StubUpstream::start(move |req: &Req, s: &mut TcpStream| {
        let origin = format!("http://127.0.0.1:{}", *p.lock().unwrap());
        let json = |s: &mut TcpStream, status: &str, body: String| {
            let _ = s.write_all(&response(status, &[("Content-Type", "application/json")], body.as_bytes()));
        };
        match req.target.as_str() {
            "/.well-known/oauth-protected-resource/mcp" => {
                let resource = if kind == As::WrongResource {
                    "https://evil.example/mcp".to_string()
                } else {
                    format!("{origin}/mcp")
                };
                json(
                    s,
                    "200 OK",
                    format!(
                        r#"{{"resource":"{resource}","authorization_servers":["{origin}/as"],"scopes_supported":["mcp:all"]}}"#
                    ),
                );
            }
            "/.well-known/oauth-authorization-server/as" => {
                let issuer = if kind == As::WrongIssuer {
                    "https://attacker.example".to_string()
                } else {
                    format!("{origin}/as")
                };
                json(
                    s,
                    "200 OK",
                    format!(
                        r#"{{"issuer":"{issuer}","token_endpoint":"{origin}/as/token","token_endpoint_auth_methods_supported":["client_secret_post"],"grant_types_supported":["client_credentials"]}}"#
                    ),
                );
            }
            "/as/token" => match kind {
                As::InvalidClient => json(
                    s,
                    "400 Bad Request",
                    r#"{"error":"invalid_client","error_description":"unknown client\u0007 or bad secret"}"#
                        .into(),
                ),
                As::Redirect => {
                    let _ =
                        s.write_all(&response("307 Temporary Redirect", &[("Location", "/elsewhere")], b""));
                }
                As::Stall => {
                    std::thread::sleep(Duration::from_secs(40));
                    return Next::Close;
                }
                _ => {
                    let k = n.fetch_add(1, Ordering::SeqCst) + 1;
                    json(
                        s,
                        "200 OK",
                        format!(
                            r#"{{"access_token":"at-{k}","token_type":"Bearer","expires_in":3600,"refresh_token":"rt-{k}"}}"#
                        ),
                    );
                }
            },
            "/mcp" => {
                let accepted = {
                    let v = v.lock().unwrap();
                    let want =
                        if v.is_empty() { format!("at-{}", n.load(Ordering::SeqCst)) } else { v.clone() };
                    req.head.all("authorization") == [format!("Bearer {want}").as_str()]
                };
                if !accepted {
                    let challenge = format!(
                        "Bearer error=\"invalid_token\", resource_metadata=\"{origin}/.well-known/oauth-protected-resource/mcp\", scope=\"mcp:call\""
                    );
                    let _ = s.write_all(&response(
                        "401 Unauthorized",
                        &[("WWW-Authenticate", challenge.as_str()), ("Content-Type", "application/json")],
                        br#"{"error":"invalid_token"}"#,
                    ));
                    return Next::KeepAlive;
                }
                json(s, "200 OK", r#"{"jsonrpc":"2.0","id":3,"result":{}}"#.into());
            }
            _ => {
                let _ = s.write_all(&response("404 Not Found", &[], b""));
            }
        }
        Next::KeepAlive
    });
    *port.lock().unwrap() = stub.port;
    Stand { stub, valid, issued }
}

fn secret_file() -> PathBuf {
    let path = scratch_dir("oauth-secret").join("secret");
    std::fs::write(&path, format!("{SECRET}\n")).unwrap();
    path
}

/// The form fields of a urlencoded body (values percent-decoded; `+` is a space).
fn form(body: &[u8]) -> Vec<(String, String)> {
    let decode = |s: &str| {
        let s = s.replace('+', " ");
        let bytes = s.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'%' && i + 2 < bytes.len() {
                if let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                    out.push(b);
                    i += 3;
                    continue;
                }
            }
            out.push(bytes[i]);
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    };
    String::from_utf8_lossy(body)
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

/// One `tools/call` through the proxy: its status, and the stub's requests it caused.
fn call(p: &ProxyProcess, st: &Stand) -> (u16, Vec<Req>) {
    let n = st.stub.request_count();
    let body =
        br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"chat_send","arguments":{}}}"#;
    let mut s = TcpStream::connect(host(p)).expect("connect");
    s.write_all(&json_post(&host(p), &[("Authorization", "Bearer the-clients-own")], body)).expect("send");
    s.set_read_timeout(Some(Duration::from_secs(15))).ok();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("}") {
        match std::io::Read::read(&mut s, &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(k) => got.extend_from_slice(&buf[..k]),
        }
    }
    let text = String::from_utf8_lossy(&got);
    let status = text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    std::thread::sleep(Duration::from_millis(100));
    (status, st.stub.requests()[n..].to_vec())
}

fn targets(reqs: &[Req]) -> Vec<String> {
    reqs.iter().map(|r| format!("{} {}", r.method, r.target)).collect()
}

#[test]
fn discovery_then_client_secret_post_with_the_challenges_scope_and_the_resource() {
    let st = stand(As::Post);
    let secret = secret_file();
    let p = ProxyProcess::builder(st.stub.url())
        .agent(AGENT)
        .arg("--oauth-client-id", "svc client")
        .arg("--oauth-client-secret-file", &secret)
        .env("RUST_LOG", "trace")
        .start();
    let at_start = st.stub.requests();
    assert_eq!(
        targets(&at_start),
        [
            "POST /mcp",
            "GET /.well-known/oauth-protected-resource/mcp",
            "GET /.well-known/oauth-authorization-server/as",
            "POST /as/token",
        ],
        "the discovery order"
    );
    // The probe carried no credential at all.
    assert!(!at_start[0].head.has("authorization"), "{}", at_start[0].raw_text());
    let token = &at_start[3];
    assert!(!token.head.has("authorization"), "client_secret_post puts nothing in Authorization");
    assert_eq!(token.head.one("content-type"), "application/x-www-form-urlencoded");
    let origin = format!("http://127.0.0.1:{}", st.stub.port);
    let mut got = form(&token.body);
    got.sort();
    let mut want = vec![
        ("grant_type".to_string(), "client_credentials".to_string()),
        ("client_id".into(), "svc client".into()),
        ("client_secret".into(), SECRET.into()),
        ("scope".into(), "mcp:call".into()),
        ("resource".into(), format!("{origin}/mcp")),
    ];
    want.sort();
    assert_eq!(got, want, "{}", String::from_utf8_lossy(&token.body));
    // The token goes in Authorization only, replacing the client's.
    let (status, reqs) = call(&p, &st);
    assert_eq!(status, 200);
    assert_eq!(targets(&reqs), ["POST /mcp"]);
    assert_eq!(reqs[0].head.all("authorization"), ["Bearer at-1"]);
    assert!(!reqs[0].head.has("x-agent-token"));
    // Revoked: the 401 renews the token (the discovery is not done again) and the call goes again once.
    *st.valid.lock().unwrap() = "at-2".into();
    let (status, reqs) = call(&p, &st);
    assert_eq!(status, 200, "the client never sees the 401");
    assert_eq!(targets(&reqs), ["POST /mcp", "POST /as/token", "POST /mcp"]);
    assert_eq!(reqs[2].head.all("authorization"), ["Bearer at-2"]);
    assert_eq!(st.issued.load(Ordering::SeqCst), 2);
    let log = p.stderr_text();
    for secret in [SECRET, "at-1", "at-2", "rt-1", "the-clients-own"] {
        assert!(!log.contains(secret), "`{secret}` in the proxy's trace log:\n{log}");
    }
}

#[test]
fn an_authorization_server_that_fails_at_start_is_exit_2_saying_why_never_a_secret() {
    let secret = secret_file();
    let secret = secret.to_str().unwrap();
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let cases: Vec<(As, Option<String>, &str, Duration)> = vec![
        (
            As::InvalidClient,
            None,
            "the token endpoint answered 400 invalid_client: unknown client or bad secret",
            Duration::from_secs(10),
        ),
        (As::Redirect, None, "answered 307 (a redirect, not followed", Duration::from_secs(10)),
        (
            As::WrongResource,
            None,
            "names the resource https://evil.example/mcp, not the upstream",
            Duration::from_secs(10),
        ),
        (As::WrongIssuer, None, "names the issuer https://attacker.example, not", Duration::from_secs(10)),
        (
            As::Post,
            Some(format!("http://127.0.0.1:{closed}/token")),
            "the token endpoint http://127.0.0.1:",
            Duration::from_secs(10),
        ),
        (
            As::Stall,
            None,
            "timed out waiting for the answer (20s for the whole exchange)",
            Duration::from_secs(28),
        ),
    ];
    std::thread::scope(|scope| {
        for (kind, endpoint, says, bound) in &cases {
            scope.spawn(move || {
                let st = stand(*kind);
                let url = st.stub.url();
                let mut args = vec![
                    "--upstream",
                    &url,
                    "--agent",
                    AGENT,
                    "--oauth-client-id",
                    "c",
                    "--oauth-client-secret-file",
                    secret,
                ];
                if let Some(e) = endpoint {
                    args.extend(["--oauth-token-endpoint", e.as_str()]);
                }
                let (out, took) = run_to_exit(&args);
                let err = String::from_utf8_lossy(&out.stderr);
                assert_eq!(out.status.code(), Some(2), "{err}");
                assert!(
                    err.contains("the OAuth client (oauth-client-credentials) got no token at start"),
                    "{err}"
                );
                assert!(err.contains(says), "expected {says:?} in:\n{err}");
                assert!(!err.contains(SECRET), "the secret in stderr:\n{err}");
                assert!(took < *bound, "exit after {took:?}, bound {bound:?}");
                let tokens: Vec<String> = st.stub.requests().iter().map(|r| r.target.clone()).collect();
                assert!(!tokens.iter().any(|t| t == "/elsewhere"), "a redirect was followed: {tokens:?}");
                if matches!(kind, As::WrongResource | As::WrongIssuer) {
                    assert!(
                        !tokens.iter().any(|t| t == "/as/token"),
                        "credentials sent after refused metadata: {tokens:?}"
                    );
                }
            });
        }
    });
}

/// A DPoP stand-in (RFC 9449): the token endpoint wants a proof and, once, its nonce (400 `use_dpop_nonce`);
/// it issues `dat-N` as `token_type: DPoP`. The MCP endpoint wants `Authorization: DPoP dat-N`, a proof
/// whose signature verifies with its own `jwk`, `htm`/`htu`/`ath` of this request and, once it asked for it
/// (401 `use_dpop_nonce`), its nonce.
fn dpop_stand() -> StubUpstream {
    let port = Arc::new(Mutex::new(0u16));
    let p = port.clone();
    let stub = StubUpstream::start(move |req: &Req, s: &mut TcpStream| {
        let origin = format!("http://127.0.0.1:{}", *p.lock().unwrap());
        let json = |s: &mut TcpStream, status: &str, extra: &[(&str, &str)], body: String| {
            let mut fields = vec![("Content-Type", "application/json")];
            fields.extend_from_slice(extra);
            let _ = s.write_all(&response(status, &fields, body.as_bytes()));
        };
        match req.target.as_str() {
            "/.well-known/oauth-protected-resource/mcp" => json(
                s,
                "200 OK",
                &[],
                format!(r#"{{"resource":"{origin}/mcp","authorization_servers":["{origin}"]}}"#),
            ),
            "/.well-known/oauth-authorization-server" => json(
                s,
                "200 OK",
                &[],
                format!(
                    r#"{{"issuer":"{origin}","token_endpoint":"{origin}/token","token_endpoint_auth_methods_supported":["client_secret_basic"],"dpop_signing_alg_values_supported":["ES256"]}}"#
                ),
            ),
            "/token" => match proof_claims(req, "POST", &format!("{origin}/token"), None) {
                Err(why) => json(
                    s,
                    "400 Bad Request",
                    &[],
                    format!(r#"{{"error":"invalid_dpop_proof","error_description":"{why}"}}"#),
                ),
                Ok(claims) if claims["nonce"] != "as-nonce-1" => json(
                    s,
                    "400 Bad Request",
                    &[("DPoP-Nonce", "as-nonce-1")],
                    r#"{"error":"use_dpop_nonce"}"#.into(),
                ),
                Ok(_) => json(
                    s,
                    "200 OK",
                    &[],
                    r#"{"access_token":"dat-1","token_type":"DPoP","expires_in":3600}"#.into(),
                ),
            },
            "/mcp" => {
                let bound = req.head.all("authorization") == ["DPoP dat-1"];
                match proof_claims(req, "POST", &format!("{origin}/mcp"), Some("dat-1")) {
                    Ok(claims) if bound && claims["nonce"] == "rs-nonce-1" => json(
                        s,
                        "200 OK",
                        &[("DPoP-Nonce", "rs-nonce-1")],
                        r#"{"jsonrpc":"2.0","id":3,"result":{}}"#.into(),
                    ),
                    Ok(_) if bound => {
                        let _ = s.write_all(&response(
                            "401 Unauthorized",
                            &[
                                (
                                    "WWW-Authenticate",
                                    "DPoP error=\"use_dpop_nonce\", error_description=\"nonce\"",
                                ),
                                ("DPoP-Nonce", "rs-nonce-1"),
                            ],
                            b"",
                        ));
                    }
                    _ => {
                        let challenge = format!(
                            "DPoP resource_metadata=\"{origin}/.well-known/oauth-protected-resource/mcp\""
                        );
                        let _ = s.write_all(&response(
                            "401 Unauthorized",
                            &[("WWW-Authenticate", challenge.as_str())],
                            b"",
                        ));
                    }
                }
            }
            _ => {
                let _ = s.write_all(&response("404 Not Found", &[], b""));
            }
        }
        Next::KeepAlive
    });
    *port.lock().unwrap() = stub.port;
    stub
}

/// The claims of the request's one `DPoP` proof, once its header (`typ`, `alg` ES256, a public `jwk`), its
/// ES256 signature under that jwk, `htm`, `htu`, `iat`, a `jti` and (with a token) `ath` are checked.
fn proof_claims(req: &Req, htm: &str, htu: &str, token: Option<&str>) -> Result<serde_json::Value, String> {
    use mcp_identity_proxy::credentials::b64;
    let proofs = req.head.all("dpop");
    let [proof] = proofs.as_slice() else { return Err(format!("{} DPoP fields", proofs.len())) };
    let parts: Vec<&str> = proof.split('.').collect();
    let [h, c, sig] = parts.as_slice() else { return Err("not a JWS".into()) };
    let part = |p: &str| -> Result<serde_json::Value, String> {
        let bytes = b64::decode_url(p.as_bytes()).ok_or("not base64url")?;
        serde_json::from_slice(&bytes).map_err(|e| e.to_string())
    };
    let (header, claims) = (part(h)?, part(c)?);
    if header["typ"] != "dpop+jwt" || header["alg"] != "ES256" || header["jwk"]["d"].is_string() {
        return Err(format!("header {header}"));
    }
    let coord =
        |k: &str| b64::decode_url(header["jwk"][k].as_str().unwrap_or("").as_bytes()).unwrap_or_default();
    let point = [vec![4u8], coord("x"), coord("y")].concat();
    let key = ring::signature::UnparsedPublicKey::new(&ring::signature::ECDSA_P256_SHA256_FIXED, point);
    let signature = b64::decode_url(sig.as_bytes()).ok_or("signature not base64url")?;
    key.verify(format!("{h}.{c}").as_bytes(), &signature).map_err(|_| "the signature does not verify")?;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let iat = claims["iat"].as_u64().unwrap_or(0);
    if claims["htm"] != htm
        || claims["htu"] != htu
        || iat + 60 < now
        || iat > now + 5
        || !claims["jti"].is_string()
    {
        return Err(format!("claims {claims}"));
    }
    let ath =
        token.map(|t| b64::encode_url(ring::digest::digest(&ring::digest::SHA256, t.as_bytes()).as_ref()));
    if claims["ath"].as_str() != ath.as_deref() {
        return Err(format!("ath {} for {ath:?}", claims["ath"]));
    }
    Ok(claims)
}

#[test]
fn dpop_binds_the_token_every_request_carries_a_proof_and_each_servers_nonce_is_used() {
    let stub = dpop_stand();
    let secret = secret_file();
    let p = ProxyProcess::builder(stub.url())
        .agent(AGENT)
        .arg("--oauth-client-id", "c")
        .arg("--oauth-client-secret-file", &secret)
        .flag("--dpop")
        .env("RUST_LOG", "trace")
        .start();
    let st = Stand { stub, valid: Arc::default(), issued: Arc::default() };
    let tokens: Vec<Req> = st.stub.requests().into_iter().filter(|r| r.target == "/token").collect();
    assert_eq!(tokens.len(), 2, "the token request again once, with the authorization server's nonce");
    // The client sends a DPoP proof of its own: it never passes.
    let n = st.stub.request_count();
    let body =
        br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"chat_send","arguments":{}}}"#;
    let mut s = TcpStream::connect(host(&p)).expect("connect");
    s.write_all(&json_post(&host(&p), &[("DPoP", "the-clients-proof")], body)).expect("send");
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("}}") {
        match std::io::Read::read(&mut s, &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(k) => got.extend_from_slice(&buf[..k]),
        }
    }
    let text = String::from_utf8_lossy(&got);
    assert!(
        text.starts_with("HTTP/1.1 200"),
        "the client never sees the nonce's 401: {text}\n{}",
        p.stderr_text()
    );
    let reqs = st.stub.requests()[n..].to_vec();
    assert_eq!(
        targets(&reqs),
        ["POST /mcp", "POST /mcp"],
        "one 401 for the nonce, then sent again; no new token"
    );
    let origin = format!("http://127.0.0.1:{}", st.stub.port);
    let jtis: Vec<String> = reqs
        .iter()
        .map(|r| {
            assert_eq!(r.head.all("authorization"), ["DPoP dat-1"]);
            let claims = proof_claims(r, "POST", &format!("{origin}/mcp"), Some("dat-1"))
                .unwrap_or_else(|e| panic!("{e}"));
            claims["jti"].as_str().unwrap_or_default().to_string()
        })
        .collect();
    assert_ne!(jtis[0], jtis[1], "a fresh jti per proof");
    // The next call carries the nonce at once.
    let (status, reqs) = call(&p, &st);
    assert_eq!(status, 200);
    assert_eq!(targets(&reqs), ["POST /mcp"]);
    let log = p.stderr_text();
    for secret in [SECRET, "dat-1", "the-clients-proof"] {
        assert!(!log.contains(secret), "`{secret}` in the proxy's trace log");
    }
}

/// A server whose `tools/call` needs the scope `mcp:write` (and, with `admin`, `mcp:admin`, which its
/// authorization server never grants): a token without it gets 403 `insufficient_scope` naming it. The
/// token endpoint grants what is asked for (bar `mcp:admin`); tokens are `at-N`, their scopes recorded.
fn scoped_stand(admin: bool) -> StubUpstream {
    let scopes: Arc<Mutex<Vec<String>>> = Arc::default();
    StubUpstream::start(move |req: &Req, s: &mut TcpStream| {
        let json = |s: &mut TcpStream, status: &str, body: String| {
            let _ = s.write_all(&response(status, &[("Content-Type", "application/json")], body.as_bytes()));
        };
        match req.target.as_str() {
            "/token" => {
                let asked = form(&req.body)
                    .into_iter()
                    .find(|(k, _)| k == "scope")
                    .map(|(_, v)| v)
                    .unwrap_or_default();
                let granted: Vec<&str> = asked.split(' ').filter(|s| *s != "mcp:admin").collect();
                let mut all = scopes.lock().unwrap();
                all.push(granted.join(" "));
                json(
                    s,
                    "200 OK",
                    format!(
                        r#"{{"access_token":"at-{}","token_type":"Bearer","expires_in":3600}}"#,
                        all.len()
                    ),
                );
            }
            _ => {
                let all = scopes.lock().unwrap();
                let held = req
                    .head
                    .all("authorization")
                    .first()
                    .and_then(|a| a.strip_prefix("Bearer at-"))
                    .and_then(|n| n.parse::<usize>().ok())
                    .and_then(|n| all.get(n - 1).cloned())
                    .unwrap_or_default();
                let need: &[&str] = if admin { &["mcp:write", "mcp:admin"] } else { &["mcp:write"] };
                if need.iter().all(|n| held.split(' ').any(|h| h == *n)) {
                    json(s, "200 OK", r#"{"jsonrpc":"2.0","id":3,"result":{}}"#.into());
                } else {
                    let challenge =
                        format!("Bearer error=\"insufficient_scope\", scope=\"{}\"", need.join(" "));
                    let _ = s.write_all(&response(
                        "403 Forbidden",
                        &[("WWW-Authenticate", challenge.as_str()), ("Content-Type", "application/json")],
                        br#"{"error":"insufficient_scope"}"#,
                    ));
                }
            }
        }
        Next::KeepAlive
    })
}

#[test]
fn a_403_for_more_scope_asks_once_for_the_union_then_relays() {
    let secret = secret_file();
    for admin in [false, true] {
        let stub = scoped_stand(admin);
        let endpoint = format!("http://127.0.0.1:{}/token", stub.port);
        let p = ProxyProcess::builder(stub.url())
            .agent(AGENT)
            .arg("--oauth-client-id", "c")
            .arg("--oauth-client-secret-file", &secret)
            .arg("--oauth-token-endpoint", &endpoint)
            .arg("--oauth-scope", "mcp:call")
            .env("RUST_LOG", "trace")
            .start();
        let st = Stand { stub, valid: Arc::default(), issued: Arc::default() };
        let (status, reqs) = call(&p, &st);
        let scopes: Vec<String> = reqs
            .iter()
            .filter(|r| r.target == "/token")
            .map(|r| {
                form(&r.body).into_iter().find(|(k, _)| k == "scope").map(|(_, v)| v).unwrap_or_default()
            })
            .collect();
        assert_eq!(targets(&reqs), ["POST /mcp", "POST /token", "POST /mcp"], "admin {admin}");
        let want = if admin { "mcp:call mcp:write mcp:admin" } else { "mcp:call mcp:write" };
        assert_eq!(scopes, [want], "the union of the scopes asked for and the challenge's");
        match admin {
            // The token with the union is enough: the client sees only the 200.
            false => assert_eq!(status, 200, "{}", p.stderr_text()),
            // Still refused: that 403 is relayed, and the next one at once, with no new token request.
            true => {
                assert_eq!(status, 403);
                let (status, reqs) = call(&p, &st);
                assert_eq!(status, 403);
                assert_eq!(
                    targets(&reqs),
                    ["POST /mcp", "POST /mcp"],
                    "asked once for that scope: the same token again"
                );
            }
        }
    }
}

#[test]
fn over_stdio_the_oauth_token_is_fetched_sent_and_renewed_after_a_401() {
    let st = stand(As::Post);
    let secret = secret_file();
    let mut p = ProxyProcess::builder(st.stub.url())
        .agent(AGENT)
        .arg("--oauth-client-id", "c")
        .arg("--oauth-client-secret-file", &secret)
        .env("RUST_LOG", "trace")
        .start_stdio();
    let call = serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "chat_send", "arguments": {}}});
    let last_mcp = |st: &Stand| {
        st.stub.requests().into_iter().rev().find(|r| r.target == "/mcp").expect("a request to /mcp")
    };
    let answer = p.call(&call);
    assert!(answer["result"].is_object(), "{answer}");
    assert_eq!(last_mcp(&st).head.all("authorization"), ["Bearer at-1"]);
    *st.valid.lock().unwrap() = "at-2".into();
    let answer = p.call(&call);
    assert!(answer["result"].is_object(), "the host never sees the 401: {answer}");
    assert_eq!(last_mcp(&st).head.all("authorization"), ["Bearer at-2"]);
    assert_eq!(st.issued.load(Ordering::SeqCst), 2);
    p.assert_stdout_clean();
    p.end_session(Duration::from_secs(5));
}

//! The OAuth 2.0 token request of a client that holds its own credentials
//! (RFC 6749 §4.4 client credentials, RFC 7523 §2.1 a workload's JWT as
//! the grant): which client authentication the authorization server's
//! metadata allows, which scope to ask for, where a token endpoint may be,
//! the request itself, and what an error answer says. Pure: the caller
//! reads the files, signs the client assertion (`jws`, TLS builds only)
//! and sends the request.

use crate::credentials::{form, Secret};
use crate::mcp::json::{self, Kind};
use crate::url::{self, Host};

/// RFC 7523 §2.1's grant type for a JWT as the authorization grant.
pub const JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
/// RFC 7523 §2.2's client assertion type.
pub const CLIENT_ASSERTION_TYPE: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";
/// An error description longer than this is cut before it is logged.
const DESCRIPTION_MAX: usize = 200;

/// What the client authenticates with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Credential {
    /// A client secret (`--oauth-client-secret-file`).
    Secret,
    /// A private key (`--oauth-client-key-file`): a signed JWT.
    Key,
    /// None: a public client (`--oauth-assertion-file` alone).
    Nothing,
}

/// RFC 7591 §2's `token_endpoint_auth_method` values this client uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// RFC 6749 §2.3.1, HTTP Basic.
    SecretBasic,
    /// RFC 6749 §2.3.1, in the form body.
    SecretPost,
    /// RFC 7523 §2.2, a client assertion signed with the client's key.
    PrivateKeyJwt,
    /// No client authentication (`client_id` in the body when known).
    Nothing,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Method::SecretBasic => "client_secret_basic",
            Method::SecretPost => "client_secret_post",
            Method::PrivateKeyJwt => "private_key_jwt",
            Method::Nothing => "none",
        }
    }
}

/// The method for `credential` among what the server supports. An empty
/// list means the server did not say, and RFC 8414 §2's default is
/// `client_secret_basic`; a key is then used as it is. The error says what
/// the server supports (method names, nothing secret).
pub fn choose_method(credential: Credential, supported: &[String]) -> Result<Method, String> {
    let has = |m: Method| supported.iter().any(|s| s == m.as_str());
    let unsaid = supported.is_empty();
    let chosen = match credential {
        Credential::Secret if unsaid || has(Method::SecretBasic) => Some(Method::SecretBasic),
        Credential::Secret if has(Method::SecretPost) => Some(Method::SecretPost),
        Credential::Key if unsaid || has(Method::PrivateKeyJwt) => Some(Method::PrivateKeyJwt),
        Credential::Nothing if unsaid || has(Method::Nothing) => Some(Method::Nothing),
        _ => None,
    };
    chosen.ok_or_else(|| {
        let given = match credential {
            Credential::Secret => "a client secret (client_secret_basic or client_secret_post)",
            Credential::Key => "a private key (private_key_jwt)",
            Credential::Nothing => "no client credential (none)",
        };
        format!(
            "the authorization server supports the token endpoint authentication methods [{}], \
             none of them for {given}",
            supported.join(", ")
        )
    })
}

/// The scope asked for: `--oauth-scope`, else the 401 challenge's `scope`,
/// else the protected resource's `scopes_supported`, else none (the MCP
/// authorization spec's scope selection order). Blank values count as none.
pub fn choose_scope(flag: Option<&str>, challenge: Option<&str>, supported: &[String]) -> Option<String> {
    let given = |s: Option<&str>| s.map(str::trim).filter(|s| !s.is_empty()).map(str::to_string);
    given(flag).or_else(|| given(challenge)).or_else(|| {
        let joined =
            supported.iter().map(|s| s.trim()).filter(|s| !s.is_empty()).collect::<Vec<_>>().join(" ");
        (!joined.is_empty()).then_some(joined)
    })
}

/// Whether the proxy may send credentials to `endpoint`: https, or http to
/// a loopback address or `localhost` (RFC 6749 §3.2 wants TLS; a local
/// authorization server in a test or a sidecar needs none).
pub fn check_endpoint(endpoint: &str) -> Result<url::Url, String> {
    let u = url::parse(endpoint).map_err(|why| format!("the token endpoint is not a usable URL: {why}"))?;
    let loopback = match &u.host {
        Host::Ip(ip) => ip.is_loopback(),
        Host::Name(name) => name.eq_ignore_ascii_case("localhost"),
    };
    if !u.https && !loopback {
        return Err("the token endpoint is plain http on a host that is not loopback: credentials \
                    go only over https"
            .into());
    }
    Ok(u)
}

/// RFC 8707 §2's `resource`: the upstream's URL as an absolute URI without
/// its query (and fragment), scheme and host lowercased, the default port
/// left out (the MCP authorization spec's canonical server URI).
pub fn canonical_resource(upstream: &url::Url) -> String {
    let scheme = if upstream.https { "https" } else { "http" };
    let host = upstream.host_text().to_ascii_lowercase();
    let default_port = if upstream.https { 443 } else { 80 };
    let path = upstream.target.split(['?', '#']).next().unwrap_or_default();
    let path = if path == "/" { "" } else { path };
    match upstream.port == default_port {
        true => format!("{scheme}://{host}{path}"),
        false => format!("{scheme}://{host}:{}{path}", upstream.port),
    }
}

/// What goes into one token request.
pub struct Grant<'a> {
    pub client_id: Option<&'a str>,
    pub method: Method,
    /// The client secret (`SecretBasic`, `SecretPost`).
    pub secret: Option<&'a Secret>,
    /// The signed client assertion (`PrivateKeyJwt`).
    pub client_assertion: Option<&'a str>,
    /// The workload's JWT: the grant is then RFC 7523's jwt-bearer, else
    /// client credentials.
    pub assertion: Option<&'a Secret>,
    pub scope: Option<&'a str>,
    /// `resource`, unless `--oauth-no-resource`.
    pub resource: Option<&'a str>,
}

/// A token request: a form POST to the token endpoint.
pub struct TokenRequest {
    /// The `Authorization` field's value (`Basic ...`), when the method
    /// puts the client's credentials there. Secret.
    pub authorization: Option<Secret>,
    /// The form body. Secret: it may hold a secret or an assertion.
    pub body: Secret,
}

/// Builds the request; an error names what the method needs and lacks.
pub fn token_request(g: &Grant<'_>) -> Result<TokenRequest, &'static str> {
    let mut pairs: Vec<(&str, &str)> = Vec::with_capacity(8);
    match g.assertion {
        Some(a) => {
            pairs.push(("grant_type", JWT_BEARER));
            pairs.push(("assertion", a.expose()));
        }
        None => pairs.push(("grant_type", "client_credentials")),
    }
    if let Some(scope) = g.scope {
        pairs.push(("scope", scope));
    }
    if let Some(resource) = g.resource {
        pairs.push(("resource", resource));
    }
    let mut authorization = None;
    match g.method {
        Method::SecretBasic => {
            let (Some(id), Some(secret)) = (g.client_id, g.secret) else {
                return Err("client_secret_basic needs a client id and a secret");
            };
            authorization = Some(Secret::new(form::basic(id, secret.expose())));
        }
        Method::SecretPost => {
            let (Some(id), Some(secret)) = (g.client_id, g.secret) else {
                return Err("client_secret_post needs a client id and a secret");
            };
            pairs.push(("client_id", id));
            pairs.push(("client_secret", secret.expose()));
        }
        Method::PrivateKeyJwt => {
            let Some(assertion) = g.client_assertion else {
                return Err("private_key_jwt needs a signed client assertion");
            };
            if let Some(id) = g.client_id {
                pairs.push(("client_id", id));
            }
            pairs.push(("client_assertion_type", CLIENT_ASSERTION_TYPE));
            pairs.push(("client_assertion", assertion));
        }
        Method::Nothing => {
            if let Some(id) = g.client_id {
                pairs.push(("client_id", id));
            }
        }
    }
    Ok(TokenRequest { authorization, body: Secret::new(form::encode(&pairs)) })
}

/// A string member of a top-level JSON object, decoded.
fn member_text(body: &[u8], key: &str) -> Option<String> {
    let top = json::parse_value(body).ok()?;
    if !matches!(top.kind, Kind::Object { .. }) {
        return None;
    }
    let found = json::find_member(body, &top, key).ok()?;
    found.value.and_then(|v| v.decode_str(body))
}

/// An error answer's `error` code (RFC 6749 §5.2), when it is a plain
/// token (letters, digits, `_`, `-`; at most 64 bytes).
pub fn error_code(body: &[u8]) -> Option<String> {
    member_text(body, "error").filter(|c| {
        !c.is_empty()
            && c.len() <= 64
            && c.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    })
}

/// What a token endpoint's error answer says (RFC 6749 §5.2: `error` and
/// `error_description`), for the log: the code as it is when it is a plain
/// token, the description cut and stripped of control characters. An
/// answer that is not such an object is described by its status alone.
pub fn describe_error(status: u16, body: &[u8]) -> String {
    let code = error_code(body);
    let description = member_text(body, "error_description")
        .map(|d| d.chars().filter(|c| !c.is_control()).take(DESCRIPTION_MAX).collect::<String>());
    match (code, description) {
        (Some(c), Some(d)) if !d.is_empty() => format!("the token endpoint answered {status} {c}: {d}"),
        (Some(c), _) => format!("the token endpoint answered {status} {c}"),
        _ => format!("the token endpoint answered {status}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    /// Every credential against every combination of the methods a server
    /// may list (and the empty list: RFC 8414's default).
    #[test]
    fn method_follows_the_servers_list() {
        let all = ["client_secret_basic", "client_secret_post", "private_key_jwt", "none"];
        for mask in 0u8..16 {
            let supported: Vec<String> = all
                .iter()
                .enumerate()
                .filter(|(i, _)| mask & (1 << i) != 0)
                .map(|(_, s)| s.to_string())
                .collect();
            let has = |m: &str| supported.iter().any(|s| s == m);
            let unsaid = supported.is_empty();
            let want_secret = if unsaid || has("client_secret_basic") {
                Some(Method::SecretBasic)
            } else if has("client_secret_post") {
                Some(Method::SecretPost)
            } else {
                None
            };
            let want_key = (unsaid || has("private_key_jwt")).then_some(Method::PrivateKeyJwt);
            let want_none = (unsaid || has("none")).then_some(Method::Nothing);
            for (cred, want) in [
                (Credential::Secret, want_secret),
                (Credential::Key, want_key),
                (Credential::Nothing, want_none),
            ] {
                let got = choose_method(cred, &supported);
                assert_eq!(got.as_ref().ok().copied(), want, "{cred:?} {supported:?}");
                if let Err(why) = got {
                    assert!(why.contains(&format!("[{}]", supported.join(", "))), "{why}");
                }
            }
        }
    }

    #[test]
    fn scope_selection_order() {
        let sup = list(&["mcp:read", "mcp:write"]);
        let cases: &[(Option<&str>, Option<&str>, &[String], Option<&str>)] = &[
            (Some("a b"), Some("c"), &sup, Some("a b")),
            (None, Some("c"), &sup, Some("c")),
            (None, None, &sup, Some("mcp:read mcp:write")),
            (None, None, &[], None),
            (Some("  "), Some(""), &sup, Some("mcp:read mcp:write")),
            (Some(" x "), None, &[], Some("x")),
            (None, None, &[String::new(), " ".to_string()], None),
        ];
        for (flag, challenge, supported, want) in cases {
            assert_eq!(
                choose_scope(*flag, *challenge, supported).as_deref(),
                *want,
                "{flag:?} {challenge:?}"
            );
        }
    }

    #[test]
    fn endpoints_need_https_except_on_loopback() {
        let cases: &[(&str, bool)] = &[
            ("https://as.example.com/token", true),
            ("HTTPS://as.example.com:8443/oauth/token", true),
            ("http://127.0.0.1:9000/token", true),
            ("http://127.8.9.1/token", true),
            ("http://[::1]:9000/token", true),
            ("http://localhost:9000/token", true),
            ("http://LOCALHOST/token", true),
            ("http://as.example.com/token", false),
            ("http://10.0.0.1/token", false),
            ("http://localhost.example.com/token", false),
            ("ftp://as.example.com/token", false),
            ("as.example.com/token", false),
            ("", false),
        ];
        for (url, ok) in cases {
            assert_eq!(check_endpoint(url).is_ok(), *ok, "{url}");
        }
    }

    #[test]
    fn canonical_resource_of_an_upstream() {
        let cases: &[(&str, &str)] = &[
            ("https://MCP.Example.com/mcp", "https://mcp.example.com/mcp"),
            ("https://mcp.example.com:443/mcp", "https://mcp.example.com/mcp"),
            ("https://mcp.example.com:8443/mcp?x=1", "https://mcp.example.com:8443/mcp"),
            ("http://127.0.0.1:8200/mcp", "http://127.0.0.1:8200/mcp"),
            ("http://localhost/", "http://localhost"),
            ("http://[::1]:9/a/b", "http://[::1]:9/a/b"),
        ];
        for (given, want) in cases {
            let u = url::parse(given).unwrap();
            assert_eq!(canonical_resource(&u), *want, "{given}");
        }
    }

    fn pairs(body: &str) -> Vec<(String, String)> {
        body.split('&')
            .map(|kv| {
                let (k, v) = kv.split_once('=').unwrap();
                (k.to_string(), v.to_string())
            })
            .collect()
    }

    /// Each method and grant puts the credentials where RFC 6749 §2.3.1,
    /// RFC 7523 §2.1/§2.2 say, and nowhere else.
    #[test]
    fn token_requests_by_method_and_grant() {
        let secret = Secret::new("s3cr:et".to_string());
        let workload = Secret::new("eyJ.wl.sig".to_string());
        let base = Grant {
            client_id: Some("client-1"),
            method: Method::SecretBasic,
            secret: Some(&secret),
            client_assertion: None,
            assertion: None,
            scope: Some("mcp:read mcp:write"),
            resource: Some("https://mcp.example.com/mcp"),
        };
        let basic = token_request(&base).unwrap();
        assert_eq!(
            basic.authorization.as_ref().map(Secret::expose),
            Some(form::basic("client-1", "s3cr:et").as_str())
        );
        assert_eq!(
            pairs(basic.body.expose()),
            vec![
                ("grant_type".into(), "client_credentials".into()),
                ("scope".into(), "mcp%3Aread+mcp%3Awrite".into()),
                ("resource".into(), "https%3A%2F%2Fmcp.example.com%2Fmcp".into()),
            ]
        );
        assert!(!basic.body.expose().contains("s3cr"));

        let post = token_request(&Grant { method: Method::SecretPost, scope: None, resource: None, ..base })
            .unwrap();
        assert!(post.authorization.is_none());
        assert_eq!(
            pairs(post.body.expose()),
            vec![
                ("grant_type".into(), "client_credentials".into()),
                ("client_id".into(), "client-1".into()),
                ("client_secret".into(), "s3cr%3Aet".into()),
            ]
        );

        let jwt = token_request(&Grant {
            method: Method::PrivateKeyJwt,
            secret: None,
            client_assertion: Some("h.c.s"),
            scope: None,
            resource: None,
            ..base
        })
        .unwrap();
        assert!(jwt.authorization.is_none());
        assert_eq!(
            pairs(jwt.body.expose()),
            vec![
                ("grant_type".into(), "client_credentials".into()),
                ("client_id".into(), "client-1".into()),
                (
                    "client_assertion_type".into(),
                    form::encode(&[("", CLIENT_ASSERTION_TYPE)])[1..].to_string()
                ),
                ("client_assertion".into(), "h.c.s".into()),
            ]
        );

        let wif = token_request(&Grant {
            method: Method::Nothing,
            secret: None,
            assertion: Some(&workload),
            client_id: Some("wl"),
            scope: None,
            ..base
        })
        .unwrap();
        assert!(wif.authorization.is_none());
        let p = pairs(wif.body.expose());
        assert_eq!(p[0], ("grant_type".into(), form::encode(&[("", JWT_BEARER)])[1..].to_string()));
        assert_eq!(p[1], ("assertion".into(), "eyJ.wl.sig".into()));
        assert_eq!(p[2].0, "resource");
        assert_eq!(p[3], ("client_id".into(), "wl".into()));
        assert_eq!(p.len(), 4);

        // What a method needs and lacks is an error, never a request without it.
        assert!(token_request(&Grant { secret: None, ..base }).is_err());
        assert!(token_request(&Grant { method: Method::SecretPost, client_id: None, ..base }).is_err());
        assert!(token_request(&Grant { method: Method::PrivateKeyJwt, ..base }).is_err());
        let public =
            token_request(&Grant { method: Method::Nothing, client_id: None, secret: None, ..base }).unwrap();
        assert!(!public.body.expose().contains("client_id"));
    }

    #[test]
    fn error_answers_are_described_without_echoing_the_body() {
        let cases: &[(u16, &str, &str)] = &[
            (
                400,
                r#"{"error":"invalid_client","error_description":"Invalid client credentials"}"#,
                "the token endpoint answered 400 invalid_client: Invalid client credentials",
            ),
            (401, r#"{"error":"invalid_grant"}"#, "the token endpoint answered 401 invalid_grant"),
            (400, r#"{"error":"bad code with spaces"}"#, "the token endpoint answered 400"),
            (500, "<html>oops</html>", "the token endpoint answered 500"),
            (400, r#"["invalid_client"]"#, "the token endpoint answered 400"),
            (
                400,
                r#"{"error":"x","error_description":"line\none\u0007"}"#,
                "the token endpoint answered 400 x: lineone",
            ),
        ];
        for (status, body, want) in cases {
            assert_eq!(describe_error(*status, body.as_bytes()), *want, "{body}");
        }
        let long = format!(r#"{{"error":"e","error_description":"{}"}}"#, "d".repeat(5000));
        assert!(describe_error(400, long.as_bytes()).len() < 300);
    }
}

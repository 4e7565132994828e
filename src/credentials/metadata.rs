//! The OAuth metadata the client discovers its token endpoint with:
//! protected-resource metadata (RFC 9728 §2), authorization-server metadata
//! (RFC 8414 §2, with RFC 9449 §5.1's DPoP member; an OpenID configuration
//! reads the same), the well-known URLs each is fetched from, in the order
//! the MCP authorization specification tries them, and the issuer check.
//! Pure: a document's bytes in, the members the client uses out; a URL in,
//! URLs out.
//!
//! Read with the project's one JSON reader (`mcp::json`). Unknown members
//! are ignored and `null` reads as absent (as in `output`); a member of the
//! wrong type, or one this module reads that occurs twice (which one a
//! server meant is not ours to guess), is an error naming the member. An
//! error carries fixed text and numbers, never a byte of the document.

use std::fmt;

use crate::mcp::json::{self, Kind, ScanError, Value};

/// Largest document read. Real ones are a few KiB (Entra's OpenID
/// configuration about 2 KiB); past this it is not metadata.
pub const MAX_METADATA_LEN: usize = 64 * 1024;

/// Most elements read in one array member (scopes, algorithms, servers).
/// Far above any real list; bounds what a hostile document can make us
/// allocate one string at a time.
pub const MAX_METADATA_ARRAY: usize = 256;

/// RFC 9728 §3's well-known suffix.
const PROTECTED_RESOURCE: &str = "/.well-known/oauth-protected-resource";
/// RFC 8414 §3's well-known suffix.
const AUTHORIZATION_SERVER: &str = "/.well-known/oauth-authorization-server";
/// OpenID Connect Discovery 1.0 §4's well-known suffix.
const OPENID_CONFIGURATION: &str = "/.well-known/openid-configuration";

/// Protected-resource metadata (RFC 9728 §2): the members the client uses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResourceMetadata {
    /// The resource identifier; the caller compares it with the resource's
    /// URL (RFC 9728 §3.3).
    pub resource: Option<String>,
    pub authorization_servers: Vec<String>,
    pub scopes_supported: Vec<String>,
}

/// Authorization-server metadata (RFC 8414 §2, RFC 9449 §5.1): the members
/// the client uses. A list member that is absent is empty.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerMetadata {
    /// Never empty.
    pub issuer: String,
    pub token_endpoint: Option<String>,
    pub token_endpoint_auth_methods_supported: Vec<String>,
    pub token_endpoint_auth_signing_alg_values_supported: Vec<String>,
    pub grant_types_supported: Vec<String>,
    pub scopes_supported: Vec<String>,
    pub dpop_signing_alg_values_supported: Vec<String>,
}

/// Why a document is not metadata the client can use. Copy and free of
/// document bytes: `member` is one of this module's fixed names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetadataError {
    /// The document is longer than `MAX_METADATA_LEN`.
    TooLarge { len: usize },
    /// Not JSON.
    Json(ScanError),
    /// JSON, but not an object.
    NotObject,
    /// A required member is absent (or `null`).
    Missing { member: &'static str },
    /// A member holds the wrong type of JSON value (or an array element
    /// that is not a string).
    WrongType { member: &'static str },
    /// A string in the member holds an unpaired surrogate escape.
    NotText { member: &'static str },
    /// The member occurs twice.
    Duplicate { member: &'static str },
    /// The member's array has more than `MAX_METADATA_ARRAY` elements.
    TooMany { member: &'static str },
    /// A member that must not be empty is the empty string.
    Empty { member: &'static str },
}

impl fmt::Display for MetadataError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetadataError::TooLarge { len } => {
                write!(f, "the metadata document is {len} bytes long, over the limit of {MAX_METADATA_LEN}")
            }
            MetadataError::Json(e) => write!(f, "the metadata document is not JSON: {e}"),
            MetadataError::NotObject => f.write_str("the metadata document is not a JSON object"),
            MetadataError::Missing { member } => write!(f, "the metadata document has no `{member}`"),
            MetadataError::WrongType { member } => {
                write!(f, "`{member}` in the metadata document has the wrong JSON type")
            }
            MetadataError::NotText { member } => {
                write!(f, "`{member}` in the metadata document holds an unpaired surrogate escape")
            }
            MetadataError::Duplicate { member } => {
                write!(f, "`{member}` occurs twice in the metadata document")
            }
            MetadataError::TooMany { member } => {
                write!(f, "`{member}` in the metadata document has more than {MAX_METADATA_ARRAY} elements")
            }
            MetadataError::Empty { member } => write!(f, "`{member}` in the metadata document is empty"),
        }
    }
}

impl std::error::Error for MetadataError {}

impl From<ScanError> for MetadataError {
    fn from(e: ScanError) -> Self {
        MetadataError::Json(e)
    }
}

/// Reads protected-resource metadata (RFC 9728 §2). Every member is
/// optional here; which are needed is the caller's to say.
pub fn parse_resource(body: &[u8]) -> Result<ResourceMetadata, MetadataError> {
    const NAMES: [&str; 3] = ["resource", "authorization_servers", "scopes_supported"];
    let top = object(body)?;
    let [resource, servers, scopes] = members(body, &top, NAMES)?;
    Ok(ResourceMetadata {
        resource: string(body, resource, NAMES[0])?,
        authorization_servers: strings(body, servers, NAMES[1])?,
        scopes_supported: strings(body, scopes, NAMES[2])?,
    })
}

/// Reads authorization-server metadata (RFC 8414 §2). `issuer` is required
/// and not empty; the rest is optional.
pub fn parse_server(body: &[u8]) -> Result<ServerMetadata, MetadataError> {
    const NAMES: [&str; 7] = [
        "issuer",
        "token_endpoint",
        "token_endpoint_auth_methods_supported",
        "token_endpoint_auth_signing_alg_values_supported",
        "grant_types_supported",
        "scopes_supported",
        "dpop_signing_alg_values_supported",
    ];
    let top = object(body)?;
    let [issuer, token_endpoint, auth_methods, signing_algs, grant_types, scopes, dpop_algs] =
        members(body, &top, NAMES)?;
    let issuer = string(body, issuer, NAMES[0])?.ok_or(MetadataError::Missing { member: NAMES[0] })?;
    if issuer.is_empty() {
        return Err(MetadataError::Empty { member: NAMES[0] });
    }
    Ok(ServerMetadata {
        issuer,
        token_endpoint: string(body, token_endpoint, NAMES[1])?,
        token_endpoint_auth_methods_supported: strings(body, auth_methods, NAMES[2])?,
        token_endpoint_auth_signing_alg_values_supported: strings(body, signing_algs, NAMES[3])?,
        grant_types_supported: strings(body, grant_types, NAMES[4])?,
        scopes_supported: strings(body, scopes, NAMES[5])?,
        dpop_signing_alg_values_supported: strings(body, dpop_algs, NAMES[6])?,
    })
}

/// RFC 8414 §3.3: the `issuer` in the metadata must be identical to the
/// issuer the metadata URL was built from. A plain string comparison, with
/// no normalization: `https://as/` is not `https://as`, nor is
/// `HTTPS://as`.
pub fn issuer_matches(expected: &str, metadata: &ServerMetadata) -> bool {
    metadata.issuer == expected
}

/// Where to fetch a resource's metadata from (RFC 9728 §3.1, in the order
/// the MCP authorization specification tries them): for a URL with a path,
/// the well-known suffix inserted between the host and the path, then at
/// the root; without a path, only the root. The query and fragment are
/// dropped (the MCP server's URL may carry a query the metadata URL does
/// not), and so is a path's terminating `/`. Empty when `resource` is not
/// an http(s) URL with a host.
pub fn resource_metadata_urls(resource: &str) -> Vec<String> {
    let without_query = resource.find(['?', '#']).and_then(|i| resource.get(..i)).unwrap_or(resource);
    let Some((origin, path)) = origin_and_path(without_query) else {
        return Vec::new();
    };
    let root = format!("{origin}{PROTECTED_RESOURCE}");
    if path.is_empty() {
        return vec![root];
    }
    vec![format!("{root}{path}"), root]
}

/// Where to fetch an authorization server's metadata from, in the MCP
/// authorization specification's order. With a path: RFC 8414 §3.1's path
/// insertion, OpenID Connect's path insertion, then OpenID Connect
/// Discovery 1.0 §4's suffix appended to the path; without one: the two
/// suffixes at the root. A path's terminating `/` is dropped first (RFC
/// 8414 §3.1). Empty when `issuer` is not an http(s) URL with a host, or
/// has a query or fragment, which an issuer never has (RFC 8414 §2).
pub fn server_metadata_urls(issuer: &str) -> Vec<String> {
    if issuer.contains(['?', '#']) {
        return Vec::new();
    }
    let Some((origin, path)) = origin_and_path(issuer) else {
        return Vec::new();
    };
    if path.is_empty() {
        return vec![format!("{origin}{AUTHORIZATION_SERVER}"), format!("{origin}{OPENID_CONFIGURATION}")];
    }
    vec![
        format!("{origin}{AUTHORIZATION_SERVER}{path}"),
        format!("{origin}{OPENID_CONFIGURATION}{path}"),
        format!("{origin}{path}{OPENID_CONFIGURATION}"),
    ]
}

/// `scheme://authority` and the path of `url`, both as written, the path
/// without its terminating slashes (so `""` for none), once `url::parse`
/// has found `url` an http(s) URL with a host. `url` has no query or
/// fragment, so the authority ends at the first `/` after `://`.
fn origin_and_path(url: &str) -> Option<(&str, &str)> {
    crate::url::parse(url).ok()?;
    // The parser accepted `http://` or `https://` (any case) at the start.
    let authority = url.find("://")?.checked_add(3)?;
    let path_at = url.get(authority..)?.find('/').map_or(url.len(), |i| authority + i);
    Some((url.get(..path_at)?, url.get(path_at..)?.trim_end_matches('/')))
}

/// The document's top-level object.
fn object(body: &[u8]) -> Result<Value, MetadataError> {
    if body.len() > MAX_METADATA_LEN {
        return Err(MetadataError::TooLarge { len: body.len() });
    }
    let top = json::parse_value(body)?;
    if !matches!(top.kind, Kind::Object { .. }) {
        return Err(MetadataError::NotObject);
    }
    Ok(top)
}

/// The values of the members `names` of `object`, in one pass; a name
/// that occurs twice is an error.
fn members<const N: usize>(
    body: &[u8],
    object: &Value,
    names: [&'static str; N],
) -> Result<[Option<Value>; N], MetadataError> {
    let mut found = [None; N];
    json::for_each_member(body, object, |key, value| {
        for (name, slot) in names.iter().zip(found.iter_mut()) {
            if key.is(body, name) {
                if slot.is_some() {
                    return Err(MetadataError::Duplicate { member: name });
                }
                *slot = Some(value);
            }
        }
        Ok(())
    })?;
    Ok(found)
}

/// A string value's decoded text.
fn text(body: &[u8], value: &Value, member: &'static str) -> Result<String, MetadataError> {
    if !matches!(value.kind, Kind::String { .. }) {
        return Err(MetadataError::WrongType { member });
    }
    value.decode_str(body).ok_or(MetadataError::NotText { member })
}

/// An optional string member; `null` reads as absent.
fn string(body: &[u8], value: Option<Value>, member: &'static str) -> Result<Option<String>, MetadataError> {
    match value {
        None => Ok(None),
        Some(v) if v.kind == Kind::Null => Ok(None),
        Some(v) => text(body, &v, member).map(Some),
    }
}

/// An optional array-of-strings member, empty when absent or `null`.
fn strings(body: &[u8], value: Option<Value>, member: &'static str) -> Result<Vec<String>, MetadataError> {
    let Some(array) = value.filter(|v| v.kind != Kind::Null) else {
        return Ok(Vec::new());
    };
    if array.kind != Kind::Array {
        return Err(MetadataError::WrongType { member });
    }
    let mut out = Vec::new();
    json::for_each_element(body, &array, |element| {
        if out.len() == MAX_METADATA_ARRAY {
            return Err(MetadataError::TooMany { member });
        }
        out.push(text(body, &element, member)?);
        Ok(())
    })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    /// RFC 9728 §3.2's example response.
    const RFC9728_EXAMPLE: &str = r#"{
        "resource": "https://resource.example.com",
        "authorization_servers": ["https://as1.example.com", "https://as2.example.net"],
        "bearer_methods_supported": ["header", "body"],
        "scopes_supported": ["profile", "email", "phone"],
        "resource_documentation": "https://resource.example.com/resource_documentation.html"
    }"#;

    /// RFC 8414 §3.2's example response, with RFC 9449 §5.1's member and
    /// the grant types added.
    const RFC8414_EXAMPLE: &str = r#"{
        "issuer": "https://server.example.com",
        "authorization_endpoint": "https://server.example.com/authorize",
        "token_endpoint": "https://server.example.com/token",
        "token_endpoint_auth_methods_supported": ["client_secret_basic", "private_key_jwt"],
        "token_endpoint_auth_signing_alg_values_supported": ["RS256", "ES256"],
        "userinfo_endpoint": "https://server.example.com/userinfo",
        "jwks_uri": "https://server.example.com/jwks.json",
        "registration_endpoint": "https://server.example.com/register",
        "scopes_supported": ["openid", "profile", "email", "address", "phone", "offline_access"],
        "response_types_supported": ["code", "code token"],
        "grant_types_supported": ["authorization_code", "client_credentials"],
        "dpop_signing_alg_values_supported": ["ES256", "PS256"],
        "service_documentation": "http://server.example.com/service_documentation.html",
        "ui_locales_supported": ["en-US", "en-GB", "en-CA", "fr-FR", "fr-CA"]
    }"#;

    #[test]
    fn resource_metadata_reads() {
        let cases: Vec<(&str, ResourceMetadata)> = vec![
            (
                RFC9728_EXAMPLE,
                ResourceMetadata {
                    resource: Some("https://resource.example.com".into()),
                    authorization_servers: v(&["https://as1.example.com", "https://as2.example.net"]),
                    scopes_supported: v(&["profile", "email", "phone"]),
                },
            ),
            ("{}", ResourceMetadata::default()),
            (" {\"x\":[1,{\"y\":null}],\"x\":2} ", ResourceMetadata::default()),
            (
                r#"{"resource":null,"authorization_servers":null,"scopes_supported":[]}"#,
                ResourceMetadata::default(),
            ),
            // Escapes decoded; keys compared decoded.
            (
                r#"{"r\u0065source":"https:\/\/h\/mcp","scopes_supported":["a\"b","\u00e9","\ud83d\ude00",""]}"#,
                ResourceMetadata {
                    resource: Some("https://h/mcp".into()),
                    scopes_supported: v(&["a\"b", "é", "😀", ""]),
                    ..Default::default()
                },
            ),
        ];
        for (doc, want) in cases {
            assert_eq!(parse_resource(doc.as_bytes()), Ok(want), "{doc}");
        }
    }

    #[test]
    fn server_metadata_reads() {
        let cases: Vec<(&str, ServerMetadata)> = vec![
            (
                RFC8414_EXAMPLE,
                ServerMetadata {
                    issuer: "https://server.example.com".into(),
                    token_endpoint: Some("https://server.example.com/token".into()),
                    token_endpoint_auth_methods_supported: v(&["client_secret_basic", "private_key_jwt"]),
                    token_endpoint_auth_signing_alg_values_supported: v(&["RS256", "ES256"]),
                    grant_types_supported: v(&["authorization_code", "client_credentials"]),
                    scopes_supported: v(&[
                        "openid",
                        "profile",
                        "email",
                        "address",
                        "phone",
                        "offline_access",
                    ]),
                    dpop_signing_alg_values_supported: v(&["ES256", "PS256"]),
                },
            ),
            (
                r#"{"issuer":"https://as"}"#,
                ServerMetadata { issuer: "https://as".into(), ..Default::default() },
            ),
            (
                r#"{"issuer":"https://as/tenant/v2.0/","token_endpoint":null,"unknown":{"issuer":1}}"#,
                ServerMetadata { issuer: "https://as/tenant/v2.0/".into(), ..Default::default() },
            ),
        ];
        for (doc, want) in cases {
            assert_eq!(parse_server(doc.as_bytes()), Ok(want), "{doc}");
        }
    }

    #[test]
    fn documents_that_are_refused_name_the_member() {
        use MetadataError::*;
        let big = format!("{{\"x\":\"{}\"}}", "a".repeat(MAX_METADATA_LEN));
        let many = |n: usize| {
            let items = vec!["\"s\""; n].join(",");
            format!(r#"{{"issuer":"i","scopes_supported":[{items}]}}"#)
        };
        let over_cap = many(MAX_METADATA_ARRAY + 1);
        // Refused by both readers alike.
        let both: &[(&str, MetadataError)] = &[
            (&big, TooLarge { len: big.len() }),
            ("", Json(ScanError::Syntax { offset: 0 })),
            ("{", Json(ScanError::Syntax { offset: 1 })),
            (r#"{"issuer":"i"} x"#, Json(ScanError::Syntax { offset: 15 })),
            ("[]", NotObject),
            ("\"issuer\"", NotObject),
            ("null", NotObject),
            (r#"{"issuer":"i","scopes_supported":["\udc00"]}"#, NotText { member: "scopes_supported" }),
            (r#"{"issuer":"i","scopes_supported":[["a"]]}"#, WrongType { member: "scopes_supported" }),
            (r#"{"issuer":"i","scopes_supported":"a b"}"#, WrongType { member: "scopes_supported" }),
            (
                r#"{"issuer":"i","scopes_supported":[],"scopes_supported":[]}"#,
                Duplicate { member: "scopes_supported" },
            ),
            (&over_cap, TooMany { member: "scopes_supported" }),
        ];
        let server: &[(&str, MetadataError)] = &[
            // issuer: required, a non-empty string, once.
            ("{}", Missing { member: "issuer" }),
            (r#"{"issuer":null}"#, Missing { member: "issuer" }),
            (r#"{"Issuer":"i"}"#, Missing { member: "issuer" }),
            (r#"{"issuer":""}"#, Empty { member: "issuer" }),
            (r#"{"issuer":1}"#, WrongType { member: "issuer" }),
            (r#"{"issuer":["https://as"]}"#, WrongType { member: "issuer" }),
            (r#"{"issuer":"\ud800"}"#, NotText { member: "issuer" }),
            (r#"{"issuer":"a","issuer":"a"}"#, Duplicate { member: "issuer" }),
            (r#"{"issuer":"a","iss\u0075er":"b"}"#, Duplicate { member: "issuer" }),
            // The other members: their types, their duplicates.
            (r#"{"issuer":"i","token_endpoint":true}"#, WrongType { member: "token_endpoint" }),
            (
                r#"{"issuer":"i","token_endpoint":"a","token_endpoint":null}"#,
                Duplicate { member: "token_endpoint" },
            ),
            (
                r#"{"issuer":"i","grant_types_supported":"client_credentials"}"#,
                WrongType { member: "grant_types_supported" },
            ),
            (
                r#"{"issuer":"i","token_endpoint_auth_methods_supported":[1]}"#,
                WrongType { member: "token_endpoint_auth_methods_supported" },
            ),
            (
                r#"{"issuer":"i","token_endpoint_auth_signing_alg_values_supported":["a",null]}"#,
                WrongType { member: "token_endpoint_auth_signing_alg_values_supported" },
            ),
            (
                r#"{"issuer":"i","dpop_signing_alg_values_supported":{}}"#,
                WrongType { member: "dpop_signing_alg_values_supported" },
            ),
        ];
        let resource: &[(&str, MetadataError)] = &[
            (r#"{"resource":5}"#, WrongType { member: "resource" }),
            (r#"{"resource":"a","resource":"b"}"#, Duplicate { member: "resource" }),
            (r#"{"authorization_servers":"https://as"}"#, WrongType { member: "authorization_servers" }),
            (r#"{"authorization_servers":[{}]}"#, WrongType { member: "authorization_servers" }),
            (
                r#"{"authorization_servers":[],"authorization_servers":[]}"#,
                Duplicate { member: "authorization_servers" },
            ),
        ];
        for (doc, want) in both {
            assert_eq!(parse_server(doc.as_bytes()), Err(*want), "{doc}");
            assert_eq!(parse_resource(doc.as_bytes()), Err(*want), "{doc}");
        }
        for (doc, want) in server {
            assert_eq!(parse_server(doc.as_bytes()), Err(*want), "{doc}");
        }
        for (doc, want) in resource {
            assert_eq!(parse_resource(doc.as_bytes()), Err(*want), "{doc}");
        }
        let not_utf8 = Err(Json(ScanError::InvalidUtf8 { offset: 11 }));
        assert_eq!(parse_server(b"{\"issuer\":\"\xff\"}"), not_utf8);
        // At the caps, read.
        let at_cap = many(MAX_METADATA_ARRAY);
        assert_eq!(parse_server(at_cap.as_bytes()).map(|m| m.scopes_supported.len()), Ok(MAX_METADATA_ARRAY));
        let at_len = format!("{{\"issuer\":\"{}\"}}", "a".repeat(MAX_METADATA_LEN - 13));
        assert_eq!(at_len.len(), MAX_METADATA_LEN);
        assert!(parse_server(at_len.as_bytes()).is_ok());
    }

    #[test]
    fn issuer_is_compared_exactly() {
        let m = parse_server(br#"{"issuer":"https://as.example.com/tenant"}"#).unwrap();
        let cases: &[(&str, bool)] = &[
            ("https://as.example.com/tenant", true),
            ("https://as.example.com/tenant/", false),
            ("https://AS.example.com/tenant", false),
            ("HTTPS://as.example.com/tenant", false),
            ("https://as.example.com:443/tenant", false),
            ("https://as.example.com/Tenant", false),
            ("https://as.example.com", false),
            ("", false),
        ];
        for (expected, want) in cases {
            assert_eq!(issuer_matches(expected, &m), *want, "{expected}");
        }
    }

    #[test]
    fn resource_metadata_urls_insert_then_fall_back_to_the_root() {
        let cases: &[(&str, &[&str])] = &[
            // The MCP authorization specification's example.
            (
                "https://example.com/public/mcp",
                &[
                    "https://example.com/.well-known/oauth-protected-resource/public/mcp",
                    "https://example.com/.well-known/oauth-protected-resource",
                ],
            ),
            ("https://h", &["https://h/.well-known/oauth-protected-resource"]),
            ("https://h/", &["https://h/.well-known/oauth-protected-resource"]),
            ("https://h?x=1", &["https://h/.well-known/oauth-protected-resource"]),
            (
                "https://h/mcp/",
                &[
                    "https://h/.well-known/oauth-protected-resource/mcp",
                    "https://h/.well-known/oauth-protected-resource",
                ],
            ),
            // Query and fragment dropped.
            (
                "http://127.0.0.1:8080/mcp?session=1#top",
                &[
                    "http://127.0.0.1:8080/.well-known/oauth-protected-resource/mcp",
                    "http://127.0.0.1:8080/.well-known/oauth-protected-resource",
                ],
            ),
            ("https://h#frag", &["https://h/.well-known/oauth-protected-resource"]),
            // Scheme and authority as written.
            (
                "HTTPS://MCP.Example.com:443/A%20b",
                &[
                    "HTTPS://MCP.Example.com:443/.well-known/oauth-protected-resource/A%20b",
                    "HTTPS://MCP.Example.com:443/.well-known/oauth-protected-resource",
                ],
            ),
            ("http://[::1]:9/", &["http://[::1]:9/.well-known/oauth-protected-resource"]),
            // Not an http(s) URL with a host.
            ("", &[]),
            ("mcp.example.com/mcp", &[]),
            ("ftp://h/mcp", &[]),
            ("https:///mcp", &[]),
            ("https://user@h/mcp", &[]),
            ("https://h:0/mcp", &[]),
            ("https://h/a b", &[]),
        ];
        for (resource, want) in cases {
            assert_eq!(resource_metadata_urls(resource), v(want), "{resource}");
        }
    }

    #[test]
    fn server_metadata_urls_follow_the_mcp_order() {
        let cases: &[(&str, &[&str])] = &[
            (
                "https://auth.example.com/tenant1",
                &[
                    "https://auth.example.com/.well-known/oauth-authorization-server/tenant1",
                    "https://auth.example.com/.well-known/openid-configuration/tenant1",
                    "https://auth.example.com/tenant1/.well-known/openid-configuration",
                ],
            ),
            (
                "https://auth.example.com",
                &[
                    "https://auth.example.com/.well-known/oauth-authorization-server",
                    "https://auth.example.com/.well-known/openid-configuration",
                ],
            ),
            (
                "https://auth.example.com/",
                &[
                    "https://auth.example.com/.well-known/oauth-authorization-server",
                    "https://auth.example.com/.well-known/openid-configuration",
                ],
            ),
            // Entra's v2 issuer: the trailing slash goes before insertion.
            (
                "https://login.microsoftonline.com/t-1/v2.0/",
                &[
                    "https://login.microsoftonline.com/.well-known/oauth-authorization-server/t-1/v2.0",
                    "https://login.microsoftonline.com/.well-known/openid-configuration/t-1/v2.0",
                    "https://login.microsoftonline.com/t-1/v2.0/.well-known/openid-configuration",
                ],
            ),
            (
                "http://localhost:9000/a/b",
                &[
                    "http://localhost:9000/.well-known/oauth-authorization-server/a/b",
                    "http://localhost:9000/.well-known/openid-configuration/a/b",
                    "http://localhost:9000/a/b/.well-known/openid-configuration",
                ],
            ),
            // An issuer has no query or fragment (RFC 8414 §2).
            ("https://as?x", &[]),
            ("https://as/t#f", &[]),
            ("https://as/t?", &[]),
            ("", &[]),
            ("as.example.com", &[]),
            ("https://", &[]),
            ("urn:as", &[]),
        ];
        for (issuer, want) in cases {
            assert_eq!(server_metadata_urls(issuer), v(want), "{issuer}");
        }
    }

    #[test]
    fn mutations_never_panic_and_stay_bounded() {
        use crate::test_rng::Rng;
        let mut r = Rng(0x0A17_4D0C);
        for seed in [RFC8414_EXAMPLE, RFC9728_EXAMPLE] {
            let b = seed.as_bytes();
            for i in 0..=b.len() {
                let _ = (parse_server(&b[..i]), parse_resource(&b[..i]));
            }
            for _ in 0..2_000 {
                let mut m = b.to_vec();
                let at = r.below(m.len());
                m[at] = r.pick(b"{}[]\":,\\0n \xff");
                if let Ok(s) = parse_server(&m) {
                    assert!(!s.issuer.is_empty());
                }
                let _ = parse_resource(&m);
            }
        }
        for url in ["https://h/a/b/", "http://[::1]:80/x?y#z", "https://h"] {
            for i in 0..=url.len() {
                let Some(prefix) = url.get(..i) else { continue };
                for built in resource_metadata_urls(prefix).iter().chain(&server_metadata_urls(prefix)) {
                    assert!(built.len() <= prefix.len() + AUTHORIZATION_SERVER.len(), "{built}");
                    assert!(crate::url::parse(built).is_ok(), "{built}");
                }
            }
        }
    }

    #[test]
    fn errors_carry_no_document() {
        let docs = [
            r#"{"issuer":"SECRET-1","issuer":"SECRET-2"}"#,
            r#"{"issuer":"SECRET-1","token_endpoint":["SECRET-2"]}"#,
            r#"{"SECRET":1}"#,
            r#"{"issuer":SECRET}"#,
            r#"["SECRET"]"#,
        ];
        for doc in docs {
            let e = parse_server(doc.as_bytes()).unwrap_err();
            let shown = format!("{e} {e:?}");
            assert!(!shown.contains("SECRET"), "{shown}");
        }
        let messages = [
            (MetadataError::Missing { member: "issuer" }, "the metadata document has no `issuer`"),
            (
                MetadataError::TooMany { member: "scopes_supported" },
                "`scopes_supported` in the metadata document has more than 256 elements",
            ),
            (
                MetadataError::TooLarge { len: 70_000 },
                "the metadata document is 70000 bytes long, over the limit of 65536",
            ),
            (
                MetadataError::Json(ScanError::Syntax { offset: 4 }),
                "the metadata document is not JSON: invalid JSON at byte 4",
            ),
        ];
        for (e, want) in messages {
            assert_eq!(e.to_string(), want);
        }
    }
}

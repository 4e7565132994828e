//! Defends the reading of OAuth metadata documents
//! (`credentials::metadata::parse_resource`, `parse_server`) and the
//! well-known URLs built from a resource or issuer: fed any bytes, nothing
//! panics; a document read gives a non-empty issuer, at most
//! `MAX_METADATA_ARRAY` elements per list and no more decoded text than
//! the document had bytes; every error is a fixed message (numbers and
//! member names aside); and when the input is UTF-8, the URLs built from
//! it are at most 2 (resource) or 3 (issuer), each no longer than the
//! input plus a well-known suffix, and each an http(s) URL on the input's
//! own host and port.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_identity_proxy::credentials::metadata::{self, MAX_METADATA_ARRAY};
use mcp_identity_proxy::url;

/// The longest suffix a builder adds (`/.well-known/oauth-authorization-server`).
const SUFFIX: usize = 39;

/// Member names and numbers aside, `message` is one of the fixed texts.
fn check_message(message: &str) {
    const NAMES: &[&str] = &[
        "resource",
        "authorization_servers",
        "scopes_supported",
        "issuer",
        "token_endpoint",
        "token_endpoint_auth_methods_supported",
        "token_endpoint_auth_signing_alg_values_supported",
        "grant_types_supported",
        "dpop_signing_alg_values_supported",
    ];
    let mut shape = String::new();
    let mut rest = message;
    // A backquoted name must be one of ours.
    while let Some((before, after)) = rest.split_once('`') {
        shape.push_str(before);
        let (name, after) = after.split_once('`').expect("backquotes pair");
        assert!(NAMES.contains(&name), "not a member name: {name:?} in {message:?}");
        shape.push_str("`M`");
        rest = after;
    }
    shape.push_str(rest);
    let shape: String = shape.chars().filter(|c| !c.is_ascii_digit()).collect();
    const FIXED: &[&str] = &[
        "the metadata document is  bytes long, over the limit of ",
        "the metadata document is not JSON: invalid JSON at byte ",
        "the metadata document is not JSON: invalid UTF- at byte ",
        "the metadata document is not JSON: JSON nested deeper than  at byte ",
        "the metadata document is not a JSON object",
        "the metadata document has no `M`",
        "`M` in the metadata document has the wrong JSON type",
        "`M` in the metadata document holds an unpaired surrogate escape",
        "`M` occurs twice in the metadata document",
        "`M` in the metadata document has more than  elements",
        "`M` in the metadata document is empty",
    ];
    assert!(FIXED.contains(&shape.as_str()), "not a fixed message: {message:?}");
}

fn text_len<'a>(lists: impl IntoIterator<Item = &'a Vec<String>>) -> usize {
    lists.into_iter().map(|l| l.iter().map(String::len).sum::<usize>()).sum()
}

fn check_urls(input: &str, built: &[String], most: usize) {
    assert!(built.len() <= most, "{} URLs", built.len());
    let Some(first) = built.first() else { return };
    let base = url::parse(first).expect("a built URL parses");
    for u in built {
        assert!(u.len() <= input.len() + SUFFIX, "{u:?} from {input:?}");
        let parsed = url::parse(u).expect("a built URL parses");
        assert_eq!((parsed.https, &parsed.host, parsed.port), (base.https, &base.host, base.port));
        assert!(u.contains("/.well-known/"), "{u:?}");
    }
}

fuzz_target!(|data: &[u8]| {
    match metadata::parse_resource(data) {
        Ok(m) => {
            for list in [&m.authorization_servers, &m.scopes_supported] {
                assert!(list.len() <= MAX_METADATA_ARRAY);
            }
            let decoded = m.resource.as_ref().map_or(0, String::len)
                + text_len([&m.authorization_servers, &m.scopes_supported]);
            assert!(decoded <= data.len());
        }
        Err(e) => check_message(&e.to_string()),
    }
    match metadata::parse_server(data) {
        Ok(m) => {
            assert!(!m.issuer.is_empty());
            assert!(metadata::issuer_matches(&m.issuer, &m));
            let lists = [
                &m.token_endpoint_auth_methods_supported,
                &m.token_endpoint_auth_signing_alg_values_supported,
                &m.grant_types_supported,
                &m.scopes_supported,
                &m.dpop_signing_alg_values_supported,
            ];
            assert!(lists.iter().all(|l| l.len() <= MAX_METADATA_ARRAY));
            let decoded = m.issuer.len() + m.token_endpoint.as_ref().map_or(0, String::len) + text_len(lists);
            assert!(decoded <= data.len());
        }
        Err(e) => check_message(&e.to_string()),
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let resource = metadata::resource_metadata_urls(text);
        check_urls(text, &resource, 2);
        if let Ok(origin) = url::parse(text.split(['?', '#']).next().unwrap_or_default()) {
            let root = url::parse(resource.last().expect("an http(s) URL has a root")).expect("parses");
            assert_eq!((root.https, root.host, root.port), (origin.https, origin.host, origin.port));
        }
        let issuer = metadata::server_metadata_urls(text);
        check_urls(text, &issuer, 3);
        assert!(issuer.is_empty() || issuer.len() >= 2);
    }
});

//! The challenges of a `WWW-Authenticate` field value (RFC 9110 §11.6.1),
//! which the OAuth client reads from a 401 or 403: the scheme (`Bearer`,
//! `DPoP`), `error`, `scope` and `resource_metadata` (RFC 6750 §3, RFC
//! 9449 §7.1, RFC 9728 §5.1). Pure: the field value in, the challenges out.
//!
//! The grammar (RFC 9110 §11.3, §5.6):
//!
//! ```text
//! WWW-Authenticate = #challenge
//! challenge        = auth-scheme [ 1*SP ( token68 / #auth-param ) ]
//! auth-param       = token BWS "=" BWS ( token / quoted-string )
//! token68          = 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"="
//! ```
//!
//! Both lists share one comma, so a list element is a new challenge unless
//! it is `token BWS "="`, which is one more parameter of the challenge
//! before it. Field lines joined with ", " thus split where they were
//! joined. Lenient where servers are sloppy and nothing is ambiguous: empty
//! list elements, any run of SP or HTAB where one space or none is due.
//! Refused: a scheme or parameter that is not a token, an unterminated
//! quoted string, a control byte (or a byte past ASCII outside a quoted
//! string), a parameter named twice in one challenge (RFC 9110 §11.2: which
//! one a client reads is not ours to guess), a parameter after a token68,
//! and values over `MAX_CHALLENGE_LEN`. An error carries a byte offset and
//! fixed text, never a byte of the value.

use std::fmt;

use crate::http::headers::is_tchar;

/// Longest field value read. A real challenge list is a few hundred bytes
/// (a realm, a scope, a metadata URL); past this it is not worth reading.
pub const MAX_CHALLENGE_LEN: usize = 8 * 1024;

/// One challenge: a scheme and either a token68 or parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Challenge {
    /// As written; compare it with `is`.
    pub scheme: String,
    pub token68: Option<String>,
    /// In order, each name lowercased (names are case-insensitive, RFC
    /// 9110 §11.2), each value a token or a quoted string's content with
    /// its quoted-pairs undone. No name occurs twice.
    pub params: Vec<(String, String)>,
}

impl Challenge {
    /// Whether this challenge's scheme is `scheme` (case-insensitive,
    /// RFC 9110 §11.1).
    pub fn is(&self, scheme: &str) -> bool {
        self.scheme.eq_ignore_ascii_case(scheme)
    }

    /// The value of the parameter `name` (case-insensitive).
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// Why a field value is not a list of challenges, and at which byte of
/// it. Copy and free of the value's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChallengeError {
    /// The value is longer than `MAX_CHALLENGE_LEN`.
    TooLong { len: usize },
    /// A control byte, DEL, or (outside a quoted string) a byte past ASCII.
    Byte { offset: usize },
    /// A list element that does not open with a token.
    Scheme { offset: usize },
    /// The auth-scheme is followed by neither a space nor a comma.
    AfterScheme { offset: usize },
    /// After the scheme's space: neither a token68 nor an auth-param.
    Body { offset: usize },
    /// An auth-param's name is not followed by `=`.
    Equals { offset: usize },
    /// An auth-param's `=` is followed by neither a token nor a quoted
    /// string.
    ParamValue { offset: usize },
    /// A quoted string opened here is never closed.
    Unterminated { offset: usize },
    /// A quoted string opened here holds bytes that are not UTF-8.
    NotUtf8 { offset: usize },
    /// An auth-param with no challenge to belong to: first in the list, or
    /// after a token68.
    StrayParam { offset: usize },
    /// An auth-param whose name the challenge already has.
    DuplicateParam { offset: usize },
    /// A complete element is followed by something other than a comma.
    Comma { offset: usize },
}

impl fmt::Display for ChallengeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChallengeError::TooLong { len } => write!(
                f,
                "the WWW-Authenticate value is {len} bytes long, over the limit of {MAX_CHALLENGE_LEN}"
            ),
            ChallengeError::Byte { offset } => write!(
                f,
                "WWW-Authenticate has a control character or a non-ASCII byte outside a quoted string \
                 at byte {offset}"
            ),
            ChallengeError::Scheme { offset } => {
                write!(f, "WWW-Authenticate has no auth-scheme token at byte {offset}")
            }
            ChallengeError::AfterScheme { offset } => {
                write!(f, "WWW-Authenticate's auth-scheme is followed by neither a space nor a comma at byte {offset}")
            }
            ChallengeError::Body { offset } => {
                write!(f, "WWW-Authenticate has neither a token68 nor an auth-param at byte {offset}")
            }
            ChallengeError::Equals { offset } => {
                write!(f, "WWW-Authenticate's auth-param has no '=' at byte {offset}")
            }
            ChallengeError::ParamValue { offset } => write!(
                f,
                "WWW-Authenticate's auth-param value is neither a token nor a quoted string at byte {offset}"
            ),
            ChallengeError::Unterminated { offset } => {
                write!(f, "WWW-Authenticate's quoted string opened at byte {offset} is not closed")
            }
            ChallengeError::NotUtf8 { offset } => {
                write!(f, "WWW-Authenticate's quoted string opened at byte {offset} is not UTF-8")
            }
            ChallengeError::StrayParam { offset } => write!(
                f,
                "WWW-Authenticate has an auth-param with no challenge to belong to (first, or after a \
                 token68) at byte {offset}"
            ),
            ChallengeError::DuplicateParam { offset } => {
                write!(f, "WWW-Authenticate names an auth-param twice in one challenge at byte {offset}")
            }
            ChallengeError::Comma { offset } => {
                write!(
                    f,
                    "WWW-Authenticate has something other than ',' after a list element at byte {offset}"
                )
            }
        }
    }
}

impl std::error::Error for ChallengeError {}

/// Reads a whole `WWW-Authenticate` value (several field lines already
/// joined with ", ", or not). An empty list is not an error here: whether
/// a 401 without a challenge is usable is the caller's to say.
pub fn parse(value: &[u8]) -> Result<Vec<Challenge>, ChallengeError> {
    if value.len() > MAX_CHALLENGE_LEN {
        return Err(ChallengeError::TooLong { len: value.len() });
    }
    let mut p = Parser { b: value, pos: 0 };
    let mut out: Vec<Challenge> = Vec::new();
    // Whether the last challenge takes more parameters (it has no token68).
    let mut open = false;
    loop {
        p.ows();
        match p.peek() {
            None => return Ok(out),
            // An empty list element (RFC 9110 §5.6.1).
            Some(b',') => {
                p.pos += 1;
                continue;
            }
            Some(_) => {}
        }
        let start = p.pos;
        let name = p.token().ok_or_else(|| p.unexpected(ChallengeError::Scheme { offset: start }))?;
        let after_name = p.pos;
        p.ows();
        if p.peek() == Some(b'=') {
            // `token BWS "="`: one more parameter of the challenge before.
            let last = out.last_mut().filter(|_| open).ok_or(ChallengeError::StrayParam { offset: start })?;
            p.pos = after_name;
            p.param(name, start, &mut last.params)?;
        } else {
            let mut c = Challenge { scheme: name.to_string(), token68: None, params: Vec::new() };
            open = true;
            // A body, unless the element ends here.
            if p.peek().is_some_and(|b| b != b',') {
                if p.pos == after_name {
                    return Err(p.unexpected(ChallengeError::AfterScheme { offset: p.pos }));
                }
                if let Some(t) = p.token68() {
                    c.token68 = Some(t.to_string());
                    open = false;
                } else {
                    let at = p.pos;
                    let name = p.token().ok_or_else(|| p.unexpected(ChallengeError::Body { offset: at }))?;
                    p.param(name, at, &mut c.params)?;
                }
            }
            out.push(c);
        }
        p.ows();
        if p.peek().is_some_and(|b| b != b',') {
            return Err(p.unexpected(ChallengeError::Comma { offset: p.pos }));
        }
    }
}

/// A cursor over the value.
struct Parser<'b> {
    b: &'b [u8],
    pos: usize,
}

/// Visible ASCII, SP or HTAB: every byte a value may hold outside a
/// quoted string (RFC 9110 §5.5 and §5.6.2).
fn visible_or_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | 0x21..=0x7e)
}

fn is_token68_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'+' | b'/')
}

impl<'b> Parser<'b> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.pos).copied()
    }

    /// OWS and BWS: any run of SP and HTAB.
    fn ows(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.pos += 1;
        }
    }

    /// `err`, unless the byte at the cursor is one no value may hold
    /// there, which is the better message.
    fn unexpected(&self, err: ChallengeError) -> ChallengeError {
        match self.peek() {
            Some(b) if !visible_or_ws(b) => ChallengeError::Byte { offset: self.pos },
            _ => err,
        }
    }

    /// `1*tchar` at the cursor, or `None` (the cursor unmoved).
    fn token(&mut self) -> Option<&'b str> {
        let start = self.pos;
        while self.peek().is_some_and(is_tchar) {
            self.pos += 1;
        }
        // tchars are ASCII, so the slice is UTF-8.
        self.b.get(start..self.pos).filter(|t| !t.is_empty()).and_then(|t| std::str::from_utf8(t).ok())
    }

    /// A token68 at the cursor when it is the whole challenge body (only
    /// OWS between it and a comma or the end), or `None` with the cursor
    /// unmoved: `realm="x"` starts like a token68 but goes on.
    fn token68(&mut self) -> Option<&'b str> {
        let start = self.pos;
        let mut end = start;
        while self.b.get(end).copied().is_some_and(is_token68_char) {
            end += 1;
        }
        if end == start {
            return None;
        }
        while self.b.get(end) == Some(&b'=') {
            end += 1;
        }
        let mut next = end;
        while matches!(self.b.get(next), Some(b' ' | b'\t')) {
            next += 1;
        }
        if !matches!(self.b.get(next), None | Some(b',')) {
            return None;
        }
        self.pos = end;
        // token68 characters are ASCII.
        self.b.get(start..end).and_then(|t| std::str::from_utf8(t).ok())
    }

    /// The rest of an auth-param whose name was just read (starting at
    /// `start`): BWS `=` BWS and a token or quoted string, added to
    /// `params` under the lowercased name.
    fn param(
        &mut self,
        name: &str,
        start: usize,
        params: &mut Vec<(String, String)>,
    ) -> Result<(), ChallengeError> {
        self.ows();
        if self.peek() != Some(b'=') {
            return Err(self.unexpected(ChallengeError::Equals { offset: self.pos }));
        }
        self.pos += 1;
        self.ows();
        let value = if self.peek() == Some(b'"') {
            self.quoted()?
        } else {
            let at = self.pos;
            self.token()
                .ok_or_else(|| self.unexpected(ChallengeError::ParamValue { offset: at }))?
                .to_string()
        };
        let name = name.to_ascii_lowercase();
        if params.iter().any(|(n, _)| *n == name) {
            return Err(ChallengeError::DuplicateParam { offset: start });
        }
        params.push((name, value));
        Ok(())
    }

    /// A quoted-string at the cursor (RFC 9110 §5.6.4), its quoted-pairs
    /// undone. obs-text is kept, and the content must be UTF-8.
    fn quoted(&mut self) -> Result<String, ChallengeError> {
        let open = self.pos;
        self.pos += 1;
        let mut out = Vec::new();
        loop {
            let b = self.peek().ok_or(ChallengeError::Unterminated { offset: open })?;
            let b = match b {
                b'"' => break,
                b'\\' => {
                    self.pos += 1;
                    self.peek().ok_or(ChallengeError::Unterminated { offset: open })?
                }
                b => b,
            };
            // qdtext and a quoted-pair's second byte: HTAB, SP, VCHAR,
            // obs-text; never a control or DEL.
            if !(visible_or_ws(b) || b >= 0x80) {
                return Err(ChallengeError::Byte { offset: self.pos });
            }
            out.push(b);
            self.pos += 1;
        }
        self.pos += 1;
        String::from_utf8(out).map_err(|_| ChallengeError::NotUtf8 { offset: open })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ch(scheme: &str, token68: Option<&str>, params: &[(&str, &str)]) -> Challenge {
        Challenge {
            scheme: scheme.to_string(),
            token68: token68.map(str::to_string),
            params: params.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect(),
        }
    }

    const PRM: &str = "https://mcp.example.com/.well-known/oauth-protected-resource";

    #[test]
    fn values_that_parse() {
        let cases: Vec<(&str, Vec<Challenge>)> = vec![
            // The MCP authorization specification's examples.
            (
                r#"Bearer resource_metadata="https://mcp.example.com/.well-known/oauth-protected-resource", scope="files:read""#,
                vec![ch("Bearer", None, &[("resource_metadata", PRM), ("scope", "files:read")])],
            ),
            (
                r#"Bearer error="insufficient_scope", scope="files:read files:write", resource_metadata="https://mcp.example.com/.well-known/oauth-protected-resource""#,
                vec![ch(
                    "Bearer",
                    None,
                    &[
                        ("error", "insufficient_scope"),
                        ("scope", "files:read files:write"),
                        ("resource_metadata", PRM),
                    ],
                )],
            ),
            (
                r#"DPoP error="use_dpop_nonce", resource_metadata="https://mcp.example.com/.well-known/oauth-protected-resource""#,
                vec![ch("DPoP", None, &[("error", "use_dpop_nonce"), ("resource_metadata", PRM)])],
            ),
            // Field lines joined with ", ": each challenge where it began.
            (
                r#"Bearer realm="a, b", error="invalid_token", DPoP algs="ES256", Basic"#,
                vec![
                    ch("Bearer", None, &[("realm", "a, b"), ("error", "invalid_token")]),
                    ch("DPoP", None, &[("algs", "ES256")]),
                    ch("Basic", None, &[]),
                ],
            ),
            // RFC 9110 §11.6.1's example.
            (
                r#"Newauth realm="apps", type=1, title="Login to \"apps\"", Basic realm="simple""#,
                vec![
                    ch("Newauth", None, &[("realm", "apps"), ("type", "1"), ("title", r#"Login to "apps""#)]),
                    ch("Basic", None, &[("realm", "simple")]),
                ],
            ),
            // RFC 6750 §3's examples.
            (r#"Bearer realm="example""#, vec![ch("Bearer", None, &[("realm", "example")])]),
            (
                r#"Bearer realm="example", error="invalid_token", error_description="The access token expired""#,
                vec![ch(
                    "Bearer",
                    None,
                    &[
                        ("realm", "example"),
                        ("error", "invalid_token"),
                        ("error_description", "The access token expired"),
                    ],
                )],
            ),
            // RFC 9449 §7.1's example.
            (
                r#"DPoP error="invalid_token", error_description="Invalid DPoP key binding", algs="ES256""#,
                vec![ch(
                    "DPoP",
                    None,
                    &[
                        ("error", "invalid_token"),
                        ("error_description", "Invalid DPoP key binding"),
                        ("algs", "ES256"),
                    ],
                )],
            ),
            // Schemes alone, and token68s.
            ("Bearer", vec![ch("Bearer", None, &[])]),
            ("bearer", vec![ch("bearer", None, &[])]),
            ("Basic, Bearer", vec![ch("Basic", None, &[]), ch("Bearer", None, &[])]),
            (
                "Negotiate YIIBhgYGKwYBBQUCoIIBejCCAXag",
                vec![ch("Negotiate", Some("YIIBhgYGKwYBBQUCoIIBejCCAXag"), &[])],
            ),
            ("Basic dXNlcjpwYXNz==", vec![ch("Basic", Some("dXNlcjpwYXNz=="), &[])]),
            ("X a-._~+/Z9=", vec![ch("X", Some("a-._~+/Z9="), &[])]),
            ("X abc=, Bearer", vec![ch("X", Some("abc="), &[]), ch("Bearer", None, &[])]),
            ("X abc , Y", vec![ch("X", Some("abc"), &[]), ch("Y", None, &[])]),
            // What looks like a parameter but is a token68: the grammar's
            // reading, since nothing follows.
            ("Bearer realm", vec![ch("Bearer", Some("realm"), &[])]),
            ("Bearer realm=", vec![ch("Bearer", Some("realm="), &[])]),
            ("Bearer realm= , X", vec![ch("Bearer", Some("realm="), &[]), ch("X", None, &[])]),
            // BWS on both sides of '=' (RFC 9110 §11.2).
            ("Basic abc= def", vec![ch("Basic", None, &[("abc", "def")])]),
            ("Bearer ,", vec![ch("Bearer", None, &[])]),
            ("X a/b, Y k=v", vec![ch("X", Some("a/b"), &[]), ch("Y", None, &[("k", "v")])]),
            // A scheme of any tchars.
            ("!#$%&'*+-.^_`|~09aZ", vec![ch("!#$%&'*+-.^_`|~09aZ", None, &[])]),
            // Parameter names lowercased; tokens and empty quoted strings
            // as values; BWS around '='.
            (r#"Bearer Realm="x", SCOPE=a"#, vec![ch("Bearer", None, &[("realm", "x"), ("scope", "a")])]),
            (r#"Bearer realm="""#, vec![ch("Bearer", None, &[("realm", "")])]),
            (
                r#"Bearer realm = "x" , scope	=	y"#,
                vec![ch("Bearer", None, &[("realm", "x"), ("scope", "y")])],
            ),
            // quoted-pairs undone; a backslash before any byte.
            (r#"B p="a\\b\"c\d""#, vec![ch("B", None, &[("p", r#"a\b"cd"#)])]),
            (r#"B p="\,\ \	""#, vec![ch("B", None, &[("p", ", \t")])]),
            // obs-text that is UTF-8, in a quoted string.
            ("B realm=\"caf\u{e9}\"", vec![ch("B", None, &[("realm", "caf\u{e9}")])]),
            // Commas and '=' inside quotes are content.
            (
                r#"B p=",,=,", q="a\"", r"#,
                vec![ch("B", None, &[("p", ",,=,"), ("q", "a\"")]), ch("r", None, &[])],
            ),
            // Sloppy but unambiguous: empty elements, extra whitespace,
            // a parameter after the scheme's comma.
            ("", vec![]),
            ("  ,, ,\t", vec![]),
            (
                " , Bearer   realm=\"a\" ,, ,error=x ,\tBasic\t, ",
                vec![ch("Bearer", None, &[("realm", "a"), ("error", "x")]), ch("Basic", None, &[])],
            ),
            ("Bearer\trealm=a", vec![ch("Bearer", None, &[("realm", "a")])]),
            ("Basic, realm=\"x\"", vec![ch("Basic", None, &[("realm", "x")])]),
            ("Basic ,realm=\"x\"", vec![ch("Basic", None, &[("realm", "x")])]),
            // The same parameter in two challenges is two parameters.
            ("A p=1, B p=2", vec![ch("A", None, &[("p", "1")]), ch("B", None, &[("p", "2")])]),
        ];
        for (value, want) in &cases {
            assert_eq!(parse(value.as_bytes()).as_ref(), Ok(want), "{value}");
        }
    }

    #[test]
    fn values_that_are_refused_say_where() {
        use ChallengeError::*;
        let long = format!("Bearer realm=\"{}\"", "a".repeat(MAX_CHALLENGE_LEN));
        let cases: &[(&[u8], ChallengeError)] = &[
            (long.as_bytes(), TooLong { len: long.len() }),
            // Not a token where a scheme must be.
            (b"\"Bearer\"", Scheme { offset: 0 }),
            (b"Bearer, (x)", Scheme { offset: 8 }),
            (b"=x", Scheme { offset: 0 }),
            (b"/a", Scheme { offset: 0 }),
            (b"Bearer realm=\"x\", @", Scheme { offset: 18 }),
            (b"Bear\xc3\xa9r", Byte { offset: 4 }),
            (b"\x00Bearer", Byte { offset: 0 }),
            (b"Bearer\r\n realm=x", Byte { offset: 6 }),
            (b"Bearer realm=x\x7f", Byte { offset: 14 }),
            (b"Bearer realm=\xff", Byte { offset: 13 }),
            // A scheme glued to what follows.
            (b"Bearer\"x\"", AfterScheme { offset: 6 }),
            (b"Bearer/x", AfterScheme { offset: 6 }),
            // Neither token68 nor auth-param.
            (b"Bearer \"x\"", Body { offset: 7 }),
            (b"Bearer (x)", Body { offset: 7 }),
            // Parameter grammar.
            (b"Bearer =x", StrayParam { offset: 0 }),
            (b"Bearer realm x", Equals { offset: 13 }),
            (b"Bearer a=b=", Comma { offset: 10 }),
            (b"Bearer realm=(", ParamValue { offset: 13 }),
            (b"Bearer a=1, realm=", ParamValue { offset: 18 }),
            (b"Bearer a=1, realm= ,", ParamValue { offset: 19 }),
            (b"Bearer realm=a/b", Comma { offset: 14 }),
            (b"Bearer realm=https://x", Comma { offset: 18 }),
            (b"Bearer realm=x error=y", Comma { offset: 15 }),
            (b"Bearer realm=\"x\"y", Comma { offset: 16 }),
            (b"Bearer realm=\"x\" \"y\"", Comma { offset: 17 }),
            // Quoted strings.
            (b"Bearer realm=\"abc", Unterminated { offset: 13 }),
            (b"Bearer realm=\"abc\\\"", Unterminated { offset: 13 }),
            (b"Bearer realm=\"abc\\", Unterminated { offset: 13 }),
            (b"Bearer realm=\"", Unterminated { offset: 13 }),
            (b"Bearer realm=\"a\nb\"", Byte { offset: 15 }),
            (b"Bearer realm=\"a\\\x00\"", Byte { offset: 16 }),
            (b"Bearer realm=\"a\x7f\"", Byte { offset: 15 }),
            (b"Bearer realm=\"\xff\"", NotUtf8 { offset: 13 }),
            // Parameters with nothing to belong to.
            (b"realm=\"x\"", StrayParam { offset: 0 }),
            (b", realm=x, Bearer", StrayParam { offset: 2 }),
            (b"Negotiate abc, realm=\"x\"", StrayParam { offset: 15 }),
            // Twice in one challenge, whatever the case.
            (b"Bearer scope=a, scope=b", DuplicateParam { offset: 16 }),
            (b"Bearer scope=a, Scope=\"a\"", DuplicateParam { offset: 16 }),
            (b"Bearer SCOPE=a,, scope=a", DuplicateParam { offset: 17 }),
            (b"Bearer, scope=a, scope=a", DuplicateParam { offset: 17 }),
        ];
        for (value, want) in cases {
            assert_eq!(parse(value), Err(*want), "{:?}", String::from_utf8_lossy(value));
        }
        // At the cap, read.
        let at_cap = format!("B r=\"{}\"", "a".repeat(MAX_CHALLENGE_LEN - 6));
        assert_eq!(at_cap.len(), MAX_CHALLENGE_LEN);
        assert_eq!(parse(at_cap.as_bytes()).map(|c| c.len()), Ok(1));
    }

    #[test]
    fn scheme_and_param_lookups_ignore_case() {
        let c = parse(br#"DPoP Error="use_dpop_nonce", ALGS="ES256 RS256""#).unwrap();
        let c = c.first().unwrap();
        let cases: &[(&str, bool)] =
            &[("DPoP", true), ("dpop", true), ("DPOP", true), ("Bearer", false), ("", false)];
        for (scheme, want) in cases {
            assert_eq!(c.is(scheme), *want, "{scheme}");
        }
        let params: &[(&str, Option<&str>)] = &[
            ("error", Some("use_dpop_nonce")),
            ("ERROR", Some("use_dpop_nonce")),
            ("algs", Some("ES256 RS256")),
            ("realm", None),
            ("", None),
        ];
        for (name, want) in params {
            assert_eq!(c.param(name), *want, "{name}");
        }
    }

    #[test]
    fn every_prefix_parses_or_errors() {
        // Each prefix of a valid value either parses or says where it is
        // wrong (never past its own end), and never panics.
        let values = [
            r#"Bearer realm="a, b", error="invalid_token", DPoP algs="ES256", Basic"#,
            r#"Newauth realm="apps", type=1, title="Login to \"apps\"", Basic realm="simple""#,
            r#"Bearer error="insufficient_scope", scope="files:read files:write", resource_metadata="https://mcp.example.com/.well-known/oauth-protected-resource""#,
            " , Negotiate abc==,\tX a = \"\\\"\" ,, Y",
        ];
        for value in values {
            let b = value.as_bytes();
            assert!(parse(b).is_ok(), "{value}");
            for i in 0..=b.len() {
                match parse(&b[..i]) {
                    Ok(cs) => assert!(cs.iter().all(|c| !c.scheme.is_empty()), "{value} [..{i}]"),
                    Err(e) => {
                        let offset = match e {
                            ChallengeError::TooLong { .. } => unreachable!("short"),
                            ChallengeError::Byte { offset }
                            | ChallengeError::Scheme { offset }
                            | ChallengeError::AfterScheme { offset }
                            | ChallengeError::Body { offset }
                            | ChallengeError::Equals { offset }
                            | ChallengeError::ParamValue { offset }
                            | ChallengeError::Unterminated { offset }
                            | ChallengeError::NotUtf8 { offset }
                            | ChallengeError::StrayParam { offset }
                            | ChallengeError::DuplicateParam { offset }
                            | ChallengeError::Comma { offset } => offset,
                        };
                        assert!(offset <= i, "{value} [..{i}]: {e}");
                    }
                }
            }
        }
    }

    #[test]
    fn mutations_never_panic_and_names_stay_lowercase() {
        use crate::test_rng::Rng;
        let seed = br#"Bearer realm="a, b", error="invalid_token", DPoP algs="ES256", Basic dXNlcg==, X k=v"#;
        let mut r = Rng(0x57_A11E);
        for _ in 0..5_000 {
            let mut m = seed.to_vec();
            for _ in 0..=r.below(3) {
                let at = r.below(m.len());
                m[at] = r.pick(b" \t,=\"\\aZ0/+~(\x00\xff\xc3");
            }
            if let Ok(cs) = parse(&m) {
                for c in &cs {
                    assert!(!c.scheme.is_empty() && c.scheme.bytes().all(is_tchar));
                    assert!(c.token68.is_none() || c.params.is_empty());
                    for (n, _) in &c.params {
                        assert!(!n.is_empty() && n.bytes().all(|b| is_tchar(b) && !b.is_ascii_uppercase()));
                    }
                }
            }
        }
    }

    #[test]
    fn errors_carry_no_value() {
        let values: &[&[u8]] = &[
            b"SECRETSCHEME\"",
            b"Bearer SECRETTOKEN \"x\"",
            b"Bearer realm=\"SECRETVALUE",
            b"Bearer SECRETNAME=\"a\", SECRETNAME=b",
            b"SECRETNAME=x",
            b"Bearer realm=SECRETVALUE x",
            b"Bearer realm=\"SECRET\xff\"",
        ];
        for value in values {
            let e = parse(value).unwrap_err();
            let shown = format!("{e} {e:?}");
            assert!(!shown.contains("SECRET"), "{shown}");
        }
        let messages = [
            (
                ChallengeError::TooLong { len: 9000 },
                "the WWW-Authenticate value is 9000 bytes long, over the limit of 8192",
            ),
            (
                ChallengeError::Unterminated { offset: 13 },
                "WWW-Authenticate's quoted string opened at byte 13 is not closed",
            ),
            (ChallengeError::Scheme { offset: 0 }, "WWW-Authenticate has no auth-scheme token at byte 0"),
        ];
        for (e, want) in messages {
            assert_eq!(e.to_string(), want);
        }
    }
}

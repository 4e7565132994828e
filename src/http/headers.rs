//! `HeaderList`: the one place field lines live between parsing and writing.
//!
//! Names are ASCII-lowercased by the only constructor, `set` replaces in
//! place and there is no `append`, so two lines with one name can never be
//! written: the agentchattr proxy's duplicated `Mcp-Session-Id` cannot happen.
//! Pure: no I/O.

use smallvec::SmallVec;
use std::fmt;

/// Field name, lowercased. 24 bytes inline covers every MCP field name.
pub type Name = SmallVec<[u8; 24]>;
/// Field value. 64 bytes inline covers session ids, tokens and accept lists.
pub type Value = SmallVec<[u8; 64]>;

/// One field line.
#[derive(Clone, PartialEq, Eq)]
pub struct Header {
    name: Name,
    value: Value,
}

impl Header {
    pub fn name(&self) -> &[u8] {
        &self.name
    }
    pub fn value(&self) -> &[u8] {
        &self.value
    }
}

/// Why a field line could not enter the list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldError {
    /// The name is empty or not an RFC 9110 token.
    InvalidName,
    /// The value holds CR, LF, NUL or another control character (RFC 9110 §5.5).
    InvalidValue,
    /// A singleton field was repeated with a different value (RFC 9110 §5.3).
    ConflictingSingleton,
    /// The list already holds `MAX_FIELDS` names.
    TooMany,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FieldError::InvalidName => "invalid field name",
            FieldError::InvalidValue => "invalid field value",
            FieldError::ConflictingSingleton => "conflicting values of a singleton field",
            FieldError::TooMany => "too many fields",
        })
    }
}

/// Fields whose repeated lines with different values are an error instead of
/// a comma-joined list: their grammar is not a `#list` (RFC 9110 §5.3), and a
/// joined value (`abc, abc`) is exactly the bug this proxy exists to end.
const SINGLETONS: &[&[u8]] = &[
    b"authorization",
    b"content-length",
    b"content-type",
    b"date",
    b"etag",
    b"host",
    b"last-event-id",
    b"last-modified",
    b"location",
    b"mcp-method",
    b"mcp-name",
    b"mcp-protocol-version",
    b"mcp-session-id",
    b"origin",
    b"retry-after",
    b"x-agent-token",
    b"x-accel-buffering",
];

/// Hop-by-hop fields (RFC 9110 §7.6.1, plus the proxy-auth pair and
/// `trailer`, as Go's ReverseProxy and agentgateway do). Framing fields among
/// them are re-derived from `Framing` when a head is written.
pub const HOP_BY_HOP: &[&[u8]] = &[
    b"connection",
    b"keep-alive",
    b"proxy-authenticate",
    b"proxy-authorization",
    b"proxy-connection",
    b"te",
    b"trailer",
    b"transfer-encoding",
    b"upgrade",
];

pub fn is_singleton(name: &[u8]) -> bool {
    SINGLETONS.contains(&name) || name.starts_with(b"mcp-param-")
}

/// RFC 9110 §5.6.2 `tchar`.
pub fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// A field value as RFC 9110 §5.5 allows it: visible ASCII, SP, HTAB and
/// obs-text; no CR, LF, NUL or other controls; no leading or trailing
/// whitespace (the parser has already trimmed it).
pub fn valid_value(v: &[u8]) -> bool {
    let ok_byte = |b: &u8| *b == b'\t' || (*b >= 0x20 && *b != 0x7f);
    let trimmed = !matches!(v.first(), Some(b' ' | b'\t')) && !matches!(v.last(), Some(b' ' | b'\t'));
    trimmed && v.iter().all(ok_byte)
}

fn valid_name(n: &[u8]) -> bool {
    !n.is_empty() && n.iter().all(|b| is_tchar(*b))
}

/// Field lines keyed by lowercased name, at most one entry per name.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct HeaderList {
    items: SmallVec<[Header; 12]>,
}

impl fmt::Debug for HeaderList {
    /// Names only: values may hold credentials.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.items.iter().map(|h| String::from_utf8_lossy(&h.name))).finish()
    }
}

fn lowercase(name: &[u8]) -> Name {
    name.iter().map(u8::to_ascii_lowercase).collect()
}

impl HeaderList {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Header> {
        self.items.iter()
    }

    fn position(&self, lower: &[u8]) -> Option<usize> {
        self.items.iter().position(|h| h.name.as_slice() == lower)
    }

    /// Take in one received field line (any case). Identical repeats
    /// collapse; different values of a list field are joined with `, ` in
    /// arrival order (RFC 9110 §5.3); different values of a singleton are an
    /// error. `set-cookie` cannot be folded: the last value is kept.
    pub fn merge_line(&mut self, name: &[u8], value: &[u8]) -> Result<(), FieldError> {
        if !valid_name(name) {
            return Err(FieldError::InvalidName);
        }
        if !valid_value(value) {
            return Err(FieldError::InvalidValue);
        }
        let lower = lowercase(name);
        let Some(i) = self.position(&lower) else {
            if self.items.len() >= crate::limits::MAX_FIELDS {
                return Err(FieldError::TooMany);
            }
            self.items.push(Header { name: lower, value: Value::from_slice(value) });
            return Ok(());
        };
        let existing = &mut self.items[i].value;
        if existing.as_slice() == value {
            return Ok(());
        }
        if is_singleton(&lower) {
            return Err(FieldError::ConflictingSingleton);
        }
        if lower.as_slice() == b"set-cookie" {
            log::debug!("set-cookie repeated; keeping the last value");
            *existing = Value::from_slice(value);
            return Ok(());
        }
        if value.is_empty() {
            return Ok(());
        }
        if !existing.is_empty() {
            existing.extend_from_slice(b", ");
        }
        existing.extend_from_slice(value);
        Ok(())
    }

    /// Set `name` to `value`, replacing any existing entry in place. Used for
    /// values the proxy itself decides (credentials, Host), which are valid
    /// by construction; an invalid name or value is refused rather than
    /// written.
    pub fn set(&mut self, name: &[u8], value: &[u8]) -> Result<(), FieldError> {
        if !valid_name(name) {
            return Err(FieldError::InvalidName);
        }
        if !valid_value(value) {
            return Err(FieldError::InvalidValue);
        }
        let lower = lowercase(name);
        match self.position(&lower) {
            Some(i) => self.items[i].value = Value::from_slice(value),
            None => self.items.push(Header { name: lower, value: Value::from_slice(value) }),
        }
        Ok(())
    }

    /// The value of `name` (any case).
    pub fn get(&self, name: &[u8]) -> Option<&[u8]> {
        self.items.iter().find(|h| h.name.eq_ignore_ascii_case(name)).map(|h| h.value.as_slice())
    }

    /// Remove `name` (any case); returns whether it was present.
    pub fn remove(&mut self, name: &[u8]) -> bool {
        let before = self.items.len();
        self.items.retain(|h| !h.name.eq_ignore_ascii_case(name));
        self.items.len() != before
    }

    /// Remove every field whose (lowercase) name satisfies `pred`.
    pub fn remove_where(&mut self, mut pred: impl FnMut(&[u8]) -> bool) {
        self.items.retain(|h| !pred(&h.name));
    }

    /// Whether the comma-separated list in `name` has `token` as an element
    /// (ASCII case-insensitive), e.g. `connection: keep-alive, close`.
    pub fn has_token(&self, name: &[u8], token: &[u8]) -> bool {
        self.get(name).map(|v| list_elements(v).any(|e| e.eq_ignore_ascii_case(token))).unwrap_or(false)
    }

    /// Drop hop-by-hop fields: first every field named in `Connection`
    /// (RFC 9110 §7.6.1), then the fixed list.
    pub fn strip_hop_by_hop(&mut self) {
        if let Some(i) = self.position(b"connection") {
            let named = self.items.remove(i).value;
            for token in list_elements(&named) {
                self.remove(token);
            }
        }
        self.remove_where(|n| HOP_BY_HOP.contains(&n));
    }

    /// Append every field as `name: value\r\n`. Names are unique by
    /// construction, so this cannot emit a duplicate.
    pub fn write_to(&self, out: &mut Vec<u8>) {
        for h in &self.items {
            out.extend_from_slice(&h.name);
            out.extend_from_slice(b": ");
            out.extend_from_slice(&h.value);
            out.extend_from_slice(b"\r\n");
        }
    }
}

/// Elements of a comma-separated list value, trimmed, empty ones skipped
/// (RFC 9110 §5.6.1).
pub fn list_elements(v: &[u8]) -> impl Iterator<Item = &[u8]> {
    v.split(|b| *b == b',').map(trim_ows).filter(|e| !e.is_empty())
}

/// Trim optional whitespace (SP / HTAB) on both sides.
pub fn trim_ows(mut v: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = v {
        v = rest;
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(lines: &[(&str, &str)]) -> Result<HeaderList, FieldError> {
        let mut l = HeaderList::new();
        for (n, v) in lines {
            l.merge_line(n.as_bytes(), v.as_bytes())?;
        }
        Ok(l)
    }

    fn written(l: &HeaderList) -> String {
        let mut out = Vec::new();
        l.write_to(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn session_id_in_any_case_is_one_line() {
        for lines in [
            &[("Mcp-Session-Id", "abc"), ("mcp-session-id", "abc")][..],
            &[("MCP-SESSION-ID", "abc")][..],
            &[("mcp-session-id", "abc"), ("MCP-Session-Id", "abc"), ("Mcp-Session-ID", "abc")][..],
        ] {
            let l = list(lines).unwrap();
            assert_eq!(written(&l), "mcp-session-id: abc\r\n");
        }
    }

    #[test]
    fn merge_table() {
        let cases: &[(&[(&str, &str)], Result<&str, FieldError>)] = &[
            (&[("Accept", "a"), ("accept", "b")], Ok("accept: a, b\r\n")),
            (&[("Accept", "a"), ("accept", "a")], Ok("accept: a\r\n")),
            (
                &[("Cache-Control", "no-cache"), ("X-A", "1"), ("cache-control", "no-transform")],
                Ok("cache-control: no-cache, no-transform\r\nx-a: 1\r\n"),
            ),
            (&[("Mcp-Session-Id", "a"), ("mcp-session-id", "b")], Err(FieldError::ConflictingSingleton)),
            (&[("Content-Length", "5"), ("content-length", "6")], Err(FieldError::ConflictingSingleton)),
            (
                &[("Authorization", "Bearer a"), ("authorization", "Bearer b")],
                Err(FieldError::ConflictingSingleton),
            ),
            (&[("Mcp-Param-Sender", "a"), ("mcp-param-sender", "b")], Err(FieldError::ConflictingSingleton)),
            (&[("Set-Cookie", "a=1"), ("set-cookie", "b=2")], Ok("set-cookie: b=2\r\n")),
            (&[("Bad Name", "x")], Err(FieldError::InvalidName)),
            (&[("", "x")], Err(FieldError::InvalidName)),
            (&[("x-a", "a\rb")], Err(FieldError::InvalidValue)),
            (&[("x-a", "a\0b")], Err(FieldError::InvalidValue)),
            (&[("x-a", "a\nb")], Err(FieldError::InvalidValue)),
            (&[("x-a", "")], Ok("x-a: \r\n")),
            (&[("x-a", "v"), ("x-a", "")], Ok("x-a: v\r\n")),
        ];
        for (lines, want) in cases {
            let got = list(lines).map(|l| written(&l));
            assert_eq!(got.as_deref().map_err(|e| *e), *want, "{lines:?}");
        }
    }

    #[test]
    fn set_replaces_and_never_duplicates() {
        let mut l = list(&[("Authorization", "Bearer client"), ("X-Agent-Token", "x")]).unwrap();
        l.set(b"authorization", b"Bearer tok").unwrap();
        l.set(b"X-Agent-Token", b"tok").unwrap();
        assert_eq!(written(&l), "authorization: Bearer tok\r\nx-agent-token: tok\r\n");
        assert_eq!(l.set(b"x-a", b"a\r\nb"), Err(FieldError::InvalidValue));
    }

    #[test]
    fn hop_by_hop_and_connection_named_fields_are_stripped() {
        let mut l = list(&[
            ("Connection", "keep-alive, X-Secret"),
            ("X-Secret", "1"),
            ("Keep-Alive", "timeout=5"),
            ("Transfer-Encoding", "chunked"),
            ("Upgrade", "h2c"),
            ("TE", "trailers"),
            ("Proxy-Authorization", "Basic x"),
            ("Accept", "*/*"),
        ])
        .unwrap();
        l.strip_hop_by_hop();
        assert_eq!(written(&l), "accept: */*\r\n");
    }

    #[test]
    fn too_many_fields() {
        let mut l = HeaderList::new();
        for i in 0..crate::limits::MAX_FIELDS {
            l.merge_line(format!("x-{i}").as_bytes(), b"v").unwrap();
        }
        assert_eq!(l.merge_line(b"x-last", b"v"), Err(FieldError::TooMany));
        // Repeats of an existing name still merge.
        assert_eq!(l.merge_line(b"X-0", b"w"), Ok(()));
    }

    #[test]
    fn tokens_and_trim() {
        let l = list(&[("Connection", "Keep-Alive ,, close")]).unwrap();
        assert!(l.has_token(b"connection", b"close"));
        assert!(l.has_token(b"Connection", b"keep-alive"));
        assert!(!l.has_token(b"connection", b"upgrade"));
        assert_eq!(trim_ows(b" \t a b \t"), b"a b");
    }
}

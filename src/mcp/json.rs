//! JSON spans over a whole body, read with `lex::Cursor` (the grammar's
//! whole-slice path): the byte spans of `method`, `params`, `params.name`,
//! `params.arguments` and of one key inside `arguments`, for one JSON-RPC
//! message or each element of a batch, without building a tree; walkers over
//! a value already scanned; string decoding and writing. Pure: no I/O, no
//! allocation.
//!
//! The grammar accepts exactly what the upstream acts on (Python's
//! `json.loads` on UTF-8 bytes), so that no body is read one way here and
//! another way there: keys and strings are compared after decoding escapes
//! (`"\u0073ender"` is `sender`), the literals `NaN`, `Infinity`, `-Infinity`
//! and numbers of any length are values, lone `\uD800` escapes are accepted.
//! Refused: invalid UTF-8 (also a BOM, UTF-16 and UTF-32, which Python would
//! sniff and decode: refusing is the safe side), control characters in
//! strings, bad escapes, trailing bytes, and nesting deeper than
//! `MAX_JSON_DEPTH`.

use std::fmt;

use super::lex::{find_special, Cursor};
use crate::limits::MAX_JSON_DEPTH;

/// Why a body is not JSON the stamper can act on. `offset` is the byte where
/// the scanner stopped; nothing of the body's content is carried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScanError {
    /// Not RFC 8259 JSON (plus the Python literals).
    Syntax { offset: usize },
    /// Not UTF-8.
    InvalidUtf8 { offset: usize },
    /// An array or object nested deeper than `MAX_JSON_DEPTH`.
    TooDeep { offset: usize },
}

impl fmt::Display for ScanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScanError::Syntax { offset } => write!(f, "invalid JSON at byte {offset}"),
            ScanError::InvalidUtf8 { offset } => write!(f, "invalid UTF-8 at byte {offset}"),
            ScanError::TooDeep { offset } => {
                write!(f, "JSON nested deeper than {MAX_JSON_DEPTH} at byte {offset}")
            }
        }
    }
}

/// What kind of value a span holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Object {
        empty: bool,
    },
    Array,
    /// `escaped`: the raw string contains a backslash, so comparing it needs
    /// decoding.
    String {
        escaped: bool,
    },
    /// Also `NaN`, `Infinity` and `-Infinity` (Python's literals).
    Number,
    True,
    False,
    Null,
}

/// A value's bytes are `body[start..end]`, delimiters included.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Value {
    pub start: usize,
    pub end: usize,
    pub kind: Kind,
}

impl Value {
    /// The raw bytes of the value.
    pub fn bytes<'b>(&self, body: &'b [u8]) -> &'b [u8] {
        body.get(self.start..self.end).unwrap_or_default()
    }

    /// Whether this is a string whose decoded content equals `s`.
    pub fn is_str(&self, body: &[u8], s: &str) -> bool {
        match self.kind {
            Kind::String { escaped } => {
                self.string_raw(body).is_some_and(|raw| text_eq(raw, escaped, s.as_bytes()))
            }
            _ => false,
        }
    }

    /// The raw text between a string's quotes.
    fn string_raw<'b>(&self, body: &'b [u8]) -> Option<&'b [u8]> {
        body.get(self.start.checked_add(1)?..self.end.checked_sub(1)?)
    }

    /// `decode_str` without a copy when the string has no escapes.
    pub fn decode_cow<'b>(&self, body: &'b [u8]) -> Option<std::borrow::Cow<'b, str>> {
        match self.kind {
            Kind::String { escaped: false } => {
                std::str::from_utf8(self.string_raw(body)?).ok().map(std::borrow::Cow::Borrowed)
            }
            _ => self.decode_str(body).map(std::borrow::Cow::Owned),
        }
    }

    /// The decoded content of a string value; `None` for other kinds and for
    /// strings holding a lone surrogate (no Rust `String` can hold one).
    pub fn decode_str(&self, body: &[u8]) -> Option<String> {
        let Kind::String { escaped } = self.kind else {
            return None;
        };
        let raw = self.string_raw(body)?;
        if !escaped {
            return std::str::from_utf8(raw).ok().map(str::to_owned);
        }
        String::from_utf8(Unescape::new(raw).collect()).ok()
    }
}

/// The key of an object member: `body[start..end]` is the raw text between
/// the quotes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Key {
    pub start: usize,
    pub end: usize,
    pub escaped: bool,
}

impl Key {
    /// Whether the decoded key equals `s`.
    pub fn is(&self, body: &[u8], s: &str) -> bool {
        let raw = body.get(self.start..self.end).unwrap_or_default();
        text_eq(raw, self.escaped, s.as_bytes())
    }
}

/// Keys seen more than once in one message. Python keeps the last of
/// duplicate keys; which one a server reads is not ours to guess.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Duplicates {
    pub method: bool,
    pub params: bool,
    /// `name` in the first `params` object.
    pub name: bool,
    /// `arguments` in the first `params` object.
    pub arguments: bool,
}

/// The spans of one JSON-RPC message object (the first of each key), or
/// of a batch element that is not an object (`object` false, its members
/// all `None`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Message {
    /// The message object (or element) is `body[start..end]`.
    pub start: usize,
    pub end: usize,
    pub object: bool,
    pub method: Option<Value>,
    /// `id`: the last of equal keys, as the upstream reads it.
    pub id: Option<Value>,
    /// `result` and `error` of an answer, the last of equal keys (as `id`).
    pub result: Option<Value>,
    pub error: Option<Value>,
    /// `isError` and `protocolVersion` of that last `result` when it is an
    /// object (the last of each), found in the same pass.
    pub is_error: Option<Value>,
    pub protocol_version: Option<Value>,
    pub params: Option<Value>,
    /// `params.name`, when `params` is an object.
    pub name: Option<Value>,
    /// `params.arguments`, when `params` is an object.
    pub arguments: Option<Value>,
    /// The identity key looked up in `arguments` during the same pass: set
    /// when `name` came before an object `arguments` and the caller's
    /// `identity_key` named a key for it (else use `find_member`).
    pub identity: Option<Lookup>,
    pub duplicates: Duplicates,
}

/// Result of looking for one key among an object's members.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lookup {
    /// The value of the first member with that key.
    pub value: Option<Value>,
    /// The key occurs more than once.
    pub duplicate: bool,
}

/// Scans a whole body and calls `visit` for the message object at the top
/// or for each element of a top-level batch array, in order (an element
/// that is not an object with `object` false: JSON-RPC owes it an error,
/// and a batch rebuilt from the elements keeps it). The body
/// is fully validated: an error anywhere is returned, possibly after some
/// messages were visited. `identity_key` maps a `params.name` value to the
/// key to look up in `arguments` (see `Message::identity`).
pub fn scan_messages<'k, E: From<ScanError>>(
    body: &[u8],
    identity_key: impl Fn(&Value) -> Option<&'k str>,
    mut visit: impl FnMut(&Message) -> Result<(), E>,
) -> Result<(), E> {
    let mut cur = Cursor { b: body, pos: 0 };
    match cur.messages(&identity_key, &mut visit) {
        Ok(()) => Ok(()),
        Err(stop) => {
            // Whatever stopped the scan, a body that is not UTF-8 is
            // refused as such (see `check_utf8`).
            check_utf8(body)?;
            Err(match stop {
                Stop::Scan(e) => e.into(),
                Stop::Visit(e) => e,
            })
        }
    }
}

/// Why `Cursor::messages` stopped: the scanner's error, or the visitor's.
enum Stop<E> {
    Scan(ScanError),
    Visit(E),
}

impl<E> From<ScanError> for Stop<E> {
    fn from(e: ScanError) -> Self {
        Stop::Scan(e)
    }
}

/// JSON's whitespace (RFC 8259 §2): space, tab, LF and CR; not a form feed
/// (which `u8::is_ascii_whitespace` also takes). The one definition.
pub fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// The first byte of `body` past JSON whitespace.
pub fn first_byte(body: &[u8]) -> Option<u8> {
    body.iter().copied().find(|&b| !is_ws(b))
}

/// Whether `body` opens an array (a batch, or a batch's answer).
pub fn is_array(body: &[u8]) -> bool {
    first_byte(body) == Some(b'[')
}

/// Validates a whole body holding one JSON value and returns its span.
pub fn parse_value(body: &[u8]) -> Result<Value, ScanError> {
    let mut cur = Cursor { b: body, pos: 0 };
    let scanned = (|| {
        cur.ws();
        let v = cur.value(0)?;
        cur.end()?;
        Ok(v)
    })();
    scanned.map_err(|e| {
        // As in `scan_messages`.
        check_utf8(body).err().unwrap_or(e)
    })
}

/// Calls `f(key, value)` for each member of `object`, an object value this
/// module returned for `body`.
pub fn for_each_member<E: From<ScanError>>(
    body: &[u8],
    object: &Value,
    mut f: impl FnMut(Key, Value) -> Result<(), E>,
) -> Result<(), E> {
    let mut cur = Cursor { b: body, pos: object.start };
    // The object was validated where it sits; at depth 1 it stays within
    // the limit it met there.
    cur.object(1, |cur, key| {
        let v = cur.value(1)?;
        f(key, v)
    })?;
    Ok(())
}

/// Calls `f(element)` for each element of `array`, an array value this
/// module returned for `body`, in order.
pub fn for_each_element<E: From<ScanError>>(
    body: &[u8],
    array: &Value,
    mut f: impl FnMut(Value) -> Result<(), E>,
) -> Result<(), E> {
    let mut cur = Cursor { b: body, pos: array.start };
    cur.expect(b'[')?;
    cur.ws();
    if cur.peek() == Some(b']') {
        return Ok(());
    }
    loop {
        // Validated where it sits, as in `for_each_member`.
        let v = cur.value(1)?;
        f(v)?;
        if !cur.after_element(b']')? {
            return Ok(());
        }
    }
}

/// Finds the member of `object` whose decoded key is `key`.
pub fn find_member(body: &[u8], object: &Value, key: &str) -> Result<Lookup, ScanError> {
    let mut found = Lookup::default();
    for_each_member(body, object, |k, v| {
        if k.is(body, key) {
            if found.value.is_some() {
                found.duplicate = true;
            } else {
                found.value = Some(v);
            }
        }
        Ok::<(), ScanError>(())
    })?;
    Ok(found)
}

/// Whether `write_json_string` escapes any byte of `s` (else it writes
/// `s` between quotes as it is).
pub fn needs_escape(s: &str) -> bool {
    find_special(s.as_bytes()).is_some()
}

/// Where `write_json_string` writes: a byte buffer that takes a slice whole
/// (`Extend<u8>` on a `Vec` pushes byte by byte).
pub trait ByteSink {
    fn put(&mut self, bytes: &[u8]);
    fn byte(&mut self, b: u8) {
        self.put(&[b]);
    }
    /// Room for `n` more bytes (a hint).
    fn reserve_for(&mut self, _n: usize) {}
}

/// The audit log's and the error writers' buffer: a byte is a push, and the
/// string's room is reserved once.
impl ByteSink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
    fn byte(&mut self, b: u8) {
        self.push(b);
    }
    fn reserve_for(&mut self, n: usize) {
        self.reserve(n);
    }
}

/// The stamp's splice buffer, written only for a name that needs escapes.
impl<const N: usize> ByteSink for smallvec::SmallVec<[u8; N]> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// Writes `s` as a JSON string, quotes included: `"` and `\` escaped,
/// control characters as `\n`-style or `\u00XX` escapes, the rest as UTF-8.
/// Plain runs are written whole, found a word at a time.
pub fn write_json_string<S: ByteSink>(s: &str, out: &mut S) {
    write_json_text(s.as_bytes(), out);
}

/// `write_json_string` for text held as bytes (UTF-8, as its maker
/// promises: bytes at and above 0x80 are written as they are).
pub fn write_json_text<S: ByteSink>(text: &[u8], out: &mut S) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut rest = text;
    out.reserve_for(rest.len() + 2);
    out.byte(b'"');
    while let Some(at) = find_special(rest) {
        out.put(rest.get(..at).unwrap_or_default());
        let c = rest.get(at).copied().unwrap_or(0);
        match c {
            b'"' => out.put(b"\\\""),
            b'\\' => out.put(b"\\\\"),
            b'\n' => out.put(b"\\n"),
            b'\r' => out.put(b"\\r"),
            b'\t' => out.put(b"\\t"),
            0x08 => out.put(b"\\b"),
            0x0c => out.put(b"\\f"),
            _ => {
                let hex = |n: u8| HEX.get(usize::from(n)).copied().unwrap_or(b'0');
                out.put(&[b'\\', b'u', b'0', b'0', hex(c >> 4), hex(c & 0xf)]);
            }
        }
        rest = rest.get(at + 1..).unwrap_or_default();
    }
    out.put(rest);
    out.byte(b'"');
}

/// Whether the whole body is UTF-8. Not run ahead of a scan: the scanner
/// accepts only ASCII outside strings and checks each string holding other
/// bytes as it reads it (`Cursor::string_rest`), so a body it accepts is
/// UTF-8. Run when a scan stops, so that a body that is not UTF-8 is always
/// refused as `InvalidUtf8` at its first bad byte, as it was when this check
/// came first.
fn check_utf8(body: &[u8]) -> Result<(), ScanError> {
    std::str::from_utf8(body).map_err(|e| ScanError::InvalidUtf8 { offset: e.valid_up_to() })?;
    Ok(())
}

/// Compares the raw text of a key or string (between the quotes) with
/// `target` after decoding escapes, without allocating.
fn text_eq(raw: &[u8], escaped: bool, target: &[u8]) -> bool {
    if escaped {
        Unescape::new(raw).eq(target.iter().copied())
    } else {
        raw == target
    }
}

/// Decodes the raw text of a validated JSON string into bytes: UTF-8, with a
/// lone surrogate as its 3-byte generalized UTF-8 form (which never equals a
/// valid `str`, as in Python it never equals an ordinary key).
struct Unescape<'a> {
    raw: &'a [u8],
    pos: usize,
    pending: [u8; 4],
    pending_at: u8,
    pending_len: u8,
}

impl<'a> Unescape<'a> {
    fn new(raw: &'a [u8]) -> Self {
        Unescape { raw, pos: 0, pending: [0; 4], pending_at: 0, pending_len: 0 }
    }

    fn hex4(&self, at: usize) -> Option<u32> {
        let digits = self.raw.get(at..at.checked_add(4)?)?;
        digits.iter().try_fold(0u32, |acc, &d| {
            let v = char::from(d).to_digit(16)?;
            Some(acc << 4 | v)
        })
    }

    /// Decodes the escape at `pos` (just after the backslash) into a code
    /// point, pairing `\uD83D\uDE00` surrogates as Python does.
    fn escape(&mut self) -> Option<u32> {
        let c = *self.raw.get(self.pos)?;
        self.pos += 1;
        let simple = match c {
            b'"' => b'"',
            b'\\' => b'\\',
            b'/' => b'/',
            b'b' => 0x08,
            b'f' => 0x0c,
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            b'u' => {
                let hi = self.hex4(self.pos)?;
                self.pos += 4;
                if (0xD800..0xDC00).contains(&hi) && self.raw.get(self.pos..self.pos + 2) == Some(b"\\u") {
                    if let Some(lo @ 0xDC00..=0xDFFF) = self.hex4(self.pos + 2) {
                        self.pos += 6;
                        return Some(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00));
                    }
                }
                return Some(hi);
            }
            _ => return None,
        };
        Some(u32::from(simple))
    }
}

impl Iterator for Unescape<'_> {
    type Item = u8;

    fn next(&mut self) -> Option<u8> {
        if self.pending_at < self.pending_len {
            let b = self.pending.get(usize::from(self.pending_at)).copied();
            self.pending_at += 1;
            return b;
        }
        let c = *self.raw.get(self.pos)?;
        self.pos += 1;
        if c != b'\\' {
            return Some(c);
        }
        let cp = self.escape()?;
        // Generalized UTF-8: like `char::encode_utf8`, surrogates included.
        let (len, first) = match cp {
            0..=0x7F => return Some(cp as u8),
            0x80..=0x7FF => (2, 0xC0 | (cp >> 6) as u8),
            0x800..=0xFFFF => (3, 0xE0 | (cp >> 12) as u8),
            _ => (4, 0xF0 | (cp >> 18) as u8),
        };
        let cont = |shift: u32| 0x80 | ((cp >> shift) & 0x3F) as u8;
        self.pending = match len {
            2 => [0, cont(0), 0, 0],
            3 => [0, cont(6), cont(0), 0],
            _ => [0, cont(12), cont(6), cont(0)],
        };
        self.pending_at = 1;
        self.pending_len = len;
        Some(first)
    }
}

/// The caller's map from a `params.name` value to the identity key.
type IdentityKey<'f, 'k> = &'f dyn Fn(&Value) -> Option<&'k str>;

impl Cursor<'_> {
    /// The body of `scan_messages`, from the start of the body: a message
    /// object, or a batch array whose object elements are messages.
    fn messages<'k, E>(
        &mut self,
        identity_key: IdentityKey<'_, 'k>,
        visit: &mut impl FnMut(&Message) -> Result<(), E>,
    ) -> Result<(), Stop<E>> {
        self.ws();
        match self.peek() {
            Some(b'{') => {
                let mut m = Message::default();
                self.message(1, identity_key, &mut m)?;
                visit(&m).map_err(Stop::Visit)?;
            }
            Some(b'[') => {
                self.pos += 1;
                self.ws();
                if self.peek() == Some(b']') {
                    self.pos += 1;
                } else {
                    loop {
                        if self.peek() == Some(b'{') {
                            let mut m = Message::default();
                            self.message(2, identity_key, &mut m)?;
                            visit(&m).map_err(Stop::Visit)?;
                        } else {
                            let v = self.value(1)?;
                            visit(&Message { start: v.start, end: v.end, ..Message::default() })
                                .map_err(Stop::Visit)?;
                        }
                        if !self.after_element(b']')? {
                            break;
                        }
                    }
                }
            }
            _ => {
                self.value(0)?;
            }
        }
        self.end()?;
        Ok(())
    }

    /// A message object at `depth`: records `method` and `params`, and
    /// descends into the first `params` when it is an object.
    /// Fills `m`, a default `Message`, in place: it is large, and returning
    /// it would copy it.
    fn message(&mut self, depth: usize, identity_key: IdentityKey, m: &mut Message) -> Result<(), ScanError> {
        let body = self.b;
        let v = self.object(depth, |cur, key| {
            if key.is(body, "method") {
                let v = cur.value(depth)?;
                first(&mut m.method, &mut m.duplicates.method, v);
            } else if key.is(body, "id") {
                m.id = Some(cur.value(depth)?);
            } else if key.is(body, "result") {
                m.is_error = None;
                m.protocol_version = None;
                let v = if cur.peek() == Some(b'{') { cur.result(depth + 1, m)? } else { cur.value(depth)? };
                m.result = Some(v);
            } else if key.is(body, "error") {
                m.error = Some(cur.value(depth)?);
            } else if key.is(body, "params") {
                let v = if m.params.is_none() && cur.peek() == Some(b'{') {
                    cur.params(depth + 1, m, identity_key)?
                } else {
                    cur.value(depth)?
                };
                first(&mut m.params, &mut m.duplicates.params, v);
            } else {
                cur.value(depth)?;
            }
            Ok::<(), ScanError>(())
        })?;
        m.start = v.start;
        m.end = v.end;
        m.object = true;
        Ok(())
    }

    fn params(
        &mut self,
        depth: usize,
        m: &mut Message,
        identity_key: IdentityKey,
    ) -> Result<Value, ScanError> {
        let body = self.b;
        self.object(depth, |cur, key| {
            let lookup_key = match (m.name, m.arguments, cur.peek()) {
                (Some(name), None, Some(b'{')) if key.is(body, "arguments") => identity_key(&name),
                _ => None,
            };
            if let Some(wanted) = lookup_key {
                // One pass: the arguments object is walked here, not again.
                let mut found = Lookup::default();
                let v = cur.object(depth + 1, |cur, k| {
                    let v = cur.value(depth + 1)?;
                    if k.is(body, wanted) {
                        first(&mut found.value, &mut found.duplicate, v);
                    }
                    Ok::<(), ScanError>(())
                })?;
                m.arguments = Some(v);
                m.identity = Some(found);
                return Ok(());
            }
            let v = cur.value(depth)?;
            if key.is(body, "name") {
                first(&mut m.name, &mut m.duplicates.name, v);
            } else if key.is(body, "arguments") {
                first(&mut m.arguments, &mut m.duplicates.arguments, v);
            }
            Ok::<(), ScanError>(())
        })
    }
}

impl Cursor<'_> {
    /// An answer's `result` object: its `isError` and `protocolVersion`
    /// (the last of each) are kept as it is walked, not walked again.
    fn result(&mut self, depth: usize, m: &mut Message) -> Result<Value, ScanError> {
        let body = self.b;
        self.object(depth, |cur, key| {
            let v = cur.value(depth)?;
            if key.is(body, "isError") {
                m.is_error = Some(v);
            } else if key.is(body, "protocolVersion") {
                m.protocol_version = Some(v);
            }
            Ok::<(), ScanError>(())
        })
    }
}

/// Keeps the first value of a key and flags any later one.
fn first(slot: &mut Option<Value>, duplicate: &mut bool, v: Value) {
    if slot.is_some() {
        *duplicate = true;
    } else {
        *slot = Some(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A slow, obviously-correct recursive parser that builds a tree; the
    /// fast scanner must agree with it (memchr's `naive.rs` idea).
    mod naive {
        use super::super::{Kind, Value};
        use crate::limits::MAX_JSON_DEPTH;

        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Error {
            Syntax,
            Utf8,
            Deep,
        }

        pub struct Node {
            pub value: Value,
            /// Members (decoded key, value) of an object, elements of an array.
            pub members: Vec<(Vec<u8>, Node)>,
        }

        struct P<'a> {
            b: &'a [u8],
            i: usize,
        }

        pub fn parse(b: &[u8]) -> Result<Node, Error> {
            if std::str::from_utf8(b).is_err() {
                return Err(Error::Utf8);
            }
            let mut p = P { b, i: 0 };
            p.ws();
            let n = p.value(0)?;
            p.ws();
            if p.i != b.len() {
                return Err(Error::Syntax);
            }
            Ok(n)
        }

        /// Decoded bytes of a string (generalized UTF-8 for lone surrogates).
        pub fn push_cp(out: &mut Vec<u8>, cp: u32) {
            if cp < 0x80 {
                out.push(cp as u8);
            } else if cp < 0x800 {
                out.push(0xC0 | (cp >> 6) as u8);
                out.push(0x80 | (cp & 0x3F) as u8);
            } else if cp < 0x10000 {
                out.push(0xE0 | (cp >> 12) as u8);
                out.push(0x80 | ((cp >> 6) & 0x3F) as u8);
                out.push(0x80 | (cp & 0x3F) as u8);
            } else {
                out.push(0xF0 | (cp >> 18) as u8);
                out.push(0x80 | ((cp >> 12) & 0x3F) as u8);
                out.push(0x80 | ((cp >> 6) & 0x3F) as u8);
                out.push(0x80 | (cp & 0x3F) as u8);
            }
        }

        impl P<'_> {
            fn at(&self) -> Option<u8> {
                self.b.get(self.i).copied()
            }
            fn ws(&mut self) {
                while self.at().is_some_and(crate::mcp::json::is_ws) {
                    self.i += 1;
                }
            }
            fn eat(&mut self, s: &[u8]) -> bool {
                if self.b[self.i..].starts_with(s) {
                    self.i += s.len();
                    true
                } else {
                    false
                }
            }
            fn hex4(&mut self) -> Result<u32, Error> {
                let mut v = 0;
                for _ in 0..4 {
                    let d = self.at().and_then(|c| (c as char).to_digit(16));
                    v = v * 16 + d.ok_or(Error::Syntax)?;
                    self.i += 1;
                }
                Ok(v)
            }
            fn string(&mut self) -> Result<(Vec<u8>, bool), Error> {
                assert!(self.eat(b"\""));
                let mut out = Vec::new();
                let mut escaped = false;
                loop {
                    let c = self.at().ok_or(Error::Syntax)?;
                    self.i += 1;
                    match c {
                        b'"' => return Ok((out, escaped)),
                        0..=0x1f => return Err(Error::Syntax),
                        b'\\' => {
                            escaped = true;
                            let e = self.at().ok_or(Error::Syntax)?;
                            self.i += 1;
                            match e {
                                b'"' | b'\\' | b'/' => out.push(e),
                                b'b' => out.push(8),
                                b'f' => out.push(12),
                                b'n' => out.push(b'\n'),
                                b'r' => out.push(b'\r'),
                                b't' => out.push(b'\t'),
                                b'u' => {
                                    let hi = self.hex4()?;
                                    let save = self.i;
                                    if (0xD800..0xDC00).contains(&hi) && self.eat(b"\\u") {
                                        match self.hex4() {
                                            Ok(lo) if (0xDC00..0xE000).contains(&lo) => {
                                                let cp = 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
                                                push_cp(&mut out, cp);
                                                continue;
                                            }
                                            _ => self.i = save,
                                        }
                                    }
                                    push_cp(&mut out, hi);
                                }
                                _ => return Err(Error::Syntax),
                            }
                        }
                        _ => out.push(c),
                    }
                }
            }
            fn digits(&mut self) -> usize {
                let s = self.i;
                while self.at().is_some_and(|c| c.is_ascii_digit()) {
                    self.i += 1;
                }
                self.i - s
            }
            fn value(&mut self, depth: usize) -> Result<Node, Error> {
                let start = self.i;
                let mut members = Vec::new();
                let kind = match self.at().ok_or(Error::Syntax)? {
                    b'{' | b'[' if depth + 1 > MAX_JSON_DEPTH => return Err(Error::Deep),
                    b'{' => {
                        self.i += 1;
                        self.ws();
                        if !self.eat(b"}") {
                            loop {
                                if self.at() != Some(b'"') {
                                    return Err(Error::Syntax);
                                }
                                let (k, _) = self.string()?;
                                self.ws();
                                if !self.eat(b":") {
                                    return Err(Error::Syntax);
                                }
                                self.ws();
                                let v = self.value(depth + 1)?;
                                members.push((k, v));
                                self.ws();
                                if self.eat(b",") {
                                    self.ws();
                                } else if self.eat(b"}") {
                                    break;
                                } else {
                                    return Err(Error::Syntax);
                                }
                            }
                        }
                        Kind::Object { empty: members.is_empty() }
                    }
                    b'[' => {
                        self.i += 1;
                        self.ws();
                        if !self.eat(b"]") {
                            loop {
                                let v = self.value(depth + 1)?;
                                members.push((Vec::new(), v));
                                self.ws();
                                if self.eat(b",") {
                                    self.ws();
                                } else if self.eat(b"]") {
                                    break;
                                } else {
                                    return Err(Error::Syntax);
                                }
                            }
                        }
                        Kind::Array
                    }
                    b'"' => {
                        let (_, escaped) = self.string()?;
                        Kind::String { escaped }
                    }
                    b't' if self.eat(b"true") => Kind::True,
                    b'f' if self.eat(b"false") => Kind::False,
                    b'n' if self.eat(b"null") => Kind::Null,
                    b'N' if self.eat(b"NaN") => Kind::Number,
                    b'I' if self.eat(b"Infinity") => Kind::Number,
                    b'-' if self.eat(b"-Infinity") => Kind::Number,
                    b'-' | b'0'..=b'9' => {
                        self.eat(b"-");
                        if !self.eat(b"0") && self.digits() == 0 {
                            return Err(Error::Syntax);
                        }
                        if self.eat(b".") && self.digits() == 0 {
                            return Err(Error::Syntax);
                        }
                        if self.eat(b"e") || self.eat(b"E") {
                            let _ = self.eat(b"+") || self.eat(b"-");
                            if self.digits() == 0 {
                                return Err(Error::Syntax);
                            }
                        }
                        Kind::Number
                    }
                    _ => return Err(Error::Syntax),
                };
                Ok(Node { value: Value { start, end: self.i, kind }, members })
            }
        }

        /// The first value under `key` and whether there are more.
        pub fn member<'n>(n: &'n Node, key: &str) -> (Option<&'n Node>, bool) {
            let mut it = n.members.iter().filter(|(k, _)| k == key.as_bytes());
            let first = it.next().map(|(_, v)| v);
            (first, it.next().is_some())
        }

        pub fn message(n: &Node) -> super::Message {
            let (method, dm) = member(n, "method");
            let (params, dp) = member(n, "params");
            let last = |key: &[u8]| n.members.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.value);
            let (id, result, error) = (last(b"id"), last(b"result"), last(b"error"));
            let in_result = |key: &[u8]| {
                let r = n.members.iter().rev().find(|(k, _)| k == b"result").map(|(_, v)| v)?;
                r.members.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.value)
            };
            let (is_error, protocol_version) = (in_result(b"isError"), in_result(b"protocolVersion"));
            if !matches!(n.value.kind, Kind::Object { .. }) {
                let (start, end) = (n.value.start, n.value.end);
                return super::Message { start, end, ..Default::default() };
            }
            let mut m = super::Message {
                start: n.value.start,
                end: n.value.end,
                object: true,
                method: method.map(|v| v.value),
                id,
                result,
                error,
                is_error,
                protocol_version,
                params: params.map(|v| v.value),
                ..Default::default()
            };
            m.duplicates.method = dm;
            m.duplicates.params = dp;
            if let Some(p) = params.filter(|p| matches!(p.value.kind, Kind::Object { .. })) {
                let (name, dn) = member(p, "name");
                let (args, da) = member(p, "arguments");
                // The one-pass lookup happens when a string `name` precedes
                // an object `arguments` (see `sender_for_strings`).
                let at = |key: &str| p.members.iter().position(|(k, _)| k == key.as_bytes());
                if let (Some(n), Some(a), Some(name), Some(args)) = (at("name"), at("arguments"), name, args)
                {
                    let is_str = matches!(name.value.kind, Kind::String { .. });
                    let is_obj = matches!(args.value.kind, Kind::Object { .. });
                    if n < a && is_str && is_obj {
                        let (v, dup) = member(args, "sender");
                        m.identity = Some(super::Lookup { value: v.map(|v| v.value), duplicate: dup });
                    }
                }
                m.name = name.map(|v| v.value);
                m.arguments = args.map(|v| v.value);
                m.duplicates.name = dn;
                m.duplicates.arguments = da;
            }
            m
        }

        pub fn messages(b: &[u8]) -> Result<Vec<super::Message>, Error> {
            let top = parse(b)?;
            Ok(match top.value.kind {
                Kind::Object { .. } => vec![message(&top)],
                Kind::Array => top.members.iter().map(|(_, v)| message(v)).collect(),
                _ => Vec::new(),
            })
        }
    }

    /// The identity-key map of these tests: `sender` for any string name.
    fn sender_for_strings(name: &Value) -> Option<&'static str> {
        matches!(name.kind, Kind::String { .. }).then_some("sender")
    }

    fn fast(b: &[u8]) -> Result<Vec<Message>, naive::Error> {
        let mut out = Vec::new();
        scan_messages(b, sender_for_strings, |m| {
            out.push(*m);
            Ok::<(), ScanError>(())
        })
        .map_err(|e| match e {
            ScanError::Syntax { .. } => naive::Error::Syntax,
            ScanError::InvalidUtf8 { .. } => naive::Error::Utf8,
            ScanError::TooDeep { .. } => naive::Error::Deep,
        })?;
        Ok(out)
    }

    #[track_caller]
    fn agree(b: &[u8]) -> Result<Vec<Message>, naive::Error> {
        let f = fast(b);
        let n = naive::messages(b);
        assert_eq!(f, n, "fast and naive disagree on {:?}", String::from_utf8_lossy(b));
        // UTF-8 is checked as strings are read, yet a body that is not UTF-8
        // is refused at its first bad byte, as by a check ahead of the scan.
        if let Err(e) = std::str::from_utf8(b) {
            let want = Err(ScanError::InvalidUtf8 { offset: e.valid_up_to() });
            assert_eq!(scan_messages(b, sender_for_strings, |_| Ok::<(), ScanError>(())), want);
            assert_eq!(parse_value(b).map(|_| ()), want);
        }
        // parse_value accepts exactly the same bodies.
        assert_eq!(parse_value(b).is_ok(), n.is_ok(), "{:?}", String::from_utf8_lossy(b));
        // The walks over the top value's elements or members give the
        // naive tree's spans.
        if let (Ok(top), Ok(tree)) = (parse_value(b), naive::parse(b)) {
            let want: Vec<Value> = tree.members.iter().map(|(_, n)| n.value).collect();
            let mut got = Vec::new();
            match top.kind {
                Kind::Array => for_each_element(b, &top, |v| {
                    got.push(v);
                    Ok::<(), ScanError>(())
                })
                .unwrap(),
                Kind::Object { .. } => for_each_member(b, &top, |_, v| {
                    got.push(v);
                    Ok::<(), ScanError>(())
                })
                .unwrap(),
                _ => {}
            }
            assert_eq!(got, want, "{:?}", String::from_utf8_lossy(b));
        }
        f
    }

    const VALID: &[&str] = &[
        r#"{}"#,
        r#"[]"#,
        r#" [ ] "#,
        r#"1"#,
        r#""x""#,
        r#"null"#,
        "\t{ \"a\" : [ 1 , 2 ] }\r\n",
        r#"{"method":"tools/call","params":{"name":"chat_send","arguments":{"sender":"x"}}}"#,
        r#"{"params":{"arguments":null,"name":"t"},"method":"tools/call","id":"7"}"#,
        r#"[{"method":"a"},1,[{"method":"nested"}],{"method":"b","params":[]}]"#,
        r#"{"m\u0065thod":"tools\/call","p\u0061rams":{"n\u0061me":"x"}}"#,
        r#"{"method":1,"method":2}"#,
        r#"{"params":{"name":1,"name":2,"arguments":{},"arguments":[]}}"#,
        r#"{"params":7,"params":{"name":"x"}}"#,
        r#"[NaN, Infinity, -Infinity, 1e400, -0.5E-7, 0, 12345678901234567890123456789012345678901234567890]"#,
        r#"{"s":"\ud800","p":"\ud83d\ude00","q":"\udc00\ud800x","\u00e9":"é"}"#,
        "{\"\u{7f}\":\"\u{7f}\u{10ffff}\"}",
        r#"{"a":{"b":{"c":[[[{}]]]}},"d":[{},[],""]}"#,
        r#""\"\\\/\b\f\n\r\t\u0000\uFFFF""#,
    ];

    const INVALID: &[&str] = &[
        "",
        " ",
        "{",
        "}",
        "{\"a\"}",
        "{\"a\":}",
        "{\"a\":1,}",
        "[1,]",
        "[,1]",
        "{,}",
        "{'a':1}",
        "{a:1}",
        "[1 2]",
        "{} {}",
        "{}x",
        "01",
        "-",
        "1.",
        ".5",
        "1e",
        "1e+",
        "+1",
        "-NaN",
        "nan",
        "infinity",
        "-Inf",
        "tru",
        "nul",
        "\"\\x\"",
        "\"\\u12\"",
        "\"\\u12g4\"",
        "\"\\\"",
        "\"a\nb\"",
        "\"a\tb\"",
        "\"\u{1}\"",
        "\"abc",
        "[\"a\"",
        "{\"a\":1 \"b\":2}",
        "\u{feff}{}",
        "{\"a\":1}\u{0}",
        "[1]\u{b}",
    ];

    #[test]
    fn fixtures_agree_with_naive() {
        for s in VALID {
            assert!(agree(s.as_bytes()).is_ok(), "valid refused: {s:?}");
        }
        for s in INVALID {
            assert!(agree(s.as_bytes()).is_err(), "invalid accepted: {s:?}");
        }
    }

    #[test]
    fn invalid_utf8_is_refused() {
        for b in [
            &b"\"\xff\""[..],
            b"{\"a\":\"\xc3\"}",
            b"{\"\xed\xa0\x80\":1}", // an encoded surrogate: Python refuses it too
            b"[\"\xf4\x90\x80\x80\"]",
            b"\xef\xbb\xbf{}",
        ] {
            assert!(matches!(
                scan_messages(b, |_| None, |_| Ok::<(), ScanError>(())),
                Err(ScanError::InvalidUtf8 { .. }) | Err(ScanError::Syntax { .. })
            ));
            assert!(agree(b).is_err());
        }
    }

    #[test]
    fn invalid_utf8_comes_before_other_errors() {
        // After a syntax error, past the string the scan stopped in, in a
        // message the visitor refused: still `InvalidUtf8`, at the bad byte.
        for (b, offset) in [
            (&b"{\"a\":x,\"b\":\"\xff\"}"[..], 12),
            (b"[\"\\q\xc3\"]", 4),
            (b"\"abc\xe9", 4),
            (b"[{\"method\":1}, \"\xff\"]", 16),
            (b"{\"method\":1} \x80", 13),
            (b"[[[[\xff", 4),
        ] {
            let want = Err(ScanError::InvalidUtf8 { offset });
            assert_eq!(scan_messages(b, |_| None, |_| Err(ScanError::Syntax { offset: 0 })), want, "{b:?}");
            assert_eq!(parse_value(b).map(|_| ()), want, "{b:?}");
        }
        // The error a string's own check gives is the whole-body one.
        let b = "{\"é\":\"x\u{10ffff}y\"}";
        assert!(parse_value(b.as_bytes()).is_ok());
        let mut bad = b.as_bytes().to_vec();
        bad.truncate(b.len() - 4); // `x` and 3 of the 4 bytes of U+10FFFF
        bad.extend_from_slice(b"\"}");
        assert_eq!(parse_value(&bad), Err(ScanError::InvalidUtf8 { offset: 8 }));
    }

    #[test]
    fn spans_of_a_message() {
        let b = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"chat_send","arguments":{"sender":"x","n":1e400}}}"#;
        let m = agree(b).unwrap();
        assert_eq!(m.len(), 1);
        let m = m[0];
        assert_eq!(m.identity.unwrap().value.unwrap().bytes(b), br#""x""#, "looked up in the same pass");
        assert_eq!(m.method.unwrap().bytes(b), br#""tools/call""#);
        assert!(m.method.unwrap().is_str(b, "tools/call"));
        assert_eq!(m.name.unwrap().bytes(b), br#""chat_send""#);
        let args = m.arguments.unwrap();
        assert_eq!(args.bytes(b), br#"{"sender":"x","n":1e400}"#);
        assert_eq!(args.kind, Kind::Object { empty: false });
        let l = find_member(b, &args, "sender").unwrap();
        assert_eq!(l.value.unwrap().bytes(b), br#""x""#);
        assert!(!l.duplicate);
        assert_eq!(find_member(b, &args, "n").unwrap().value.unwrap().bytes(b), b"1e400");
        assert_eq!(find_member(b, &args, "absent").unwrap(), Lookup::default());
        assert_eq!((m.start, m.end), (0, b.len()));
    }

    #[test]
    fn escaped_keys_and_values_are_decoded() {
        let b = br#"{"\u006dethod":"tools\/call","params":{"\u006e\u0061me":"chat\u005fsend","arguments":{"\u0073ender":1,"sender":2}}}"#;
        let m = agree(b).unwrap()[0];
        assert!(m.method.unwrap().is_str(b, "tools/call"));
        assert!(m.name.unwrap().is_str(b, "chat_send"));
        assert_eq!(m.name.unwrap().decode_str(b).as_deref(), Some("chat_send"));
        let l = find_member(b, &m.arguments.unwrap(), "sender").unwrap();
        assert_eq!(m.identity, Some(l));
        assert!(l.duplicate);
        assert_eq!(l.value.unwrap().bytes(b), b"1");
    }

    #[test]
    fn surrogates_decode_like_python() {
        let b = r#"["\ud83d\ude00", "😀", "\ud83d", "\ud83d\u0041", "\u00e9", "\ude00\ud83d"]"#;
        // The naive tree gives the element spans; `is_str` decodes them.
        let n = naive::parse(b.as_bytes()).unwrap();
        let vals: Vec<Value> = n.members.iter().map(|(_, v)| v.value).collect();
        let b = b.as_bytes();
        assert!(vals[0].is_str(b, "😀"));
        assert!(vals[1].is_str(b, "😀"));
        assert_eq!(vals[2].decode_str(b), None);
        assert!(!vals[2].is_str(b, "\u{FFFD}"));
        assert_eq!(vals[3].decode_str(b), None);
        assert!(vals[4].is_str(b, "é"));
        assert_eq!(vals[5].decode_str(b), None);
    }

    #[test]
    fn duplicates_are_reported() {
        let cases: &[(&str, Duplicates)] = &[
            (r#"{"method":"a","method":"b"}"#, Duplicates { method: true, ..Default::default() }),
            (r#"{"params":{},"p\u0061rams":{}}"#, Duplicates { params: true, ..Default::default() }),
            (r#"{"params":{"name":"a","name":"a"}}"#, Duplicates { name: true, ..Default::default() }),
            (
                r#"{"params":{"arguments":{},"arguments":null}}"#,
                Duplicates { arguments: true, ..Default::default() },
            ),
            (r#"{"params":{"x":{"name":1,"name":2}}}"#, Duplicates::default()),
        ];
        for (s, d) in cases {
            assert_eq!(agree(s.as_bytes()).unwrap()[0].duplicates, *d, "{s}");
        }
    }

    #[test]
    fn depth_is_bounded_without_recursion() {
        let nest = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(agree(nest(MAX_JSON_DEPTH).as_bytes()).is_ok());
        assert_eq!(agree(nest(MAX_JSON_DEPTH + 1).as_bytes()), Err(naive::Error::Deep));
        // A message's own levels count too.
        let obj = |n: usize| format!("{{\"params\":{{\"arguments\":{}{}}}}}", "[".repeat(n), "]".repeat(n));
        assert!(agree(obj(MAX_JSON_DEPTH - 2).as_bytes()).is_ok());
        assert_eq!(agree(obj(MAX_JSON_DEPTH - 1).as_bytes()), Err(naive::Error::Deep));
        let batch = |n: usize| {
            let (open, close) = ("{\"a\":".repeat(n), "}".repeat(n));
            format!("[{{\"params\":{{\"a\":{open}1{close}}}}}]")
        };
        assert!(agree(batch(MAX_JSON_DEPTH - 3).as_bytes()).is_ok());
        assert_eq!(agree(batch(MAX_JSON_DEPTH - 2).as_bytes()), Err(naive::Error::Deep));
        // 100k open brackets: an error, not a stack overflow (only the fast one).
        let deep = "[".repeat(100_000);
        assert!(matches!(
            parse_value(deep.as_bytes()),
            Err(ScanError::TooDeep { offset }) if offset == MAX_JSON_DEPTH
        ));
        let deep = format!("{{\"params\":{{\"arguments\":{}", "{\"a\":".repeat(100_000));
        assert!(matches!(fast(deep.as_bytes()), Err(naive::Error::Deep)));
    }

    #[test]
    fn every_prefix_of_a_message_is_refused() {
        let b = br#"{"method":"tools/call","params":{"name":"chat_send","arguments":{"sender":"\u00e9x","n":[1.5e3,{"k":null}]}}}"#;
        for i in 0..b.len() {
            assert!(agree(&b[..i]).is_err(), "prefix {i} accepted");
        }
    }

    #[test]
    fn write_json_string_round_trips() {
        // Long runs too (past SWAR_BYTES, the vector search), with escapes at their ends.
        let long = "x".repeat(300);
        let cases = [
            "".to_string(),
            "plain".into(),
            "é—😀".into(),
            "a\"b\\c/".into(),
            "\n\r\t\u{8}\u{c}\u{0}\u{1f}\u{7f}".into(),
            "\u{2028}".into(),
            long.clone(),
            format!("\"{long}\u{1}{long}\\"),
            format!("{long}é\n"),
        ];
        for s in cases.iter().map(String::as_str) {
            let mut out = Vec::new();
            write_json_string(s, &mut out);
            let v = parse_value(&out).unwrap();
            assert_eq!(v.decode_str(&out).as_deref(), Some(s));
            assert_eq!(serde_json::from_slice::<String>(&out).unwrap(), s);
        }
        let mut out = Vec::new();
        write_json_string("a\u{1}b", &mut out);
        assert_eq!(out, b"\"a\\u0001b\"");
    }

    use crate::test_rng::Rng;

    const KEYS: &[&str] = &[
        "method",
        "params",
        "name",
        "arguments",
        "sender",
        "m\\u0065thod",
        "p\\u0061rams",
        "\\u006eame",
        "x",
        "",
        "id",
        "é",
    ];
    const SCALARS: &[&str] = &[
        "0",
        "-1",
        "1.5e300",
        "1e400",
        "123456789012345678901234567890123456789012",
        "NaN",
        "-Infinity",
        "Infinity",
        "true",
        "false",
        "null",
        "\"\"",
        "\"tools/call\"",
        "\"tools\\/call\"",
        "\"chat_send\"",
        "\"\\ud800\"",
        "\"é😀\"",
        "\"a\\\"b\"",
    ];
    const WS: &[&str] = &["", "", "", " ", "\n", "\t", "\r\n  "];

    fn gen_value(r: &mut Rng, out: &mut String, depth: usize) {
        match r.below(if depth > 5 { 3 } else { 6 }) {
            0..=2 => out.push_str(r.pick(SCALARS)),
            3 | 4 => {
                out.push('{');
                for i in 0..r.below(5) {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(r.pick(WS));
                    out.push('"');
                    out.push_str(r.pick(KEYS));
                    out.push('"');
                    out.push_str(r.pick(WS));
                    out.push(':');
                    out.push_str(r.pick(WS));
                    gen_value(r, out, depth + 1);
                }
                out.push('}');
            }
            _ => {
                out.push('[');
                for i in 0..r.below(4) {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(r.pick(WS));
                    gen_value(r, out, depth + 1);
                }
                out.push_str(r.pick(WS));
                out.push(']');
            }
        }
    }

    #[test]
    fn generated_inputs_agree_with_naive() {
        let mut r = Rng(0x9E37_79B9_7F4A_7C15);
        let mut valid = 0;
        for _ in 0..20_000 {
            let mut s = String::new();
            s.push_str(r.pick(WS));
            gen_value(&mut r, &mut s, 0);
            s.push_str(r.pick(WS));
            let mut b = s.into_bytes();
            // Half of the inputs get a few byte-level mutations.
            if r.below(2) == 0 {
                for _ in 0..1 + r.below(3) {
                    let junk = r.pick(b"{}[]\",:\\u0123456789eE+-.ntfNI \n\x01\xff");
                    let at = r.below(b.len() + 1);
                    match r.below(3) {
                        0 => b.insert(at, junk),
                        1 if at < b.len() => {
                            b.remove(at);
                        }
                        _ if at < b.len() => b[at] = junk,
                        _ => {}
                    }
                }
            }
            if agree(&b).is_ok() {
                valid += 1;
            }
        }
        assert!(valid > 10_000, "generator too weak: {valid}");
    }

    #[test]
    fn error_display_carries_no_content() {
        let e = parse_value(b"{\"secret-token\":x}").unwrap_err();
        assert_eq!(e.to_string(), "invalid JSON at byte 16");
        assert_eq!(ScanError::TooDeep { offset: 3 }.to_string(), "JSON nested deeper than 128 at byte 3");
    }
}

//! `HeaderList`: the one place field lines live between parsing and writing.
//!
//! Two lines with one name can never be written: the agentchattr proxy's
//! duplicated `Mcp-Session-Id` cannot happen. Pure: no I/O. The guards of
//! that invariant, each the only way into the list of its kind:
//!
//! - `push` writes every line the list makes itself, its name lowercased
//!   (or a compile-time `Name`, lowercase by construction); it is reached
//!   only through `merge_valid` and `set_at`, which first look the name up
//!   (`position_keyed`) and replace the line found instead of adding one.
//! - `merge_parsed_in` takes a received line where it lies (after
//!   `take_block` copied the head's lines in one piece), lowercasing the
//!   name in place, only when `position_keyed` finds no line of that name;
//!   any other line goes through `merge_parsed` -> `merge_valid`.
//! - `set`/`set_name` replace in place; there is no `append`; `remove`,
//!   `remove_name` and `strip_for_forwarding` only take lines out.
//! - The writer (`write_to`) emits the lines of the list and nothing else.
//!
//! Storage: every line is kept as it will be written (`name: value\r\n`,
//! name lowercased) in one byte buffer, and the list is a small index into
//! it. A line is copied once on the way in and once on the way out (runs of
//! adjacent lines in one copy); a replaced or removed line leaves dead bytes
//! behind until the list is dropped. What the proxy does with a name
//! (singleton, hop-by-hop, Host, ...) is decided once, when its line enters.

use smallvec::SmallVec;
use std::fmt;

/// A field value kept aside while a joined value is built.
pub type Value = SmallVec<[u8; 64]>;

/// Bytes of lines kept inline: a client's head with the proxy's edits
/// (credentials, Host) fits, so a request allocates nothing here.
const INLINE_BYTES: usize = 1024;
/// Lines kept inline, for the same reason.
const INLINE_LINES: usize = 16;

/// One field line, as `iter` shows it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Header<'a> {
    name: &'a [u8],
    value: &'a [u8],
}

impl<'a> Header<'a> {
    pub fn name(&self) -> &'a [u8] {
        self.name
    }
    pub fn value(&self) -> &'a [u8] {
        self.value
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

/// What the list and the parser do with a (lowercase) name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    Other,
    /// In `SINGLETONS` or `mcp-param-*`, but not `host`.
    Singleton,
    /// `host`, a singleton the parser also counts (RFC 9112 §3.2).
    Host,
    /// In `HOP_BY_HOP`, but not one of the two below.
    HopByHop,
    /// `transfer-encoding`, hop-by-hop; the parser counts its lines.
    TransferEncoding,
    /// `connection`, hop-by-hop; it names more hop-by-hop fields.
    Connection,
    /// `set-cookie`: cannot be folded (RFC 9110 §5.3), the last value wins.
    SetCookie,
    /// `content-length`, a singleton the parser reads for framing.
    ContentLength,
    /// `expect`, which the parser reads and the proxy answers itself.
    Expect,
}

impl Class {
    fn is_singleton(self) -> bool {
        matches!(self, Class::Singleton | Class::Host | Class::ContentLength)
    }
    #[cfg(test)]
    fn is_hop_by_hop(self) -> bool {
        self.bit() & HOP_BY_HOP_BITS != 0
    }
    /// This class's bit in `HeaderList::classes`.
    fn bit(self) -> u16 {
        1 << self as u16
    }
}

/// The bits of the classes `strip_hop_by_hop` always drops.
const HOP_BY_HOP_BITS: u16 =
    1 << Class::HopByHop as u16 | 1 << Class::TransferEncoding as u16 | 1 << Class::Connection as u16;

/// The class of a lowercase name: a switch on its length, then at most a
/// few comparisons, instead of a walk over both lists for every line. Must
/// agree with `SINGLETONS`, `HOP_BY_HOP` and `is_singleton` (tested).
fn classify(n: &[u8]) -> Class {
    use Class::*;
    let one_of = |names: &[&[u8]], class: Class| if names.contains(&n) { class } else { Other };
    let listed = match n.len() {
        2 => one_of(&[b"te"], HopByHop),
        4 => match n {
            b"host" => Host,
            b"date" | b"etag" => Singleton,
            _ => Other,
        },
        6 => match n {
            b"origin" => Singleton,
            b"expect" => Expect,
            _ => Other,
        },
        7 => one_of(&[b"trailer", b"upgrade"], HopByHop),
        8 => one_of(&[b"location", b"mcp-name"], Singleton),
        10 => match n {
            b"connection" => Connection,
            b"keep-alive" => HopByHop,
            b"set-cookie" => SetCookie,
            b"mcp-method" => Singleton,
            _ => Other,
        },
        11 => one_of(&[b"retry-after"], Singleton),
        12 => one_of(&[b"content-type"], Singleton),
        13 => one_of(&[b"authorization", b"last-event-id", b"last-modified", b"x-agent-token"], Singleton),
        14 => match n {
            b"content-length" => ContentLength,
            b"mcp-session-id" => Singleton,
            _ => Other,
        },
        16 => one_of(&[b"proxy-connection"], HopByHop),
        17 => match n {
            b"transfer-encoding" => TransferEncoding,
            b"x-accel-buffering" => Singleton,
            _ => Other,
        },
        18 => one_of(&[b"proxy-authenticate"], HopByHop),
        19 => one_of(&[b"proxy-authorization"], HopByHop),
        20 => one_of(&[b"mcp-protocol-version"], Singleton),
        _ => Other,
    };
    if listed == Other && n.starts_with(b"mcp-param-") {
        Singleton
    } else {
        listed
    }
}

/// A field name the proxy names in its own code: a lowercase token whose
/// `key` and `Class` are worked out when the program is compiled (a name
/// that is not a lowercase token does not compile), so a lookup or a `set`
/// by it neither checks nor lowercases anything per request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Name {
    bytes: &'static [u8],
    key: u32,
    class: Class,
}

impl Name {
    /// `class` must be `classify(bytes)` (the test `known_names_agree` holds
    /// every name below to it).
    const fn new(bytes: &'static [u8], class: Class) -> Name {
        assert!(!bytes.is_empty(), "an empty field name");
        let mut i = 0;
        while i < bytes.len() {
            assert!(TCHAR[bytes[i] as usize] && !bytes[i].is_ascii_uppercase(), "not a lowercase token");
            i += 1;
        }
        let key = (bytes.len() as u32) << 16 | (bytes[0] as u32) << 8 | bytes[bytes.len() - 1] as u32;
        Name { bytes, key, class }
    }
}

/// The names the proxy reads, sets or removes by name.
pub mod name {
    use super::{Class, Name};
    pub const ACCEPT_ENCODING: Name = Name::new(b"accept-encoding", Class::Other);
    pub const AUTHORIZATION: Name = Name::new(b"authorization", Class::Singleton);
    pub const CONTENT_TYPE: Name = Name::new(b"content-type", Class::Singleton);
    pub const DPOP: Name = Name::new(b"dpop", Class::Other);
    pub const DPOP_NONCE: Name = Name::new(b"dpop-nonce", Class::Other);
    pub const HOST: Name = Name::new(b"host", Class::Host);
    pub const LAST_EVENT_ID: Name = Name::new(b"last-event-id", Class::Singleton);
    pub const LOCATION: Name = Name::new(b"location", Class::Singleton);
    pub const MCP_PROTOCOL_VERSION: Name = Name::new(b"mcp-protocol-version", Class::Singleton);
    pub const MCP_SESSION_ID: Name = Name::new(b"mcp-session-id", Class::Singleton);
    pub const ORIGIN: Name = Name::new(b"origin", Class::Singleton);
    pub const X_ACCEL_BUFFERING: Name = Name::new(b"x-accel-buffering", Class::Singleton);
    pub const X_AGENT_TOKEN: Name = Name::new(b"x-agent-token", Class::Singleton);
    /// Every name above (for tests and the fuzz target).
    pub const ALL: &[Name] = &[
        ACCEPT_ENCODING,
        AUTHORIZATION,
        CONTENT_TYPE,
        DPOP,
        DPOP_NONCE,
        HOST,
        LAST_EVENT_ID,
        LOCATION,
        MCP_PROTOCOL_VERSION,
        MCP_SESSION_ID,
        ORIGIN,
        X_ACCEL_BUFFERING,
        X_AGENT_TOKEN,
    ];
}

/// RFC 9110 §5.6.2 `tchar`, as a table.
const TCHAR: [bool; 256] = {
    let mut t = [false; 256];
    let mut i = 0;
    while i < 256 {
        let b = i as u8;
        t[i] = b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'!' | b'#'
                    | b'$'
                    | b'%'
                    | b'&'
                    | b'\''
                    | b'*'
                    | b'+'
                    | b'-'
                    | b'.'
                    | b'^'
                    | b'_'
                    | b'`'
                    | b'|'
                    | b'~'
            );
        i += 1;
    }
    t
};

/// RFC 9110 §5.6.2 `tchar`.
pub fn is_tchar(b: u8) -> bool {
    TCHAR[usize::from(b)]
}

/// A field value as RFC 9110 §5.5 allows it: visible ASCII, SP, HTAB and
/// obs-text; no CR, LF, NUL or other controls; no leading or trailing
/// whitespace (the parser has already trimmed it).
pub fn valid_value(v: &[u8]) -> bool {
    // No early exit: the loop then runs on whole vectors.
    let bad = v.iter().fold(false, |bad, b| bad | ((*b < 0x20 && *b != b'\t') | (*b == 0x7f)));
    let trimmed = !matches!(v.first(), Some(b' ' | b'\t')) && !matches!(v.last(), Some(b' ' | b'\t'));
    trimmed && !bad
}

fn valid_name(n: &[u8]) -> bool {
    !n.is_empty() && n.iter().all(|b| is_tchar(*b))
}

/// The bytes of the lines: in a fixed inline array while they fit (a
/// request allocates nothing), then in a `Vec`. Copies go straight into
/// place, with none of `SmallVec`'s per-call reserve.
#[derive(Clone)]
struct Arena {
    inline: [u8; INLINE_BYTES],
    len: usize,
    /// Holds every byte once the inline array is outgrown.
    heap: Vec<u8>,
}

impl Default for Arena {
    fn default() -> Self {
        Arena { inline: [0; INLINE_BYTES], len: 0, heap: Vec::new() }
    }
}

impl Arena {
    fn data(&self) -> &[u8] {
        if self.heap.is_empty() {
            self.inline.get(..self.len).unwrap_or_default()
        } else {
            &self.heap
        }
    }

    fn data_mut(&mut self) -> &mut [u8] {
        if self.heap.is_empty() {
            self.inline.get_mut(..self.len).unwrap_or_default()
        } else {
            &mut self.heap
        }
    }

    /// Room for `n` more bytes at the end, zeroed or stale: the caller
    /// fills all of it. Returns where it starts.
    #[inline]
    fn grow(&mut self, n: usize) -> &mut [u8] {
        let start = self.len;
        let end = start + n;
        if self.heap.is_empty() && end <= INLINE_BYTES {
            self.len = end;
            return self.inline.get_mut(start..end).unwrap_or_default();
        }
        self.grow_heap(start, end)
    }

    /// `grow` past the inline array: a head of unusual size.
    #[cold]
    fn grow_heap(&mut self, start: usize, end: usize) -> &mut [u8] {
        self.len = end;
        if self.heap.is_empty() {
            self.heap.reserve(end.max(2 * INLINE_BYTES));
            self.heap.extend_from_slice(self.inline.get(..start).unwrap_or_default());
        }
        self.heap.resize(end, 0);
        self.heap.get_mut(start..end).unwrap_or_default()
    }
}

/// A name's length and its first and last bytes, lowercased: equal for
/// names equal ignoring case, and different for nearly all other pairs.
fn key(name: &[u8]) -> u32 {
    let first = name.first().map_or(0, u8::to_ascii_lowercase);
    let last = name.last().map_or(0, u8::to_ascii_lowercase);
    (name.len() as u32) << 16 | u32::from(first) << 8 | u32::from(last)
}

/// `dst = src` ASCII-lowercased, eight bytes at a time: a name is a token,
/// so a byte-wise loop would spend most of its time on loop control. A name
/// of eight bytes or more ends with a word that overlaps the one before it
/// (lowercasing twice changes nothing), so no byte-wise tail is left.
fn lowercase_into(dst: &mut [u8], src: &[u8]) {
    let n = src.len().min(dst.len());
    if n < 8 {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = s.to_ascii_lowercase();
        }
        return;
    }
    let mut at = 0;
    loop {
        let start = at.min(n - 8);
        if let (Some(s), Some(d)) = (src.get(start..start + 8), dst.get_mut(start..start + 8)) {
            let word = s.try_into().map_or(0, u64::from_le_bytes);
            d.copy_from_slice(&lowercase_word(word).to_le_bytes());
        }
        at = start + 8;
        if at >= n {
            return;
        }
    }
}

/// Eight bytes ASCII-lowercased at once.
fn lowercase_word(word: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    // Per byte below 0x80: bit 7 of `upper` is set exactly for `A`-`Z` (no
    // carry crosses a byte, since every sum stays below 0x100).
    let ascii = !word & (ONES * 0x80);
    let low7 = word & (ONES * 0x7f);
    let upper =
        (low7 + ONES * (0x80 - u64::from(b'A'))) & !(low7 + ONES * (0x80 - u64::from(b'Z') - 1)) & ascii;
    word | (upper >> 2)
}

/// One of 64 bits for a name's `key`: a name whose bit is clear in
/// `HeaderList::names` is not in the list, which settles most lookups of an
/// absent name (and the merge of a new one) without walking the lines.
fn key_bit(key: u32) -> u64 {
    1 << (key.wrapping_mul(0x9E37_79B9) >> 26)
}

/// Copies `src` to the front of `dst`; returns what is left of `dst`.
fn put<'a>(dst: &'a mut [u8], src: &[u8]) -> Result<&'a mut [u8], FieldError> {
    let (front, rest) = dst.split_at_mut_checked(src.len()).ok_or(FieldError::TooMany)?;
    front.copy_from_slice(src);
    Ok(rest)
}

/// Where one line lives in `HeaderList::bytes`: `name: value\r\n` from
/// `start`.
#[derive(Clone, Copy, Debug)]
struct Line {
    /// `key(name)`: most lookups are settled by comparing it alone.
    key: u32,
    start: u32,
    name_len: u32,
    value_len: u32,
    class: Class,
}

impl Line {
    fn name(self, bytes: &[u8]) -> &[u8] {
        let start = self.start as usize;
        bytes.get(start..start + self.name_len as usize).unwrap_or_default()
    }
    fn value(self, bytes: &[u8]) -> &[u8] {
        let start = self.start as usize + self.name_len as usize + 2;
        bytes.get(start..start + self.value_len as usize).unwrap_or_default()
    }
    /// The whole line, `\r\n` included.
    fn span(self) -> (usize, usize) {
        let start = self.start as usize;
        (start, start + self.name_len as usize + self.value_len as usize + 4)
    }
    /// Whether this line's name is `name` (any case), `key` being
    /// `key(name)`.
    fn is(self, bytes: &[u8], name: &[u8], key: u32) -> bool {
        self.key == key && self.name_len as usize == name.len() && {
            let own = self.name(bytes);
            own == name || own.eq_ignore_ascii_case(name)
        }
    }
}

/// Where the block of field lines `HeaderList::take_block` copied was
/// received: its address and length, to place each line's slices in it.
pub(crate) struct Block {
    addr: usize,
    len: usize,
}

/// Where a received line's name and value lie in the copied block, when
/// the value starts two bytes after the name and ends two bytes before the
/// block does at the latest (its `\r\n` fits): a `Line` but for its key
/// and class.
struct Placed {
    start: u32,
    name_len: u32,
    value_len: u32,
}

impl Placed {
    fn name(&self) -> std::ops::Range<usize> {
        let start = self.start as usize;
        start..start + self.name_len as usize
    }
    fn value_end(&self) -> usize {
        self.name().end + 2 + self.value_len as usize
    }
}

impl Block {
    fn line(&self, name: &[u8], value: &[u8]) -> Option<Placed> {
        let start = (name.as_ptr() as usize).checked_sub(self.addr)?;
        let value_at = (value.as_ptr() as usize).checked_sub(self.addr)?;
        let value_end = value_at.checked_add(value.len())?;
        if value_at != start.checked_add(name.len())?.checked_add(2)? || value_end.checked_add(2)? > self.len
        {
            return None;
        }
        Some(Placed {
            start: u32::try_from(start).ok()?,
            name_len: u32::try_from(name.len()).ok()?,
            value_len: u32::try_from(value.len()).ok()?,
        })
    }
}

/// Field lines keyed by lowercased name, at most one entry per name.
#[derive(Clone, Default)]
pub struct HeaderList {
    /// Lines as written, names lowercased; dead bytes of replaced lines too.
    bytes: Arena,
    /// The live lines, in the order they are written.
    lines: SmallVec<[Line; INLINE_LINES]>,
    /// `key_bit` of every name that entered (removed ones stay: a set bit
    /// only means "walk the lines").
    names: u64,
    /// `Class::bit` of every class that entered, kept the same way: most
    /// heads have no hop-by-hop, framing or `expect` line, and then
    /// `get_class` and `strip_for_forwarding` walk nothing.
    classes: u16,
}

impl fmt::Debug for HeaderList {
    /// Names only: values may hold credentials.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter().map(|h| String::from_utf8_lossy(h.name))).finish()
    }
}

impl PartialEq for HeaderList {
    /// The same lines in the same order (dead bytes do not count).
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for HeaderList {}

impl HeaderList {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.lines.len()
    }

    /// Empty, keeping the memory: a list reused for the next head costs
    /// no allocation and no zeroing.
    pub fn clear(&mut self) {
        self.lines.clear();
        self.names = 0;
        self.classes = 0;
        self.bytes.len = 0;
        self.bytes.heap.clear();
    }

    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = Header<'_>> {
        self.lines
            .iter()
            .map(|l| Header { name: l.name(self.bytes.data()), value: l.value(self.bytes.data()) })
    }

    fn position(&self, name: &[u8]) -> Option<usize> {
        self.position_keyed(name, key(name))
    }

    /// `position`, `k` being `key(name)`.
    fn position_keyed(&self, name: &[u8], k: u32) -> Option<usize> {
        if self.names & key_bit(k) == 0 {
            return None;
        }
        self.lines.iter().position(|l| l.is(self.bytes.data(), name, k))
    }

    /// The value of the line of class `class` (one of the classes that
    /// name a single field: `Host`, `ContentLength`, `TransferEncoding`,
    /// `Connection`, `Expect`).
    pub(crate) fn get_class(&self, class: Class) -> Option<&[u8]> {
        if self.classes & class.bit() == 0 {
            return None;
        }
        self.lines.iter().find(|l| l.class == class).map(|l| l.value(self.bytes.data()))
    }

    /// The one constructor of a line: appends `name: value\r\n` with the
    /// name lowercased, the value being `value` parts back to back. The
    /// caller has validated both; the caller places the returned `Line`.
    fn push_line<const N: usize>(
        &mut self,
        name: &[u8],
        key: u32,
        value: [&[u8]; N],
    ) -> Result<Line, FieldError> {
        self.push(name, key, None, value)
    }

    /// `push_line`, with the lowercasing and classing skipped when the name
    /// is `known` (then `name` is its bytes). `key` is `key(name)`, which
    /// the caller has already worked out to look the name up. Generic over
    /// the number of value parts, so that the one-part push of nearly every
    /// line has no loop over them.
    fn push<const N: usize>(
        &mut self,
        name: &[u8],
        key: u32,
        known: Option<Name>,
        value: [&[u8]; N],
    ) -> Result<Line, FieldError> {
        let value_len: usize = value.iter().map(|p| p.len()).sum();
        let start = self.bytes.len;
        let total = name.len() + value_len + 4;
        let (Ok(start32), Ok(name_len), Ok(value_len), true) = (
            u32::try_from(start),
            u32::try_from(name.len()),
            u32::try_from(value_len),
            start.checked_add(total).is_some_and(|e| u32::try_from(e).is_ok()),
        ) else {
            return Err(FieldError::TooMany);
        };
        let line = self.bytes.grow(total);
        let (lower, rest) = line.split_at_mut_checked(name.len()).ok_or(FieldError::TooMany)?;
        let class = match known {
            Some(n) => {
                lower.copy_from_slice(name);
                n.class
            }
            None => {
                lowercase_into(lower, name);
                classify(lower)
            }
        };
        let (sep, mut rest) = rest.split_first_chunk_mut::<2>().ok_or(FieldError::TooMany)?;
        *sep = *b": ";
        for part in value {
            rest = put(rest, part)?;
        }
        let end: &mut [u8; 2] = rest.try_into().map_err(|_| FieldError::TooMany)?;
        *end = *b"\r\n";
        self.names |= key_bit(key);
        self.classes |= class.bit();
        Ok(Line { key, start: start32, name_len, value_len, class })
    }

    /// Take in one received field line (any case). Identical repeats
    /// collapse; different values of a list field are joined with `, ` in
    /// arrival order (RFC 9110 §5.3); different values of a singleton are an
    /// error. `set-cookie` cannot be folded: the last value is kept.
    pub fn merge_line(&mut self, name: &[u8], value: &[u8]) -> Result<(), FieldError> {
        self.merge(name, value).map(|_| ())
    }

    /// `merge_line`, telling the caller what the name was.
    fn merge(&mut self, name: &[u8], value: &[u8]) -> Result<Class, FieldError> {
        if !valid_name(name) {
            return Err(FieldError::InvalidName);
        }
        if !valid_value(value) {
            return Err(FieldError::InvalidValue);
        }
        self.merge_valid(name, value)
    }

    /// `merge` of a line httparse returned (default `ParserConfig`, as in
    /// `http::head`): its name is a token and its value holds only HTAB,
    /// visible ASCII, SP and obs-text, with the whitespace around it cut,
    /// so the checks `merge` makes would only repeat httparse's (the test
    /// `httparse_lines_are_valid_lines` holds httparse to that).
    pub(crate) fn merge_parsed(&mut self, name: &[u8], value: &[u8]) -> Result<Class, FieldError> {
        debug_assert!(valid_name(name) && valid_value(value));
        self.merge_valid(name, value)
    }

    /// Copies `block`, the field lines of a head as received (from the
    /// first name to the end of the head), into the list in one piece, so
    /// that `merge_parsed_in` can take each line where it lies instead of
    /// copying it on its own. `None` when the block does not fit the inline
    /// bytes or the list is not empty: then every line goes through
    /// `merge_parsed`.
    pub(crate) fn take_block(&mut self, block: &[u8]) -> Option<Block> {
        // No bytes means no lines: every line has at least its `: \r\n`.
        if self.bytes.len != 0 || block.len() > INLINE_BYTES {
            return None;
        }
        self.bytes.grow(block.len()).copy_from_slice(block);
        Some(Block { addr: block.as_ptr() as usize, len: block.len() })
    }

    /// `merge_parsed` of a line of the block `take_block` copied (`name`
    /// and `value` are slices of that block as received). A line that lies
    /// there as this list writes lines, `name: value\r\n`, and whose name is
    /// new, is lowercased in place and taken as it is; any other line (no
    /// space or more than one after the colon, whitespace after the value,
    /// a bare `\n`, a repeated name) goes through `merge_parsed`, which
    /// writes it anew.
    pub(crate) fn merge_parsed_in(
        &mut self,
        block: &Block,
        name: &[u8],
        value: &[u8],
    ) -> Result<Class, FieldError> {
        let Some(line) = block.line(name, value).filter(|_| self.lines.len() < crate::limits::MAX_FIELDS)
        else {
            return self.merge_parsed(name, value);
        };
        let k = key(name);
        let (name_at, value_end) = (line.name(), line.value_end());
        let laid_out = |data: &[u8]| {
            data.get(name_at.end..name_at.end + 2) == Some(b": ")
                && data.get(value_end..value_end + 2) == Some(b"\r\n")
        };
        if !laid_out(self.bytes.data()) || self.position_keyed(name, k).is_some() {
            return self.merge_parsed(name, value);
        }
        let Some(lower) = self.bytes.data_mut().get_mut(name_at) else {
            return self.merge_parsed(name, value);
        };
        lowercase_into(lower, name);
        let class = classify(lower);
        self.names |= key_bit(k);
        self.classes |= class.bit();
        self.lines.push(Line {
            key: k,
            start: line.start,
            name_len: line.name_len,
            value_len: line.value_len,
            class,
        });
        Ok(class)
    }

    fn merge_valid(&mut self, name: &[u8], value: &[u8]) -> Result<Class, FieldError> {
        let k = key(name);
        let Some(i) = self.position_keyed(name, k) else {
            if self.lines.len() >= crate::limits::MAX_FIELDS {
                return Err(FieldError::TooMany);
            }
            let line = self.push_line(name, k, [value])?;
            self.lines.push(line);
            return Ok(line.class);
        };
        let Some(&old) = self.lines.get(i) else { return Err(FieldError::TooMany) };
        let existing = old.value(self.bytes.data());
        if existing == value {
            return Ok(old.class);
        }
        if old.class.is_singleton() {
            return Err(FieldError::ConflictingSingleton);
        }
        let line = if old.class == Class::SetCookie || existing.is_empty() {
            if old.class == Class::SetCookie {
                log::debug!("set-cookie repeated; keeping the last value");
            }
            self.push_line(name, k, [value])?
        } else if value.is_empty() {
            return Ok(old.class);
        } else {
            let kept = Value::from_slice(existing);
            self.push_line(name, k, [&kept, b", ", value])?
        };
        if let Some(slot) = self.lines.get_mut(i) {
            *slot = line;
        }
        Ok(line.class)
    }

    /// Set `name` to `value`, replacing any existing entry in place. Used for
    /// values the proxy itself decides (credentials, Host), which are valid
    /// by construction; an invalid name or value is refused rather than
    /// written.
    pub fn set(&mut self, name: &[u8], value: &[u8]) -> Result<(), FieldError> {
        if !valid_name(name) {
            return Err(FieldError::InvalidName);
        }
        let k = key(name);
        self.set_at(self.position_keyed(name, k), name, k, None, value)
    }

    /// `set` by a name known when compiled: only the value is checked.
    pub fn set_name(&mut self, name: Name, value: &[u8]) -> Result<(), FieldError> {
        self.set_at(self.position_of(name), name.bytes, name.key, Some(name), value)
    }

    /// The value of `name` (any case).
    pub fn get(&self, name: &[u8]) -> Option<&[u8]> {
        self.value_at(self.position(name))
    }

    /// `get` by a name known when compiled.
    pub fn get_name(&self, name: Name) -> Option<&[u8]> {
        self.value_at(self.position_of(name))
    }

    /// Remove `name` (any case); returns whether it was present.
    pub fn remove(&mut self, name: &[u8]) -> bool {
        self.remove_at(self.position(name))
    }

    /// `remove` by a name known when compiled.
    pub fn remove_name(&mut self, name: Name) -> bool {
        self.remove_at(self.position_of(name))
    }

    /// Where the line named `name` is: stored names are lowercase, as
    /// `name` is, so no case is folded.
    fn position_of(&self, name: Name) -> Option<usize> {
        if self.names & key_bit(name.key) == 0 {
            return None;
        }
        let bytes = self.bytes.data();
        self.lines.iter().position(|l| l.key == name.key && l.name(bytes) == name.bytes)
    }

    /// The line `name: value` (its name checked, `known` or not, as `push`
    /// takes it) in place of the line at `at`, or last. Inlined into both
    /// callers, so that `push` is compiled for a known name and for any
    /// name apart (shared, it cost 90 instructions per GET).
    #[inline(always)]
    fn set_at(
        &mut self,
        at: Option<usize>,
        name: &[u8],
        key: u32,
        known: Option<Name>,
        value: &[u8],
    ) -> Result<(), FieldError> {
        if !valid_value(value) {
            return Err(FieldError::InvalidValue);
        }
        let line = self.push(name, key, known, [value])?;
        match at.and_then(|i| self.lines.get_mut(i)) {
            Some(slot) => *slot = line,
            None => self.lines.push(line),
        }
        Ok(())
    }

    fn value_at(&self, at: Option<usize>) -> Option<&[u8]> {
        at.and_then(|i| self.lines.get(i)).map(|l| l.value(self.bytes.data()))
    }

    /// At most one line per name: removing the one at `at` removes the name.
    fn remove_at(&mut self, at: Option<usize>) -> bool {
        match at.filter(|&i| i < self.lines.len()) {
            Some(i) => {
                self.lines.remove(i);
                true
            }
            None => false,
        }
    }

    /// Drop hop-by-hop fields: every field named in `Connection`
    /// (RFC 9110 §7.6.1) and the fixed list, in one pass.
    pub fn strip_hop_by_hop(&mut self) {
        self.strip_for_forwarding(&[]);
    }

    /// `strip_hop_by_hop`, also dropping the lines of the classes in
    /// `also` (the framing fields the writer re-derives), in the same pass.
    pub(crate) fn strip_for_forwarding(&mut self, also: &[Class]) {
        let droppable = also.iter().fold(HOP_BY_HOP_BITS, |bits, c| bits | c.bit());
        if self.classes & droppable == 0 {
            return;
        }
        let mut named: SmallVec<[(&[u8], u32); 4]> = SmallVec::new();
        let bytes = self.bytes.data();
        // One slice for the walk: each index into the `SmallVec` itself
        // would ask again whether it has spilled.
        let lines = self.lines.as_mut_slice();
        if let Some(v) = lines.iter().find(|l| l.class == Class::Connection).map(|l| l.value(bytes)) {
            named.extend(list_elements(v).map(|t| (t, key(t))));
        }
        let drop = |l: Line| l.class.bit() & droppable != 0 || named.iter().any(|(t, k)| l.is(bytes, t, *k));
        let mut kept = 0;
        for i in 0..lines.len() {
            let Some(&l) = lines.get(i) else { break };
            if !drop(l) {
                if kept != i {
                    if let Some(slot) = lines.get_mut(kept) {
                        *slot = l;
                    }
                }
                kept += 1;
            }
        }
        self.lines.truncate(kept);
    }

    /// Append every field as `name: value\r\n`. Names are unique by
    /// construction, so this cannot emit a duplicate. Lines that lie back to
    /// back are copied as one run.
    pub fn write_to(&self, out: &mut Vec<u8>) {
        let mut run: Option<(usize, usize)> = None;
        for l in &self.lines {
            let (start, end) = l.span();
            run = match run {
                Some((a, b)) if b == start => Some((a, end)),
                Some((a, b)) => {
                    out.extend_from_slice(self.bytes.data().get(a..b).unwrap_or_default());
                    Some((start, end))
                }
                None => Some((start, end)),
            };
        }
        if let Some((a, b)) = run {
            out.extend_from_slice(self.bytes.data().get(a..b).unwrap_or_default());
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
    fn known_names_agree() {
        for n in name::ALL {
            assert_eq!(classify(n.bytes), n.class, "{:?}", String::from_utf8_lossy(n.bytes));
            assert_eq!(key(n.bytes), n.key, "{:?}", String::from_utf8_lossy(n.bytes));
        }
    }

    #[test]
    fn known_names_find_lines_in_any_case() {
        let mut l = list(&[("HOST", "client"), ("Authorization", "Bearer client"), ("Origin", "o")]).unwrap();
        assert_eq!(l.get_name(name::HOST), Some(&b"client"[..]));
        assert_eq!(l.get_name(name::X_AGENT_TOKEN), None);
        l.set_name(name::HOST, b"up:1").unwrap();
        l.set_name(name::AUTHORIZATION, b"Bearer tok").unwrap();
        l.set_name(name::X_AGENT_TOKEN, b"tok").unwrap();
        assert!(l.remove_name(name::ORIGIN));
        assert!(!l.remove_name(name::ORIGIN));
        assert_eq!(written(&l), "host: up:1\r\nauthorization: Bearer tok\r\nx-agent-token: tok\r\n");
        assert_eq!(l.set_name(name::HOST, b"a\r\nx: y"), Err(FieldError::InvalidValue));
        assert_eq!(l.get_name(name::HOST), Some(&b"up:1"[..]));
        // A line set by a known name is found by the generic lookups, and
        // merging the same name afterwards still makes one line.
        assert_eq!(l.get(b"X-Agent-Token"), Some(&b"tok"[..]));
        assert_eq!(l.merge_line(b"X-AGENT-TOKEN", b"other"), Err(FieldError::ConflictingSingleton));
        assert_eq!(l.len(), 3);
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
        let elements: Vec<&[u8]> = list_elements(l.get(b"connection").unwrap()).collect();
        assert_eq!(elements, [&b"Keep-Alive"[..], b"close"]);
        assert_eq!(trim_ows(b" \t a b \t"), b"a b");
    }
    #[test]
    fn names_absent_or_removed_are_answered_alike() {
        let mut l = list(&[("Host", "a"), ("X-One", "1"), ("mcp-session-id", "s")]).unwrap();
        for absent in [&b"x-two"[..], b"origin", b"mcp-param-sender", b"", b"HOST-"] {
            assert_eq!(l.get(absent), None);
        }
        assert!(l.remove(b"x-one"));
        assert_eq!(l.get(b"X-ONE"), None);
        l.set(b"x-one", b"2").unwrap();
        assert_eq!(l.get(b"x-one"), Some(&b"2"[..]));
        assert_eq!(l.get(b"MCP-Session-Id"), Some(&b"s"[..]));
    }

    #[test]
    fn classify_agrees_with_the_lists() {
        for name in SINGLETONS
            .iter()
            .chain(HOP_BY_HOP)
            .chain([&b"set-cookie"[..], b"mcp-param-sender", b"expect", b"x-other"].iter())
        {
            let c = classify(name);
            assert_eq!(c.is_singleton(), is_singleton(name), "{}", String::from_utf8_lossy(name));
            assert_eq!(c.is_hop_by_hop(), HOP_BY_HOP.contains(name), "{}", String::from_utf8_lossy(name));
        }
        for (name, class) in [
            (&b"host"[..], Class::Host),
            (b"connection", Class::Connection),
            (b"transfer-encoding", Class::TransferEncoding),
            (b"set-cookie", Class::SetCookie),
            (b"content-length", Class::ContentLength),
            (b"expect", Class::Expect),
            (b"mcp-param-x", Class::Singleton),
            (b"mcp-param-a-much-longer-key", Class::Singleton),
            (b"accept", Class::Other),
            (b"hosts", Class::Other),
            (b"t", Class::Other),
            (b"", Class::Other),
        ] {
            assert_eq!(classify(name), class, "{}", String::from_utf8_lossy(name));
        }
    }

    #[test]
    fn lowercase_into_lowers_ascii_letters_only() {
        // Every byte value at every position of the eight-byte words and
        // of the tail, against the byte-wise definition.
        for len in [0usize, 1, 7, 8, 9, 15, 16, 23] {
            for b in 0..=255u8 {
                for at in 0..len {
                    let mut src: Vec<u8> = (0..len).map(|i| b"aZ-09_Mx"[i % 8]).collect();
                    src[at] = b;
                    let mut dst = vec![0u8; len];
                    lowercase_into(&mut dst, &src);
                    assert_eq!(dst, src.to_ascii_lowercase(), "byte {b:#x} at {at} of {len}");
                }
            }
        }
    }

    /// `merge_parsed` skips the name and value checks because httparse
    /// (default config) already makes them: every line it accepts, from
    /// heads built of hostile bytes, must pass `valid_name` and
    /// `valid_value` (trimmed).
    #[test]
    fn httparse_lines_are_valid_lines() {
        // Lines shaped like fields (name, colon, value), each part built of
        // pieces that are mostly harmless and sometimes hostile.
        const NAME: &[&[u8]] =
            &[b"a", b"X-Y", b"Mcp-Session-Id", b"!#$%&'*+.^_`|~", b" ", b"\t", b"\0", b"(", b"\x80"];
        const VALUE: &[&[u8]] = &[
            b"a", b"v w", b" ", b"\t", b":", b"\r", b"\n", b"\0", b"\x7f", b"\x80", b"\xff", b"\x01",
            b"\x0b", b",", b"\"", b"(", b"@", b"\\", b"",
        ];
        let mut rng = crate::test_rng::Rng(0x4A77_9A25);
        let mut accepted = 0;
        for _ in 0..100_000 {
            let mut fields = Vec::new();
            for _ in 0..1 + rng.below(3) {
                for _ in 0..1 + rng.below(2) {
                    fields.extend_from_slice(rng.pick(NAME));
                }
                fields.push(b':');
                for _ in 0..rng.below(4) {
                    fields.extend_from_slice(rng.pick(VALUE));
                }
                fields.extend_from_slice(b"\r\n");
            }
            for start in [&b"GET / HTTP/1.1\r\n"[..], b"HTTP/1.1 200 OK\r\n"] {
                let raw = [start, &fields, b"\r\n"].concat();
                let mut slots = [httparse::EMPTY_HEADER; 8];
                let parsed: Vec<httparse::Header<'_>> = if start.starts_with(b"GET") {
                    let mut req = httparse::Request::new(&mut slots);
                    match req.parse(&raw) {
                        Ok(httparse::Status::Complete(_)) => req.headers.to_vec(),
                        _ => continue,
                    }
                } else {
                    let mut resp = httparse::Response::new(&mut slots);
                    match resp.parse(&raw) {
                        Ok(httparse::Status::Complete(_)) => resp.headers.to_vec(),
                        _ => continue,
                    }
                };
                for h in parsed {
                    accepted += 1;
                    assert!(valid_name(h.name.as_bytes()), "{raw:?}");
                    assert!(valid_value(h.value), "{raw:?}");
                }
            }
        }
        // The generator reaches accepted lines, not only refusals.
        assert!(accepted > 10_000, "{accepted}");
    }

    /// The list as it was first written: a vector of owned lowercase
    /// names and values, each operation a plain scan. The fast list must
    /// agree with it.
    mod naive {
        use super::super::{is_singleton, list_elements, valid_name, valid_value, FieldError, HOP_BY_HOP};

        #[derive(Default)]
        pub struct List(pub Vec<(Vec<u8>, Vec<u8>)>);

        impl List {
            fn pos(&self, name: &[u8]) -> Option<usize> {
                self.0.iter().position(|(n, _)| n.eq_ignore_ascii_case(name))
            }
            pub fn merge_line(&mut self, name: &[u8], value: &[u8]) -> Result<(), FieldError> {
                if !valid_name(name) {
                    return Err(FieldError::InvalidName);
                }
                if !valid_value(value) {
                    return Err(FieldError::InvalidValue);
                }
                let lower = name.to_ascii_lowercase();
                let Some(i) = self.pos(name) else {
                    if self.0.len() >= crate::limits::MAX_FIELDS {
                        return Err(FieldError::TooMany);
                    }
                    self.0.push((lower, value.to_vec()));
                    return Ok(());
                };
                let existing = &mut self.0[i].1;
                if existing.as_slice() == value {
                    return Ok(());
                }
                if is_singleton(&lower) {
                    return Err(FieldError::ConflictingSingleton);
                }
                if lower == b"set-cookie" {
                    *existing = value.to_vec();
                } else if !value.is_empty() {
                    if !existing.is_empty() {
                        existing.extend_from_slice(b", ");
                    }
                    existing.extend_from_slice(value);
                }
                Ok(())
            }
            pub fn set(&mut self, name: &[u8], value: &[u8]) -> Result<(), FieldError> {
                if !valid_name(name) {
                    return Err(FieldError::InvalidName);
                }
                if !valid_value(value) {
                    return Err(FieldError::InvalidValue);
                }
                match self.pos(name) {
                    Some(i) => self.0[i].1 = value.to_vec(),
                    None => self.0.push((name.to_ascii_lowercase(), value.to_vec())),
                }
                Ok(())
            }
            pub fn remove(&mut self, name: &[u8]) -> bool {
                let before = self.0.len();
                self.0.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
                before != self.0.len()
            }
            pub fn strip_hop_by_hop(&mut self) {
                if let Some(i) = self.pos(b"connection") {
                    let named = self.0.remove(i).1;
                    for t in list_elements(&named) {
                        self.remove(t);
                    }
                }
                self.0.retain(|(n, _)| !HOP_BY_HOP.contains(&n.as_slice()));
            }
            pub fn written(&self) -> Vec<u8> {
                let mut out = Vec::new();
                for (n, v) in &self.0 {
                    out.extend_from_slice(n);
                    out.extend_from_slice(b": ");
                    out.extend_from_slice(v);
                    out.extend_from_slice(b"\r\n");
                }
                out
            }
        }
    }

    #[test]
    fn generated_operations_agree_with_the_naive_list() {
        const NAMES: &[&str] = &[
            "Host",
            "host",
            "Accept",
            "ACCEPT",
            "Connection",
            "X-Hop",
            "x-hop",
            "Mcp-Session-Id",
            "mcp-param-sender",
            "Set-Cookie",
            "Transfer-Encoding",
            "TE",
            "Keep-Alive",
            "Authorization",
            "x-a",
            "Bad Name",
            "",
            "proxy-authorization",
            "Content-Length",
        ];
        const VALUES: &[&str] =
            &["", "a", "b", "a, b", "X-Hop", "keep-alive, x-hop", "close", " a", "a\rb", "\u{7f}", "v\tw"];
        let mut rng = crate::test_rng::Rng(0x4EAD_E125);
        for _ in 0..3000 {
            let (mut fast, mut slow) = (HeaderList::new(), naive::List::default());
            for _ in 0..rng.below(24) {
                let (name, value) = (rng.pick(NAMES).as_bytes(), rng.pick(VALUES).as_bytes());
                match rng.below(8) {
                    0 => assert_eq!(fast.set(name, value), slow.set(name, value)),
                    1 => assert_eq!(fast.remove(name), slow.remove(name)),
                    2 => {
                        fast.strip_hop_by_hop();
                        slow.strip_hop_by_hop();
                    }
                    _ => assert_eq!(fast.merge_line(name, value), slow.merge_line(name, value)),
                }
                assert_eq!(
                    fast.get(name),
                    slow.0.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_slice())
                );
                assert_eq!(fast.len(), slow.0.len());
            }
            assert_eq!(written(&fast).into_bytes(), slow.written());
        }
    }
}

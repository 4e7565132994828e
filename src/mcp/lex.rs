//! The one JSON grammar of the proxy (RFC 8259, plus Python's `NaN`,
//! `Infinity` and `-Infinity`, which the Python servers it fronts read and
//! write). Two readers share it:
//!
//! - [`Lexer`], resumable: fed a text in any pieces, it yields the same
//!   tokens with their byte spans (a token a piece's end cuts comes in
//!   parts). The answer reader (`version_scan.rs`) reads answers with it as
//!   they stream past.
//! - [`Cursor`], the whole-slice fast path, for a text given whole: recursive
//!   descent with no state kept between tokens, so that the stamp's hot path
//!   does not pay for resumability. `json.rs` walks request bodies and
//!   answers whole in one read with it.
//!
//! Both take strings, numbers and literals from the same functions (`string`,
//! `scalar`), and hold the same rules whatever the split: strings are UTF-8
//! (RFC 3629, checked across pieces), without control characters, with
//! valid escapes; every number and literal is checked whether or not
//! anybody keeps it; containers nest at most `MAX_JSON_DEPTH` deep (a bit
//! per level, no recursion); JSON whitespace is `json::is_ws`. Their
//! structure rules are held to each other, to every split and to serde_json
//! by this module's tests and the `json_lexer` fuzz target. Strings, the bulk
//! of any body, are read a word at a time in both.
//!
//! Pure: no I/O, no allocation.

use memchr::memchr2;

use super::json::{is_ws, Key, Kind, ScanError, Value};
use crate::limits::MAX_JSON_DEPTH;

/// What a token is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tok {
    /// `{` (`obj`) or `[`.
    Open { obj: bool },
    /// `}` (`obj`) or `]`.
    Close { obj: bool },
    /// An object's key (quotes included in its span); `escaped`: a
    /// backslash is in it (so far, for a part).
    Key { escaped: bool },
    /// A string, number or literal value. A string's `escaped` is as a key's.
    Scalar(Kind),
}

/// A token, or a part of one: its bytes are `input[start..end]` of the piece
/// it was read from. A key, string or scalar that a piece's end cuts comes
/// as parts: `first` on its first, `last` on the one that ends it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Token {
    pub tok: Tok,
    pub start: usize,
    pub end: usize,
    pub first: bool,
    pub last: bool,
}

/// What is due next, between tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Want {
    /// A value: the top one, after `:`, after `,` in an array.
    Value,
    /// After `[`: a value or `]`.
    ValueOrClose,
    /// After `{`: a key or `}`.
    KeyOrClose,
    /// After `,` in an object.
    Key,
    /// After a key.
    Colon,
    /// After a value in a container: `,` or its close.
    AfterValue,
    /// The top value is whole: only whitespace may follow.
    End,
}

/// A token the last piece ended inside.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Inside {
    No,
    Str { key: bool, escaped: bool, esc: Esc, utf8: Utf8 },
    Scalar { kind: Kind, check: ScalarCheck },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Esc {
    No,
    Backslash,
    /// Hex digits still due after `\u`.
    Hex(u8),
}

/// Words of the bit stack that remembers, per open container, whether it is
/// an object (1) or an array (0).
const STACK_WORDS: usize = MAX_JSON_DEPTH / 64 + 1;

/// What [`Lexer::skip_container`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Skip {
    /// No array or object is due next.
    NotDue,
    /// One was read whole: an object (`obj`) or an array.
    Skipped { obj: bool },
    /// One is due, but this piece does not hold it whole (or it is not JSON).
    NotWhole,
}

/// A lexer over one JSON value. See the module's doc.
#[derive(Clone, Debug)]
pub struct Lexer {
    want: Want,
    inside: Inside,
    depth: usize,
    objects: [u64; STACK_WORDS],
    /// The input is one piece, the whole text.
    whole: bool,
}

impl Lexer {
    /// A lexer given the whole text in one `next` input.
    pub fn whole() -> Lexer {
        Lexer::new(true)
    }

    /// A lexer given the text in pieces, each to `next` until it says
    /// `None`, then [`Lexer::finish`] at the text's end.
    pub fn pieces() -> Lexer {
        Lexer::new(false)
    }

    fn new(whole: bool) -> Lexer {
        Lexer { want: Want::Value, inside: Inside::No, depth: 0, objects: [0; STACK_WORDS], whole }
    }

    /// The top value is whole (only whitespace may follow).
    pub fn done(&self) -> bool {
        self.want == Want::End && self.inside == Inside::No
    }

    /// Nothing of the text is read yet but whitespace.
    pub fn at_start(&self) -> bool {
        self.want == Want::Value && self.depth == 0 && self.inside == Inside::No
    }

    /// The top value was read by the whole-slice scanner (`Cursor`): only
    /// whitespace may follow.
    pub fn end_of_value(&mut self) {
        (self.want, self.inside, self.depth) = (Want::End, Inside::No, 0);
    }

    /// Within a scalar value at the top, cut by the last piece's end.
    pub fn in_top_scalar(&self) -> bool {
        self.depth == 0 && matches!(self.inside, Inside::Scalar { .. })
    }

    /// The next token of `input` from `*pos` (moved past it), or `None` when
    /// the piece is read to its end (a lexer given the whole text says so
    /// when the text ends where a token may: `done` tells whether it ended
    /// the value).
    #[inline(always)]
    pub fn next(&mut self, input: &[u8], pos: &mut usize) -> Result<Option<Token>, ScanError> {
        if self.inside != Inside::No {
            return self.resume(input, pos);
        }
        loop {
            let Some(&c) = input.get(*pos) else { return Ok(None) };
            if is_ws(c) {
                *pos += 1;
                continue;
            }
            let start = *pos;
            let err = Err(ScanError::Syntax { offset: start });
            match self.want {
                Want::Colon => {
                    if c != b':' {
                        return err;
                    }
                    *pos += 1;
                    self.want = Want::Value;
                }
                Want::AfterValue => match c {
                    b',' => {
                        *pos += 1;
                        self.want = if self.top_is_object() { Want::Key } else { Want::Value };
                    }
                    b'}' | b']' if (c == b'}') == self.top_is_object() => {
                        return Ok(Some(self.close(start, pos)))
                    }
                    _ => return err,
                },
                Want::End => return err,
                Want::KeyOrClose | Want::Key => match c {
                    b'"' => return self.string(input, pos, true).map(Some),
                    b'}' if self.want == Want::KeyOrClose => return Ok(Some(self.close(start, pos))),
                    _ => return err,
                },
                Want::Value | Want::ValueOrClose => {
                    return match c {
                        b'"' => self.string(input, pos, false).map(Some),
                        b'{' | b'[' => {
                            if self.depth >= MAX_JSON_DEPTH {
                                return Err(ScanError::TooDeep { offset: start });
                            }
                            let obj = c == b'{';
                            if let Some(w) = self.objects.get_mut(self.depth / 64) {
                                let bit = 1u64 << (self.depth % 64);
                                *w = if obj { *w | bit } else { *w & !bit };
                            }
                            self.depth += 1;
                            *pos += 1;
                            self.want = if obj { Want::KeyOrClose } else { Want::ValueOrClose };
                            Ok(Some(whole_token(Tok::Open { obj }, start, *pos)))
                        }
                        b']' if self.want == Want::ValueOrClose => Ok(Some(self.close(start, pos))),
                        _ => self.scalar(input, pos).map(Some),
                    };
                }
            }
        }
    }

    /// Where a value is due (or a key's colon, then the value) and `input`
    /// holds a whole array or object from `*pos` (after whitespace), reads
    /// it with the whole-slice scanner and moves past it: a reader that
    /// needs nothing inside it gets no tokens for it. Nothing is read
    /// (`NotDue`, `NotWhole`) when no container is due, or this piece does
    /// not hold it whole, or it is not JSON: the tokens then read it and
    /// say where.
    pub fn skip_container(&mut self, input: &[u8], pos: &mut usize) -> Skip {
        if self.inside != Inside::No || !matches!(self.want, Want::Value | Want::ValueOrClose | Want::Colon) {
            return Skip::NotDue;
        }
        let mut cur = Cursor { b: input, pos: *pos };
        if self.want == Want::Colon && cur.colon().is_err() {
            return Skip::NotDue;
        }
        cur.ws();
        let obj = match cur.peek() {
            Some(b'{') => true,
            Some(b'[') => false,
            _ => return Skip::NotDue,
        };
        match cur.container(self.depth) {
            Ok(_) => {
                *pos = cur.pos;
                self.after_value();
                Skip::Skipped { obj }
            }
            Err(_) => Skip::NotWhole,
        }
    }

    /// The text is over: a scalar at the top that the last piece ended in
    /// is whole (its token's last part, empty, is returned); anything else
    /// unfinished is an error at `at`, the text's length.
    pub fn finish(&mut self, at: usize) -> Result<Option<Token>, ScanError> {
        match self.inside {
            Inside::Scalar { kind, check } if check.complete() => {
                self.inside = Inside::No;
                self.after_value();
                Ok(Some(Token { tok: Tok::Scalar(kind), start: 0, end: 0, first: false, last: true }))
            }
            Inside::No if self.want == Want::End => Ok(None),
            _ => Err(ScanError::Syntax { offset: at }),
        }
    }

    fn top_is_object(&self) -> bool {
        let Some(top) = self.depth.checked_sub(1) else { return false };
        self.objects.get(top / 64).is_some_and(|w| w & (1u64 << (top % 64)) != 0)
    }

    fn after_value(&mut self) {
        self.want = if self.depth == 0 { Want::End } else { Want::AfterValue };
    }

    fn close(&mut self, start: usize, pos: &mut usize) -> Token {
        let obj = self.top_is_object();
        self.depth = self.depth.saturating_sub(1);
        *pos += 1;
        self.after_value();
        whole_token(Tok::Close { obj }, start, *pos)
    }

    fn ended(&mut self, key: bool) {
        if key {
            self.want = Want::Colon;
        } else {
            self.after_value();
        }
    }

    /// A string (`key`: an object's key) from its opening quote at `*pos`.
    #[inline(always)]
    fn string(&mut self, input: &[u8], pos: &mut usize, key: bool) -> Result<Token, ScanError> {
        let start = *pos;
        let end = string(input, pos, self.whole)?;
        let part = Part { start, key, escaped: end.escaped(), first: true };
        Ok(self.string_end(part, end, *pos))
    }

    /// A string's token, or its part when the piece's end cut it.
    fn string_end(&mut self, part: Part, end: StrEnd, at: usize) -> Token {
        match end {
            StrEnd::Closed { .. } => {
                self.ended(part.key);
                part.token(at, true)
            }
            StrEnd::Cut { escaped, esc, utf8 } => {
                self.inside = Inside::Str { key: part.key, escaped, esc, utf8 };
                part.token(at, false)
            }
        }
    }

    /// A number or literal from its first byte at `*pos`; it ends at the
    /// first byte that cannot continue one, which is then read as what
    /// follows it.
    fn scalar(&mut self, input: &[u8], pos: &mut usize) -> Result<Token, ScanError> {
        let start = *pos;
        let (kind, check) = scalar_start(input, pos)?;
        self.scalar_rest(input, pos, kind, check, start, true)
    }

    fn scalar_rest(
        &mut self,
        input: &[u8],
        pos: &mut usize,
        kind: Kind,
        check: ScalarCheck,
        start: usize,
        first: bool,
    ) -> Result<Token, ScanError> {
        let check = scalar_run(input, pos, check)?;
        let last = *pos < input.len() || self.whole;
        if !last {
            self.inside = Inside::Scalar { kind, check };
            return Ok(Token { tok: Tok::Scalar(kind), start, end: *pos, first, last: false });
        }
        if !check.complete() {
            return Err(ScanError::Syntax { offset: *pos });
        }
        // A value at the top is whole at its first other byte only when
        // that byte may follow a value (whitespace, structure, a quote), as
        // serde_json's stream reader requires: the reader that decides a
        // body once its value is whole reads no further.
        let follows = |b: u8| is_ws(b) || matches!(b, b'"' | b'[' | b']' | b'{' | b'}' | b',' | b':');
        if self.depth == 0 && input.get(*pos).is_some_and(|&b| !follows(b)) {
            return Err(ScanError::Syntax { offset: *pos });
        }
        self.inside = Inside::No;
        self.after_value();
        Ok(Token { tok: Tok::Scalar(kind), start, end: *pos, first, last: true })
    }

    /// The rest of a token the last piece ended inside.
    #[cold]
    fn resume(&mut self, input: &[u8], pos: &mut usize) -> Result<Option<Token>, ScanError> {
        if *pos >= input.len() {
            return Ok(None);
        }
        let start = *pos;
        match self.inside {
            Inside::No => Ok(None),
            Inside::Scalar { kind, check } => {
                self.scalar_rest(input, pos, kind, check, start, false).map(Some)
            }
            Inside::Str { key, escaped, mut esc, mut utf8 } => {
                // A character or an escape the piece's end cut, a byte at a
                // time; then the word-at-a-time path.
                while esc != Esc::No || utf8.due() {
                    let Some(&b) = input.get(*pos) else {
                        self.inside = Inside::Str { key, escaped, esc, utf8 };
                        let part = Part { start, key, escaped, first: false };
                        return Ok(Some(part.token(*pos, false)));
                    };
                    if utf8.due() {
                        if !utf8.next(b) {
                            return Err(ScanError::InvalidUtf8 { offset: *pos });
                        }
                    } else {
                        esc = match esc {
                            Esc::Backslash => match ESCAPES.get(usize::from(b)).copied().unwrap_or(0) {
                                SIMPLE_ESCAPE => Esc::No,
                                UNICODE_ESCAPE => Esc::Hex(4),
                                _ => return Err(ScanError::Syntax { offset: *pos }),
                            },
                            Esc::Hex(n) if b.is_ascii_hexdigit() => {
                                if n > 1 {
                                    Esc::Hex(n - 1)
                                } else {
                                    Esc::No
                                }
                            }
                            _ => return Err(ScanError::Syntax { offset: *pos }),
                        };
                    }
                    *pos += 1;
                }
                self.inside = Inside::No;
                let text = *pos;
                let end = string_rest(input, pos, text, escaped, false)?;
                let part = Part { start, key, escaped: end.escaped(), first: false };
                Ok(Some(self.string_end(part, end, *pos)))
            }
        }
    }
}

/// A string being read: where its bytes began in this piece, and what it
/// is so far.
#[derive(Clone, Copy)]
struct Part {
    start: usize,
    key: bool,
    escaped: bool,
    first: bool,
}

impl Part {
    fn token(self, end: usize, last: bool) -> Token {
        let tok = if self.key {
            Tok::Key { escaped: self.escaped }
        } else {
            Tok::Scalar(Kind::String { escaped: self.escaped })
        };
        Token { tok, start: self.start, end, first: self.first, last }
    }
}

fn whole_token(tok: Tok, start: usize, end: usize) -> Token {
    Token { tok, start, end, first: true, last: true }
}

/// The whole-slice fast path: a text given whole, read by recursive
/// descent under the same rules as `Lexer` (its strings and scalars are
/// the same functions; the structure is checked where the caller walks it
/// and skipped a bit per level where it does not), with no state kept
/// between tokens. `json.rs` walks a body's messages with it.
pub(super) struct Cursor<'a> {
    pub(super) b: &'a [u8],
    /// Invariant: `pos <= b.len()`.
    pub(super) pos: usize,
}

impl Cursor<'_> {
    pub(super) fn peek(&self) -> Option<u8> {
        self.b.get(self.pos).copied()
    }

    pub(super) fn err(&self) -> ScanError {
        ScanError::Syntax { offset: self.pos }
    }

    /// RFC 8259 §2: the four whitespace bytes and no others.
    pub(super) fn ws(&mut self) {
        while self.peek().is_some_and(is_ws) {
            self.pos += 1;
        }
    }

    pub(super) fn expect(&mut self, c: u8) -> Result<(), ScanError> {
        if self.peek() == Some(c) {
            self.pos += 1;
            Ok(())
        } else {
            Err(self.err())
        }
    }

    /// Only whitespace may follow the top-level value.
    pub(super) fn end(&mut self) -> Result<(), ScanError> {
        self.ws();
        if self.pos == self.b.len() {
            Ok(())
        } else {
            Err(self.err())
        }
    }

    /// Skips a string starting at its opening quote; returns whether it
    /// holds an escape. Inlined where strings are read, with the position
    /// in a register (`plain_run`); the rest is `string_rest`'s.
    #[inline(always)]
    pub(super) fn string(&mut self) -> Result<bool, ScanError> {
        self.expect(b'"')?;
        let from = self.pos;
        match plain_run(self.b, from) {
            Ok(end) => {
                self.pos = end;
                Ok(false)
            }
            Err(at) => {
                self.pos = at;
                self.string_rest(from)
            }
        }
    }

    #[inline(never)]
    fn string_rest(&mut self, from: usize) -> Result<bool, ScanError> {
        match string_rest(self.b, &mut self.pos, from, false, true)? {
            StrEnd::Closed { escaped } => Ok(escaped),
            StrEnd::Cut { .. } => Err(ScanError::Syntax { offset: self.b.len() }),
        }
    }

    /// A string, number or literal: the lexer's.
    pub(super) fn scalar(&mut self) -> Result<Kind, ScanError> {
        match self.peek() {
            Some(b'"') => Ok(Kind::String { escaped: self.string()? }),
            _ => scalar(self.b, &mut self.pos),
        }
    }

    /// Skips one value inside `depth` open containers. Inlined, with the
    /// string fast path, where members are read: most values of a request
    /// are strings, and a call per value costs more than a short string.
    #[inline(always)]
    pub(super) fn value(&mut self, depth: usize) -> Result<Value, ScanError> {
        let start = self.pos;
        let kind = match self.peek() {
            Some(b'"') => Kind::String { escaped: self.string()? },
            Some(b'{' | b'[') => self.container(depth)?,
            _ => self.scalar()?,
        };
        Ok(Value { start, end: self.pos, kind })
    }

    /// What follows an array element or an object member: whitespace, then
    /// `,` and the whitespace after it (another element follows: true) or
    /// the container's `close` (consumed: false).
    #[inline(always)]
    pub(super) fn after_element(&mut self, close: u8) -> Result<bool, ScanError> {
        self.ws();
        match self.peek() {
            Some(b',') => {
                self.pos += 1;
                self.ws();
                Ok(true)
            }
            Some(c) if c == close => {
                self.pos += 1;
                Ok(false)
            }
            _ => Err(self.err()),
        }
    }

    /// A key, its colon and the whitespace up to the member's value.
    #[inline(always)]
    pub(super) fn member_key(&mut self) -> Result<(), ScanError> {
        self.string()?;
        self.colon()
    }

    /// The colon after a key, with the whitespace around it. Most bodies
    /// have none before it, and then this is one test.
    #[inline(always)]
    pub(super) fn colon(&mut self) -> Result<(), ScanError> {
        if self.peek() == Some(b':') {
            self.pos += 1;
        } else {
            self.ws();
            self.expect(b':')?;
        }
        self.ws();
        Ok(())
    }

    /// Skips the array or object at `pos` without recursion, so that no
    /// input can overflow the stack; one bit per open container says
    /// whether it is an object.
    pub(super) fn container(&mut self, depth: usize) -> Result<Kind, ScanError> {
        let outer_is_object = self.peek() == Some(b'{');
        let mut stack = [0u64; STACK_WORDS];
        let mut level = 0usize;
        let mut outer_empty = false;
        'value: loop {
            match self.peek() {
                Some(c @ (b'{' | b'[')) => {
                    if depth + level >= MAX_JSON_DEPTH {
                        return Err(ScanError::TooDeep { offset: self.pos });
                    }
                    let is_object = c == b'{';
                    if let Some(w) = stack.get_mut(level / 64) {
                        let bit = 1u64 << (level % 64);
                        *w = if is_object { *w | bit } else { *w & !bit };
                    }
                    level += 1;
                    self.pos += 1;
                    self.ws();
                    let close = if is_object { b'}' } else { b']' };
                    if self.peek() != Some(close) {
                        if is_object {
                            self.member_key()?;
                        }
                        continue 'value;
                    }
                    self.pos += 1;
                    level -= 1;
                    outer_empty = level == 0;
                }
                _ => {
                    self.scalar()?;
                }
            }
            // A value has ended inside `level` open containers.
            while level > 0 {
                self.ws();
                let top = level - 1;
                let is_object = stack.get(top / 64).is_some_and(|w| w & (1u64 << (top % 64)) != 0);
                match self.peek() {
                    Some(b',') => {
                        self.pos += 1;
                        self.ws();
                        if is_object {
                            self.member_key()?;
                        }
                        continue 'value;
                    }
                    Some(b'}') if is_object => {}
                    Some(b']') if !is_object => {}
                    _ => return Err(self.err()),
                }
                self.pos += 1;
                level -= 1;
            }
            break;
        }
        Ok(if outer_is_object { Kind::Object { empty: outer_empty } } else { Kind::Array })
    }

    /// Walks the object at `pos`, which is the `depth`-th open container;
    /// `member` is called with each key and must consume the member's value.
    pub(super) fn object<E: From<ScanError>>(
        &mut self,
        depth: usize,
        mut member: impl FnMut(&mut Self, Key) -> Result<(), E>,
    ) -> Result<Value, E> {
        let start = self.pos;
        if depth > MAX_JSON_DEPTH {
            return Err(ScanError::TooDeep { offset: start }.into());
        }
        self.expect(b'{')?;
        self.ws();
        let mut empty = true;
        if self.peek() == Some(b'}') {
            self.pos += 1;
        } else {
            empty = false;
            loop {
                let key_start = self.pos + 1;
                let escaped = self.string()?;
                let key = Key { start: key_start, end: self.pos - 1, escaped };
                self.colon()?;
                member(self, key)?;
                if !self.after_element(b'}')? {
                    break;
                }
            }
        }
        Ok(Value { start, end: self.pos, kind: Kind::Object { empty } })
    }
}

/// How a string's reading ended: at its closing quote, or at the piece's
/// end (a lexer given pieces), with the escape or character it cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum StrEnd {
    Closed { escaped: bool },
    Cut { escaped: bool, esc: Esc, utf8: Utf8 },
}

impl StrEnd {
    fn escaped(self) -> bool {
        match self {
            StrEnd::Closed { escaped } | StrEnd::Cut { escaped, .. } => escaped,
        }
    }
}

/// A string from its opening quote at `*pos` (moved past its closing
/// quote, or to the piece's end: `whole` says there is no more).
#[inline(always)]
pub(super) fn string(input: &[u8], pos: &mut usize, whole: bool) -> Result<StrEnd, ScanError> {
    let from = *pos + 1;
    match plain_run(input, from) {
        Ok(end) => {
            *pos = end;
            Ok(StrEnd::Closed { escaped: false })
        }
        Err(at) => {
            *pos = at;
            string_rest(input, pos, from, false, whole)
        }
    }
}

/// A string's text from `from` as far as it is plain ASCII: `Ok` with the
/// position past its closing quote when that ends it, else `Err` with where
/// `string_rest` goes on (a backslash, control character, non-ASCII byte,
/// long run or the input's end). Most strings of a body are ASCII keys and
/// short values without escapes: for them this is one or two word tests
/// with the position in a register.
#[inline(always)]
fn plain_run(input: &[u8], from: usize) -> Result<usize, usize> {
    let limit = from + SWAR_BYTES;
    let mut at = from;
    while let Some(w) = input.get(at..at + 8) {
        let hits = stop_bytes(le_word(w));
        if hits != 0 {
            at += (hits.trailing_zeros() / 8) as usize;
            if input.get(at) == Some(&b'"') {
                return Ok(at + 1);
            }
            return Err(at);
        }
        at += 8;
        if at >= limit {
            break;
        }
    }
    Err(at)
}

/// The rest of a string from `*pos`: escapes, control characters, long
/// runs, non-ASCII text, the piece's end. The text from `text` on is
/// checked as UTF-8 at the closing quote or at the piece's end (a
/// character the end cuts is then read on a byte at a time).
#[inline(never)]
fn string_rest(
    input: &[u8],
    pos: &mut usize,
    mut text: usize,
    mut escaped: bool,
    whole: bool,
) -> Result<StrEnd, ScanError> {
    loop {
        let rest = input.get(*pos..).unwrap_or_default();
        let Some(i) = find_special(rest) else {
            // The piece ends inside the string.
            *pos = input.len();
            if whole {
                utf8_text(input, text, input.len())?;
                return Err(ScanError::Syntax { offset: input.len() });
            }
            let utf8 = utf8_tail(input, text)?;
            return Ok(StrEnd::Cut { escaped, esc: Esc::No, utf8 });
        };
        *pos += i;
        match rest.get(i) {
            Some(b'"') => {
                // A multi-byte sequence cannot hold the quote (its bytes
                // are all non-ASCII), so the text is checked alone.
                utf8_text(input, text, *pos)?;
                *pos += 1;
                return Ok(StrEnd::Closed { escaped });
            }
            // The text before an escape or a control byte is checked first,
            // so that the first bad byte is named whatever the split.
            Some(b'\\') => {
                utf8_text(input, text, *pos)?;
                *pos += 1;
            }
            // RFC 8259 §7: control characters must be escaped.
            _ => {
                utf8_text(input, text, *pos)?;
                return Err(ScanError::Syntax { offset: *pos });
            }
        }
        escaped = true;
        // A table, not a `match`: the escape letters of real text are
        // unpredictable, and a jump table mispredicts on each.
        let class = input.get(*pos).map_or(0, |&c| ESCAPES.get(usize::from(c)).copied().unwrap_or(0));
        if class == SIMPLE_ESCAPE {
            *pos += 1;
            text = *pos;
            continue;
        }
        if class == UNICODE_ESCAPE {
            let hex = input.get(*pos + 1..).unwrap_or_default();
            let digits = hex.iter().take(4).take_while(|c| c.is_ascii_hexdigit()).count();
            if digits == 4 {
                *pos += 5;
                text = *pos;
                continue;
            }
            if !whole && *pos + 1 + digits == input.len() {
                // The piece ends within the escape's digits.
                *pos = input.len();
                return Ok(StrEnd::Cut { escaped, esc: Esc::Hex(4 - digits as u8), utf8: Utf8::default() });
            }
            // At the first byte that is not a hex digit, as a piece that
            // ends within the digits names it.
            return Err(ScanError::Syntax { offset: *pos + 1 + digits });
        }
        if *pos == input.len() && !whole {
            // The piece ends with the backslash.
            return Ok(StrEnd::Cut { escaped, esc: Esc::Backslash, utf8: Utf8::default() });
        }
        return Err(ScanError::Syntax { offset: *pos });
    }
}

/// The first byte of a number or literal at `*pos` (moved past it): its
/// kind and the check that reads on.
#[inline(always)]
fn scalar_start(input: &[u8], pos: &mut usize) -> Result<(Kind, ScalarCheck), ScanError> {
    let start = *pos;
    let kind = match input.get(start).copied() {
        Some(b'-' | b'0'..=b'9' | b'N' | b'I') => Kind::Number,
        Some(b't') => Kind::True,
        Some(b'f') => Kind::False,
        Some(b'n') => Kind::Null,
        _ => return Err(ScanError::Syntax { offset: start }),
    };
    let check = ScalarCheck::start(input.get(start).copied().unwrap_or(0));
    *pos += 1;
    Ok((kind, check))
}

/// Reads on through a number's or literal's bytes from `*pos`, to the first
/// byte that cannot continue one or the piece's end.
#[inline(always)]
fn scalar_run(input: &[u8], pos: &mut usize, mut check: ScalarCheck) -> Result<ScalarCheck, ScanError> {
    if let ScalarCheck::Literal { lit, at } = check {
        // The rest of a literal at once, when the piece holds it.
        let due = LITERALS.get(usize::from(lit)).and_then(|w| w.get(usize::from(at)..)).unwrap_or_default();
        if input.get(*pos..*pos + due.len()) == Some(due) {
            *pos += due.len();
            check = ScalarCheck::Done;
        }
    }
    while let Some(&b) = input.get(*pos) {
        if b.is_ascii_digit()
            && matches!(check, ScalarCheck::Int | ScalarCheck::Frac | ScalarCheck::ExpDigits)
        {
            // A digit changes no state there.
            *pos += 1;
            continue;
        }
        if !is_scalar_byte(b) {
            break;
        }
        check = check.next(b);
        if check == ScalarCheck::Bad {
            return Err(ScanError::Syntax { offset: *pos });
        }
        *pos += 1;
    }
    Ok(check)
}

/// A whole number or literal at `*pos` (moved past it): its kind.
#[inline(always)]
pub(super) fn scalar(input: &[u8], pos: &mut usize) -> Result<Kind, ScanError> {
    // Most scalars of a body are small integers (ids) and whole literals,
    // followed by what ends them: taken at once, a subset of what the
    // check below accepts; anything else goes through it.
    let rest = input.get(*pos..).unwrap_or_default();
    let ends = |n: usize| !rest.get(n).copied().is_some_and(is_scalar_byte);
    let quick = match rest.first() {
        Some(b'1'..=b'9') => {
            let n = 1 + rest.iter().skip(1).take_while(|b| b.is_ascii_digit()).count();
            ends(n).then_some((n, Kind::Number))
        }
        Some(b'n') if rest.starts_with(b"null") && ends(4) => Some((4, Kind::Null)),
        Some(b't') if rest.starts_with(b"true") && ends(4) => Some((4, Kind::True)),
        Some(b'f') if rest.starts_with(b"false") && ends(5) => Some((5, Kind::False)),
        _ => None,
    };
    if let Some((n, kind)) = quick {
        *pos += n;
        return Ok(kind);
    }
    let (kind, check) = scalar_start(input, pos)?;
    if !scalar_run(input, pos, check)?.complete() {
        return Err(ScanError::Syntax { offset: *pos });
    }
    Ok(kind)
}

/// Where UTF-8 breaks in `input[from..to]`: an error at the first byte at
/// which the text stops being a prefix of UTF-8 text (found a byte at a
/// time from the first bad sequence, so that whatever the split the same
/// byte is named); else the state of a character cut at `to`, if any.
fn utf8_scan(input: &[u8], from: usize, to: usize) -> Result<Utf8, ScanError> {
    let text = input.get(from..to).unwrap_or_default();
    let Err(e) = std::str::from_utf8(text) else { return Ok(Utf8::default()) };
    let start = e.valid_up_to();
    let mut utf8 = Utf8::default();
    for (i, &b) in text.get(start..).unwrap_or_default().iter().enumerate() {
        if !utf8.next(b) {
            return Err(ScanError::InvalidUtf8 { offset: from + start + i });
        }
    }
    Ok(utf8)
}

/// `input[from..to]`, string text that ends at a quote, backslash or
/// control byte (at `to`), is UTF-8; a character that byte cuts breaks at it.
fn utf8_text(input: &[u8], from: usize, to: usize) -> Result<(), ScanError> {
    if utf8_scan(input, from, to)?.due() {
        return Err(ScanError::InvalidUtf8 { offset: to });
    }
    Ok(())
}

/// `input[from..]`, string text the piece's end cuts, is UTF-8 but for a
/// character the end may cut: its state is returned.
fn utf8_tail(input: &[u8], from: usize) -> Result<Utf8, ScanError> {
    utf8_scan(input, from, input.len())
}

/// UTF-8 a byte at a time (RFC 3629 §4: no overlong forms, no surrogates,
/// nothing past U+10FFFF), for a character cut by a piece's end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Utf8 {
    /// Continuation bytes still due.
    need: u8,
    /// The range the next continuation byte must be in.
    lo: u8,
    hi: u8,
}

impl Utf8 {
    fn due(&self) -> bool {
        self.need > 0
    }

    /// Takes the next byte of a string; false when it breaks UTF-8.
    fn next(&mut self, b: u8) -> bool {
        if self.need > 0 {
            if b < self.lo || b > self.hi {
                return false;
            }
            self.need -= 1;
            (self.lo, self.hi) = (0x80, 0xbf);
            return true;
        }
        (self.need, self.lo, self.hi) = match b {
            0x00..=0x7f => (0, 0x80, 0xbf),
            0xc2..=0xdf => (1, 0x80, 0xbf),
            0xe0 => (2, 0xa0, 0xbf),
            0xe1..=0xec | 0xee..=0xef => (2, 0x80, 0xbf),
            0xed => (2, 0x80, 0x9f),
            0xf0 => (3, 0x90, 0xbf),
            0xf1..=0xf3 => (3, 0x80, 0xbf),
            0xf4 => (3, 0x80, 0x8f),
            _ => return false,
        };
        true
    }
}

/// A byte that continues a number or literal (which may is `ScalarCheck`'s).
fn is_scalar_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.')
}

/// RFC 8259's number (§6, any length) and literal grammar, a byte at a
/// time, with Python's `NaN`, `Infinity` and `-Infinity`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ScalarCheck {
    /// After `-`: a digit is due.
    Minus,
    /// After a leading `0`: no more integer digits.
    Zero,
    Int,
    /// After `.`: a digit is due.
    Dot,
    Frac,
    /// After `e`/`E`: a sign or digit is due.
    Exp,
    /// After the exponent's sign: a digit is due.
    ExpSign,
    ExpDigits,
    /// Within `LITERALS[lit]`, whose bytes from `at` on are due.
    Literal {
        lit: u8,
        at: u8,
    },
    /// A whole literal.
    Done,
    Bad,
}

/// The literals, as `ScalarCheck::Literal` names them.
const LITERALS: [&[u8]; 5] = [b"true", b"false", b"null", b"NaN", b"Infinity"];

impl ScalarCheck {
    fn start(b: u8) -> ScalarCheck {
        match b {
            b'-' => ScalarCheck::Minus,
            b'0' => ScalarCheck::Zero,
            b'1'..=b'9' => ScalarCheck::Int,
            b't' => ScalarCheck::Literal { lit: 0, at: 1 },
            b'f' => ScalarCheck::Literal { lit: 1, at: 1 },
            b'n' => ScalarCheck::Literal { lit: 2, at: 1 },
            b'N' => ScalarCheck::Literal { lit: 3, at: 1 },
            b'I' => ScalarCheck::Literal { lit: 4, at: 1 },
            _ => ScalarCheck::Bad,
        }
    }

    fn next(self, b: u8) -> ScalarCheck {
        use ScalarCheck::*;
        match (self, b) {
            (Minus, b'0') => Zero,
            (Minus, b'I') => Literal { lit: 4, at: 1 },
            (Minus, b'1'..=b'9') | (Int, b'0'..=b'9') => Int,
            (Zero | Int, b'.') => Dot,
            (Dot | Frac, b'0'..=b'9') => Frac,
            (Zero | Int | Frac, b'e' | b'E') => Exp,
            (Exp, b'+' | b'-') => ExpSign,
            (Exp | ExpSign | ExpDigits, b'0'..=b'9') => ExpDigits,
            (Literal { lit, at }, b) => {
                let word = LITERALS.get(usize::from(lit)).copied().unwrap_or_default();
                match word.get(usize::from(at)) {
                    Some(&want) if want == b && usize::from(at) + 1 == word.len() => Done,
                    Some(&want) if want == b => Literal { lit, at: at + 1 },
                    _ => Bad,
                }
            }
            _ => Bad,
        }
    }

    /// The scalar may end here.
    fn complete(self) -> bool {
        matches!(
            self,
            ScalarCheck::Zero
                | ScalarCheck::Int
                | ScalarCheck::Frac
                | ScalarCheck::ExpDigits
                | ScalarCheck::Done
        )
    }
}

/// What may follow a backslash in a string (RFC 8259 §7).
const SIMPLE_ESCAPE: u8 = 1;
const UNICODE_ESCAPE: u8 = 2;
const ESCAPES: [u8; 256] = {
    let mut t = [0u8; 256];
    let simple = b"\"\\/bfnrt";
    let mut i = 0;
    while i < simple.len() {
        t[simple[i] as usize] = SIMPLE_ESCAPE;
        i += 1;
    }
    t[b'u' as usize] = UNICODE_ESCAPE;
    t
};

/// Index of the first byte of `s` that ends a plain run inside a string:
/// `"`, `\\` or a control character. Most strings of a request are keys and
/// short values (2 to 20 bytes), so the run is searched one `u64` at a time
/// and the search stops at the first word holding a hit: a short key costs
/// one word. Past `SWAR_BYTES` the run is long, and memchr's vector search
/// (with a vectorized control check) takes over.
pub(super) fn find_special(s: &[u8]) -> Option<usize> {
    let mut at = 0;
    while let Some(w) = s.get(at..at + 8) {
        let hits = special_bytes(le_word(w));
        if hits != 0 {
            return Some(at + (hits.trailing_zeros() / 8) as usize);
        }
        at += 8;
        if at >= SWAR_BYTES {
            return long_run(s, at);
        }
    }
    // Fewer than 8 bytes left.
    let rest = s.get(at..)?;
    rest.iter().position(|&c| is_special(c)).map(|i| at + i)
}

/// `find_special` from `at` on, for a run already known to be long.
fn long_run(s: &[u8], at: usize) -> Option<usize> {
    let rest = s.get(at..)?;
    let end = memchr2(b'"', b'\\', rest).unwrap_or(rest.len());
    let run = rest.get(..end)?;
    let stop = if has_control(run) {
        run.iter().position(|&c| c < 0x20)?
    } else if end < rest.len() {
        end
    } else {
        return None;
    };
    Some(at + stop)
}

/// Runs of string text at least this long are searched with memchr.
const SWAR_BYTES: usize = 256;

/// The little-endian `u64` of an 8-byte slice (0 for any other length,
/// which callers never pass).
fn le_word(w: &[u8]) -> u64 {
    w.try_into().map_or(0, u64::from_le_bytes)
}

fn is_special(c: u8) -> bool {
    c == b'"' || c == b'\\' || c < 0x20
}

/// SWAR: the high bit of each byte of the result is set where `x` holds
/// `"`, `\\` or a byte below 0x20. Borrows can flag bytes above a real hit,
/// never below, so the lowest set bit is exact.
fn special_bytes(x: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let zero = |t: u64| t.wrapping_sub(ONES) & !t;
    let quote = zero(x ^ (ONES * u64::from(b'"')));
    let backslash = zero(x ^ (ONES * u64::from(b'\\')));
    let control = x.wrapping_sub(ONES * 0x20) & !x;
    (quote | backslash | control) & HIGHS
}

/// As `special_bytes`, also flagging non-ASCII bytes (high bit set), which
/// end the inlined ASCII fast path of `Lexer::string`. Borrows start only
/// at a flagged byte (a zero byte after the XOR, or one below 0x20), so again
/// the lowest set bit is exact; a flagged non-ASCII byte needs no `& !t`.
fn stop_bytes(x: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let quote = (x ^ (ONES * u64::from(b'"'))).wrapping_sub(ONES);
    let backslash = (x ^ (ONES * u64::from(b'\\'))).wrapping_sub(ONES);
    let control = x.wrapping_sub(ONES * 0x20);
    (quote | backslash | control | x) & HIGHS
}

/// Whether a run of string bytes holds a control character. Written without
/// early exit so it vectorizes.
fn has_control(run: &[u8]) -> bool {
    run.iter().fold(false, |acc, &c| acc | (c < 0x20))
}

// The tokens of a text given in pieces: shared with the `json_lexer` fuzz
// target, which includes the file.
#[cfg(test)]
#[path = "lex_pieces.rs"]
mod pieces;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_rng::Rng;

    #[test]
    fn find_special_agrees_with_a_byte_loop() {
        let mut r = Rng(7);
        let alphabet = b"aZ \"\\\x00\x1f\x20\x7f\x80\xa2\xdc\xff!#";
        for _ in 0..20_000 {
            let len = r.below(700);
            let mut s: Vec<u8> = (0..len).map(|_| b'x').collect();
            for _ in 0..r.below(4) * r.below(2) {
                if len > 0 {
                    let at = r.below(len);
                    s[at] = r.pick(alphabet);
                }
            }
            let naive = s.iter().position(|&c| c == b'"' || c == b'\\' || c < 0x20);
            assert_eq!(find_special(&s), naive, "{s:?}");
        }
    }

    #[test]
    fn stop_bytes_finds_the_first_stop() {
        let mut r = Rng(11);
        let alphabet = b"aZ \"\\\x00\x1f\x20\x21\x5b\x5d\x7f\x80\xa2\xdc\xff";
        for _ in 0..100_000 {
            let w: [u8; 8] = std::array::from_fn(|_| if r.below(3) == 0 { r.pick(alphabet) } else { b'x' });
            let naive = w.iter().position(|&c| is_special(c) || c >= 0x80);
            let hits = stop_bytes(u64::from_le_bytes(w));
            let got = (hits != 0).then(|| (hits.trailing_zeros() / 8) as usize);
            assert_eq!(got, naive, "{w:?}");
        }
    }

    use super::pieces::{error_at, lex};

    /// Values made of JSON's pieces: structure, keys, every kind of scalar,
    /// escapes, UTF-8 of each length, whitespace.
    fn value(rng: &mut Rng, out: &mut Vec<u8>, depth: usize) {
        const SCALARS: &[&[u8]] = &[
            b"1",
            b"0",
            b"-0.5e+3",
            b"1.5",
            b"2E-2",
            b"true",
            b"false",
            b"null",
            b"\"\"",
            b"\"id\"",
            b"\"\\u0041\"",
            b"\"\\ud83d\\ude00\"",
            b"\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"",
            b"\"\xc3\xa9\"",
            b"\"\xe2\x82\xac\"",
            b"\"\xf0\x9f\x98\x80 x\"",
            b"\"a long string that takes the word-at-a-time path for more than one word of it\"",
        ];
        const WS: &[&[u8]] = &[b"", b"", b" ", b"\n", b"\t", b"\r\n"];
        out.extend_from_slice(WS[rng.below(WS.len())]);
        match if depth > 3 { 0 } else { rng.below(4) } {
            0 | 1 => out.extend_from_slice(SCALARS[rng.below(SCALARS.len())]),
            2 => {
                out.push(b'[');
                for i in 0..rng.below(4) {
                    if i > 0 {
                        out.push(b',');
                    }
                    value(rng, out, depth + 1);
                }
                out.push(b']');
            }
            _ => {
                out.push(b'{');
                for i in 0..rng.below(4) {
                    if i > 0 {
                        out.push(b',');
                    }
                    out.extend_from_slice(SCALARS[8 + rng.below(SCALARS.len() - 8)]);
                    out.extend_from_slice(WS[rng.below(WS.len())]);
                    out.push(b':');
                    value(rng, out, depth + 1);
                }
                out.push(b'}');
            }
        }
        out.extend_from_slice(WS[rng.below(WS.len())]);
    }

    /// Generated values, half of them broken by a byte or a piece put in,
    /// replaced or taken out: bare words, broken scalars and escapes,
    /// control bytes, bad UTF-8, stray structure.
    fn generated(rng: &mut Rng, n: usize) -> Vec<Vec<u8>> {
        const BAD: &[&[u8]] = &[
            b"hello",
            b"tru",
            b"nul",
            b"01",
            b"1.",
            b".5",
            b"-",
            b"+1",
            b"e",
            b"\\x",
            b"\\u12",
            b"\t",
            b"\x01",
            b"\x0c",
            b"\xff",
            b"\xc3",
            b"\xed\xa0\x80",
            b"\xe0\x80\x80",
            b"\"",
            b"\\",
            b",",
            b":",
            b"]",
            b"}",
            b"[",
            b"{",
            b"x",
        ];
        (0..n)
            .map(|_| {
                let mut t = Vec::new();
                value(rng, &mut t, 0);
                if rng.below(2) == 0 && !t.is_empty() {
                    let at = rng.below(t.len());
                    match rng.below(3) {
                        0 => drop(t.remove(at)),
                        1 => t[at] = BAD[rng.below(BAD.len())][0],
                        _ => {
                            let bad = BAD[rng.below(BAD.len())];
                            t.splice(at..at, bad.iter().copied());
                        }
                    }
                }
                t
            })
            .collect()
    }

    #[test]
    fn every_split_reads_as_the_whole() {
        let mut rng = Rng(0x5eed_1e8e);
        let texts = generated(&mut rng, 6_000);
        let mut accepted = 0;
        for text in &texts {
            let whole = lex(text, &[]);
            accepted += usize::from(whole.is_ok());
            for cut in 0..=text.len() {
                let got = lex(text, &[cut]);
                assert_eq!(
                    got.is_ok(),
                    whole.is_ok(),
                    "{:?} cut at {cut}: {got:?} / {whole:?}",
                    text.escape_ascii().to_string()
                );
                if let (Ok(g), Ok(w)) = (&got, &whole) {
                    assert_eq!(g, w, "{:?} cut at {cut}", text.escape_ascii().to_string());
                }
            }
            let bytes: Vec<usize> = (1..text.len()).collect();
            let got = lex(text, &bytes);
            assert_eq!(
                got.ok(),
                whole.as_ref().ok().cloned(),
                "{:?} byte by byte",
                text.escape_ascii().to_string()
            );
        }
        assert!(accepted > 3_000, "generator too weak: {accepted} accepted");
    }

    /// An answer's reader says where its body stopped being JSON: the same
    /// byte whatever the split (an invalid character and a control byte
    /// after it, a bad escape digit, a cut character).
    #[test]
    fn the_first_bad_byte_is_named_whatever_the_split() {
        let mut rng = Rng(0xbad_b17e);
        let mut texts = generated(&mut rng, 6_000);
        texts.extend([
            b"\"ab\xe2\xcd\x00\"".to_vec(),
            b"\"\xff\\x\"".to_vec(),
            b"\"\xe2\x00\"".to_vec(),
            b"\"\xe2\\n\"".to_vec(),
            b"\"\\u12x4\"".to_vec(),
            b"[\"\xed\xa0\x80\"]".to_vec(),
        ]);
        for text in &texts {
            let one = error_at(text, &[]);
            for cut in 0..=text.len() {
                assert_eq!(error_at(text, &[cut]), one, "{:?} cut at {cut}", text.escape_ascii().to_string());
            }
            let bytes: Vec<usize> = (1..text.len()).collect();
            assert_eq!(error_at(text, &bytes), one, "{:?} byte by byte", text.escape_ascii().to_string());
        }
        assert_eq!(error_at(b"\"ab\xe2\xcd\x00\"", &[]), Some(4), "the byte that breaks the character");
        assert_eq!(error_at(b"\"\\u12x4\"", &[]), Some(5), "the first byte that is not a hex digit");
    }

    #[test]
    fn it_accepts_exactly_what_serde_json_accepts() {
        let mut rng = Rng(0xacce_9755);
        for text in generated(&mut rng, 40_000) {
            let serde = serde_json::from_slice::<serde_json::Value>(&text);
            // A lone surrogate escape is a value here, as in Python's `json`
            // (tested above), not in serde_json, which says so in these words.
            let lone = |e: &serde_json::Error| {
                let e = e.to_string();
                e.contains("surrogate") || e.contains("end of hex escape")
            };
            if serde.as_ref().is_err_and(lone) {
                continue;
            }
            let serde_ok = serde.is_ok();
            let cut = rng.below(text.len() + 1);
            let whole = lex(&text, &[]);
            assert_eq!(whole.is_ok(), serde_ok, "{:?}: {whole:?}", text.escape_ascii().to_string());
            assert_eq!(
                lex(&text, &[cut]).is_ok(),
                serde_ok,
                "{:?} cut at {cut}",
                text.escape_ascii().to_string()
            );
        }
    }

    #[test]
    fn python_literals_lone_surrogates_and_long_numbers_are_values() {
        for text in [
            &b"NaN"[..],
            b"-Infinity",
            b"[Infinity]",
            b"\"\\ud800\"",
            b"1e400",
            b"123456789012345678901234567890",
        ] {
            assert!(lex(text, &[]).is_ok(), "{:?}", text.escape_ascii().to_string());
            for cut in 0..=text.len() {
                assert!(lex(text, &[cut]).is_ok(), "{:?} cut at {cut}", text.escape_ascii().to_string());
            }
        }
    }

    #[test]
    fn a_bare_word_is_refused_wherever_it_stands() {
        // The answer reader once took any alphanumeric run for a scalar.
        for text in [&br#"{"a":hello}"#[..], br#"[1,hello]"#, b"hello", br#"{"a":1}x"#, br#"{"a":-}"#, b"tru"]
        {
            for cut in 0..=text.len() {
                assert!(lex(text, &[cut]).is_err(), "{:?} cut at {cut}", text.escape_ascii().to_string());
            }
            assert!(lex(text, &[]).is_err());
        }
    }

    #[test]
    fn depth_is_bounded_at_every_split() {
        let deep = |n: usize| [vec![b'['; n], vec![b']'; n]].concat();
        let ok = deep(MAX_JSON_DEPTH);
        let over = deep(MAX_JSON_DEPTH + 1);
        assert!(lex(&ok, &[]).is_ok());
        assert!(matches!(lex(&over, &[]), Err(ScanError::TooDeep { offset }) if offset == MAX_JSON_DEPTH));
        for cut in 0..=over.len() {
            assert!(lex(&ok, &[cut.min(ok.len())]).is_ok());
            assert!(matches!(lex(&over, &[cut]), Err(ScanError::TooDeep { .. })), "cut at {cut}");
        }
    }
}

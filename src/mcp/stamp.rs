//! Identity stamping: for each `tools/call` whose tool is in the stamp map,
//! a splice that sets the identity argument to the agent name. The JSON is
//! never re-serialised; every byte outside the splices goes out unchanged.
//! Pure: no I/O.
//!
//! Fail closed: a body the scanner refuses, a duplicate key the upstream
//! could read differently, or an `arguments` that cannot hold the identity
//! is an error, and the core answers 400 without forwarding anything.

use std::fmt;
use std::sync::Arc;

use smallvec::SmallVec;

use crate::mcp::json::{self, Kind, Message, ScanError, Value};
use crate::mcp::rpc;

/// Which argument of which tool carries the caller's identity.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StampMap {
    /// (tool, argument); few entries, so a linear scan beats hashing.
    entries: Vec<(String, Param)>,
    /// How many of `entries` were added by `learn`.
    learned: usize,
}

/// Most stamps learned from `tools/list` answers, per map (per proxy). The
/// map is searched linearly on every `tools/call`, so its size is part of
/// each call's cost: 256 is ten times agentchattr's 12 tools and leaves the
/// worst search a few thousand instructions; it also bounds what a server
/// listing endless tools can make the proxy keep (256 names of at most
/// `MAX_LEARNED_NAME` bytes).
pub const MAX_LEARNED_STAMPS: usize = 256;

/// Longest tool name a stamp is learned for: MCP (2025-11-25, "Tool Names")
/// says names SHOULD be 1 to 128 characters; a longer one is not learned.
pub const MAX_LEARNED_NAME: usize = 128;

/// An argument to stamp: its name, and the name's JSON text between the
/// quotes, escaped once here instead of on each request.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Param {
    name: Arc<str>,
    text: Box<[u8]>,
}

impl Param {
    fn new(name: &str) -> Param {
        let mut buf = SmallVec::new();
        let text = string_text(name, &mut buf).into();
        Param { name: Arc::from(name), text }
    }
}

impl StampMap {
    /// agentchattr's tools: its reference proxy's
    /// `_SENDER_PARAMS` plus chat_rules, chat_summary and chat_propose_job,
    /// which agentchattr's server overrides from the token anyway. chat_claim's
    /// `name` is the identity to reclaim, so only its `sender` is stamped.
    pub fn agentchattr() -> StampMap {
        let mut map = StampMap::empty();
        for tool in [
            "chat_send",
            "chat_read",
            "chat_resync",
            "chat_decision",
            "chat_set_hat",
            "chat_claim",
            "chat_rules",
            "chat_summary",
            "chat_propose_job",
        ] {
            map.set(tool, "sender");
        }
        map.set("chat_join", "name");
        map
    }

    pub fn empty() -> StampMap {
        StampMap::default()
    }

    /// Adds `tool`, or changes the argument it is stamped into.
    pub fn set(&mut self, tool: &str, param: &str) {
        let param = Param::new(param);
        match self.entries.iter_mut().find(|(t, _)| t == tool) {
            Some(entry) => entry.1 = param,
            None => self.entries.push((tool.to_owned(), param)),
        }
    }

    /// The argument to stamp for a tool name (decoded bytes).
    pub fn param_for(&self, tool: &[u8]) -> Option<&str> {
        self.entries.iter().find(|(t, _)| t.as_bytes() == tool).map(|(_, p)| &*p.name)
    }

    /// Whether the map has no entry at all.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Adds a stamp learned from a `tools/list` answer, unless `tool` is
    /// already in the map (its entry, static or learned, stays: the static
    /// map's exceptions, such as chat_join's `name`, are kept), the map
    /// holds `MAX_LEARNED_STAMPS` learned entries, or the name is longer
    /// than `MAX_LEARNED_NAME`. Returns whether it was added.
    pub fn learn(&mut self, tool: &str, param: &str) -> bool {
        if self.learn_room() == 0
            || tool.len() > MAX_LEARNED_NAME
            || self.param_for(tool.as_bytes()).is_some()
        {
            return false;
        }
        self.entries.push((tool.to_owned(), Param::new(param)));
        self.learned += 1;
        true
    }

    /// How many more stamps `learn` would add.
    pub fn learn_room(&self) -> usize {
        MAX_LEARNED_STAMPS.saturating_sub(self.learned)
    }

    /// How many entries `learn` added.
    pub fn learned(&self) -> usize {
        self.learned
    }

    /// The entry for the tool named by a `params.name` string value.
    fn param_for_value(&self, body: &[u8], name: &Value) -> Option<&Param> {
        self.entries.iter().find(|(t, _)| name.is_str(body, t)).map(|(_, p)| p)
    }
}

/// Parses the value of `--stamp TOOL=PARAM`.
pub fn parse_stamp_arg(s: &str) -> Result<(String, String), &'static str> {
    let (tool, param) = s.split_once('=').ok_or("expected TOOL=PARAM")?;
    if tool.is_empty() {
        return Err("empty tool name in TOOL=PARAM");
    }
    if param.is_empty() {
        return Err("empty parameter name in TOOL=PARAM");
    }
    if s.chars().any(char::is_control) {
        return Err("control character in TOOL=PARAM");
    }
    Ok((tool.to_owned(), param.to_owned()))
}

/// Replace `body[start..end]` with `insert` (an empty range inserts).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Splice {
    pub start: usize,
    pub end: usize,
    pub insert: SmallVec<[u8; 64]>,
}

/// The splices for one body, sorted and non-overlapping, and the identity
/// keys they stamp. One inline slot each: a single call allocates nothing
/// here beyond a long agent name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    splices: SmallVec<[Splice; 1]>,
    keys: SmallVec<[Arc<str>; 1]>,
    /// A message of the body is a `tools/list` request (seen by the same
    /// scan, so the tool policy needs no second look at other bodies).
    lists_tools: bool,
    /// The `params.name` of each `tools/call` in the body, in order (none
    /// when it has no `params` object): what the tool policy checks,
    /// without scanning the body again.
    calls: SmallVec<[Option<Value>; 1]>,
    /// (index in `calls`, value) of each stamped call that already had an
    /// identity argument: what the client claimed (the audit log's
    /// impersonation check reads it).
    claims: SmallVec<[(usize, Value); 1]>,
    /// The envelope the same scan read, for the readers after it (the
    /// audit, the tool policy, the session): each batch element or the one
    /// message, in order; whether the body is a batch; and whether the body
    /// was scanned at all.
    envelope: SmallVec<[Element; 1]>,
    batch: bool,
    scanned: bool,
}

/// One element of a body as the stamp scan read it: a message object, with
/// the spans of its `method`, `id` (the last, as the upstream reads it) and
/// `params.name` (when `params` is an object), or a batch element that is
/// not an object (`object` false).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Element {
    /// The element is `body[start..end]`.
    pub start: usize,
    pub end: usize,
    pub object: bool,
    pub method: Option<Value>,
    pub id: Option<Value>,
    pub name: Option<Value>,
}

impl Element {
    /// The message as `rpc::parse` reads it.
    pub fn message<'b>(&self, body: &'b [u8]) -> rpc::Message<'b> {
        match self.object {
            true => rpc::Message::of_object(body, self.method, self.id),
            false => rpc::Message::invalid(body),
        }
    }
}

impl Plan {
    /// Empty, as `Plan::default()`, its buffers kept.
    pub fn clear(&mut self) {
        let Plan { splices, keys, lists_tools, calls, claims, envelope, batch, scanned } = self;
        splices.clear();
        keys.clear();
        calls.clear();
        claims.clear();
        envelope.clear();
        (*lists_tools, *batch, *scanned) = (false, false, false);
    }

    /// The body's elements, when it was scanned (`None`: it was not, or
    /// was refused).
    pub fn envelope(&self) -> Option<&[Element]> {
        self.scanned.then_some(&self.envelope[..])
    }

    /// The body's message objects as `rpc::parse` reads them, built from the
    /// envelope: the readers after the stamp (the tool policy's list ids,
    /// session bookkeeping) do not parse the body again. `None` when the
    /// body was not scanned. A batch's elements that are not objects are
    /// left out (`rpc_body` has them).
    pub fn messages<'s, 'b: 's>(
        &'s self,
        body: &'b [u8],
    ) -> Option<impl Iterator<Item = rpc::Message<'b>> + 's> {
        Some(self.envelope()?.iter().filter(|e| e.object).map(move |e| e.message(body)))
    }

    /// The body as `rpc::parse` reads it, built from the envelope: its one
    /// message (an invalid one when it is not an object), or a batch's
    /// every element. `None` for a body not scanned: the caller parses it.
    pub fn rpc_body<'b>(&self, body: &'b [u8]) -> Option<rpc::Body<'b>> {
        let elements = self.envelope()?;
        if self.batch {
            return Some(rpc::Body::of_envelope(true, elements.iter().map(|e| e.message(body))));
        }
        let message = self.messages(body)?.next().unwrap_or_else(|| rpc::Message::invalid(body));
        Some(rpc::Body::of_envelope(false, std::iter::once(message)))
    }

    /// As if no body had been scanned: the envelope's readers get `None`
    /// (a new exchange begins; tests compare the envelope with a second
    /// parse). One store: the rest is cleared by the next scan.
    pub fn forget_envelope(&mut self) {
        self.scanned = false;
    }

    /// The body is a batch (a JSON array).
    pub fn is_batch(&self) -> bool {
        self.batch
    }

    /// A message of the body names the method `tools/list`.
    pub fn lists_tools(&self) -> bool {
        self.lists_tools
    }

    /// The tool name of each `tools/call` of the body (a span of it).
    pub fn called_tools(&self) -> &[Option<Value>] {
        &self.calls
    }

    /// The identity argument the client sent with the `index`th
    /// `tools/call` (a span of the body), if it sent one.
    pub fn claim(&self, index: usize) -> Option<Value> {
        self.claims.iter().find(|(i, _)| *i == index).map(|&(_, v)| v)
    }

    /// Nothing to stamp: the body goes out byte for byte.
    pub fn is_empty(&self) -> bool {
        self.splices.is_empty()
    }

    pub fn splices(&self) -> &[Splice] {
        &self.splices
    }

    /// The identity keys stamped (each once), for the `Mcp-Param-*` mirror
    /// of protocol 2026-07-28 (`x-mcp-header`: a server may route or
    /// authorise on the header, so it must carry the stamped value).
    pub fn stamped_keys(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(|k| &**k)
    }

    /// Length of the stamped body: the Content-Length to send.
    pub fn new_len(&self, body_len: usize) -> usize {
        self.splices.iter().fold(body_len, |len, s| {
            len.saturating_sub(s.end.saturating_sub(s.start)).saturating_add(s.insert.len())
        })
    }

    /// The stamped body as the slices to write in order: the body before
    /// each splice, its insert, and the rest after the last one. The body
    /// is never copied (the core writes them with one vectored write).
    pub fn parts<'a>(&'a self, body: &'a [u8]) -> impl Iterator<Item = &'a [u8]> + 'a {
        let from = std::iter::once(0).chain(self.splices.iter().map(|s| s.end));
        let tail = self.splices.last().map_or(0, |s| s.end);
        self.splices
            .iter()
            .zip(from)
            .flat_map(move |(s, from)| [body.get(from..s.start).unwrap_or_default(), &s.insert[..]])
            .chain(std::iter::once(body.get(tail..).unwrap_or_default()))
    }

    /// The stamped body in one buffer.
    pub fn apply(&self, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.new_len(body.len()));
        self.parts(body).for_each(|p| out.extend_from_slice(p));
        out
    }
}

/// A key whose duplicate makes a body ambiguous.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DuplicateKey {
    Method,
    Params,
    Name,
    Arguments,
    /// The identity argument of a stamped call.
    Identity,
}

/// Why a body is refused. Carries no content of the body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StampError {
    /// Not JSON (or not UTF-8): JSON-RPC parse error.
    Parse {
        offset: usize,
    },
    /// Nested deeper than `MAX_JSON_DEPTH`.
    TooDeep {
        offset: usize,
    },
    Duplicate(DuplicateKey),
    /// A `tools/call` whose `params` is not an object.
    ParamsNotObject,
    /// A stamped call whose `arguments` is neither an object nor null.
    ArgumentsNotObject,
}

impl StampError {
    /// The JSON-RPC error code of the 400 answer: -32700 Parse error for a
    /// body that is not JSON, -32600 Invalid Request for the rest.
    pub fn jsonrpc_code(&self) -> i32 {
        match self {
            StampError::Parse { .. } => -32700,
            _ => -32600,
        }
    }
}

impl From<ScanError> for StampError {
    fn from(e: ScanError) -> Self {
        match e {
            ScanError::Syntax { offset } | ScanError::InvalidUtf8 { offset } => StampError::Parse { offset },
            ScanError::TooDeep { offset } => StampError::TooDeep { offset },
        }
    }
}

impl fmt::Display for StampError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = |k: &DuplicateKey| match k {
            DuplicateKey::Method => "\"method\"",
            DuplicateKey::Params => "\"params\"",
            DuplicateKey::Name => "\"params.name\"",
            DuplicateKey::Arguments => "\"params.arguments\"",
            DuplicateKey::Identity => "identity argument",
        };
        match self {
            StampError::Parse { offset } => write!(f, "body is not valid JSON (byte {offset})"),
            StampError::TooDeep { offset } => {
                write!(f, "body nested deeper than {} (byte {offset})", crate::limits::MAX_JSON_DEPTH)
            }
            StampError::Duplicate(k) => write!(f, "duplicate {} key", key(k)),
            StampError::ParamsNotObject => f.write_str("tools/call params is not an object"),
            StampError::ArgumentsNotObject => f.write_str("tools/call arguments is not an object"),
        }
    }
}

/// Plans the stamping of `agent` into every `tools/call` of `body` (one
/// message or a batch) whose tool is in `map`.
pub fn plan(body: &[u8], agent: &str, map: &StampMap) -> Result<Plan, StampError> {
    let mut plan = Plan::default();
    plan_into(&mut plan, body, agent, map)?;
    Ok(plan)
}

/// `plan`, written into `plan` (the exchange's own, whatever it held):
/// a plan is a few hundred bytes, and is not moved on each request. A body
/// refused leaves it empty and not scanned. Kept out of line (it runs once
/// per request, so the call costs nothing) so that a profile gives the
/// whole body scan and stamp as this one function's inclusive figure.
#[inline(never)]
pub fn plan_into(plan: &mut Plan, body: &[u8], agent: &str, map: &StampMap) -> Result<(), StampError> {
    plan.clear();
    let scanned = json::scan_messages(
        body,
        |name| map.param_for_value(body, name).map(|p| &*p.name),
        |m| {
            let (start, end, object) = (m.start, m.end, m.object);
            plan.envelope.push(Element { start, end, object, method: m.method, id: m.id, name: m.name });
            plan_message(body, m, agent, map, plan)
        },
    );
    if let Err(e) = scanned {
        plan.clear();
        return Err(e);
    }
    plan.scanned = true;
    plan.batch = json::is_array(body);
    debug_assert!(plan.splices.windows(2).all(|w| w[0].end <= w[1].start));
    Ok(())
}

fn plan_message(
    body: &[u8],
    m: &Message,
    agent: &str,
    map: &StampMap,
    plan: &mut Plan,
) -> Result<(), StampError> {
    // Which `method` or `params` the server reads is unknowable with two.
    if m.duplicates.method {
        return Err(StampError::Duplicate(DuplicateKey::Method));
    }
    if m.duplicates.params {
        return Err(StampError::Duplicate(DuplicateKey::Params));
    }
    if !m.method.is_some_and(|v| v.is_str(body, "tools/call")) {
        plan.lists_tools |= m.method.is_some_and(|v| v.is_str(body, "tools/list"));
        return Ok(());
    }
    plan.calls.push(m.name);
    // A tools/call without params names no tool; the server refuses it.
    let Some(params) = m.params else {
        return Ok(());
    };
    let Kind::Object { .. } = params.kind else {
        return Err(StampError::ParamsNotObject);
    };
    if m.duplicates.name {
        return Err(StampError::Duplicate(DuplicateKey::Name));
    }
    if m.duplicates.arguments {
        return Err(StampError::Duplicate(DuplicateKey::Arguments));
    }
    // The key's name, and its JSON text between the quotes.
    let Some(Param { name: key, text: k }) = m.name.and_then(|name| map.param_for_value(body, &name)) else {
        return Ok(());
    };
    // The agent name's.
    let mut agent_buf = SmallVec::new();
    let a = string_text(agent, &mut agent_buf);
    let splice = match m.arguments {
        // `params` holds at least `name`: the new member needs a comma.
        None => {
            let insert = from_parts(&[b"\"arguments\":{\"", k, b"\":\"", a, b"\"},"]);
            Splice { start: params.start + 1, end: params.start + 1, insert }
        }
        Some(args) => match args.kind {
            Kind::Null => {
                let insert = from_parts(&[b"{\"", k, b"\":\"", a, b"\"}"]);
                Splice { start: args.start, end: args.end, insert }
            }
            Kind::Object { empty } => {
                let found = match m.identity {
                    Some(found) => found,
                    // `arguments` came before `name`: a second walk.
                    None => json::find_member(body, &args, key)?,
                };
                if found.duplicate {
                    return Err(StampError::Duplicate(DuplicateKey::Identity));
                }
                match found.value {
                    Some(v) => {
                        plan.claims.push((plan.calls.len() - 1, v));
                        let insert = from_parts(&[b"\"", a, b"\""]);
                        Splice { start: v.start, end: v.end, insert }
                    }
                    None => {
                        let end: &[u8] = if empty { b"\"" } else { b"\"," };
                        let insert = from_parts(&[b"\"", k, b"\":\"", a, end]);
                        Splice { start: args.start + 1, end: args.start + 1, insert }
                    }
                }
            }
            _ => return Err(StampError::ArgumentsNotObject),
        },
    };
    plan.splices.push(splice);
    if !plan.keys.iter().any(|k| k == key) {
        plan.keys.push(Arc::clone(key));
    }
    Ok(())
}

/// The JSON text of `s` between its quotes: `s` itself unless it needs
/// escapes, which are then written into `buf`.
fn string_text<'a>(s: &'a str, buf: &'a mut SmallVec<[u8; 64]>) -> &'a [u8] {
    if !json::needs_escape(s) {
        return s.as_bytes();
    }
    json::write_json_string(s, buf);
    let len = buf.len();
    buf.get(1..len.saturating_sub(1)).unwrap_or_default()
}

/// A splice's bytes from its parts, built on the stack and moved in whole
/// when they fit the inline buffer (they do for usual key and agent names):
/// `extend_from_slice` on a `SmallVec` costs a `memmove` and a `memcpy`
/// call per part, `extend` a few instructions per byte.
fn from_parts(parts: &[&[u8]]) -> SmallVec<[u8; 64]> {
    let mut buf = [0u8; 64];
    let mut len = 0;
    for part in parts {
        let Some(to) = buf.get_mut(len..len + part.len()) else {
            return parts.iter().flat_map(|p| p.iter().copied()).collect();
        };
        to.copy_from_slice(part);
        len += part.len();
    }
    SmallVec::from_buf_and_len(buf, len)
}

/// The value of an `Mcp-Param-{Name}` header for a stamped argument
/// (protocol 2026-07-28, `x-mcp-header`): the text itself when it is
/// visible ASCII or inner spaces, else `=?base64?{standard Base64 of the
/// UTF-8}?=`. Empty text and text that itself looks like the sentinel are
/// encoded too, so that a receiver always decodes back the exact text.
pub fn mcp_param_value(value: &str) -> SmallVec<[u8; 64]> {
    const PREFIX: &str = "=?base64?";
    let b = value.as_bytes();
    let plain = !b.is_empty()
        && b.iter().all(|c| (0x20..=0x7e).contains(c))
        && b.first() != Some(&b' ')
        && b.last() != Some(&b' ')
        && !value.starts_with(PREFIX);
    let mut out = SmallVec::new();
    if plain {
        out.extend_from_slice(b);
    } else {
        out.extend_from_slice(PREFIX.as_bytes());
        base64(b, &mut out);
        out.extend_from_slice(b"?=");
    }
    out
}

/// RFC 4648 §4 Base64 with padding.
fn base64(input: &[u8], out: &mut SmallVec<[u8; 64]>) {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let sym = |n: u32| ALPHABET.get((n & 63) as usize).copied().unwrap_or(b'=');
    for chunk in input.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |acc, (i, &c)| acc | u32::from(c) << (16 - 8 * i));
        out.push(sym(n >> 18));
        out.push(sym(n >> 12));
        out.push(if chunk.len() > 1 { sym(n >> 6) } else { b'=' });
        out.push(if chunk.len() > 2 { sym(n) } else { b'=' });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The envelope's messages are `rpc::parse`'s message objects (a
    /// batch's other elements aside): the readers after the stamp take them
    /// instead of parsing the body again.
    #[test]
    fn the_envelopes_messages_are_a_second_parses() {
        let bodies = [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"chat_send","arguments":{"sender":"bob"}}}"#,
            r#"{"id":1,"id":"two","method":"tools\u002flist"}"#,
            r#"[{"id":NaN,"method":"a"},{"id":1e400,"method":"b"},{"id":"\ud800","method":"c"},{"id":null,"method":"d"}]"#,
            r#"[1,{"method":"n"},{"id":3,"result":{}},[],{"id":{},"method":"x"},{"method":5,"id":6},"s",null]"#,
            r#" [ ] "#,
            r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}"#,
            r#"[{"jsonrpc":"2.0","method":"notifications\/initialized"},{"id":"7","method":"tools/list"},{"id":7.0,"method":"tools/list"}]"#,
            r#"{"id":"a\"b","method":"tools/list","params":{"cursor":"x"}}"#,
            r#"{"result":{},"id":9}"#,
            r#""just a string""#,
            r#"42"#,
            "null",
            "{}",
            r#"{"method":"notifications/cancelled","params":{"requestId":3}}"#,
        ];
        for body in bodies {
            let p = plan(body.as_bytes(), "alice", &StampMap::agentchattr()).unwrap();
            let from_envelope: Vec<rpc::Message> = p.messages(body.as_bytes()).unwrap().collect();
            let parsed = rpc::parse(body.as_bytes()).unwrap();
            let objects: Vec<rpc::Message> =
                parsed.messages().iter().copied().filter(|m| m.role() != rpc::Role::Invalid).collect();
            assert_eq!(from_envelope, objects, "{body}");
            assert_eq!(p.is_batch(), parsed.is_batch(), "{body}");
            // The whole body as a second parse reads it, a batch's elements
            // that are not objects included.
            assert_eq!(p.rpc_body(body.as_bytes()), Some(parsed), "{body}");
        }
        let mut bare = plan(b"{}", "alice", &StampMap::agentchattr()).unwrap();
        bare.forget_envelope();
        assert!(bare.messages(b"{}").is_none() && bare.rpc_body(b"{}").is_none());
    }
    use serde_json::{json, Value as J};

    fn stamp(body: &str, agent: &str) -> Result<String, StampError> {
        let map = StampMap::agentchattr();
        let p = plan(body.as_bytes(), agent, &map)?;
        let out = p.apply(body.as_bytes());
        assert_eq!(out.len(), p.new_len(body.len()));
        Ok(String::from_utf8(out).unwrap())
    }

    /// name, body, expected stamped body (agent "claude").
    macro_rules! stamps {
        ($($name:ident: $body:expr => $want:expr;)*) => {$(
            #[test]
            fn $name() {
                assert_eq!(stamp($body, "claude").as_deref(), Ok($want));
            }
        )*};
    }

    /// name, body, expected error.
    macro_rules! refuses {
        ($($name:ident: $body:expr => $err:expr;)*) => {$(
            #[test]
            fn $name() {
                let body: &[u8] = $body.as_ref();
                let got = plan(body, "claude", &StampMap::agentchattr());
                assert_eq!(got, Err($err));
            }
        )*};
    }

    stamps! {
        replaces_spoofed_sender:
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"chat_send","arguments":{"sender":"spoof","message":"hi"}}}"#
            => r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"chat_send","arguments":{"sender":"claude","message":"hi"}}}"#;
        replaces_a_non_string_sender:
            r#"{"method":"tools/call","params":{"name":"chat_read","arguments":{"sender":{"x":[1]},"limit":5}}}"#
            => r#"{"method":"tools/call","params":{"name":"chat_read","arguments":{"sender":"claude","limit":5}}}"#;
        inserts_missing_sender:
            r#"{"method":"tools/call","params":{"name":"chat_send","arguments":{"message":"hi"}},"id":"s"}"#
            => r#"{"method":"tools/call","params":{"name":"chat_send","arguments":{"sender":"claude","message":"hi"}},"id":"s"}"#;
        fills_empty_arguments:
            r#"{"method":"tools/call","params":{"name":"chat_read","arguments":{ }}}"#
            => r#"{"method":"tools/call","params":{"name":"chat_read","arguments":{"sender":"claude" }}}"#;
        replaces_null_arguments:
            r#"{"method":"tools/call","params":{"name":"chat_read","arguments":null}}"#
            => r#"{"method":"tools/call","params":{"name":"chat_read","arguments":{"sender":"claude"}}}"#;
        creates_missing_arguments:
            r#"{"method":"tools/call","params":{"name":"chat_read"}}"#
            => r#"{"method":"tools/call","params":{"arguments":{"sender":"claude"},"name":"chat_read"}}"#;
        chat_join_stamps_name:
            r#"{"method":"tools/call","params":{"name":"chat_join","arguments":{"name":"spoof","channel":"general"}}}"#
            => r#"{"method":"tools/call","params":{"name":"chat_join","arguments":{"name":"claude","channel":"general"}}}"#;
        chat_claim_name_is_never_touched:
            r#"{"method":"tools/call","params":{"name":"chat_claim","arguments":{"name":"old-me","sender":"x"}}}"#
            => r#"{"method":"tools/call","params":{"name":"chat_claim","arguments":{"name":"old-me","sender":"claude"}}}"#;
        chat_claim_duplicate_name_is_not_ours:
            r#"{"method":"tools/call","params":{"name":"chat_claim","arguments":{"name":"a","name":"b"}}}"#
            => r#"{"method":"tools/call","params":{"name":"chat_claim","arguments":{"sender":"claude","name":"a","name":"b"}}}"#;
        escaped_identity_key_is_found:
            r#"{"method":"tools/call","params":{"name":"chat_send","arguments":{"\u0073ender":"spoof"}}}"#
            => r#"{"method":"tools/call","params":{"name":"chat_send","arguments":{"\u0073ender":"claude"}}}"#;
        escaped_method_and_tool_are_decoded:
            r#"{"m\u0065thod":"tools\/call","params":{"name":"chat\u005fsend","arguments":{}}}"#
            => r#"{"m\u0065thod":"tools\/call","params":{"name":"chat\u005fsend","arguments":{"sender":"claude"}}}"#;
        key_order_does_not_matter:
            r#"{"params":{"arguments":{"sender":"x"},"name":"chat_send"},"method":"tools/call"}"#
            => r#"{"params":{"arguments":{"sender":"claude"},"name":"chat_send"},"method":"tools/call"}"#;
        whitespace_is_kept:
            "{ \"method\" : \"tools/call\" ,\n \"params\" : { \"name\" : \"chat_send\" , \"arguments\" : { \"sender\" :\t\"x\" } } }\n"
            => "{ \"method\" : \"tools/call\" ,\n \"params\" : { \"name\" : \"chat_send\" , \"arguments\" : { \"sender\" :\t\"claude\" } } }\n";
        numbers_meta_and_unicode_are_byte_exact:
            r#"{"id":1234567890123456789012345678901234567890,"method":"tools/call","params":{"_meta":{"progressToken":1e400},"name":"chat_send","arguments":{"n":1.50E+3,"big":-1234567890123456789012345678901234567890,"x":NaN,"y":-Infinity,"t":"é\u00e9😀\ud800","sender":"x"}}}"#
            => r#"{"id":1234567890123456789012345678901234567890,"method":"tools/call","params":{"_meta":{"progressToken":1e400},"name":"chat_send","arguments":{"n":1.50E+3,"big":-1234567890123456789012345678901234567890,"x":NaN,"y":-Infinity,"t":"é\u00e9😀\ud800","sender":"claude"}}}"#;
        batch_stamps_each_call:
            r#"[{"method":"tools/list","id":1},{"method":"tools/call","params":{"name":"chat_send","arguments":{"sender":"a"}}},{"method":"tools/call","params":{"name":"chat_who","arguments":{"sender":"b"}}},{"method":"tools/call","params":{"name":"chat_read"}},7]"#
            => r#"[{"method":"tools/list","id":1},{"method":"tools/call","params":{"name":"chat_send","arguments":{"sender":"claude"}}},{"method":"tools/call","params":{"name":"chat_who","arguments":{"sender":"b"}}},{"method":"tools/call","params":{"arguments":{"sender":"claude"},"name":"chat_read"}},7]"#;
        other_methods_pass:
            r#"{"method":"tools/list","params":{"name":"chat_send","arguments":{"sender":"x"}}}"#
            => r#"{"method":"tools/list","params":{"name":"chat_send","arguments":{"sender":"x"}}}"#;
        unmapped_tool_passes_even_with_bad_arguments:
            r#"{"method":"tools/call","params":{"name":"chat_who","arguments":[1]}}"#
            => r#"{"method":"tools/call","params":{"name":"chat_who","arguments":[1]}}"#;
        non_string_tool_name_passes:
            r#"{"method":"tools/call","params":{"name":["chat_send"],"arguments":{"sender":"x"}}}"#
            => r#"{"method":"tools/call","params":{"name":["chat_send"],"arguments":{"sender":"x"}}}"#;
        tool_call_without_params_passes:
            r#"{"method":"tools/call","id":3}"#
            => r#"{"method":"tools/call","id":3}"#;
        responses_and_scalars_pass:
            r#"[{"id":1,"result":{}}, "tools/call", null, []]"#
            => r#"[{"id":1,"result":{}}, "tools/call", null, []]"#;
        nested_sender_is_not_the_identity:
            r#"{"method":"tools/call","params":{"name":"chat_send","arguments":{"x":{"sender":"spoof","sender":"again"}}}}"#
            => r#"{"method":"tools/call","params":{"name":"chat_send","arguments":{"sender":"claude","x":{"sender":"spoof","sender":"again"}}}}"#;
    }

    refuses! {
        duplicate_method: r#"{"method":"tools/list","method":"tools/call","params":{"name":"chat_send","arguments":{}}}"#
            => StampError::Duplicate(DuplicateKey::Method);
        duplicate_escaped_method: r#"{"method":"tools/call","\u006dethod":"tools/list"}"#
            => StampError::Duplicate(DuplicateKey::Method);
        duplicate_params: r#"{"method":"tools/call","params":{"name":"chat_who"},"params":{"name":"chat_send","arguments":{"sender":"x"}}}"#
            => StampError::Duplicate(DuplicateKey::Params);
        duplicate_name: r#"{"method":"tools/call","params":{"name":"chat_send","arguments":{},"name":"chat_who"}}"#
            => StampError::Duplicate(DuplicateKey::Name);
        duplicate_arguments: r#"{"method":"tools/call","params":{"name":"chat_send","arguments":{"sender":"x"},"arguments":{"sender":"y"}}}"#
            => StampError::Duplicate(DuplicateKey::Arguments);
        duplicate_identity: r#"{"method":"tools/call","params":{"name":"chat_send","arguments":{"sender":"x","sender":"y"}}}"#
            => StampError::Duplicate(DuplicateKey::Identity);
        duplicate_escaped_identity: r#"{"method":"tools/call","params":{"name":"chat_send","arguments":{"sender":"x","\u0073ender":"spoof"}}}"#
            => StampError::Duplicate(DuplicateKey::Identity);
        duplicate_in_a_batch_element: r#"[{"method":"ping"},{"method":"tools/call","params":{"name":"chat_send","arguments":{"sender":"a","sender":"b"}}}]"#
            => StampError::Duplicate(DuplicateKey::Identity);
        arguments_array: r#"{"method":"tools/call","params":{"name":"chat_send","arguments":[]}}"#
            => StampError::ArgumentsNotObject;
        arguments_string: r#"{"method":"tools/call","params":{"name":"chat_send","arguments":"x"}}"#
            => StampError::ArgumentsNotObject;
        params_array: r#"{"method":"tools/call","params":["chat_send"]}"#
            => StampError::ParamsNotObject;
        params_null: r#"{"method":"tools/call","params":null}"#
            => StampError::ParamsNotObject;
        trailing_garbage: r#"{"method":"tools/call","params":{"name":"chat_send","arguments":{}}}x"#
            => StampError::Parse { offset: 68 };
        two_objects: r#"{"method":"tools/call"} {}"#
            => StampError::Parse { offset: 24 };
        invalid_utf8: b"{\"method\":\"tools/call\",\"params\":{\"name\":\"chat_send\",\"arguments\":{\"m\":\"\xff\"}}}"
            => StampError::Parse { offset: 70 };
        control_char_in_string: "{\"method\":\"tools/call\",\"params\":{\"name\":\"chat\u{1}send\"}}"
            => StampError::Parse { offset: 45 };
        truncated: r#"{"method":"tools/call","params":{"name":"chat_send","arguments":{"#
            => StampError::Parse { offset: 65 };
        empty_body: "" => StampError::Parse { offset: 0 };
    }

    #[test]
    fn deep_nesting_is_refused_without_overflow() {
        let deep = format!(
            r#"{{"method":"tools/call","params":{{"name":"chat_send","arguments":{{"x":{}}}}}}}"#,
            "[".repeat(100_000)
        );
        let got = plan(deep.as_bytes(), "claude", &StampMap::agentchattr());
        assert!(matches!(got, Err(StampError::TooDeep { .. })));
        assert_eq!(got.unwrap_err().jsonrpc_code(), -32600);
        // Within the limit it is stamped.
        let n = crate::limits::MAX_JSON_DEPTH - 4;
        let ok = format!(
            r#"{{"method":"tools/call","params":{{"name":"chat_send","arguments":{{"x":{}{}}}}}}}"#,
            "[".repeat(n),
            "]".repeat(n)
        );
        assert!(stamp(&ok, "claude").unwrap().contains(r#""sender":"claude""#));
    }

    #[test]
    fn error_codes() {
        assert_eq!(StampError::Parse { offset: 0 }.jsonrpc_code(), -32700);
        for e in [
            StampError::TooDeep { offset: 1 },
            StampError::Duplicate(DuplicateKey::Identity),
            StampError::ParamsNotObject,
            StampError::ArgumentsNotObject,
        ] {
            assert_eq!(e.jsonrpc_code(), -32600);
        }
        assert_eq!(StampError::Duplicate(DuplicateKey::Name).to_string(), "duplicate \"params.name\" key");
        let secret = r#"{"method":"tools/call","params":{"name":"chat_send","arguments":{"sender":"hunter2","sender":"hunter2"}}}"#;
        let e = plan(secret.as_bytes(), "claude", &StampMap::agentchattr()).unwrap_err();
        assert!(!e.to_string().contains("hunter2"));
    }

    #[test]
    fn long_agent_names_in_every_splice_shape() {
        // Past the 64 bytes a splice holds inline, with and without escapes.
        let long = "x".repeat(70);
        let long_escaped = "\"".repeat(40);
        for body in [
            r#"{"method":"tools/call","params":{"name":"chat_send","arguments":{"sender":"x"}}}"#,
            r#"{"method":"tools/call","params":{"name":"chat_send","arguments":{"a":1}}}"#,
            r#"{"method":"tools/call","params":{"name":"chat_send","arguments":{}}}"#,
            r#"{"method":"tools/call","params":{"name":"chat_send","arguments":null}}"#,
            r#"{"method":"tools/call","params":{"name":"chat_send"}}"#,
        ] {
            for agent in [long.as_str(), long_escaped.as_str(), "\"", ""] {
                let v: J = serde_json::from_str(&stamp(body, agent).unwrap()).unwrap();
                assert_eq!(v["params"]["arguments"]["sender"], J::from(agent), "{body}");
            }
        }
    }

    #[test]
    fn non_ascii_and_escaped_agent_names() {
        let body = r#"{"method":"tools/call","params":{"name":"chat_send","arguments":{"sender":"x"}}}"#;
        for agent in ["claude-é😀", "quote\"back\\slash", "tab\tnew\nline", "\u{7f}"] {
            let out = stamp(body, agent).unwrap();
            let v: J = serde_json::from_str(&out).unwrap();
            assert_eq!(v["params"]["arguments"]["sender"], J::from(agent));
        }
    }

    #[test]
    fn one_mib_text_argument() {
        let text = "é0123456789abcdef\\n\\\"".repeat(1 << 16);
        let body = format!(
            r#"{{"method":"tools/call","params":{{"name":"chat_send","arguments":{{"message":"{text}","sender":"spoof"}}}}}}"#
        );
        assert!(body.len() > 1 << 20);
        let p = plan(body.as_bytes(), "claude", &StampMap::agentchattr()).unwrap();
        assert_eq!(p.splices().len(), 1);
        let out = p.apply(body.as_bytes());
        let v: J = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["params"]["arguments"]["sender"], "claude");
        assert_eq!(&out[..body.len() - 9], &body.as_bytes()[..body.len() - 9]);
    }

    #[test]
    fn plan_reports_stamped_keys_once() {
        let body = r#"[{"method":"tools/call","params":{"name":"chat_send"}},{"method":"tools/call","params":{"name":"chat_join"}},{"method":"tools/call","params":{"name":"chat_read"}}]"#;
        let p = plan(body.as_bytes(), "a", &StampMap::agentchattr()).unwrap();
        assert_eq!(p.splices().len(), 3);
        assert_eq!(p.stamped_keys().collect::<Vec<_>>(), ["sender", "name"]);
        let none = plan(br#"{"method":"ping"}"#, "a", &StampMap::agentchattr()).unwrap();
        assert!(none.is_empty());
        assert_eq!(none.stamped_keys().count(), 0);
        assert_eq!(none.new_len(17), 17);
    }

    #[test]
    fn stamp_map_configuration() {
        let mut map = StampMap::agentchattr();
        assert_eq!(map.param_for(b"chat_send"), Some("sender"));
        assert_eq!(map.param_for(b"chat_join"), Some("name"));
        assert_eq!(map.param_for(b"chat_claim"), Some("sender"));
        assert_eq!(map.param_for(b"chat_who"), None);
        assert_eq!(map.param_for(b"chat_channels"), None);
        map.set("chat_send", "author");
        map.set("my_tool", "who");
        assert_eq!(map.param_for(b"chat_send"), Some("author"));
        assert_eq!(map.param_for(b"my_tool"), Some("who"));
        let body = r#"{"method":"tools/call","params":{"name":"my_tool","arguments":{"who":"x"}}}"#;
        let out = plan(body.as_bytes(), "z", &map).unwrap().apply(body.as_bytes());
        assert!(String::from_utf8(out).unwrap().contains(r#""who":"z""#));
        let empty = StampMap::empty();
        assert_eq!(empty.param_for(b"chat_send"), None);
        let body = r#"{"method":"tools/call","params":{"name":"chat_send","arguments":[]}}"#;
        assert!(plan(body.as_bytes(), "z", &empty).unwrap().is_empty());
    }

    #[test]
    fn learned_stamps_keep_the_static_entries_and_are_bounded() {
        let mut map = StampMap::agentchattr();
        assert_eq!(map.learn_room(), MAX_LEARNED_STAMPS);
        // Static entries stay, chat_join's `name` and chat_claim's `sender` too.
        assert!(!map.learn("chat_join", "sender"));
        assert!(!map.learn("chat_claim", "name"));
        assert_eq!(map.param_for(b"chat_join"), Some("name"));
        assert_eq!(map.param_for(b"chat_claim"), Some("sender"));
        assert!(map.learn("chat_new", "sender"));
        assert!(!map.learn("chat_new", "agent"));
        assert_eq!(map.param_for(b"chat_new"), Some("sender"));
        assert_eq!((map.learned(), map.learn_room()), (1, MAX_LEARNED_STAMPS - 1));
        assert!(!map.learn(&"n".repeat(MAX_LEARNED_NAME + 1), "sender"));
        assert!(map.learn(&"n".repeat(MAX_LEARNED_NAME), "sender"));
        for i in 2..MAX_LEARNED_STAMPS {
            assert!(map.learn(&format!("tool_{i}"), "sender"));
        }
        assert_eq!(map.learn_room(), 0);
        assert!(!map.learn("one_more", "sender"));
        assert_eq!(map.param_for(b"one_more"), None);
        // A learned stamp stamps.
        let body = r#"{"method":"tools/call","params":{"name":"tool_7","arguments":{"sender":"x"}}}"#;
        let out = plan(body.as_bytes(), "z", &map).unwrap().apply(body.as_bytes());
        assert!(String::from_utf8(out).unwrap().contains(r#""sender":"z""#));
    }

    #[test]
    fn argument_names_that_need_escapes() {
        // The name's JSON text is escaped once, when the map is built.
        let mut map = StampMap::empty();
        map.set("t", "a\"b\\é");
        for body in [
            r#"{"method":"tools/call","params":{"name":"t","arguments":{"x":1}}}"#,
            r#"{"method":"tools/call","params":{"name":"t","arguments":{"a\"b\\\u00e9":1}}}"#,
            r#"{"method":"tools/call","params":{"name":"t","arguments":null}}"#,
            r#"{"method":"tools/call","params":{"name":"t"}}"#,
        ] {
            let p = plan(body.as_bytes(), "z", &map).unwrap();
            let v: J = serde_json::from_slice(&p.apply(body.as_bytes())).unwrap();
            assert_eq!(v["params"]["arguments"]["a\"b\\é"], J::from("z"), "{body}");
            assert_eq!(p.stamped_keys().collect::<Vec<_>>(), ["a\"b\\é"]);
        }
    }

    #[test]
    fn stamp_arg_parsing() {
        assert_eq!(parse_stamp_arg("chat_send=author"), Ok(("chat_send".into(), "author".into())));
        assert_eq!(parse_stamp_arg("t=a=b"), Ok(("t".into(), "a=b".into())));
        assert!(parse_stamp_arg("chat_send").is_err());
        assert!(parse_stamp_arg("=sender").is_err());
        assert!(parse_stamp_arg("chat_send=").is_err());
        assert!(parse_stamp_arg("a\n=b").is_err());
    }

    #[test]
    fn mcp_param_values() {
        let cases: &[(&str, &str)] = &[
            ("claude-prime", "claude-prime"),
            ("two words", "two words"),
            ("Hello, 世界", "=?base64?SGVsbG8sIOS4lueVjA==?="),
            (" padded ", "=?base64?IHBhZGRlZCA=?="),
            ("line1\nline2", "=?base64?bGluZTEKbGluZTI=?="),
            ("", "=?base64??="),
            ("=?base64?x?=", "=?base64?PT9iYXNlNjQ/eD89?="),
            ("tab\t", "=?base64?dGFiCQ==?="),
            ("\u{7f}", "=?base64?fw==?="),
        ];
        for (input, want) in cases {
            assert_eq!(&mcp_param_value(input)[..], want.as_bytes(), "{input:?}");
        }
        // RFC 4648 §10 test vectors.
        for (input, want) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            let mut out = SmallVec::new();
            base64(input.as_bytes(), &mut out);
            assert_eq!(&out[..], want.as_bytes());
        }
    }

    use crate::test_rng::Rng;

    const WS: &[&str] = &["", "", " ", "\n", "\t ", "\r\n"];
    /// Valid for serde_json too: no NaN, no lone surrogates, finite numbers.
    const SCALARS: &[&str] = &[
        "0",
        "-12",
        "3.25e-7",
        "1.7976931348623157e308",
        "123456789012345678901234567890",
        "true",
        "false",
        "null",
        "\"\"",
        "\"spoof\"",
        "\"é\\u00e9😀\\ud83d\\ude00\"",
        "\"a\\\"b\\\\c\\/\\n\"",
    ];
    const ARG_KEYS: &[&str] = &["message", "channel", "name", "_meta", "limit", "x\\u0079"];

    fn gen_value(r: &mut Rng, out: &mut String, depth: usize) {
        match r.below(if depth > 3 { 2 } else { 4 }) {
            0 | 1 => out.push_str(r.pick(SCALARS)),
            2 => {
                out.push('[');
                for i in 0..r.below(4) {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(r.pick(WS));
                    gen_value(r, out, depth + 1);
                }
                out.push(']');
            }
            _ => {
                out.push('{');
                let mut keys = ARG_KEYS.to_vec();
                for i in 0..r.below(4) {
                    if i > 0 {
                        out.push(',');
                    }
                    let k = keys.remove(r.below(keys.len()));
                    out.push_str(&format!("{}\"{k}\"{}:", r.pick(WS), r.pick(WS)));
                    gen_value(r, out, depth + 1);
                }
                out.push('}');
            }
        }
    }

    /// One generated message; its members in random order with random
    /// whitespace. Returns the text and whether it should be stamped.
    fn gen_message(r: &mut Rng) -> (String, bool) {
        let tool = r.pick(&["chat_send", "chat_read", "chat_who", "chat_\\u0073end"]);
        let method = r.pick(&["\"tools/call\"", "\"tools\\/call\"", "\"tools/list\"", "1"]);
        let stamped = tool != "chat_who" && method.contains("call");
        let mut args: Vec<String> = Vec::new();
        let mut keys = ARG_KEYS.to_vec();
        for _ in 0..r.below(4) {
            let k = keys.remove(r.below(keys.len()));
            let mut v = String::new();
            gen_value(r, &mut v, 1);
            args.push(format!("\"{k}\"{}:{}{v}", r.pick(WS), r.pick(WS)));
        }
        match r.below(3) {
            0 => {}
            1 => args.push(format!("\"sender\":{}", r.pick(SCALARS))),
            _ => args.push("\"\\u0073ender\":\"spoof\"".into()),
        }
        if let Some(last) = args.len().checked_sub(1) {
            args.swap(last, r.below(last + 1));
        }
        let sep = format!(",{}", r.pick(WS));
        let mut params = vec![format!("\"name\":\"{tool}\"")];
        match r.below(4) {
            0 => {}
            1 => params.push("\"arguments\":null".into()),
            _ => params.push(format!("\"arguments\":{{{}{}}}", r.pick(WS), args.join(&sep))),
        }
        params.push("\"_meta\":{\"progressToken\":12345678901234567890}".into());
        let m = params.len();
        params.swap(0, r.below(m));
        let mut members = [
            "\"jsonrpc\":\"2.0\"".to_string(),
            format!("\"id\":{}", r.pick(&["1", "\"abc\"", "0.5"])),
            format!("\"method\":{method}"),
            format!("\"params\":{}{{{}}}", r.pick(WS), params.join(&sep)),
        ];
        let k = members.len();
        members.swap(r.below(k), r.below(k));
        (format!("{}{{{}}}{}", r.pick(WS), members.join(&sep), r.pick(WS)), stamped)
    }

    /// What serde_json should read after stamping: the original with only
    /// the identity key set.
    fn expected(mut v: J, agent: &str) -> J {
        let params = &mut v["params"];
        match params.get_mut("arguments") {
            Some(J::Object(args)) => {
                args.insert("sender".into(), J::from(agent));
            }
            _ => params["arguments"] = json!({ "sender": agent }),
        }
        v
    }

    #[test]
    fn differential_against_serde_json() {
        let mut r = Rng(0xD1B5_4A32_D192_ED03);
        let map = StampMap::agentchattr();
        let mut stamped_count = 0;
        for i in 0..5_000 {
            let agent = r.pick(&["claude", "codex-2", "ñandú 😀", "q\"uote"]);
            let batch = i % 3 == 0;
            let parts: Vec<(String, bool)> =
                (0..if batch { 1 + r.below(3) } else { 1 }).map(|_| gen_message(&mut r)).collect();
            let body = if batch {
                let texts: Vec<&str> = parts.iter().map(|(t, _)| t.as_str()).collect();
                format!("[{}]", texts.join(","))
            } else {
                parts[0].0.clone()
            };
            let original: J = serde_json::from_str(&body)
                .unwrap_or_else(|e| panic!("generator made invalid JSON ({e}): {body}"));
            let p = plan(body.as_bytes(), agent, &map).unwrap_or_else(|e| panic!("{e}: {body}"));
            let out = p.apply(body.as_bytes());
            let got: J = serde_json::from_slice(&out).unwrap();
            let want = match original {
                J::Array(items) => J::Array(
                    items
                        .into_iter()
                        .zip(&parts)
                        .map(|(v, (_, s))| if *s { expected(v, agent) } else { v })
                        .collect(),
                ),
                v if parts[0].1 => expected(v, agent),
                v => v,
            };
            assert_eq!(got, want, "{body}");
            let n = parts.iter().filter(|(_, s)| *s).count();
            assert_eq!(p.splices().len(), n);
            if n == 0 {
                assert_eq!(out, body.as_bytes());
            }
            stamped_count += n;
            // Stamping again changes nothing.
            let again = plan(&out, agent, &map).unwrap().apply(&out);
            assert_eq!(again, out, "{body}");
            // Bytes outside the splices are untouched.
            let mut at = 0;
            let mut o = 0;
            for s in p.splices() {
                let keep = &body.as_bytes()[at..s.start];
                assert_eq!(&out[o..o + keep.len()], keep);
                o += keep.len() + s.insert.len();
                at = s.end;
            }
            assert_eq!(&out[o..], &body.as_bytes()[at..]);
        }
        assert!(stamped_count > 2_000, "generator too weak: {stamped_count}");
    }
}

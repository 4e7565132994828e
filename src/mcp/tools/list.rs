//! The `tools/list` rewriter: from one JSON-RPC response message (the bytes
//! of the object, wherever the caller found it), the edits that hide the
//! tools the policy hides and the identity parameters the proxy stamps, and
//! the stamps the list teaches. Pure: no I/O.
//!
//! The JSON is never re-serialised: the output is the input with byte
//! ranges deleted (a hidden tool with its comma, an identity property, its
//! `required` entry, a `required` left empty) and `cacheScope` set to
//! `"private"` when anything was removed; every other byte (descriptions,
//! annotations, `outputSchema`, unknown members, number spellings, escapes,
//! whitespace, `nextCursor`) goes out as the server sent it. Names are
//! compared decoded (`"chat\u005fsend"` is `chat_send`), as the stamper
//! reads them.
//!
//! Fail closed: what cannot be rewritten safely is an error, and must not be
//! relayed while a policy is in force.

use std::fmt;

use crate::mcp::json::{self, Key, Kind, ScanError, Value};
use crate::mcp::stamp::{StampMap, MAX_LEARNED_NAME};
use crate::mcp::tools::policy::Policy;

/// What the caller knows beside the message.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ListOptions {
    /// How many stamps this list may teach (`StampMap::learn_room`); 0
    /// learns none.
    pub learn_room: usize,
    /// The session's protocol revision has a cache scope on list results
    /// (2026-07-28 on): a filtered result without `cacheScope` gets
    /// `"cacheScope":"private"`. An existing `cacheScope` is set to
    /// `"private"` whatever the revision.
    pub insert_cache_scope: bool,
}

/// A key whose duplicate makes the list ambiguous: which of the two a
/// client reads is not ours to guess.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListKey {
    Result,
    Tools,
    CacheScope,
    /// A tool's `name`.
    Name,
    InputSchema,
    Properties,
    Required,
    /// A property named by an identity parameter or a stamped one.
    IdentityProperty,
    /// `type` of such a property.
    Type,
}

impl ListKey {
    fn name(self) -> &'static str {
        match self {
            ListKey::Result => "result",
            ListKey::Tools => "result.tools",
            ListKey::CacheScope => "result.cacheScope",
            ListKey::Name => "name",
            ListKey::InputSchema => "inputSchema",
            ListKey::Properties => "inputSchema.properties",
            ListKey::Required => "inputSchema.required",
            ListKey::IdentityProperty => "identity property",
            ListKey::Type => "identity property type",
        }
    }
}

/// Why a `tools/list` answer cannot be rewritten. Carries no content of the
/// answer: tools are named by their index in `result.tools`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListError {
    /// Not JSON, or not UTF-8.
    Parse {
        offset: usize,
    },
    /// Nested deeper than `MAX_JSON_DEPTH`.
    TooDeep {
        offset: usize,
    },
    NotObject,
    /// Neither `result` nor `error`.
    NoResult,
    ResultNotObject,
    /// `result.tools` missing or not an array.
    ToolsNotArray,
    ToolNotObject {
        index: usize,
    },
    /// A tool whose `name` is missing, not a string, or not valid text (a
    /// lone surrogate escape).
    ToolName {
        index: usize,
    },
    Duplicate {
        key: ListKey,
        tool: Option<usize>,
    },
}

impl ListError {
    /// The JSON-RPC error code of the answer sent instead: -32603 Internal
    /// error (the server's answer, not the client's request, is at fault).
    pub fn jsonrpc_code(&self) -> i32 {
        -32603
    }
}

impl From<ScanError> for ListError {
    fn from(e: ScanError) -> Self {
        match e {
            ScanError::Syntax { offset } | ScanError::InvalidUtf8 { offset } => ListError::Parse { offset },
            ScanError::TooDeep { offset } => ListError::TooDeep { offset },
        }
    }
}

impl ListError {
    /// The message holds no list at all (no `result`, or no `tools` array
    /// in it), as opposed to a list that is malformed.
    pub fn is_not_a_list(&self) -> bool {
        matches!(self, ListError::NoResult | ListError::ResultNotObject | ListError::ToolsNotArray)
    }
}

impl fmt::Display for ListError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListError::Parse { offset } => write!(f, "tools/list answer is not valid JSON (byte {offset})"),
            ListError::TooDeep { offset } => {
                write!(
                    f,
                    "tools/list answer nested deeper than {} (byte {offset})",
                    crate::limits::MAX_JSON_DEPTH
                )
            }
            ListError::NotObject => f.write_str("tools/list answer is not a JSON object"),
            ListError::NoResult => f.write_str("tools/list answer has neither result nor error"),
            ListError::ResultNotObject => f.write_str("tools/list result is not an object"),
            ListError::ToolsNotArray => f.write_str("tools/list result.tools is missing or not an array"),
            ListError::ToolNotObject { index } => write!(f, "tools/list tool {index} is not an object"),
            ListError::ToolName { index } => write!(f, "tools/list tool {index} has no name of valid text"),
            ListError::Duplicate { key, tool: Some(index) } => {
                write!(f, "tools/list tool {index} has a duplicate \"{}\" key", key.name())
            }
            ListError::Duplicate { key, tool: None } => {
                write!(f, "tools/list answer has a duplicate \"{}\" key", key.name())
            }
        }
    }
}

/// Replace `message[start..end]` with `insert` (empty: a deletion).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Edit {
    pub start: usize,
    pub end: usize,
    pub insert: &'static [u8],
}

/// A stamp the list teaches: `tool`'s argument `param` carries the
/// identity. Add it with `StampMap::learn`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Learned {
    pub tool: String,
    pub param: String,
}

/// The rewrite of one `tools/list` answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListEdit {
    /// Sorted, non-overlapping.
    edits: Vec<Edit>,
    learned: Vec<Learned>,
    /// Tools removed from the list.
    pub hidden_tools: usize,
    /// Identity parameters removed (a property, or a `required` entry
    /// without its property, counts once per tool).
    pub hidden_params: usize,
    /// Tools that would have taught a stamp past `learn_room`.
    pub not_learned: usize,
}

impl ListEdit {
    /// Nothing changes: the answer goes out byte for byte.
    pub fn is_unchanged(&self) -> bool {
        self.edits.is_empty()
    }

    pub fn edits(&self) -> &[Edit] {
        &self.edits
    }

    /// The stamps learned, in list order, each tool once.
    pub fn learned(&self) -> &[Learned] {
        &self.learned
    }

    /// Length of the rewritten message.
    pub fn new_len(&self, len: usize) -> usize {
        self.edits.iter().fold(len, |len, e| {
            len.saturating_sub(e.end.saturating_sub(e.start)).saturating_add(e.insert.len())
        })
    }

    /// The rewritten message as the slices to write in order.
    pub fn parts<'a>(&'a self, message: &'a [u8]) -> impl Iterator<Item = &'a [u8]> + 'a {
        let from = std::iter::once(0).chain(self.edits.iter().map(|e| e.end));
        let tail = self.edits.last().map_or(0, |e| e.end);
        self.edits
            .iter()
            .zip(from)
            .flat_map(move |(e, from)| [message.get(from..e.start).unwrap_or_default(), e.insert])
            .chain(std::iter::once(message.get(tail..).unwrap_or_default()))
    }

    /// The rewritten message in one buffer.
    pub fn apply(&self, message: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.new_len(message.len()));
        self.parts(message).for_each(|p| out.extend_from_slice(p));
        out
    }
}

/// One element of `result.tools`, as read in the first walk.
struct Tool {
    /// The tool object.
    span: Value,
    name: String,
    input_schema: Option<Value>,
}

/// Rewrites one `tools/list` answer for `policy`, with the stamps of `map`
/// and those this list teaches (hidden as well when learned here). An
/// error answer (`error`, no `result`) is left unchanged. Kept out of line
/// so that a profile shows the whole rewrite as this function.
#[inline(never)]
pub fn rewrite_list(
    message: &[u8],
    policy: &Policy,
    map: &StampMap,
    options: ListOptions,
) -> Result<ListEdit, ListError> {
    let mut result = None;
    let mut has_error = false;
    walk_message(message, |k, v| {
        if k.is(message, "result") {
            set_once(&mut result, v, ListKey::Result, None)?;
        } else if k.is(message, "error") {
            has_error = true;
        }
        Ok(())
    })?;
    let Some(result) = result else {
        return if has_error { Ok(ListEdit::default()) } else { Err(ListError::NoResult) };
    };
    let Kind::Object { .. } = result.kind else {
        return Err(ListError::ResultNotObject);
    };
    let mut tools_value = None;
    let mut cache_scope = None;
    json::for_each_member(message, &result, |k, v| {
        if k.is(message, "tools") {
            set_once(&mut tools_value, v, ListKey::Tools, None)?;
        } else if k.is(message, "cacheScope") {
            set_once(&mut cache_scope, v, ListKey::CacheScope, None)?;
        }
        Ok::<(), ListError>(())
    })?;
    let Some(tools_value @ Value { kind: Kind::Array, .. }) = tools_value else {
        return Err(ListError::ToolsNotArray);
    };
    let tools = read_tools(message, &tools_value)?;

    let mut out = ListEdit::default();
    if options.learn_room > 0 && !policy.identity_params().is_empty() {
        learn(message, &tools, policy, map, options.learn_room, &mut out)?;
    }

    let mut items = Vec::with_capacity(tools.len());
    for (index, tool) in tools.iter().enumerate() {
        let hidden = !policy.allows(&tool.name);
        items.push(Item { start: tool.span.start, end: tool.span.end, removed: hidden });
        if hidden {
            out.hidden_tools += 1;
            continue;
        }
        if policy.show_identity_params() {
            continue;
        }
        let learned = || out.learned.iter().find(|l| l.tool == tool.name).map(|l| l.param.as_str());
        let Some(param) = map.param_for(tool.name.as_bytes()).or_else(learned) else {
            continue;
        };
        if let Some(schema) = tool.input_schema {
            if hide_param(message, &schema, param, index, &mut out.edits)? {
                out.hidden_params += 1;
            }
        }
    }
    delete_items(&items, &mut out.edits);

    if !out.edits.is_empty() {
        match cache_scope {
            Some(v) if v.is_str(message, "private") => {}
            Some(v) => out.edits.push(Edit { start: v.start, end: v.end, insert: b"\"private\"" }),
            None if options.insert_cache_scope => {
                // `result` holds `tools`: the new member needs a comma.
                let at = result.start + 1;
                out.edits.push(Edit { start: at, end: at, insert: b"\"cacheScope\":\"private\"," });
            }
            None => {}
        }
    }
    out.edits.sort_by_key(|e| (e.start, e.end));
    debug_assert!(out.edits.windows(2).all(|w| w[0].end <= w[1].start));
    Ok(out)
}

/// Walks the members of the message object and validates the whole
/// message as `json::parse_value` does, in one pass instead of two (a walk
/// checks everything it reads; only what follows the object is left).
fn walk_message(
    message: &[u8],
    mut f: impl FnMut(Key, Value) -> Result<(), ListError>,
) -> Result<(), ListError> {
    let is_ws = |c: &u8| json::is_ws(*c);
    let start = message.iter().position(|c| !is_ws(c)).unwrap_or(message.len());
    if message.get(start) != Some(&b'{') {
        // Not an object; but first, whether it is JSON at all.
        json::parse_value(message)?;
        return Err(ListError::NotObject);
    }
    let object = Value { start, end: message.len(), kind: Kind::Object { empty: false } };
    let mut last = start + 1;
    json::for_each_member(message, &object, |k, v| {
        last = v.end;
        f(k, v)
    })?;
    // The walk read up to the object's `}`: after the last member (or the
    // `{`) only whitespace and that `}`.
    let rest = message.get(last..).unwrap_or_default();
    let close = rest.iter().position(|&c| c == b'}').map_or(message.len(), |i| last + i + 1);
    let tail = message.get(close..).unwrap_or_default();
    match tail.iter().position(|c| !is_ws(c)) {
        Some(i) => Err(ListError::Parse { offset: close + i }),
        None => Ok(()),
    }
}

/// Keeps the first value of a key; a second one is an error.
fn set_once(slot: &mut Option<Value>, v: Value, key: ListKey, tool: Option<usize>) -> Result<(), ListError> {
    if slot.is_some() {
        return Err(ListError::Duplicate { key, tool });
    }
    *slot = Some(v);
    Ok(())
}

/// The first walk of `result.tools`: each tool's span, decoded name and
/// `inputSchema`.
fn read_tools(message: &[u8], tools: &Value) -> Result<Vec<Tool>, ListError> {
    let mut out = Vec::new();
    json::for_each_element(message, tools, |t| {
        let index = out.len();
        let Kind::Object { .. } = t.kind else {
            return Err(ListError::ToolNotObject { index });
        };
        let mut name = None;
        let mut input_schema = None;
        json::for_each_member(message, &t, |k, v| {
            if k.is(message, "name") {
                set_once(&mut name, v, ListKey::Name, Some(index))?;
            } else if k.is(message, "inputSchema") {
                set_once(&mut input_schema, v, ListKey::InputSchema, Some(index))?;
            }
            Ok::<(), ListError>(())
        })?;
        let name = name.and_then(|n| n.decode_str(message)).ok_or(ListError::ToolName { index })?;
        out.push(Tool { span: t, name, input_schema });
        Ok(())
    })?;
    Ok(out)
}

/// The members `properties` and `required` of an `inputSchema` object,
/// and every member's span (for deleting `required`).
struct Schema {
    properties: Option<Value>,
    required: Option<Value>,
    /// Every member, `required` marked as the one to remove.
    members: Vec<Item>,
}

fn read_schema(message: &[u8], schema: &Value, index: usize) -> Result<Option<Schema>, ListError> {
    let Kind::Object { .. } = schema.kind else {
        return Ok(None);
    };
    let mut s = Schema { properties: None, required: None, members: Vec::new() };
    json::for_each_member(message, schema, |k, v| {
        let mut removed = false;
        if k.is(message, "properties") {
            set_once(&mut s.properties, v, ListKey::Properties, Some(index))?;
        } else if k.is(message, "required") {
            set_once(&mut s.required, v, ListKey::Required, Some(index))?;
            removed = true;
        }
        // The key's opening quote starts the member.
        s.members.push(Item { start: k.start - 1, end: v.end, removed });
        Ok::<(), ListError>(())
    })?;
    Ok(Some(s))
}

/// Learns, in list order, a stamp for each tool that the map does not
/// have, whose `inputSchema.properties` has a member named by an identity
/// parameter (the first in the policy's order) whose value is an object
/// with `"type": "string"`. Only a plain string type counts: stamping a
/// string where the schema asks for another type, or for a union
/// (`anyOf`, `["string", "null"]`), could make the server refuse the call,
/// so such tools keep the static map's treatment (none).
fn learn(
    message: &[u8],
    tools: &[Tool],
    policy: &Policy,
    map: &StampMap,
    room: usize,
    out: &mut ListEdit,
) -> Result<(), ListError> {
    let params = policy.identity_params();
    for (index, tool) in tools.iter().enumerate() {
        if tool.name.len() > MAX_LEARNED_NAME
            || map.param_for(tool.name.as_bytes()).is_some()
            || out.learned.iter().any(|l| l.tool == tool.name)
        {
            continue;
        }
        let Some(schema) = tool.input_schema else {
            continue;
        };
        let Some(Schema { properties: Some(props @ Value { kind: Kind::Object { .. }, .. }), .. }) =
            read_schema(message, &schema, index)?
        else {
            continue;
        };
        // The first value of each identity parameter; a second is refused.
        let mut found: Vec<Option<Value>> = vec![None; params.len()];
        json::for_each_member(message, &props, |k, v| {
            if let Some(i) = params.iter().position(|p| k.is(message, p)) {
                if let Some(slot) = found.get_mut(i) {
                    set_once(slot, v, ListKey::IdentityProperty, Some(index))?;
                }
            }
            Ok::<(), ListError>(())
        })?;
        for (param, value) in params.iter().zip(&found) {
            let Some(value) = value else {
                continue;
            };
            if !is_string_schema(message, value, index)? {
                continue;
            }
            if out.learned.len() < room {
                out.learned.push(Learned { tool: tool.name.clone(), param: param.clone() });
            } else {
                out.not_learned += 1;
            }
            break;
        }
    }
    Ok(())
}

/// Whether a property's schema is an object whose `type` is `"string"`.
fn is_string_schema(message: &[u8], schema: &Value, index: usize) -> Result<bool, ListError> {
    let Kind::Object { .. } = schema.kind else {
        return Ok(false);
    };
    let mut ty = None;
    json::for_each_member(message, schema, |k, v| {
        if k.is(message, "type") {
            set_once(&mut ty, v, ListKey::Type, Some(index))?;
        }
        Ok::<(), ListError>(())
    })?;
    Ok(ty.is_some_and(|t| t.is_str(message, "string")))
}

/// The edits that remove `param` from a tool's `inputSchema`: every member
/// of `properties` with that key, every string of `required` equal to it,
/// and `required` itself when that leaves it empty (JSON Schema draft-04
/// forbids an empty `required`). A `properties` that is not an object or a
/// `required` that is not an array is left as it is: it names no
/// parameter, and the rewrite changes only what it can name; non-string
/// elements of `required` stay. Returns whether anything was removed.
fn hide_param(
    message: &[u8],
    schema: &Value,
    param: &str,
    index: usize,
    edits: &mut Vec<Edit>,
) -> Result<bool, ListError> {
    let Some(s) = read_schema(message, schema, index)? else {
        return Ok(false);
    };
    let mut removed = false;
    if let Some(props @ Value { kind: Kind::Object { .. }, .. }) = s.properties {
        let mut items = Vec::new();
        json::for_each_member(message, &props, |k, v| {
            items.push(Item { start: k.start - 1, end: v.end, removed: k.is(message, param) });
            Ok::<(), ListError>(())
        })?;
        removed |= delete_items(&items, edits);
    }
    if let Some(req @ Value { kind: Kind::Array, .. }) = s.required {
        let mut items = Vec::new();
        json::for_each_element(message, &req, |e| {
            items.push(Item { start: e.start, end: e.end, removed: e.is_str(message, param) });
            Ok::<(), ListError>(())
        })?;
        if !items.is_empty() && items.iter().all(|i| i.removed) {
            // `required` is the only member `read_schema` marked removed.
            removed |= delete_items(&s.members, edits);
        } else {
            removed |= delete_items(&items, edits);
        }
    }
    Ok(removed)
}

/// An array element or object member (from its first byte, a member's
/// key quote, to the end of its value), and whether it goes.
#[derive(Clone, Copy, Debug)]
struct Item {
    start: usize,
    end: usize,
    removed: bool,
}

/// The deletions that remove the `removed` items of one array or object
/// and keep its commas right, touching nothing else: an item after a kept
/// one goes with the separator before it (from the end of the item before
/// it); an item with no kept one before it goes with the separator after
/// it (up to the next item), or alone when it is the last. Returns whether
/// any item was removed.
fn delete_items(items: &[Item], edits: &mut Vec<Edit>) -> bool {
    let mut kept_before = false;
    let mut any = false;
    for (i, item) in items.iter().enumerate() {
        if !item.removed {
            kept_before = true;
            continue;
        }
        any = true;
        let (start, end) = match (kept_before, i.checked_sub(1).and_then(|p| items.get(p)), items.get(i + 1))
        {
            (true, Some(prev), _) => (prev.end, item.end),
            (_, _, Some(next)) => (item.start, next.start),
            _ => (item.start, item.end),
        };
        edits.push(Edit { start, end, insert: b"" });
    }
    any
}

#[cfg(test)]
#[path = "list_twin.rs"]
mod twin;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::tools::policy::ToolFlags;
    use crate::test_rng::Rng;
    use serde_json::Value as J;
    use twin::expected;

    mod fixture {
        include!(concat!(env!("CARGO_MANIFEST_DIR"), "/benches/util/tools_list.rs"));
    }

    fn strings(xs: &[&str]) -> Vec<String> {
        xs.iter().map(|s| s.to_string()).collect()
    }

    fn policy(allow: Option<&[&str]>, deny: &[&str], show: bool, params: &[&str]) -> Policy {
        Policy::from_flags(&ToolFlags {
            allow: allow.map(strings),
            deny: strings(deny),
            show_identity_params: show,
            identity_params: strings(params),
        })
    }

    /// The usual policy: `chat_rules` denied, `sender` learned, the
    /// agentchattr map.
    fn usual() -> Policy {
        policy(None, &["chat_rules"], false, &["sender"])
    }

    const ROOM: ListOptions = ListOptions { learn_room: 256, insert_cache_scope: false };

    fn run(input: &str, p: &Policy, map: &StampMap, options: ListOptions) -> Result<String, ListError> {
        let edit = rewrite_list(input.as_bytes(), p, map, options)?;
        let out = edit.apply(input.as_bytes());
        assert_eq!(out.len(), edit.new_len(input.len()));
        assert_eq!(edit.parts(input.as_bytes()).flatten().copied().collect::<Vec<u8>>(), out);
        assert_eq!(edit.is_unchanged(), out == input.as_bytes());
        Ok(String::from_utf8(out).unwrap())
    }

    /// A tools/list answer around `tools` (the array's inner text).
    fn answer(tools: &str) -> String {
        format!(r#"{{"jsonrpc":"2.0","id":3,"result":{{"tools":[{tools}]}}}}"#)
    }

    /// name, tools (inner text of `result.tools`), expected tools, with the
    /// usual policy.
    macro_rules! rewrites {
        ($($name:ident: $tools:expr => $want:expr;)*) => {$(
            #[test]
            fn $name() {
                let map = StampMap::agentchattr();
                assert_eq!(run(&answer($tools), &usual(), &map, ROOM), Ok(answer($want)));
            }
        )*};
    }

    const WHO: &str = r#"{"name":"chat_who","inputSchema":{"type":"object","properties":{}}}"#;
    const RULES: &str = r#"{"name":"chat_rules","description":"x"}"#;
    const OTHER: &str = r#"{"name":"other","inputSchema":{"properties":{"sender":{"type":"integer"}}}}"#;

    rewrites! {
        nothing_to_hide_is_unchanged: WHO => WHO;
        empty_list_is_unchanged: "" => "";
        hides_the_only_tool: RULES => "";
        hides_the_first_tool: &format!("{RULES},{WHO}") => WHO;
        hides_the_last_tool: &format!("{WHO},{RULES}") => WHO;
        hides_a_middle_tool: &format!("{WHO},{RULES},{OTHER}") => &format!("{WHO},{OTHER}");
        hides_runs_of_tools: &format!("{RULES},{RULES},{WHO},{RULES},{RULES},{OTHER},{RULES}")
            => &format!("{WHO},{OTHER}");
        hides_all_tools_keeping_the_whitespace: &format!("\n  {RULES} ,\n  {RULES}\n") => "\n  \n";
        keeps_the_whitespace_between_kept_tools: &format!(" {WHO} ,\n {RULES} , {OTHER} ") => &format!(" {WHO} , {OTHER} ");
        hides_an_escaped_name: r#"{"name":"chat\u005frules"},{"name":"chat_\u0072ules"}"# => "";
        removes_the_stamped_property_and_required_entry:
            r#"{"name":"chat_send","inputSchema":{"properties":{"sender":{"type":"string"},"message":{"type":"string"}},"required":["sender","message"],"type":"object"}}"#
            => r#"{"name":"chat_send","inputSchema":{"properties":{"message":{"type":"string"}},"required":["message"],"type":"object"}}"#;
        removes_a_last_property_and_required_entry:
            r#"{"name":"chat_send","inputSchema":{"properties":{"message":{},"sender":{}},"required":["message", "sender"]}}"#
            => r#"{"name":"chat_send","inputSchema":{"properties":{"message":{}},"required":["message"]}}"#;
        drops_a_required_left_empty:
            r#"{"name":"chat_claim","inputSchema":{"properties":{"sender":{"type":"string"},"name":{"default":"","type":"string"}},"required":["sender"],"title":"chat_claimArguments","type":"object"}}"#
            => r#"{"name":"chat_claim","inputSchema":{"properties":{"name":{"default":"","type":"string"}},"title":"chat_claimArguments","type":"object"}}"#;
        drops_a_first_required_left_empty:
            r#"{"name":"chat_claim","inputSchema":{ "required" : [ "sender" ] , "properties":{"sender":{}}}}"#
            => r#"{"name":"chat_claim","inputSchema":{ "properties":{}}}"#;
        drops_an_only_required:
            r#"{"name":"chat_claim","inputSchema":{"required":["sender","sender"]}}"#
            => r#"{"name":"chat_claim","inputSchema":{}}"#;
        keeps_an_empty_required_it_did_not_empty:
            r#"{"name":"chat_send","inputSchema":{"properties":{"sender":{}},"required":[]}}"#
            => r#"{"name":"chat_send","inputSchema":{"properties":{},"required":[]}}"#;
        required_without_the_parameter_stays:
            r#"{"name":"chat_read","inputSchema":{"properties":{"sender":{"default":""},"limit":{}}}}"#
            => r#"{"name":"chat_read","inputSchema":{"properties":{"limit":{}}}}"#;
        escaped_property_keys_and_required_strings_are_decoded:
            r#"{"name":"chat\u005fsend","inputSchema":{"properties":{"s\u0065nder":{},"m":{}},"required":["send\u0065r","m"]}}"#
            => r#"{"name":"chat\u005fsend","inputSchema":{"properties":{"m":{}},"required":["m"]}}"#;
        every_duplicate_of_the_stamped_property_goes:
            r#"{"name":"chat_send","inputSchema":{"properties":{"sender":{},"m":1,"sender":{"type":"integer"}}}}"#
            => r#"{"name":"chat_send","inputSchema":{"properties":{"m":1}}}"#;
        chat_join_loses_name_and_keeps_sender:
            r#"{"name":"chat_join","inputSchema":{"properties":{"name":{"type":"string"},"sender":{"type":"string"}},"required":["name","sender"]}}"#
            => r#"{"name":"chat_join","inputSchema":{"properties":{"sender":{"type":"string"}},"required":["sender"]}}"#;
        output_schema_and_everything_else_are_untouched:
            r#"{"annotations":{"readOnlyHint":true},"name":"chat_send","x-unknown":[1.50,-0E+3,1e400,"\ud83d\ude00\/"],"outputSchema":{"properties":{"sender":{"type":"string"}},"required":["sender"]},"description":"a \"quoted\" é\n","inputSchema":{"$schema":"https://json-schema.org/draft/2020-12/schema","properties":{"sender":{"type":"string"}},"additionalProperties":false}}"#
            => r#"{"annotations":{"readOnlyHint":true},"name":"chat_send","x-unknown":[1.50,-0E+3,1e400,"\ud83d\ude00\/"],"outputSchema":{"properties":{"sender":{"type":"string"}},"required":["sender"]},"description":"a \"quoted\" é\n","inputSchema":{"$schema":"https://json-schema.org/draft/2020-12/schema","properties":{},"additionalProperties":false}}"#;
        properties_not_an_object_is_left:
            r#"{"name":"chat_send","inputSchema":{"properties":["sender"],"required":["sender","m"]}}"#
            => r#"{"name":"chat_send","inputSchema":{"properties":["sender"],"required":["m"]}}"#;
        required_not_an_array_is_left:
            r#"{"name":"chat_send","inputSchema":{"properties":{"sender":{}},"required":"sender"}}"#
            => r#"{"name":"chat_send","inputSchema":{"properties":{},"required":"sender"}}"#;
        non_string_required_elements_stay:
            r#"{"name":"chat_send","inputSchema":{"required":[1,"sender",null]}}"#
            => r#"{"name":"chat_send","inputSchema":{"required":[1,null]}}"#;
        input_schema_not_an_object_is_left:
            r#"{"name":"chat_send","inputSchema":true},{"name":"chat_read","inputSchema":null},{"name":"chat_resync"}"#
            => r#"{"name":"chat_send","inputSchema":true},{"name":"chat_read","inputSchema":null},{"name":"chat_resync"}"#;
        nested_properties_are_not_top_level:
            r#"{"name":"chat_send","inputSchema":{"properties":{"opts":{"properties":{"sender":{}},"required":["sender"]}}}}"#
            => r#"{"name":"chat_send","inputSchema":{"properties":{"opts":{"properties":{"sender":{}},"required":["sender"]}}}}"#;
        learns_and_hides_a_new_tool:
            r#"{"name":"chat_new","inputSchema":{"properties":{"sender":{"title":"Sender","type":"string"},"x":{}},"required":["sender"]}}"#
            => r#"{"name":"chat_new","inputSchema":{"properties":{"x":{}}}}"#;
        does_not_learn_a_non_string_parameter: OTHER => OTHER;
        does_not_learn_a_union:
            r#"{"name":"n","inputSchema":{"properties":{"sender":{"anyOf":[{"type":"string"},{"type":"null"}]}}}},{"name":"m","inputSchema":{"properties":{"sender":{"type":["string","null"]}}}},{"name":"o","inputSchema":{"properties":{"sender":"string"}}}"#
            => r#"{"name":"n","inputSchema":{"properties":{"sender":{"anyOf":[{"type":"string"},{"type":"null"}]}}}},{"name":"m","inputSchema":{"properties":{"sender":{"type":["string","null"]}}}},{"name":"o","inputSchema":{"properties":{"sender":"string"}}}"#;
    }

    #[test]
    fn cache_scope_is_made_private_when_anything_was_removed() {
        let map = StampMap::agentchattr();
        let p = usual();
        let with_scope = |scope: &str, tools: &str| {
            format!(
                r#"{{"id":1,"result":{{"ttlMs":60000,"cacheScope":{scope},"tools":[{tools}],"nextCursor":"c2"}}}}"#
            )
        };
        let insert = ListOptions { insert_cache_scope: true, ..ROOM };
        // (input, options, expected)
        let cases: &[(String, ListOptions, String)] = &[
            (with_scope("\"public\"", RULES), ROOM, with_scope("\"private\"", "")),
            (with_scope("\"public\"", WHO), ROOM, with_scope("\"public\"", WHO)),
            (with_scope("\"private\"", RULES), ROOM, with_scope("\"private\"", "")),
            (with_scope("\"priv\\u0061te\"", RULES), ROOM, with_scope("\"priv\\u0061te\"", "")),
            (with_scope("5", RULES), ROOM, with_scope("\"private\"", "")),
            (with_scope(" \"public\" ", RULES), insert, with_scope(" \"private\" ", "")),
            (answer(RULES), ROOM, answer("")),
            (
                answer(&format!("{RULES},{WHO}")),
                insert,
                format!(r#"{{"jsonrpc":"2.0","id":3,"result":{{"cacheScope":"private","tools":[{WHO}]}}}}"#),
            ),
            (answer(WHO), insert, answer(WHO)),
        ];
        for (input, options, want) in cases {
            assert_eq!(run(input, &p, &map, *options).as_ref(), Ok(want), "{input}");
        }
    }

    #[test]
    fn error_answers_pass_and_malformed_ones_are_refused() {
        let map = StampMap::agentchattr();
        let p = usual();
        let passes = [
            r#"{"jsonrpc":"2.0","id":3,"error":{"code":-32601,"message":"Method not found"}}"#,
            r#" {"error":null,"id":3} "#,
        ];
        for input in passes {
            assert_eq!(run(input, &p, &map, ROOM).as_deref(), Ok(input));
        }
        use ListError as E;
        use ListKey as K;
        let dup = |key, tool| E::Duplicate { key, tool };
        let refused: &[(&str, ListError)] = &[
            ("", E::Parse { offset: 0 }),
            (r#"{"result":{"tools":[]}"#, E::Parse { offset: 22 }),
            (r#"{"result":{"tools":[]}} {}"#, E::Parse { offset: 24 }),
            ("[]", E::NotObject),
            (r#"{"id":3}"#, E::NoResult),
            (r#"{"result":[]}"#, E::ResultNotObject),
            (r#"{"result":null,"error":{}}"#, E::ResultNotObject),
            (r#"{"result":{}}"#, E::ToolsNotArray),
            (r#"{"result":{"tools":{}}}"#, E::ToolsNotArray),
            (r#"{"result":{"tools":null}}"#, E::ToolsNotArray),
            (r#"{"result":{"tools":[{"name":"a"},"chat_rules"]}}"#, E::ToolNotObject { index: 1 }),
            (r#"{"result":{"tools":[{}]}}"#, E::ToolName { index: 0 }),
            (r#"{"result":{"tools":[{"name":1}]}}"#, E::ToolName { index: 0 }),
            (r#"{"result":{"tools":[{"name":null}]}}"#, E::ToolName { index: 0 }),
            (r#"{"result":{"tools":[{"name":"\ud800"}]}}"#, E::ToolName { index: 0 }),
            (r#"{"result":{"tools":[]},"result":{"tools":[]}}"#, dup(K::Result, None)),
            (r#"{"result":{"tools":[],"tools":[]}}"#, dup(K::Tools, None)),
            (r#"{"result":{"tools":[],"cacheScope":"a","cacheScope":"b"}}"#, dup(K::CacheScope, None)),
            (r#"{"result":{"tools":[{"name":"a","name":"chat_rules"}]}}"#, dup(K::Name, Some(0))),
            (r#"{"result":{"tools":[{"name":"a"},{"name":"b","n\u0061me":"c"}]}}"#, dup(K::Name, Some(1))),
            (
                r#"{"result":{"tools":[{"name":"a","inputSchema":{},"inputSchema":{}}]}}"#,
                dup(K::InputSchema, Some(0)),
            ),
            (
                r#"{"result":{"tools":[{"name":"chat_send","inputSchema":{"properties":{},"properties":{}}}]}}"#,
                dup(K::Properties, Some(0)),
            ),
            (
                r#"{"result":{"tools":[{"name":"chat_send","inputSchema":{"required":[],"required":["sender"]}}]}}"#,
                dup(K::Required, Some(0)),
            ),
            (
                r#"{"result":{"tools":[{"name":"new","inputSchema":{"properties":{"sender":{"type":"string"},"sender":{}}}}]}}"#,
                dup(K::IdentityProperty, Some(0)),
            ),
            (
                r#"{"result":{"tools":[{"name":"new","inputSchema":{"properties":{"sender":{"type":"integer","type":"string"}}}}]}}"#,
                dup(K::Type, Some(0)),
            ),
        ];
        for (input, want) in refused {
            assert_eq!(run(input, &p, &map, ROOM), Err(*want), "{input}");
        }
        let not_utf8 = b"{\"result\":{\"tools\":[{\"name\":\"\xff\"}]}}";
        assert_eq!(rewrite_list(not_utf8, &p, &map, ROOM), Err(E::Parse { offset: 29 }));
        let deep = format!(
            r#"{{"result":{{"tools":[{{"name":"a","x":{}{}}}]}}}}"#,
            "[".repeat(200),
            "]".repeat(200)
        );
        assert!(matches!(run(&deep, &p, &map, ROOM), Err(E::TooDeep { .. })));
    }

    #[test]
    fn error_display_carries_no_content() {
        let map = StampMap::agentchattr();
        let inputs = [
            r#"{"result":{"tools":[{"name":"secret_tool","name":"secret_tool"}]}}"#,
            r#"{"result":{"tools":[{"name":"secret_tool"},"secret_tool"]}}"#,
            r#"{"result":{"tools":[{"name":"secret_tool"}"#,
            r#"{"result":{"tools":"secret_tool"}}"#,
        ];
        for input in inputs {
            let e = run(input, &usual(), &map, ROOM).unwrap_err();
            for shown in [e.to_string(), format!("{e:?}")] {
                assert!(!shown.contains("secret"), "{shown}");
            }
            assert_eq!(e.jsonrpc_code(), -32603);
        }
        let shown = ListError::Duplicate { key: ListKey::Name, tool: Some(2) }.to_string();
        assert_eq!(shown, "tools/list tool 2 has a duplicate \"name\" key");
    }

    #[test]
    fn learning() {
        let empty = StampMap::empty();
        let ac = StampMap::agentchattr();
        let new = |name: &str, param: &str| {
            format!(r#"{{"name":"{name}","inputSchema":{{"properties":{{"{param}":{{"type":"string"}}}}}}}}"#)
        };
        let learned = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(t, p)| Learned { tool: t.to_string(), param: p.to_string() })
                .collect::<Vec<_>>()
        };
        let long = "t".repeat(MAX_LEARNED_NAME + 1);
        // (tools, policy, map, room, learned, not learned, still visible)
        let cases: Vec<(String, Policy, &StampMap, usize, Vec<Learned>, usize, usize)> = vec![
            // The map's entries stay: chat_join keeps `name`, chat_claim `sender`.
            (
                [new("chat_join", "sender"), new("chat_claim", "name"), new("a", "sender")].join(","),
                usual(),
                &ac,
                256,
                learned(&[("a", "sender")]),
                0,
                2,
            ),
            // The first identity parameter in the policy's order wins.
            (
                r#"{"name":"a","inputSchema":{"properties":{"sender":{"type":"string"},"agent":{"type":"string"}}}}"#
                    .into(),
                policy(None, &[], false, &["agent", "sender"]),
                &empty,
                256,
                learned(&[("a", "agent")]),
                0,
                1,
            ),
            // A later parameter is learned when the first is not a string.
            (
                r#"{"name":"a","inputSchema":{"properties":{"agent":{"type":"integer"},"sender":{"type":"string"}}}}"#
                    .into(),
                policy(None, &[], false, &["agent", "sender"]),
                &empty,
                256,
                learned(&[("a", "sender")]),
                0,
                0,
            ),
            // Bounded: past the room, nothing is learned, nothing hidden.
            (
                [new("a", "sender"), new("b", "sender"), new("c", "sender")].join(","),
                usual(),
                &empty,
                2,
                learned(&[("a", "sender"), ("b", "sender")]),
                1,
                1,
            ),
            (new("a", "sender"), usual(), &empty, 0, vec![], 0, 1),
            // A tool listed twice is learned once, and both copies hidden.
            ([new("a", "sender"), new("a", "sender")].join(","), usual(), &empty, 256, learned(&[("a", "sender")]), 0, 0),
            // Hidden tools are learned too (a later policy may allow them).
            (new("chat_rules", "sender"), usual(), &empty, 256, learned(&[("chat_rules", "sender")]), 0, 0),
            // Shown identity parameters are still learned.
            (new("a", "sender"), policy(None, &[], true, &["sender"]), &empty, 256, learned(&[("a", "sender")]), 0, 1),
            // No identity parameter, too long a name: nothing.
            (new("a", "sender"), policy(None, &[], false, &[]), &empty, 256, vec![], 0, 1),
            (new(&long, "sender"), usual(), &empty, 256, vec![], 0, 1),
        ];
        for (i, (tools, p, map, room, want, not_learned, visible)) in cases.into_iter().enumerate() {
            let input = answer(&tools);
            let options = ListOptions { learn_room: room, insert_cache_scope: false };
            let edit = rewrite_list(input.as_bytes(), &p, map, options).unwrap();
            assert_eq!((edit.learned(), edit.not_learned), (&want[..], not_learned), "case {i}");
            let out = String::from_utf8(edit.apply(input.as_bytes())).unwrap();
            let left = out.matches(r#"":{"type":"string"}"#).count();
            assert_eq!(left, visible, "case {i}: {out}");
        }
    }

    /// The properties every rewrite must have: output equal to the twin's
    /// (where serde_json reads the input), rewriting again changes nothing,
    /// and the learned stamps are those of the twin.
    fn check(input: &[u8], p: &Policy, map: &StampMap, options: ListOptions) -> Result<(), ListError> {
        let edit = rewrite_list(input, p, map, options)?;
        let out = edit.apply(input);
        assert!(edit.edits().windows(2).all(|w| w[0].end <= w[1].start));
        let mut map2 = map.clone();
        for l in edit.learned() {
            assert!(map2.learn(&l.tool, &l.param), "{l:?} learned twice or over a map entry");
        }
        let again = rewrite_list(&out, p, &map2, ListOptions { learn_room: 0, ..options })
            .expect("a rewritten list rewrites again");
        assert!(again.is_unchanged(), "not idempotent: {}", String::from_utf8_lossy(&out));
        if let Ok(v) = serde_json::from_slice::<J>(input) {
            let got: J = serde_json::from_slice(&out).expect("rewritten list parses");
            let (want, learned) = expected(&v, p, map, options);
            assert_eq!(got, want, "input {}", String::from_utf8_lossy(input));
            assert_eq!(edit.learned(), &learned[..]);
        }
        Ok(())
    }

    #[test]
    fn agentchattr_list() {
        let list = fixture::agentchattr_tools_list(2, 1);
        assert!((9_000..12_000).contains(&list.len()), "{}", list.len());
        let v: J = serde_json::from_slice(&list).unwrap();
        let names = |v: &J| -> Vec<String> {
            v["result"]["tools"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["name"].as_str().unwrap().to_owned())
                .collect()
        };
        assert_eq!(names(&v).len(), 12);

        // The issue's setup: two tools denied, the default map, `sender` learned.
        let p = policy(None, &["chat_rules", "chat_decision"], false, &["sender"]);
        let map = StampMap::agentchattr();
        check(&list, &p, &map, ROOM).unwrap();
        let edit = rewrite_list(&list, &p, &map, ROOM).unwrap();
        assert_eq!((edit.hidden_tools, edit.hidden_params, edit.learned().len()), (2, 8, 0));
        let out: J = serde_json::from_slice(&edit.apply(&list)).unwrap();
        let want = ["chat_send", "chat_read", "chat_resync", "chat_join", "chat_who", "chat_channels"];
        let want2 = ["chat_set_hat", "chat_claim", "chat_summary", "chat_propose_job"];
        assert_eq!(names(&out), [&want[..], &want2[..]].concat());
        for t in out["result"]["tools"].as_array().unwrap() {
            let schema = &t["inputSchema"];
            assert!(schema["properties"].get("sender").is_none(), "{t}");
            assert!(!schema["required"].as_array().is_some_and(|r| r.contains(&J::from("sender"))));
            assert_eq!(t["outputSchema"]["required"], serde_json::json!(["result"]));
        }
        let claim = &out["result"]["tools"][7];
        assert_eq!(claim["name"], "chat_claim");
        assert_eq!(claim["inputSchema"].get("required"), None);
        assert!(claim["inputSchema"]["properties"].get("name").is_some());
        let join = &out["result"]["tools"][3];
        assert_eq!(join["inputSchema"]["properties"].get("name"), None);

        // --no-default-stamps --identity-param sender: the same tools learned.
        let empty = StampMap::empty();
        let p = policy(None, &[], false, &["sender"]);
        check(&list, &p, &empty, ROOM).unwrap();
        let edit = rewrite_list(&list, &p, &empty, ROOM).unwrap();
        let tools: Vec<&str> = edit.learned().iter().map(|l| l.tool.as_str()).collect();
        let sender_tools = [
            "chat_send",
            "chat_read",
            "chat_resync",
            "chat_rules",
            "chat_decision",
            "chat_set_hat",
            "chat_claim",
            "chat_summary",
            "chat_propose_job",
        ];
        assert_eq!(tools, sender_tools);
        assert!(edit.learned().iter().all(|l| l.param == "sender"));
        // Each learned tool is what the static map has for it.
        for l in edit.learned() {
            assert_eq!(map.param_for(l.tool.as_bytes()), Some("sender"));
        }

        // --show-identity-params and no list: unchanged, still learning.
        let p = policy(None, &[], true, &["sender"]);
        let edit = rewrite_list(&list, &p, &empty, ROOM).unwrap();
        assert!(edit.is_unchanged());
        assert_eq!(edit.learned().len(), 9);
        // An allow list of one glob.
        let p = policy(Some(&["chat_re*"]), &[], false, &["sender"]);
        let out: J =
            serde_json::from_slice(&rewrite_list(&list, &p, &map, ROOM).unwrap().apply(&list)).unwrap();
        assert_eq!(names(&out), ["chat_read", "chat_resync"]);

        // Twice the tools (about 20 KB): the renamed copies are learned.
        let big = fixture::agentchattr_tools_list(2, 2);
        assert!((18_000..24_000).contains(&big.len()), "{}", big.len());
        let p = policy(None, &["*chat_rules", "*chat_decision"], false, &["sender"]);
        check(&big, &p, &map, ROOM).unwrap();
        let edit = rewrite_list(&big, &p, &map, ROOM).unwrap();
        let learned: Vec<String> = edit.learned().iter().map(|l| l.tool.clone()).collect();
        assert_eq!(learned, sender_tools.map(|t| format!("v2_{t}")));
        assert_eq!((edit.hidden_tools, edit.hidden_params), (4, 15));
        let out = String::from_utf8(edit.apply(&big)).unwrap();
        assert!(
            !out.contains("\"sender\"") && !out.contains("chat_rules") && !out.contains("chat_decision\"")
        );
    }

    // Pieces of generated lists.
    const NAMES: &[&str] = &[
        "\"chat_send\"",
        "\"chat\\u005fsend\"",
        "\"chat_read\"",
        "\"chat_claim\"",
        "\"chat_join\"",
        "\"chat_rules\"",
        "\"chat_\\u0072ules\"",
        "\"chat_who\"",
        "\"new_tool\"",
        "\"other\"",
        "\"é😀\"",
    ];
    const PROPS: &[&str] =
        &["\"sender\"", "\"s\\u0065nder\"", "\"name\"", "\"agent\"", "\"message\"", "\"x\""];
    const PROP_SCHEMAS: &[&str] = &[
        "{\"type\":\"string\"}",
        "{\"title\":\"Sender\",\"type\":\"string\",\"default\":\"\"}",
        "{\"type\":\"integer\"}",
        "{\"type\":\"str\\u0069ng\"}",
        "{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]}",
        "{}",
        "true",
        "{\"type\":[\"string\"]}",
    ];
    const REQUIRED: &[&str] =
        &["\"sender\"", "\"send\\u0065r\"", "\"name\"", "\"agent\"", "\"message\"", "1", "null"];
    const SCALARS: &[&str] = &[
        "1.50",
        "-0E+3",
        "12345678901234567890",
        "\"text \\\"q\\\" \\n é\"",
        "\"\\ud83d\\ude00\"",
        "null",
        "true",
        "[]",
        "{}",
        "[1,{\"sender\":\"x\"}]",
    ];
    const WS: &[&str] = &["", "", "", " ", "\n", "\r\n  ", "\t"];

    /// Members `(key, value)` written in order with random whitespace;
    /// the keys are raw JSON strings.
    fn object(r: &mut Rng, members: &[(String, String)]) -> String {
        let mut s = String::from("{");
        s.push_str(r.pick(WS));
        for (i, (k, v)) in members.iter().enumerate() {
            if i > 0 {
                s.push(',');
                s.push_str(r.pick(WS));
            }
            s.push_str(k);
            s.push_str(r.pick(WS));
            s.push(':');
            s.push_str(r.pick(WS));
            s.push_str(v);
            s.push_str(r.pick(WS));
        }
        s.push('}');
        s
    }

    fn array(r: &mut Rng, items: &[String]) -> String {
        let mut s = String::from("[");
        for (i, v) in items.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            s.push_str(r.pick(WS));
            s.push_str(v);
            s.push_str(r.pick(WS));
        }
        s.push(']');
        s
    }

    fn shuffle<T>(r: &mut Rng, xs: &mut [T]) {
        for i in (1..xs.len()).rev() {
            xs.swap(i, r.below(i + 1));
        }
    }

    fn input_schema(r: &mut Rng) -> String {
        let mut members = Vec::new();
        match r.below(10) {
            0 => members.push(("\"properties\"".to_owned(), "[\"sender\"]".to_owned())),
            1 => {}
            _ => {
                let mut props: Vec<(String, String)> = Vec::new();
                for _ in 0..r.below(5) {
                    let key = r.pick(PROPS);
                    // Mostly distinct keys; now and then a duplicate.
                    if props.iter().any(|(k, _)| k == key) && r.below(8) != 0 {
                        continue;
                    }
                    props.push((key.to_owned(), r.pick(PROP_SCHEMAS).to_owned()));
                }
                members.push(("\"properties\"".to_owned(), object(r, &props)));
            }
        }
        match r.below(8) {
            0 => {}
            1 => members.push(("\"required\"".to_owned(), "\"sender\"".to_owned())),
            _ => {
                let req: Vec<String> = (0..r.below(4)).map(|_| r.pick(REQUIRED).to_owned()).collect();
                members.push(("\"required\"".to_owned(), array(r, &req)));
            }
        }
        members.push(("\"type\"".to_owned(), "\"object\"".to_owned()));
        if r.below(3) == 0 {
            members.push(("\"title\"".to_owned(), "\"Args\"".to_owned()));
        }
        shuffle(r, &mut members);
        object(r, &members)
    }

    fn tool(r: &mut Rng) -> String {
        let mut members = vec![("\"name\"".to_owned(), r.pick(NAMES).to_owned())];
        if r.below(6) != 0 {
            members.push(("\"inputSchema\"".to_owned(), input_schema(r)));
        }
        for _ in 0..r.below(3) {
            let key =
                r.pick(&["\"description\"", "\"annotations\"", "\"outputSchema\"", "\"x\"", "\"title\""]);
            let value = if key == "\"outputSchema\"" { input_schema(r) } else { r.pick(SCALARS).to_owned() };
            members.push((key.to_owned(), value));
        }
        shuffle(r, &mut members);
        object(r, &members)
    }

    fn message(r: &mut Rng) -> String {
        let tools: Vec<String> = (0..r.below(6)).map(|_| tool(r)).collect();
        let mut result = vec![("\"tools\"".to_owned(), array(r, &tools))];
        if r.below(3) == 0 {
            result.push(("\"nextCursor\"".to_owned(), "\"c\\u0032\"".to_owned()));
        }
        if r.below(3) == 0 {
            result
                .push(("\"cacheScope\"".to_owned(), r.pick(&["\"public\"", "\"private\"", "7"]).to_owned()));
        }
        if r.below(4) == 0 {
            result.push(("\"ttlMs\"".to_owned(), "0".to_owned()));
        }
        shuffle(r, &mut result);
        let mut top = vec![
            ("\"jsonrpc\"".to_owned(), "\"2.0\"".to_owned()),
            ("\"id\"".to_owned(), r.pick(SCALARS).to_owned()),
            ("\"result\"".to_owned(), object(r, &result)),
        ];
        shuffle(r, &mut top);
        format!("{}{}{}", r.pick(WS), object(r, &top), r.pick(WS))
    }

    #[test]
    fn generated_lists_agree_with_the_twin() {
        let mut r = Rng(0x2545_F491_4F6C_DD1D);
        let maps = [StampMap::agentchattr(), StampMap::empty()];
        let policies = [
            usual(),
            policy(None, &[], false, &["sender"]),
            policy(None, &[], true, &["sender", "agent"]),
            policy(Some(&["chat_*", "?😀"]), &["chat_who"], false, &["agent", "sender"]),
            policy(Some(&[]), &[], false, &[]),
            policy(None, &["*"], false, &["sender"]),
        ];
        let (mut ok, mut changed, mut learned) = (0, 0, 0);
        for i in 0..20_000 {
            let input = message(&mut r);
            let p = &policies[i % policies.len()];
            let map = &maps[(i / policies.len()) % maps.len()];
            let options = ListOptions { learn_room: r.below(4), insert_cache_scope: r.below(2) == 0 };
            match check(input.as_bytes(), p, map, options) {
                Ok(()) => {
                    ok += 1;
                    let edit = rewrite_list(input.as_bytes(), p, map, options).unwrap();
                    changed += usize::from(!edit.is_unchanged());
                    learned += usize::from(!edit.learned().is_empty());
                }
                Err(ListError::Duplicate { .. }) => {}
                Err(e) => panic!("{e} on {input}"),
            }
        }
        // The generator exercises every path, mostly on accepted lists.
        assert!(ok > 15_000 && changed > 5_000 && learned > 1_000, "{ok} {changed} {learned}");
    }

    #[test]
    fn mutated_lists_are_refused_exactly_when_they_are_not_json() {
        // The message is validated in its member walk, not by parse_value:
        // the two must agree on what is JSON.
        let mut r = Rng(0x9E37_79B9_7F4A_7C15);
        let bytes = b"{}[],:\"\\ \nx0-e.tn\xc3\xff";
        let (mut refused, mut accepted) = (0, 0);
        for _ in 0..20_000 {
            let mut m = message(&mut r).into_bytes();
            for _ in 0..1 + r.below(2) {
                let at = r.below(m.len() + 1);
                match r.below(3) {
                    0 if at < m.len() => m[at] = r.pick(bytes),
                    1 => m.insert(at, r.pick(bytes)),
                    _ => m.truncate(at),
                }
            }
            let json = json::parse_value(&m).is_ok();
            // An answer both malformed and ambiguous may be refused as either.
            match (rewrite_list(&m, &usual(), &StampMap::agentchattr(), ROOM), json) {
                (Err(ListError::Parse { .. } | ListError::TooDeep { .. }), false) => refused += 1,
                (Ok(_), true) => accepted += 1,
                (Err(ListError::Parse { .. } | ListError::TooDeep { .. }), true) | (Ok(_), false) => {
                    panic!("{json}: {}", String::from_utf8_lossy(&m))
                }
                (Err(_), _) => {}
            }
        }
        assert!(refused > 5_000 && accepted > 2_000, "{refused} {accepted}");
    }

    /// See: fuzz/corpus/tools_list/crash-malformed_after_a_duplicate.
    #[test]
    fn regression_malformed_after_a_duplicate_is_refused() {
        let input =
            br#"{"id":1,"result":0,"result":{"ttlMs":60000,"cacheScope":"x"},{"namelimit":"c$hatacheScope"#;
        let refused = rewrite_list(input, &usual(), &StampMap::agentchattr(), ROOM);
        assert_eq!(refused, Err(ListError::Duplicate { key: ListKey::Result, tool: None }));
    }

    #[test]
    fn every_truncation_is_refused() {
        // The rewriter is not incremental: a cut answer is never half-rewritten.
        let list = answer(&format!("{WHO},{RULES}"));
        for i in 0..list.len() {
            assert!(
                rewrite_list(&list.as_bytes()[..i], &usual(), &StampMap::agentchattr(), ROOM).is_err(),
                "{i}"
            );
        }
    }
}

//! The agent's identity (name + bearer token, and optionally its tool
//! lists) and its parsing from the identity file or a `--control-stdin`
//! line: `{"agent": "...", "token": "...", "allow_tools": [...],
//! "deny_tools": [...]}`. Pure: no I/O. The token is never printed, not
//! even by `Debug` or in an error.

use std::fmt;

use crate::mcp::json::{self, Kind, ScanError, Value};

pub use crate::limits::{MAX_AGENT_LEN, MAX_TOKEN_LEN};

#[derive(Clone, PartialEq, Eq)]
pub struct Identity {
    pub agent: String,
    pub token: String,
    /// `"allow_tools"` (globs): replaces the flags' allow list; an empty
    /// list allows no tool. `None` when absent.
    pub allow_tools: Option<Vec<String>>,
    /// `"deny_tools"` (globs): added to the flags' deny list. `None` when
    /// absent.
    pub deny_tools: Option<Vec<String>>,
}

impl Identity {
    /// An identity with no tool lists (the flags' policy applies).
    pub fn new(agent: String, token: String) -> Identity {
        Identity { agent, token, allow_tools: None, deny_tools: None }
    }
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Identity");
        d.field("agent", &self.agent).field("token", &"<redacted>");
        // Shown only when present, so an identity without lists reads as
        // it always did.
        if let Some(allow) = &self.allow_tools {
            d.field("allow_tools", allow);
        }
        if let Some(deny) = &self.deny_tools {
            d.field("deny_tools", deny);
        }
        d.finish()
    }
}

/// Which field of the identity object an error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    Agent,
    Token,
    AllowTools,
    DenyTools,
}

impl Field {
    fn name(self) -> &'static str {
        match self {
            Field::Agent => "agent",
            Field::Token => "token",
            Field::AllowTools => "allow_tools",
            Field::DenyTools => "deny_tools",
        }
    }
}

/// Why an identity is refused. Carries no value of the input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdentityError {
    /// Not JSON; `offset` is where the scanner stopped.
    Json {
        offset: usize,
    },
    NotObject,
    Missing(Field),
    Duplicate(Field),
    NotString(Field),
    /// A tool list that is not an array, or holds an element that is not a
    /// string.
    NotStringList(Field),
    /// A string with a lone surrogate escape: no valid text.
    BadString(Field),
    Empty(Field),
    TooLong(Field),
    /// A control character in the agent name.
    AgentControl,
    /// A token byte outside visible ASCII (0x21..=0x7E).
    TokenChar,
}

impl From<ScanError> for IdentityError {
    fn from(e: ScanError) -> Self {
        let (ScanError::Syntax { offset }
        | ScanError::InvalidUtf8 { offset }
        | ScanError::TooDeep { offset }) = e;
        IdentityError::Json { offset }
    }
}

impl fmt::Display for IdentityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdentityError::Json { offset } => {
                write!(f, "identity is not valid JSON (byte {offset})")
            }
            IdentityError::NotObject => f.write_str("identity is not a JSON object"),
            IdentityError::Missing(k) => write!(f, "identity has no \"{}\"", k.name()),
            IdentityError::Duplicate(k) => write!(f, "identity has \"{}\" twice", k.name()),
            IdentityError::NotString(k) => {
                write!(f, "identity \"{}\" is not a string", k.name())
            }
            IdentityError::NotStringList(k) => {
                write!(f, "identity \"{}\" is not an array of strings", k.name())
            }
            IdentityError::BadString(k) => {
                write!(f, "identity \"{}\" holds a lone surrogate", k.name())
            }
            IdentityError::Empty(k) => write!(f, "identity \"{}\" is empty", k.name()),
            IdentityError::TooLong(k) => {
                let max = if *k == Field::Token { MAX_TOKEN_LEN } else { MAX_AGENT_LEN };
                write!(f, "identity \"{}\" is longer than {max} bytes", k.name())
            }
            IdentityError::AgentControl => f.write_str("identity \"agent\" holds a control character"),
            IdentityError::TokenChar => f.write_str("identity \"token\" holds a byte outside visible ASCII"),
        }
    }
}

/// Parses one identity object: `agent` and `token` required strings,
/// `allow_tools` and `deny_tools` optional arrays of strings, duplicates
/// refused, unknown keys ignored, whitespace (a trailing newline) allowed.
pub fn parse(bytes: &[u8]) -> Result<Identity, IdentityError> {
    let top = json::parse_value(bytes)?;
    let Kind::Object { .. } = top.kind else {
        return Err(IdentityError::NotObject);
    };
    let mut agent = None;
    let mut token = None;
    let mut allow = None;
    let mut deny = None;
    json::for_each_member(bytes, &top, |key, value| {
        let (slot, field) = if key.is(bytes, "agent") {
            (&mut agent, Field::Agent)
        } else if key.is(bytes, "token") {
            (&mut token, Field::Token)
        } else if key.is(bytes, "allow_tools") {
            (&mut allow, Field::AllowTools)
        } else if key.is(bytes, "deny_tools") {
            (&mut deny, Field::DenyTools)
        } else {
            return Ok(());
        };
        if slot.is_some() {
            return Err(IdentityError::Duplicate(field));
        }
        *slot = Some(value);
        Ok(())
    })?;
    let agent = text(bytes, agent, Field::Agent)?;
    let token = text(bytes, token, Field::Token)?;
    validate_agent(&agent)?;
    validate_token(&token)?;
    let allow_tools = allow.map(|v| text_list(bytes, v, Field::AllowTools)).transpose()?;
    let deny_tools = deny.map(|v| text_list(bytes, v, Field::DenyTools)).transpose()?;
    Ok(Identity { agent, token, allow_tools, deny_tools })
}

/// A tool list: an array whose elements are all strings of valid text.
fn text_list(bytes: &[u8], v: Value, field: Field) -> Result<Vec<String>, IdentityError> {
    let Kind::Array = v.kind else {
        return Err(IdentityError::NotStringList(field));
    };
    let mut list = Vec::new();
    json::for_each_element(bytes, &v, |e| {
        let Kind::String { .. } = e.kind else {
            return Err(IdentityError::NotStringList(field));
        };
        list.push(e.decode_str(bytes).ok_or(IdentityError::BadString(field))?);
        Ok(())
    })?;
    Ok(list)
}

fn text(bytes: &[u8], v: Option<Value>, field: Field) -> Result<String, IdentityError> {
    let v = v.ok_or(IdentityError::Missing(field))?;
    let Kind::String { .. } = v.kind else {
        return Err(IdentityError::NotString(field));
    };
    v.decode_str(bytes).ok_or(IdentityError::BadString(field))
}

/// An agent name: non-empty, at most `MAX_AGENT_LEN` bytes, no control
/// characters (it is logged and shown in chat).
pub fn validate_agent(agent: &str) -> Result<(), IdentityError> {
    if agent.is_empty() {
        return Err(IdentityError::Empty(Field::Agent));
    }
    if agent.len() > MAX_AGENT_LEN {
        return Err(IdentityError::TooLong(Field::Agent));
    }
    if agent.chars().any(char::is_control) {
        return Err(IdentityError::AgentControl);
    }
    Ok(())
}

/// A token: non-empty, at most `MAX_TOKEN_LEN` bytes, visible ASCII only,
/// since it is written into `Authorization` and `X-Agent-Token` verbatim.
pub fn validate_token(token: &str) -> Result<(), IdentityError> {
    if token.is_empty() {
        return Err(IdentityError::Empty(Field::Token));
    }
    if token.len() > MAX_TOKEN_LEN {
        return Err(IdentityError::TooLong(Field::Token));
    }
    if !token.bytes().all(|c| (0x21..=0x7e).contains(&c)) {
        return Err(IdentityError::TokenChar);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn parses_identity_objects() {
        let ok: &[(&str, &str, &str)] = &[
            (r#"{"agent":"claude","token":"t0k"}"#, "claude", "t0k"),
            ("  {\"token\": \"t\", \"agent\": \"codex-2\", \"extra\": [1, {}]}\n", "codex-2", "t"),
            (r#"{"\u0061gent":"\u00e9\ud83d\ude00","token":"a\/b"}"#, "é😀", "a/b"),
            (r#"{"agent":"a b","token":"x","agent_old":1}"#, "a b", "x"),
        ];
        for (input, agent, token) in ok {
            let id = parse(input.as_bytes()).unwrap();
            assert_eq!((id.agent.as_str(), id.token.as_str()), (*agent, *token));
        }
    }

    #[test]
    fn refuses_bad_identities() {
        use IdentityError as E;
        let bad: &[(&[u8], IdentityError)] = &[
            (b"", E::Json { offset: 0 }),
            (b"{\"agent\":\"a\",\"token\":\"t\"} x", E::Json { offset: 26 }),
            (b"{\"agent\":\"a\",\"token\":\"\xff\"}", E::Json { offset: 22 }),
            (b"[]", E::NotObject),
            (b"\"a\"", E::NotObject),
            (b"{\"agent\":\"a\"}", E::Missing(Field::Token)),
            (b"{\"token\":\"t\"}", E::Missing(Field::Agent)),
            (b"{\"agent\":\"a\",\"token\":\"t\",\"agent\":\"b\"}", E::Duplicate(Field::Agent)),
            (b"{\"agent\":\"a\",\"token\":\"t\",\"t\\u006fken\":\"u\"}", E::Duplicate(Field::Token)),
            (b"{\"agent\":1,\"token\":\"t\"}", E::NotString(Field::Agent)),
            (b"{\"agent\":\"a\",\"token\":null}", E::NotString(Field::Token)),
            (b"{\"agent\":\"\\ud800\",\"token\":\"t\"}", E::BadString(Field::Agent)),
            (b"{\"agent\":\"\",\"token\":\"t\"}", E::Empty(Field::Agent)),
            (b"{\"agent\":\"a\",\"token\":\"\"}", E::Empty(Field::Token)),
            (b"{\"agent\":\"a\\nb\",\"token\":\"t\"}", E::AgentControl),
            (b"{\"agent\":\"a\\u0085b\",\"token\":\"t\"}", E::AgentControl),
            (b"{\"agent\":\"a\",\"token\":\"t t\"}", E::TokenChar),
            (b"{\"agent\":\"a\",\"token\":\"t\\r\\nX-Evil: 1\"}", E::TokenChar),
            (b"{\"agent\":\"a\",\"token\":\"t\xc3\xa9\"}", E::TokenChar),
        ];
        for (input, want) in bad {
            assert_eq!(parse(input), Err(*want), "{:?}", String::from_utf8_lossy(input));
        }
        let long_agent = format!(r#"{{"agent":"{}","token":"t"}}"#, "a".repeat(MAX_AGENT_LEN + 1));
        assert_eq!(parse(long_agent.as_bytes()), Err(E::TooLong(Field::Agent)));
        let max_agent = format!(r#"{{"agent":"{}","token":"t"}}"#, "é".repeat(MAX_AGENT_LEN / 2));
        assert!(parse(max_agent.as_bytes()).is_ok());
        let long_token = format!(r#"{{"agent":"a","token":"{}"}}"#, "t".repeat(MAX_TOKEN_LEN + 1));
        assert_eq!(parse(long_token.as_bytes()), Err(E::TooLong(Field::Token)));
    }

    #[test]
    fn tool_lists() {
        type Lists = (Option<Vec<&'static str>>, Option<Vec<&'static str>>);
        let ok: &[(&str, Lists)] = &[
            (r#"{"agent":"a","token":"t"}"#, (None, None)),
            (r#"{"agent":"a","token":"t","allow_tools":[]}"#, (Some(vec![]), None)),
            (
                r#"{"allow_tools":["chat_*","chat_\u0072ead"],"agent":"a","token":"t","deny_tools":[ "chat_rules" ]}"#,
                (Some(vec!["chat_*", "chat_read"]), Some(vec!["chat_rules"])),
            ),
            (r#"{"agent":"a","token":"t","deny_tools":["", "?"]}"#, (None, Some(vec!["", "?"]))),
        ];
        for (input, (allow, deny)) in ok {
            let id = parse(input.as_bytes()).unwrap();
            let own = |l: &Option<Vec<&str>>| l.as_ref().map(|l| l.iter().map(|s| s.to_string()).collect());
            assert_eq!((id.allow_tools, id.deny_tools), (own(allow), own(deny)), "{input}");
        }
        use IdentityError as E;
        let bad: &[(&str, IdentityError)] = &[
            (r#"{"agent":"a","token":"t","allow_tools":"chat_*"}"#, E::NotStringList(Field::AllowTools)),
            (r#"{"agent":"a","token":"t","allow_tools":null}"#, E::NotStringList(Field::AllowTools)),
            (r#"{"agent":"a","token":"t","deny_tools":["a",1]}"#, E::NotStringList(Field::DenyTools)),
            (r#"{"agent":"a","token":"t","deny_tools":[["a"]]}"#, E::NotStringList(Field::DenyTools)),
            (r#"{"agent":"a","token":"t","deny_tools":["\udc00"]}"#, E::BadString(Field::DenyTools)),
            (
                r#"{"agent":"a","token":"t","allow_tools":[],"allow_tools":[]}"#,
                E::Duplicate(Field::AllowTools),
            ),
            (
                r#"{"agent":"a","token":"t","deny_tools":[],"deny\u005ftools":["x"]}"#,
                E::Duplicate(Field::DenyTools),
            ),
            // The agent and token are checked first.
            (r#"{"agent":"","token":"t","deny_tools":5}"#, E::Empty(Field::Agent)),
        ];
        for (input, want) in bad {
            assert_eq!(parse(input.as_bytes()), Err(*want), "{input}");
        }
        let shown = [
            E::NotStringList(Field::AllowTools).to_string(),
            E::Duplicate(Field::DenyTools).to_string(),
            E::BadString(Field::DenyTools).to_string(),
        ];
        assert_eq!(
            shown,
            [
                "identity \"allow_tools\" is not an array of strings",
                "identity has \"deny_tools\" twice",
                "identity \"deny_tools\" holds a lone surrogate",
            ]
        );
        let id = parse(br#"{"agent":"a","token":"secret-token","allow_tools":["x"]}"#).unwrap();
        assert_eq!(format!("{id:?}"), r#"Identity { agent: "a", token: "<redacted>", allow_tools: ["x"] }"#);
        assert_eq!(
            format!("{:?}", Identity::new("a".into(), "t".into())),
            r#"Identity { agent: "a", token: "<redacted>" }"#
        );
    }

    #[test]
    fn token_never_shows() {
        let id = parse(format!(r#"{{"agent":"claude","token":"{TOKEN}"}}"#).as_bytes()).unwrap();
        let debug = format!("{id:?}");
        assert!(debug.contains("claude") && !debug.contains(TOKEN), "{debug}");
        let inputs = [
            format!(r#"{{"agent":"claude","token":"{TOKEN} "}}"#),
            format!(r#"{{"agent":"","token":"{TOKEN}"}}"#),
            format!(r#"{{"agent":"a","token":"{TOKEN}","token":"{TOKEN}"}}"#),
            format!(r#"{{"agent":"a","token":"{TOKEN}"#),
            format!(r#"{{"agent":"a","token":["{TOKEN}"]}}"#),
        ];
        for input in inputs {
            let e = parse(input.as_bytes()).unwrap_err();
            for shown in [e.to_string(), format!("{e:?}")] {
                assert!(!shown.contains(TOKEN) && !shown.contains("0123"), "{shown}");
            }
        }
    }

    #[test]
    fn round_trips_through_a_serialised_object() {
        for (agent, token) in [("claude", TOKEN), ("q\"uote\\ é", "!~"), ("\u{7f}x", "a")] {
            let mut text = b"{\"agent\":".to_vec();
            json::write_json_string(agent, &mut text);
            text.extend_from_slice(b",\"token\":");
            json::write_json_string(token, &mut text);
            text.extend_from_slice(b"}\n");
            match parse(&text) {
                Ok(id) => assert_eq!((id.agent.as_str(), id.token.as_str()), (agent, token)),
                Err(e) => assert_eq!(validate_agent(agent), Err(e)),
            }
        }
    }
}

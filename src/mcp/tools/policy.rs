//! The tool policy of one agent: which tools it may see and call (allow and
//! deny globs, deny wins), whether the identity parameters the proxy stamps
//! stay visible in `tools/list`, and which parameter names are learned as
//! identity parameters from the server's schemas. Built from the flags and
//! the identity file's `allow_tools` / `deny_tools`. Pure.

use crate::mcp::identity::Identity;
use crate::mcp::json::Value;
use crate::mcp::stamp::StampMap;
use crate::mcp::tools::glob::Glob;

/// What the command line says (`--allow-tool`, `--deny-tool`,
/// `--show-identity-params`, `--identity-param`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolFlags {
    /// `--allow-tool GLOB` (repeatable); `None` when never given: all tools.
    pub allow: Option<Vec<String>>,
    /// `--deny-tool GLOB` (repeatable).
    pub deny: Vec<String>,
    pub show_identity_params: bool,
    /// `--identity-param NAME` (repeatable): `["sender"]` by default while
    /// the default stamp map is in force, empty with `--no-default-stamps`
    /// unless given. Earlier names win when a tool has several.
    pub identity_params: Vec<String>,
}

/// The effective policy. Cheap to query; build it once per identity change.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    /// `None`: every tool is allowed (before `deny`). `Some(empty)`: none.
    allow: Option<Vec<Glob>>,
    deny: Vec<Glob>,
    show_identity_params: bool,
    identity_params: Vec<String>,
}

/// What a `tools/list` answer needs, given the policy and the stamp map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListHandling {
    /// Relay it byte for byte, as any other answer: the policy hides
    /// nothing and there is nothing to learn.
    Relay,
    /// The output is the input (the policy hides nothing), but the list
    /// may teach stamps: the answer may be relayed as it streams while a
    /// bounded copy is read with `rewrite_list`; a copy over the bound, or
    /// one that cannot be read, is only not learned from.
    Learn,
    /// The answer must be read whole, rewritten with `rewrite_list` and
    /// sent as rewritten; what cannot be rewritten must not be relayed.
    Rewrite,
}

impl Policy {
    /// The policy of the flags alone.
    pub fn from_flags(flags: &ToolFlags) -> Policy {
        Policy::effective(flags, None, None)
    }

    /// The policy of the flags with the identity file's lists: an absent
    /// field leaves the flags' list in force; `allow_tools` replaces the
    /// flags' allow list (an empty one allows nothing); `deny_tools` adds to
    /// the flags' deny list.
    pub fn effective(
        flags: &ToolFlags,
        allow_tools: Option<&[String]>,
        deny_tools: Option<&[String]>,
    ) -> Policy {
        let globs = |list: &[String]| list.iter().map(|g| Glob::new(g)).collect::<Vec<_>>();
        let allow = match allow_tools {
            Some(file) => Some(globs(file)),
            None => flags.allow.as_deref().map(globs),
        };
        let mut deny = globs(&flags.deny);
        deny.extend(deny_tools.map(globs).unwrap_or_default());
        Policy {
            allow,
            deny,
            show_identity_params: flags.show_identity_params,
            identity_params: flags.identity_params.clone(),
        }
    }

    /// `effective` with the lists of an identity (file or control line).
    pub fn for_identity(flags: &ToolFlags, identity: &Identity) -> Policy {
        Policy::effective(flags, identity.allow_tools.as_deref(), identity.deny_tools.as_deref())
    }

    /// Whether the agent may see and call `tool` (the decoded name).
    pub fn allows(&self, tool: &str) -> bool {
        let allowed = self.allow.as_ref().map_or(true, |a| a.iter().any(|g| g.matches(tool)));
        allowed && !self.deny.iter().any(|g| g.matches(tool))
    }

    /// No allow list and no deny list: every tool is allowed, whatever its
    /// name (even one that is not a string).
    pub fn allows_all(&self) -> bool {
        self.allow.is_none() && self.deny.is_empty()
    }

    /// Whether a `tools/call` whose `params.name` is `name` (a value the
    /// JSON scanner returned for `body`) may go upstream. The name is read
    /// as the stamp reads it, escapes decoded. Under an allow or deny list
    /// a call whose name is missing, not a string, or not valid text (a
    /// lone surrogate) is refused: no glob can vouch for it.
    pub fn allows_call(&self, body: &[u8], name: Option<&Value>) -> bool {
        if self.allows_all() {
            return true;
        }
        name.and_then(|n| n.decode_cow(body)).is_some_and(|n| self.allows(&n))
    }

    pub fn show_identity_params(&self) -> bool {
        self.show_identity_params
    }

    pub fn identity_params(&self) -> &[String] {
        &self.identity_params
    }

    /// What an answer to `tools/list` needs; `learn_room` is how many more
    /// stamps may be learned (`StampMap::learn_room`).
    pub fn list_handling(&self, map: &StampMap, learn_room: usize) -> ListHandling {
        let learns = learn_room > 0 && !self.identity_params.is_empty();
        let hides_params = !self.show_identity_params && (!map.is_empty() || learns);
        if !self.allows_all() || hides_params {
            ListHandling::Rewrite
        } else if learns {
            ListHandling::Learn
        } else {
            ListHandling::Relay
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(xs: &[&str]) -> Vec<String> {
        xs.iter().map(|s| s.to_string()).collect()
    }

    fn flags(allow: Option<&[&str]>, deny: &[&str]) -> ToolFlags {
        ToolFlags {
            allow: allow.map(strings),
            deny: strings(deny),
            show_identity_params: false,
            identity_params: strings(&["sender"]),
        }
    }

    const TOOLS: &[&str] = &["chat_send", "chat_read", "chat_rules", "chat_decision", "chat_who", "other"];

    /// Which of `TOOLS` a policy allows.
    fn allowed(p: &Policy) -> Vec<&'static str> {
        TOOLS.iter().copied().filter(|t| p.allows(t)).collect()
    }

    #[test]
    fn allow_and_deny() {
        let cases: &[(Option<&[&str]>, &[&str], &[&str])] = &[
            (None, &[], TOOLS),
            (None, &["chat_rules", "chat_decision"], &["chat_send", "chat_read", "chat_who", "other"]),
            (Some(&[]), &[], &[]),
            (Some(&["chat_*"]), &[], &["chat_send", "chat_read", "chat_rules", "chat_decision", "chat_who"]),
            (Some(&["chat_*"]), &["chat_r*"], &["chat_send", "chat_decision", "chat_who"]),
            // Deny wins over an exact allow.
            (Some(&["chat_send"]), &["chat_send"], &[]),
            (Some(&["chat_???d", "other"]), &[], &["chat_send", "chat_read", "other"]),
        ];
        for (allow, deny, want) in cases {
            let p = Policy::from_flags(&flags(*allow, deny));
            assert_eq!(allowed(&p), *want, "allow {allow:?} deny {deny:?}");
        }
    }

    #[test]
    fn identity_file_lists_combine_with_the_flags() {
        // (flags allow, flags deny, file allow_tools, file deny_tools, allowed)
        let cases: &[(Option<&[&str]>, &[&str], Option<&[&str]>, Option<&[&str]>, &[&str])] = &[
            // Absent fields leave the flags in force.
            (
                Some(&["chat_*"]),
                &["chat_rules"],
                None,
                None,
                &["chat_send", "chat_read", "chat_decision", "chat_who"],
            ),
            // allow_tools replaces the flags' allow list...
            (Some(&["chat_*"]), &[], Some(&["other"]), None, &["other"]),
            (None, &[], Some(&["chat_send"]), None, &["chat_send"]),
            // ...an empty one allows nothing...
            (Some(&["chat_*"]), &[], Some(&[]), None, &[]),
            // ...and the flags' deny list still holds.
            (None, &["chat_send"], Some(&["chat_s*", "chat_r*"]), None, &["chat_read", "chat_rules"]),
            // deny_tools adds to the flags' deny list.
            (
                None,
                &["chat_rules"],
                None,
                Some(&["chat_decision"]),
                &["chat_send", "chat_read", "chat_who", "other"],
            ),
            (None, &[], None, Some(&[]), TOOLS),
            (
                Some(&["chat_*"]),
                &["chat_who"],
                Some(&["*"]),
                Some(&["other"]),
                &["chat_send", "chat_read", "chat_rules", "chat_decision"],
            ),
        ];
        for (allow, deny, file_allow, file_deny, want) in cases {
            let fa = file_allow.map(strings);
            let fd = file_deny.map(strings);
            let p = Policy::effective(&flags(*allow, deny), fa.as_deref(), fd.as_deref());
            assert_eq!(allowed(&p), *want, "{allow:?} {deny:?} {file_allow:?} {file_deny:?}");
        }
    }

    #[test]
    fn for_identity_reads_the_identity_lists() {
        let id = crate::mcp::identity::parse(
            br#"{"agent":"a","token":"t","allow_tools":["chat_*"],"deny_tools":["chat_rules"]}"#,
        )
        .unwrap();
        let p = Policy::for_identity(&flags(Some(&["other"]), &["chat_who"]), &id);
        assert_eq!(allowed(&p), ["chat_send", "chat_read", "chat_decision"]);
    }

    #[test]
    fn calls_are_read_as_the_stamp_reads_names() {
        let p = Policy::from_flags(&flags(None, &["chat_rules"]));
        let open = Policy::from_flags(&flags(None, &[]));
        let cases: &[(&str, bool, bool)] = &[
            (r#""chat_send""#, true, true),
            (r#""chat_rules""#, false, true),
            (r#""chat\u005frules""#, false, true),
            (r#""\ud800""#, false, true),
            ("7", false, true),
            ("null", false, true),
        ];
        for &(name, want, want_open) in cases {
            let v = crate::mcp::json::parse_value(name.as_bytes()).unwrap();
            assert_eq!(p.allows_call(name.as_bytes(), Some(&v)), want, "{name}");
            assert_eq!(open.allows_call(name.as_bytes(), Some(&v)), want_open, "{name}");
        }
        assert!(!p.allows_call(b"", None));
        assert!(open.allows_call(b"", None));
    }

    #[test]
    fn list_handling() {
        let agentchattr = StampMap::agentchattr();
        let empty = StampMap::empty();
        let with = |allow: Option<&[&str]>, deny: &[&str], show: bool, params: &[&str]| {
            Policy::from_flags(&ToolFlags {
                allow: allow.map(strings),
                deny: strings(deny),
                show_identity_params: show,
                identity_params: strings(params),
            })
        };
        use ListHandling::*;
        let cases: &[(Policy, &StampMap, usize, ListHandling)] = &[
            // The default: the map's parameters are hidden.
            (with(None, &[], false, &["sender"]), &agentchattr, 256, Rewrite),
            (with(None, &[], false, &["sender"]), &agentchattr, 0, Rewrite),
            // --show-identity-params with no list: relayed, or read to learn.
            (with(None, &[], true, &["sender"]), &agentchattr, 256, Learn),
            (with(None, &[], true, &["sender"]), &agentchattr, 0, Relay),
            (with(None, &[], true, &[]), &agentchattr, 256, Relay),
            // --no-default-stamps and nothing given: nothing to do.
            (with(None, &[], false, &[]), &empty, 256, Relay),
            (with(None, &[], false, &["agent"]), &empty, 256, Rewrite),
            (with(None, &[], false, &["agent"]), &empty, 0, Relay),
            // Any list rewrites.
            (with(None, &["x"], true, &[]), &empty, 0, Rewrite),
            (with(Some(&["*"]), &[], true, &[]), &empty, 0, Rewrite),
        ];
        for (i, (p, map, room, want)) in cases.iter().enumerate() {
            assert_eq!(p.list_handling(map, *room), *want, "case {i}");
        }
    }
}

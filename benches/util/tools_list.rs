// A tools/list answer shaped like agentchattr's (12 tools, FastMCP 1.x
// through pydantic: compact JSON, properties in signature order with their
// keys sorted, `required` left out when a tool has no required parameter,
// an `outputSchema` per tool): about 10 KB, as agentchattr's own answer
// (9,711 bytes at a813e38). The tool signatures follow agentchattr's
// `mcp_bridge.py`; the descriptions are this file's own text of a similar
// length and make-up (`\n` escapes, quoted examples, a few non-ASCII
// characters). `copies` > 1 appends renamed copies of the 12 tools
// (`v2_chat_send`, ...): tools no stamp map knows, as a server that grew.
//
// Plain `//` comments: the unit tests `include!` this file, the benches
// load it with `#[path]`.

// (name, description, parameters as (name, JSON type, default JSON or ""
// for a required one)).
type Param = (&'static str, &'static str, &'static str);

#[allow(dead_code)]
const TOOLS: &[(&str, &str, &[Param])] = &[
    (
        "chat_send",
        "Post a message to the shared chat. Put your own agent name in sender (for example claude or codex).\nAttach a local picture with image_path (an absolute path), answer a message with reply_to (its id).\nWhere the message goes:\n  - channel or job_id, when given, is the target.\n  - With neither, it goes where this sender last read with chat_read, so an answer after\n    `chat_read(channel=\"release\")` lands in #release rather than #general.\n  - A sender that never read anything writes to 'general'.\nALWAYS give choices. For a yes/no or pick-one question list the options, so that a person\ncan answer with one click:\n  chat_send(sender=\"claude\", message=\"Ship it?\", choices=[\"Yes\", \"No\", \"Show me the diff\"])\nFor an ordinary message pass an empty list:\n  chat_send(sender=\"claude\", message=\"Finished the review — two nits.\", choices=[])\nMessages over 4,000 characters are cut; split long reports into several messages, each with\nits own heading, and reference earlier ones by id instead of quoting them again.",
        &[
            ("sender", "string", ""),
            ("message", "string", ""),
            ("choices", "array", "[]"),
            ("image_path", "string", "\"\""),
            ("reply_to", "integer", "-1"),
            ("channel", "string", "\"\""),
            ("job_id", "integer", "0"),
        ],
    ),
    (
        "chat_read",
        "Read messages from the chat. The answer is a JSON array of objects with id, sender, text, type, time and channel.\n\nHow it picks what to return:\n- The first call with a sender returns the newest `limit` messages, the whole context.\n- Later calls with the same sender return only what arrived since that sender's last read.\n- since_id overrides the cursor and reads from that message on.\n- Without a sender it always returns the newest `limit` messages and keeps no cursor.\n- channel restricts the read to one channel (by default every channel is read).\n- job_id reads one job: a header entry with the job's title and body comes first, then\n  the messages of its thread, oldest first.\nRead before you write: a reply that ignores what others said in the meantime costs everyone a round trip.",
        &[
            ("sender", "string", "\"\""),
            ("since_id", "integer", "0"),
            ("limit", "integer", "20"),
            ("channel", "string", "\"\""),
            ("job_id", "integer", "0"),
        ],
    ),
    (
        "chat_resync",
        "Fetch the full context on purpose.\n\nReturns the newest `limit` messages and moves this sender's cursor to the newest one returned.\nchannel restricts it to one channel (by default: all channels). Use it after a long pause,\nafter a restart, or when chat_read's incremental answers no longer make sense to you — not on every turn.",
        &[("sender", "string", ""), ("limit", "integer", "50"), ("channel", "string", "\"\"")],
    ),
    (
        "chat_join",
        "Say that you are connected. Call it once when a session starts; the others then see you in chat_who's list.",
        &[("name", "string", ""), ("channel", "string", "\"general\"")],
    ),
    ("chat_who", "List who is online right now.", &[]),
    (
        "chat_rules",
        "Shared rules: the working style everyone follows. Agents list and propose them; people approve them in the web UI.\n\nActions:\n  - list: the rules in force (the current working style), numbered.\n  - propose: suggest a new rule for a person to approve. Needs the rule's text, a sender and a channel.\n\nchannel places the proposal card in the right chat channel (default: 'general').\nAgents cannot activate, change or remove rules; only people can, from the web UI. A proposal that\nrepeats a rule in force is refused, and at most 50 rules can be pending at once.",
        &[
            ("action", "string", ""),
            ("sender", "string", ""),
            ("rule", "string", "\"\""),
            ("reason", "string", "\"\""),
            ("channel", "string", "\"general\""),
        ],
    ),
    (
        "chat_decision",
        "Older name of chat_rules, kept so that existing prompts keep working. Use chat_rules.",
        &[
            ("action", "string", ""),
            ("sender", "string", ""),
            ("decision", "string", "\"\""),
            ("reason", "string", "\"\""),
        ],
    ),
    ("chat_channels", "List every channel. The answer is a JSON array of channel names.", &[]),
    (
        "chat_set_hat",
        "Give your avatar a hat. Pass an SVG document (viewBox \"0 0 32 16\", at most 5 KB).\nThe hat is drawn above your avatar in the chat; people can drag it to the bin to remove it.\nColours to design against: the chat background is dark (#0f0f17); avatars are claude=#da7756 (coral),\ncodex=#10a37f (green), gemini=#4285f4 (blue), qwen=#8b5cf6 (violet).\nOptional: target puts the hat on another agent (e.g. target=\"qwen\"). Keep it friendly.",
        &[("sender", "string", ""), ("svg", "string", ""), ("target", "string", "\"\"")],
    ),
    (
        "chat_claim",
        "Claim your identity when several instances of one agent are registered.\n\n- Without name: take the identity you were given and unlock chat_send.\n- With name: take back an earlier identity (for example one from a breadcrumb after /resume).\n\nsender must be the name you were registered under. The identity breadcrumb in chat_read's\nanswers shows your current identity.",
        &[("sender", "string", ""), ("name", "string", "\"\"")],
    ),
    (
        "chat_summary",
        "Read or write a channel's summary, so that whoever joins late catches up fast.\n\nActions:\n  - read: the current summary of a channel (default: the sender's last active channel).\n  - write: replace the summary (text required, at most 1,000 characters).\n\nWrite one when a thread settles: what was decided, what is open, who does what next. Keep it\nfactual — a summary is read by people and agents alike, and an outdated one misleads both.",
        &[
            ("action", "string", ""),
            ("sender", "string", ""),
            ("text", "string", "\"\""),
            ("channel", "string", "\"\""),
        ],
    ),
    (
        "chat_propose_job",
        "Propose a job for a person to approve. A proposal card appears in the timeline; the person\naccepts it (the job is created) or dismisses it. Agents must NOT create jobs directly: propose\nand let a person decide.\n\nArgs:\n    sender: your agent name.\n    title: a short title for the job (at most 80 characters).\n    body: what the job is, why, and what done looks like.\n    channel: where the card goes (default 'general').",
        &[
            ("sender", "string", ""),
            ("title", "string", ""),
            ("body", "string", "\"\""),
            ("channel", "string", "\"general\""),
        ],
    ),
];

// "image_path" -> "Image Path", as pydantic titles a field.
#[allow(dead_code)]
fn title_of(name: &str) -> String {
    name.split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next().map(|f| f.to_uppercase().chain(c).collect::<String>()).unwrap_or_default()
        })
        .collect::<Vec<_>>()
        .join(" ")
}

// The answer to `tools/list` with JSON-RPC id `id`: the 12 tools, then
// `copies - 1` renamed copies of them.
#[allow(dead_code)]
pub fn agentchattr_tools_list(id: u32, copies: usize) -> Vec<u8> {
    let mut tools = Vec::new();
    for (copy, (name, description, params)) in (0..copies).flat_map(|c| TOOLS.iter().map(move |t| (c, t))) {
        let name = if copy == 0 { name.to_string() } else { format!("v{}_{name}", copy + 1) };
        let mut props = Vec::new();
        let mut required = Vec::new();
        for (p, ty, default) in params.iter() {
            let mut schema = String::from("{");
            if !default.is_empty() {
                schema.push_str(&format!("\"default\":{default},"));
            }
            if *ty == "array" {
                schema.push_str("\"items\":{\"type\":\"string\"},");
            }
            schema.push_str(&format!("\"title\":\"{}\",\"type\":\"{ty}\"}}", title_of(p)));
            props.push(format!("\"{p}\":{schema}"));
            if default.is_empty() {
                required.push(format!("\"{p}\""));
            }
        }
        let required = if required.is_empty() {
            String::new()
        } else {
            format!("\"required\":[{}],", required.join(","))
        };
        tools.push(format!(
            concat!(
                "{{\"name\":\"{name}\",\"description\":\"{description}\",",
                "\"inputSchema\":{{\"properties\":{{{props}}},{required}\"title\":\"{name}Arguments\",\"type\":\"object\"}},",
                "\"outputSchema\":{{\"properties\":{{\"result\":{{\"title\":\"Result\",\"type\":\"string\"}}}},",
                "\"required\":[\"result\"],\"title\":\"{name}Output\",\"type\":\"object\"}}}}"
            ),
            name = name,
            description = description.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n"),
            props = props.join(","),
            required = required,
        ));
    }
    format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{{\"tools\":[{}]}}}}", tools.join(",")).into_bytes()
}

//! Every size, count and time limit of the proxy, in one place.
//!
//! Each value is a documented constant; the few a user may need to change are
//! exposed as flags in `config.rs` (timeouts) and default to these.

use std::time::Duration;

/// Largest request head (request line + fields) accepted from a client. Node
/// and h11 cap heads at 16 KiB; 64 KiB leaves room for long session or auth
/// values. Beyond it: 431 (RFC 6585 §5).
pub const MAX_REQUEST_HEAD: usize = 64 * 1024;

/// Largest response head accepted from the upstream; beyond it: 502.
pub const MAX_RESPONSE_HEAD: usize = 64 * 1024;

/// Largest answer head a forward proxy may send to a `CONNECT` (a 407's
/// head with its `Proxy-Authenticate` lines is some hundred bytes); beyond
/// it the tunnel fails as a proxy failure.
pub const MAX_PROXY_ANSWER_HEAD: usize = 16 * 1024;

/// Most field lines in one head (hyper's default is 100). Beyond it: 431 for
/// a client, 502 for the upstream.
pub const MAX_FIELDS: usize = 100;

/// Largest request body accepted, and so the most the proxy reads whole
/// (every body is read whole and scanned; chunked bodies are de-chunked). The
/// upstream's own limit is 4 MiB (FastMCP); beyond this: 413, answered
/// before the body is read.
pub const MAX_STAMP_BODY: usize = 8 * 1024 * 1024;

/// Longest chunk-size line (hex digits, extensions) in a chunked body.
pub const MAX_CHUNK_LINE: usize = 4096;

/// Largest trailer section of a chunked body; trailers are dropped.
pub const MAX_TRAILER: usize = 16 * 1024;

/// Nesting depth of JSON arrays and objects the stamper follows.
pub const MAX_JSON_DEPTH: usize = 128;

/// Size of the buffer each direction starts with. The client's grows up to
/// `MAX_REQUEST_HEAD` only while a head does not fit; the upstream's up to
/// `MAX_RELAY_BUF` while a response streams fast (and up to
/// `MAX_RESPONSE_HEAD` for a head). Also the most proxy-made bytes
/// (re-framed or rewritten payload) queued for the client before the relay
/// stops classifying and waits for a write.
pub const IO_BUF_SIZE: usize = 16 * 1024;

/// Base-size buffers kept on a free list for reuse (256 KiB at most): a
/// quiet stream gives its buffers back, the next event takes one again.
pub const BUF_POOL: usize = 16;

/// Most rounds over both sockets (`Conn::step`: each reads or writes until
/// the socket would block or its buffer is full) per drive of one
/// connection; past it the connection is driven again after the others
/// (`Verdict::Again`), so one busy connection cannot starve them on the
/// single thread.
pub const MAX_IO_PER_EVENT: usize = 32;

/// Most client connections open at once (lowered at start to what the
/// descriptor limit allows: two per connection); at the limit the listener
/// stops accepting until one closes.
pub const MAX_CONNECTIONS: usize = 16384;

/// Connections accepted at most on a Unix whose descriptor limit cannot be
/// read (two descriptors each, well inside the usual 1024).
pub const FALLBACK_CONNECTIONS: usize = 512;

/// How long accepting pauses after an accept error such as EMFILE, instead
/// of spinning on a listener that stays readable.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Readiness events taken from one poll.
pub const EVENT_CAPACITY: usize = 1024;

/// Rounds of "give me an upstream socket" per drive of one connection: a
/// pooled socket found stale, then fresh connects to each resolved address.
pub const MAX_UPSTREAM_ROUNDS: usize = 8;

/// Descriptors kept free for the listener, signal pipe, stdin and logs.
pub const RESERVED_FDS: u64 = 32;

/// Idle upstream connections kept for reuse across clients.
pub const MAX_POOLED_UPSTREAM: usize = 256;

/// Largest buffer a busy response stream grows to (from `IO_BUF_SIZE`):
/// fewer reads and writes per byte while data flows; released when quiet.
pub const MAX_RELAY_BUF: usize = 256 * 1024;

/// How long an idle upstream connection is kept. Below uvicorn's 5 s
/// keep-alive so that the upstream rarely closes a connection we are about
/// to reuse.
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(2);

/// Default time for a whole request, head and body, counted from its first
/// byte (`--request-timeout`); a byte does not extend it, so a client that
/// drips a head or stalls its body is cut off (slowloris). Then 408 and
/// close. nginx's `client_header_timeout` / HAProxy's `timeout
/// http-request` play the same role; 10 s is ample for the 8 MiB body limit
/// on loopback.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Default time an idle client connection is kept open before its first
/// request or between requests (`--keepalive-timeout`); nginx's
/// `keepalive_timeout` default.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(75);

/// Time a proxy-made answer (or the rest of a cut response) may take to
/// reach a client that does not read it; then the connection is dropped.
pub const ANSWER_FLUSH_TIMEOUT: Duration = Duration::from_secs(30);

/// Default upstream connect timeout (`--connect-timeout`); then 504.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Default time from a fully sent request to the upstream's response head
/// (`--response-timeout`). A long tool call in JSON-response mode answers
/// only when it ends; then 504.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(300);

/// Default idle timeout of an open exchange: no byte either way
/// (`--idle-timeout`): applies to open responses and streams only.
/// FastMCP pings every 15 s; Python clients give up
/// after 300 s.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// Default time a request in a recorded MCP session waits for a restarting
/// upstream (`--restart-grace`): an upstream restart takes a few seconds,
/// and the whole wait stays under the 10 s that client deadlines allow.
pub const RESTART_GRACE: Duration = Duration::from_secs(5);

/// How much longer than `--restart-grace` a recorded session's GET stream
/// is held open after its upstream went away (`conn/reattach.rs`): the time
/// a restart takes. agentchattr starts in about 1.5 s here; 10 s covers a
/// Python server's cold start on a loaded machine several times over, and
/// a held stream costs no buffer. Clients time a quiet GET stream out only
/// after 300 s (the Python SDK's `sse_read_timeout`), so none notices the
/// hold; past it the stream ends as a cut one and the client reconnects.
pub const STREAM_HOLD_EXTRA: Duration = Duration::from_secs(10);

/// A refused upstream connect is retried this many times...
pub const CONNECT_RETRIES: u32 = 3;
/// ...this far apart (nothing has been sent, so a retry is safe).
pub const CONNECT_RETRY_DELAY: Duration = Duration::from_millis(200);

/// How long in-flight exchanges may run after SIGINT/SIGTERM.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// How often the identity file is checked where no change notification is
/// wired (macOS, Windows, an unwatchable directory); Linux uses inotify and
/// never polls.
pub const IDENTITY_POLL: Duration = Duration::from_millis(250);

/// Longest line accepted on `--control-stdin`.
pub const MAX_CONTROL_LINE: usize = 64 * 1024;

/// Largest identity file or token file read.
pub const MAX_SECRET_FILE: u64 = 64 * 1024;

/// Most bytes of one event (all its lines, up to the blank line that
/// dispatches it) held while looking for its `event:` field, which may come
/// after its `data:` lines. An endpoint event is about 80 bytes; past this
/// the held bytes are flushed unchanged and scanning stops.
pub const MAX_SSE_HELD_EVENT: usize = 16 * 1024;

/// Most bytes scanned before the first dispatched event (comment-only blocks,
/// e.g. anti-buffering padding, do not dispatch). Past this, scanning stops,
/// so a stream that never sends an event is not scanned forever.
pub const MAX_SSE_SCAN: usize = 64 * 1024;

/// Longest agent name, in bytes; it is stamped into every tools/call.
pub const MAX_AGENT_LEN: usize = 256;

/// Longest token, in bytes; it goes into two request headers (agentchattr
/// tokens are 32 hex digits).
pub const MAX_TOKEN_LEN: usize = 4096;

/// Most connections the metrics listener serves at once (a scraper and a
/// health check or two); more wait in the listen queue.
pub const MAX_METRICS_CONNS: usize = 16;

/// Longest request head the metrics listener reads (two GET paths need
/// little); a head not whole by then is answered 431.
pub const MAX_METRICS_HEAD: usize = 8 * 1024;

/// A metrics listener's client must send its request within this, and then
/// has as long again to read the answer.
pub const METRICS_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest a stale `/healthz` waits for its probe connect (or
/// `--connect-timeout`, if shorter): container health checks time out
/// after a few seconds.
pub const HEALTH_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Most legacy SSE streams whose session the proxy routes POSTs' answers
/// to (the tool policy's errors and filtered lists): one or two per agent;
/// past it the oldest is forgotten and its POSTs are answered as if its
/// stream were not relayed here.
pub const MAX_LEGACY_STREAMS: usize = 256;

/// Most `tools/list` answers one legacy stream may owe a filter at once (a
/// client lists once per session, or once per list-changed notification).
pub const MAX_PENDING_LISTS: usize = 16;

/// Most bytes of the proxy's own events one legacy stream may owe while
/// its upstream is inside an event (an error event is about 100 bytes).
pub const MAX_LEGACY_QUEUED: usize = 64 * 1024;

/// Most MCP sessions the proxy records for transparent re-initialisation
/// after an upstream restart (a few agents, each with one or two sessions);
/// past it the least recently used is forgotten, which only means that
/// session gets the server's 404 as it would without the proxy.
pub const MAX_SESSIONS: usize = 64;

/// Longest `Mcp-Session-Id` recorded, in bytes. Servers use a UUID (32 to
/// 36 bytes); a longer id is relayed as usual but not tracked.
pub const MAX_SESSION_ID_LEN: usize = 128;

/// Largest `initialize` request body recorded for replay. Real clients send
/// 200 to 700 bytes (Claude Code, Gemini CLI and the SDKs: capabilities with
/// roots, sampling, elicitation, tasks; Codex adds a clientInfo title), but
/// a 2025-11-25 clientInfo may carry `icons`, which may be `data:` URIs of
/// a few KiB each: 64 KiB is a hundred times what is sent today. A larger
/// one is forwarded but its session not tracked; at most `MAX_SESSIONS` are
/// held.
pub const MAX_RECORDED_INITIALIZE: usize = 64 * 1024;

/// A recorded session not used for this long is forgotten (an agent's
/// working day; the server has long dropped it by then).
pub const SESSION_IDLE_TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);

/// Least time between two re-initialisations of one session: a server that
/// answers 404 to everything must not cause a storm of `initialize`s.
pub const REOPEN_INTERVAL: Duration = Duration::from_secs(1);

/// Largest upstream answer held whole during a re-initialisation: the 404
/// being recovered from (relayed as it came if the recovery fails).
/// FastMCP's is about 100 bytes; a larger 404 is relayed at once. The
/// answers to the replayed `initialize` and `notifications/initialized` are
/// not held: they are walked as they arrive, whatever their size.
pub const MAX_REOPEN_ANSWER: usize = 64 * 1024;

/// How long a request whose session is being re-initialised by another
/// request waits for it before getting the server's 404 (the whole wait
/// stays under the 10 s clients allow).
pub const REOPEN_WAIT: Duration = Duration::from_secs(8);

/// How often a waiting request looks at the session table (only while a
/// re-initialisation is in flight).
pub const REOPEN_POLL: Duration = Duration::from_millis(10);

/// The whole of a `--probe`: connect, send the request, read the status
/// line. The health endpoint is the proxy's own, answered in well under a
/// millisecond on loopback; an event loop that cannot answer within 3 s is
/// unhealthy. Well inside Docker's default HEALTHCHECK timeout (30 s), so
/// the probe's own line, not Docker's kill, says what went wrong.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// Most bytes of the answer a `--probe` reads: its status line must end
/// within them. `HTTP/1.1 503 Service Unavailable` is 32 bytes; 1 KiB
/// leaves room for any reason phrase.
pub const PROBE_MAX_STATUS_LINE: usize = 1024;

/// Most received bytes a failed `--probe` shows (escaped) in its one line
/// on stderr: enough to recognise what answered, never a body.
pub const PROBE_EXCERPT: usize = 32;

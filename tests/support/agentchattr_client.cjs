// One MCP session of the TypeScript SDK (StreamableHTTPClientTransport on Node's fetch) against agentchattr
// (through the proxy), driven step by step; JSON on stdout. The TypeScript twin of agentchattr_client.py.
//
//   NODE_PATH=<realenv>/node/node_modules node agentchattr_client.cjs URL --steps STEP[,STEP...]
//        [--transport streamable-http|stdio] [--sender mallory] [--timeout 60]
//
// connect (initialize + notifications/initialized + standalone GET stream), the steps, then
// terminateSession() (DELETE) and close(). With `--transport stdio`, URL is the command line of a stdio server as a
// JSON array (the proxy with `--stdio`), which StdioClientTransport spawns (with RUST_LOG from this environment,
// `debug` by default; its stderr is this script's): no HTTP to record, no session id, and close() ends it. Steps:
//
// - `list:LABEL`        tools/list; the tool names are recorded.
// - `call:LABEL`        chat_send {sender, message: LABEL, channel: "general", choices: []}; its result or error is
//                       recorded, never thrown.
// - `stream:LABEL:SECS` the state of the standalone GET streams: every GET so far with its status, when it opened
//                       (before the last pause began or not) and ended and why, and the bytes it carried before
//                       and after the last pause ended; first waits
//                       up to SECS seconds for a byte on a GET stream after the last pause (agentchattr's server
//                       writes a `: ping` comment on it every 15 s and nothing else).
// - `read:LABEL`        chat_read {sender, channel: "general"}; its result or error is recorded, never thrown.
// - `pause:NAME`        print `PAUSE NAME` and wait for a line on stdin (the test acts meanwhile).
//
// Every fetch is recorded by a wrapper under the transport (the body passes through a TransformStream that notes
// its chunks): method, path, status, the Mcp-Session-Id sent and read, the JSON-RPC method and id sent, the
// JSON-RPC messages of the answer (JSON or SSE `data:` lines), and for a GET its chunks and how it ended; plus the
// transport's errors. The request carries `Authorization: Bearer spoof` (the proxy replaces it).
//
// Prints `RESULT <json>` last; exits 0 even if something failed ("error").
'use strict';

const { Client } = require('@modelcontextprotocol/sdk/client/index.js');
const { StreamableHTTPClientTransport } = require('@modelcontextprotocol/sdk/client/streamableHttp.js');
const { StdioClientTransport } = require('@modelcontextprotocol/sdk/client/stdio.js');
const {
  errorOf,
  flagParser,
  printResult,
  recordCall,
  rpcOf,
  runBounded,
  sdkVersion,
  stdinPauses,
} = require('./client_common.cjs');

const CALL_TIMEOUT_MS = 15000;
const BODY_CAP = 256 * 1024;
const CHUNK_RECORDS_CAP = 200;

const parseArgs = flagParser(
  { steps: null, sender: 'mallory', timeout: 60, transport: 'streamable-http' },
  ['steps'],
  'usage: agentchattr_client.cjs URL --steps STEPS [options]',
);

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const now = () => Date.now() / 1000;

const stdin = stdinPauses();

// The JSON-RPC messages of a body (JSON, or the `data:` lines of SSE events), summarised.
function answersIn(contentType, text) {
  const texts = [];
  if (!text.trim()) return [];
  if (contentType.startsWith('application/json')) texts.push(text);
  else if (contentType.startsWith('text/event-stream')) {
    let data = [];
    for (const line of text.replace(/\r\n/g, '\n').split('\n')) {
      if (line.startsWith('data:')) data.push(line.slice(5).replace(/^ /, ''));
      else if (line === '' && data.length) {
        texts.push(data.join('\n'));
        data = [];
      }
    }
    if (data.length) texts.push(data.join('\n'));
  }
  const out = [];
  for (const t of texts) {
    let msg;
    try {
      msg = JSON.parse(t);
    } catch {
      out.push({ unparsed: t.slice(0, 200) });
      continue;
    }
    for (const m of Array.isArray(msg) ? msg : [msg]) {
      if (!m || typeof m !== 'object') continue;
      const rec = { id: m.id ?? null, method: m.method ?? null, has_result: 'result' in m, bytes: t.length };
      if ('error' in m) rec.error = m.error;
      if (m.result && typeof m.result === 'object' && 'protocolVersion' in m.result) {
        rec.protocol_version = m.result.protocolVersion;
      }
      out.push(rec);
    }
  }
  return out;
}

async function run(args, out) {
  let pauseT = null; // when the last pause began (PAUSE printed)
  let markT = now(); // the last pause's end (or the start)

  const recordingFetch = async (url, init) => {
    const method = (init && init.method) || 'GET';
    const sentHeaders = new Headers((init && init.headers) || {});
    const u = new URL(url);
    const entry = {
      t: now(),
      method,
      path: u.pathname + u.search,
      status: null,
      content_type: null,
      sent_session_id: sentHeaders.get('mcp-session-id'),
      session_get: null,
      rpc_method: null,
      rpc_id: null,
      bytes: 0,
      chunks: [],
      ended: null,
      end: null,
    };
    [entry.rpc_method, entry.rpc_id] = rpcOf(init && init.body);
    out.http.push(entry);
    let response;
    try {
      response = await fetch(url, init);
    } catch (e) {
      entry.ended = now();
      entry.end = `error: ${String(e && e.message ? e.message : e)}`;
      throw e;
    }
    entry.status = response.status;
    entry.content_type = response.headers.get('content-type');
    entry.session_get = response.headers.get('mcp-session-id');
    if (!response.body) {
      entry.ended = now();
      entry.end = 'no body';
      return response;
    }
    const decoder = new TextDecoder();
    let body = '';
    const finish = (how) => {
      if (entry.ended !== null) return;
      entry.ended = now();
      entry.end = how;
      if (method === 'POST' || (method === 'GET' && entry.status !== 200)) {
        entry.answers = answersIn(entry.content_type || '', body);
      }
      if (entry.status !== 200 && method !== 'DELETE') entry.body_text = body.slice(0, 600);
    };
    const reader = response.body.getReader();
    const counted = new ReadableStream({
      async pull(controller) {
        let next;
        try {
          next = await reader.read();
        } catch (e) {
          finish(`error: ${String(e && e.message ? e.message : e)}`);
          controller.error(e);
          return;
        }
        if (next.done) {
          finish('eof');
          controller.close();
          return;
        }
        const chunk = next.value;
        entry.bytes += chunk.byteLength;
        const text = decoder.decode(chunk, { stream: true });
        if (entry.chunks.length < CHUNK_RECORDS_CAP) entry.chunks.push({ t: now(), n: chunk.byteLength, head: text.slice(0, 80) });
        if (body.length < BODY_CAP) body += text.slice(0, BODY_CAP - body.length);
        controller.enqueue(chunk);
      },
      cancel(reason) {
        finish(`cancelled by the client: ${String(reason)}`);
        return reader.cancel(reason);
      },
    });
    return new Response(counted, { status: response.status, statusText: response.statusText, headers: response.headers });
  };

  const stdio = args.transport === 'stdio';
  const argv = stdio ? JSON.parse(args.url) : null;
  const transport = stdio
    ? new StdioClientTransport({
        command: argv[0],
        args: argv.slice(1),
        env: { RUST_LOG: process.env.RUST_LOG || 'debug' },
        stderr: 'inherit',
      })
    : new StreamableHTTPClientTransport(new URL(args.url), {
        requestInit: { headers: { Authorization: 'Bearer spoof' } },
        fetch: recordingFetch,
      });
  const client = new Client({ name: 'agentchattr-test-client', version: '0.0.1' });
  transport.onerror = (e) =>
    out.transport_errors.push({ t: now(), message: String(e && e.message ? e.message : e) });

  await client.connect(transport);
  const sessionId = () => (stdio ? null : (transport.sessionId ?? null));
  const callTool = (name, a) => client.callTool({ name, arguments: a }, undefined, { timeout: CALL_TIMEOUT_MS });

  async function call(label) {
    const rec = { step: 'call', label, message: label, started: now() };
    const t0 = performance.now();
    const lo = out.http.length;
    await recordCall(rec, () =>
      callTool('chat_send', { sender: args.sender, message: label, channel: 'general', choices: [] }),
    );
    rec.elapsed_ms = performance.now() - t0;
    rec.session_id = sessionId();
    rec.http_range = [lo, out.http.length];
    return rec;
  }

  async function read(label) {
    const rec = { step: 'read', label };
    await recordCall(rec, () => callTool('chat_read', { sender: args.sender, channel: 'general' }));
    rec.session_id = sessionId();
    return rec;
  }

  async function list(label) {
    const rec = { step: 'list', label };
    try {
      const tools = await client.listTools();
      rec.tools = tools.tools.map((t) => t.name);
    } catch (e) {
      rec.error = errorOf(e);
    }
    rec.session_id = sessionId();
    return rec;
  }

  const gets = () =>
    out.http
      .filter((h) => h.method === 'GET')
      .map((h) => {
        const after = h.chunks.filter((c) => c.t > markT);
        return {
          opened: h.t,
          status: h.status,
          sent_session_id: h.sent_session_id,
          ended: h.ended,
          end: h.end,
          opened_after_mark: h.t > markT,
          opened_before_pause: pauseT !== null && h.t < pauseT,
          bytes: h.bytes,
          bytes_after_mark: after.reduce((n, c) => n + c.n, 0),
          first_after_mark: after.length ? after[0] : null,
          body_text: h.body_text ?? null,
        };
      });

  async function stream(label, secs) {
    const rec = { step: 'stream', label, pause: pauseT, mark: markT };
    const t0 = performance.now();
    while (!gets().some((g) => g.bytes_after_mark) && performance.now() - t0 < secs * 1000) await sleep(50);
    rec.waited_ms = performance.now() - t0;
    rec.gets = gets();
    rec.at = now();
    rec.session_id = sessionId();
    return rec;
  }

  out.session_id_at_start = sessionId();
  for (const step of args.steps.split(',')) {
    const [kind, ...rest] = step.split(':');
    let rec;
    if (kind === 'call') rec = await call(rest[0]);
    else if (kind === 'list') rec = await list(rest[0]);
    else if (kind === 'read') rec = await read(rest[0]);
    else if (kind === 'stream') rec = await stream(rest[0], Number(rest[1] || 0));
    else if (kind === 'pause') {
      pauseT = now();
      await stdin.pause(rest[0]);
      markT = now();
      rec = { step: 'pause', label: rest[0], paused: pauseT, resumed: markT };
    } else throw new Error(`unknown step ${step}`);
    out.steps.push(rec);
  }
  out.session_id_at_end = sessionId();

  if (!stdio) await transport.terminateSession();
  await client.close();
  out.closed = true;
}

// Each call step's tools/call POSTs: the JSON-RPC id sent, and the messages their answers carried.
function describePosts(out) {
  for (const rec of out.steps) {
    const [lo, hi] = rec.http_range || [0, 0];
    delete rec.http_range;
    if (rec.step === 'call') {
      rec.posts = out.http
        .slice(lo, hi)
        .filter((h) => h.method === 'POST' && h.rpc_method === 'tools/call')
        .map((h) => ({ rpc_id: h.rpc_id, status: h.status, answers: h.answers ?? null, end: h.end }));
    }
  }
  for (const h of out.http) if (h.method !== 'GET') delete h.chunks;
}

async function main() {
  const out = { sdk: sdkVersion(), node: process.version, http: [], steps: [], transport_errors: [], error: null };
  await runBounded('agentchattr_client.cjs', parseArgs, run, out);
  describePosts(out);
  stdin.close();
  printResult(out);
}

main();

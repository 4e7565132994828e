// One MCP session of the TypeScript SDK (StreamableHTTPClientTransport on Node's fetch) living through an
// upstream restart, driven step by step; JSON on stdout. The TypeScript twin of restart_client.py.
//
//   NODE_PATH=<realenv>/node/node_modules node ts_restart_client.cjs URL --steps STEP[,STEP...]
//        [--authorization "Bearer spoof"] [--sender mallory] [--timeout 40]
//
// connect (initialize + notifications/initialized + standalone GET stream), the steps, then
// terminateSession() (DELETE) and close(). Steps:
//
// - `call:LABEL`     chat_send {sender, message: LABEL}; its result or error is recorded, never thrown.
// - `calls:LABEL:N`  N chat_send at once (messages LABEL-0 .. LABEL-<N-1>).
// - `notify:LABEL`   call notify_standalone until its log message arrives (3 tries, 2 s each; after a miss, wait
//                    up to 8 s for a GET stream opened (200)); `get_open` says whether a GET was answered 200
//                    since the last pause (or the start). The server sends that message outside any request, so
//                    it can only travel on the standalone GET stream.
// - `pause:NAME`     print `PAUSE NAME` and wait for a line on stdin (the test restarts the upstream meanwhile).
//
// Prints `RESULT <json>` last: each step's outcome with the client's view of its session id
// (`transport.sessionId`), and every fetch (method, status, the Mcp-Session-Id sent and what
// `headers.get('mcp-session-id')` reads, the JSON-RPC method and id sent, the parsed body of a JSON answer to
// a POST), plus the transport's errors. Exits 0 even if something failed ("error").
'use strict';

const { Client } = require('@modelcontextprotocol/sdk/client/index.js');
const { StreamableHTTPClientTransport } = require('@modelcontextprotocol/sdk/client/streamableHttp.js');
const { LoggingMessageNotificationSchema } = require('@modelcontextprotocol/sdk/types.js');
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

const CALL_TIMEOUT_MS = 10000;

const parseArgs = flagParser(
  { steps: null, authorization: null, sender: 'mallory', timeout: 40 },
  ['steps'],
  'usage: ts_restart_client.cjs URL --steps STEPS [options]',
);

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const stdin = stdinPauses();

async function run(args, out) {
  let mark = 0; // index into out.http at the last pause
  let standalone = 0;

  const recordingFetch = async (url, init) => {
    const method = (init && init.method) || 'GET';
    const sentHeaders = new Headers((init && init.headers) || {});
    const entry = {
      t: Date.now() / 1000,
      method,
      status: null,
      sent_session_id: sentHeaders.get('mcp-session-id'),
      rpc_method: null,
      rpc_id: null,
    };
    [entry.rpc_method, entry.rpc_id] = rpcOf(init && init.body);
    const response = await fetch(url, init);
    entry.status = response.status;
    entry.content_type = response.headers.get('content-type');
    entry.session_get = response.headers.get('mcp-session-id');
    if (method === 'POST' && (entry.content_type || '').startsWith('application/json')) {
      try {
        const text = await response.clone().text();
        if (text) entry.body = JSON.parse(text);
      } catch (e) {
        entry.body_error = String(e);
      }
    }
    out.http.push(entry);
    return response;
  };

  const headers = {};
  if (args.authorization !== null) headers['Authorization'] = args.authorization;
  const transport = new StreamableHTTPClientTransport(new URL(args.url), {
    requestInit: { headers },
    fetch: recordingFetch,
  });
  const client = new Client({ name: 'ts-restart-client', version: '0.0.1' });
  client.setNotificationHandler(LoggingMessageNotificationSchema, (n) => {
    try {
      if (JSON.parse(n.params.data).standalone) standalone++;
    } catch {}
  });
  transport.onerror = (e) => out.transport_errors.push(String(e && e.message ? e.message : e));

  await client.connect(transport);
  const sessionId = () => transport.sessionId ?? null;
  const callTool = (name, a) => client.callTool({ name, arguments: a }, undefined, { timeout: CALL_TIMEOUT_MS });

  async function chatSend(label, message) {
    const rec = { label, message, started: Date.now() / 1000 };
    const t0 = performance.now();
    await recordCall(rec, () => callTool('chat_send', { sender: args.sender, message }));
    rec.elapsed_ms = performance.now() - t0;
    rec.session_id = sessionId();
    return rec;
  }

  const getOpenSinceMark = () => out.http.slice(mark).some((h) => h.method === 'GET' && h.status === 200);

  async function notify(label) {
    const rec = { step: 'notify', label };
    const t0 = performance.now();
    rec.arrived = false;
    rec.tries = [];
    for (let i = 0; i < 3; i++) {
      const before = standalone;
      try {
        await callTool('notify_standalone', { sender: args.sender, delay_ms: 100 });
        rec.tries.push('called');
      } catch (e) {
        rec.tries.push(errorOf(e));
        break;
      }
      const t1 = performance.now();
      while (standalone === before && performance.now() - t1 < 2000) await sleep(20);
      if (standalone > before) {
        rec.arrived = true;
        break;
      }
      // Not there: the stream may be (re)opening; wait for a GET answered 200.
      const t2 = performance.now();
      while (!getOpenSinceMark() && performance.now() - t2 < 8000) await sleep(20);
    }
    rec.get_open = getOpenSinceMark();
    rec.get_wait_ms = performance.now() - t0;
    rec.session_id = sessionId();
    return rec;
  }

  out.session_id_at_start = sessionId();
  for (const step of args.steps.split(',')) {
    const [kind, ...rest] = step.split(':');
    let rec;
    if (kind === 'call') {
      rec = { step: 'call', ...(await chatSend(rest[0], rest[0])) };
    } else if (kind === 'calls') {
      const [label, n] = rest;
      const calls = await Promise.all(Array.from({ length: Number(n) }, (_, i) => chatSend(label, `${label}-${i}`)));
      rec = { step: 'calls', label, calls, session_id: sessionId() };
    } else if (kind === 'notify') {
      rec = await notify(rest[0]);
    } else if (kind === 'pause') {
      await stdin.pause(rest[0]);
      mark = out.http.length;
      rec = { step: 'pause', label: rest[0], resumed: Date.now() / 1000 };
    } else {
      throw new Error(`unknown step ${step}`);
    }
    out.steps.push(rec);
  }
  out.session_id_at_end = sessionId();

  await transport.terminateSession();
  out.session_id_after_terminate = sessionId();
  await client.close();
  out.closed = true;
}

async function main() {
  const out = { sdk: sdkVersion(), node: process.version, http: [], steps: [], transport_errors: [], error: null };
  await runBounded('ts_restart_client.cjs', parseArgs, run, out);
  stdin.close();
  printResult(out);
}

main();

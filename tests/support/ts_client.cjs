// TypeScript MCP SDK client (StreamableHTTPClientTransport on Node's fetch), as JSON on stdout.
//
//   NODE_PATH=<realenv>/node/node_modules node ts_client.cjs URL [--authorization "Bearer spoof"]
//        [--x-agent-token spoof] [--sender mallory] [--transport streamable-http|sse]
//
// connect (initialize + notifications/initialized + standalone GET stream), tools/list, tools/call
// (chat_send, chat_join, chat_read, chat_who as --sender), slow_progress (arrival latency of each
// progress/log notification), notify_standalone (a tools/list_changed notification that the server sends
// outside any request: it must arrive on the GET stream, which this script taps), terminateSession()
// (DELETE) and close(). Every fetch is recorded (method, status, what `headers.get('mcp-session-id')`
// reads). Prints one JSON object; exits 0 even if a step failed ("error").
// With `--transport sse`: the legacy SSEClientTransport (URL = the `/sse` endpoint); the server's
// out-of-request notifications then arrive on that one GET stream, and there is no session to terminate.
'use strict';

const { Client } = require('@modelcontextprotocol/sdk/client/index.js');
const { StreamableHTTPClientTransport } = require('@modelcontextprotocol/sdk/client/streamableHttp.js');
const { SSEClientTransport } = require('@modelcontextprotocol/sdk/client/sse.js');
const {
  LoggingMessageNotificationSchema,
  ToolListChangedNotificationSchema,
} = require('@modelcontextprotocol/sdk/types.js');
const { flagParser, runBounded, sdkVersion, textJson } = require('./client_common.cjs');

const parseArgs = flagParser(
  { authorization: null, xAgentToken: null, sender: 'mallory', count: 3, transport: 'streamable-http', timeout: 30 },
  [],
  'usage: ts_client.cjs URL [options]',
);

const nowSec = () => Date.now() / 1000;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function waitFor(pred, ms) {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (pred()) return true;
    await sleep(10);
  }
  return pred();
}

async function run(args, out) {
  // fetch wrapper: records every exchange and taps the body of the standalone GET stream.
  const getStreamEvents = out.get_stream_events;
  const recordingFetch = async (url, init) => {
    const method = (init && init.method) || 'GET';
    const response = await fetch(url, init);
    const u = new URL(String(url instanceof Request ? url.url : url));
    const entry = {
      method,
      path: u.pathname + u.search,
      status: response.status,
      content_type: response.headers.get('content-type'),
      session_get: response.headers.get('mcp-session-id'),
    };
    out.http.push(entry);
    if (method === 'GET' && response.ok && response.body) {
      const [mine, theirs] = response.body.tee();
      (async () => {
        const reader = mine.getReader();
        const decoder = new TextDecoder();
        let text = '';
        for (;;) {
          let chunk;
          try {
            chunk = await reader.read();
          } catch {
            break;
          }
          if (chunk.done) break;
          text += decoder.decode(chunk.value, { stream: true });
          let idx;
          while ((idx = text.search(/\r?\n\r?\n/)) >= 0) {
            const event = text.slice(0, idx);
            text = text.slice(idx).replace(/^\r?\n\r?\n/, '');
            const data = event
              .split(/\r?\n/)
              .filter((l) => l.startsWith('data:'))
              .map((l) => l.slice(5).trimStart())
              .join('\n');
            if (data) {
              try {
                getStreamEvents.push({ method: JSON.parse(data).method ?? null, at: nowSec() });
              } catch {
                getStreamEvents.push({ raw: data, at: nowSec() });
              }
            }
          }
        }
      })();
      return new Response(theirs, { status: response.status, statusText: response.statusText, headers: response.headers });
    }
    return response;
  };

  const headers = {};
  if (args.authorization !== null) headers['Authorization'] = args.authorization;
  if (args.xAgentToken !== null) headers['X-Agent-Token'] = args.xAgentToken;

  const Transport = args.transport === 'sse' ? SSEClientTransport : StreamableHTTPClientTransport;
  const transport = new Transport(new URL(args.url), {
    requestInit: { headers },
    fetch: recordingFetch,
  });
  const client = new Client({ name: 'ts-test-client', version: '0.0.1' });
  client.setNotificationHandler(LoggingMessageNotificationSchema, (n) => {
    const now = nowSec();
    let data = n.params.data;
    let latency = null;
    try {
      data = JSON.parse(data);
      latency = (now - data.sent) * 1000;
    } catch {}
    out.logs.push({ level: n.params.level, data, latency_ms: latency });
  });
  client.setNotificationHandler(ToolListChangedNotificationSchema, () => {
    out.tool_list_changed.push({ at: nowSec() });
  });
  transport.onerror = (e) => out.transport_errors.push(String(e && e.stack ? e.stack : e));

  await client.connect(transport);
  out.protocol_version = transport.protocolVersion ?? null;
  out.server = client.getServerVersion()?.name ?? null;
  out.session_id = transport.sessionId ?? null;

  const tools = await client.listTools();
  out.tools = tools.tools.map((t) => t.name).sort();
  const calls = out.calls;
  calls.chat_send = textJson(
    await client.callTool({ name: 'chat_send', arguments: { sender: args.sender, message: 'hello from ts' } }),
  );
  calls.chat_join = textJson(await client.callTool({ name: 'chat_join', arguments: { name: args.sender } }));
  calls.chat_read = textJson(await client.callTool({ name: 'chat_read', arguments: { sender: args.sender } }));
  calls.chat_who = textJson(await client.callTool({ name: 'chat_who', arguments: {} }));
  // Warm-up: the first notification-carrying call of a process can find the client's event loop busy
  // for ~45 ms (measured against the server directly with strace: the bytes were there, Node read them
  // late). Measure a second call, after a pause, with only its own notifications.
  await client.callTool({ name: 'slow_progress', arguments: { sender: args.sender, count: 1 } }, undefined, {
    onprogress: () => {},
  });
  out.logs.length = 0;
  await sleep(200); // let deferred work (validator compiles, GC) finish before the measured call
  calls.slow_progress = textJson(
    await client.callTool({ name: 'slow_progress', arguments: { sender: args.sender, count: args.count } }, undefined, {
      onprogress: (p) => {
        const now = nowSec();
        let sent = null;
        try {
          sent = JSON.parse(p.message).sent;
        } catch {}
        out.progress.push({ progress: p.progress, total: p.total, latency_ms: sent ? (now - sent) * 1000 : null });
      },
    }),
  );

  // The standalone GET stream: opened after the 202 to notifications/initialized. The server sends
  // notifications with no related request there and drops them if no stream is open, so wait for it.
  out.get_stream_open = await waitFor(() => out.http.some((h) => h.method === 'GET' && h.status === 200), 3000);
  const before = out.logs.length;
  calls.notify_standalone = textJson(
    await client.callTool({ name: 'notify_standalone', arguments: { sender: args.sender, delay_ms: 100 } }),
  );
  await waitFor(
    () => out.tool_list_changed.length > 0 && out.logs.length > before && getStreamEvents.length >= 2,
    3000,
  );
  out.standalone_logs = out.logs.splice(before);

  if (args.transport !== 'sse') {
    await transport.terminateSession();
    out.session_id_after_terminate = transport.sessionId ?? null;
  }
  await client.close();
  out.closed = true;
}

async function main() {
  const out = {
    sdk: sdkVersion(),
    node: process.version,
    http: [],
    progress: [],
    logs: [],
    tool_list_changed: [],
    get_stream_events: [],
    transport_errors: [],
    calls: {},
    error: null,
  };
  await runBounded('ts_client.cjs', parseArgs, run, out);
  process.stdout.write(JSON.stringify(out, null, 1) + '\n', () => process.exit(0));
}

main();

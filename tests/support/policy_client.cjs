// One MCP session of the TypeScript SDK through the proxy with a tool policy in force; JSON on stdout. The
// TypeScript twin of policy_client.py.
//
//   NODE_PATH=<realenv>/node/node_modules node policy_client.cjs URL {http|sse} MESSAGE DENIED_TOOL
//
// The transport is StreamableHTTPClientTransport (http) or the legacy SSEClientTransport (sse), on Node's
// fetch. Lists the tools, calls chat_send without a sender (the proxy stamps it) and calls DENIED_TOOL (the
// proxy must answer it itself), each call bounded by CALL_TIMEOUT_MS (the SDK's own timeout error then).
// Prints one JSON object on stdout: the SDK version, the tool names listed, the tools whose inputSchema still
// has a `sender` property, chat_send's `required`, chat_send's result text, and the denied call's outcome (its
// error code and message, the result it was answered with, or why it failed: an SSE POST refused with an
// HTTP status rejects the call with a plain Error, no code). A failure outside the calls lands in `error`;
// exits 0 either way.
'use strict';

const { Client } = require('@modelcontextprotocol/sdk/client/index.js');
const { SSEClientTransport } = require('@modelcontextprotocol/sdk/client/sse.js');
const { StreamableHTTPClientTransport } = require('@modelcontextprotocol/sdk/client/streamableHttp.js');
const { errorOf, runBounded, sdkVersion } = require('./client_common.cjs');

const CALL_TIMEOUT_MS = 10000;

function parseArgs(argv) {
  const [url, transport, message, denied] = argv;
  if (!denied || !['http', 'sse'].includes(transport)) {
    throw new Error('usage: policy_client.cjs URL {http|sse} MESSAGE DENIED_TOOL');
  }
  return { url, transport, message, denied, timeout: 40 };
}

const hasSender = (t) => Boolean(t.inputSchema && t.inputSchema.properties && 'sender' in t.inputSchema.properties);
const texts = (result) => (result.content || []).filter((c) => typeof c.text === 'string').map((c) => c.text);

async function run(args, out) {
  const url = new URL(args.url);
  const transport =
    args.transport === 'sse' ? new SSEClientTransport(url) : new StreamableHTTPClientTransport(url);
  const client = new Client({ name: 'policy-test-client', version: '0.0.1' });
  await client.connect(transport);
  const call = (name, a) => client.callTool({ name, arguments: a }, undefined, { timeout: CALL_TIMEOUT_MS });

  const listed = await client.listTools();
  out.tools = listed.tools.map((t) => t.name).sort();
  out.with_sender = listed.tools.filter(hasSender).map((t) => t.name).sort();
  const send = listed.tools.find((t) => t.name === 'chat_send');
  out.required_of_send = send && send.inputSchema ? send.inputSchema.required ?? null : null;

  const sent = await call('chat_send', { message: args.message, channel: 'general' });
  out.send = { is_error: Boolean(sent.isError), text: texts(sent).join(' ') };
  try {
    const r = await call(args.denied, {});
    out.denied = { answered: true, is_error: Boolean(r.isError), text: texts(r).join(' ') };
  } catch (e) {
    out.denied = errorOf(e);
  }

  if (args.transport === 'http') await transport.terminateSession();
  await client.close();
}

async function main() {
  const out = { sdk: sdkVersion(), node: process.version, error: null };
  await runBounded('policy_client.cjs', parseArgs, run, out);
  process.stdout.write(JSON.stringify(out) + '\n', () => process.exit(0));
}

main();

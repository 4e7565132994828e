// POST an MCP initialize with Node's built-in fetch (undici: the HTTP stack of the TypeScript MCP SDK) and
// print, as JSON, what `response.headers.get('mcp-session-id')` reads (fetch joins repeated fields with ", ").
//
//   node read_session_header.cjs URL
'use strict';

const INIT = {
  jsonrpc: '2.0',
  id: 1,
  method: 'initialize',
  params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'node-fetch', version: '0' } },
};

(async () => {
  const r = await fetch(process.argv[2], {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      authorization: 'Bearer spoof',
    },
    body: JSON.stringify(INIT),
  });
  await r.arrayBuffer();
  process.stdout.write(
    JSON.stringify({ node: process.version, status: r.status, get: r.headers.get('mcp-session-id') }) + '\n',
  );
})().catch((e) => {
  process.stderr.write(String(e && e.stack ? e.stack : e) + '\n');
  process.exit(1);
});

// What the Node client scripts share (ts_client.cjs, ts_restart_client.cjs, agentchattr_client.cjs,
// policy_client.cjs): reading results and errors, the SDK's version, the `pause:NAME` handshake, and the
// runner that bounds a run and reports whatever it threw in `error`.
'use strict';

const fs = require('fs');
const path = require('path');
const readline = require('readline');

// A tool result's first text content, as JSON when it is JSON.
function textJson(result) {
  const text = result.content[0].text;
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

// An MCP error's code and message, or the thrown value's text (code null).
function errorOf(e) {
  return { code: e && typeof e.code === 'number' ? e.code : null, message: String(e && e.message ? e.message : e) };
}

// The JSON-RPC method and id a request body sent, `[method, id]`; nulls for no body, one that is not JSON, or
// a batch.
function rpcOf(body) {
  if (typeof body !== 'string') return [null, null];
  try {
    const sent = JSON.parse(body);
    return [sent.method ?? null, sent.id ?? null];
  } catch {
    return [null, null];
  }
}

// `call()`, a tool call, with its outcome in `rec`: `result` (textJson) and `is_error`, or `error` (errorOf).
// Never throws: a failed call is something the test looks at.
async function recordCall(rec, call) {
  try {
    const result = await call();
    rec.result = textJson(result);
    rec.is_error = Boolean(result.isError);
  } catch (e) {
    rec.error = errorOf(e);
  }
}

// The SDK's version, from its package.json on NODE_PATH (the `exports` map resolves
// '@modelcontextprotocol/sdk/package.json' to dist/cjs/package.json, which has none).
function sdkVersion() {
  try {
    const file = path.join(process.env.NODE_PATH || '', '@modelcontextprotocol', 'sdk', 'package.json');
    return JSON.parse(fs.readFileSync(file, 'utf8')).version;
  } catch {
    return null;
  }
}

// The test's side of the `pause:NAME` step, reading stdin from the call on: `pause(name)` prints
// `PAUSE NAME` and resolves once the test writes a line (lines written early wait their turn), and throws if
// stdin closes first; `close()` stops reading, so the process can exit.
function stdinPauses() {
  const lines = [];
  let waiter = null;
  let closed = false;
  const rl = readline.createInterface({ input: process.stdin });
  rl.on('line', (line) => {
    if (waiter) {
      const w = waiter;
      waiter = null;
      w(line);
    } else lines.push(line);
  });
  rl.on('close', () => {
    closed = true;
    if (waiter) {
      const w = waiter;
      waiter = null;
      w(null);
    }
  });
  function nextLine() {
    if (lines.length) return Promise.resolve(lines.shift());
    if (closed) return Promise.resolve(null);
    return new Promise((r) => (waiter = r));
  }
  return {
    async pause(name) {
      process.stdout.write(`PAUSE ${name}\n`);
      const line = await nextLine();
      if (line === null) throw new Error(`stdin closed at pause ${name}`);
    },
    close: () => rl.close(),
  };
}

// A parser of `URL [--flag VALUE]...` for `runBounded`: `--some-flag V` sets `someFlag`, one of the keys of
// `defaults` (a number where its default is one), and the one other argument is `url`. Throws on any further
// argument, and `usage` when the URL or one of the `required` keys is missing.
function flagParser(defaults, required, usage) {
  return (argv) => {
    const args = { url: null, ...defaults };
    for (let i = 0; i < argv.length; i++) {
      const a = argv[i];
      const key = a.replace(/^--/, '').replace(/-([a-z])/g, (_, c) => c.toUpperCase());
      if (a.startsWith('--') && Object.hasOwn(defaults, key)) {
        args[key] = typeof defaults[key] === 'number' ? Number(argv[++i]) : argv[++i];
      } else if (args.url === null) args.url = a;
      else throw new Error(`unexpected argument ${a}`);
    }
    if (!args.url || required.some((k) => !args[k])) throw new Error(usage);
    return args;
  };
}

// Runs `run(args, out)` with the arguments `parse` reads from argv, bounded by `args.timeout` seconds. A
// failure or the timeout lands in `out.error`; `out.elapsed_ms` is always set. Never throws.
async function runBounded(name, parse, run, out) {
  const started = Date.now();
  let timer;
  try {
    const args = parse(process.argv.slice(2));
    await Promise.race([
      run(args, out),
      new Promise((_, reject) => {
        timer = setTimeout(() => reject(new Error(`${name}: timed out after ${args.timeout} s`)), args.timeout * 1000);
      }),
    ]);
  } catch (e) {
    out.error = String(e && e.stack ? e.stack : e);
  } finally {
    clearTimeout(timer);
  }
  out.elapsed_ms = Date.now() - started;
}

// The last line of a stepped client, the one the test reads (`RESULT <json>`), then exit 0 once it is written.
function printResult(out) {
  process.stdout.write('RESULT ' + JSON.stringify(out) + '\n', () => process.exit(0));
}

module.exports = {
  textJson,
  errorOf,
  rpcOf,
  recordCall,
  sdkVersion,
  stdinPauses,
  flagParser,
  runBounded,
  printResult,
};

// What the Node client scripts share (ts_client.cjs, ts_restart_client.cjs).
'use strict';

// A tool result's first text content, as JSON when it is JSON.
function textJson(result) {
  const text = result.content[0].text;
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
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

module.exports = { textJson, runBounded };

"""The Python SDK's conformance client.py through the proxy, as the conformance suite's client-mode command.

    MCP_CONFORMANCE_PROXY_ARGS='["--deny-tool", "no_such_tool_*"]' \\
        python conformance_client_wrapper.py PROXY_BIN TOKEN_FILE CLIENT_PY SERVER_URL

The suite appends SERVER_URL (its mock server) to the command and sets MCP_CONFORMANCE_SCENARIO etc., which
client.py reads. This script:

- starts PROXY_BIN --upstream SERVER_URL --agent conformance-agent --token-file TOKEN_FILE --control-stdin,
  plus the JSON array of arguments in MCP_CONFORMANCE_PROXY_ARGS (the environment, not argv: the suite splits
  its command on spaces and runs it through /bin/sh, which would glob a `*`); the proxy's stderr is ours;
- reads the proxy's `  MCP proxy: port N` line from its stdout (10 s bound);
- runs CLIENT_PY in this interpreter (runpy, as `__main__`) with the proxy's URL, SERVER_URL's path and
  query on the proxy's port, so the client and this wrapper are one process;
- stops the proxy when the client ends, and exits with the client's status.

With MCP_CONFORMANCE_PROXY_OAUTH=1 (the suite's OAuth extension scenarios), the proxy holds the credentials
and the client none: the credentials in MCP_CONFORMANCE_CONTEXT (client_id, client_secret, private_key_pem,
valid_jwt) are written to files in a private temporary directory and given to the proxy as --oauth-client-id,
--oauth-client-secret-file, --oauth-client-key-file, --oauth-assertion-file (never in argv); TOKEN_FILE and
--control-stdin are then not used (a renewed token source is the only one). The client then runs the
`initialize` scenario (connect, initialize, list tools) with MCP_CONFORMANCE_CONTEXT removed from its
environment: it has nothing to authenticate with, and the suite's authorization server sees only the proxy.

The proxy never outlives this process: on SIGTERM (what the suite sends on a timeout, to the shell that ran
this) it is stopped first; if this process dies any other way, even by SIGKILL, the proxy's stdin (a pipe only
this process holds) reaches EOF and `--control-stdin` shuts it down. If the shell that ran this is killed
instead, a watcher sees the parent change and exits the same way.
"""

from __future__ import annotations

import json
import os
import queue
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
import time
from urllib.parse import urlsplit

AGENT = "conformance-agent"
PORT_LINE = "  MCP proxy: port "


def oauth_args(context: dict, into: str) -> list[str]:
    """The proxy's --oauth-* arguments for the scenario's credentials, each secret in a 0600 file."""

    def secret_file(name: str, text: str) -> str:
        path = os.path.join(into, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return path

    args: list[str] = []
    if "client_id" in context:
        args += ["--oauth-client-id", context["client_id"]]
    if "client_secret" in context:
        args += ["--oauth-client-secret-file", secret_file("client_secret", context["client_secret"])]
    if "private_key_pem" in context:
        args += ["--oauth-client-key-file", secret_file("client_key.pem", context["private_key_pem"])]
    if "valid_jwt" in context:
        args += ["--oauth-assertion-file", secret_file("workload.jwt", context["valid_jwt"])]
    return args


def start_proxy(binary: str, token_file: str, upstream: str, oauth: list[str] | None) -> tuple[subprocess.Popen, int]:
    extra = json.loads(os.environ.get("MCP_CONFORMANCE_PROXY_ARGS", "[]"))
    argv = [binary, "--upstream", upstream, "--agent", AGENT]
    if oauth is None:
        argv += ["--token-file", token_file, "--control-stdin"]
    else:
        argv += oauth
    proxy = subprocess.Popen(argv + extra, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: lines.put(proxy.stdout.readline()), daemon=True).start()
    try:
        line = lines.get(timeout=10)
    except queue.Empty:
        line = ""
    if not line.startswith(PORT_LINE):
        stop_proxy(proxy)
        sys.exit(f"conformance_client_wrapper.py: the proxy printed {line!r} instead of its port line")
    return proxy, int(line[len(PORT_LINE) :])


def stop_proxy(proxy: subprocess.Popen) -> None:
    if proxy.poll() is None:
        proxy.terminate()
        try:
            proxy.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proxy.kill()
            proxy.wait()


def watch_parent(proxy: subprocess.Popen) -> None:
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(0.2)
    stop_proxy(proxy)
    os._exit(1)


def main() -> None:
    if len(sys.argv) != 5:
        sys.exit("usage: conformance_client_wrapper.py PROXY_BIN TOKEN_FILE CLIENT_PY SERVER_URL")
    binary, token_file, client, server_url = sys.argv[1:]
    oauth = None
    if os.environ.get("MCP_CONFORMANCE_PROXY_OAUTH") == "1":
        context = json.loads(os.environ.pop("MCP_CONFORMANCE_CONTEXT", "{}"))
        oauth = oauth_args(context, tempfile.mkdtemp(prefix="conformance-oauth-"))
        os.environ["MCP_CONFORMANCE_SCENARIO"] = "initialize"
    proxy, port = start_proxy(binary, token_file, server_url, oauth)

    def on_term(signum, _frame):
        stop_proxy(proxy)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    threading.Thread(target=watch_parent, args=(proxy,), daemon=True).start()

    target = urlsplit(server_url)
    proxy_url = f"http://127.0.0.1:{port}{target.path}" + (f"?{target.query}" if target.query else "")
    sys.argv = [client, proxy_url]
    status: int | str | None = 0
    try:
        runpy.run_path(client, run_name="__main__")
    except SystemExit as e:
        status = e.code
    finally:
        stop_proxy(proxy)
    sys.exit(status)


if __name__ == "__main__":
    main()

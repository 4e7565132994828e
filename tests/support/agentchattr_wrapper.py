"""agentchattr's wrapper.py, reduced to what it does around the MCP proxy; events as JSON lines on stdout.

    PYTHONPATH=<repo>/python MCP_IDENTITY_PROXY_BIN=<binary> python agentchattr_wrapper.py \
        --server-port P --upstream-base http://127.0.0.1:M --path /mcp|/sse [--base claude] \
        [--heartbeat 0.5] [--on-409 set_identity|setters]

What wrapper.py (agentchattr a813e38) does, in the same order, with the project's drop-in in place of its
`mcp_proxy.McpIdentityProxy`:

1. register: `POST /api/register {"base": ..., "label": null, "ready_gate": false}` -> name, token
   (`_register_instance`);
2. start the proxy: `McpIdentityProxy(upstream_base, upstream_path, agent_name, instance_token).start()`, the
   agent's MCP URL being `proxy.url + path`;
3. heartbeat every `--heartbeat` seconds (wrapper.py: 5): `POST /api/heartbeat/<name>` with
   `Authorization: Bearer <token>` and an empty body. 200 `{"name": N}` with N not the current name: a rename,
   `proxy.agent_name = N`. 409 (`stale_session`): register again and hand the new name and token to the proxy:
   `proxy.set_identity(name, token)` (one control line), or with `--on-409 setters` the two property
   assignments wrapper.py's `set_runtime_identity` makes (`proxy.agent_name = ...`, `proxy.token = ...`).
   Any other failure: try again at the next beat, as wrapper.py does.

The proxy's stderr (its log) is inherited: it is this process's stderr. Standard library only (plus the
drop-in). Runs until stdin closes, then `proxy.stop()`.

Events, one JSON object a line, each with "event" and "t" (time.time()):
  registered {name, token, slot}    the first registration
  proxy {url, port, name, binary}   the proxy listens; url is what the agent would be given; binary is the
                                    executable the drop-in found
  heartbeat {status, name, sent_as, error?}
                                    every beat: the HTTP status (null when the server is unreachable), the
                                    name the server answered, the name the beat was sent for
  renamed {old, new}                after proxy.agent_name = new
  stale {name}                      a 409; re-registration follows
  reregistered {name, token, old_name, old_token, how}
                                    after the new identity was handed to the proxy
  reregister_failed {error}
  stopped {returncode}
  fatal {error}                     then exit 1
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import urllib.error
import urllib.request

import mcp_identity_proxy
from mcp_identity_proxy import McpIdentityProxy

_print_lock = threading.Lock()


def emit(event: str, **fields) -> None:
    with _print_lock:
        sys.stdout.write(json.dumps({"event": event, "t": time.time(), **fields}) + "\n")
        sys.stdout.flush()


def register(server_port: int, base: str) -> dict:
    """wrapper.py's _register_instance."""
    body = json.dumps({"base": base, "label": None, "ready_gate": False}).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{server_port}/api/register",
        method="POST",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--server-port", type=int, required=True)
    parser.add_argument("--upstream-base", required=True)
    parser.add_argument("--path", required=True, choices=["/mcp", "/sse"])
    parser.add_argument("--base", default="claude")
    parser.add_argument("--heartbeat", type=float, default=0.5)
    parser.add_argument("--on-409", default="set_identity", choices=["set_identity", "setters"])
    args = parser.parse_args()

    try:
        reg = register(args.server_port, args.base)
    except Exception as e:  # noqa: BLE001 - reported, as wrapper.py does before it exits
        emit("fatal", error=f"registration failed: {e!r}")
        sys.exit(1)
    emit("registered", name=reg["name"], token=reg["token"], slot=reg.get("slot"))

    proxy = McpIdentityProxy(
        upstream_base=args.upstream_base,
        upstream_path=args.path,
        agent_name=reg["name"],
        instance_token=reg["token"],
    )
    try:
        started = proxy.start()
    except Exception as e:  # noqa: BLE001
        emit("fatal", error=f"proxy did not start: {e!r}")
        sys.exit(1)
    if started is False:
        emit("fatal", error="proxy.start() returned False")
        sys.exit(1)
    # Which binary the drop-in ran (its own lookup: beside the interpreter, $MCP_IDENTITY_PROXY_BIN, PATH).
    find = getattr(mcp_identity_proxy, "find_binary", None)
    binary = find() if find else None
    emit("proxy", url=f"{proxy.url}{args.path}", port=proxy.port, name=reg["name"], binary=binary)

    lock = threading.Lock()
    identity = {"name": reg["name"], "token": reg["token"]}
    stop = threading.Event()

    def beat() -> None:
        with lock:
            name, token = identity["name"], identity["token"]
        req = urllib.request.Request(
            f"http://127.0.0.1:{args.server_port}/api/heartbeat/{name}",
            method="POST",
            data=b"",
            headers={"Authorization": f"Bearer {token}"},
        )
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                data = json.loads(resp.read())
        except urllib.error.HTTPError as e:
            emit("heartbeat", status=e.code, name=None, sent_as=name)
            if e.code != 409:
                return
            emit("stale", name=name)
            try:
                new = register(args.server_port, args.base)
            except Exception as e2:  # noqa: BLE001 - the next beat tries again, as wrapper.py's loop does
                emit("reregister_failed", error=repr(e2))
                return
            with lock:
                identity["name"], identity["token"] = new["name"], new["token"]
            if args.on_409 == "setters":
                proxy.agent_name = new["name"]
                proxy.token = new["token"]
            else:
                proxy.set_identity(new["name"], new["token"])
            emit("reregistered", name=new["name"], token=new["token"], old_name=name, old_token=token,
                 how=args.on_409)
            return
        except Exception as e:  # noqa: BLE001 - server down: the next beat tries again
            emit("heartbeat", status=None, name=None, sent_as=name, error=repr(e))
            return
        server_name = data.get("name", name)
        emit("heartbeat", status=200, name=server_name, sent_as=name)
        if server_name != name:
            with lock:
                identity["name"] = server_name
            proxy.agent_name = server_name
            emit("renamed", old=name, new=server_name)

    def heartbeat_loop() -> None:
        while not stop.is_set():
            beat()
            stop.wait(args.heartbeat)

    threading.Thread(target=heartbeat_loop, daemon=True).start()
    sys.stdin.read()  # until the test closes our stdin
    stop.set()
    proxy.stop()
    emit("stopped", returncode=proxy.returncode)


if __name__ == "__main__":
    main()

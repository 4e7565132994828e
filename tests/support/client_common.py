"""What the Python client scripts share (py1_client.py, py2_client.py, restart_client.py, agentchattr_client.py,
audit_client.py): reading results and errors, the recorders of notifications, the `pause:NAME` handshake, and
the runner that bounds a run and reports whatever it raised in "error"."""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback

import anyio


def text_json(result) -> object:
    """A tool result's first text content, as JSON when it is JSON."""
    text = result.content[0].text
    try:
        return json.loads(text)
    except ValueError:
        return text


def error_of(e: BaseException) -> dict:
    """An MCP error's code and message, or the exception's text (code None)."""
    err = getattr(e, "error", None)
    if err is not None and hasattr(err, "code"):
        return {"code": err.code, "message": err.message}
    return {"code": None, "message": "".join(traceback.format_exception_only(e)).strip()}


def rpc_of(content: bytes) -> tuple:
    """The JSON-RPC method and id a request body sent: (method, id) for one message, ("batch", None) for
    an array, (None, None) for no body or one that is not JSON (it is simply not described)."""
    try:
        sent = json.loads(content) if content else None
    except ValueError:
        return None, None
    if isinstance(sent, dict):
        return sent.get("method"), sent.get("id")
    return ("batch", None) if sent is not None else (None, None)


async def record_call(rec: dict, call, name: str, arguments: dict) -> None:
    """`call(name, arguments)`, a tool call, with its outcome in `rec`: "result" (`text_json`) and "is_error",
    or "error" (`error_of`). Never raises: a failed call is something the test looks at."""
    try:
        result = await call(name, arguments)
        rec["result"] = text_json(result)
        rec["is_error"] = bool(getattr(result, "isError", getattr(result, "is_error", False)))
    except Exception as e:  # noqa: BLE001 - recorded for the test
        rec["error"] = error_of(e)


def last_sent_session_id(http: list[dict]):
    """The session id of a 2.x client, which keeps its transport out of reach: the id on its latest request
    in `http` (entries with "sent_session_id", "rpc_method", "session_get"), or, before it sent one, the id
    its initialize was answered with."""
    for h in reversed(http):
        if h["sent_session_id"]:
            return h["sent_session_id"]
    for h in http:
        if h["rpc_method"] == "initialize":
            return h["session_get"]
    return None


def lifecycle_parser() -> argparse.ArgumentParser:
    """The command line py1_client.py and py2_client.py share: `URL [--authorization A] [--x-agent-token T]
    [--sender S] [--count N] [--timeout SECS]`."""
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--authorization")
    parser.add_argument("--x-agent-token")
    parser.add_argument("--sender", default="mallory")
    parser.add_argument("--count", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=30, help="bound on the whole run, seconds")
    return parser


def spoofed_headers(args) -> dict:
    """The credentials a client sends of its own, `--authorization` and `--x-agent-token` as given: the
    proxy must replace them."""
    headers = {}
    if args.authorization is not None:
        headers["Authorization"] = args.authorization
    if args.x_agent_token is not None:
        headers["X-Agent-Token"] = args.x_agent_token
    return headers


def latency_recorders(out: dict):
    """The progress and logging callbacks of the lifecycle clients: each notification is appended to
    out["progress"] or out["logs"] with its arrival latency in ms, from the `sent` time the server wrote into
    it (None when it has none)."""
    progress: list[dict] = out["progress"]
    logs: list[dict] = out["logs"]

    async def on_progress(p: float, total: float | None, message: str | None) -> None:
        now = time.time()
        sent = json.loads(message)["sent"] if message else None
        progress.append({"progress": p, "total": total, "latency_ms": (now - sent) * 1000 if sent else None})

    async def on_log(params) -> None:
        now = time.time()
        try:
            data = json.loads(params.data)
            latency = (now - data["sent"]) * 1000
        except (TypeError, ValueError, KeyError):
            data, latency = params.data, None
        logs.append({"level": params.level, "data": data, "latency_ms": latency})

    return on_progress, on_log


async def pause(name: str) -> None:
    """The `pause:NAME` step: print `PAUSE NAME` and wait for a line on stdin (the test acts meanwhile)."""
    print(f"PAUSE {name}", flush=True)
    line = await anyio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
    if not line:
        raise RuntimeError(f"stdin closed at pause {name}")


def run_reported(run, timeout: float, out: dict) -> float:
    """Run `run()`, a coroutine function, under anyio, bounded by `timeout` seconds. Whatever it raises (the
    timeout, an ExceptionGroup) lands in out["error"] as its traceback, so the script still prints all it got.
    Returns the run's wall time in ms."""

    async def bounded() -> None:
        with anyio.fail_after(timeout):
            await run()

    started = time.monotonic()
    try:
        anyio.run(bounded)
    except BaseException as e:  # noqa: BLE001 - report everything, including ExceptionGroups
        out["error"] = "".join(traceback.format_exception(e))
    return (time.monotonic() - started) * 1000


def print_result(out: dict) -> None:
    """The last line of a stepped client, the one the test reads: `RESULT <json>`."""
    sys.stdout.write("RESULT " + json.dumps(out) + "\n")
    sys.stdout.flush()

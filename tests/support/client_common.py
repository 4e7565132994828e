"""What the Python client scripts share (py1_client.py, py2_client.py, restart_client.py, agentchattr_client.py,
audit_client.py)."""

from __future__ import annotations

import json
import traceback


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

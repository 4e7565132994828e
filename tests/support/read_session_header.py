"""POST an MCP initialize with httpx (the HTTP stack of the Python MCP SDK) and print, as JSON, what httpx
reads from the response's Mcp-Session-Id: `get` (what the SDK uses; httpx joins repeated fields with ", ")
and `get_list` (every field line).

    python read_session_header.py URL
"""

import json
import sys
from importlib.metadata import version

import httpx

INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "httpx", "version": "0"}},
}

with httpx.Client(timeout=10) as client:
    r = client.post(
        sys.argv[1], json=INIT, headers={"Accept": "application/json, text/event-stream", "Authorization": "Bearer spoof"}
    )
    print(
        json.dumps(
            {
                "httpx": version("httpx"),
                "status": r.status_code,
                "get": r.headers.get("mcp-session-id"),
                "get_list": r.headers.get_list("mcp-session-id"),
            }
        )
    )

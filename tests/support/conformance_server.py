"""The Python SDK's conformance "everything" server on an OS-assigned port, for tests/it/conformance.rs.

    python conformance_server.py EVERYTHING_SERVER_DIR

- EVERYTHING_SERVER_DIR is the SDK's `examples/servers/everything-server/` (unpacked at test time from the
  reference tarball in ../shared/mcp-conformance/); its `mcp_everything_server` package is imported from
  there unchanged.
- Serves its Streamable HTTP app at /mcp with the settings of the package's own `main()` (the in-memory event
  store, a 100 ms SSE retry interval), but on a socket bound to 127.0.0.1 port 0, so parallel tests never
  race for a port; prints `PORT <n>` on stdout once listening, then serves until killed.
- DNS-rebinding protection is the SDK default for host 127.0.0.1, as in `main()`.
"""

from __future__ import annotations

import socket
import sys

from server_common import serve


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: conformance_server.py EVERYTHING_SERVER_DIR")
    sys.path.insert(0, sys.argv[1])
    from mcp_everything_server import server as everything

    app = everything.mcp.streamable_http_app(
        event_store=everything.event_store,
        retry_interval=100,
        host="127.0.0.1",
    )
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    serve(app, sock)


if __name__ == "__main__":
    main()

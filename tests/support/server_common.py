"""What the Python test servers share (fastmcp_server.py, conformance_server.py): serving an ASGI app on a
socket the script bound itself, and saying when it is up."""

from __future__ import annotations

import asyncio
import socket

import uvicorn


def serve(app, sock: socket.socket) -> None:
    """Serve `app` with uvicorn on `sock` (bound, listening) until killed. Prints `PORT <n>` on stdout once the
    server has started, the line the test waits for; a server that fails to start raises instead."""
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)

    async def run() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            if task.done():
                task.result()
                return
            await asyncio.sleep(0.01)
        print(f"PORT {port}", flush=True)
        await task

    asyncio.run(run())

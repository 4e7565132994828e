"""``python -m mcp_identity_proxy ARGS...``: run the mcp-identity-proxy binary
(found as :func:`mcp_identity_proxy.find_binary` finds it: the one this
package's wheel installed first) with ``ARGS`` and exit with its status.

On Unix the interpreter is replaced by the binary (``execv``), so signals,
stdin (``--control-stdin``) and the exit status are the binary's own. On
Windows it runs as a child sharing the console: a Ctrl-C reaches both, the
binary shuts down gracefully, and this process waits for it and exits with
its status.
"""

from __future__ import annotations

import os
import subprocess
import sys

from . import WINDOWS, find_binary


def main(argv: list[str] | None = None) -> int:
    """Run the binary with ``argv`` (default: ``sys.argv[1:]``); return its
    exit status (127 if it cannot be found or run; on Unix the binary
    replaces this process, so only then does this return)."""
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        binary = find_binary()
    except FileNotFoundError as e:
        print(f"mcp_identity_proxy: {e}", file=sys.stderr)
        return 127
    if not WINDOWS:
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            os.execv(binary, [binary, *args])
        except OSError as e:
            print(f"mcp_identity_proxy: cannot run {binary}: {e}", file=sys.stderr)
            return 127
    try:
        proc = subprocess.Popen([binary, *args])
    except OSError as e:
        print(f"mcp_identity_proxy: cannot run {binary}: {e}", file=sys.stderr)
        return 127
    while True:
        try:
            return proc.wait()
        except KeyboardInterrupt:
            # The binary got the same Ctrl-C and is shutting down: wait for it.
            continue


if __name__ == "__main__":
    sys.exit(main())

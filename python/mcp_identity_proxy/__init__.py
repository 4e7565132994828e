"""Drop-in for agentchattr's ``mcp_proxy.McpIdentityProxy``, backed by the
mcp-identity-proxy binary.

Same constructor, ``start()``/``stop()``, ``port``, ``url`` and the
``agent_name``/``token`` properties as agentchattr's class, so ``wrapper.py``
needs no change beyond the import::

    from mcp_identity_proxy import McpIdentityProxy

The binary runs as a child process with ``--control-stdin``: a new name or
token is one JSON line on its stdin and applies to the next request, and the
child shuts down when its stdin closes, so it never outlives the wrapper.
The token goes in through the ``MCP_PROXY_TOKEN`` environment variable,
never argv. Standard library only.

Installed with ``pip install mcp-identity-proxy``, the wheel carries the
binary itself: pip puts it in the environment's scripts directory (``bin/``,
or ``Scripts`` on Windows), where :func:`find_binary` looks first. The
binary is ``binary=`` if given, else the one beside this interpreter's
scripts (``sysconfig``'s scripts path, the user scheme's, the directory of
``sys.executable``, or ``bin/`` beside the package for ``pip install
--target``), else ``$MCP_IDENTITY_PROXY_BIN``, else ``mcp-identity-proxy`` on
``PATH`` (``mcp-identity-proxy.exe`` on Windows). ``python -m
mcp_identity_proxy ARGS...`` runs that binary with ``ARGS`` and exits with
its status.

Windows and Unix alike: the port line is read by a reader thread (no
``selectors`` on a pipe, which Windows cannot select), stdin is always a
pipe (the child never shares the agent's console), and on Windows the child
gets its own process group (``CREATE_NEW_PROCESS_GROUP``), so a Ctrl-C in the
agent's console does not reach it directly. ``stop()`` closes stdin (a
graceful shutdown), then sends Ctrl-Break (Windows) or SIGTERM, then
terminates.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading

log = logging.getLogger(__name__)

PORT_LINE = "  MCP proxy: port "
IN_USE_SUFFIX = " in use (shared with another instance)"
EXIT_BIND_FAILED = 3
START_TIMEOUT = 10.0
STOP_TIMEOUT = 10.0
WINDOWS = sys.platform == "win32"
BINARY_NAME = "mcp-identity-proxy" + (".exe" if WINDOWS else "")
ENV_BINARY = "MCP_IDENTITY_PROXY_BIN"


def _installed_dirs() -> list[str]:
    """Where pip puts the wheel's binary for this interpreter, most likely first."""
    dirs = [sysconfig.get_path("scripts")]
    try:
        if sys.version_info >= (3, 10):
            user_scheme = sysconfig.get_preferred_scheme("user")
        elif os.name == "nt":
            user_scheme = "nt_user"
        elif sys.platform == "darwin" and getattr(sys, "_framework", None):
            user_scheme = "osx_framework_user"
        else:
            user_scheme = "posix_user"
        dirs.append(sysconfig.get_path("scripts", scheme=user_scheme))
    except (KeyError, ValueError):
        pass
    if sys.executable:
        dirs.append(os.path.dirname(os.path.abspath(sys.executable)))
    # `pip install --target DIR` puts the package in DIR and the binary in DIR/bin.
    dirs.append(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bin"))
    seen: list[str] = []
    for d in dirs:
        if d and d not in seen:
            seen.append(d)
    return seen


def find_binary(binary: str | None = None) -> str:
    """The mcp-identity-proxy executable to run.

    ``binary`` if given; else the one pip installed with this package (the
    interpreter's scripts directories, see the module doc); else
    ``$MCP_IDENTITY_PROXY_BIN``; else ``mcp-identity-proxy`` on ``PATH``.
    Raises FileNotFoundError naming every place it looked.
    """
    if binary:
        return binary
    for d in _installed_dirs():
        candidate = os.path.join(d, BINARY_NAME)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    from_env = os.environ.get(ENV_BINARY)
    if from_env:
        return from_env
    on_path = shutil.which(BINARY_NAME)
    if on_path:
        return on_path
    raise FileNotFoundError(
        f"{BINARY_NAME} not found: not installed beside this Python ({', '.join(_installed_dirs())}), "
        f"${ENV_BINARY} not set, not on PATH; `pip install mcp-identity-proxy`, or pass binary=")


class McpIdentityProxy:
    """Local identity proxy for one agent in front of agentchattr's MCP server.

    agentchattr's ``wrapper.py`` makes one per agent instance after
    registering it (``McpIdentityProxy(upstream_base=..., upstream_path=...,
    agent_name=..., instance_token=...)``), calls ``start()``, hands the
    agent CLI ``proxy.url + upstream_path``, assigns ``agent_name`` and
    ``token`` when the server renames or re-registers the instance, and
    calls ``stop()`` when the agent exits.

    Args:
        upstream_base: base URL without path, e.g. "http://127.0.0.1:8200"
        upstream_path: "/mcp" (streamable HTTP) or "/sse" (legacy SSE)
        agent_name: current canonical name of this instance
        instance_token: server-issued token (sent as Authorization: Bearer
            and X-Agent-Token)
        port: 0 lets the OS choose; a fixed port already in use makes
            start() return False
        binary: path of mcp-identity-proxy (optional: see find_binary)
        extra_args: more flags for the binary, e.g. ("--stamp", "t=p")
    """

    def __init__(self, upstream_base: str, upstream_path: str, agent_name: str,
                 instance_token: str, port: int = 0, *, binary: str | None = None,
                 extra_args: tuple[str, ...] = ()):
        self._upstream_base = upstream_base.rstrip("/")
        self._upstream_path = upstream_path
        self._agent_name = agent_name
        self._token = instance_token
        self._requested_port = port
        self._binary = binary
        self._extra_args = tuple(extra_args)
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._drain: threading.Thread | None = None
        self._port = 0
        self.returncode: int | None = None

    # -- agentchattr's interface ------------------------------------------

    @property
    def port(self) -> int:
        """The port the proxy listens on (127.0.0.1) while running, else 0.
        With ``port=0`` it is the one the OS chose, known once start() has
        returned True."""
        return self._port if self._proc else 0

    @property
    def url(self) -> str:
        """Base URL of the proxy, ``http://127.0.0.1:PORT`` (no path: the
        wrapper appends ``/mcp`` or ``/sse`` and gives that to the agent)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def agent_name(self) -> str:
        """The name stamped into the sender argument of the agent's tool
        calls. The wrapper assigns it when the server renames the instance
        (a heartbeat answering another name); the running proxy applies the
        new name from its next request on, open streams keep going."""
        with self._lock:
            return self._agent_name

    @agent_name.setter
    def agent_name(self, name: str):
        with self._lock:
            self._agent_name = name
            self._push_identity()

    @property
    def token(self) -> str:
        """The instance token sent upstream as ``Authorization: Bearer`` and
        ``X-Agent-Token`` in place of whatever the agent sent. The wrapper
        assigns it after re-registering (a heartbeat answered 409); applied
        from the next request on, like ``agent_name``."""
        with self._lock:
            return self._token

    @token.setter
    def token(self, value: str):
        with self._lock:
            self._token = value
            self._push_identity()

    def set_identity(self, agent_name: str, token: str):
        """Rename and rotate in one control line, so no request can carry
        the new name with the old token (two property assignments, as
        agentchattr's wrapper does them, send two lines)."""
        with self._lock:
            self._agent_name = agent_name
            self._token = token
            self._push_identity()

    def start(self) -> bool:
        """Start the binary as a child process and wait (10 s at most) for
        it to listen; print its ``  MCP proxy: port N`` line, as
        agentchattr's proxy does, and return True. The wrapper exits when
        this returns False: a fixed ``port`` already in use (the binary
        prints agentchattr's "in use" line and exits 3). Raises RuntimeError
        on any other failure (no binary; bad arguments: exit 2, its message
        on stderr). True at once if already running."""
        if self._proc:
            return True
        with self._lock:
            env = dict(os.environ)
            env["MCP_PROXY_TOKEN"] = self._token
            args = [self._find_binary(),
                    "--upstream", self._upstream_base + self._upstream_path,
                    "--control-stdin",
                    "--agent", self._agent_name]
        if self._requested_port:
            args += ["--listen", f"127.0.0.1:{self._requested_port}"]
        args += list(self._extra_args)
        # stderr is inherited: the proxy's log lines (RUST_LOG) and its
        # one-line configuration errors reach the wrapper's console.
        flags = subprocess.CREATE_NEW_PROCESS_GROUP if WINDOWS else 0
        proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                env=env, close_fds=True, creationflags=flags)
        line = _read_line(proc, START_TIMEOUT)
        if line.startswith(PORT_LINE) and line.endswith(IN_USE_SUFFIX):
            print(line, flush=True)
            self._reap(proc)
            return False
        port = line[len(PORT_LINE):] if line.startswith(PORT_LINE) else ""
        if not port.isdigit():
            rc = self._reap(proc)
            raise RuntimeError(
                f"mcp-identity-proxy did not start (exit status {rc}, first line {line!r}); "
                "see its message on stderr")
        self._proc = proc
        self._port = int(port)
        self.returncode = None
        # Nothing else is expected on stdout; drain it so the child can
        # never block on a full pipe.
        self._drain = threading.Thread(target=_drain, args=(proc.stdout,), daemon=True)
        self._drain.start()
        log.info("MCP proxy for %s on port %d", self.agent_name, self._port)
        print(line, flush=True)
        return True

    def stop(self):
        """Stop the proxy; the wrapper calls it when the agent has exited.
        Closes the child's stdin (it shuts down gracefully at EOF, letting
        in-flight exchanges finish, and exits 0) and waits for it; after
        10 s Ctrl-Break (Windows) or SIGTERM, also graceful; then
        terminates it. Sets ``returncode``; ``port`` is 0 afterwards. Does
        nothing if not running."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with self._lock:
            try:
                proc.stdin.close()
            except OSError:
                pass
        try:
            self.returncode = proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            log.warning("mcp-identity-proxy did not exit at stdin EOF; interrupting it")
            try:
                # Reaches only the child's own process group on Windows.
                proc.send_signal(signal.CTRL_BREAK_EVENT if WINDOWS else signal.SIGTERM)
                self.returncode = proc.wait(timeout=STOP_TIMEOUT)
            except (OSError, subprocess.TimeoutExpired):
                log.warning("mcp-identity-proxy still running; terminating")
                proc.terminate()
                try:
                    self.returncode = proc.wait(timeout=STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    self.returncode = proc.wait()
        # The child is gone, so its stdout is at EOF: let the drain thread
        # see it, then close the pipe (no ResourceWarning, no leaked fd).
        drain, self._drain = self._drain, None
        if drain is not None:
            drain.join(timeout=STOP_TIMEOUT)
        if proc.stdout is not None and (drain is None or not drain.is_alive()):
            proc.stdout.close()
        self._port = 0

    # -- internals ----------------------------------------------------------

    def _push_identity(self):
        """Send the current identity to the running child (lock held). It
        applies to the next request; open streams keep going."""
        proc = self._proc
        if proc is None or proc.stdin is None or proc.stdin.closed:
            return
        line = json.dumps({"agent": self._agent_name, "token": self._token}) + "\n"
        try:
            proc.stdin.write(line.encode("utf-8"))
            proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            log.warning("cannot update the MCP proxy's identity: %s", e)

    def _find_binary(self) -> str:
        try:
            return find_binary(self._binary)
        except FileNotFoundError as e:
            raise RuntimeError(str(e)) from e

    def _reap(self, proc: subprocess.Popen) -> int:
        try:
            proc.stdin.close()
        except OSError:
            pass
        try:
            rc = proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        proc.stdout.close()
        self.returncode = rc
        return rc


def _read_line(proc: subprocess.Popen, timeout: float) -> str:
    """The child's first stdout line, without its newline ("" on EOF or
    timeout). A reader thread, since Windows cannot select() on a pipe; on
    timeout it stays blocked until the child is reaped and its pipe ends."""
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    line = got[0] if got else b""
    return line.rstrip(b"\n").decode("utf-8", "replace").rstrip("\r")


def _drain(stream):
    try:
        while stream.read(4096):
            pass
    except (OSError, ValueError):
        pass

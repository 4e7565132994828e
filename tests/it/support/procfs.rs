//! What `/proc` tells about a process (the proxy child): CPU time, resident
//! memory, open descriptors; and which processes run a given executable with
//! given arguments. Linux only; the suites gate the checks built on them with
//! `#[cfg(target_os = "linux")]`.

/// `/proc/<pid>/stat`: (state, utime + stime in seconds).
pub fn proc_stat(pid: u32) -> (char, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read /proc/pid/stat");
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let state = fields[0].chars().next().unwrap();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (state, ticks as f64 / hz)
}

/// VmRSS of `pid` in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc/pid/status");
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS line");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// VmHWM (the peak of VmRSS so far) of `pid` in KiB.
pub fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc/pid/status");
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM line");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Open descriptors of `pid`.
pub fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

/// The live processes (zombies left out) running the executable `exe` with every one of `args` among their
/// arguments.
pub fn running_with(exe: &std::path::Path, args: &[&std::ffi::OsStr]) -> Vec<u32> {
    use std::os::unix::ffi::OsStrExt;
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let exe = std::fs::canonicalize(exe).unwrap_or_else(|_| exe.to_path_buf());
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        // A process may end between the listing and these reads: it is then not running.
        if std::fs::read_link(format!("/proc/{pid}/exe")).ok().as_ref() != Some(&exe) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        // The state follows the command's closing parenthesis.
        let zombie = stat.rfind(')').and_then(|i| stat[i + 1..].split_whitespace().next()) == Some("Z");
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { continue };
        let argv: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        if !zombie && args.iter().all(|a| argv.contains(&a.as_bytes())) {
            out.push(pid);
        }
    }
    out
}

#!/usr/bin/env python3
"""Static checks of what .ci/dist produced (no build): run by .ci/dist-check. Standard library only.

Usage:
  dist_check.py artefacts DIST README.md PYTHON_PACKAGE_DIR
      Every artefact against README's install table (file name, pip tags, the binary inside: format, CPU,
      static or not), nothing missing and nothing extra; each wheel's contents (the package's sources byte for
      byte, the binary, the dist-info: METADATA's name, version and licence, RECORD's hashes, the binary's
      executable bit); the macOS binaries' Mach-O load commands (only /usr/lib and /System libraries, a
      minimum macOS no newer than the wheel's tag); the plain archives holding the wheels' binaries byte for
      byte; the sdist's layout; SHA256SUMS naming every other file.
  dist_check.py extract DIST TRIPLE DEST
      Write the binary of the wheel built for TRIPLE (e.g. aarch64-unknown-linux-musl) to DEST.
"""

import base64
import glob
import hashlib
import io
import os
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import tomllib
import zipfile

# Wheel platform tag (the first in its file name) -> Rust target, as .ci/dist builds them.
TRIPLES = {
    "manylinux2014_x86_64": "x86_64-unknown-linux-musl",
    "manylinux2014_aarch64": "aarch64-unknown-linux-musl",
    "win_amd64": "x86_64-pc-windows-gnu",
    "macosx_10_12_x86_64": "x86_64-apple-darwin",
    "macosx_11_0_arm64": "aarch64-apple-darwin",
}

failures = []


def check(ok, msg):
    if not ok:
        failures.append(msg)
        print(f"  FAIL: {msg}")
    return ok


def version():
    with open("Cargo.toml", "rb") as f:
        return tomllib.load(f)["package"]["version"]


def wheel_for(dist, triple):
    for path in glob.glob(os.path.join(dist, "*.whl")):
        if TRIPLES.get(platform_of(os.path.basename(path))) == triple:
            return path
    sys.exit(f"dist_check: no wheel for {triple} in {dist}")


def platform_of(wheel_name):
    return wheel_name[: -len(".whl")].split("-")[4].split(".")[0]


def binary_name(triple):
    return "mcp-identity-proxy.exe" if "windows" in triple else "mcp-identity-proxy"


def wheel_binary(path, ver):
    triple = TRIPLES[platform_of(os.path.basename(path))]
    with zipfile.ZipFile(path) as z:
        return z.read(f"mcp_identity_proxy-{ver}.data/scripts/{binary_name(triple)}")


# -- binary formats ------------------------------------------------------------------------------------------

def describe_elf(b):
    if b[4] != 2 or b[5] != 1:
        return "ELF (not 64-bit little-endian)", []
    machine = struct.unpack_from("<H", b, 18)[0]
    cpu = {62: "x86-64", 183: "aarch64"}.get(machine, f"machine {machine}")
    phoff, = struct.unpack_from("<Q", b, 32)
    phentsize, phnum = struct.unpack_from("<HH", b, 54)
    interp, needed = None, 0
    for i in range(phnum):
        p_type, _, p_offset, _, _, p_filesz = struct.unpack_from("<IIQQQQ", b, phoff + i * phentsize)
        if p_type == 3:  # PT_INTERP
            interp = b[p_offset:p_offset + p_filesz].rstrip(b"\0").decode()
        elif p_type == 2:  # PT_DYNAMIC: count DT_NEEDED
            for off in range(p_offset, p_offset + p_filesz, 16):
                tag, _ = struct.unpack_from("<qQ", b, off)
                if tag == 0:
                    break
                needed += tag == 1
    linking = "static" if interp is None and needed == 0 else f"dynamic ({interp}, {needed} DT_NEEDED)"
    return f"ELF {cpu}, {linking}", []


def describe_pe(b):
    off, = struct.unpack_from("<I", b, 0x3C)
    if b[off:off + 4] != b"PE\0\0":
        return "MZ without a PE header", []
    machine, = struct.unpack_from("<H", b, off + 4)
    return ("PE x86-64" if machine == 0x8664 else f"PE machine {machine:#x}"), []


MACHO_DYLIB_CMDS = {0xC: "LC_LOAD_DYLIB", 0x80000018: "LC_LOAD_WEAK_DYLIB", 0x8000001F: "LC_REEXPORT_DYLIB",
                    0x20: "LC_LAZY_LOAD_DYLIB", 0x80000023: "LC_LOAD_UPWARD_DYLIB"}


def macho_info(b):
    """(cpu, filetype, [(load command, dylib path)], minimum macOS as (major, minor))."""
    cputype, _, filetype, ncmds, _ = struct.unpack_from("<iiIII", b, 4)
    cpu = {0x01000007: "x86_64", 0x0100000C: "arm64"}.get(cputype, f"cputype {cputype:#x}")
    off, dylibs, minos = 32, [], None
    for _ in range(ncmds):
        cmd, size = struct.unpack_from("<II", b, off)
        if cmd in MACHO_DYLIB_CMDS:
            name_off, = struct.unpack_from("<I", b, off + 8)
            name = b[off + name_off:off + size].split(b"\0", 1)[0].decode()
            dylibs.append((MACHO_DYLIB_CMDS[cmd], name))
        elif cmd == 0x32:  # LC_BUILD_VERSION: platform, minos (xxxx.yy.zz)
            v, = struct.unpack_from("<I", b, off + 12)
            minos = (v >> 16, (v >> 8) & 0xFF)
        elif cmd == 0x24:  # LC_VERSION_MIN_MACOSX
            v, = struct.unpack_from("<I", b, off + 8)
            minos = (v >> 16, (v >> 8) & 0xFF)
        off += size
    return cpu, filetype, dylibs, minos


def describe_macho(b):
    cpu, filetype, dylibs, _ = macho_info(b)
    kind = f"Mach-O {cpu}" + ("" if filetype == 2 else f" (filetype {filetype}, not MH_EXECUTE)")
    return kind, dylibs


def describe(b):
    if b[:4] == b"\x7fELF":
        return describe_elf(b)
    if b[:2] == b"MZ":
        return describe_pe(b)
    if b[:4] == b"\xcf\xfa\xed\xfe":
        return describe_macho(b)
    return f"unknown format {b[:4]!r}", []


# -- the README table ----------------------------------------------------------------------------------------

def readme_table(readme):
    """{file name: (tags or kind, binary name or None, binary description or None)} from the rows whose first
    cell is an artefact's file name."""
    rows = {}
    for line in open(readme, encoding="utf-8"):
        m = re.match(r"^\| `(mcp[-_]identity[-_]proxy-[^`]+)` \|(.*)\|\s*$", line)
        if not m:
            continue
        cells = [c.strip() for c in m.group(2).split("|")]
        tags = re.findall(r"`([^`]+)`", cells[0]) or [cells[0]]
        inside = re.match(r"^`([^`]+)`: (.+)$", cells[2]) if len(cells) > 2 else None
        rows[m.group(1)] = (tags, inside.group(1) if inside else None, inside.group(2) if inside else None)
    return rows


def record_ok(z, record_name):
    bad = []
    for row in z.read(record_name).decode().splitlines():
        name, digest, _ = row.rsplit(",", 2)
        if not digest:
            continue
        algo, want = digest.split("=", 1)
        got = base64.urlsafe_b64encode(hashlib.new(algo, z.read(name)).digest()).rstrip(b"=").decode()
        if got != want:
            bad.append(name)
    return bad


def check_wheel(path, row, ver, package_dir):
    name = os.path.basename(path)
    triple = TRIPLES.get(platform_of(name))
    print(f"- {name}")
    if not check(triple is not None, f"{name}: no Rust target for platform {platform_of(name)}"):
        return None
    tags, binary, kind = row
    exe = binary_name(triple)
    check(binary == exe, f"{name}: README names the binary {binary!r}, the wheel's is {exe!r}")
    # The file name's compressed tag set expands to the README's tags, and so does WHEEL.
    py, abi, plats = name[: -len(".whl")].split("-")[2:5]
    from_name = [f"{p}-{a}-{pl}" for p in py.split(".") for a in abi.split(".") for pl in plats.split(".")]
    check(sorted(from_name) == sorted(tags), f"{name}: file name tags {from_name} != README {tags}")
    dist_info = f"mcp_identity_proxy-{ver}.dist-info"
    sources = sorted(f for f in os.listdir(package_dir) if f.endswith(".py"))
    expected = {f"mcp_identity_proxy/{f}" for f in sources} | {
        f"mcp_identity_proxy-{ver}.data/scripts/{exe}", f"{dist_info}/METADATA", f"{dist_info}/WHEEL",
        f"{dist_info}/RECORD", f"{dist_info}/sboms/mcp-identity-proxy.cyclonedx.json"}
    with zipfile.ZipFile(path) as z:
        names = set(z.namelist())
        check(names == expected, f"{name}: contents differ: extra {sorted(names - expected)}, "
                                 f"missing {sorted(expected - names)}")
        if names != expected:
            return None
        for f in sources:
            with open(os.path.join(package_dir, f), "rb") as src:
                check(z.read(f"mcp_identity_proxy/{f}") == src.read(), f"{name}: {f} is not python/'s")
        wheel_tags = [l.split(":", 1)[1].strip() for l in z.read(f"{dist_info}/WHEEL").decode().splitlines()
                      if l.startswith("Tag:")]
        check(sorted(wheel_tags) == sorted(tags), f"{name}: WHEEL tags {wheel_tags} != README {tags}")
        meta = z.read(f"{dist_info}/METADATA").decode()
        for field in ("Name: mcp-identity-proxy", f"Version: {ver}", "License-Expression: MIT"):
            check(f"\n{field}\n" in f"\n{meta}", f"{name}: METADATA lacks {field!r}")
        check("\n# mcp-identity-proxy\n" in meta, f"{name}: METADATA's description is not the README")
        bad = record_ok(z, f"{dist_info}/RECORD")
        check(not bad, f"{name}: RECORD hashes wrong for {bad}")
        info = z.getinfo(f"mcp_identity_proxy-{ver}.data/scripts/{exe}")
        if "windows" not in triple:
            # pip makes an installed script executable only if its zip entry is.
            check((info.external_attr >> 16) & 0o111 == 0o111, f"{name}: the binary is not executable")
        data = z.read(info)
    got, dylibs = describe(data)
    check(got == kind, f"{name}: the binary is {got!r}, README says {kind!r}")
    print(f"    {len(expected)} files; {exe}: {len(data)} bytes, {got}")
    if got.startswith("Mach-O"):
        check_macho(name, data, dylibs)
    return data


def check_macho(name, data, dylibs):
    _, _, _, minos = macho_info(data)
    tag = re.search(r"macosx_(\d+)_(\d+)_", name)
    tag_v = (int(tag.group(1)), int(tag.group(2)))
    check(minos is not None and minos <= tag_v, f"{name}: minimum macOS {minos} is newer than the tag's {tag_v}")
    print(f"    minimum macOS {minos[0]}.{minos[1]} (tag {tag_v[0]}.{tag_v[1]})" if minos else "    no minimum")
    check(dylibs, f"{name}: no LC_LOAD_DYLIB at all (not a dynamically linked Mach-O executable?)")
    for cmd, lib in dylibs:
        system = lib.startswith("/usr/lib/") or lib.startswith("/System/Library/")
        print(f"    {cmd} {lib}")
        check(system, f"{name}: links {lib}, not a system library")
    # A second opinion where llvm's objdump is installed (it is not required).
    objdump = shutil.which("llvm-objdump")
    if objdump:
        tmp = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"macho-{os.getpid()}")
        with open(tmp, "wb") as f:
            f.write(data)
        out = subprocess.run([objdump, "--macho", "--dylibs-used", tmp], capture_output=True, text=True)
        os.unlink(tmp)
        theirs = sorted(l.strip().split(" (")[0] for l in out.stdout.splitlines()[1:] if l.strip())
        check(theirs == sorted(lib for _, lib in dylibs), f"{name}: llvm-objdump lists {theirs}")
        print(f"    llvm-objdump --dylibs-used agrees")


def check_archive(path, binaries, readme_bytes, ver):
    name = os.path.basename(path)
    print(f"- {name}")
    before = len(failures)
    m = re.match(rf"^mcp-identity-proxy-{re.escape(ver)}-(.+?)\.(tar\.gz|zip)$", name)
    if not check(m is not None, f"{name}: not a plain-binary archive name"):
        return
    triple, top = m.group(1), name[: -len("." + m.group(2))]
    exe = binary_name(triple)
    if not check(triple in binaries, f"{name}: no wheel was built for {triple}"):
        return
    if m.group(2) == "zip":
        check("windows" in triple, f"{name}: a .zip for a Unix target")
        with zipfile.ZipFile(path) as z:
            members = {i.filename: z.read(i) for i in z.infolist()}
    else:
        check("windows" not in triple, f"{name}: a .tar.gz for Windows")
        with tarfile.open(path) as t:
            members = {}
            for i in t.getmembers():
                members[i.name] = t.extractfile(i).read()
                if i.name.endswith(exe):
                    check(i.mode & 0o111 == 0o111, f"{name}: {i.name} is not executable")
    want = {f"{top}/{exe}", f"{top}/README.md"}
    check(set(members) == want, f"{name}: holds {sorted(members)}, expected {sorted(want)}")
    check(members.get(f"{top}/{exe}") == binaries[triple], f"{name}: its binary is not the wheel's")
    check(members.get(f"{top}/README.md") == readme_bytes, f"{name}: its README.md is not the README")
    if len(failures) == before:
        print(f"    {exe}: the {triple} wheel's binary, byte for byte; README.md")


def check_sdist(path, ver):
    name = os.path.basename(path)
    print(f"- {name}")
    top = f"mcp_identity_proxy-{ver}"
    with tarfile.open(path) as t:
        names = set(t.getnames())
        pkg_info = t.extractfile(f"{top}/PKG-INFO").read().decode() if f"{top}/PKG-INFO" in names else ""
    for f in ("PKG-INFO", "pyproject.toml", "Cargo.toml", "Cargo.lock", "README.md", "src/main.rs",
              "python/mcp_identity_proxy/__init__.py", "python/mcp_identity_proxy/__main__.py"):
        check(f"{top}/{f}" in names, f"{name}: no {f}")
    check(f"\nVersion: {ver}\n" in pkg_info, f"{name}: PKG-INFO is not version {ver}")
    print(f"    {len(names)} files: the crate (Cargo.toml, Cargo.lock, src/), pyproject.toml, python/")


def artefacts(dist, readme, package_dir):
    ver = version()
    rows = readme_table(readme)
    files = sorted(f for f in os.listdir(dist) if f != "SHA256SUMS")
    print(f"{len(files)} artefacts in {dist}, {len(rows)} rows in {readme}'s table")
    check(sorted(rows) == files, f"README's table {sorted(set(rows) - set(files))} not built; "
                                 f"built but not in README's table {sorted(set(files) - set(rows))}")
    binaries = {}
    for f in files:
        if f.endswith(".whl") and f in rows:
            data = check_wheel(os.path.join(dist, f), rows[f], ver, package_dir)
            if data is not None:
                binaries[TRIPLES[platform_of(f)]] = data
    check(sorted(binaries) == sorted(TRIPLES.values()), f"wheels for {sorted(binaries)} only")
    with open(readme, "rb") as f:
        readme_bytes = f.read()
    for f in files:
        if f.startswith("mcp-identity-proxy-"):
            check_archive(os.path.join(dist, f), binaries, readme_bytes, ver)
        elif f == f"mcp_identity_proxy-{ver}.tar.gz":
            check(rows.get(f, ([],))[0] == ["sdist"], f"{f}: README's row does not call it the sdist")
            check_sdist(os.path.join(dist, f), ver)
        elif not f.endswith(".whl"):
            check(False, f"{f}: not an artefact .ci/dist makes")
    sums = {}
    with open(os.path.join(dist, "SHA256SUMS")) as f:
        for line in f:
            digest, fname = line.rstrip("\n").split(None, 1)
            sums[fname.lstrip("*")] = digest
    check(sorted(sums) == files, f"SHA256SUMS names {sorted(sums)}, the directory holds {files}")
    if failures:
        print(f"dist_check: {len(failures)} failure(s)")
        sys.exit(1)
    print("dist_check: every artefact is what README's table says")


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "artefacts":
        artefacts(*sys.argv[2:])
    elif len(sys.argv) == 5 and sys.argv[1] == "extract":
        dist, triple, dest = sys.argv[2:]
        data = wheel_binary(wheel_for(dist, triple), version())
        with open(dest, "wb") as f:
            f.write(data)
        os.chmod(dest, 0o755)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()

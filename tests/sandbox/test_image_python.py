"""Images without a Python raas can run on: the action server runs on the one raas provides.

The images here are tiny: the host's bash and a few coreutils with the shared libraries they
need (found with ldd), copied into a layer; the control adds a python3 of its own. Both run in
real bwrap sandboxes, so the tests show which interpreter the action server ran on (the bash
tool's parent is the action server: its /proc/PID/exe and maps).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from raas.images.errors import ImageError
from raas.images.image import StoredImage
from raas.sandbox import rootfs
from raas.sandbox.bwrap import BwrapSandbox
from raas.sandbox.hostpython import MOUNT, provided_python
from raas.sandbox.rootfs import ImagePython, probe_python
from tests.sandbox.test_image_rootfs import layer, runtime, started  # noqa: F401  (runtime: a fixture)

PATH = "/usr/local/bin:/usr/bin:/bin"
TOOLS = ("bash", "cat", "readlink", "ls")
ELF_STUB = b"\x7fELF\x02\x01\x01" + bytes(9) + b"\x02\x00\x3e\x00"  # an x86-64 ELF header's start
_LDD_PATH = re.compile(r"(/\S+) \(0x[0-9a-f]+\)")


def image_of(*layers: Path, digest: str = "sha256:01") -> StoredImage:
    return StoredImage("example.org/nopython:1", digest, tuple(layers))


def tools_layer(root: Path) -> Path:
    """A layer of the host's bash and coreutils, their libraries and loader, nothing else."""
    root.mkdir(parents=True)
    # The host's merged-/usr links (bin -> usr/bin...), so that the host's paths hold here too.
    for name in ("bin", "sbin", "lib", "lib64"):
        if Path("/", name).is_symlink():
            link = os.readlink(Path("/", name))
            (root / name).symlink_to(link)
            (root / link).mkdir(parents=True, exist_ok=True)  # a relative link: its target
    binaries = [Path(shutil.which(tool) or tool) for tool in TOOLS]
    ldd = subprocess.run(["ldd", *map(str, binaries)], capture_output=True, text=True, check=True)
    for path in [*binaries, *(Path(p) for p in _LDD_PATH.findall(ldd.stdout))]:
        target = root / path.relative_to("/")  # where the host has it (a link: its file)
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
    for name in ("etc", "tmp", "proc", "dev"):
        (root / name).mkdir(exist_ok=True)
    for name in ("passwd", "group"):  # what bwrap binds its own over
        (root / "etc" / name).touch()
    return root


def python_layer(root: Path, libc: Path) -> Path:
    """A layer with a python3 of the image's own, at /usr/local (made from the copy raas
    provides: the same Python, started the usual way, by the image's own loader)."""
    copy = provided_python().copy
    version = next(copy.glob("bin/python3.*")).name
    (root / "usr/local/bin").mkdir(parents=True)
    shutil.copy2(copy / "bin" / version, root / "usr/local/bin" / version)
    (root / "usr/local/bin/python3").symlink_to(version)
    shutil.copytree(copy / "lib" / version, root / "usr/local/lib" / version, copy_function=_link)
    libs = root / libc.parent.relative_to("/")
    libs.mkdir(parents=True, exist_ok=True)
    for lib in (copy / "lib").glob("lib*.so*"):
        if not (libs / lib.name).exists():
            shutil.copy2(lib, libs / lib.name)
    return root


def _link(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # another filesystem
        shutil.copy2(source, target)


def host_libc() -> Path:
    bash = shutil.which("bash") or "bash"
    ldd = subprocess.run(["ldd", bash], capture_output=True, text=True, check=True).stdout
    return Path(os.path.realpath(re.search(r"libc\.so\.6 => (\S+)", ldd)[1]))  # type: ignore[index]


async def server_exe(sandbox: BwrapSandbox) -> tuple[str, set[str]]:
    """The action server's binary (the bash tool's parent) and the libc files it has mapped."""
    shell = await sandbox.bash(
        'readlink /proc/$PPID/exe; while read -r l; do case $l in *libc.so*) echo "${l##* }";;'
        " esac; done < /proc/$PPID/maps"
    )
    assert shell.exit_code == 0, shell.output
    exe, *libcs = shell.output.split()
    return exe, set(libcs)


# -- unit: the probe ----------------------------------------------------------------------------


def python_in(root: Path, name: str, content: bytes = ELF_STUB, stdlib: bool = True) -> Path:
    (root / "usr/bin").mkdir(parents=True, exist_ok=True)
    (root / "usr/bin" / name).write_bytes(content)
    (root / "usr/bin" / name).chmod(0o755)
    (root / "usr/bin/python3").symlink_to(name)
    if stdlib:
        layer(root, {f"usr/lib/{name}/os.py": ""})
    return root


def bash_in(root: Path) -> Path:
    (root / "bin").mkdir(parents=True, exist_ok=True)
    (root / "bin/bash").write_bytes(Path(os.path.realpath(shutil.which("bash") or "")).read_bytes())
    (root / "bin/bash").chmod(0o755)
    return root


def test_the_probe_trusts_only_what_it_can_check(tmp_path: Path) -> None:
    bash = bash_in(tmp_path / "bash")
    own = image_of(bash, python_in(tmp_path / "ok", "python3.10"), digest="sha256:a")
    assert probe_python(own, "python3", PATH) == ImagePython("/usr/bin/python3")
    cases = {
        "old": (python_in(tmp_path / "old", "python3.6"), r"Python 3\.6; .*3\.8 or newer"),
        "script": (
            python_in(tmp_path / "script", "python3.11", b'#!/bin/sh\nexec python3.6 "$@"\n'),
            r"not an ELF binary \(a wrapper script\?\)",
        ),
        "nolib": (
            python_in(tmp_path / "nolib", "python3.11", stdlib=False),
            r"no standard library beside it \(/usr/lib/python3.11/os.py\)",
        ),
        "none": (layer(tmp_path / "none", {"etc/issue": ""}), r"no python3 on its PATH"),
    }
    for name, (python, why) in cases.items():
        found = probe_python(image_of(bash, python, digest=f"sha256:{name}"), "python3", PATH)
        assert found.path is None and re.search(why, found.why), (name, found)


def test_the_probe_reads_an_image_once(tmp_path: Path) -> None:
    python = python_in(tmp_path / "ok", "python3.10")
    image = image_of(bash_in(tmp_path / "bash"), python, digest="sha256:once")
    assert probe_python(image, "python3", PATH).path == "/usr/bin/python3"
    (python / "usr/bin/python3.10").unlink()  # an image never changes: not read again
    assert probe_python(image, "python3", PATH).path == "/usr/bin/python3"
    other = image_of(bash_in(tmp_path / "bash"), python, digest="sha256:other")
    assert probe_python(other, "python3", PATH).path is None


def test_an_image_that_can_run_neither_is_an_error_naming_it(tmp_path: Path) -> None:
    old = python_in(tmp_path / "old", "python3.6")
    with pytest.raises(
        ImageError,
        match=r"^image example.org/nopython:1: raas cannot run in it: its python3 .* is Python"
        r" 3\.6; .*, and it cannot run raas's own Python either: it has no bash on its PATH",
    ) as raised:
        probe_python(image_of(old, digest="sha256:nobash"), "python3", PATH)
    assert raised.value.retry is False  # running the job again cannot help
    alien = tmp_path / "alien"
    (alien / "bin").mkdir(parents=True)
    (alien / "bin/bash").write_bytes(ELF_STUB[:18] + b"\xb7\x00")  # aarch64
    (alien / "bin/bash").chmod(0o755)
    with pytest.raises(ImageError, match=r"its bash \(/bin/bash\) is built for another arch"):
        probe_python(image_of(old, alien, digest="sha256:alien"), "python3", PATH)


# -- sandboxes: the provided Python, and the image's own ----------------------------------------


async def test_an_image_without_python_runs_on_the_provided_one(
    tmp_path: Path,
    runtime: Path,  # noqa: F811
) -> None:
    image = image_of(tools_layer(tmp_path / "tools"), digest="sha256:tools")
    assert not any(rootfs.lookup(image, f"{d}/python3") for d in PATH.split(":"))
    async with started(image, runtime) as sandbox:
        exe, libcs = await server_exe(sandbox)
        assert exe == f"{MOUNT}/lib/ld-linux-x86-64.so.2"
        assert libcs == {f"{MOUNT}/lib/libc.so.6"}  # never the image's own
        # The tools are the image's, and inherit nothing of the loader's options.
        shell = await sandbox.bash(
            'echo "${LD_LIBRARY_PATH-none} ${PYTHONHOME-none}"; type -P bash; ls /'
        )
        lines = shell.output.splitlines()
        assert lines[:2] == ["none none", "/usr/bin/bash"], shell.output
        assert "python3" not in shell.output
        created = await sandbox.editor("create", "/workspace/a.py", file_text="x = 1\n")
        assert "created" in created.lower()
        await sandbox.editor("str_replace", "/workspace/a.py", old_str="x = 1", new_str="x = 2")
        cat = await sandbox.bash("cat /workspace/a.py")
        assert cat.output.strip() == "x = 2"
        # The provided copy is read-only in the sandbox.
        denied = await sandbox.bash(f"echo x > {MOUNT}/lib/libc.so.6 || echo denied")
        assert denied.output.strip().endswith("denied")


async def test_an_image_with_its_own_python_runs_on_it(
    tmp_path: Path,
    runtime: Path,  # noqa: F811
) -> None:
    tools = tools_layer(tmp_path / "tools")
    python = python_layer(tmp_path / "python", host_libc())
    image = image_of(tools, python, digest="sha256:python")
    async with started(image, runtime) as sandbox:
        exe, libcs = await server_exe(sandbox)
        assert exe.startswith("/usr/local/bin/python3.")
        assert libcs and not any(lib.startswith(MOUNT) for lib in libcs)
        mounts = await sandbox.bash(f"ls {MOUNT} 2>&1 || echo absent")
        assert mounts.output.strip().endswith("absent")  # nothing provided was bound

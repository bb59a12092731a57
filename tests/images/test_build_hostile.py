"""A hostile tenant's Dockerfile against the build host (``raas.images.buildah``): each attack
beside a control that shows the same build otherwise works. The ``images`` tier: real buildah
on the tier's base image (the fixture of ``test_dockerfile``).

Holes found (each test fails on the code before its fix):

- a RUN step saw every process of the host (no PID namespace of the build's own): the
  server's, other tenants' sandboxes', their command lines;
- a process a RUN step started detached (``setsid``) outlived the build, as the build ids'
  root (host uid 1,100,000, the owner of every build's storage), reparented to the host's init,
  free to run on and to signal every later build's processes (the same host uid).
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from raas.images.buildah import build_context
from raas.images.errors import ImageError
from raas.sandbox import cgroups, runtime_root
from tests.images import test_dockerfile
from tests.images.test_dockerfile import BASE, Setup, _build, _in_layers, _marked

setup = test_dockerfile.setup  # the fixture: the tier's base in a store, buildah's storage


def _context(root: Path, dockerfile: str, files: dict[str, str]) -> Path:
    root.mkdir(parents=True)
    (root / "Dockerfile").write_text(dockerfile)
    for name, text in files.items():
        (root / name).write_text(text)
    return root


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)


LOOK = """\
import os, sys
host = int(sys.argv[1])
pids = [p for p in os.listdir('/proc') if p.isdigit()]
seen = os.path.exists(f'/proc/{host}')
open('/seen.txt', 'w').write(f'{seen} {len(pids)}')
"""


@pytest.mark.images
def test_a_run_step_sees_no_process_of_the_host(setup: Setup, tmp_path: Path) -> None:
    """The test's own process (the host's, as raas's server would be) is not visible from a
    RUN step; the control: the step sees itself."""
    ctx = _context(
        tmp_path / "env",
        f"FROM {BASE}\nCOPY look.py /look.py\nRUN python3 /look.py {os.getpid()}\n",
        {"look.py": LOOK},
    )
    image, _ = _build(setup, ctx)
    seen, count = (_in_layers(image, "/seen.txt") or "").split()
    assert int(count) >= 1  # control: its own process at least
    assert seen == "False", f"a RUN step saw the host's process {os.getpid()} ({count} in all)"


SPAWN = """\
import subprocess, sys
subprocess.Popen(
    ['python3', '-c', 'import time; time.sleep(300)', sys.argv[1]],
    start_new_session=True,
    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
)
open('/spawned.txt', 'w').write('spawned')
"""


@pytest.mark.images
def test_a_process_a_run_step_leaves_behind_dies_with_the_build(
    setup: Setup, tmp_path: Path
) -> None:
    marker = f"raas-survivor-{os.getpid()}"
    ctx = _context(
        tmp_path / "env",
        f"FROM {BASE}\nCOPY spawn.py /spawn.py\nRUN python3 /spawn.py {marker}\n",
        {"spawn.py": SPAWN},
    )
    try:
        image, _ = _build(setup, ctx)
        assert _in_layers(image, "/spawned.txt") == "spawned"  # control: it did start one
        left = _marked(marker)
        assert left == [], f"a RUN step's detached process outlived the build: pids {left}"
    finally:
        _kill(_marked(marker))


PLANT = """\
import os
open('/opt/suid', 'w').write('#!/bin/sh\\nid\\n')
os.chmod('/opt/suid', 0o6755)
open('/opt/capped', 'w').write('x')
# security.capability v2, CAP_SETUID|CAP_SYS_ADMIN permitted and effective
cap = (0x02000001).to_bytes(4, 'little') + (0x200080).to_bytes(4, 'little') + bytes(16)
try:
    os.setxattr('/opt/capped', 'security.capability', cap)
    capped = 'yes'
except OSError as e:
    capped = e.strerror
os.mkdir('/opt/open')
os.chmod('/opt/open', 0o777)
mode = oct(os.stat('/opt/suid').st_mode & 0o7777)
open('/opt/planted.txt', 'w').write(f'{mode} {capped}')
"""


def _layer_entry(image: object, path: str) -> Path:
    for layer in reversed(image.layers):  # type: ignore[attr-defined]
        found = layer / path.lstrip("/")
        if os.path.lexists(found):
            return found
    raise AssertionError(f"{path} not in the image")


@pytest.mark.images
def test_setuid_files_capabilities_and_open_dirs_do_not_survive_into_the_store(
    setup: Setup, tmp_path: Path
) -> None:
    """Contained: what a RUN step planted for the sandbox's user to climb by is masked by the
    store's unpacking (``raas.images.layers``); the control: the step did plant it."""
    ctx = _context(
        tmp_path / "env",
        f"FROM {BASE}\nCOPY plant.py /plant.py\nRUN python3 /plant.py\n",
        {"plant.py": PLANT},
    )
    image, _ = _build(setup, ctx)
    planted = (_in_layers(image, "/opt/planted.txt") or "").split(maxsplit=1)
    assert planted[0] == "0o6755"  # control: setuid and setgid inside the build
    suid = _layer_entry(image, "/opt/suid").lstat()
    assert stat.S_IMODE(suid.st_mode) & 0o6000 == 0 and suid.st_mode & 0o100
    capped = _layer_entry(image, "/opt/capped")
    assert "security.capability" not in os.listxattr(capped, follow_symlinks=False), planted
    assert stat.S_IMODE(_layer_entry(image, "/opt/open").lstat().st_mode) & 0o022 == 0


FORKS = """\
import os, time
kids = []
try:
    for _ in range(300):
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        kids.append(pid)
except OSError:
    pass
for pid in kids:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
open('/forks.txt', 'w').write(str(len(kids)))
"""


@contextlib.contextmanager
def _build_cgroup(caps: cgroups.Caps) -> Iterator[list[Path]]:
    group = cgroups.create(runtime_root(), f"build-test-{os.getpid()}", caps)
    if group is None:
        pytest.skip("raas can write no cgroup here: builds run without caps")
    try:
        yield group.procs_files()
    finally:
        group.remove()


@pytest.mark.images
@pytest.mark.parametrize("capped", [False, True], ids=["control", "capped"])
def test_a_run_steps_processes_are_held_to_the_builds_cgroup(
    setup: Setup, tmp_path: Path, capped: bool
) -> None:
    """A fork bomb in a RUN step is held to the build's pids cap (buildah's own threads count
    too); the control, with no cgroup, forks all 300."""
    ctx = _context(
        tmp_path / "env",
        f"FROM {BASE}\nCOPY forks.py /forks.py\nRUN python3 /forks.py\n",
        {"forks.py": FORKS, "nonce": str(capped)},
    )
    with contextlib.ExitStack() as stack:
        procs = stack.enter_context(_build_cgroup(cgroups.Caps(None, 96, None))) if capped else []
        image = build_context(setup.store, ctx, dirs=setup.dirs, timeout_s=300, cgroup=procs).image
    forks = int(_in_layers(image, "/forks.txt") or "-1")
    assert forks < 96 if capped else forks == 300


@pytest.mark.images
def test_a_run_step_over_the_builds_memory_cap_fails_the_build(
    setup: Setup, tmp_path: Path
) -> None:
    """512 MiB written in a RUN step under a 256 MiB cap: killed, and the build is an
    ImageError; the control (the same step under a 2 GiB cap) builds."""
    hog = "RUN python3 -c \"b = b'x' * (512 << 20); print(len(b))\"\n"
    for cap, name in ((2048 << 20, "control"), (256 << 20, "capped")):
        ctx = _context(tmp_path / name, f"FROM {BASE}\n{hog}", {"nonce": name})
        with _build_cgroup(cgroups.Caps(cap, None, None)) as procs:
            if name == "control":
                build_context(setup.store, ctx, dirs=setup.dirs, timeout_s=300, cgroup=procs)
            else:
                with pytest.raises(ImageError, match="build failed"):
                    build_context(setup.store, ctx, dirs=setup.dirs, timeout_s=300, cgroup=procs)

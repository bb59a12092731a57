"""Every ```bash and ```python block of README.md and of the pages in docs/ runs as written.

A ```python block runs with the block's ``.venv/bin/python``, unless the line before its fence
says what else it is: ``<!-- excerpt: PATH -->`` (an abridged part of a file of the repository,
each of its lines found in that file in order, the file itself run by another block or tier) or
``<!-- fragment: WHY -->`` (a sketch that needs what no block has, a trainer's cluster: few of
them, each saying why).

Each block runs as a script (``bash -e -o pipefail``: a failing command fails the block) in a
fresh directory that looks like the repository's root (its files linked in, so ``examples/...``
and ``scripts/...`` resolve, while what a block writes stays there), with a ``.venv`` of its
own: an overlay of the running environment's packages with this checkout installed editable, so
``.venv/bin/raas`` is the code under test and a block's ``pip install`` changes nothing outside.
A block runs in a process group of its own, and in a network namespace of its own when the test
runs as root (its fixed ports, 8000 and up, collide with nothing), unless it downloads
(``NETWORK``); whatever it started in the background is killed when it ends, and the test fails
if any of it survives.

A block that is not listed below runs in the default suite. ``SKIP`` lists the blocks that do
not run here and why; ``HEAVY`` the ones too slow for ``make test`` (SmolLM2 on the CPU, the
agents' environment), which run with ``make test-readme`` (marker ``readme``). A listed block
that is no longer in the README fails the listing test, so the lists cannot go stale.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import site
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# The README and the manual's pages, whose blocks are keyed by heading as the README's are.
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]

# Keyed by the block's section heading and its first line (without a trailing comment).
SKIP = {
    "Two commands :: make demo": "installs into .venv and runs the whole suite (make test, this"
    " test's own runner) and the SmolLM2 demo: what a fresh clone runs, not a step inside it",
    "raas with verl :: make test-verl": "builds .venv-verl (torch, verl 0.9.1: minutes); it is"
    " a tier of its own",
    "SWE-bench, SWE-Gym and R2E-Gym rows in their images :: raas images pull"
    " swebench/sweb.eval.x86_64.astropy__astropy-12907:latest": "pulls SWE-bench's images from"
    " Docker Hub, which this machine cannot reach (make test-images runs the same path against"
    " a registry on 127.0.0.1)",
    "On HPC clusters: Apptainer, Slurm, Ray :: raas images build ./rootfs"
    " ~/.cache/raas/images/my-env.sif": "needs a root filesystem, Apptainer images and a Slurm"
    " cluster with GPU nodes (make test-hpc and make test-slurm test those paths)",
}
HEAVY = {
    "Using it :: .venv/bin/raas engine --model smollm2 --port 8001 &": "SmolLM2 on the CPU:"
    " converts the model on a first start, then 8 HumanEval rollouts",
    "The embedded engine :: RAAS_API_KEY=$(openssl rand -hex 16) .venv/bin/raas engine --model"
    " smollm2 --port 8001 &": "starts SmolLM2 on the CPU",
    "Agents raas did not write: the gateway and harness tasks :: make agents-venv": "builds"
    " .venv-agents from PyPI (about 730 MB, minutes), then mini-swe-agent's rollout",
    "Agents raas did not write: the gateway and harness tasks :: make agents-node": "builds"
    " .agents-node from npm (612 MB), Pi's rollout with the tiny model, then the harness_agents"
    " tier's npm agents",
    "Running the shipped tasks :: scripts/harbor/import-base.sh": "makes Debian's root"
    " filesystem with debootstrap (once), builds six images with buildah, runs them twice",
}
# Blocks that download (pip): they run on the host's network, not in a namespace of their own.
# None of them listens on a fixed port.
NETWORK = {
    "Writing a task :: .venv/bin/pip install --quiet -e examples/my_task",
    "Running the shipped tasks :: scripts/harbor/import-base.sh",  # debootstrap, once
    "Agents raas did not write: the gateway and harness tasks :: make agents-venv",
    "Agents raas did not write: the gateway and harness tasks :: make agents-node",
}
# What a block's output must hold, beyond its exit status (matched with runs of whitespace as
# one space: rich folds lines off a terminal).
EXPECT = {
    "Running the shipped tasks :: scripts/harbor/import-base.sh": [
        r"6 of 6 tasks ok",
        r"mean reward 1\.000, pass rate 6/6",
    ],
    "Agents raas did not write: the gateway and harness tasks :: make agents-node": [
        r"humaneval-swe-0000 done 0\.0 1 32 agent_exit_0",
        r"\b6 passed\b",  # the six npm agents of the tier
    ],
    "Two commands :: .venv/bin/raas demo --oracle": [
        r"mean reward 1\.000, pass rate 10/10; done 10",
    ],
    "Using it :: .venv/bin/raas serve --port 8000 --run-workers 8 --eval-workers 32 &": [
        r'"job_id":"cd-7","state":"done","stage":null,"result":\{',
        r"1 result in results\.jsonl: done 1",
        r"wrote 2 results to rollouts\.parquet",
        r"wrote 2 results to rollouts\.jsonl",
    ],
    "Exporting :: ADMIN_KEY=$(python3 -c 'import secrets; print(secrets.token_hex(16))')": [
        r'\{"job_id":"cd-7",.*,"tenant":"alice"\}',  # the export's line: Alice's own id
        r"wrote 1 result to alice\.parquet",
        r"wrote 1 result to alice\.jsonl",
    ],
    "Dashboard :: export RAAS_API_KEY=$(python3 -c 'import secrets;"
    " print(secrets.token_hex(16))')": [
        r"\b401 open http://localhost:8003/ui\?key=[0-9a-f]{32}",
    ],
    "Writing a task :: .venv/bin/pip install --quiet -e examples/my_task": [
        r"errors done \S+ 1 \d+ \S+",  # the table: task, state, reward, turns, tokens, why
        r"2 rollouts in .* done 2",
    ],
    "Agents raas did not write: the gateway and harness tasks :: .venv/bin/python -c 'import"
    " json; from raas.tasks.datasets import humaneval": [
        r"HumanEval/0 done",
        r"1 rollout in .* done 1",
    ],
    "Agents raas did not write: the gateway and harness tasks :: mkdir -p my_agent": [
        r"math-gen-0001 done 0\.0 1 32 agent_exit_0",  # task, state, reward, turns, tokens, why
        # metrics.agent_output: what it printed; repr picks " when the text holds a '
        r"exit code 0 output: the model answered: ['\"]",
    ],
}
DEADLINE_S = 240.0  # per block, generous for a loaded 2-core machine
HEAVY_DEADLINE_S = 1200.0
STOP_GRACE_S = 40.0  # SIGTERM lets servers drain (nothing in flight) and remove their sandboxes


COMMENT = re.compile(r"\s{2,}#")  # the README's trailing comments: two spaces or more, then #


MARKER = re.compile(r"<!-- (excerpt|fragment): (.+?) -->")
MAX_FRAGMENTS = 5  # sketches that run nowhere: kept few


@dataclass(frozen=True)
class Block:
    heading: str
    line: int  # of the opening fence
    text: str
    page: str = "README.md"  # relative to the repository's root
    language: str = "bash"
    marker: tuple[str, str] | None = None  # ("excerpt", PATH) or ("fragment", WHY)

    @property
    def key(self) -> str:
        first = next(x for x in self.text.splitlines() if x.strip())
        command = COMMENT.split(first)[0].strip()
        return f"{self.heading} :: {command}"


def code_blocks(markdown: str, page: str = "README.md") -> list[Block]:
    """The page's ```bash and ```python blocks, each with its heading and its marker."""
    blocks: list[Block] = []
    heading, fence, start, body, before = "", None, 0, [], ""
    marker: tuple[str, str] | None = None
    for number, line in enumerate(markdown.splitlines(), 1):
        if fence is None:
            if line.startswith("#"):
                heading = line.lstrip("#").strip()
            elif line.startswith("```"):
                fence, start, body = line[3:].strip(), number, []
                found = MARKER.fullmatch(before.strip())
                marker = (found[1], found[2]) if found else None
            if line.strip():
                before = line
        elif line.startswith("```"):
            if fence in ("bash", "python"):
                text = "\n".join(body) + "\n"
                blocks.append(Block(heading, start, text, page, fence, marker))
            fence, before = None, ""
        else:
            body.append(line)
    return blocks


ALL_BLOCKS = [b for p in PAGES for b in code_blocks(p.read_text(), str(p.relative_to(ROOT)))]
# What runs: every bash block, and the python blocks that are neither excerpts nor fragments.
BLOCKS = [b for b in ALL_BLOCKS if b.language == "bash" or b.marker is None]
EXCERPTS = [b for b in ALL_BLOCKS if b.marker is not None and b.marker[0] == "excerpt"]
FRAGMENTS = [b for b in ALL_BLOCKS if b.marker is not None and b.marker[0] == "fragment"]


def test_every_python_block_runs_or_is_a_true_excerpt_or_one_of_few_fragments() -> None:
    assert len(FRAGMENTS) <= MAX_FRAGMENTS, [f"{b.page}:{b.line}" for b in FRAGMENTS]
    for block in FRAGMENTS:
        assert block.language == "python" and len(block.marker[1]) > 20, block  # says why
    for block in EXCERPTS:
        path = ROOT / block.marker[1]
        assert path.is_file(), f"{block.page}:{block.line}: no {block.marker[1]}"
        lines = iter(line.strip() for line in path.read_text().splitlines())
        for wanted in (line.strip() for line in block.text.splitlines() if line.strip()):
            assert wanted in lines, (
                f"{block.page}:{block.line}: {wanted!r} not (in order) in {path}"
            )


def test_a_marker_says_what_a_block_is() -> None:
    (run, excerpt, fragment) = code_blocks(
        "# T\n```python\nprint(1)\n```\n<!-- excerpt: a.py -->\n```python\nx = 1\n```\n"
        "<!-- fragment: needs a cluster -->\n\n```python\ny\n```\n```json\n{}\n```\n"
    )
    assert run.marker is None and run.language == "python" and run.text == "print(1)\n"
    assert excerpt.marker == ("excerpt", "a.py") and fragment.marker == (
        "fragment",
        "needs a cluster",
    )


def test_the_lists_name_blocks_that_exist() -> None:
    keys = [b.key for b in BLOCKS]
    assert len(set(keys)) == len(keys), "two blocks share a key: give one another first line"
    for listed in (SKIP, HEAVY, EXPECT, NETWORK):
        assert set(listed) <= set(keys), set(listed) - set(keys)
    assert not set(SKIP) & set(HEAVY)


# -- the environment a block runs in ---------------------------------------------------------


def overlay_venv(venv: Path) -> None:
    """A venv whose own site-packages hold this checkout (editable) and whose search path then
    holds the running environment's packages, so installing into it touches nothing shared."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True, timeout=60)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    own = venv / "lib" / version / "site-packages"
    (own / "_outer_env.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    python = venv / "bin" / "python"
    # pip comes from the outer environment; this script makes `.venv/bin/pip` use it here.
    pip = venv / "bin" / "pip"
    pip.write_text(
        f"#!{python}\nimport sys\nfrom pip._internal.cli.main import main\nsys.exit(main())\n"
    )
    pip.chmod(0o755)
    install = subprocess.run(
        [pip, "install", "--quiet", "--no-deps", "--no-build-isolation", "-e", ROOT],
        timeout=300,
        capture_output=True,
        text=True,
    )
    assert install.returncode == 0, f"installing the checkout into {venv}:\n{install.stderr}"


def tracked_entries() -> list[str]:
    """The repository's top-level entries as a fresh clone has them."""
    listed = subprocess.run(
        ["git", "-C", ROOT, "ls-files"], capture_output=True, text=True, timeout=60
    )
    if listed.returncode == 0:
        return sorted({line.split("/")[0] for line in listed.stdout.splitlines()})
    skip = (".git", ".venv", ".venv-verl", "out", ".mypy_cache", ".pytest_cache", ".ruff_cache")
    return sorted(e.name for e in ROOT.iterdir() if e.name not in skip and ".db" not in e.name)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repository's root as a fresh clone has it, with a .venv of its own. The package and
    the tests are linked; the rest is copied, so what a block writes (a pip install's metadata
    in examples/, results) stays here."""
    root = tmp_path_factory.mktemp("readme")
    for name in tracked_entries():
        source = ROOT / name
        if name in ("raas", "tests"):
            (root / name).symlink_to(source)
        elif source.is_dir():
            shutil.copytree(source, root / name, ignore=shutil.ignore_patterns("*.egg-info"))
        elif source.exists():
            shutil.copy2(source, root / name)
    overlay_venv(root / ".venv")
    return root


def _netns_works() -> bool:
    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("ip")):
        return False
    probe = subprocess.run(
        ["unshare", "--net", "ip", "link", "set", "lo", "up"], capture_output=True, timeout=30
    )
    return probe.returncode == 0


NETNS = _netns_works()


def _group_members(pgid: int) -> list[str]:
    """The live (not zombie) processes of a process group, as 'pid command'."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # gone meanwhile
        comm_end = text.rindex(")")
        state, _ppid, group = text[comm_end + 2 :].split()[:3]
        if int(group) == pgid and state != "Z":
            members.append(f"{stat.parent.name} {text[text.index('(') + 1 : comm_end]}")
    return members


def _stop_group(pgid: int) -> list[str]:
    """SIGTERM the group, SIGKILL what is left after the grace; what still lives after that."""
    for sig, grace in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return []
        deadline = time.monotonic() + grace
        while _group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)  # polling for a condition, with a deadline
        if not _group_members(pgid):
            return []
    return _group_members(pgid)


@dataclass
class Outcome:
    returncode: int | None  # None: killed at the deadline
    output: str
    survivors: list[str]


def run_block(block: Block, cwd: Path, deadline_s: float) -> Outcome:
    if block.language == "python":
        script = cwd / f"readme-block-{Path(block.page).stem}-{block.line}.py"
        command = [str(cwd / ".venv" / "bin" / "python"), str(script)]
    else:
        script = cwd / f"readme-block-{block.line}.sh"
        command = ["bash", "-e", "-o", "pipefail", str(script)]
    script.write_text(block.text)
    if NETNS and block.key not in NETWORK:
        # loopback of its own: the block's fixed ports are free, its servers unreachable
        command = [
            "unshare",
            "--net",
            "bash",
            "-c",
            'ip link set lo up && exec "$@"',
            "-",
            *command,
        ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAAS_")}
    env.pop("PYTHONPATH", None)  # the block's .venv has this checkout installed
    log_path = cwd / f"readme-block-{block.line}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            returncode: int | None = proc.wait(deadline_s)
        except subprocess.TimeoutExpired:
            returncode = None
        finally:
            survivors = _stop_group(proc.pid)
            proc.wait()
    return Outcome(returncode, log_path.read_text(errors="replace"), survivors)


# pip's complaint about each index directory of the machine's pip configuration that lacks a
# package (one line per package looked up): noise that pushed the real error out of the tail.
PIP_INDEX_NOISE = re.compile(
    r"^WARNING: Location '\S+' is ignored: it is neither a file nor a directory\.$"
)


def failure_tail(output: str, cwd: Path) -> str:
    """What a failing block's message shows: its output's last 6,000 characters without pip's
    index noise, and the free space where it ran (a full disk fails a block in any command)."""
    kept = "\n".join(line for line in output.splitlines() if not PIP_INDEX_NOISE.match(line))
    free = shutil.disk_usage(cwd).free
    return f"{kept[-6000:]}\n[{free / 2**30:.1f} GiB free in {cwd}]"


def _params() -> list[object]:
    params: list[object] = []
    for block in BLOCKS:
        marks: list[pytest.MarkDecorator] = []
        if block.key in SKIP:
            marks.append(pytest.mark.skip(reason=f"{block.page}:{block.line}: {SKIP[block.key]}"))
        elif block.key in HEAVY:
            marks.append(pytest.mark.readme)
        section = block.key.split(" :: ")[0]
        page = Path(block.page).stem
        params.append(pytest.param(block, marks=marks, id=f"{page}-L{block.line}-{section}"))
    return params


def test_a_failure_shows_the_error_under_pip_index_noise(tmp_path: Path) -> None:
    noise = "".join(
        f"WARNING: Location 'file:///opt/x/simple/p{i}/' is ignored: it is neither a file nor a"
        " directory.\n"
        for i in range(500)
    )
    tail = failure_tail(
        "Collecting a\n" + noise + "ERROR: No space left on device\n" + noise, tmp_path
    )
    assert "Collecting a" in tail and "ERROR: No space left on device" in tail
    assert "is ignored" not in tail
    assert re.search(r"\[\d+\.\d GiB free in ", tail)
    # a warning of another shape is the block's own output, kept
    assert "WARNING: other" in failure_tail("WARNING: other\n", tmp_path)


@pytest.mark.parametrize("block", _params())
def test_readme_block_runs_as_written(block: Block, workdir: Path) -> None:
    heavy = block.key in HEAVY
    outcome = run_block(block, workdir, HEAVY_DEADLINE_S if heavy else DEADLINE_S)
    where = f"{block.page}:{block.line} ({block.key})"
    tail = failure_tail(outcome.output, workdir)
    assert outcome.returncode is not None, f"{where} ran past its deadline; output:\n{tail}"
    assert outcome.returncode == 0, f"{where} exited {outcome.returncode}; output:\n{tail}"
    assert not outcome.survivors, f"{where} left processes after SIGKILL: {outcome.survivors}"
    flat = " ".join(outcome.output.split())
    for pattern in EXPECT.get(block.key, []):
        assert re.search(pattern, flat), f"{where}: no {pattern!r} in:\n{tail}"

"""Nothing of the server's is readable in a sandbox: not its environment, not another job's token.

The server's environment holds its API key and cloud credentials; a sandbox (bwrap itself, its
PID 1, the action server, the agent) starts from an empty one. A scanner run inside, through the
agent's shell and as a fresh process, reads every /proc/*/environ and /proc/*/cmdline it can,
the files of /proc/self, every file under / that raas or the sandbox made (not the host's
read-only system trees), and the Unix socket names of /proc/net/unix, looking for the secrets.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator

import pytest

from raas.sandbox import BwrapConfig, Sandbox, create_sandbox
from tests.sandbox.test_sandbox import LIMITS

# The scanner: the needles come hex-encoded (argv or stdin), so that its own command line and
# input hold none of them; it prints where each one was found.
SCAN = r"""
import json, os, stat, sys
args = sys.argv[1:] or sys.stdin.read().split()
needles = [bytes.fromhex(h) for h in args]
SYSTEM = {"proc", "sys", "usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"}
hits, seen = [], {"environ": 0, "cmdline": 0, "files": 0, "proc_self": 0}

def check(path, data):
    for i, needle in enumerate(needles):
        if needle in data:
            hits.append([path, i])

def read(path, limit=16 << 20):
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            return None
        with open(path, "rb") as f:
            return f.read(limit)
    except OSError:
        return None

for pid in os.listdir("/proc"):
    if pid.isdigit():
        for name in ("environ", "cmdline"):
            data = read("/proc/%s/%s" % (pid, name))
            if data is not None:
                seen[name] += 1
                check("/proc/%s/%s" % (pid, name), data)
for name in os.listdir("/proc/self"):
    if name not in ("mem", "pagemap", "clear_refs"):
        data = read("/proc/self/" + name)
        if data is not None:
            seen["proc_self"] += 1
            check("/proc/self/" + name, data)
for top in os.listdir("/"):
    if top in SYSTEM:
        continue
    for root, dirs, files in os.walk("/" + top):
        for name in files:
            data = read(os.path.join(root, name))
            if data is not None:
                seen["files"] += 1
                check(os.path.join(root, name), data)
data = read("/proc/net/unix")
if data is not None:
    check("/proc/net/unix", data)
print(json.dumps({"hits": hits, "seen": seen}))
"""


@pytest.fixture
def host_secrets(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Fake credentials in the host process's environment (what bwrap would inherit)."""
    fake = {
        "RAAS_API_KEY": f"raas-key-{secrets.token_hex(16)}",
        "AWS_SECRET_ACCESS_KEY": f"aws-secret-{secrets.token_hex(16)}",
    }
    for name, value in fake.items():
        monkeypatch.setenv(name, value)
    return fake


@pytest.fixture
async def two_sandboxes(host_secrets: dict[str, str]) -> AsyncIterator[tuple[Sandbox, Sandbox]]:
    first, second = (
        create_sandbox(BwrapConfig(limits=LIMITS)),
        create_sandbox(BwrapConfig(limits=LIMITS)),
    )
    try:
        await first.start()
        await second.start()
        yield first, second
    finally:
        await first.close()
        await second.close()


async def answer(
    method: str, path: str, headers: dict[str, str], body: bytes
) -> tuple[int, dict[str, str], bytes]:
    return 200, {"content-type": "application/json"}, b"{}"


async def give_job_token(sandbox: Sandbox, token: str) -> None:
    """What a harness job does: the relay admits the token, the agent runs with it."""
    port = await sandbox.expose(answer, token=token)
    env = f"OPENAI_API_KEY={token} OPENAI_BASE_URL=http://127.0.0.1:{port}/v1"
    result = await sandbox.bash(f"(export {env}; exec sleep 300) >/dev/null 2>&1 &")
    assert result.exit_code == 0, result.output


async def scan(sandbox: Sandbox, needles: list[str]) -> list[dict[str, object]]:
    """The scanner's report, run once in the agent's shell and once as a fresh process."""
    await sandbox.write_file("/tmp/scan.py", SCAN)
    hexed = [n.encode().hex() for n in needles]
    shell = await sandbox.bash("python3 /tmp/scan.py " + " ".join(hexed), timeout_s=60)
    assert shell.exit_code == 0, shell.output
    fresh = await sandbox.exec(["python3", "/tmp/scan.py"], stdin=" ".join(hexed), timeout_s=60)
    assert fresh.exit_code == 0, fresh.stderr
    return [json.loads(shell.output.strip().splitlines()[-1]), json.loads(fresh.stdout)]


async def test_no_sandbox_can_read_the_servers_environment_or_another_jobs_token(
    two_sandboxes: tuple[Sandbox, Sandbox], host_secrets: dict[str, str]
) -> None:
    first, second = two_sandboxes
    token_a, token_b = f"raas-{secrets.token_urlsafe(32)}", f"raas-{secrets.token_urlsafe(32)}"
    await give_job_token(first, token_a)
    await give_job_token(second, token_b)
    server = list(host_secrets.values())
    for sandbox, own, other in ((first, token_a, token_b), (second, token_b, token_a)):
        for report in await scan(sandbox, [*server, other, own]):
            seen = report["seen"]
            assert isinstance(seen, dict)
            # The scan reads what it should: its processes' environments and cmdlines, files.
            assert seen["environ"] >= 3 and seen["cmdline"] >= 3 and seen["files"] >= 5, seen
            found = {int(i) for _, i in report["hits"]}  # type: ignore[attr-defined]
            # It finds what the sandbox was given (its own job's token, in the agent's
            # environment), and nothing that is not its own.
            assert 3 in found, report
            leaks = [hit for hit in report["hits"] if hit[1] != 3]  # type: ignore[attr-defined]
            assert leaks == [], f"secrets readable in sandbox {sandbox.id}: {leaks}"

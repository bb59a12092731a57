"""Qwen Code (npm's ``@qwen-code/qwen-code``) as a harness task's agent program.

The harness task binds the service's node environment (``make agents-node``) and the host's
node read-only into the sandbox (see raas.tasks.harness_node) and runs this file with the job's
``OPENAI_BASE_URL`` and ``OPENAI_API_KEY``, ``$RAAS_NODE`` and ``$RAAS_NODE_MODULES``. It runs
Qwen Code's own command line, unmodified, headless: the task on its standard input (one-shot,
as ``echo task | qwen`` does), every tool approved (``--approval-mode yolo``), at most
``$RAAS_MAX_TURNS`` turns (``--max-session-turns``), on its OpenAI provider pointed at the
gateway (``OPENAI_*`` and ``security.auth.selectedType`` in its settings). Its settings and
what it records live in a home of this run's, with update checks, usage statistics and
telemetry off: the sandbox has no network, and nothing should try. The task is the job's user
messages (in ``$RAAS_MESSAGES_FILE``); Qwen Code's last answer (what it prints) goes to
``$RAAS_ANSWER_FILE``. Arguments are passed on to ``qwen`` (``--exclude-tools web_fetch``...).
Standard library only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any

PACKAGE = "@qwen-code/qwen-code"
SETTINGS: dict[str, Any] = {
    "security": {"auth": {"selectedType": "openai"}},
    "general": {"enableAutoUpdate": False},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
}


def qwen_command(extra: list[str]) -> list[str]:
    cli = os.path.join(os.environ["RAAS_NODE_MODULES"], PACKAGE, "cli.js")
    turns = os.environ.get("RAAS_MAX_TURNS", "0")
    limit = ["--max-session-turns", turns] if int(turns) > 0 else []
    # V8 reserves 10 GiB of address space for each WebAssembly memory when bounds are checked
    # by its trap handler; the sandbox allows a process 4 GiB (RLIMIT_AS), and node's fetch
    # parses HTTP in WebAssembly (undici's llhttp): without this every model call fails with
    # "Cannot allocate Wasm memory". Qwen Code's relaunch of itself keeps node's options.
    node = [os.environ["RAAS_NODE"], "--disable-wasm-trap-handler", "--wasm-max-mem-pages=4096"]
    return [*node, cli, "--approval-mode", "yolo", *limit, *extra]


def main(argv: list[str] | None = None) -> int:
    extra = sys.argv[1:] if argv is None else argv
    with open(os.environ["RAAS_MESSAGES_FILE"], encoding="utf-8") as f:
        messages: list[dict[str, Any]] = json.load(f)
    # The problem itself: raas's system prompts describe raas's own tools, not Qwen Code's.
    task = "\n\n".join(str(m.get("content") or "") for m in messages if m.get("role") == "user")
    home = tempfile.mkdtemp(prefix="qwen-code-")
    model = os.environ.get("RAAS_MODEL", "policy")
    os.makedirs(os.path.join(home, ".qwen"))
    with open(os.path.join(home, ".qwen", "settings.json"), "w", encoding="utf-8") as f:
        json.dump({**SETTINGS, "model": {"name": model}}, f)
    env = dict(
        os.environ,
        HOME=home,  # its settings, sessions and logs: this run's alone
        OPENAI_MODEL=model,
        NO_BROWSER="1",
        # It would start itself again with a heap of half the host's memory, more than the
        # sandbox lets a process address (std::bad_alloc): node's own default heap is enough.
        QWEN_CODE_NO_RELAUNCH="1",
    )
    done = subprocess.run(
        qwen_command(extra),
        env=env,
        input=task,  # not an argument: one that starts with "-" would be read as an option
        stdout=subprocess.PIPE,
        text=True,
        check=False,
    )
    print(done.stdout, end="", flush=True)
    print(f"qwen-code: exit {done.returncode}", flush=True)
    answer_file = os.environ.get("RAAS_ANSWER_FILE")
    if answer_file and done.stdout.strip():
        with open(answer_file, "w", encoding="utf-8") as f:
            f.write(done.stdout.strip())
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())

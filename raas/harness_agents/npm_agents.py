"""Coding-agent CLIs from npm as a harness task's agent program: ``npm_agents.py AGENT [ARGS]``.

The harness task binds the service's node environment (``make agents-node``) and the host's node
read-only into the sandbox (see raas.tasks.harness_node) and runs this file with the job's
``OPENAI_BASE_URL`` and ``OPENAI_API_KEY``, ``$RAAS_NODE`` and ``$RAAS_NODE_MODULES``. It runs
the agent's own command line, unmodified and headless: the task on its standard input (as ``echo
TASK | qwen``, ``echo TASK | pi -p`` and ``echo TASK | opencode run`` run it), every tool
allowed, on an OpenAI chat-completions provider pointed at the gateway, configured the agent's
own way in a home of this run's (settings, sessions and logs stay there), with update checks,
usage statistics and telemetry off: the sandbox has no network, and nothing should try.

- ``qwen-code`` (``@qwen-code/qwen-code``): ``--approval-mode yolo``, at most
  ``$RAAS_MAX_TURNS`` turns (``--max-session-turns``), its OpenAI provider
  (``OPENAI_*``, ``security.auth.selectedType`` in ``~/.qwen/settings.json``).
- ``pi`` (``@mariozechner/pi-coding-agent``): print mode (``-p``), no session file, a provider
  ``raas`` of API ``openai-completions`` in ``~/.pi/agent/models.json``; Pi has no limit of
  turns of its own (``agent_timeout_s`` bounds it).
- ``opencode`` (``opencode-ai``: a Bun program, not node's, in the package of this platform,
  ``opencode-linux-x64``): ``opencode run --auto`` with a title of its own (else it asks the
  model for one, a call outside the conversation), no external plugins (``--pure``), a provider
  ``raas`` of ``@ai-sdk/openai-compatible`` (bundled in it) in its ``opencode.json``; no limit
  of turns either.

The task is the job's user messages (in ``$RAAS_MESSAGES_FILE``); what the agent prints (its
last answer) goes to ``$RAAS_ANSWER_FILE``. Further arguments are passed on to the agent's CLI.
Standard library only.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any

# V8 reserves address space for each WebAssembly memory up to its maximum (10 GiB when its trap
# handler checks bounds); the sandbox allows a process 4 GiB (RLIMIT_AS), and node's fetch
# parses HTTP in WebAssembly (undici's llhttp): without these every model call fails with
# "Cannot allocate Wasm memory". 4096 pages: 256 MiB for each, ample for a parser.
NODE_OPTIONS = ["--disable-wasm-trap-handler", "--wasm-max-mem-pages=4096"]


def _write_json(path: str, value: dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f)


def _node(script: str) -> list[str]:
    """Node's command line for ``script`` (a path below node_modules)."""
    path = os.path.join(os.environ["RAAS_NODE_MODULES"], script)
    return [os.environ["RAAS_NODE"], *NODE_OPTIONS, path]


def qwen_code(home: str, model: str) -> tuple[list[str], dict[str, str]]:
    settings = {
        "security": {"auth": {"selectedType": "openai"}},
        "model": {"name": model},
        "general": {"enableAutoUpdate": False},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
    }
    _write_json(os.path.join(home, ".qwen", "settings.json"), settings)
    turns = os.environ.get("RAAS_MAX_TURNS", "0")
    limit = ["--max-session-turns", turns] if int(turns) > 0 else []
    env = {
        "OPENAI_MODEL": model,
        "NO_BROWSER": "1",
        # It would start itself again with a heap of half the host's memory, more than the
        # sandbox lets a process address (std::bad_alloc): node's own default heap is enough.
        "QWEN_CODE_NO_RELAUNCH": "1",
    }
    return [*_node("@qwen-code/qwen-code/cli.js"), "--approval-mode", "yolo", *limit], env


def pi(home: str, model: str) -> tuple[list[str], dict[str, str]]:
    agent_dir = os.path.join(home, ".pi", "agent")
    provider = {
        "baseUrl": os.environ["OPENAI_BASE_URL"],
        "api": "openai-completions",
        "apiKey": "OPENAI_API_KEY",  # the name of the variable that holds it
        # The system prompt as a system message; no reasoning_effort: a plain chat model.
        "compat": {"supportsDeveloperRole": False, "supportsReasoningEffort": False},
        "models": [{"id": model}],
    }
    _write_json(os.path.join(agent_dir, "models.json"), {"providers": {"raas": provider}})
    _write_json(os.path.join(agent_dir, "settings.json"), {"enableInstallTelemetry": False})
    env = {
        "PI_CODING_AGENT_DIR": agent_dir,
        "PI_OFFLINE": "1",  # no update checks, no install ping, no package checks
        "PI_SKIP_VERSION_CHECK": "1",
        "PI_TELEMETRY": "0",
    }
    cli = [*_node("@mariozechner/pi-coding-agent/dist/cli.js"), "-p", "--no-session"]
    return [*cli, "--provider", "raas", "--model", model], env


def opencode(home: str, model: str) -> tuple[list[str], dict[str, str]]:
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "raas": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "raas",
                "options": {
                    "baseURL": os.environ["OPENAI_BASE_URL"],
                    "apiKey": "{env:OPENAI_API_KEY}",
                },
                "models": {model: {"name": model}},
            }
        },
        "model": f"raas/{model}",
        "autoupdate": False,
        "share": "disabled",
        "permission": {"edit": "allow", "bash": "allow", "webfetch": "deny"},
    }
    path = os.path.join(home, "opencode.json")
    _write_json(path, config)
    env = {
        "OPENCODE_CONFIG": path,
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",  # models.dev's catalogue
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
        "OPENCODE_DISABLE_SHARE": "1",
        **{f"XDG_{kind}_HOME": os.path.join(home, kind.lower()) for kind in XDG},
    }
    arch = {"x86_64": "x64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    binary = os.path.join(os.environ["RAAS_NODE_MODULES"], f"opencode-linux-{arch}/bin/opencode")
    return [binary, "run", "--auto", "--pure", "--title", "raas"], env


XDG = ("CONFIG", "DATA", "CACHE", "STATE")
AGENTS: dict[str, Callable[[str, str], tuple[list[str], dict[str, str]]]] = {
    "qwen-code": qwen_code,
    "pi": pi,
    "opencode": opencode,
}


def main(argv: list[str] | None = None) -> int:
    agent, *extra = sys.argv[1:] if argv is None else argv
    with open(os.environ["RAAS_MESSAGES_FILE"], encoding="utf-8") as f:
        messages: list[dict[str, Any]] = json.load(f)
    # The problem itself: raas's system prompts describe raas's own tools, not the agent's.
    task = "\n\n".join(str(m.get("content") or "") for m in messages if m.get("role") == "user")
    home = tempfile.mkdtemp(prefix=f"{agent}-")
    cli, env = AGENTS[agent](home, os.environ.get("RAAS_MODEL", "policy"))
    done = subprocess.run(
        [*cli, *extra],
        env={**os.environ, "HOME": home, **env},
        input=task,  # not an argument: one that starts with "-" would be read as an option
        stdout=subprocess.PIPE,
        text=True,
        check=False,
    )
    print(done.stdout, end="", flush=True)
    print(f"{agent}: exit {done.returncode}", flush=True)
    answer_file = os.environ.get("RAAS_ANSWER_FILE")
    if answer_file and done.stdout.strip():
        with open(answer_file, "w", encoding="utf-8") as f:
            f.write(done.stdout.strip())
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())

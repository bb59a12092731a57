"""Coding-agent CLIs from npm as a harness task's agent program: ``npm_agents.py AGENT [ARGS]``.

The harness task binds the service's node environment (``make agents-node``) and the host's node
read-only into the sandbox (see raas.tasks.harness_node) and runs this file with the job's
``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` (``ANTHROPIC_*`` and ``GOOGLE_GEMINI_BASE_URL``,
``GEMINI_API_KEY`` the same gateway and token), ``$RAAS_NODE`` and ``$RAAS_NODE_MODULES``. It runs
the agent's own command line, unmodified and headless: the task on its standard input (as ``echo
TASK | qwen``, ``echo TASK | pi -p``, ``echo TASK | opencode run``, ``echo TASK | claude -p``,
``echo TASK | gemini`` and ``echo TASK | codex exec -`` run it), every tool allowed, on the
gateway through the API the agent speaks (OpenAI's chat completions, Anthropic's Messages,
Gemini's, OpenAI's Responses), configured the agent's own way in a home of this run's (settings,
sessions and logs stay there), with update checks, usage statistics and telemetry off: the
sandbox has no network, and nothing should try.

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
- ``claude-code`` (``@anthropic-ai/claude-code``: a Bun program in
  ``@anthropic-ai/claude-code-linux-x64``, run as it is, its package's postinstall not needed):
  ``claude -p --dangerously-skip-permissions`` (``IS_SANDBOX=1``: it runs as root here), at most
  ``$RAAS_MAX_TURNS`` turns (``--max-turns``), on Anthropic's Messages API (``ANTHROPIC_*``),
  every model it names the job's, ``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC`` and the rest.
- ``gemini`` (``@google/gemini-cli``): ``--yolo`` with the task on its standard input (its
  non-interactive mode), on Gemini's API (``GOOGLE_GEMINI_BASE_URL``, ``GEMINI_API_KEY``:
  ``security.auth.selectedType`` ``gemini-api-key`` in ``~/.gemini/settings.json``, else it
  takes the base URL alone for a "gateway" auth that ``-p`` refuses), the workspace trusted, no
  relaunch, at most ``$RAAS_MAX_TURNS`` turns (``model.maxSessionTurns``).
- ``codex`` (``@openai/codex``: a Rust program in ``@openai/codex-linux-x64``): ``codex exec
  -`` without Codex's own sandbox or approvals (raas's sandbox is the boundary), a provider
  ``raas`` of ``wire_api = "responses"`` in ``$CODEX_HOME/config.toml``, update checks,
  analytics, feedback and OpenTelemetry off; no limit of turns either.

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
    binary = _binary("opencode-linux-{arch}/bin/opencode")
    return [binary, "run", "--auto", "--pure", "--title", "raas"], env


def claude_code(home: str, model: str) -> tuple[list[str], dict[str, str]]:
    env = {
        "CLAUDE_CONFIG_DIR": os.path.join(home, ".claude"),
        # Every model it names (the main one, the small one it sends side tasks to) is the job's.
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
        "ANTHROPIC_SMALL_FAST_MODEL": model,
        # No auto-update, telemetry, error reports, feature flags or other calls of its own.
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_NON_ESSENTIAL_MODEL_CALLS": "1",
        # --dangerously-skip-permissions refuses root unless it is told it is in a sandbox.
        "IS_SANDBOX": "1",
    }
    turns = os.environ.get("RAAS_MAX_TURNS", "0")
    limit = ["--max-turns", turns] if int(turns) > 0 else []
    cli = [_binary("@anthropic-ai/claude-code-linux-{arch}/claude"), "-p"]
    return [*cli, "--dangerously-skip-permissions", "--model", model, *limit], env


def gemini(home: str, model: str) -> tuple[list[str], dict[str, str]]:
    turns = int(os.environ.get("RAAS_MAX_TURNS", "0"))
    settings = {
        # Else GOOGLE_GEMINI_BASE_URL alone reads as its "gateway" auth, which -p refuses; the
        # base URL still comes from the variable.
        "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
        "model": {"name": model, "maxSessionTurns": turns if turns > 0 else -1},
        "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
    }
    _write_json(os.path.join(home, ".gemini", "settings.json"), settings)
    env = {
        "GEMINI_MODEL": model,
        "NO_BROWSER": "1",
        "GEMINI_CLI_TRUST_WORKSPACE": "true",
        # As Qwen Code (its fork): no second start with a heap the sandbox cannot address.
        "GEMINI_CLI_NO_RELAUNCH": "true",
    }
    return [*_node("@google/gemini-cli/bundle/gemini.js"), "--yolo", "--model", model], env


def codex(home: str, model: str) -> tuple[list[str], dict[str, str]]:
    codex_home = os.path.join(home, ".codex")
    os.makedirs(codex_home, exist_ok=True)
    base_url = json.dumps(os.environ["OPENAI_BASE_URL"])  # a TOML basic string is JSON's
    config = f"""model = {json.dumps(model)}
model_provider = "raas"
check_for_update_on_startup = false

[model_providers.raas]
name = "raas"
base_url = {base_url}
env_key = "OPENAI_API_KEY"
wire_api = "responses"

[features]
plugins = false  # else it syncs OpenAI's curated plugins from GitHub at start

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"
log_user_prompt = false
"""
    with open(os.path.join(codex_home, "config.toml"), "w", encoding="utf-8") as f:
        f.write(config)
    env = {"CODEX_HOME": codex_home}
    binary = _binary("@openai/codex-linux-{arch}/vendor/{triple}/bin/codex")
    # raas's sandbox is the boundary: none of Codex's own (it would need namespaces of its own).
    flags = ["--dangerously-bypass-approvals-and-sandbox", "--skip-git-repo-check"]
    return [binary, "exec", *flags, "-"], env


def _binary(template: str) -> str:
    """The path of a platform package's program below node_modules (``{arch}``: x64 or arm64,
    ``{triple}``: Rust's target, musl's)."""
    machine = platform.machine()
    arch = {"x86_64": "x64", "aarch64": "arm64"}.get(machine, machine)
    triple = f"{machine}-unknown-linux-musl"
    return os.path.join(os.environ["RAAS_NODE_MODULES"], template.format(arch=arch, triple=triple))


XDG = ("CONFIG", "DATA", "CACHE", "STATE")
AGENTS: dict[str, Callable[[str, str], tuple[list[str], dict[str, str]]]] = {
    "qwen-code": qwen_code,
    "pi": pi,
    "opencode": opencode,
    "claude-code": claude_code,
    "gemini": gemini,
    "codex": codex,
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

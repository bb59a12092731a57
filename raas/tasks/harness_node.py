"""Coding-agent CLIs from npm as harness agents: the node environment and the node they run on.

``make agents-node`` builds the environment (``.agents-node``: the packages pinned by
``raas/harness_agents/npm/package-lock.json``); ``raas serve --agents-node DIR``
(``RAAS_AGENTS_NODE``) names it. A harness job of such an agent gets that environment's
``node_modules`` and the host's ``node`` (the first on raas's PATH) bound read-only into its
sandbox, at ``NODE_MODULES_INSIDE`` and ``NODE_INSIDE``; the launcher (``raas/harness_agents``)
finds them through ``$RAAS_NODE_MODULES`` and ``$RAAS_NODE``. The node binary is the host's, so
it needs the host's C and C++ runtime: the host's /usr under bwrap has it; an image root must
carry a glibc and libstdc++ as new as the host's.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from raas.sandbox import SandboxError

# Agent name → the npm package that holds its CLI (in raas/harness_agents/npm/package.json).
NODE_AGENTS: dict[str, str] = {
    "qwen-code": "@qwen-code/qwen-code",
    "pi": "@mariozechner/pi-coding-agent",
    "opencode": "opencode-ai",  # a Bun program in opencode-linux-<arch>; node is bound all the same
    "claude-code": "@anthropic-ai/claude-code",  # a Bun program in claude-code-linux-<arch>
    "gemini": "@google/gemini-cli",
    "codex": "@openai/codex",  # a Rust program in codex-linux-<arch>
}
# Those whose CLI is a program of its own, not node's: their package's engines.node (Claude
# Code's says 22) is its installer's, not theirs.
NATIVE_AGENTS = frozenset({"opencode", "claude-code", "codex"})
NODE_MODULES_INSIDE = "/.raas/agent-node/node_modules"
NODE_INSIDE = "/.raas/node/bin/node"
NODE_VERSION_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class NodeEnvironment:
    modules: Path  # the environment's node_modules
    node: Path  # the host's node binary, links resolved

    def binds(self) -> dict[str, str]:
        """``{host path: sandbox path}`` of both, for ``staged_binds``."""
        return {str(self.modules): NODE_MODULES_INSIDE, str(self.node): NODE_INSIDE}

    def variables(self, bound: bool) -> dict[str, str]:
        """What the launcher reads: where node and node_modules are for the agent (bound in,
        else, with the local provider, where they are on the host)."""
        if bound:
            return {"RAAS_NODE": NODE_INSIDE, "RAAS_NODE_MODULES": NODE_MODULES_INSIDE}
        return {"RAAS_NODE": str(self.node), "RAAS_NODE_MODULES": str(self.modules)}


def node_environment(agents_node: Path | None, agent: str) -> NodeEnvironment:
    """The service's node environment, checked to hold ``agent``'s package, and a node that
    package runs on. Blocking (it runs ``node --version``): call it off the loop."""
    package = NODE_AGENTS[agent]
    if agents_node is None:
        raise SandboxError(
            f"the {agent} agent needs a node environment: start raas serve with --agents-node"
            " DIR (raas run --agents-node DIR, RAAS_AGENTS_NODE), a directory whose node_modules"
            f" holds {package} (`make agents-node` builds .agents-node)"
        )
    modules = Path(agents_node).resolve() / "node_modules"
    manifest = modules / package / "package.json"
    if not manifest.is_file():
        raise SandboxError(
            f"agents_node {agents_node} has no {package} in its node_modules"
            " (`make agents-node` builds .agents-node)"
        )
    found = shutil.which("node")
    if found is None:
        raise SandboxError(
            f"the {agent} agent runs on the host's node, and there is no `node` on raas's PATH"
        )
    node = Path(found).resolve()
    if agent not in NATIVE_AGENTS:
        _check_engine(node, json.loads(manifest.read_text(encoding="utf-8")), package)
    return NodeEnvironment(modules, node)


def _check_engine(node: Path, manifest: dict[str, object], package: str) -> None:
    """The package's ``engines.node`` (a ``>=N...`` bound) against ``node --version``: a node
    too old fails here, naming both, rather than as a syntax error in the sandbox."""
    engines = manifest.get("engines")
    wanted = engines.get("node") if isinstance(engines, dict) else None
    bound = re.fullmatch(r">=\s*(\d+)(?:\.\d+)*", str(wanted or "").strip())
    if bound is None:
        return
    done = subprocess.run(
        [str(node), "--version"],
        capture_output=True,
        text=True,
        timeout=NODE_VERSION_TIMEOUT_S,
        check=False,
    )
    have = re.match(r"v(\d+)", done.stdout.strip())
    if have is None or int(have.group(1)) < int(bound.group(1)):
        raise SandboxError(
            f"{package} needs node {wanted}; {node} is {done.stdout.strip() or 'not runnable'}"
        )

"""The trainer-side package installs and imports alone: no server code, no web framework, no
model stack. One list says what it may load."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# What `raas.client` may load of raas: itself, the wire types and the shared helpers.
ALLOWED_RAAS = ("raas", "raas.client", "raas.wire", "raas.helpers", "raas.images.refs")
# The metrics logger imports tensorboard and wandb only when asked to write to them.
FORBIDDEN = ("fastapi", "starlette", "uvicorn", "torch", "transformers", "tensorboard", "wandb")

CHECK = """
import importlib, json, sys
importlib.import_module(sys.argv[1])
allowed, forbidden = json.loads(sys.argv[2]), json.loads(sys.argv[3])
bad = sorted(
    m for m in sys.modules
    if (m.split(".")[0] == "raas" and not any(m == a or m.startswith(a + ".") for a in allowed))
    or m.split(".")[0] in forbidden
)
print(json.dumps(bad))
"""


@pytest.mark.parametrize(
    "module",
    [
        "raas.client",
        "raas.client.batch",
        "raas.client.metrics",
        "raas.client.task_files",
        "raas.client.integrations.trl",
        "raas.client.integrations.verl_bridge",
    ],
)
def test_client_loads_no_server_code(module: str) -> None:
    run = subprocess.run(
        [sys.executable, "-c", CHECK, module, json.dumps(ALLOWED_RAAS), json.dumps(FORBIDDEN)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(run.stdout) == []

"""skopeo, which moves images between registries, archives and OCI layouts, verifying digests.

Every copy lands in a fresh OCI layout whose blobs go to the store's shared blob directory
(``--dest-shared-blob-dir``), where skopeo reuses the blobs it finds instead of fetching them
again; the store reads the manifest's digest from that layout's index.json.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

INSTALL = "apt-get install skopeo"


class SkopeoError(Exception):
    """skopeo failed; the message is its own error, on one line."""


def copy(
    src: str,
    layout: Path,
    blob_dir: Path,
    *,
    tls_verify: bool = True,
    authfile: Path | None = None,
    timeout_s: float = 3600.0,
) -> None:
    """``skopeo copy SRC oci:LAYOUT:latest``, blobs in ``blob_dir``; auth as skopeo does it
    (``authfile``, else $REGISTRY_AUTH_FILE, else the containers auth.json)."""
    binary = shutil.which("skopeo")
    if binary is None:
        raise SkopeoError(f"skopeo is not installed ({INSTALL})")
    argv = [binary, "--command-timeout", f"{int(timeout_s)}s", "copy", "--quiet"]
    if src.startswith("docker://"):
        argv.append(f"--src-tls-verify={'true' if tls_verify else 'false'}")
        if authfile is not None:
            argv += ["--src-authfile", str(authfile)]
    argv += ["--dest-shared-blob-dir", str(blob_dir), src, f"oci:{layout}:latest"]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s + 30)
    except subprocess.TimeoutExpired as e:
        raise SkopeoError(f"skopeo took more than {timeout_s:.0f} s") from e
    if proc.returncode != 0:
        raise SkopeoError(error_line(proc.stderr) or f"skopeo exited with {proc.returncode}")


_MSG = re.compile(r'level=(?:fatal|error) msg="((?:[^"\\]|\\.)*)"')


def error_line(stderr: str) -> str:
    """The cause from skopeo's log lines (``level=fatal msg="..."``), else its last line."""
    found = _MSG.findall(stderr)
    if found:
        return str(found[-1]).replace('\\"', '"').replace("\\\\", "\\")
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return lines[-1] if lines else ""

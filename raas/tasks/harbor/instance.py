"""A Harbor task as the ``harbor`` task takes it: the task directory's files, inline.

``files`` maps each path in the task directory (``task.toml``, ``instruction.md``,
``environment/...``, ``tests/...``, ``solution/...``) to its UTF-8 text, ``binary_files`` to
base64 for what is not text, ``executable`` lists the paths with an executable bit
(``raas.helpers.task_dirs`` reads a directory into this). ``reward_key`` picks the scalar reward
from a ``reward.json`` (default ``reward``). A submission may instead give ``path``, a task
directory beneath the server's Harbor roots, which the server reads into ``files`` at
submission (``raas.tasks.harbor.task.HarborTask.prepare``): the job then keeps both, ``path``
saying where its files were read. Checked at submission: the paths (relative, inside
the task, none twice), the sizes, ``task.toml`` read strictly (``raas.tasks.harbor.config``),
an environment (a Dockerfile or a ``docker_image``), and what raas cannot run refused in one
line naming the task: docker-compose services. Whether the network a task asks for is allowed
depends on the server's settings: ``HarborTask.validate`` checks it (raas.tasks.harbor.network).
"""

from __future__ import annotations

import base64
import binascii
import functools
import os
import posixpath
import re
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

from pydantic import (
    ConfigDict,
    Field,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from raas.helpers.task_dirs import MAX_TASK_BYTES, MAX_TASK_FILES, TASK_FILE
from raas.tasks.harbor.config import HarborConfig
from raas.tasks.protocol import TaskInstance, located_error

INSTRUCTION = "instruction.md"
TEST_SCRIPT = "tests/test.sh"
SOLVE_SCRIPT = "solution/solve.sh"
DOCKERFILE = "environment/Dockerfile"
SOLVE_FILE = "/tmp/solve.sh"  # where a gold policy writes solve.sh in the agent's sandbox
TOP_LEVEL = ("environment", "tests", "solution")
NAME_MAX = 255  # bytes of one file name (Linux's file systems)
COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")


def _clean_path(path: str) -> str | None:
    """``path`` if it is a plain relative path inside the task, else None."""
    if not path or path.startswith("/") or "\\" in path or "\0" in path:
        return None
    if posixpath.normpath(path) != path or path.split("/")[0] in ("", ".", ".."):
        return None
    return path


def _dirs_above(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


# A path the document admits: a top-level file, or one below environment/, tests/ or solution/
# whose every name is neither "." nor ".." (JSON Schema's regex has no lookahead), of at most
# NAME_MAX ASCII characters with no "/", "\\" or NUL.
_NAME = r"(?:[^/\\\x00.][^/\\\x00]{0,254}|\.[^/\\\x00.][^/\\\x00]{0,253}|\.\.[^/\\\x00]{1,253})"
PATH_PATTERN = rf"^(?:task\.toml|instruction\.md|(?:environment|tests|solution)(?:/{_NAME})+)$"
BASE64_PATTERN = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
# The task.toml texts the document admits: only comments, blank lines, a schema version and a
# [metadata] table of plain values. The server reads every task.toml Harbor defines (strictly:
# raas.tasks.harbor.config); JSON Schema cannot say which TOML texts those are, so the document
# says less than the server takes, never more.
_PLAIN = r"[^\x00-\x08\x0a-\x1f\x7f"
_BLANK = rf"[ \t]*(?:#{_PLAIN}]*)?"  # a blank line or a comment (TOML takes no control character)
_VALUE = rf'(?:"{_PLAIN}"\\]*"|-?(?:0|[1-9][0-9]{{0,8}})|true|false)'
_PAIR = rf"[a-z_]{{1,30}}[ \t]*=[ \t]*{_VALUE}[ \t]*"  # one, so never a key twice
TASK_TOML_PATTERN = (
    rf'^(?:(?:schema_version|version)[ \t]*=[ \t]*"1\.[01]"\n)?(?:{_BLANK}\n)*'
    rf"(?:\[metadata\]\n(?:{_BLANK}\n)*(?:{_PAIR}\n)?(?:{_BLANK}\n)*)?$"
)


NOT_READ = (
    "a task directory named by path is read by the server at submission, and this instance was"
    " not read (only a server started with --harbor-roots reads one)"
)
NO_PATH_HERE = (
    "Not taken by this server, which reads no task directories: a server started with"
    " --harbor-roots DIR takes a task directory's absolute path beneath DIR instead of files"
    " (docs/harbor.md)."
)
PATH_MAX = 4096  # bytes of a path (Linux's PATH_MAX)
FILES_OR_PATH = ("files", "binary_files", "executable")


def _a_task_in_the_document(schema: dict[str, Any]) -> None:
    """What submission checks, as far as JSON Schema can say it: the paths, the files a task
    needs (a Dockerfile, or task.toml's docker_image, which the admitted task.toml cannot
    name), base64, and the task.toml texts above. The files come inline: a server that reads
    task directories documents the path form too (``document_path_form``)."""
    schema["required"] = ["files"]
    schema["properties"]["path"] = {"not": {}, "description": NO_PATH_HERE}
    files = schema["properties"]["files"]
    files["propertyNames"] = {"pattern": PATH_PATTERN}
    files["maxProperties"] = MAX_TASK_FILES
    files["required"] = [TASK_FILE, INSTRUCTION, TEST_SCRIPT, DOCKERFILE]
    files["properties"] = {
        TASK_FILE: {
            "type": "string",
            "pattern": TASK_TOML_PATTERN,
            "description": "task.toml's text; the document admits a plain subset, the server"
            " reads every key Harbor defines (docs/harbor.md)",
        }
    }
    binary = schema["properties"]["binary_files"]
    binary["propertyNames"] = {"pattern": PATH_PATTERN, "not": {"enum": [TASK_FILE, INSTRUCTION]}}
    binary["additionalProperties"] = {"type": "string", "pattern": BASE64_PATTERN}
    schema["properties"]["executable"]["items"] = {"type": "string", "pattern": PATH_PATTERN}


def _escaped(text: str) -> str:
    """``text`` matched literally by a pattern (ECMA-262's and Python's alike)."""
    return re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\1", text)


def document_path_form(schema: dict[str, Any], roots: Sequence[Path]) -> None:
    """The path form in ``schema`` (an instance's, ``_a_task_in_the_document``'s) of a server
    whose Harbor roots are ``roots``: ``path`` instead of the files, an absolute path beneath a
    root as text (either spelling of it: as given, or where its links lead). That it names a
    task directory there is the server's to find: any other path is a 422."""
    spellings = sorted({os.path.abspath(r) for r in roots} | {os.path.realpath(r) for r in roots})
    alternatives = "|".join(_escaped(s.rstrip("/")) for s in spellings)
    schema["properties"]["path"] = {
        "type": "string",
        "maxLength": PATH_MAX,
        "pattern": rf"^(?:{alternatives})(?:/{_NAME})*/?$",
        "description": "Instead of files: the absolute path of a task directory beneath one of"
        f" this server's Harbor roots ({', '.join(spellings)}), read at submission into the"
        " job's files (which the job keeps: a later change to the directory changes no job)."
        " A path that names no task directory there (once every link is followed) is a 422"
        " naming instance.path, in one text whatever the reason.",
    }
    schema.pop("required", None)
    schema["oneOf"] = [
        {"required": ["files"], "not": {"required": ["path"]}},
        {
            "required": ["path"],
            "not": {"anyOf": [{"required": [key]} for key in FILES_OR_PATH]},
        },
    ]


class HarborInstance(TaskInstance):
    model_config = ConfigDict(json_schema_extra=_a_task_in_the_document)

    name: StrictStr | None = Field(default=None, max_length=200)
    files: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    # Where the server read the files (a submission's path form; raas.tasks.harbor.task).
    path: StrictStr | None = Field(default=None, min_length=1, max_length=PATH_MAX)
    binary_files: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    executable: list[StrictStr] = Field(default_factory=list)
    reward_key: StrictStr = Field(default="reward", min_length=1, max_length=200)

    @field_validator("files", "binary_files")
    @classmethod
    def _paths(cls, files: dict[str, str]) -> dict[str, str]:
        for path in files:
            if _clean_path(path) is None:
                raise ValueError(f"{path!r} is not a relative path inside the task")
            if any(len(part.encode()) > NAME_MAX for part in path.split("/")):
                raise ValueError(f"{path[:80]!r}...: a name longer than {NAME_MAX} bytes")
            if path != TASK_FILE and path != INSTRUCTION and path.split("/")[0] not in TOP_LEVEL:
                raise ValueError(
                    f"{path!r}: a Harbor task holds {TASK_FILE}, {INSTRUCTION} and the"
                    f" directories {', '.join(TOP_LEVEL)}"
                )
        return files

    @field_validator("binary_files")
    @classmethod
    def _base64(cls, files: dict[str, str]) -> dict[str, str]:
        for path, data in files.items():
            try:
                base64.b64decode(data, validate=True)
            except (binascii.Error, ValueError):
                raise ValueError(f"{path}: not base64") from None
        return files

    @model_validator(mode="after")
    def _a_task(self) -> Self:
        if not self.files and not self.binary_files:
            if self.path is not None:
                raise located_error(("path",), NOT_READ)
            raise located_error(
                ("files",),
                "Field required: a Harbor task's files (path to text), or on a server that"
                " reads task directories, the task directory's path (path)",
            )
        both = set(self.files) & set(self.binary_files)
        if both:
            raise located_error(("binary_files",), f"{sorted(both)[0]} is also in files")
        total = sum(len(v) for v in self.files.values()) + sum(
            len(v) * 3 // 4 for v in self.binary_files.values()
        )
        if total > MAX_TASK_BYTES or len(self.files) + len(self.binary_files) > MAX_TASK_FILES:
            raise located_error(
                ("files",), f"over {MAX_TASK_BYTES >> 20} MiB or {MAX_TASK_FILES} files in all"
            )
        for path in (TASK_FILE, INSTRUCTION, TEST_SCRIPT):
            if path not in self.files:
                raise located_error(("files",), f"{self.label}: a Harbor task needs {path}")
        paths = {*self.files, *self.binary_files}
        # A file and a directory of one name cannot both be written (INIT writes them out).
        clash = sorted(p for p in paths if any(d in paths for d in _dirs_above(p)))
        if clash:
            raise located_error(("files",), f"{clash[0]} is below a file of the task's")
        config = self._config_or_error()
        self._runnable_here(config)
        return self

    def _config_or_error(self) -> HarborConfig:
        try:
            return self.config
        except ValidationError as e:
            first = e.errors(include_url=False)[0]
            where = ".".join(str(part) for part in first["loc"]) or "task.toml"
            raise located_error(
                ("files", TASK_FILE), f"{self.label}: task.toml: {where}: {first['msg']}"
            ) from None
        except ValueError as e:  # TOML syntax
            raise located_error(("files", TASK_FILE), f"{self.label}: task.toml: {e}") from None

    def _runnable_here(self, config: HarborConfig) -> None:
        env = config.environment
        for name in COMPOSE_FILES:
            if f"environment/{name}" in self.files:
                raise located_error(
                    ("files", f"environment/{name}"),
                    f"{self.label}: docker-compose services are not supported by raas (one"
                    " image per task: a Dockerfile or task.toml's docker_image)",
                )
        if env.docker_image is None and DOCKERFILE not in self.files:
            raise located_error(
                ("files",), f"{self.label}: needs {DOCKERFILE} or task.toml's docker_image"
            )

    @property
    def label(self) -> str:
        """How messages name the task: its ``[task]`` name, else the instance's ``name``."""
        return f"Harbor task {self.name!r}" if self.name else "the Harbor task"

    @functools.cached_property
    def config(self) -> HarborConfig:
        return HarborConfig.from_toml(self.files[TASK_FILE])

    @property
    def instruction(self) -> str:
        return self.files[INSTRUCTION]

    def under(self, top: str) -> dict[str, tuple[bytes, bool]]:
        """The files under ``top`` (``tests``, ``solution``, ``environment``), by their path
        below it: their bytes and whether they are executable."""
        prefix = top + "/"
        out: dict[str, tuple[bytes, bool]] = {}
        executable = set(self.executable)
        for path, text in self.files.items():
            if path.startswith(prefix):
                out[path[len(prefix) :]] = (text.encode("utf-8"), path in executable)
        for path, data in self.binary_files.items():
            if path.startswith(prefix):
                out[path[len(prefix) :]] = (base64.b64decode(data), path in executable)
        return out

    def gold_command(self) -> str | None:
        """The shell command that runs ``solution/solve.sh`` where the agent works (written to
        ``SOLVE_FILE``, run by bash with ``[solution] env``): the gold policy of the oracle and
        of ``raas datasets check``; None where the task has no solution."""
        solve = self.files.get(SOLVE_SCRIPT)
        if solve is None:
            return None
        env = self.config.solution.env
        assignments = " ".join(f"{name}={shlex.quote(value)}" for name, value in env.items())
        run = f"env {assignments} bash {SOLVE_FILE}" if assignments else f"bash {SOLVE_FILE}"
        end = "RAAS_SOLVE_SH"
        return f"cat > {SOLVE_FILE} <<'{end}'\n{solve.rstrip()}\n{end}\n{run}"

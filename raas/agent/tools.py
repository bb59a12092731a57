"""The tools an agent is offered: their schemas (what the model sees) and what they do."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from raas.sandbox import Sandbox, SandboxError, ToolError


@dataclass(frozen=True)
class ToolOutcome:
    observation: str
    finish: bool = False
    answer: str | None = None


@runtime_checkable
class Tool(Protocol):
    """A tool: its name, description and JSON-schema parameters are what the model is shown;
    a call gets the parsed arguments and the job's sandbox (None for tasks without one). A
    mistake of the model's (a bad argument, a refused action) is best returned as an
    observation, or raised as ToolError, so the model can correct itself. A tool may say
    ``touches_sandbox = False`` (it neither reads nor changes the sandbox: think, finish); its
    calls then never wait for a checkpoint's read of the sandbox (``touches_sandbox``)."""

    name: str
    description: str
    parameters: dict[str, Any]

    async def __call__(self, args: dict[str, Any], sandbox: Sandbox | None) -> ToolOutcome: ...


def touches_sandbox(tool: Tool | None) -> bool:
    """Whether a call of ``tool`` may read or change the sandbox (an unknown one: it may)."""
    return tool is None or bool(getattr(tool, "touches_sandbox", True))


def schema(tool: Tool) -> dict[str, Any]:
    """The OpenAI/Hermes function schema the chat template shows the model."""
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        },
    }


def _obj(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required}


def _need(sandbox: Sandbox | None, tool: str) -> Sandbox:
    if sandbox is None:
        raise ToolError("ToolError", f"{tool} needs a sandbox and this task has none")
    return sandbox


def _observation(output: str, *notes: str | None) -> str:
    """A tool's output (trailing newlines off) and the notes that apply, a line each."""
    parts = [output.rstrip("\n")] if output.strip() else []
    return "\n".join(parts + [n for n in notes if n])


class BashTool:
    name = "bash"
    description = "Run a command in a persistent bash shell (state is kept between calls)."
    parameters = _obj({"command": {"type": "string"}}, ["command"])

    async def __call__(self, args: dict[str, Any], sandbox: Sandbox | None) -> ToolOutcome:
        result = await _need(sandbox, self.name).bash(str(args["command"]))
        timed_out = "[the command timed out and was interrupted]" if result.timed_out else None
        note = f"[{result.note}]" if result.note else None
        return ToolOutcome(
            _observation(result.output, timed_out, note, f"[exit code {result.exit_code}]")
        )


class IPythonTool:
    name = "ipython"
    description = "Run Python code in a persistent IPython kernel; the last expression is shown."
    parameters = _obj({"code": {"type": "string"}}, ["code"])

    async def __call__(self, args: dict[str, Any], sandbox: Sandbox | None) -> ToolOutcome:
        result = await _need(sandbox, self.name).ipython(str(args["code"]))
        out = f"Out: {result.result}" if result.result is not None else None
        error = (
            result.error.get("traceback") or result.error.get("evalue") if result.error else None
        )
        timed_out = "[the cell timed out and was interrupted]" if result.timed_out else None
        note = f"[{result.note}]" if result.note else None
        return ToolOutcome(
            _observation(result.stdout, out, error, timed_out, note) or "[no output]"
        )


class EditorTool:
    name = "editor"
    description = (
        "View, create and edit files. Commands: view (path, view_range?), create (path,"
        " file_text), str_replace (path, old_str, new_str; old_str must be unique), insert"
        " (path, insert_line, new_str), undo_edit (path)."
    )
    parameters = _obj(
        {
            "command": {"enum": ["view", "create", "str_replace", "insert", "undo_edit"]},
            "path": {"type": "string"},
            "file_text": {"type": "string"},
            "old_str": {"type": "string"},
            "new_str": {"type": "string"},
            "insert_line": {"type": "integer"},
            "view_range": {"type": "array", "items": {"type": "integer"}},
        },
        ["command", "path"],
    )

    async def __call__(self, args: dict[str, Any], sandbox: Sandbox | None) -> ToolOutcome:
        args = dict(args)
        command, path = str(args.pop("command", "")), str(args.pop("path", ""))
        return ToolOutcome(await _need(sandbox, self.name).editor(command, path, **args))


class FinishTool:
    name = "finish"
    touches_sandbox = False
    description = "End the task. Give the final answer (for questions) or a short message."
    parameters = _obj({"answer": {"type": "string"}, "message": {"type": "string"}}, [])

    async def __call__(self, args: dict[str, Any], sandbox: Sandbox | None) -> ToolOutcome:
        answer = args.get("answer")
        return ToolOutcome("finished", finish=True, answer=None if answer is None else str(answer))


class ThinkTool:
    name = "think"
    touches_sandbox = False
    description = "Think out loud; nothing happens, the thought is recorded."
    parameters = _obj({"thought": {"type": "string"}}, ["thought"])

    async def __call__(self, args: dict[str, Any], sandbox: Sandbox | None) -> ToolOutcome:
        return ToolOutcome("[thought recorded]")


BUILTIN_TOOLS: dict[str, Tool] = {
    t.name: t for t in (BashTool(), IPythonTool(), EditorTool(), FinishTool(), ThinkTool())
}


def select_tools(tools: Iterable[str | Tool]) -> dict[str, Tool]:
    """The tools by name, in order: each a built-in tool's name or a Tool object (a task's own)."""
    items = list(tools)
    unknown = [t for t in items if isinstance(t, str) and t not in BUILTIN_TOOLS]
    if unknown:
        raise ValueError(f"unknown tools {unknown} (have: {', '.join(BUILTIN_TOOLS)})")
    chosen: dict[str, Tool] = {}
    for item in items:
        tool = BUILTIN_TOOLS[item] if isinstance(item, str) else item
        if not (isinstance(tool, Tool) and callable(tool) and isinstance(tool.parameters, dict)):
            raise TypeError(
                f"{item!r} is not a tool: it needs name, description, parameters (a JSON schema)"
                " and async __call__(args, sandbox)"
            )
        if tool.name in chosen:
            raise ValueError(f"two tools are named {tool.name!r}")
        chosen[tool.name] = tool
    return chosen


async def call_tool(
    tools: dict[str, Tool], name: str, args: dict[str, Any], sandbox: Sandbox | None
) -> ToolOutcome:
    """Run a tool; the agent's mistakes (unknown tool, bad arguments, refused edits) come back as
    observations, so the model can correct itself."""
    tool = tools.get(name)
    if tool is None:
        return ToolOutcome(f"Error: there is no tool {name!r}; available: {', '.join(tools)}")
    missing = [k for k in tool.parameters.get("required", []) if k not in args]
    if missing:
        return ToolOutcome(f"Error: {name} needs {', '.join(missing)}; got {json.dumps(args)}")
    try:
        return await tool(args, sandbox)
    except ToolError as e:
        return ToolOutcome(f"Error: {e}")
    except (TypeError, ValueError) as e:
        return ToolOutcome(f"Error: bad arguments for {name}: {e}")
    except SandboxError:
        raise

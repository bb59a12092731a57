"""The reference agent: a small tool loop on the real ``openai`` client, run inside a sandbox.

It talks to ``$OPENAI_BASE_URL`` with ``$OPENAI_API_KEY`` (the gateway, through the relay),
reads its chat from the file ``$RAAS_MESSAGES_FILE`` names (a JSON list of messages), offers
the model a ``bash`` tool (run here with subprocess) and a ``finish`` tool, and stops at
``finish`` or at a reply without tool calls; the answer (finish's argument, else that reply)
goes to ``$RAAS_ANSWER_FILE``. Standard library and openai only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

from openai import OpenAI

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a bash command in the sandbox; returns its output and exit code.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "The command."}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "finish",
            "description": "Stop: the task is done. Give the final answer if there is one.",
            "parameters": {
                "type": "object",
                "properties": {"answer": {"type": "string", "description": "The answer."}},
            },
        },
    },
]


def run_bash(command: str, timeout_s: float, max_output: int) -> str:
    try:
        done = subprocess.run(
            ["bash", "-c", command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace")
        return f"{out[-max_output:]}\n[timed out after {timeout_s:g} s]"
    out = done.stdout.decode(errors="replace")
    if len(out) > max_output:
        half = max_output // 2
        out = f"{out[:half]}\n[... {len(out) - max_output} characters cut ...]\n{out[-half:]}"
    return f"{out}\n[exit code {done.returncode}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", default=os.environ.get("RAAS_MESSAGES_FILE"))
    parser.add_argument("--answer-file", default=os.environ.get("RAAS_ANSWER_FILE"))
    parser.add_argument("--model", default=os.environ.get("RAAS_MODEL", "policy"))
    parser.add_argument("--max-turns", type=int, default=int(os.environ.get("RAAS_MAX_TURNS", 20)))
    parser.add_argument("--tool-timeout", type=float, default=120.0)
    parser.add_argument("--max-output", type=int, default=8000)
    args = parser.parse_args(argv)
    if not args.messages:
        parser.error("no messages: pass --messages or set RAAS_MESSAGES_FILE")
    with open(args.messages, encoding="utf-8") as f:
        messages: list[dict[str, Any]] = json.load(f)

    client = OpenAI(max_retries=1)
    answer: str | None = None
    for _ in range(args.max_turns):
        reply = client.chat.completions.create(
            model=args.model,
            messages=messages,  # type: ignore[arg-type]  # plain dicts, as on the wire
            tools=TOOLS,  # type: ignore[arg-type]
        )
        message = reply.choices[0].message
        calls = message.tool_calls or []
        turn: dict[str, Any] = {"role": "assistant", "content": message.content or ""}
        if calls:
            turn["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": c.function.arguments},
                }
                for c in calls
                if c.type == "function"
            ]
        messages.append(turn)
        if not calls:
            answer = message.content or ""
            break
        finished = False
        for c in calls:
            if c.type != "function":
                continue
            try:
                arguments = json.loads(c.function.arguments or "{}")
            except ValueError as e:
                arguments, error = None, f"the arguments are not JSON: {e}"
            if not isinstance(arguments, dict):
                output = error if arguments is None else "the arguments must be a JSON object"
            elif c.function.name == "finish":
                answer, finished = str(arguments.get("answer") or ""), True
                output = "finished"
            elif c.function.name == "bash":
                output = run_bash(
                    str(arguments.get("command", "")), args.tool_timeout, args.max_output
                )
            else:
                output = f"unknown tool {c.function.name!r} (have: bash, finish)"
            messages.append({"role": "tool", "tool_call_id": c.id, "content": output})
        if finished:
            break
    else:
        print(f"reference agent: no answer after {args.max_turns} turns", file=sys.stderr)
    if answer is not None and args.answer_file:
        with open(args.answer_file, "w", encoding="utf-8") as f:
            f.write(answer)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The oracle policy without sandboxes: its math, its choices, its protocol, its command line.

(tests/oracle/test_oracle.py runs it through a real server over every bundled task.)
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from raas.agent.tools import schema, select_tools
from raas.cli import main
from raas.launch import EngineProcess
from raas.llm.chat import encode, observation_delta, render_text
from raas.llm.models import ModelNotFound, load_model, load_tokenizer, tokenizer_missing
from raas.llm.toolcalls import HermesParser
from raas.oracle import sabotage
from raas.oracle.catalogue import HANDLERS, IMAGE_SETS, SETS, GoldTask, catalogue, gold_tasks
from raas.oracle.math_solvers import solver_program
from raas.oracle.model import Oracle, token_logprob
from raas.oracle.policy import UNKNOWN, chatml, last_written_line, plan


@pytest.fixture(scope="module")
def tok() -> Any:
    return load_tokenizer("oracle")


def first_prompt(tok: Any, task: GoldTask) -> list[int]:
    """The prompt the agent loop renders for the task's first turn."""
    handler = HANDLERS[task.kind]
    tools = [schema(t) for t in select_tools(list(handler.tools)).values()]
    return encode(tok, render_text(tok, handler.messages(task.instance), tools, True))


def calls(tok: Any, token_ids: list[int]) -> list[Any]:
    parsed = HermesParser().parse(tok.decode(token_ids, skip_special_tokens=True))
    assert not parsed.errors
    return parsed.calls


def after(tok: Any, prompt: list[int], output: list[int], observation: str) -> list[int]:
    """The next turn's prompt, as the agent loop builds it."""
    return prompt + output + observation_delta(tok, [{"role": "tool", "content": observation}])


def run_exec(program: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(program, {})
    return out.getvalue().strip()


def test_every_math_answer_follows_from_its_problem_text() -> None:
    """The programs the oracle runs in ipython, run here: each prints the stored answer."""
    wrong = []
    for task in gold_tasks("math"):
        program = solver_program(task.instance["kind"], task.instance["problem"])
        if run_exec(program) != task.solution:
            wrong.append(task.instance_id)
    assert not wrong


def test_the_catalogue_knows_every_bundled_task() -> None:
    counts = {name: len(gold_tasks(name)) for name in [*SETS, *IMAGE_SETS]}
    assert counts == {"humaneval": 164, "swe": 24, "math": 200, "stem": 120, "harbor": 6}
    assert len(catalogue()) == sum(counts.values())


def test_the_harbor_oracle_runs_the_tasks_solution_or_does_nothing() -> None:
    (task,) = [t for t in gold_tasks("harbor") if t.instance["name"] == "shell-pipeline"]
    gold = plan(task, None)
    reply = gold[0]([])
    call = json.loads(reply.split("<tool_call>")[1].split("</tool_call>")[0])
    command = call["arguments"]["command"]
    assert call["name"] == "bash" and command.endswith("\nbash /tmp/solve.sh")
    assert task.solution.strip() in command
    assert "finish" in gold[1]([])
    (no_op,) = plan(task, "no_op")
    assert "finish" in no_op([]) and "solve.sh" not in no_op([])


def test_sabotage_is_a_deterministic_fraction() -> None:
    tasks = [t for name in SETS for t in gold_tasks(name)]
    for fraction in (0.0, 0.3, 1.0):
        ways = [sabotage.sabotage_of(t.kind, t.instance_id, fraction, 7) for t in tasks]
        assert ways == [sabotage.sabotage_of(t.kind, t.instance_id, fraction, 7) for t in tasks]
        share = sum(w is not None for w in ways) / len(ways)
        assert abs(share - fraction) < 0.06
        pairs = zip(tasks, ways, strict=True)
        assert all(w is None or w in sabotage.SABOTAGES[t.kind] for t, w in pairs)
    other = [sabotage.sabotage_of(t.kind, t.instance_id, 0.3, 8) for t in tasks]
    assert other != [sabotage.sabotage_of(t.kind, t.instance_id, 0.3, 7) for t in tasks]


def test_a_code_trajectory_reads_the_view_to_place_the_body(tok: Any) -> None:
    task = gold_tasks("humaneval")[0]
    oracle = Oracle(tok)
    prompt = first_prompt(tok, task)
    first = oracle.generate(prompt, 4096)
    (view,) = calls(tok, first.token_ids)
    assert (view.name, view.arguments["command"]) == ("editor", "view")
    shown = "  1\tdef f():\n  2\t    pass\n  3\t    '''doc'''\n  4\t"  # its last line is line 3
    second = oracle.generate(after(tok, prompt, first.token_ids, shown), 4096)
    (insert,) = calls(tok, second.token_ids)
    assert insert.arguments["insert_line"] == 3
    assert insert.arguments["new_str"] == task.solution
    assert last_written_line("no numbered lines") is None


def test_a_math_trajectory_gives_what_ipython_printed(tok: Any) -> None:
    task = gold_tasks("math")[0]
    for fraction, given in ((0.0, "17/3"), (1.0, None)):
        oracle = Oracle(tok, sabotage=fraction)
        prompt = first_prompt(tok, task)
        first = oracle.generate(prompt, 4096)
        (compute,) = calls(tok, first.token_ids)
        assert compute.name == "ipython" and "print(" in compute.arguments["code"]
        (finish,) = calls(
            tok, oracle.generate(after(tok, prompt, first.token_ids, "17/3"), 4096).token_ids
        )
        assert finish.name == "finish"
        if given is not None:
            assert finish.arguments["answer"] == given
        else:
            assert finish.arguments["answer"] in ("20/3", "20/3 or 17/3")


def test_generations_honour_max_tokens_and_stop_ids_and_are_recorded(tok: Any) -> None:
    task = gold_tasks("stem")[0]
    oracle = Oracle(tok)
    prompt = first_prompt(tok, task)
    whole = oracle.generate(prompt, 4096)
    assert whole.finish_reason == "stop" and whole.token_ids[-1] == tok.eos_token_id
    assert whole.logprobs == [token_logprob(t) for t in whole.token_ids]
    cut = oracle.generate(prompt, 5)
    assert (cut.token_ids, cut.finish_reason) == (whole.token_ids[:5], "length")
    stop = whole.token_ids[3]
    stopped = oracle.generate(prompt, 4096, frozenset({stop}))
    at = whole.token_ids.index(stop)
    assert stopped.token_ids == whole.token_ids[: at + 1] and stopped.stop_reason == stop
    assert [g.token_ids for g in oracle.generations(task.instance_id)] == [
        whole.token_ids,
        cut.token_ids,
        stopped.token_ids,
    ]


def test_an_unknown_prompt_gets_plain_text(tok: Any) -> None:
    oracle = Oracle(tok)
    text = render_text(
        tok, [{"role": "user", "content": "What is the capital of France?"}], None, True
    )
    out = oracle.generate(encode(tok, text), 4096)
    assert tok.decode(out.token_ids, skip_special_tokens=True) == UNKNOWN
    assert oracle.counts["unknown"] == 1


def test_chatml_reads_the_conversation() -> None:
    text = (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
        "<|im_start|>assistant\nA<|im_end|>\n<|im_start|>tool\nO<|im_end|>\n<|im_start|>assistant\n"
    )
    assert chatml(text) == [("system", "S"), ("user", "U"), ("assistant", "A"), ("tool", "O")]


def test_edit_tests_sabotage_blanks_the_failing_tests() -> None:
    task = next(t for t in gold_tasks("swe"))
    source = task.instance["snapshot"]["files"]["tests/test_solution.py"]
    names = [t.rsplit(".", 1)[1] for t in task.instance["FAIL_TO_PASS"]]
    edited = source
    for old, new in sabotage.test_method_bodies(source, names):
        assert edited.count(old) == 1
        edited = edited.replace(old, new)
    compile(edited, "test_solution.py", "exec")
    assert edited.count("        pass\n") == len(names)


def test_wrong_results_are_wrong_for_each_type() -> None:
    for value in (True, 3, 2.5, "ab", [1], [], (1,), {"a": 1}, None):
        namespace: dict[str, Any] = {}
        exec(
            f"def f():\n    return {value!r}\n" + sabotage.WRONG_RESULTS.format(name="f"), namespace
        )
        assert namespace["f"]() != value


def test_the_oracle_shares_smollm2s_tokenizer_and_has_no_weights() -> None:
    assert tokenizer_missing("oracle") is None
    with pytest.raises(ModelNotFound, match="no weights"):
        load_model("oracle")


def test_sabotage_is_only_for_the_oracle() -> None:
    result = CliRunner().invoke(main, ["engine", "--model", "tiny", "--sabotage", "0.3"])
    assert result.exit_code == 2 and "--model oracle" in result.output


@pytest.fixture(scope="module")
def oracle_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    log = tmp_path_factory.mktemp("oracle") / "engine.log"
    engine = EngineProcess("oracle", log, extra_args=["--sabotage", "1", "--sabotage-seed", "3"])
    try:
        engine.wait_ready(120)
        yield engine
    finally:
        engine.stop()


def test_raas_engine_model_oracle_speaks_vllms_protocol(
    oracle_process: EngineProcess, tok: Any
) -> None:
    url = oracle_process.url
    assert httpx.get(f"{url}/health").status_code == 200
    assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == "oracle"
    task = gold_tasks("math")[5]
    body = {
        "model": "oracle",
        "prompt": first_prompt(tok, task),
        "max_tokens": 2048,
        "logprobs": 0,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "skip_special_tokens": False,
    }
    choice = httpx.post(f"{url}/v1/completions", json=body).json()["choices"][0]
    assert len(choice["token_ids"]) == len(choice["logprobs"]["token_logprobs"])
    assert choice["logprobs"]["tokens"][0] == f"token_id:{choice['token_ids'][0]}"
    (compute,) = calls(tok, choice["token_ids"])
    assert compute.name == "ipython"
    bad = httpx.post(f"{url}/v1/completions", json={**body, "bogus": 1})
    assert bad.status_code == 422 and "bogus" in bad.text
    stats = httpx.get(f"{url}/v1/oracle/stats").json()
    assert (stats["sabotage"], stats["seed"], stats["math"]) == (1.0, 3, 1)


def test_raas_engine_model_oracle_answers_chat_completions(
    oracle_process: EngineProcess,
) -> None:
    task = next(t for t in gold_tasks("stem") if isinstance(t.instance.get("choices"), dict))
    handler = HANDLERS["stem"]
    tools = [schema(t) for t in select_tools(list(handler.tools)).values()]
    body = {"messages": handler.messages(task.instance), "tools": tools}
    got = httpx.post(f"{oracle_process.url}/v1/chat/completions", json=body).json()
    choice = got["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (tool_call,) = choice["message"]["tool_calls"]
    answer = json.loads(tool_call["function"]["arguments"])["answer"]
    assert tool_call["function"]["name"] == "finish" and answer != task.solution  # sabotaged

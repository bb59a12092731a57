"""verl's datasets, scored right: each format's right answer scores 1 and a wrong one 0, in a
plain-text reply and through the finish tool, under the row's own data_source.

The rows are shaped as verl's preprocessing scripts and the datasets' own write them
(examples/data_preprocess/gsm8k.py and math_dataset.py, DAPO-Math-17k's parquet, PRIME's
Eurus-2-RL-Data for the numina_* sources, rllm's DeepScaleR script, verl's retool AIME rows).
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import raas.tasks.math
from raas.api.app import create_app
from raas.client.task_files import TaskFileError, read_tasks, task_instance
from raas.judge.answers import marked_answer
from raas.llm.models import load_tokenizer
from raas.pipeline import JobRequest, Pipeline, PipelineConfig, RequestRejected
from raas.sandbox import BwrapConfig
from raas.settings import ServeSettings
from raas.store.sqlite import ResultStore
from raas.tasks import TaskJob, TaskRegistry, UnknownTask
from raas.tasks.math import MathTask, verl_judge, verl_solution
from raas.tasks.protocol import PolicyError
from raas.tasks.services import TaskServices
from raas.tasks.sources import ALIASES, lookup, markers
from tests.support.policies import ScriptedPolicy, call
from tests.support.probe import WAIT_S

GSM8K_QUESTION = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in"
    " May. How many clips did Natalia sell altogether in April and May?"
)
DAPO_PROMPT = (
    "Solve the following math problem step by step. The last line of your response should be of"
    " the form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
    '{}\n\nRemember to put your answer on its own line after "Answer:".'
)
BOXED = "Let's think step by step and output the final answer within \\boxed{}."

# Each kind of row: (row, a right reply in plain text, a wrong one, a right finish answer).
ROWS: dict[str, tuple[dict[str, Any], str, str, str]] = {
    "gsm8k": (
        {
            "data_source": "openai/gsm8k",
            "prompt": [
                {
                    "role": "user",
                    "content": GSM8K_QUESTION
                    + ' Let\'s think step by step and output the final answer after "####".',
                }
            ],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": "72"},
            "extra_info": {
                "split": "train",
                "index": 0,
                "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold"
                " 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72",
                "question": GSM8K_QUESTION,
            },
        },
        "In May she sold 48/2 = 24 clips, so 48 + 24 = 72 in all.\n#### 72",
        "In May she sold 48*2 = 96 clips, so 48 + 96 = 144 in all.\n#### 144",
        "72",
    ),
    "math": (
        {
            "data_source": "DigitalLearningGmbH/MATH-lighteval",
            "prompt": [
                {
                    "role": "user",
                    "content": "If $x^2+y^2=1$, what is the largest possible value of"
                    f" $|x|+|y|$? {BOXED}",
                }
            ],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": "\\sqrt{2}"},
            "extra_info": {"split": "test", "index": 7},
        },
        "Take x = y = \\frac{\\sqrt{2}}{2}: the largest value is \\boxed{\\sqrt{2}}.",
        "The largest value is at x = 1, y = 0: \\boxed{1}.",
        "\\sqrt{2}",
    ),
    "dapo": (
        {
            "data_source": "math_dapo",
            "prompt": [
                {
                    "role": "user",
                    "content": DAPO_PROMPT.format(
                        "How many positive divisors does 2^5 * 3^4 have? Find their count."
                    ),
                }
            ],
            "ability": "MATH",
            "reward_model": {"ground_truth": "30", "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": "9a9b6eb4-a1cb-49d1-8c1e-62eaf2f74079"},
        },
        "The count is (5+1)(4+1) = 30.\n\nAnswer: 30",
        "The count is 5 * 4 = 20.\n\nAnswer: 20",
        "30",
    ),
    "dapo-byted": (
        {
            "data_source": "BytedTsinghua-SIA/DAPO-Math-17k",
            "prompt": [{"role": "user", "content": DAPO_PROMPT.format("What is 17 * 3?")}],
            "ability": "MATH",
            "reward_model": {"ground_truth": "51", "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": "b1"},
        },
        "17 * 3 = 51.\nAnswer: $51$",
        "17 * 3 = 41.\nAnswer: $41$",
        "Answer: 51",
    ),
    "aime": (
        {
            "data_source": "aime_2024",
            "prompt": [
                {
                    "role": "user",
                    "content": "Find the remainder when 2^10 is divided by 1000. Put the final"
                    " answer within \\boxed{}.",
                }
            ],
            "ability": "MATH",
            "reward_model": {"ground_truth": "24"},
        },
        "2^10 = 1024, which leaves \\boxed{24}.",
        "2^10 = 1024, which leaves \\boxed{124}.",
        "\\boxed{24}",
    ),
    "numina": (
        {
            "data_source": "numina_olympiads",
            "prompt": [
                {
                    "role": "system",
                    "content": "When tackling complex reasoning tasks, you have access to the"
                    " following actions. Use them as needed to progress through your thought"
                    " process.",
                },
                {
                    "role": "user",
                    "content": "What fraction of 8 is 6?\n\nPresent the answer in LaTex format:"
                    " \\boxed{Your answer}",
                },
            ],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": "\\frac{3}{4}"},
            "extra_info": {"split": "train", "index": 3},
        },
        "6/8 reduces, so the answer is 3/4. That is all.",
        "6/8 reduces to \\boxed{\\frac{2}{3}}.",
        "0.75",
    ),
    "deepscaler": (
        {
            "data_source": "",
            "prompt": [{"role": "user", "content": f"What is 2 + 3? {BOXED}"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": "5"},
            "extra_info": {"split": "train", "index": 12},
        },
        "2 + 3 = \\boxed{5}",
        "2 + 3 = \\boxed{6}",
        "5",
    ),
    "deepscaler-list": (
        {
            "data_source": "agentica-org/DeepScaleR-Preview-Dataset",
            "prompt": [{"role": "user", "content": f"What is half of 9? {BOXED}"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": ["4.5", "\\frac{9}{2}"]},
            "extra_info": {"split": "train", "index": 13},
        },
        "Half of 9 is \\boxed{\\frac{9}{2}}.",
        "Half of 9 is \\boxed{4}.",
        "4.5",
    ),
}


def registry() -> TaskRegistry:
    reg = TaskRegistry()
    reg.register(MathTask())
    return reg


def write_rows(tmp_path: Path) -> tuple[list[Path], Path]:
    """Each kind in a Parquet file of its own (a dataset's file), all of them in one JSONL."""
    rows = [row for row, *_ in ROWS.values()]
    parquets = []
    for kind, row in zip(ROWS, rows, strict=True):
        parquets.append(tmp_path / f"{kind}.parquet")
        pq.write_table(pa.Table.from_pylist([row]), parquets[-1])
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return parquets, jsonl


def test_reading_verl_rows_keeps_the_data_source(tmp_path: Path) -> None:
    parquets, jsonl = write_rows(tmp_path)
    from_jsonl = [task for _, task in read_tasks(jsonl)]
    assert [i for p in parquets for _, i in read_tasks(p)] == from_jsonl
    by_kind = dict(zip(ROWS, from_jsonl, strict=True))
    gsm8k = by_kind["gsm8k"]
    # The row as verl wrote it (what POST /v1/rollouts takes), its id filled in.
    assert gsm8k == {**ROWS["gsm8k"][0], "instance_id": "openai/gsm8k-0"}
    assert gsm8k["data_source"] == "openai/gsm8k"
    assert gsm8k["instance_id"] == "openai/gsm8k-0"
    assert gsm8k["prompt"] == ROWS["gsm8k"][0]["prompt"]
    assert gsm8k["ability"] == "math" and gsm8k["extra_info"]["split"] == "train"
    assert by_kind["dapo"]["instance_id"] == "math_dapo-9a9b6eb4-a1cb-49d1-8c1e-62eaf2f74079"
    assert by_kind["numina"]["prompt"][0]["role"] == "system"
    assert "instance_id" not in by_kind["aime"]  # no extra_info index
    assert by_kind["deepscaler"]["data_source"] == "math"  # empty, ability math
    assert by_kind["deepscaler-list"]["reward_model"]["ground_truth"] == ["4.5", "\\frac{9}{2}"]
    reg, task = registry(), MathTask()
    for kind, instance in by_kind.items():
        assert reg.resolve(instance["data_source"]) == "math", kind
        task.validate(TaskJob("j", instance, {}))
        assert task.messages(instance) == ROWS[kind][0]["prompt"], kind
    with pytest.raises(TaskFileError, match=r"x\.jsonl:1: no data_source"):
        task_instance({**ROWS["deepscaler"][0], "ability": "code"}, "x.jsonl:1")


def test_the_alias_table_and_markers() -> None:
    assert lookup("openai/gsm8k") is ALIASES["openai/gsm8k"]
    assert lookup("DeepScaleR") is ALIASES["deepscaler"]  # names are matched ignoring case
    assert lookup("aime_2025") is lookup("AIME24") is ALIASES["math_dapo"]  # verl: "aime*"
    assert lookup("codecontests") is ALIASES["apps"]  # verl's prime_code sources run as code
    assert lookup("deepcoder_lcb") is ALIASES["deepcoder"]  # ProRL Agent: "deepcoder*"
    assert lookup("math") is None
    assert markers("math") == ("boxed", "answer_line")  # verl scores "math" as DAPO math
    assert markers("openai/gsm8k")[0] == "gsm8k" and markers("lighteval/MATH") == ("boxed",)
    assert marked_answer("so\n#### 1,000", ["gsm8k"]) == "1000"
    assert marked_answer("**Answer:** $\\frac{1}{2}$", ["answer_line"]) == "$\\frac{1}{2}$"
    assert marked_answer("Answer: \\boxed{7}", ["answer_line"]) == "7"
    assert marked_answer("So the answer is 3.5. Next.", ["answer_is"]) == "3.5"
    assert marked_answer("#### 72 and \\boxed{71}", ["boxed", "gsm8k"]) == "71"
    assert marked_answer("no answer here", ["gsm8k", "answer_line", "boxed"]) is None


async def test_each_format_scores_right_and_wrong_both_ways(tmp_path: Path) -> None:
    """Every kind: right and wrong, as plain text and through finish, one pipeline run."""
    _, jsonl = write_rows(tmp_path)
    instances = dict(zip(ROWS, [task for _, task in read_tasks(jsonl)], strict=True))
    wrong_finish = "-1"
    jobs: dict[str, tuple[dict[str, Any], list[str]]] = {}
    for kind, (_, right, wrong, finish) in ROWS.items():
        instance = instances[kind]
        jobs[f"{kind}.text.right"] = (instance, [right])
        jobs[f"{kind}.text.wrong"] = (instance, [wrong])
        jobs[f"{kind}.finish.right"] = (instance, [call("finish", answer=finish)])
        jobs[f"{kind}.finish.wrong"] = (instance, [call("finish", answer=wrong_finish)])
    # A raw verl row, submitted as it is (reward_model and all), runs too.
    raw = ROWS["gsm8k"][0]
    jobs["raw.text.right"] = (raw, [ROWS["gsm8k"][1]])
    jobs["raw.finish.wrong"] = (raw, [call("finish", answer="71")])

    policy = ScriptedPolicy(
        load_tokenizer("smollm2"), {job_id: script for job_id, (_, script) in jobs.items()}
    )
    services = TaskServices(llm=policy, sandbox_config=BwrapConfig())
    store = ResultStore(tmp_path / "verl.db")
    await store.open()
    pipeline = Pipeline(registry(), store, PipelineConfig(job_timeout_s=120), services=services)
    await pipeline.start()
    results: dict[str, dict[str, Any]] = {}
    try:
        requests = [JobRequest.of(inst, job_id=job_id) for job_id, (inst, _) in jobs.items()]
        await pipeline.submit(requests)
        for job_id in jobs:
            view = await pipeline.wait(job_id, WAIT_S * 6)
            assert view is not None and view.result is not None, job_id
            results[job_id] = view.result.model_dump(mode="json")
    finally:
        await pipeline.stop()
        await services.close()
        await store.close()

    for job_id, result in results.items():
        instance = jobs[job_id][0]
        expected = 1.0 if job_id.endswith(".right") else 0.0
        assert result["state"] == "done", (job_id, result["error"])
        assert result["reward"] == expected, (job_id, result["metrics"])
        assert result["metrics"]["correct"] is (expected == 1.0), job_id
        assert result["data_source"] == instance["data_source"], job_id  # the row's own
        assert result["task"] == "math", job_id
    assert results["gsm8k.text.right"]["data_source"] == "openai/gsm8k"
    assert results["gsm8k.text.right"]["instance_id"] == "openai/gsm8k-0"
    assert results["gsm8k.text.right"]["metrics"]["artifact"] == {"answer": "72"}
    assert results["dapo.text.wrong"]["metrics"]["artifact"] == {"answer": "20"}
    assert results["deepscaler-list.text.right"]["metrics"]["ground_truth"] == [
        "4.5",
        "\\frac{9}{2}",
    ]


async def test_an_unknown_data_source_is_a_422_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(raas.tasks.math, "verl_installed", lambda: False)  # as in this venv
    reg = registry()
    with pytest.raises(UnknownTask) as exc:
        reg.get("codecontests")
    assert "openai/gsm8k" in exc.value.known and "aime*" in exc.value.known
    assert "codecontests" not in reg and "openai/gsm8k" in reg
    with pytest.raises(UnknownTask, match="did you mean 'openai/gsm8k'"):
        reg.get("openai/gsm8")

    @asynccontextmanager
    async def client() -> AsyncIterator[httpx.AsyncClient]:
        app = create_app(ServeSettings(db=tmp_path / "api.db", cancel_grace_s=0.05), reg)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
                yield http

    row = ROWS["gsm8k"][0]
    async with client() as http:
        r = await http.post("/v1/rollouts", json={"instance": {**row, "data_source": "taco"}})
        assert r.status_code == 422
        (error,) = r.json()["detail"]
        assert error["loc"] == ["body", "instance", "data_source"]
        assert error["type"] == "unknown_task" and "'taco'" in error["msg"]
        assert error["ctx"]["data_source"] == "taco"
        assert {"math", "openai/gsm8k", "math_dapo", "lighteval/MATH"} <= set(error["ctx"]["known"])
        # verl's own scorer where verl is not installed: refused, naming the field.
        r = await http.post("/v1/rollouts", json={"instance": {**row, "scorer": "verl"}})
        assert r.status_code == 422
        assert r.json()["detail"][0]["loc"] == ["body", "instance", "scorer"]
        assert "verl package is not installed" in r.json()["detail"][0]["msg"]
        spec = (await http.get("/openapi.json")).json()
    source = spec["components"]["schemas"]["Instance.math"]["properties"]["data_source"]
    assert "openai/gsm8k" in source["anyOf"][0]["enum"]
    mapping = spec["components"]["schemas"]["RolloutRequest"]["properties"]["instance"]
    assert mapping["discriminator"]["mapping"]["math_dapo"].endswith("/Instance.math")

    store = ResultStore(tmp_path / "p.db")
    await store.open()
    try:
        pipeline = Pipeline(reg, store, PipelineConfig())
        with pytest.raises(RequestRejected) as rejected:
            await pipeline.submit([JobRequest.of({**row, "data_source": "searchR1_nq"})])
        assert isinstance(rejected.value.cause, UnknownTask)
    finally:
        await store.close()


STAND_IN = """
calls = []


def default_compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    calls.append((data_source, solution_str, ground_truth, extra_info))
    if data_source == "taco":
        raise NotImplementedError(f"Reward function is not implemented for {data_source=}")
    right = solution_str.rstrip().endswith(("#### " + ground_truth, "Answer: " + ground_truth))
    return {"score": 1.0 if right else -1.0, "acc": right, "pred": solution_str[-5:]}
"""


@pytest.fixture
def stand_in_verl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A stand-in ``verl`` package whose default_compute_score records its calls."""
    package = tmp_path / "site" / "verl" / "utils" / "reward_score"
    package.mkdir(parents=True)
    for folder in (package.parent.parent, package.parent):
        (folder / "__init__.py").write_text("")
    (package / "__init__.py").write_text(STAND_IN)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    yield
    for name in [m for m in sys.modules if m == "verl" or m.startswith("verl.")]:
        del sys.modules[name]


@pytest.mark.usefixtures("stand_in_verl")
def test_verl_scorer_is_used_when_installed() -> None:
    import verl.utils.reward_score as reward_score  # the stand-in

    task = MathTask()
    instance = {**task_instance(ROWS["gsm8k"][0], "row"), "scorer": "verl"}
    task.validate(TaskJob("j", instance, {}))  # accepted: verl is importable
    text = "48 + 24 = 72"
    right = verl_judge(instance, {"solution": verl_solution(text, "72", markers("openai/gsm8k"))})
    assert reward_score.calls[-1] == (
        "openai/gsm8k",
        "48 + 24 = 72\n#### 72",
        "72",
        instance["extra_info"],
    )
    assert right.reward == 1.0 and right.metrics["scorer"] == "verl"
    assert right.metrics["correct"] is True and right.metrics["verl"]["pred"] == "## 72"
    assert verl_solution("", "#### 72", markers("openai/gsm8k")) == "#### 72"
    dapo = {**task_instance(ROWS["dapo"][0], "row"), "scorer": "verl"}
    wrong = verl_judge(dapo, {"solution": verl_solution("Answer: 20", None, markers("math_dapo"))})
    assert (wrong.reward, wrong.metrics["correct"]) == (-1.0, False)  # verl's own reward
    # Below a pass, the reason says what verl's scorer gave and read (its pred: the stand-in's
    # is the reply's last 5 characters); a pass has none.
    assert wrong.metrics["reason"] == (
        "verl's math_dapo scorer gave -1, answer read: r: 20, expected 30"
    )
    assert "reason" not in right.metrics
    with pytest.raises(PolicyError, match="no scorer for data_source 'taco'"):
        verl_judge({**instance, "data_source": "taco"}, {"solution": "#### 72"})

"""Dataset names that raas runs as one of its tasks: the one alias table.

verl's RL rows name their dataset in ``data_source`` (``openai/gsm8k``, ``math_dapo``...) and verl
picks the reward function by that name (``verl.utils.reward_score.default_compute_score``). raas
runs such a row as one of its own tasks: the registry resolves the name through this table
(``TaskRegistry.resolve``), the row keeps its ``data_source`` (results and exports say
``openai/gsm8k``; /metrics counts it under the table's name, ``canonical``: ``aime*`` for every
``aime...``), and the result's ``task`` says which raas task ran it.

Each name also says where a reply puts its answer, as the dataset's prompt asks and as verl's
scorer for it reads it (in that order; the finish tool's answer comes before all of them):

- ``gsm8k``: the last ``#### 72`` (verl's ``gsm8k.py``, strict method); then ``\\boxed{}``.
- ``answer_line``: the last ``Answer: 72`` line (DAPO's prompt; verl's ``math_dapo.py`` reads it
  first and falls back to the last ``\\boxed{}``).
- ``boxed``: the last ``\\boxed{}`` (MATH: verl's ``math.py`` / ``math_verify.py``).
- ``answer_is``: ``The answer is 72`` / ``answer: 72`` when there is no box (verl's
  ``prime_math``, for the ``numina_*`` sources, prefers a box and falls back to these).

raas then compares the answer with the ground truth by symbolic equivalence (math-verify, see
``raas.judge.answers.check_math``), not verl's string normalisation, and gives 1.0 or 0.0 (verl's
``math_dapo`` gives -1.0 for a wrong answer; an instance with ``"scorer": "verl"`` gets verl's own
score where verl is installed, see ``raas.tasks.math``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from raas.judge.answers import AnswerMarker


@dataclass(frozen=True)
class DataSource:
    """How raas runs the rows of one dataset name."""

    task: str  # the raas task that runs and scores them
    markers: tuple[AnswerMarker, ...]  # where a reply puts its answer, in order
    verl_scorer: str  # the module of verl.utils.reward_score that verl scores them with


GSM8K = DataSource("math", ("gsm8k", "boxed"), "gsm8k")
MATH = DataSource("math", ("boxed",), "math")
DAPO = DataSource("math", ("answer_line", "boxed"), "math_dapo")
PRIME = DataSource("math", ("boxed", "answer_is"), "prime_math")
DEEPSCALER = DataSource("math", ("boxed",), "math")
CODE = DataSource("code", (), "prime_code")
SWE = DataSource("swe", (), "")  # verl has no scorer for it

# The names of verl's default_compute_score table that raas can score, and the names verl's
# recipes and the datasets' own preprocessing scripts write.
ALIASES: dict[str, DataSource] = {
    "openai/gsm8k": GSM8K,
    "lighteval/MATH": MATH,
    "DigitalLearningGmbH/MATH-lighteval": MATH,
    "HuggingFaceH4/MATH-500": MATH,
    "math_dapo": DAPO,
    "math_dapo_reasoning": DAPO,
    "BytedTsinghua-SIA/DAPO-Math-17k": DAPO,
    "BytedTsinghua-SIA/AIME-2024": DAPO,
    "numina_aops_forum": PRIME,
    "numina_synthetic_math": PRIME,
    "numina_amc_aime": PRIME,
    "numina_synthetic_amc": PRIME,
    "numina_cn_k12": PRIME,
    "numina_olympiads": PRIME,
    "agentica-org/DeepScaleR-Preview-Dataset": DEEPSCALER,
    "deepscaler": DEEPSCALER,
    # Code contests (verl scores these with prime_code; ProRL Agent runs them as "deepcoder").
    "deepcoder": CODE,
    "codecontests": CODE,
    "apps": CODE,
    "codeforces": CODE,
    "taco": CODE,
    # ProRL Agent's name for SWE-bench-style rows (its server's default data_source).
    "swebench": SWE,
}
# verl scores any name that starts with "aime" (aime_2024, aime25...) as DAPO math; ProRL
# Agent runs any name that starts with "deepcoder" as its code task.
PREFIXES: dict[str, DataSource] = {"aime": DAPO, "deepcoder": CODE}

# raas's own math task: verl scores a row whose data_source is "math" as DAPO math too.
NATIVE_MARKERS: dict[str, tuple[AnswerMarker, ...]] = {"math": ("boxed", "answer_line")}

_LOWER = {name.lower(): source for name, source in ALIASES.items()}
_SPELLED = {name.lower(): name for name in ALIASES}
_LONGEST = max(len(name) for name in [*ALIASES, *PREFIXES])


def lookup(data_source: str) -> DataSource | None:
    """The alias entry for ``data_source`` (exact, then ignoring case, then by prefix)."""
    found = ALIASES.get(data_source) or _LOWER.get(data_source.lower())
    if found is not None:
        return found
    lowered = data_source.lower()
    for prefix, source in PREFIXES.items():
        if lowered.startswith(prefix):
            return source
    return None


def canonical(data_source: str) -> str | None:
    """The table's own name for ``data_source``, as ``lookup`` finds it: the alias as the table
    spells it (``openai/gsm8k`` for ``OpenAI/GSM8K``), or its prefix's pattern (``aime*`` for
    ``aime_2024``, as ``names_for`` lists it); None when the table lacks it. One of a fixed set
    of names, whatever a client wrote (what a count of jobs by dataset is labelled with)."""
    if data_source in ALIASES:
        return data_source
    # A name longer than every one of the table's is none of them: only its head is read (a
    # client's string may be megabytes, and a job's counts ask several times).
    lowered = data_source[: _LONGEST + 1].lower()
    spelled = _SPELLED.get(lowered)
    if spelled is not None:
        return spelled
    for prefix in PREFIXES:
        if lowered.startswith(prefix):
            return f"{prefix}*"
    return None


def markers(data_source: str) -> tuple[AnswerMarker, ...]:
    """Where a reply to a row of ``data_source`` puts its answer (a box when nothing says)."""
    source = lookup(data_source)
    if source is not None:
        return source.markers
    return NATIVE_MARKERS.get(data_source, ("boxed",))


def names_for(tasks: Iterable[str]) -> list[str]:
    """The alias names (and ``PREFIX*`` patterns) that run as one of ``tasks``, sorted."""
    wanted = set(tasks)
    exact = [name for name, source in ALIASES.items() if source.task in wanted]
    patterns = [f"{prefix}*" for prefix, source in PREFIXES.items() if source.task in wanted]
    return sorted(exact, key=str.lower) + sorted(patterns)

"""Hidden checks of the spans package in /app (the agent never sees them).

The agent's code is run, not trusted: ``RUNNER`` imports spans in a child process (``python3
-I``, in a session of its own, under a deadline) and prints each function's answers to the
cases as JSON; this process, which never imports /app, compares them with a brute-force model
(the set of covered integer points). Before the reward is written, every process but this one
and the sandbox's own first two (its init and raas's action server) is killed: nothing the
agent's code started can write the reward after it. Signals that would end this process
early are ignored (SIGKILL ends it: a verifier killed by a signal scores nothing).
"""

import contextlib
import json
import os
import random
import signal
import subprocess
import sys

REWARD = "/logs/verifier/reward.txt"
DEADLINE_S = 60

for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1):
    signal.signal(sig, signal.SIG_IGN)


def write_reward(value):
    os.makedirs(os.path.dirname(REWARD), exist_ok=True)
    with open(REWARD, "w") as f:
        f.write(f"{value}\n")


def points(intervals):
    return {p for start, end in intervals for p in range(start, end)}


def runs(point_set):
    result = []
    for p in sorted(point_set):
        if result and result[-1][1] == p:
            result[-1] = (result[-1][0], p + 1)
        else:
            result.append((p, p + 1))
    return result


def random_cases(seed, count=300):
    rng = random.Random(seed)
    for _ in range(count):
        intervals = []
        for _ in range(rng.randint(0, 7)):
            start = rng.randint(0, 40)
            intervals.append((start, start + rng.randint(0, 15)))
        yield intervals


def cases():
    """(function, args, expected) triples; expected ``"ValueError"`` where it must raise."""
    out = [
        ("merge", [[(9, 17), (10, 11)]], [(9, 17)]),
        ("total_length", [[(9, 17), (10, 11)]], 8),
        ("covers", [[(9, 17), (10, 11)], 14], True),
        ("gaps", [[(9, 17), (10, 11)], 0, 24], [(0, 9), (17, 24)]),
        ("merge", [[(0, 100), (5, 10), (20, 30), (99, 120)]], [(0, 120)]),
        ("merge", [[(0, 10), (2, 3), (10, 12)]], [(0, 12)]),
        ("merge", [[(3, 9), (3, 4)]], [(3, 9)]),
        ("merge", [[[4, 6], [1, 1], [2, 3]]], [(2, 3), (4, 6)]),
        ("merge", [[(1, 5), (9, 2)]], "ValueError"),
        ("gaps", [[], 5, 1], "ValueError"),
        ("normalize", [[(1, 1), (2, 5)]], [(2, 5)]),
        ("merge", [[(1, 3), (3, 5)]], [(1, 5)]),
        ("merge", [[(7, 9), (1, 3)]], [(1, 3), (7, 9)]),
        ("gaps", [[(2, 4), (6, 7)], 0, 10], [(0, 2), (4, 6), (7, 10)]),
        ("gaps", [[(0, 10)], 3, 5], []),
        ("covers", [[(2, 4)], 4], False),
        ("total_length", [[]], 0),
    ]
    out += [("merge", [c], runs(points(c))) for c in random_cases(1)]
    out += [("total_length", [c], len(points(c))) for c in random_cases(2)]
    rng = random.Random(3)
    for c in random_cases(4):
        lo = rng.randint(0, 30)
        hi = lo + rng.randint(0, 30)
        out.append(("gaps", [c, lo, hi], runs(set(range(lo, hi)) - points(c))))
    for c in random_cases(5, count=100):
        covered = points(c)
        out += [("covers", [c, p], p in covered) for p in range(-1, 58)]
    return out


# Run by the agent's Python in a child: reads the cases' calls on stdin, prints the answers
# (tuples kept as such: their type is part of the contract).
RUNNER = r"""
import json, sys
sys.path.insert(0, "/app")
import spans
answers = []
for name, args in json.load(sys.stdin):
    try:
        value = getattr(spans, name)(*args)
    except ValueError:
        answers.append({"raised": "ValueError"})
        continue
    except Exception as e:
        answers.append({"raised": type(e).__name__})
        continue
    if isinstance(value, list):
        answers.append({"list": [[list(v), type(v).__name__] for v in value]})
    else:
        answers.append({"value": value, "type": type(value).__name__})
print(json.dumps(answers))
"""


def agents_answers(calls):
    child = subprocess.Popen(
        [sys.executable, "-I", "-c", RUNNER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd="/tmp",
        start_new_session=True,
    )
    try:
        out, _ = child.communicate(json.dumps(calls).encode(), timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        out = b""
    return out


def kill_the_rest():
    """Every process but this one and the sandbox's first two: what the agent's code left."""
    me = os.getpid()
    for _ in range(3):  # what was forking meanwhile is caught by a later round
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) > 2 and int(entry) != me:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(entry), signal.SIGKILL)


def matches(answer, expected):
    if expected == "ValueError":
        return answer == {"raised": "ValueError"}
    if isinstance(expected, list):
        want = [[list(v), "tuple"] for v in expected]
        return answer == {"list": want}
    return answer.get("type") == type(expected).__name__ and answer.get("value") == expected


def main():
    write_reward(0)
    checks = cases()
    raw = agents_answers([[name, args] for name, args, _ in checks])
    kill_the_rest()
    try:
        answers = json.loads(raw.decode("utf-8"))
    except ValueError:
        answers = None
    passed = isinstance(answers, list) and len(answers) == len(checks)
    if passed:
        pairs = zip(checks, answers, strict=True)
        wrong = [c for c, a in pairs if not isinstance(a, dict) or not matches(a, c[2])]
        passed = not wrong
        print(f"{len(checks) - len(wrong)} of {len(checks)} checks pass")
    else:
        print("the package gave no answers")
    write_reward(1 if passed else 0)
    print(f"reward: {1 if passed else 0}")


main()

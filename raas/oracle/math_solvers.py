"""Python programs that compute the answer of a bundled math problem from its text.

The oracle does not copy the bundle's ``answer`` into ipython: it reads the numbers out of the
problem as the model sees it and writes a short program (standard library only: the sandbox's
python3 runs it) that works the answer out with exact fractions. A problem whose text does not
lead to its stored answer is therefore a failure the oracle tier reports, not a pass.

One solver per ``kind`` of ``scripts/make_math_bundle.py``; each returns the program's source,
which prints the answer (``48``, ``7/10``, ``-23/17``).
"""

from __future__ import annotations

import re
from collections.abc import Callable

HEADER = "from fractions import Fraction as F\n"

# An integer, a decimal or a fraction as the problems write them ("12", "2.5", "3/4", "-7").
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?:/\d+)?")


class Unsolvable(ValueError):
    """The problem's text does not have the shape its kind's solver reads."""


def numbers(text: str) -> list[str]:
    """Every number in ``text``, in order, as Python source of a Fraction (``F('3/4')``)."""
    return [f"F('{n}')" for n in _NUMBER.findall(text)]


def _need(found: list[str], count: int, text: str) -> list[str]:
    if len(found) != count:
        raise Unsolvable(f"expected {count} numbers, found {len(found)} in {text!r}")
    return found


def _program(assignments: str, result: str) -> str:
    return f"{HEADER}{assignments}\nprint({result})\n"


def _names(names: str, values: list[str]) -> str:
    return "\n".join(f"{n} = {v}" for n, v in zip(names.split(), values, strict=True))


def _fixed(names: str, result: str) -> Callable[[str], str]:
    """A solver for problems with exactly the numbers ``names`` in that order."""

    def solve(text: str) -> str:
        values = _need(numbers(text), len(names.split()), text)
        return _program(_names(names, values), result)

    return solve


def _polynomial(expression: str, variables: str = "x") -> str:
    """``2x - 12``, ``3x^2 - 23x - 36``, ``6x + 2y`` as a Python expression over Fractions."""
    expr = expression.replace("^", "**").replace("\u2212", "-")
    expr = re.sub(r"(\d+)", r"F(\1)", expr)
    expr = re.sub(rf"\)(?=[{variables}])", ")*", expr)  # F(2)x -> F(2)*x
    return expr


def _equation(text: str, pattern: str) -> tuple[str, str]:
    match = re.search(pattern, text)
    if match is None:
        raise Unsolvable(f"no equation in {text!r}")
    return _polynomial(match.group("left")), _polynomial(match.group("right"))


def linear_equation(text: str) -> str:
    """``a x + b = c x + d``: f(x) = left - right is linear, so x = -f(0) / (f(1) - f(0))."""
    left, right = _equation(text, r"(?::|if) (?P<left>[^=]+?) = (?P<right>[^=]+?)\.$")
    return (
        f"{HEADER}def f(x):\n    return ({left}) - ({right})\n\n"
        "x = -f(F(0)) / (f(F(1)) - f(F(0)))\nprint(x)\n"
    )


def linear_system(text: str) -> str:
    """Two linear equations in x and y (Cramer's rule), then the asked expression of x, y."""
    match = re.search(
        r"system (?P<e1>[^=]+= -?\d+) and (?P<e2>[^=]+= -?\d+)\. What is the value of "
        r"(?P<ask>[xy +-]+)\?",
        text,
    )
    if match is None:
        raise Unsolvable(f"no system in {text!r}")
    rows = []
    for key in ("e1", "e2"):
        left, right = match.group(key).split("=")
        rows.append((_polynomial(left, "xy"), _polynomial(right, "xy")))
    (l1, r1), (l2, r2) = rows
    return (
        f"{HEADER}def e1(x, y):\n    return {l1}\n\ndef e2(x, y):\n    return {l2}\n\n"
        "a1, b1 = e1(F(1), F(0)), e1(F(0), F(1))\na2, b2 = e2(F(1), F(0)), e2(F(0), F(1))\n"
        f"c1, c2 = {r1}, {r2}\ndet = a1 * b2 - a2 * b1\n"
        "x = (c1 * b2 - c2 * b1) / det\ny = (a1 * c2 - a2 * c1) / det\n"
        f"print({match.group('ask')})\n"
    )


def _quadratic(text: str) -> str:
    """``a x^2 + b x + c = 0``: a, b, c from f(0), f(1), f(-1)."""
    match = re.search(r"(?:equation|of) (?P<left>[-\dx^ +]+?) = 0", text)
    if match is None:
        raise Unsolvable(f"no quadratic in {text!r}")
    return (
        f"{HEADER}def f(x):\n    return {_polynomial(match.group('left'))}\n\n"
        "c = f(F(0))\na = (f(F(1)) + f(F(-1))) / 2 - c\nb = (f(F(1)) - f(F(-1))) / 2\n"
    )


def quadratic_positive_root(text: str) -> str:
    return (
        _quadratic(text) + "import math\nd = b * b - 4 * a * c\n"
        "root = F(math.isqrt(int(d)))\nassert root * root == d, 'irrational roots'\n"
        "print(max((-b + root) / (2 * a), (-b - root) / (2 * a)))\n"
    )


def quadratic_roots_sum_product(text: str) -> str:
    if "sum of the roots" in text:
        return _quadratic(text) + "print(-b / a)\n"
    if "product of the roots" in text:
        return _quadratic(text) + "print(c / a)\n"
    raise Unsolvable(f"neither a sum nor a product is asked in {text!r}")


def consecutive_integers(text: str) -> str:
    count, total = _need(numbers(text), 2, text)
    step = 2 if ("even" in text or "odd" in text) else 1
    ask = "smallest" if "smallest" in text else "smallest + step * (count - 1)"
    return _program(
        f"count, total, step = {count}, {total}, {step}\n"
        "smallest = (total - step * count * (count - 1) / 2) / count",
        ask,
    )


def average_missing(text: str) -> str:
    found = numbers(text)
    if len(found) < 4:
        raise Unsolvable(f"too few numbers in {text!r}")
    scores, (k, target, after) = found[:-3], found[-3:]
    return _program(
        f"scores = [{', '.join(scores)}]\nk, target, after = {k}, {target}, {after}\n"
        "assert len(scores) == k and after == k + 1",
        "target * after - sum(scores)",
    )


def fraction_scale(text: str) -> str:
    amount, *scale = numbers(text)  # "1 and 1/2 batches": the parts add up
    if not scale:
        raise Unsolvable(f"no scale in {text!r}")
    return _program(f"amount = {amount}\nscale = {' + '.join(scale)}", "amount * scale")


def trip_distance(text: str) -> str:
    hours = text.replace("half an hour", "0.5 hours")
    return _fixed("v1 t1 v2 t2", "v1 * t1 + v2 * t2")(hours)


def number_puzzle(text: str) -> str:
    return _fixed("k add result", "(result - add) / k")(text)


def age_problem(text: str) -> str:
    # k * son + years = later * (son + years)
    return _fixed("k years later", "years * (later - 1) / (k - later)")(text)


def ticket_system(text: str) -> str:
    adults = "(revenue - child * tickets) / (adult - child)"
    ask = adults if "How many adult" in text else f"tickets - {adults}"
    return _fixed("adult child tickets revenue", ask)(text)


_COIN_CENTS = {"pennies": 1, "nickels": 5, "dimes": 10, "quarters": 25}


def coin_system(text: str) -> str:
    match = re.search(r"only (\w+) and (\w+): (\d+) coins worth (\d+) cents.*How many (\w+)", text)
    if match is None:
        raise Unsolvable(f"no coins in {text!r}")
    first, second, count, cents, ask = match.groups()
    v1, v2 = _COIN_CENTS[first], _COIN_CENTS[second]
    n1 = f"(F({cents}) - {v2} * F({count})) / ({v1} - {v2})"
    return _program(
        f"n1 = {n1}  # {first}\nn2 = {count} - n1  # {second}", "n1" if ask == first else "n2"
    )


def quadratic_rectangle(text: str) -> str:
    extra, area = _need(numbers(text), 2, text)
    ask = "width" if "width" in text.rsplit(".", 1)[-1] else "width + extra"
    return (
        f"{HEADER}import math\nextra, area = {extra}, {area}\n"
        "d = extra * extra + 4 * area\nroot = F(math.isqrt(int(d)))\n"
        "assert root * root == d, 'irrational width'\nwidth = (-extra + root) / 2\n"
        f"print({ask})\n"
    )


def percent_change(text: str) -> str:
    return _fixed("old new", "abs(new - old) / old * 100")(text.replace("$", ""))


def _dollars(solver: Callable[[str], str]) -> Callable[[str], str]:
    return lambda text: solver(text.replace("$", ""))


SOLVERS: dict[str, Callable[[str], str]] = {
    "shopping_change": _dollars(_fixed("n a m b bill", "bill - (n * a + m * b)")),
    "wages_left": _dollars(
        _fixed("hours days rate weeks spent", "hours * days * rate * weeks - spent")
    ),
    "fraction_of_group": _fixed("total f1 f2", "total * f1 * f2"),
    "fraction_sum": _fixed("a b", "a + b"),
    "fraction_difference": _fixed("whole a b", "whole + a - b"),
    "fraction_scale": fraction_scale,
    "percent_discount": _dollars(_fixed("price off", "price * (100 - off) / 100")),
    "percent_of": _fixed("people pct", "people * pct / 100"),
    "percent_change": percent_change,
    "average_missing": average_missing,
    "ratio_split": _fixed("a b total", "total * b / (a + b)"),
    "trip_distance": trip_distance,
    "unit_price": _dollars(_fixed("n total m", "total / n * m")),
    "bakery": _fixed("batches per sold left_out", "batches * per * (1 - sold) - left_out"),
    "linear_equation": linear_equation,
    "linear_both_sides": linear_equation,
    "number_puzzle": number_puzzle,
    "consecutive_integers": consecutive_integers,
    "age_problem": age_problem,
    "linear_system": linear_system,
    "ticket_system": _dollars(ticket_system),
    "coin_system": coin_system,
    "quadratic_positive_root": quadratic_positive_root,
    "quadratic_roots_sum_product": quadratic_roots_sum_product,
    "quadratic_rectangle": quadratic_rectangle,
}


def solver_program(kind: str, problem: str) -> str:
    """The program that prints the answer of ``problem`` (a bundled problem of ``kind``)."""
    solver = SOLVERS.get(kind)
    if solver is None:
        raise Unsolvable(f"no solver for math problems of kind {kind!r}")
    return solver(problem)

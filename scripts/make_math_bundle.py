"""Generate raas/tasks/data/math_bundle.jsonl: 200 arithmetic and algebra word problems.

Every answer is computed here, exactly (fractions.Fraction), from the numbers that go into the
problem text; nothing is copied from elsewhere. The output is deterministic: a fixed seed, keys
sorted, one JSON object a line.

    python scripts/make_math_bundle.py            # write the file
    python scripts/make_math_bundle.py --check    # exit 1 if the file is not what this writes

Fields: data_source ("math"), instance_id ("math-gen-0001"...), problem, answer (an integer or a
fraction in lowest terms, "3/4", "-7/2"), level ("arithmetic" or "algebra"), kind.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

from bundle_io import write_or_check

SEED = 20240611
N_ARITHMETIC = 100
N_ALGEBRA = 100
OUT = Path(__file__).resolve().parents[1] / "raas" / "tasks" / "data" / "math_bundle.jsonl"

NAMES = [
    ("Maya", "she"),
    ("Liam", "he"),
    ("Sofia", "she"),
    ("Noah", "he"),
    ("Aisha", "she"),
    ("Mateo", "he"),
    ("Chen", "he"),
    ("Priya", "she"),
    ("Omar", "he"),
    ("Elena", "she"),
    ("Kofi", "he"),
    ("Hana", "she"),
]
ITEMS = [
    ("notebook", "notebooks"),
    ("pen", "pens"),
    ("apple", "apples"),
    ("sandwich", "sandwiches"),
    ("ticket", "tickets"),
    ("candle", "candles"),
    ("mug", "mugs"),
    ("comic book", "comic books"),
]

Problem = tuple[str, Fraction]
Maker = Callable[[random.Random], Problem]


def fmt(x: Fraction) -> str:
    """An exact answer as text: "12", "3/4", "-7/2"."""
    return str(x.numerator) if x.denominator == 1 else f"{x.numerator}/{x.denominator}"


def frac_text(x: Fraction) -> str:
    return f"{x.numerator}/{x.denominator}"


def person(rng: random.Random) -> tuple[str, str]:
    return rng.choice(NAMES)


def proper_fraction(rng: random.Random, denominators: tuple[int, ...]) -> Fraction:
    while True:
        d = rng.choice(denominators)
        n = rng.randint(1, d - 1)
        f = Fraction(n, d)
        if f.denominator > 1:
            return f


# --- arithmetic ---------------------------------------------------------------------------------


def shopping_change(rng: random.Random) -> Problem:
    name, pro = person(rng)
    (_, p1), (_, p2) = rng.sample(ITEMS, 2)
    n, m = rng.randint(2, 6), rng.randint(2, 5)
    a, b = rng.randint(2, 9), rng.randint(3, 12)
    total = n * a + m * b
    bill = next(x for x in (20, 50, 100) if x > total)
    text = (
        f"{name} buys {n} {p1} at ${a} each and {m} {p2} at ${b} each. "
        f"{pro.capitalize()} pays with a ${bill} bill. How many dollars of change does {pro} get?"
    )
    return text, Fraction(bill - total)


def wages_left(rng: random.Random) -> Problem:
    name, pro = person(rng)
    hours, days, rate, weeks = (
        rng.randint(3, 8),
        rng.randint(3, 6),
        rng.randint(12, 25),
        rng.randint(2, 4),
    )
    earned = hours * days * rate * weeks
    spent = rng.randint(earned // 5, earned // 2)
    text = (
        f"{name} works {hours} hours a day, {days} days a week, and earns ${rate} per hour. "
        f"After {weeks} weeks {pro} spends ${spent} on a bicycle. "
        f"How many dollars of {'her' if pro == 'she' else 'his'} earnings are left?"
    )
    return text, Fraction(earned - spent)


def fraction_of_group(rng: random.Random) -> Problem:
    f1 = proper_fraction(rng, (2, 3, 4, 5, 6))
    f2 = proper_fraction(rng, (2, 3, 4, 5))
    total = f1.denominator * f2.denominator * rng.randint(2, 12)
    first = total * f1
    answer = first * f2
    group, sub = rng.choice(
        [
            ("sing in the choir", "are sopranos"),
            ("play a sport", "play soccer"),
            ("take the bus to school", "sit upstairs"),
            ("have a pet", "have a dog"),
        ]
    )
    text = (
        f"A school has {total} students. {frac_text(f1)} of them {group}, and "
        f"{frac_text(f2)} of those {sub}. How many students {sub}?"
    )
    return text, answer


def fraction_sum(rng: random.Random) -> Problem:
    name, pro = person(rng)
    while True:
        a = proper_fraction(rng, (2, 3, 4, 5, 6, 8))
        b = proper_fraction(rng, (2, 3, 4, 5, 6, 8))
        if a.denominator != b.denominator:
            break
    text = (
        f"{name} drinks {frac_text(a)} of a liter of juice in the morning and {frac_text(b)} "
        f"of a liter in the afternoon. How many liters does {pro} drink in all? "
        "Give the answer as a fraction in lowest terms."
    )
    return text, a + b


def fraction_difference(rng: random.Random) -> Problem:
    while True:
        a = proper_fraction(rng, (2, 3, 4, 5, 6, 8, 10, 12))
        b = proper_fraction(rng, (2, 3, 4, 5, 6, 8, 10, 12))
        if a > b and a.denominator != b.denominator:
            break
    whole = rng.randint(1, 3)
    length = whole + a
    text = (
        f"A ribbon is {whole} and {frac_text(a)} meters long. A piece {frac_text(b)} of a meter "
        "long is cut off. How many meters of ribbon remain? Give the answer as a fraction."
    )
    return text, length - b


def fraction_scale(rng: random.Random) -> Problem:
    amount = proper_fraction(rng, (2, 3, 4, 8))
    scale = rng.choice(
        [Fraction(2, 3), Fraction(3, 2), Fraction(5, 2), Fraction(3, 4), Fraction(4)]
    )
    ingredient = rng.choice(["sugar", "flour", "milk", "oats"])
    scale_text = {
        Fraction(2, 3): "2/3 of a batch",
        Fraction(3, 2): "1 and 1/2 batches",
        Fraction(5, 2): "2 and 1/2 batches",
        Fraction(3, 4): "3/4 of a batch",
        Fraction(4): "4 batches",
    }[scale]
    text = (
        f"A recipe uses {frac_text(amount)} of a cup of {ingredient} per batch. How many cups of "
        f"{ingredient} are needed for {scale_text}? Give the answer as a fraction or whole number."
    )
    return text, amount * scale


def percent_discount(rng: random.Random) -> Problem:
    price = 20 * rng.randint(2, 15)
    off = rng.choice([10, 15, 20, 25, 30, 35, 40, 50])
    item = rng.choice(["jacket", "pair of shoes", "lamp", "backpack", "chair", "helmet"])
    text = (
        f"A {item} costs ${price}. It is on sale for {off}% off. "
        "What is the sale price, in dollars?"
    )
    return text, Fraction(price * (100 - off), 100)


def percent_of_town(rng: random.Random) -> Problem:
    pct = rng.choice([4, 5, 8, 12, 15, 20, 24, 25, 35, 40, 45, 60, 75])
    people = 100 * rng.randint(3, 60)
    thing = rng.choice(["own a bicycle", "speak two languages", "work from home", "have a garden"])
    text = f"A town has {people} residents and {pct}% of them {thing}. How many residents {thing}?"
    return text, Fraction(people * pct, 100)


def percent_change(rng: random.Random) -> Problem:
    old = 20 * rng.randint(2, 30)
    pct = rng.choice([5, 10, 15, 20, 25, 30, 40, 45, 50, 60, 75])
    up = rng.random() < 0.5
    new = Fraction(old * (100 + pct if up else 100 - pct), 100)
    thing = rng.choice(["A bus ticket", "A monthly gym membership", "A concert ticket", "A tablet"])
    word = "increase" if up else "decrease"
    text = (
        f"{thing} cost ${old} last year and costs ${fmt(new)} this year. "
        f"By what percent did the price {word}? Answer with the number of percent."
    )
    return text, Fraction(pct)


def average_missing(rng: random.Random) -> Problem:
    name, pro = person(rng)
    k = rng.randint(3, 5)
    while True:
        scores = [rng.randint(60, 98) for _ in range(k)]
        target = rng.randint(75, 92)
        need = target * (k + 1) - sum(scores)
        if 50 <= need <= 100:
            break
    listed = ", ".join(str(s) for s in scores[:-1]) + f" and {scores[-1]}"
    text = (
        f"{name} scored {listed} on {k} tests. What score does {pro} need on the next test "
        f"to have an average of exactly {target} over all {k + 1} tests?"
    )
    return text, Fraction(need)


def ratio_split(rng: random.Random) -> Problem:
    a, b = rng.sample(range(1, 10), 2)
    g = Fraction(a, b)
    a, b = g.numerator, g.denominator
    total = (a + b) * rng.randint(3, 15)
    text = (
        f"In a club the ratio of boys to girls is {a}:{b}. There are {total} members in all. "
        "How many girls are in the club?"
    )
    return text, Fraction(total * b, a + b)


def trip_distance(rng: random.Random) -> Problem:
    v1, v2 = 10 * rng.randint(4, 12), 10 * rng.randint(4, 12)
    t1 = rng.choice([Fraction(1, 2), Fraction(1), Fraction(3, 2), Fraction(2), Fraction(3)])
    t2 = rng.choice([Fraction(1, 2), Fraction(1), Fraction(2), Fraction(5, 2)])

    def hours(t: Fraction) -> str:
        return {
            Fraction(1, 2): "half an hour",
            Fraction(1): "1 hour",
            Fraction(3, 2): "1.5 hours",
            Fraction(5, 2): "2.5 hours",
        }.get(t, f"{fmt(t)} hours")

    text = (
        f"A car travels at {v1} km/h for {hours(t1)} and then at {v2} km/h for {hours(t2)}. "
        "How many kilometers does it travel in total?"
    )
    return text, v1 * t1 + v2 * t2


def unit_price(rng: random.Random) -> Problem:
    single, plural = rng.choice(ITEMS)
    each = Fraction(rng.randint(3, 40), 4)
    n = rng.randint(3, 9)
    while each * n != int(each * n):
        n += 1
    m = rng.randint(10, 30)
    text = (
        f"{n} {plural} cost ${fmt(each * n)} in total, and every {single} costs the same. "
        f"How many dollars do {m} {plural} cost?"
    )
    return text, each * m


def bakery(rng: random.Random) -> Problem:
    batches, per = rng.randint(3, 8), rng.choice([12, 18, 24, 30, 36])
    made = batches * per
    sold_frac = rng.choice([Fraction(1, 2), Fraction(2, 3), Fraction(3, 4), Fraction(5, 6)])
    sold = made * sold_frac
    while sold.denominator != 1:
        per += 6
        made = batches * per
        sold = made * sold_frac
    eaten = rng.randint(2, 9)
    text = (
        f"A bakery bakes {batches} batches of {per} cookies. It sells {frac_text(sold_frac)} of "
        f"the cookies, and the staff eat {eaten}. How many cookies are left?"
    )
    return text, made - sold - eaten


ARITHMETIC: list[tuple[str, Maker]] = [
    ("shopping_change", shopping_change),
    ("wages_left", wages_left),
    ("fraction_of_group", fraction_of_group),
    ("fraction_sum", fraction_sum),
    ("fraction_difference", fraction_difference),
    ("fraction_scale", fraction_scale),
    ("percent_discount", percent_discount),
    ("percent_of", percent_of_town),
    ("percent_change", percent_change),
    ("average_missing", average_missing),
    ("ratio_split", ratio_split),
    ("trip_distance", trip_distance),
    ("unit_price", unit_price),
    ("bakery", bakery),
]

# --- algebra ------------------------------------------------------------------------------------


def term(coef: int, var: str = "x", first: bool = False) -> str:
    """``coef*var`` as it is written in an equation: "3x", "- x", "+ 2x"."""
    mag = "" if abs(coef) == 1 else str(abs(coef))
    if first:
        return f"{'-' if coef < 0 else ''}{mag}{var}"
    return f"{'-' if coef < 0 else '+'} {mag}{var}"


def const(c: int) -> str:
    return f"{'-' if c < 0 else '+'} {abs(c)}"


def nonzero(rng: random.Random, lo: int, hi: int) -> int:
    while True:
        v = rng.randint(lo, hi)
        if v != 0:
            return v


def linear_one(rng: random.Random) -> Problem:
    a = nonzero(rng, -9, 12)
    b = nonzero(rng, -20, 20)
    if rng.random() < 0.6:
        x = Fraction(rng.randint(-12, 15))
        c = a * x + b
    else:
        c = Fraction(rng.randint(-30, 30))
        x = (c - b) / a
    text = f"Solve for x: {term(a, first=True)} {const(b)} = {fmt(c)}."
    return text, x


def linear_both_sides(rng: random.Random) -> Problem:
    while True:
        a, c = nonzero(rng, -8, 10), nonzero(rng, -8, 10)
        if a != c:
            break
    b, d = rng.randint(-20, 20), rng.randint(-20, 20)
    if b == d:
        d += 1
    x = Fraction(d - b, a - c)
    left = term(a, first=True) + (f" {const(b)}" if b else "")
    right = term(c, first=True) + (f" {const(d)}" if d else "")
    text = f"Find x if {left} = {right}."
    return text, x


def number_puzzle(rng: random.Random) -> Problem:
    n = rng.randint(-10, 30)
    k, add = rng.randint(2, 9), rng.randint(1, 40)
    result = k * n + add
    if rng.random() < 0.5:
        text = (
            f"When a number is multiplied by {k} and then {add} is added, the result is {result}. "
            "What is the number?"
        )
    else:
        text = (
            f"I think of a number, multiply it by {k}, add {add}, and get {result}. "
            "What number did I think of?"
        )
    return text, Fraction(n)


def consecutive_integers(rng: random.Random) -> Problem:
    count = rng.choice([3, 4, 5])
    step = rng.choice([1, 2])
    first = rng.randint(-5, 60)
    if step == 2:
        first = 2 * (first // 2) + rng.choice([0, 1])
    total = sum(first + step * i for i in range(count))
    kind = (
        "consecutive integers"
        if step == 1
        else ("consecutive even integers" if first % 2 == 0 else "consecutive odd integers")
    )
    ask = rng.choice(["smallest", "largest"])
    answer = first if ask == "smallest" else first + step * (count - 1)
    text = f"The sum of {count} {kind} is {total}. What is the {ask} of them?"
    return text, Fraction(answer)


def age_problem(rng: random.Random) -> Problem:
    while True:
        son, years, later = rng.randint(4, 15), rng.randint(2, 15), rng.choice([2, 3])
        mother = later * (son + years) - years
        if mother % son == 0 and mother // son >= 3 and 24 <= mother - son <= 40:
            break
    k = mother // son
    text = (
        f"A mother is {k} times as old as her son. In {years} years she will be {later} times "
        "as old as he will be then. How old is the son now?"
    )
    return text, Fraction(son)


def system_two(rng: random.Random) -> Problem:
    while True:
        x, y = rng.randint(-8, 12), rng.randint(-8, 12)
        a1, b1, a2, b2 = (nonzero(rng, -6, 7) for _ in range(4))
        if a1 * b2 - a2 * b1 != 0:
            break
    c1, c2 = a1 * x + b1 * y, a2 * x + b2 * y
    ask, answer = rng.choice([("x", x), ("y", y), ("x + y", x + y), ("x - y", x - y)])
    text = (
        f"Solve the system {term(a1, first=True)} {term(b1, 'y')} = {c1} and "
        f"{term(a2, first=True)} {term(b2, 'y')} = {c2}. What is the value of {ask}?"
    )
    return text, Fraction(answer)


def tickets(rng: random.Random) -> Problem:
    adult, child = rng.randint(8, 20), rng.randint(3, 7)
    n_adult, n_child = rng.randint(20, 200), rng.randint(20, 200)
    revenue = adult * n_adult + child * n_child
    ask, answer = rng.choice([("adult", n_adult), ("child", n_child)])
    text = (
        f"A theater sells adult tickets for ${adult} and child tickets for ${child}. One evening "
        f"it sold {n_adult + n_child} tickets for a total of ${revenue}. "
        f"How many {ask} tickets were sold?"
    )
    return text, Fraction(answer)


def coins(rng: random.Random) -> Problem:
    (v1, c1), (v2, c2) = rng.sample([(5, "nickels"), (10, "dimes"), (25, "quarters")], 2)
    n1, n2 = rng.randint(3, 40), rng.randint(3, 40)
    cents = v1 * n1 + v2 * n2
    ask, answer = rng.choice([(c1, n1), (c2, n2)])
    text = (
        f"A jar holds only {c1} and {c2}: {n1 + n2} coins worth {cents} cents in all. "
        f"How many {ask} are in the jar?"
    )
    return text, Fraction(answer)


def quadratic_text(a: int, b: int, c: int) -> str:
    s = term(a, "x^2", first=True)
    if b:
        s += f" {term(b)}"
    if c:
        s += f" {const(c)}"
    return s + " = 0"


def quadratic_positive_root(rng: random.Random) -> Problem:
    r, s = rng.randint(1, 12), -rng.randint(1, 12)
    a = rng.choice([1, 1, 1, 2, 3])
    b, c = -a * (r + s), a * r * s
    text = (
        f"The equation {quadratic_text(a, b, c)} has one positive and one negative root. "
        "What is the positive root?"
    )
    return text, Fraction(r)


def quadratic_sum(rng: random.Random) -> Problem:
    # (p x - q)(x - s) = 0 with roots q/p and s; ask for their sum (or product).
    while True:
        p, q, s = rng.choice([1, 2, 3]), rng.randint(-9, 9), rng.randint(-9, 9)
        if q != 0 and s != 0 and Fraction(q, p) != s:
            break
    a, b, c = p, -(q + p * s), q * s
    if rng.random() < 0.7:
        text = f"What is the sum of the roots of {quadratic_text(a, b, c)}?"
        return text, Fraction(q, p) + s
    text = f"What is the product of the roots of {quadratic_text(a, b, c)}?"
    return text, Fraction(q, p) * s


def rectangle_area(rng: random.Random) -> Problem:
    width, extra = rng.randint(2, 15), rng.randint(1, 9)
    area = width * (width + extra)
    ask, answer = rng.choice([("width", width), ("length", width + extra)])
    text = (
        f"A rectangle is {extra} cm longer than it is wide, and its area is {area} square cm. "
        f"What is its {ask}, in cm?"
    )
    return text, Fraction(answer)


ALGEBRA: list[tuple[str, Maker]] = [
    ("linear_equation", linear_one),
    ("linear_both_sides", linear_both_sides),
    ("number_puzzle", number_puzzle),
    ("consecutive_integers", consecutive_integers),
    ("age_problem", age_problem),
    ("linear_system", system_two),
    ("ticket_system", tickets),
    ("coin_system", coins),
    ("quadratic_positive_root", quadratic_positive_root),
    ("quadratic_roots_sum_product", quadratic_sum),
    ("quadratic_rectangle", rectangle_area),
]


def generate(seed: int = SEED) -> list[dict[str, str]]:
    rng = random.Random(seed)
    rows: list[dict[str, str]] = []
    seen: set[str] = set()
    for level, makers, count in (
        ("arithmetic", ARITHMETIC, N_ARITHMETIC),
        ("algebra", ALGEBRA, N_ALGEBRA),
    ):
        for i in range(count):
            kind, make = makers[i % len(makers)]
            for _ in range(100):
                problem, answer = make(rng)
                if problem not in seen:
                    break
            else:
                raise RuntimeError(f"{kind}: no new problem in 100 tries")
            seen.add(problem)
            rows.append({"problem": problem, "answer": fmt(answer), "level": level, "kind": kind})
    rng.shuffle(rows)
    for i, row in enumerate(rows, 1):
        row["data_source"] = "math"
        row["instance_id"] = f"math-gen-{i:04d}"
    return rows


def main() -> int:
    return write_or_check(__doc__.splitlines()[0], OUT, generate, "problems")


if __name__ == "__main__":
    sys.exit(main())

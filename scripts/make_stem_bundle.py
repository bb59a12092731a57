"""Generate raas/tasks/data/stem_bundle.jsonl: 120 physics and chemistry questions.

Each question comes from a formula with known inputs, and the answer is computed here. Half are
multiple choice (A-D, exactly one correct; the three distractors are what common mistakes give:
a forgotten 1/2, Celsius for kelvin, an inverted ratio, a missed unit conversion, ...), half ask
for a number in a given unit (checked within a relative tolerance). Deterministic: a fixed seed,
keys sorted, one JSON object a line.

    python scripts/make_stem_bundle.py            # write the file
    python scripts/make_stem_bundle.py --check    # exit 1 if the file is not what this writes

Fields: data_source ("stem"), instance_id ("stem-gen-0001"...), question, kind ("choice" or
"numeric"), topic; for choice: choices ({"A": "12.5 m/s", ...}) and answer (the letter); for
numeric: answer (a float), unit, rel_tol (0.01).
"""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bundle_io import write_or_check

SEED = 20240612
N_CHOICE = 60
N_NUMERIC = 60
REL_TOL = 0.01
OUT = Path(__file__).resolve().parents[1] / "raas" / "tasks" / "data" / "stem_bundle.jsonl"

G = 9.81  # m/s^2
R_KPA = 8.314  # L*kPa/(mol*K)
ATOMIC_MASS = {"H": 1.008, "C": 12.011, "N": 14.007, "O": 15.999, "Na": 22.990, "Cl": 35.45}
ATOMIC_MASS.update({"Ca": 40.078, "S": 32.06, "K": 39.098, "Mg": 24.305})
# (name, formula as shown, {element: count})
COMPOUNDS = [
    ("water", "H2O", {"H": 2, "O": 1}),
    ("carbon dioxide", "CO2", {"C": 1, "O": 2}),
    ("sodium chloride", "NaCl", {"Na": 1, "Cl": 1}),
    ("glucose", "C6H12O6", {"C": 6, "H": 12, "O": 6}),
    ("ammonia", "NH3", {"N": 1, "H": 3}),
    ("methane", "CH4", {"C": 1, "H": 4}),
    ("calcium carbonate", "CaCO3", {"Ca": 1, "C": 1, "O": 3}),
    ("sulfuric acid", "H2SO4", {"H": 2, "S": 1, "O": 4}),
    ("potassium chloride", "KCl", {"K": 1, "Cl": 1}),
    ("magnesium oxide", "MgO", {"Mg": 1, "O": 1}),
    ("ethanol", "C2H5OH", {"C": 2, "H": 6, "O": 1}),
    ("oxygen gas", "O2", {"O": 2}),
]


@dataclass(frozen=True)
class Item:
    topic: str
    question: str
    value: float
    unit: str
    distractors: tuple[float, ...]


Maker = Callable[[random.Random], Item]


def pick(rng: random.Random, lo: float, hi: float, step: float) -> float:
    """A random multiple of ``step`` in [lo, hi], rounded to the step's decimals."""
    n = rng.randint(round(lo / step), round(hi / step))
    decimals = max(0, -math.floor(math.log10(step))) if step < 1 else 0
    return round(n * step, decimals)


def num(x: float) -> str:
    """A number as the question shows it: no trailing zeros, no float noise."""
    return f"{x:.6g}"


def a_num(x: float, capital: bool = False) -> str:
    """``x`` with its indefinite article: "a 16", "an 80", "an 11", "an 8.5"."""
    s = num(x)
    whole = s.split(".")[0]
    vowel = whole.startswith("8") or (whole[:2] in ("11", "18") and len(whole) in (2, 5))
    article = "an" if vowel else "a"
    return f"{article.capitalize() if capital else article} {s}"


def molar_mass(counts: dict[str, int]) -> float:
    return sum(ATOMIC_MASS[e] * n for e, n in counts.items())


# --- physics ------------------------------------------------------------------------------------


def final_velocity(rng: random.Random) -> Item:
    u, a, t = pick(rng, 1, 20, 0.5), pick(rng, 0.5, 6, 0.5), pick(rng, 2, 12, 1)
    q = (
        f"A cart moving at {num(u)} m/s speeds up with a constant acceleration of {num(a)} m/s^2 "
        f"for {num(t)} s. What is its final speed?"
    )
    return Item("kinematics", q, u + a * t, "m/s", (a * t, u + 0.5 * a * t, u * a * t))


def distance_from_rest(rng: random.Random) -> Item:
    a, t = pick(rng, 0.5, 8, 0.5), pick(rng, 2, 15, 1)
    q = (
        f"A car starts from rest and accelerates uniformly at {num(a)} m/s^2 for {num(t)} s. "
        "How far does it travel in that time?"
    )
    return Item("kinematics", q, 0.5 * a * t * t, "m", (a * t * t, 0.5 * a * t, a * t))


def free_fall_speed(rng: random.Random) -> Item:
    h = pick(rng, 2, 80, 1)
    q = (
        f"A stone is dropped from rest from a height of {num(h)} m. Ignoring air resistance and "
        f"taking g = {G} m/s^2, how fast is it moving just before it hits the ground?"
    )
    v = math.sqrt(2 * G * h)
    return Item("kinematics", q, v, "m/s", (G * h, math.sqrt(G * h), 2 * G * h))


def average_speed(rng: random.Random) -> Item:
    while True:
        d = pick(rng, 20, 120, 10)
        v1, v2 = pick(rng, 20, 60, 10), pick(rng, 40, 120, 10)
        if v1 != v2:
            break
    q = (
        f"A cyclist rides {num(d)} km at {num(v1)} km/h and then returns the same {num(d)} km at "
        f"{num(v2)} km/h. What is the average speed for the whole round trip?"
    )
    t = d / v1 + d / v2
    return Item("kinematics", q, 2 * d / t, "km/h", ((v1 + v2) / 2, d / t, abs(v2 - v1)))


def kmh_to_ms(rng: random.Random) -> Item:
    v = pick(rng, 18, 180, 6)
    q = f"A train travels at {num(v)} km/h. What is this speed in meters per second?"
    return Item("units", q, v / 3.6, "m/s", (v * 3.6, v / 60, v * 1000 / 60))


def ohm_current(rng: random.Random) -> Item:
    v, r = pick(rng, 1.5, 24, 1.5), pick(rng, 2, 200, 2)
    q = (
        f"{a_num(v, capital=True)} V battery is connected across {a_num(r)} ohm resistor. "
        "What current flows?"
    )
    return Item("circuits", q, v / r, "A", (v * r, r / v, v / r * 1000))


def ohm_voltage(rng: random.Random) -> Item:
    i, r = pick(rng, 0.1, 5, 0.1), pick(rng, 5, 500, 5)
    q = (
        f"A current of {num(i)} A flows through {a_num(r)} ohm resistor. "
        "What is the voltage across it?"
    )
    return Item("circuits", q, i * r, "V", (i / r, r / i, i * r * r))


def electric_power(rng: random.Random) -> Item:
    i, r = pick(rng, 0.5, 6, 0.5), pick(rng, 2, 60, 2)
    q = (
        f"A current of {num(i)} A flows through {a_num(r)} ohm heater. "
        "How much power does it dissipate?"
    )
    return Item("circuits", q, i * i * r, "W", (i * r, i * r * r, 0.5 * i * i * r))


def parallel_resistance(rng: random.Random) -> Item:
    r1, r2 = pick(rng, 2, 100, 2), pick(rng, 2, 100, 2)
    if r1 == r2:
        r2 += 4
    q = (
        f"Resistors of {num(r1)} ohm and {num(r2)} ohm are connected in parallel. "
        "What is the equivalent resistance?"
    )
    rp = r1 * r2 / (r1 + r2)
    return Item("circuits", q, rp, "ohm", (r1 + r2, (r1 + r2) / 2, 1 / r1 + 1 / r2))


def density(rng: random.Random) -> Item:
    m, v = pick(rng, 10, 900, 5), pick(rng, 5, 400, 5)
    q = f"A block has a mass of {num(m)} g and a volume of {num(v)} cm^3. What is its density?"
    return Item("density", q, m / v, "g/cm^3", (v / m, m * v, m / v * 1000))


def mass_from_density(rng: random.Random) -> Item:
    rho, v = pick(rng, 0.5, 11, 0.1), pick(rng, 0.2, 5, 0.1)
    q = (
        f"A liquid has a density of {num(rho)} g/cm^3. What is the mass of {num(v)} L of it, "
        "in kilograms? (1 L = 1000 cm^3)"
    )
    return Item("density", q, rho * v, "kg", (rho * v * 1000, rho / v, v / rho))


def kinetic_energy(rng: random.Random) -> Item:
    m, v = pick(rng, 0.5, 1500, 0.5), pick(rng, 1, 40, 1)
    q = f"What is the kinetic energy of {a_num(m)} kg object moving at {num(v)} m/s?"
    return Item("energy", q, 0.5 * m * v * v, "J", (m * v * v, 0.5 * m * v, m * v))


def potential_energy(rng: random.Random) -> Item:
    m, h = pick(rng, 0.5, 120, 0.5), pick(rng, 1, 60, 1)
    q = (
        f"{a_num(m, capital=True)} kg crate is lifted {num(h)} m straight up. Taking g = {G} "
        "m/s^2, by how much does its gravitational potential energy increase?"
    )
    return Item("energy", q, m * G * h, "J", (m * h, 0.5 * m * G * h, m * G / h))


def momentum(rng: random.Random) -> Item:
    m, v = pick(rng, 0.1, 90, 0.1), pick(rng, 0.5, 30, 0.5)
    q = f"What is the magnitude of the momentum of {a_num(m)} kg ball moving at {num(v)} m/s?"
    return Item("mechanics", q, m * v, "kg*m/s", (0.5 * m * v * v, m / v, m * v * v))


def force_newton(rng: random.Random) -> Item:
    m, a = pick(rng, 0.5, 2000, 0.5), pick(rng, 0.2, 9, 0.2)
    q = f"What net force gives {a_num(m)} kg object an acceleration of {num(a)} m/s^2?"
    return Item("mechanics", q, m * a, "N", (m / a, a / m, m * a * G))


def pressure(rng: random.Random) -> Item:
    f, a_cm2 = pick(rng, 10, 5000, 10), pick(rng, 2, 500, 2)
    q = (
        f"A force of {num(f)} N presses evenly on an area of {num(a_cm2)} cm^2. What pressure does "
        "it exert, in pascals?"
    )
    a = a_cm2 / 1e4
    return Item("mechanics", q, f / a, "Pa", (f / a_cm2, f / (a_cm2 / 100), f * a))


def hooke(rng: random.Random) -> Item:
    k, x_cm = pick(rng, 20, 800, 10), pick(rng, 1, 30, 0.5)
    q = (
        f"A spring with a spring constant of {num(k)} N/m is stretched by {num(x_cm)} cm. "
        "What force does the spring exert?"
    )
    x = x_cm / 100
    return Item("mechanics", q, k * x, "N", (k * x_cm, k / x, 0.5 * k * x * x))


def wavelength(rng: random.Random) -> Item:
    f_mhz = pick(rng, 80, 1000, 0.5)
    c = 3.0e8
    q = (
        f"A radio station broadcasts at {num(f_mhz)} MHz. Taking the speed of light as "
        "3.0 x 10^8 m/s, what is the wavelength of its signal?"
    )
    f = f_mhz * 1e6
    return Item("waves", q, c / f, "m", (c / f_mhz, f / c, c * f / 1e12))


def power_work(rng: random.Random) -> Item:
    w, t = pick(rng, 100, 90000, 50), pick(rng, 2, 300, 1)
    q = f"A motor does {num(w)} J of work in {num(t)} s. What is its average power output?"
    return Item("energy", q, w / t, "W", (w * t, t / w, w / (t * 60)))


# --- chemistry ----------------------------------------------------------------------------------


def moles_from_mass(rng: random.Random) -> Item:
    name, formula, counts = rng.choice(COMPOUNDS)
    mm = molar_mass(counts)
    grams = pick(rng, 1, 500, 0.5)
    q = (
        f"How many moles are in {num(grams)} g of {name} ({formula})? Use atomic masses "
        + ", ".join(f"{e} = {ATOMIC_MASS[e]}" for e in counts)
        + "."
    )
    # A misread formula: every subscript taken as 1 (for NaCl, a hydrogen too many).
    careless = molar_mass(dict.fromkeys(counts, 1))
    wrong_mm = careless if abs(careless - mm) > 1e-9 else mm + ATOMIC_MASS["H"]
    return Item("stoichiometry", q, grams / mm, "mol", (mm / grams, grams * mm, grams / wrong_mm))


def mass_from_moles(rng: random.Random) -> Item:
    name, formula, counts = rng.choice(COMPOUNDS)
    mm = molar_mass(counts)
    n = pick(rng, 0.05, 12, 0.05)
    q = (
        f"What is the mass of {num(n)} mol of {name} ({formula})? Use atomic masses "
        + ", ".join(f"{e} = {ATOMIC_MASS[e]}" for e in counts)
        + "."
    )
    careless = molar_mass(dict.fromkeys(counts, 1))
    wrong_mm = careless if abs(careless - mm) > 1e-9 else mm + ATOMIC_MASS["H"]
    return Item("stoichiometry", q, n * mm, "g", (n / mm, mm / n, n * wrong_mm))


def molarity(rng: random.Random) -> Item:
    n, ml = pick(rng, 0.01, 2, 0.01), pick(rng, 50, 2000, 25)
    q = (
        f"{num(n)} mol of a salt is dissolved to make {num(ml)} mL of solution. "
        "What is its molarity?"
    )
    return Item("solutions", q, n / (ml / 1000), "mol/L", (n / ml, ml / 1000 / n, n * ml / 1000))


def gas_pressure(rng: random.Random) -> Item:
    n, t_c, v = pick(rng, 0.1, 5, 0.1), pick(rng, -20, 150, 5), pick(rng, 1, 50, 0.5)
    t = t_c + 273.15
    q = (
        f"{num(n)} mol of an ideal gas is held in {a_num(v)} L container at {num(t_c)} degrees "
        f"Celsius. Using R = {R_KPA} L*kPa/(mol*K), what is the gas pressure, in kPa?"
    )
    p = n * R_KPA * t / v
    # Celsius for kelvin (not positive at or below 0 C, so then left out), R in L*atm units,
    # V multiplied instead of divided.
    wrong_c = n * R_KPA * t_c / v
    return Item("gas laws", q, p, "kPa", (wrong_c, n * 0.08206 * t / v, n * R_KPA * t * v))


def gas_volume(rng: random.Random) -> Item:
    n, t_c, p = pick(rng, 0.1, 4, 0.1), pick(rng, 0, 120, 5), pick(rng, 50, 400, 10)
    t = t_c + 273.15
    q = (
        f"What volume does {num(n)} mol of an ideal gas occupy at {num(t_c)} degrees Celsius and "
        f"{num(p)} kPa? Use R = {R_KPA} L*kPa/(mol*K)."
    )
    v = n * R_KPA * t / p
    wrong_c = n * R_KPA * t_c / p
    return Item("gas laws", q, v, "L", (wrong_c, p / (n * R_KPA * t), n * R_KPA * t * p / 1000))


def heat_energy(rng: random.Random) -> Item:
    m, dt = pick(rng, 50, 2000, 10), pick(rng, 2, 80, 1)
    c = 4.18
    q = (
        f"How much heat, in joules, raises the temperature of {num(m)} g of water by {num(dt)} "
        f"degrees Celsius? The specific heat of water is {c} J/(g*K)."
    )
    return Item("thermochemistry", q, m * c * dt, "J", (m * dt, m * c / dt, m * c * (dt + 273.15)))


MAKERS: list[Maker] = [
    final_velocity,
    distance_from_rest,
    free_fall_speed,
    average_speed,
    kmh_to_ms,
    ohm_current,
    ohm_voltage,
    electric_power,
    parallel_resistance,
    density,
    mass_from_density,
    kinetic_energy,
    potential_energy,
    momentum,
    force_newton,
    pressure,
    hooke,
    wavelength,
    power_work,
    moles_from_mass,
    mass_from_moles,
    molarity,
    gas_pressure,
    gas_volume,
    heat_energy,
]


def sig(x: float, digits: int = 3) -> float:
    """``x`` rounded to ``digits`` significant figures."""
    if x == 0 or not math.isfinite(x):
        return x
    return round(x, digits - 1 - math.floor(math.log10(abs(x))))


def show(x: float, unit: str) -> str:
    """An option's text: 3 significant figures; "x 10^n" outside 0.001..999999."""
    x = sig(x)
    if x != 0 and not 1e-3 <= abs(x) < 1e6:
        exp = math.floor(math.log10(abs(x)))
        mant = x / 10**exp
        return f"{mant:.2f} x 10^{exp} {unit}"
    s = f"{x:.3g}" if abs(x) < 1000 else f"{round(x):d}"
    if "e" in s:
        s = f"{x:f}".rstrip("0").rstrip(".")
    return f"{s} {unit}"


def options(item: Item) -> list[str] | None:
    """The correct option first, then three distractors; None if they cannot be told apart."""
    correct = show(item.value, item.unit)
    chosen = [correct]
    values = [item.value]
    extras = (item.value * 2, item.value / 2, item.value * 10, item.value / 10)
    for d in (*item.distractors, *extras):
        if len(chosen) == 4:
            break
        if not math.isfinite(d) or d <= 0:
            continue
        # Far enough from every option that no tolerance check could confuse them.
        if any(math.isclose(d, v, rel_tol=0.05) for v in values):
            continue
        text = show(d, item.unit)
        if text in chosen:
            continue
        chosen.append(text)
        values.append(d)
    return chosen if len(chosen) == 4 else None


def generate(seed: int = SEED) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    positions = [i % 4 for i in range(N_CHOICE)]
    rng.shuffle(positions)
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i in range(N_CHOICE + N_NUMERIC):
        kind = "choice" if i % 2 == 0 else "numeric"
        make = MAKERS[(i // 2) % len(MAKERS) if kind == "choice" else (i // 2 + 7) % len(MAKERS)]
        for _ in range(100):
            item = make(rng)
            opts = options(item) if kind == "choice" else None
            if item.question not in seen and (kind == "numeric" or opts is not None):
                break
        else:
            raise RuntimeError(f"{make.__name__}: no usable question in 100 tries")
        seen.add(item.question)
        row: dict[str, Any] = {"kind": kind, "question": item.question, "topic": item.topic}
        if opts is not None:
            right, wrong = opts[0], opts[1:]
            rng.shuffle(wrong)
            pos = positions.pop()
            ordered = [*wrong[:pos], right, *wrong[pos:]]
            letters = "ABCD"
            row["choices"] = dict(zip(letters, ordered, strict=True))
            row["answer"] = letters[pos]
        else:
            row["answer"] = sig(item.value, 6)
            row["unit"] = item.unit
            row["rel_tol"] = REL_TOL
        rows.append(row)
    rng.shuffle(rows)
    for i, row in enumerate(rows, 1):
        row["data_source"] = "stem"
        row["instance_id"] = f"stem-gen-{i:04d}"
    return rows


def main() -> int:
    return write_or_check(__doc__.splitlines()[0], OUT, generate, "questions")


if __name__ == "__main__":
    sys.exit(main())

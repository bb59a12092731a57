"""Hidden tests of the spans package in /app (the agent never sees them).

Besides the reported case, they compare every function with a brute-force model (the set of
covered integer points) over many deterministic pseudo-random inputs, so a fix that only
special-cases the example does not pass.
"""

import random
import sys

import pytest

sys.path.insert(0, "/app")

from spans import covers, gaps, merge, normalize, total_length


def points(intervals):
    return {p for start, end in intervals for p in range(start, end)}


def runs(point_set):
    """The maximal runs of consecutive points, as half-open intervals."""
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


def test_reported_case():
    booked = [(9, 17), (10, 11)]
    assert merge(booked) == [(9, 17)]
    assert total_length(booked) == 8
    assert covers(booked, 14)
    assert gaps(booked, 0, 24) == [(0, 9), (17, 24)]


def test_merge_nested_chain():
    assert merge([(0, 100), (5, 10), (20, 30), (99, 120)]) == [(0, 120)]


def test_merge_interval_inside_then_touching():
    assert merge([(0, 10), (2, 3), (10, 12)]) == [(0, 12)]


def test_merge_same_start():
    assert merge([(3, 9), (3, 4)]) == [(3, 9)]


def test_merge_returns_tuples_and_drops_empty():
    result = merge([[4, 6], [1, 1], [2, 3]])
    assert result == [(2, 3), (4, 6)]
    assert all(type(item) is tuple for item in result)


def test_reversed_interval_still_refused():
    with pytest.raises(ValueError):
        merge([(1, 5), (9, 2)])
    with pytest.raises(ValueError):
        gaps([], 5, 1)


def test_existing_behaviour_kept():
    assert normalize([(1, 1), (2, 5)]) == [(2, 5)]
    assert merge([(1, 3), (3, 5)]) == [(1, 5)]
    assert merge([(7, 9), (1, 3)]) == [(1, 3), (7, 9)]
    assert gaps([(2, 4), (6, 7)], 0, 10) == [(0, 2), (4, 6), (7, 10)]
    assert gaps([(0, 10)], 3, 5) == []
    assert not covers([(2, 4)], 4)
    assert total_length([]) == 0


def test_merge_matches_model():
    for intervals in random_cases(1):
        assert merge(intervals) == runs(points(intervals)), intervals


def test_total_length_matches_model():
    for intervals in random_cases(2):
        assert total_length(intervals) == len(points(intervals)), intervals


def test_gaps_match_model():
    rng = random.Random(3)
    for intervals in random_cases(4):
        lo = rng.randint(0, 30)
        hi = lo + rng.randint(0, 30)
        expected = runs(set(range(lo, hi)) - points(intervals))
        assert gaps(intervals, lo, hi) == expected, (intervals, lo, hi)


def test_covers_matches_model():
    for intervals in random_cases(5, count=100):
        covered = points(intervals)
        for p in range(-1, 58):
            assert covers(intervals, p) == (p in covered), (intervals, p)

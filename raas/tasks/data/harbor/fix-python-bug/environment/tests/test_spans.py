import pytest
from spans import covers, gaps, merge, normalize, total_length


def test_normalize_drops_empty_intervals():
    assert normalize([(1, 1), (2, 5)]) == [(2, 5)]


def test_normalize_refuses_reversed_interval():
    with pytest.raises(ValueError):
        normalize([(5, 2)])


def test_merge_keeps_disjoint_intervals_sorted():
    assert merge([(7, 9), (1, 3)]) == [(1, 3), (7, 9)]


def test_merge_joins_overlapping_intervals():
    assert merge([(1, 4), (3, 6)]) == [(1, 6)]


def test_merge_joins_touching_intervals():
    assert merge([(1, 3), (3, 5)]) == [(1, 5)]


def test_merge_of_nothing():
    assert merge([]) == []


def test_total_length():
    assert total_length([(0, 2), (1, 4), (10, 11)]) == 5


def test_gaps_in_window():
    assert gaps([(2, 4), (6, 7)], 0, 10) == [(0, 2), (4, 6), (7, 10)]


def test_gaps_window_inside_an_interval():
    assert gaps([(0, 10)], 3, 5) == []


def test_covers_is_half_open():
    assert covers([(2, 4)], 2)
    assert not covers([(2, 4)], 4)

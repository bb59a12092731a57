import pytest
from stats import mean, median, spread


def test_mean():
    assert mean([1, 2, 3, 4]) == 2.5


def test_median_of_an_odd_count():
    assert median([5, 1, 3]) == 3


def test_median_of_an_even_count():
    assert median([4, 1, 3, 2]) == 2.5


class TestSpread:
    def test_spread(self):
        assert spread([3, 9, 4]) == 6

    def test_nothing_has_no_mean(self):
        with pytest.raises(ValueError):
            mean([])

"""Operations on half-open integer intervals [start, end), given as (start, end) pairs."""


def normalize(intervals):
    """Returns the intervals as a list of (start, end) tuples, without the empty ones.

    Raises ValueError for an interval whose end is before its start.
    """
    result = []
    for start, end in intervals:
        if end < start:
            raise ValueError(f"interval ({start}, {end}) ends before it starts")
        if end > start:
            result.append((start, end))
    return result


def merge(intervals):
    """Merges overlapping and touching intervals; returns them sorted by start.

    The result covers exactly the points that the given intervals cover, with as few
    intervals as possible.
    """
    merged = []
    for start, end in sorted(normalize(intervals)):
        if merged and start <= merged[-1][1]:
            # Overlaps or touches the previous one: extend it.
            merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def total_length(intervals):
    """The number of integer points covered by at least one of the intervals."""
    return sum(end - start for start, end in merge(intervals))


def gaps(intervals, lo, hi):
    """The parts of [lo, hi) that none of the intervals covers, sorted."""
    if hi < lo:
        raise ValueError(f"window ({lo}, {hi}) ends before it starts")
    result = []
    cursor = lo
    for start, end in merge(intervals):
        if end <= cursor:
            continue
        if start >= hi:
            break
        if start > cursor:
            result.append((cursor, start))
        cursor = end
    if cursor < hi:
        result.append((cursor, hi))
    return result


def covers(intervals, point):
    """Whether one of the intervals contains the point."""
    return any(start <= point < end for start, end in merge(intervals))

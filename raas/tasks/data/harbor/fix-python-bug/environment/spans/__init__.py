"""Half-open integer intervals [start, end): merging, coverage, gaps."""

from spans.core import covers, gaps, merge, normalize, total_length

__all__ = ["covers", "gaps", "merge", "normalize", "total_length"]

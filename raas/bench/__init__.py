"""Benchmarks: `raas bench NAME` runs `raas.bench.NAME.main(argv)`. Each prints medians and ratios
against a baseline measured in the same run, and never asserts."""

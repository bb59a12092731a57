"""`raas bench images` without running it: its options, its report (80 columns, the ratios it
prints from given figures) and the one line it prints where what it needs is missing. The bench
itself (`make bench-images`) is not run here: it prints figures and asserts nothing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from raas.bench import images, oci_fixtures
from raas.cli import main
from raas.cli.bench import known
from raas.images.store import StoreUsage


def test_it_is_a_benchmark_and_its_fixtures_are_not() -> None:
    assert "images" in known()
    assert "oci_fixtures" not in known()


def test_options_default_and_refuse_what_measures_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = images.parse([])
    assert (args.images, args.rounds, args.starts) == (3, 3, 20)
    assert images.parse(["--images", "5", "--starts", "4"]).images == 5
    with pytest.raises(SystemExit):
        images.parse(["--images", "1"])  # nothing would share a layer
    assert "--images >= 2" in capsys.readouterr().err


def test_the_report_fits_80_columns_and_gives_the_ratios() -> None:
    pulls = images.Pulls(
        store=[[4.0, 0.2, 0.2], [5.0, 0.3, 0.1]],
        copy=[[0.5, 0.1, 0.1], [0.5, 0.1, 0.1]],
        untar=[1.0, 2.0],
        layers=[2, 2, 2],
    )
    usage = StoreUsage(
        images=3, layers=4, layer_bytes=100 << 20, unshared_bytes=300 << 20, blob_bytes=40 << 20
    )
    starts = images.Starts(image=[0.15, 0.2, 0.3], plain=[0.1, 0.1, 0.2], bare=[0.02] * 3)
    pull = images.pull_report(pulls)
    disk = images.disk_report(usage)
    start = images.start_report(starts, "overlay")
    for line in pull + disk + start:
        assert len(line) <= images.WIDTH, line
    rows = {line.split("  ")[0]: line.split() for line in pull}
    assert rows["image 1 (all layers)"][-3:] == ["0.50", "s", "9.0x"]  # median 4.5 s / 0.5 s
    assert rows["all images"][-1] == "7.0x"  # median of the sums: 4.9 s / 0.7 s
    assert pull[-1].endswith("1.50 s: the store's unpack 2.7x tar")  # (4.5 - 0.5) / 1.5
    assert "sharing stores 3.00x less unpacked layer data" in disk
    assert "300.0 MiB" in disk[3] and "100.0 MiB" in disk[2]
    assert start[2].split()[-4:] == ["(overlay)", "200.0", "380.0", "2.00x"]
    assert start[3].endswith("1.00x")


def test_a_missing_tool_or_root_filesystem_is_one_line_naming_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAAS_CACHE_DIR", str(tmp_path))  # no root filesystem built there
    which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda n: None if n == "umoci" else which(n))
    result = CliRunner().invoke(main, ["bench", "images", "--", "--starts", "2"])
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert lines[0] == "$ raas bench images -- --starts 2"
    assert len(lines) == 2
    assert "umoci" in lines[1] and str(oci_fixtures.base_rootfs_dir()) in lines[1]
    assert "make test-images" in lines[1] and "skopeo" not in lines[1]

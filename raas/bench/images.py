"""`raas bench images`: task images from a registry through the image store into sandboxes.

Real images built offline with umoci on the image tier's Debian root filesystem (``--images`` of
them, each the shared base layer plus a /testbed layer of its own), pushed to Debian's
docker-registry on 127.0.0.1, then, in the same run:

- pull and unpack (``ImageStore.pull``: skopeo copy, digests verified, each layer unpacked
  once) into a fresh store, each round; the first image fetches and unpacks the base, the others
  find it there. Floor: skopeo's copy alone of the same images into a plain OCI layout, its blob
  directory shared the same way (no unpack); and GNU tar extracting the first image's layer
  blobs, against the store's unpack of them. Medians of ``--rounds`` rounds.
- disk for the images with layer sharing (each layer stored once) and without (each image its
  own copy), from ``ImageStore.usage()``, and the ratio;
- sandbox start from an image (resolve, hold, bwrap over a copy-on-write root of its layers,
  action server on the image's python3, bash) p50/p95, against raas's plain bwrap sandbox's cold
  start (the host's /usr) measured alternately in the same run (the floor), and bare bwrap
  running /bin/true.
Prints the command and the load; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from raas.bench import oci_fixtures
from raas.bench.tools import bare_bwrap, pct
from raas.images import manifests
from raas.images.layers import remove_tree, tree_bytes
from raas.images.sources import skopeo
from raas.images.store import ImageStore, StoreUsage
from raas.sandbox import BwrapConfig, create_sandbox
from raas.sandbox.rootfs import overlay_options

WIDTH = 80  # every line of the report fits


@dataclass(frozen=True)
class Pulls:
    """Seconds of each image's pull in each round (rounds x images), and of the floor's copy."""

    store: list[list[float]]
    copy: list[list[float]]
    untar: list[float]  # each round, GNU tar extracting the first image's layer blobs
    layers: list[int]  # each image's layers


@dataclass(frozen=True)
class Starts:
    """Seconds of each start, by kind."""

    image: list[float]
    plain: list[float]
    bare: list[float]


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Columns two spaces apart, the first left-aligned, the others right-aligned."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))
        return "  ".join([first, *rest]).rstrip()

    return [line(header), *(line(r) for r in rows)]


def mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def pull_report(pulls: Pulls) -> list[str]:
    rows = []
    for i, layers in enumerate(pulls.layers):
        store = statistics.median(r[i] for r in pulls.store)
        copy = statistics.median(r[i] for r in pulls.copy)
        what = "all layers" if i == 0 else "base shared"
        rows.append(
            [f"image {i + 1} ({what})", str(layers), f"{store:.2f} s", f"{copy:.2f} s"]
            + [f"{store / copy:.1f}x"]
        )
    total = statistics.median(sum(r) for r in pulls.store)
    floor = statistics.median(sum(r) for r in pulls.copy)
    rows.append(["all images", "", f"{total:.2f} s", f"{floor:.2f} s", f"{total / floor:.1f}x"])
    header = ["pull", "layers", "store", "copy only", "ratio"]
    first = statistics.median(r[0] for r in pulls.store) - statistics.median(
        r[0] for r in pulls.copy
    )
    untar = statistics.median(pulls.untar)
    return [
        f"pull + unpack into a fresh store, median of {len(pulls.store)} rounds; floor: skopeo",
        "copy alone (same blobs shared, no unpack):",
        *table(header, rows),
        f"image 1's unpack (store - copy only) {first:.2f} s; GNU tar -xf of its layer",
        f"blobs alone {untar:.2f} s: the store's unpack {first / untar:.1f}x tar",
    ]


def disk_report(usage: StoreUsage) -> list[str]:
    rows = [
        ["layers, shared (each stored once)", mib(usage.layer_bytes), str(usage.layers)],
        ["layers, not shared (a copy an image)", mib(usage.unshared_bytes), ""],
        ["blobs (compressed layers, manifests)", mib(usage.blob_bytes), ""],
    ]
    return [
        f"disk for {usage.images} images (ImageStore.usage()):",
        *table(["", "size", "layers"], rows),
        f"sharing stores {usage.share_ratio:.2f}x less unpacked layer data",
    ]


def start_report(starts: Starts, root: str) -> list[str]:
    floor = statistics.median(starts.plain)

    def row(name: str, values: list[float]) -> list[str]:
        p50, p95 = 1000 * statistics.median(values), 1000 * pct(values, 95)
        return [name, f"{p50:.1f}", f"{p95:.1f}", f"{statistics.median(values) / floor:.2f}x"]

    rows = [
        row(f"from the image ({root})", starts.image),
        row("plain bwrap sandbox (the floor)", starts.plain),
        row("bare bwrap, /bin/true", starts.bare),
    ]
    return [
        f"sandbox start, {len(starts.image)} of each, alternated (action server + bash ready):",
        *table(["start", "p50 ms", "p95 ms", "x floor"], rows),
    ]


def project_files(i: int, kib: int) -> dict[str, str | bytes]:
    """A /testbed of about ``kib`` KiB of Python source, its own per image."""
    line = f"def f{i}_{{n}}(x):\n    return x * {i} + {{n}}  # image {i}\n"
    files: dict[str, str | bytes] = {}
    for n in range(max(1, kib // 16)):
        body = "".join(line.format(n=k) for k in range(16 * 1024 // len(line)))
        files[f"/testbed/pkg{i}/mod{n}.py"] = body
    return files


def build(tmp: Path, reg: oci_fixtures.Registry, n: int, kib: int) -> list[str]:
    builder = oci_fixtures.ImageBuilder(tmp / "layout")
    rootfs = oci_fixtures.base_rootfs_dir()
    return [
        oci_fixtures.build_and_push(
            builder, reg, f"bench/repo-{i}:base", project_files(i, kib), rootfs
        )
        for i in range(n)
    ]


def timed_pulls(tmp: Path, refs: list[str], rounds: int) -> tuple[Pulls, ImageStore]:
    """Each round, the floor's copies and then a fresh store's pulls, so both see the same
    machine; the last round's store is kept (for its usage and the starts)."""
    store_rounds, copy_rounds, untars = [], [], []
    store = ImageStore(tmp / "store")
    layers: list[int] = []
    for r in range(rounds):
        copies = []
        (tmp / "copy").mkdir()
        for i, ref in enumerate(refs):
            start = time.perf_counter()
            skopeo.copy(
                f"docker://{ref}", tmp / "copy" / str(i), tmp / "copy/blobs", tls_verify=False
            )
            copies.append(time.perf_counter() - start)
        untars.append(untar(tmp / "copy" / "0", tmp / "copy" / "blobs", tmp / "copy" / "root"))
        remove_tree(tmp / "copy")
        copy_rounds.append(copies)
        remove_tree(store.root)
        pulls = []
        for ref in refs:
            start = time.perf_counter()
            image = store.pull(ref, tls_verify=False)
            pulls.append(time.perf_counter() - start)
            if r == 0:
                layers.append(len(image.layers))
        store_rounds.append(pulls)
    return Pulls(store_rounds, copy_rounds, untars, layers), store


def untar(layout: Path, blob_dir: Path, dest: Path) -> float:
    """Seconds GNU tar takes to extract the layer blobs of the image in ``layout`` into
    ``dest``, bottom first: a floor for the store's unpack (which also verifies digests and
    applies whiteouts)."""
    image = manifests.read_image(blob_dir, str(manifests.index_manifests(layout)[0]["digest"]))
    dest.mkdir()
    start = time.perf_counter()
    for layer in image.layers:
        blob = manifests.blob_path(blob_dir, layer.digest)
        # Not checked: rootless, tar cannot make the image's device nodes (nor can the store).
        subprocess.run(["tar", "-xf", str(blob), "-C", str(dest)], stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


async def timed_starts(store: ImageStore, ref: str, n: int) -> Starts:
    config = BwrapConfig()

    async def from_image() -> float:
        start = time.perf_counter()
        image = store.resolve(ref)
        sandbox = create_sandbox(config, image)
        sandbox.hold(store.in_use(image))
        await sandbox.start()
        took = time.perf_counter() - start
        await sandbox.close()
        return took

    async def plain() -> float:
        sandbox = create_sandbox(config)
        start = time.perf_counter()
        await sandbox.start()
        took = time.perf_counter() - start
        await sandbox.close()
        return took

    async def bare() -> float:
        start = time.perf_counter()
        await bare_bwrap(config, ["/bin/true"])
        return time.perf_counter() - start

    await from_image(), await plain()  # warm the page cache for both
    starts = Starts([], [], [])
    for _ in range(n):
        starts.image.append(await from_image())
        starts.plain.append(await plain())
        starts.bare.append(await bare())
    return starts


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.1f} (5 min {five:.1f}) on {os.cpu_count()} cores"


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="raas bench images", description=__doc__)
    parser.add_argument("--images", type=int, default=3, help="images on the one base (>= 2)")
    parser.add_argument("--layer-kib", type=int, default=512, help="each image's /testbed layer")
    parser.add_argument("--rounds", type=int, default=3, help="pull rounds, a fresh store each")
    parser.add_argument("--starts", type=int, default=20, help="sandbox starts of each kind")
    args = parser.parse_args(argv)
    if args.images < 2 or args.rounds < 1 or args.starts < 2:
        parser.error("--images >= 2, --rounds >= 1 and --starts >= 2")
    return args


def main(argv: list[str]) -> int:
    args = parse(argv)
    print(" ".join(["$ raas bench images", *(["--", shlex.join(argv)] if argv else [])]))
    lacks = oci_fixtures.missing()
    if lacks:
        print(f"raas bench images {lacks}")
        return 1
    root = "overlay" if overlay_options(os.geteuid() != 0) is not None else "copied layers"
    who = "root" if os.geteuid() == 0 else "rootless"
    print(f"{load()}; {who}, image roots: {root}")
    with tempfile.TemporaryDirectory(prefix="raas-bench-images-") as tmp_name:
        tmp = Path(tmp_name)
        with oci_fixtures.registry(tmp / "registry") as reg:
            start = time.perf_counter()
            refs = build(tmp, reg, args.images, args.layer_kib)
            print(
                f"{args.images} images (base {mib(tree_bytes(oci_fixtures.base_rootfs_dir()))}"
                f" + {args.layer_kib} KiB /testbed each) built and pushed to {reg.host}"
                f" in {time.perf_counter() - start:.0f} s"
            )
            pulls, store = timed_pulls(tmp, refs, args.rounds)
        remove_tree(tmp / "layout")  # the builder's blobs, no longer needed
        print()
        print("\n".join(pull_report(pulls)))
        print()
        print("\n".join(disk_report(store.usage())))
        print()
        starts = asyncio.run(timed_starts(store, refs[0], args.starts))
        print("\n".join(start_report(starts, root)))
        remove_tree(store.root)  # read-only layer directories: not for TemporaryDirectory
    print(load())
    return 0

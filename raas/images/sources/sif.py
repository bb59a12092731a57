"""Importing an Apptainer/Singularity ``.sif``: its primary squashfs partition as one layer.

A SIF (github.com/sylabs/sif) is a 128-byte header, a table of 585-byte descriptors and the
data objects they point at; the root filesystem is a data object of type partition, squashfs,
usually the primary system partition. ``unsquashfs -o OFFSET`` unpacks it straight from the
file. The layer is named by the sha256 of the partition's bytes; a config and a manifest written
here make it an ordinary image of the store (the partition itself is not kept as a blob: the
layer directory is what sandboxes use). Environment variables in the SIF's /.singularity.d are
not read.

As a layer of a tar is (``raas.images.layers``): the partition's listing (``unsquashfs
-lln``, its own tables: what it would write) is held to the caps before anything is unpacked;
it is unpacked without extended attributes (no file capability) into a partial directory that
no one else enters, where every mode is masked with 0755 and device nodes, FIFOs and sockets
are removed (``harden_tree``), before it is moved into place.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from raas.images import locks
from raas.images.layers import (
    Caps,
    Unpacked,
    harden_tree,
    layer_limits,
    remove_tree,
    write_sizes,
)
from raas.images.manifests import MANIFEST, blob_path

_HEADER = struct.Struct("<32s10s3s3s16sqqqqqqqq")  # launch, magic ... data offset, data size
_DESCRIPTOR = struct.Struct("<iBIIIqqqqqqq128s384s")
_PARTITION = 0x4004
_SQUASHFS = 1
_PRIMARY_SYSTEM = 2
LAYER_MEDIA_TYPE = "application/vnd.sylabs.sif.layer.v1.squashfs"
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"


class SifError(Exception):
    pass


@dataclass(frozen=True)
class Partition:
    offset: int
    size: int


def find_root_partition(path: Path) -> Partition:
    """The SIF's primary system squashfs partition (else its first squashfs partition)."""
    with open(path, "rb") as f:
        head = f.read(_HEADER.size)
        if len(head) < _HEADER.size:
            raise SifError("not a SIF file (too short)")
        fields = _HEADER.unpack(head)
        if fields[1].rstrip(b"\0") != b"SIF_MAGIC":
            raise SifError("not a SIF file (no SIF_MAGIC)")
        total, offset = fields[8], fields[9]
        f.seek(offset)
        table = f.read(total * _DESCRIPTOR.size)
    found = []
    for i in range(len(table) // _DESCRIPTOR.size):
        d = _DESCRIPTOR.unpack_from(table, i * _DESCRIPTOR.size)
        datatype, used, data_offset, size, extra = d[0], d[1], d[5], d[6], d[13]
        if not used or datatype != _PARTITION:
            continue
        fstype, parttype = struct.unpack_from("<ii", extra)
        if fstype == _SQUASHFS:
            found.append((parttype != _PRIMARY_SYSTEM, Partition(data_offset, size)))
    if not found:
        raise SifError("the SIF has no squashfs partition")
    return min(found, key=lambda pair: pair[0])[1]


def import_sif(
    path: Path, blob_dir: Path, layer_dir: Path, lock_dir: Path, caps: Caps | None = None
) -> dict[str, object]:
    """Unpack ``path``'s root partition as a layer (within ``caps``, default
    ``Caps.from_env()``) and write its config and manifest; the manifest's descriptor (for the
    store's index)."""
    if shutil.which("unsquashfs") is None:
        raise SifError("importing a .sif needs unsquashfs (apt-get install squashfs-tools)")
    part = find_root_partition(path)
    digest = _partition_digest(path, part)
    key = digest.replace(":", "-")
    dest = layer_dir / key
    with locks.hold(lock_dir / f"layer-{key}.lock"):
        if not dest.is_dir():
            listed = _listing(path, part, digest, Caps.from_env() if caps is None else caps)
            _unsquash(path, part, dest)
            write_sizes(layer_dir, key, listed)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {},
        "rootfs": {"type": "layers", "diff_ids": [digest]},
    }
    config_desc = _put_json(blob_dir, config, CONFIG_MEDIA_TYPE)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": config_desc,
        "layers": [{"mediaType": LAYER_MEDIA_TYPE, "digest": digest, "size": part.size}],
    }
    return _put_json(blob_dir, manifest, MANIFEST)


def _partition_digest(path: Path, part: Partition) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(part.offset)
        left = part.size
        while left > 0:
            chunk = f.read(min(left, 1 << 20))
            if not chunk:
                raise SifError("the SIF is shorter than its partition table says")
            sha.update(chunk)
            left -= len(chunk)
    return "sha256:" + sha.hexdigest()


_ENTRY = re.compile(rb"([-dlcbps])[-rwxsStT]{9}\s+\S+\s+(\S+)")


def _listing(path: Path, part: Partition, digest: str, caps: Caps) -> Unpacked:
    """What the partition unpacks to, from its listing, held to ``caps`` (a LayerTooLarge the
    moment the listing passes one: nothing is unpacked then)."""
    max_size, max_entries = layer_limits(caps, Unpacked())
    argv = ["unsquashfs", "-lln", "-o", str(part.offset), str(path)]
    size = entries = 0
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        try:
            for line in proc.stdout:
                found = _ENTRY.match(line)
                if found is None:  # a name's second line (a newline in it)
                    continue
                entries += 1
                size += 512 + (int(found[2]) if found[1] == b"-" else 0)
                if entries > max_entries.value:
                    raise max_entries.exceeded(digest, Unpacked(size, entries))
                if size > max_size.value:
                    raise max_size.exceeded(digest, Unpacked(size, entries))
        except BaseException:
            proc.kill()
            raise
        err = proc.stderr.read().decode(errors="replace")
    if proc.returncode != 0:
        lines = err.strip().splitlines()
        raise SifError(f"unsquashfs cannot list it: {lines[-1] if lines else proc.returncode}")
    return Unpacked(size, entries)


def _unsquash(path: Path, part: Partition, dest: Path) -> None:
    partial = dest.with_name(dest.name + ".partial")
    remove_tree(partial)
    os.mkdir(partial, 0o700)  # no one else enters it before it is made safe
    argv = ["unsquashfs", "-n", "-f", "-no-xattrs", "-o", str(part.offset), "-d", str(partial)]
    try:
        proc = subprocess.run([*argv, str(path)], capture_output=True, text=True)
        if proc.returncode != 0:
            lines = (proc.stderr or proc.stdout).strip().splitlines()
            raise SifError(f"unsquashfs failed: {lines[-1] if lines else proc.returncode}")
        harden_tree(partial)
        os.chmod(partial, 0o755)
        partial.rename(dest)
    except BaseException:
        remove_tree(partial)
        raise


def _put_json(blob_dir: Path, body: Mapping[str, object], media_type: str) -> dict[str, object]:
    data = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    path = blob_path(blob_dir, digest)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.rename(path)
    return {"mediaType": media_type, "digest": digest, "size": len(data)}

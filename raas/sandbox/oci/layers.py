"""Unpacking one OCI layer (a tar, maybe compressed) into a directory overlayfs can stack.

Hand-written on ``tarfile`` because no library does this: umoci and skopeo unpack a whole image
into one root (applying whiteouts by deleting files), not each layer into a directory of its own
that many images share, with the whiteouts kept as overlayfs whiteouts. ``tarfile`` does the
extraction; a filter of our own does what its ``data`` filter would (no absolute or ``..``
paths, nothing written through a symlink, no hard link to outside the layer) but keeps what a
root filesystem needs and that filter drops: absolute symlinks (they resolve inside the
sandbox's root, never here), set-uid bits, sticky ``/tmp``, numeric owners.

Whiteouts (OCI image spec, layer.md): ``DIR/.wh.NAME`` hides ``DIR/NAME`` of the layers below
and becomes an overlayfs whiteout (a character device 0/0); ``DIR/.wh..wh..opq`` hides all of
``DIR``'s lower contents and becomes the opaque mark (xattr ``trusted.overlay.opaque=y``, and
``user.overlay.opaque=y`` for overlays mounted with ``userxattr`` in a user namespace). Device
nodes are skipped: a sandbox gets its own /dev.

The layer is unpacked into ``DEST.partial`` and renamed to ``DEST`` only once both digests
checked out (the compressed blob's against the manifest, the tar's against the config's
diff_id), so ``DEST`` either is complete or does not exist.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
import shutil
import stat
import subprocess
import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

WHITEOUT_PREFIX = ".wh."
OPAQUE = ".wh..wh..opq"
_CHUNK = 1 << 20


class LayerError(Exception):
    """A layer that cannot be unpacked: its digest, its compression or an unsafe member."""


class DigestError(LayerError):
    """A layer blob whose content is not what its digest says."""


class _Hashing:
    """A read-only stream that hashes (and counts) what passes through it."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.sha = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.sha.update(data)
        return data

    def drain(self) -> None:
        while self.read(_CHUNK):
            pass

    def digest(self) -> str:
        return "sha256:" + self.sha.hexdigest()


@contextlib.contextmanager
def _decompressed(blob: IO[bytes], media_type: str) -> Iterator[Any]:
    """The layer's tar stream; zstd through the ``zstd`` program (no zstd module in 3.11)."""
    if media_type.endswith("+zstd"):
        if shutil.which("zstd") is None:
            raise LayerError(
                "a zstd-compressed layer needs the zstd program (apt-get install zstd)"
            )
        proc = subprocess.Popen(["zstd", "-dc"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert proc.stdin is not None and proc.stdout is not None
        feeder = _Feeder(blob, proc.stdin)
        feeder.start()
        try:
            yield proc.stdout
        finally:
            proc.stdout.close()
            feeder.join()
            proc.wait()
    elif media_type.endswith("gzip") or media_type.endswith("+gzip"):
        with gzip.GzipFile(fileobj=blob, mode="rb") as gz:
            yield gz
    else:
        yield blob


class _Feeder:
    """Copies a stream into a pipe on a thread (so we read the other end meanwhile)."""

    def __init__(self, src: IO[bytes], dst: IO[bytes]) -> None:
        import threading

        self.src, self.dst = src, dst
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def join(self) -> None:
        self.thread.join()

    def _run(self) -> None:
        try:
            while chunk := self.src.read(_CHUNK):
                self.dst.write(chunk)
        except (BrokenPipeError, ValueError):
            pass
        finally:
            with contextlib.suppress(OSError):
                self.dst.close()


@dataclass
class _Plan:
    """What the filter saw: whiteouts and opaque directories to make after extraction."""

    dest: str
    whiteouts: list[str] = field(default_factory=list)
    opaque: list[str] = field(default_factory=list)
    skipped_devices: int = 0


def _inside(root: str, path: str) -> bool:
    return os.path.commonpath([root, path]) == root


def _filter(plan: _Plan) -> Any:
    def layer_filter(member: tarfile.TarInfo, _path: str) -> tarfile.TarInfo | None:
        name = member.name.lstrip("/")
        if name in ("", ".", "./"):
            return None
        dest_path = plan.dest
        target = os.path.realpath(os.path.join(dest_path, name))
        if not _inside(dest_path, target):
            raise LayerError(f"unsafe path in layer: {member.name!r} leads outside it")
        base = os.path.basename(name.rstrip("/"))
        if base == OPAQUE:
            plan.opaque.append(os.path.dirname(name))
            return None
        if base.startswith(WHITEOUT_PREFIX):
            plan.whiteouts.append(os.path.join(os.path.dirname(name), base[len(WHITEOUT_PREFIX) :]))
            return None
        if member.ischr() or member.isblk():
            plan.skipped_devices += 1
            return None
        if member.islnk():
            link = os.path.realpath(os.path.join(dest_path, member.linkname.lstrip("/")))
            if not _inside(dest_path, link):
                raise LayerError(
                    f"unsafe hard link in layer: {member.name!r} -> {member.linkname!r}"
                )
            return member.replace(name=name, linkname=member.linkname.lstrip("/"), deep=False)
        return member.replace(name=name, deep=False) if name != member.name else member

    return layer_filter


@contextlib.contextmanager
def _writable(directory: str) -> Iterator[None]:
    """``directory`` writable by its owner meanwhile: unpacking as an unprivileged user (no
    CAP_DAC_OVERRIDE), a whiteout cannot be added to, nor an opaque mark set on, a directory
    that the tar made read-only (0555), as it can as root."""
    mode = stat.S_IMODE(os.lstat(directory).st_mode)
    if mode & stat.S_IWUSR:
        yield
        return
    os.chmod(directory, mode | stat.S_IWUSR)
    try:
        yield
    finally:
        os.chmod(directory, mode)


def _apply_whiteouts(plan: _Plan) -> None:
    for rel in plan.whiteouts:
        path = os.path.join(plan.dest, rel)
        if not _inside(plan.dest, os.path.realpath(os.path.dirname(path))):
            raise LayerError(f"unsafe whiteout in layer: {rel!r}")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.lexists(path):  # the same layer also has NAME: it wins (spec: whiteout below)
            continue
        try:
            with _writable(os.path.dirname(path)):
                os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(0, 0))
        except PermissionError as e:
            raise LayerError(
                f"cannot make the overlayfs whiteout for {rel!r} (a 0/0 character device: root,"
                " or Linux 5.8+ for other users)"
            ) from e
    for rel in plan.opaque:
        path = os.path.join(plan.dest, rel)
        if not _inside(plan.dest, os.path.realpath(path)):
            raise LayerError(f"unsafe opaque directory in layer: {rel!r}")
        os.makedirs(path, exist_ok=True)
        marked = False
        with _writable(path):
            for attr in ("trusted.overlay.opaque", "user.overlay.opaque"):
                with contextlib.suppress(OSError):
                    os.setxattr(path, attr, b"y", follow_symlinks=False)
                    marked = True
        if not marked:
            raise LayerError(f"cannot mark {rel!r} opaque (this filesystem has no xattrs)")


def unpack_layer(blob: Path, media_type: str, digest: str, diff_id: str, dest: Path) -> None:
    """Unpack the layer ``blob`` into ``dest`` (absent before; whole or absent after).

    ``digest`` is the blob's digest from the manifest, ``diff_id`` the uncompressed tar's from the
    image config; both are checked. The caller holds the layer's lock.
    """
    partial = dest.with_name(dest.name + ".partial")
    remove_tree(partial)  # left by a process killed mid-way
    partial.mkdir(parents=True)
    plan = _Plan(dest=os.path.realpath(partial))
    try:
        try:
            blob_digest, tar_digest = _extract(blob, media_type, partial, plan)
        except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as e:
            blob_digest, tar_digest = _file_digest(blob), ""
            if blob_digest == digest:
                raise DigestError(f"layer {digest} is not a readable tar: {e}") from e
        if blob_digest != digest:
            raise DigestError(f"layer blob {digest} has digest {blob_digest}")
        if tar_digest != diff_id:
            raise DigestError(f"layer {digest} unpacks to {tar_digest}, not the config's {diff_id}")
        _apply_whiteouts(plan)
        os.rename(partial, dest)
    except BaseException:
        remove_tree(partial)
        raise


class _Padded:
    """A tar stream, with the zeros after its end that some writers leave out.

    umoci 0.4's ``insert`` (and other Go writers that never close their tar.Writer) ends a layer
    right after the last file's data: no padding to 512 bytes, no end-of-archive blocks. Go's
    reader (containerd, Docker, umoci) takes that as the end; Python's stream reader calls it
    truncated. At most one block of padding and the two end blocks are supplied, outside the
    diff_id (which covers the bytes as published).
    """

    def __init__(self, raw: _Hashing) -> None:
        self.raw = raw
        self.zeros = 3 * tarfile.BLOCKSIZE

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        if data or n == 0:
            return data
        give = self.zeros if n < 0 else min(n, self.zeros)
        self.zeros -= give
        return bytes(give)


def _extract(blob: Path, media_type: str, partial: Path, plan: _Plan) -> tuple[str, str]:
    """Extract into ``partial``; the digests of the blob and of the tar, every byte read."""
    with open(blob, "rb") as raw:
        outer = _Hashing(raw)
        with _decompressed(outer, media_type) as stream:  # type: ignore[arg-type]
            inner = _Hashing(stream)
            with tarfile.open(fileobj=_Padded(inner), mode="r|") as tar:  # type: ignore[call-overload]
                tar.errorlevel = 2  # a member it could not make fails the layer, not a log line
                tar.extractall(partial, numeric_owner=True, filter=_filter(plan))
            inner.drain()  # the tar's end padding counts in diff_id
        outer.drain()
    return outer.digest(), inner.digest()


def _file_digest(path: Path) -> str:
    with open(path, "rb") as f:
        return "sha256:" + hashlib.file_digest(f, "sha256").hexdigest()


def remove_tree(path: Path) -> None:
    """Remove a layer directory (or anything), read-only directories in it included."""
    if not os.path.lexists(path):
        return
    if path.is_dir() and not path.is_symlink():

        def writable(func: Any, p: str, exc: Any) -> None:
            os.chmod(os.path.dirname(p), 0o700)
            func(p)

        shutil.rmtree(path, onerror=writable)
    else:
        path.unlink()


def tree_bytes(path: Path) -> int:
    """Disk used by a tree (blocks allocated; each hard-linked file once)."""
    seen: set[int] = set()
    total = 0
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            st = os.lstat(os.path.join(dirpath, name))
            if st.st_nlink > 1 and not os.path.isdir(os.path.join(dirpath, name)):
                if st.st_ino in seen:
                    continue
                seen.add(st.st_ino)
            total += st.st_blocks * 512
    return total + os.lstat(path).st_blocks * 512

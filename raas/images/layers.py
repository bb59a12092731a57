"""Unpacking one OCI layer (a tar, maybe compressed) into a directory overlayfs can stack.

Hand-written on ``tarfile`` because no library does this: umoci and skopeo unpack a whole image
into one root (applying whiteouts by deleting files), not each layer into a directory of its own
that many images share, with the whiteouts kept as overlayfs whiteouts. ``tarfile`` does the
extraction; a filter of our own does what its ``data`` filter would (no absolute or ``..``
paths, nothing written through a symlink, no hard link to outside the layer) but keeps what a
root filesystem needs and that filter drops: absolute symlinks (they resolve inside the
sandbox's root, never here) and numeric owners.

The store is on a shared host, and a layer is whatever its image's author wrote, so nothing of a
layer is made that a local user could use against the host (docs/sandboxes.md, "The image
store on a shared host"): tarfile's own ``tar_filter`` masks every mode with 0755 (no set-uid,
set-gid or sticky bit, nothing group- or world-writable: a sandbox writes to its own overlay
upper layer, never to a layer; its /tmp and /dev/shm are tmpfs mounts of its own, and rootless
the agent owns the image's files, so an image's ``/tmp`` being 0755 here changes nothing there);
device nodes and FIFOs are never made (a sandbox gets its own /dev; tar has no sockets); tarfile
applies no extended attributes, so no file capability (``security.capability``) or ACL of a
layer reaches the disk. Directories the tar leaves implicit are made 0755 whatever the umask.

Whiteouts (OCI image spec, layer.md): ``DIR/.wh.NAME`` hides ``DIR/NAME`` of the layers below
and becomes an overlayfs whiteout (a character device 0/0); ``DIR/.wh..wh..opq`` hides all of
``DIR``'s lower contents and becomes the opaque mark (xattr ``trusted.overlay.opaque=y``, and
``user.overlay.opaque=y`` for overlays mounted with ``userxattr`` in a user namespace). Device
nodes are skipped: a sandbox gets its own /dev.

Verified as it streams: the blob's digest is checked before anything is unpacked (the whole
file is hashed first, a cheap read next to the unpacking; a blob that is not a file, a pipe, is
checked as it streams), the tar's (the config's diff_id) is computed as the bytes arrive. The
layer is unpacked into ``DEST.partial`` (0700) and renamed to ``DEST`` only once both digests
checked out, so ``DEST`` either is complete or does not exist. What a layer may unpack to is
capped (``Caps``: bytes and entries, per layer and per image, from ``RAAS_LAYER_MAX_BYTES`` and
the like), checked before each member is written and as the tar's bytes arrive: past a cap the
unpacking stops there, with ``LayerTooLarge`` naming the layer, the cap and the variable to
raise, and the partial directory is removed.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import hashlib
import io
import os
import shutil
import stat
import subprocess
import tarfile
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, ClassVar

from raas.images import overlay
from raas.paths import ImageCaps, env_name, image_caps

WHITEOUT_PREFIX = ".wh."
OPAQUE = ".wh..wh..opq"
_CHUNK = 1 << 20
PATH_MAX = os.pathconf("/", "PC_PATH_MAX") if hasattr(os, "pathconf") else 4096
MAX_LINKS = 40  # the kernel's own limit on links followed in one lookup
HEADER_BYTES = 1 << 20  # a long name's or pax attributes' data, read whole by tarfile


class LayerError(Exception):
    """A layer that cannot be unpacked: its digest, its compression or an unsafe member."""


class DigestError(LayerError):
    """A layer blob whose content is not what its digest says."""


def _cap(name: str) -> int:
    return int(ImageCaps.model_fields[name].default)


@dataclass(frozen=True)
class Caps:
    """What a layer, and an image's layers together, may unpack to: the tar stream's bytes (the
    data of its files and their headers; a sparse file counts its whole size) and its entries
    (every member, and every directory the tar leaves implicit). The settings and their
    defaults are ``raas.paths.ImageCaps``'."""

    layer_bytes: int = _cap("layer_max_bytes")
    layer_entries: int = _cap("layer_max_entries")
    image_bytes: int = _cap("image_max_bytes")
    image_entries: int = _cap("image_max_entries")

    ENV: ClassVar[dict[str, str]] = {
        "layer_bytes": env_name("layer_max_bytes"),
        "layer_entries": env_name("layer_max_entries"),
        "image_bytes": env_name("image_max_bytes"),
        "image_entries": env_name("image_max_entries"),
    }

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Caps:
        """The process's caps (``raas.paths.image_caps``: a server's settings, else each
        variable where set, bytes as ``16G``, ``512M`` or a number, else the defaults); a
        LayerError names a variable that is not a number above 0."""
        try:
            caps = image_caps(environ)
        except ValueError as e:
            raise LayerError(f"{e} (caps: 16G, 512M or 1000000)") from None
        return cls(
            caps.layer_max_bytes,
            caps.layer_max_entries,
            caps.image_max_bytes,
            caps.image_max_entries,
        )


@dataclass(frozen=True)
class Unpacked:
    """What a layer unpacked to, or what an image's layers below it did (``Caps``' measure)."""

    size: int = 0
    entries: int = 0

    def __add__(self, other: Unpacked) -> Unpacked:
        return Unpacked(self.size + other.size, self.entries + other.entries)


class LayerTooLarge(LayerError):
    """A layer stopped at a cap: ``unpacked`` (the tar's bytes read, its entries) when it
    stopped, ``staged_bytes`` the disk its partial directory held then (removed since)."""

    def __init__(self, message: str, unpacked: Unpacked) -> None:
        super().__init__(message)
        self.unpacked = unpacked
        self.staged_bytes = 0


@dataclass(frozen=True)
class _Limit:
    value: int  # what this layer may unpack to
    what: str  # "bytes" or "entries"
    cap: str  # "one layer's" or "an image's"
    var: str
    below: int = 0  # what the image's layers below hold (an image's cap)

    def exceeded(self, digest: str, unpacked: Unpacked) -> LayerTooLarge:
        total = self.value + self.below  # the cap itself
        amount = _human(total) if self.what == "bytes" else f"{total} entries"
        held = self.below if self.what == "entries" else _human(self.below)
        where = f" (its layers below hold {held})" if self.cap == "an image's" else ""
        return LayerTooLarge(
            f"layer {digest} goes past {amount}, the cap on {self.cap} unpacked {self.what}"
            f"{where}: stopped there, nothing kept; raise {self.var} for an image that needs"
            " more",
            unpacked,
        )


def layer_limits(caps: Caps, below: Unpacked) -> tuple[_Limit, _Limit]:
    """The caps on this layer's bytes and entries: its own, or what the image's cap leaves."""

    def tighter(own: int, image: int, what: str, used: int) -> _Limit:
        layer = _Limit(own, what, "one layer's", Caps.ENV[f"layer_{what}"])
        whole = _Limit(image - used, what, "an image's", Caps.ENV[f"image_{what}"], used)
        return min(layer, whole, key=lambda limit: limit.value)

    return (
        tighter(caps.layer_bytes, caps.image_bytes, "bytes", below.size),
        tighter(caps.layer_entries, caps.image_entries, "entries", below.entries),
    )


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


class _Hashing:
    """A read-only stream that hashes (and counts) what passes through it; past ``stop`` bytes
    it calls ``stop_at`` (which raises) before handing those bytes on."""

    def __init__(self, raw: IO[bytes], stop: int | None = None, stop_at: Any = None) -> None:
        self.raw = raw
        self.sha = hashlib.sha256()
        self.count = 0
        self.stop, self.stop_at = stop, stop_at

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.sha.update(data)
        self.count += len(data)
        if self.stop is not None and self.count > self.stop:
            self.stop_at()
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
    """What the filter saw: whiteouts and opaque directories to make after extraction, and
    what the layer unpacked to so far against its caps."""

    dest: str
    digest: str = ""
    max_size: _Limit | None = None
    max_entries: _Limit | None = None
    declared: int = 0  # a header block per entry, and the size of each file
    entries: int = 0
    stream: _Hashing | None = None  # the tar's bytes as they arrive
    whiteouts: list[str] = field(default_factory=list)
    opaque: list[str] = field(default_factory=list)
    skipped_devices: int = 0  # device nodes and FIFOs, never made

    def unpacked(self) -> Unpacked:
        read = self.stream.count if self.stream is not None else 0
        return Unpacked(max(self.declared, read), self.entries)

    def count(self, entries: int, size: int) -> None:
        """Count what is about to be made; past a cap, stop before it is (``unpacked`` then
        says what was made before it)."""
        if self.max_entries is not None and self.entries + entries > self.max_entries.value:
            raise self.max_entries.exceeded(self.digest, self.unpacked())
        if self.max_size is not None and self.declared + size > self.max_size.value:
            raise self.max_size.exceeded(self.digest, self.unpacked())
        self.entries += entries
        self.declared += size

    def stream_past(self) -> None:
        """The tar's bytes went past the cap (read, not yet written)."""
        assert self.max_size is not None
        raise self.max_size.exceeded(self.digest, self.unpacked())

    def make_parents(self, rel: str) -> None:
        """The directories above a member that the tar leaves implicit: made 0755 whatever the
        umask (tarfile would make them 0777 less the umask), and counted as entries."""
        if not rel or os.path.isdir(os.path.join(self.dest, rel)):
            return
        missing = []
        while rel and not os.path.lexists(os.path.join(self.dest, rel)):
            missing.append(rel)
            rel = os.path.dirname(rel)
        self.count(len(missing), len(missing) * tarfile.BLOCKSIZE)
        for path in reversed(missing):
            with contextlib.suppress(FileExistsError):  # "a/." after "a"
                os.mkdir(os.path.join(self.dest, path), 0o755)


def _inside(root: str, path: str) -> bool:
    return os.path.commonpath([root, path]) == root


def _real(path: str) -> str:
    """``os.path.realpath`` of an absolute ``path``, except that a component it cannot look at
    is an error, never taken for a plain directory. realpath (before Python 3.11.13) takes a
    name the kernel refuses as too long (ENAMETOOLONG) for one that is no link, so a layer's
    chain of links that resolves past PATH_MAX, then back up with ``..``, looked inside the
    layer while the kernel followed the links out of it (CVE-2025-4517's class). A name that
    does not exist yet ends the links: the rest is plain names, as the kernel makes them."""
    resolved, pending, links = "/", [p for p in reversed(path.split("/")) if p], 0
    while pending:
        part = pending.pop()
        if part == ".":
            continue
        if part == "..":
            resolved = os.path.dirname(resolved)
            continue
        candidate = os.path.join(resolved, part)
        if len(candidate.encode()) >= PATH_MAX:
            raise LayerError(f"a path in the layer resolves past {PATH_MAX} bytes")
        try:
            mode = os.lstat(candidate).st_mode
        except (FileNotFoundError, NotADirectoryError):
            resolved = candidate
            continue
        except OSError as e:
            raise LayerError(f"a path in the layer cannot be resolved: {e}") from None
        if not stat.S_ISLNK(mode):
            resolved = candidate
            continue
        links += 1
        if links > MAX_LINKS:
            raise LayerError(f"a path in the layer goes through more than {MAX_LINKS} links")
        target = os.readlink(candidate)
        if target.startswith("/"):
            resolved = "/"
        pending.extend(p for p in reversed(target.split("/")) if p)
    return resolved


class _CappedInfo(tarfile.TarInfo):
    """A member whose long name or pax header is held to HEADER_BYTES: tarfile reads such a
    header's data whole into memory before any filter sees the member (a 2.3 MB blob holding
    a 512 MiB name took 4.6 GiB)."""

    def _proc_gnulong(self, tarfile: Any) -> Any:
        _header_fits(self)
        return super()._proc_gnulong(tarfile)  # type: ignore[misc]

    def _proc_pax(self, tarfile: Any) -> Any:
        _header_fits(self)
        return super()._proc_pax(tarfile)  # type: ignore[misc]


def _header_fits(info: tarfile.TarInfo) -> None:
    if info.size > HEADER_BYTES:
        raise LayerError(
            f"a header of the layer holds {info.size} bytes, more than {HEADER_BYTES}"
            " (a long name or pax attributes)"
        )


def _filter(plan: _Plan) -> Any:
    def layer_filter(member: tarfile.TarInfo, _path: str) -> tarfile.TarInfo | None:
        name = member.name.lstrip("/")
        if name in ("", ".", "./"):
            return None
        plan.count(1, tarfile.BLOCKSIZE + (member.size if member.isreg() else 0))
        dest_path = plan.dest
        target = _real(os.path.join(dest_path, name))
        if not _inside(dest_path, target):
            raise LayerError(f"unsafe path in layer: {member.name!r} leads outside it")
        plan.make_parents(os.path.dirname(name.rstrip("/")))
        base = os.path.basename(name.rstrip("/"))
        if base == OPAQUE:
            plan.opaque.append(os.path.dirname(name))
            return None
        if base.startswith(WHITEOUT_PREFIX):
            plan.whiteouts.append(os.path.join(os.path.dirname(name), base[len(WHITEOUT_PREFIX) :]))
            return None
        if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
            plan.skipped_devices += 1  # a device node or a FIFO: the sandbox has its own /dev
            return None
        if member.islnk():
            link = _real(os.path.join(dest_path, member.linkname.lstrip("/")))
            if not _inside(dest_path, link):
                raise LayerError(
                    f"unsafe hard link in layer: {member.name!r} -> {member.linkname!r}"
                )
            member = member.replace(name=name, linkname=member.linkname.lstrip("/"), deep=False)
        elif name != member.name:
            member = member.replace(name=name, deep=False)
        # tarfile's own: the mode masked with 0755 (no set-uid, set-gid or sticky bit, no group
        # or world write), owners kept. It checks the path again, as we did above.
        return tarfile.tar_filter(member, dest_path)

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
        if not _inside(plan.dest, _real(os.path.dirname(path))):
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
        if not _inside(plan.dest, _real(path)):
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


def unpack_layer(
    blob: Path,
    media_type: str,
    digest: str,
    diff_id: str,
    dest: Path,
    *,
    caps: Caps | None = None,
    below: Unpacked = Unpacked(),
) -> Unpacked:
    """Unpack the layer ``blob`` into ``dest`` (absent before; whole or absent after).

    ``digest`` is the blob's digest from the manifest, checked before anything is unpacked;
    ``diff_id`` the uncompressed tar's from the image config, checked as the tar ends, before
    ``dest`` is made. ``caps`` (default: ``Caps.from_env()``) bound what the layer may unpack
    to, ``below`` what the image's layers below it hold (an image's caps count them):
    ``LayerTooLarge`` the moment one is passed. Returns what the layer unpacked to. The caller
    holds the layer's lock.
    """
    caps = Caps.from_env() if caps is None else caps
    partial = dest.with_name(dest.name + ".partial")
    remove_tree(partial)  # left by a process killed mid-way
    max_size, max_entries = layer_limits(caps, below)
    with open(blob, "rb") as raw:
        verified = _verify_file(raw, digest)  # a blob that is not what it says makes nothing
        partial.parent.mkdir(parents=True, exist_ok=True)
        partial.mkdir(mode=0o700)  # no one else enters it while it is half-made
        plan = _Plan(os.path.realpath(partial), digest, max_size, max_entries)
        try:
            try:
                blob_digest, tar_digest = _extract(raw, media_type, partial, plan)
            except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as e:
                blob_digest, tar_digest = digest if verified else _file_digest(blob), ""
                if blob_digest == digest:
                    raise DigestError(f"layer {digest} is not a readable tar: {e}") from e
            if blob_digest != digest:
                raise DigestError(f"layer blob {digest} has digest {blob_digest}")
            if tar_digest != diff_id:
                raise DigestError(
                    f"layer {digest} unpacks to {tar_digest}, not the config's {diff_id}"
                )
            _apply_whiteouts(plan)
            os.chmod(partial, 0o755)
            os.rename(partial, dest)
        except LayerTooLarge as e:
            e.staged_bytes = tree_bytes(partial)  # what it had made when it stopped
            remove_tree(partial)
            raise
        except BaseException:
            remove_tree(partial)
            raise
    return plan.unpacked()


def _verify_file(raw: io.BufferedReader, digest: str) -> bool:
    """An open blob's digest checked before any of it is unpacked: True where it is a file that
    matched (read again from its start), False for a pipe (checked as it streams instead);
    DigestError where it does not match."""
    if not stat.S_ISREG(os.fstat(raw.fileno()).st_mode):
        return False
    found = "sha256:" + hashlib.file_digest(raw, "sha256").hexdigest()
    if found != digest:
        raise DigestError(f"layer blob {digest} has digest {found}")
    raw.seek(0)
    return True


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


def _extract(raw: IO[bytes], media_type: str, partial: Path, plan: _Plan) -> tuple[str, str]:
    """Extract into ``partial``; the digests of the blob and of the tar, every byte read (the
    tar's bytes past the cap stop it, junk after its end included)."""
    outer = _Hashing(raw)
    with _decompressed(outer, media_type) as stream:  # type: ignore[arg-type]
        limit = plan.max_size.value if plan.max_size is not None else None
        inner = plan.stream = _Hashing(stream, limit, plan.stream_past)
        with tarfile.open(  # type: ignore[call-overload]
            fileobj=_Padded(inner), mode="r|", tarinfo=_CappedInfo
        ) as tar:
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


def harden_tree(path: Path) -> int:
    """Make a tree already on disk (a ``.sif``'s unsquashed root, a layer an older raas
    unpacked) what ``unpack_layer`` makes: every mode masked with 0755, no file capability, no
    device node (overlayfs whiteouts, 0/0, stay) or FIFO or socket. Symbolic links are not
    followed. Returns how many entries it changed or removed."""
    changed = 0
    for dirpath, dirnames, filenames in os.walk(path):
        for name in [*dirnames, *filenames]:
            entry = os.path.join(dirpath, name)
            st = os.lstat(entry)
            kind = stat.S_IFMT(st.st_mode)
            if kind == stat.S_IFLNK:
                continue
            if kind not in (stat.S_IFREG, stat.S_IFDIR) and not overlay.is_whiteout(st):
                with _writable(dirpath):
                    os.unlink(entry)
                changed += 1
                continue
            if kind == stat.S_IFREG and _has_capability(entry):
                os.removexattr(entry, "security.capability", follow_symlinks=False)
                changed += 1
            mode = stat.S_IMODE(st.st_mode)
            if mode & ~0o755:
                os.chmod(entry, mode & 0o755)  # not a link (skipped above)
                changed += 1
    mode = stat.S_IMODE(os.lstat(path).st_mode)
    if mode & ~0o755:
        os.chmod(path, mode & 0o755)
        changed += 1
    return changed


def _has_capability(path: str) -> bool:
    """Whether a file has a file capability (anyone may ask; removing one needs CAP_SETFCAP)."""
    try:
        os.getxattr(path, "security.capability", follow_symlinks=False)
    except OSError as e:
        if e.errno in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP):
            return False
        raise
    return True


def write_sizes(layer_dir: Path, key: str, unpacked: Unpacked) -> None:
    """Beside the layer ``key``: ``.size``, its disk use, and ``.unpacked``, what its tar
    unpacked to (bytes, entries), which an image's caps count."""
    for suffix, text in (
        (".size", str(tree_bytes(layer_dir / key))),
        (".unpacked", f"{unpacked.size} {unpacked.entries}"),
    ):
        tmp = layer_dir / f".{key}{suffix}.{os.getpid()}"
        tmp.write_text(text)
        os.replace(tmp, layer_dir / (key + suffix))


def read_unpacked(layer_dir: Path, key: str) -> Unpacked | None:
    """What ``write_sizes`` wrote of the layer ``key``; None where it wrote nothing (an older
    raas)."""
    try:
        size, entries = (layer_dir / (key + ".unpacked")).read_text().split()
        return Unpacked(int(size), int(entries))
    except (OSError, ValueError):
        return None


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

"""The image store: OCI images pulled or imported once, their layers unpacked once and shared.

Layout of the store directory (several servers on one node may share it)::

    oci-layout, index.json   an OCI image layout: the index names every image (ref -> manifest)
    blobs/sha256/HEX         manifests, configs and layer blobs of all images (skopeo's
                             --dest-shared-blob-dir: a blob already there is not fetched again)
    layers/sha256-DIFFID/    each layer unpacked once (``layers.unpack_layer``); beside it .size
                             (its disk use) and .unpacked (its tar's bytes and entries, which
                             the caps on an image count)
    images/sha256-HEX.lock   per image: shared-locked while a sandbox uses it (``in_use``); its
                             mtime is when the image was last used
    locks/                   gc.lock (pulls hold it shared, prune/evict exclusive), index.lock
                             (index.json updates), layer-sha256-DIFFID.lock (one unpacker a layer)
    tmp/                     skopeo's layouts of copies in flight

A pull or import that fails leaves blobs skopeo verified (reused by the next try) and no layer
directory that is not whole.

On a shared host (docs/sandboxes.md): the root is 0700, or 0750 and the group's where
``$RAAS_IMAGE_STORE_GROUP`` names one (``layers``, ``blobs`` and the index readable by it; locks
and copies in flight still raas's alone); it must belong to raas's user, and is checked, and
made so, at every pull, import, prune and resolve. Its layers hold no set-uid, set-gid or
sticky bit, nothing group- or world-writable, no file capability, no device node
(``layers.unpack_layer``); a store that an older raas filled is made so once
(``layers.harden_tree`` on each layer, then the ``layers-hardened`` mark).
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import grp
import json
import logging
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from raas.images import locks, manifests
from raas.images.errors import ImageError, ImageNotStored
from raas.images.image import StoredImage
from raas.images.layers import (
    Caps,
    DigestError,
    LayerError,
    Unpacked,
    harden_tree,
    read_unpacked,
    remove_tree,
    tree_bytes,
    unpack_layer,
    write_sizes,
)
from raas.images.manifests import Image, ManifestError
from raas.images.refs import normalize
from raas.images.sources import archive, skopeo
from raas.paths import env_name, host_paths

log = logging.getLogger(__name__)

GROUP_ENV = env_name("image_store_group")
# In the root: every layer here was unpacked (or later made) as unpack_layer makes them.
HARDENED = "layers-hardened"


def default_store_dir() -> Path:
    """$RAAS_IMAGE_STORE, else $RAAS_CACHE_DIR/oci, else ~/.cache/raas/oci (``HostPaths``)."""
    return host_paths().store_dir()


@dataclass(frozen=True)
class ImageInfo:
    """One image of ``ImageStore.list()``."""

    ref: str
    digest: str
    layers: int
    size: int  # bytes of its unpacked layers (shared ones counted in full)
    last_used: float  # epoch seconds
    in_use: bool


@dataclass(frozen=True)
class StoreUsage:
    """The store's size and how much layer sharing saves (for ``raas images ls`` and /metrics)."""

    images: int
    layers: int
    layer_bytes: int  # unpacked layers as stored, each once
    unshared_bytes: int  # what the layers would take if each image had its own copy
    blob_bytes: int  # manifests, configs and (compressed) layer blobs

    @property
    def total_bytes(self) -> int:
        return self.layer_bytes + self.blob_bytes

    @property
    def share_ratio(self) -> float:
        """unshared / stored layer bytes: 3.0 means sharing stores a third of the copies."""
        return self.unshared_bytes / self.layer_bytes if self.layer_bytes else 1.0


@dataclass(frozen=True)
class PruneResult:
    images: int  # images evicted (prune itself removes no named image)
    layers: int
    blobs: int
    bytes: int


class ImageStore:
    """A directory of OCI images with their layers unpacked; see the module docstring.

    ``max_bytes``: after each pull or import, the least recently used images no sandbox holds
    are removed until the store (blobs and layers) fits. ``group`` (default
    ``$RAAS_IMAGE_STORE_GROUP``): a group name or gid that may read the store (its root 0750);
    without one, the root is 0700. ``caps`` (default ``Caps.from_env()``): what one layer, and
    one image's layers together, may unpack to.
    """

    def __init__(
        self,
        root: Path | None = None,
        *,
        max_bytes: int | None = None,
        group: str | None = None,
        caps: Caps | None = None,
    ) -> None:
        self.root = (root or default_store_dir()).expanduser().absolute()
        self.max_bytes = max_bytes
        self.group = group if group is not None else host_paths().image_store_group
        self.caps = caps
        self.blob_dir = self.root / "blobs"
        self.layer_dir = self.root / "layers"
        self.image_dir = self.root / "images"
        self.lock_dir = self.root / "locks"
        self.tmp_dir = self.root / "tmp"

    # -- getting images in ------------------------------------------------------------------

    def pull(
        self, ref: str, *, tls_verify: bool = True, authfile: Path | None = None
    ) -> StoredImage:
        """Pull ``ref`` from its registry (``tls_verify=False`` for a plain-HTTP one)."""
        name = _normalize(ref)
        return self._copy_in(name, f"docker://{name}", tls_verify=tls_verify, authfile=authfile)

    def import_(self, path: Path, ref: str | None = None) -> StoredImage:
        """Import a ``docker save`` archive, an OCI image layout (a directory or a tar) or a
        ``.sif``, named ``ref`` (default: the name the archive gives)."""
        try:
            source = archive.identify(path, ref)
        except archive.ArchiveError as e:
            raise ImageError(f"cannot import {path}: {e}") from e
        if source.sif is not None:
            return self._import_sif(path, _normalize(source.ref))
        return self._copy_in(_normalize(source.ref), source.skopeo_src, what=str(path))

    def _copy_in(
        self,
        name: str,
        src: str,
        *,
        what: str | None = None,
        tls_verify: bool = True,
        authfile: Path | None = None,
    ) -> StoredImage:
        verb = f"import {what} as {name}" if what else f"pull {name}"
        try:
            self._setup()
            with locks.hold(self.lock_dir / "gc.lock", shared=True):
                with self._tmp_layout() as layout:
                    skopeo.copy(
                        src, layout, self.blob_dir, tls_verify=tls_verify, authfile=authfile
                    )
                    found = manifests.index_manifests(layout)
                    if len(found) != 1:
                        raise ManifestError(f"skopeo wrote {len(found)} manifests, not 1")
                    digest = str(found[0]["digest"])
                image = manifests.read_image(self.blob_dir, digest)
                self._unpack(image, self.caps or Caps.from_env())
                self._set_ref(name, found[0])
                self._touch(digest)
        except skopeo.SkopeoError as e:
            raise ImageError(f"cannot {verb}: {e}") from e
        except (LayerError, ManifestError) as e:
            raise ImageError(f"cannot {verb}: {e}") from e
        except OSError as e:
            raise ImageError(f"cannot {verb}: {_os_cause(e, self.root)}") from e
        self._fit(protect=digest)
        return self.resolve(name)

    def _import_sif(self, path: Path, name: str) -> StoredImage:
        from raas.images.sources import sif

        try:
            self._setup()
            with locks.hold(self.lock_dir / "gc.lock", shared=True):
                caps = self.caps or Caps.from_env()
                desc = sif.import_sif(path, self.blob_dir, self.layer_dir, self.lock_dir, caps)
                self._set_ref(name, desc)
                self._touch(str(desc["digest"]))
        except (sif.SifError, LayerError) as e:
            raise ImageError(f"cannot import {path} as {name}: {e}") from e
        except OSError as e:
            raise ImageError(f"cannot import {path} as {name}: {_os_cause(e, self.root)}") from e
        self._fit(protect=str(desc["digest"]))
        return self.resolve(name)

    def _unpack(self, image: Image, caps: Caps) -> None:
        """Unpack the image's layers that are not here yet, bottom first, each within the caps
        (an image's counting the layers below it, those already here included)."""
        below = Unpacked()
        for layer in image.layers:
            dest = self.layer_dir / layer.key
            if not dest.is_dir():
                with locks.hold(self.lock_dir / f"layer-{layer.key}.lock"):
                    if not dest.is_dir():  # else another process unpacked it while we waited
                        below += self._unpack_layer(layer, dest, caps, below)
                        continue
            below += self._layer_unpacked(layer.key)

    def _unpack_layer(
        self, layer: manifests.Layer, dest: Path, caps: Caps, below: Unpacked
    ) -> Unpacked:
        blob = manifests.blob_path(self.blob_dir, layer.digest)
        try:
            done = unpack_layer(
                blob, layer.media_type, layer.digest, layer.diff_id, dest, caps=caps, below=below
            )
        except DigestError:
            blob.unlink(missing_ok=True)  # or skopeo would reuse the bad blob next time
            raise
        write_sizes(self.layer_dir, layer.key, done)
        return done

    # -- using images -----------------------------------------------------------------------

    def resolve(self, ref: str) -> StoredImage:
        """The stored image ``ref`` names; ImageError saying how to get it if there is none."""
        name = _normalize(ref)
        self._secure(create=False)
        entry = self._index().get(name)
        if entry is None:
            raise ImageNotStored(
                f"image {name} is not in the image store {self.root}: raas images pull {ref}"
            )
        digest = str(entry["digest"])
        try:
            image = manifests.read_image(self.blob_dir, digest)
        except ManifestError as e:
            raise ImageError(
                f"image {name} is damaged in {self.root} ({e}): raas images pull {ref}"
            ) from e
        layers = tuple(self.layer_dir / layer.key for layer in image.layers)
        missing = [p.name for p in layers if not p.is_dir()]
        if missing:
            raise ImageError(
                f"image {name} lacks layer {missing[0]} in {self.root}: raas images pull {ref}"
            )
        self._touch(digest)
        return StoredImage(
            ref=name,
            digest=digest,
            layers=layers,
            env=image.env,
            workdir=image.workdir,
            user=image.user,
            labels=image.labels,
            command=image.command,
        )

    @contextlib.contextmanager
    def in_use(self, image: StoredImage) -> Iterator[StoredImage]:
        """Hold ``image`` for a sandbox: neither ``remove``, ``prune`` nor the size cap removes
        it (or its layers, even if its name is pulled anew) until the block ends."""
        lock = self._image_lock(image.digest)
        with locks.hold(lock, shared=True):
            gone = [p for p in image.layers if not p.is_dir()]
            if gone:  # removed between resolve and here
                raise ImageError(
                    f"image {image.ref} was removed from {self.root}: raas images pull {image.ref}"
                )
            self._touch(image.digest)
            try:
                yield image
            finally:
                self._touch(image.digest)

    def list(self) -> builtins.list[ImageInfo]:
        """Every named image, most recently used first."""
        infos = []
        for name, entry in sorted(self._index().items()):
            digest = str(entry["digest"])
            try:
                image = manifests.read_image(self.blob_dir, digest)
            except ManifestError:
                continue
            infos.append(
                ImageInfo(
                    ref=name,
                    digest=digest,
                    layers=len(image.layers),
                    size=sum(self._layer_bytes(layer.key) for layer in image.layers),
                    last_used=self._last_used(digest),
                    in_use=locks.is_held(self._image_lock(digest)),
                )
            )
        return sorted(infos, key=lambda i: -i.last_used)

    def names(self) -> builtins.list[str]:
        """Every named image, sorted (cheap: index.json alone, no manifest read)."""
        return sorted(self._index())

    @property
    def index_file(self) -> Path:
        """The layout's index.json: it changes whenever an image is added or removed."""
        return self.root / "index.json"

    def usage(self) -> StoreUsage:
        """Sizes for ``raas images ls`` and the server's /metrics (cheap: no tree walks)."""
        keys: set[str] = set()
        unshared = 0
        index = self._index()
        for entry in index.values():
            with contextlib.suppress(ManifestError):
                image = manifests.read_image(self.blob_dir, str(entry["digest"]))
                keys.update(layer.key for layer in image.layers)
                unshared += sum(self._layer_bytes(layer.key) for layer in image.layers)
        stored = [p.name for p in self._layer_dirs()]
        blob_bytes = sum(p.stat().st_size for p in self._blobs())
        return StoreUsage(
            images=len(index),
            layers=len(stored),
            layer_bytes=sum(self._layer_bytes(key) for key in stored),
            unshared_bytes=unshared,
            blob_bytes=blob_bytes,
        )

    # -- removing images --------------------------------------------------------------------

    def remove(self, ref: str) -> None:
        """Forget ``ref`` and remove what no other image needs; refused while a sandbox uses it."""
        name = _normalize(ref)
        entry = self._index().get(name)
        if entry is None:
            raise ImageError(f"image {name} is not in the image store {self.root}")
        if locks.is_held(self._image_lock(str(entry["digest"]))):
            raise ImageError(f"image {name} is in use by a running sandbox: not removed")
        self._drop_ref(name)
        self.prune()

    def prune(self) -> PruneResult:
        """Remove blobs, layers and partial unpacks no image (named, or held by a sandbox)
        refers to."""
        try:
            self._setup()
        except OSError as e:
            raise ImageError(f"cannot prune: {_os_cause(e, self.root)}") from e
        with locks.hold(self.lock_dir / "gc.lock"):
            return self._collect(evicted=0)

    def _fit(self, protect: str) -> None:
        """Evict least recently used images no sandbox holds until the store fits max_bytes."""
        if self.max_bytes is None:
            return
        evicted = 0
        with locks.hold(self.lock_dir / "gc.lock"):
            while self.usage().total_bytes > self.max_bytes:
                candidates = [
                    info
                    for info in sorted(self.list(), key=lambda i: i.last_used)
                    if info.digest != protect and not info.in_use
                ]
                if not candidates:
                    break
                self._drop_ref(candidates[0].ref)
                evicted += 1
                self._collect(evicted=0)

    def _collect(self, evicted: int) -> PruneResult:
        keep_blobs: set[str] = set()
        keep_layers: set[str] = set()
        named = {str(e["digest"]) for e in self._index().values()}
        held = set()
        for lock in sorted(self.image_dir.glob("sha256-*.lock")):
            digest = lock.name.removesuffix(".lock").replace("-", ":", 1)
            if digest in named:
                continue
            try:
                with locks.hold(lock, wait=False):
                    lock.unlink()
            except locks.Busy:
                held.add(digest)  # in use under a name pulled anew since: keep its layers
        for digest in named | held:
            with contextlib.suppress(ManifestError):
                image = manifests.read_image(self.blob_dir, digest)
                keep_blobs.update(image.blobs)
                keep_layers.update(layer.key for layer in image.layers)
        removed_bytes = layers = blobs = 0
        for path in self._layer_dirs(partial=True):
            key = path.name.removesuffix(".partial")
            if key in keep_layers and path.name == key:
                continue
            lock = self.lock_dir / f"layer-{key}.lock"
            try:
                with locks.hold(lock, wait=False):
                    size = self._layer_bytes(key) if path.name == key else 0
                    remove_tree(path)
                    lock.unlink()
                    if path.name == key:
                        for suffix in (".size", ".unpacked"):
                            self.layer_dir.joinpath(key + suffix).unlink(missing_ok=True)
                        removed_bytes += size
                        layers += 1
            except locks.Busy:
                continue  # being unpacked right now
        if self.tmp_dir.is_dir():  # copies hold gc.lock shared: these were killed mid-way
            for leftover in self.tmp_dir.iterdir():
                remove_tree(leftover)
        for blob in self._blobs():
            if "sha256:" + blob.name not in keep_blobs:
                removed_bytes += blob.stat().st_size
                blob.unlink()
                blobs += 1
        return PruneResult(images=evicted, layers=layers, blobs=blobs, bytes=removed_bytes)

    # -- the index and bookkeeping ----------------------------------------------------------

    def _setup(self) -> None:
        self._secure(create=True)
        shared = 0o700 if self._gid() is None else 0o750  # what the group may read
        for d, mode in (
            (self.blob_dir, shared),
            (self.blob_dir / "sha256", shared),
            (self.layer_dir, shared),
            (self.image_dir, 0o700),
            (self.lock_dir, 0o700),
            (self.tmp_dir, 0o700),
        ):
            d.mkdir(mode=mode, exist_ok=True)
            if stat.S_IMODE(d.stat().st_mode) != mode:
                d.chmod(mode)
        layout = self.root / "oci-layout"
        if not layout.exists():
            _write_atomic(layout, json.dumps({"imageLayoutVersion": "1.0.0"}))

    def _secure(self, create: bool) -> None:
        """The store's root made (``create``) or found as a shared host needs it: raas's
        user's, 0700 (0750 and the group's, with a group); one an older raas filled has its
        layers made safe once. ImageError where it belongs to another user."""
        if create:
            self.root.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                self.root.mkdir(mode=0o700)
        try:
            st = self.root.stat()
        except FileNotFoundError:
            if create:
                raise
            return
        if not stat.S_ISDIR(st.st_mode):
            raise ImageError(f"the image store {self.root} is not a directory")
        if st.st_uid != os.geteuid():
            raise ImageError(
                f"the image store {self.root} belongs to uid {st.st_uid}, not to raas's user"
                f" (uid {os.geteuid()}): refused, as its owner could change every image; use a"
                " store of your own ($RAAS_IMAGE_STORE)"
            )
        gid = self._gid()
        mode = 0o700 if gid is None else 0o750
        try:
            if gid is not None and st.st_gid != gid:
                os.chown(self.root, -1, gid)
            if stat.S_IMODE(st.st_mode) != mode:
                if stat.S_IMODE(st.st_mode) & ~mode:
                    log.warning(
                        "image store %s was %o: made %o (docs/sandboxes.md: a shared host)",
                        self.root,
                        stat.S_IMODE(st.st_mode),
                        mode,
                    )
                os.chmod(self.root, mode)
        except PermissionError as e:
            raise ImageError(
                f"cannot give the image store {self.root} to group {self.group} ({GROUP_ENV}):"
                f" raas's user is not in it ({e.strerror})"
            ) from e
        if not (self.root / HARDENED).exists():
            self._harden_old_layers()

    def _gid(self) -> int | None:
        if not self.group:
            return None
        if self.group.isdigit():
            return int(self.group)
        try:
            return grp.getgrnam(self.group).gr_gid
        except KeyError:
            raise ImageError(f"{GROUP_ENV}={self.group}: there is no such group") from None

    def _harden_old_layers(self) -> None:
        """Layers an older raas unpacked (set-uid bits, world-writable directories, FIFOs kept)
        made as ``unpack_layer`` makes them, once, under the exclusive gc lock (no pull is
        unpacking meanwhile); then the mark that says so."""
        self.lock_dir.mkdir(mode=0o700, exist_ok=True)
        with locks.hold(self.lock_dir / "gc.lock"):
            if (self.root / HARDENED).exists():
                return
            changed = sum(harden_tree(path) for path in self._layer_dirs())
            if changed:
                log.warning(
                    "image store %s: %d entries of layers an older raas unpacked made safe"
                    " (set-uid bits, group- and world-writable modes, devices removed)",
                    self.root,
                    changed,
                )
            _write_atomic(self.root / HARDENED, "1\n")

    def _index(self) -> dict[str, dict[str, object]]:
        """ref -> manifest descriptor, from the layout's index.json."""
        try:
            found = manifests.index_manifests(self.root)
        except ManifestError:
            return {}
        out = {}
        for m in found:
            name = (m.get("annotations") or {}).get(manifests.REF_NAME)
            if isinstance(name, str) and isinstance(m.get("digest"), str):
                out[name] = m
        return out

    def _write_index(self, index: dict[str, dict[str, object]]) -> None:
        body = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [index[name] for name in sorted(index)],
        }
        _write_atomic(self.root / "index.json", json.dumps(body, indent=1))

    def _set_ref(self, name: str, descriptor: dict[str, object]) -> None:
        entry: dict[str, object] = {
            k: descriptor[k] for k in ("mediaType", "digest", "size") if k in descriptor
        }
        entry["annotations"] = {manifests.REF_NAME: name}
        with locks.hold(self.lock_dir / "index.lock"):
            index = self._index()
            index[name] = entry
            self._write_index(index)

    def _drop_ref(self, name: str) -> None:
        with locks.hold(self.lock_dir / "index.lock"):
            index = self._index()
            index.pop(name, None)
            self._write_index(index)

    def _image_lock(self, digest: str) -> Path:
        return self.image_dir / (digest.replace(":", "-", 1) + ".lock")

    def _touch(self, digest: str) -> None:
        path = self._image_lock(digest)
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
            now = time.time_ns()  # not the kernel's coarse file clock: two uses a ms apart differ
            os.utime(path, ns=(now, now))

    def _last_used(self, digest: str) -> float:
        try:
            return self._image_lock(digest).stat().st_mtime
        except FileNotFoundError:
            return 0.0

    def _layer_unpacked(self, key: str) -> Unpacked:
        """What the layer ``key`` unpacked to (an older raas's layer: its disk use alone)."""
        found = read_unpacked(self.layer_dir, key)
        return found if found is not None else Unpacked(self._layer_bytes(key), 0)

    def _layer_bytes(self, key: str) -> int:
        size_file = self.layer_dir / (key + ".size")
        try:
            return int(size_file.read_text())
        except (FileNotFoundError, ValueError):
            path = self.layer_dir / key
            if not path.is_dir():
                return 0
            size = tree_bytes(path)
            with contextlib.suppress(OSError):
                _write_atomic(size_file, str(size))
            return size

    def _layer_dirs(self, partial: bool = False) -> builtins.list[Path]:
        if not self.layer_dir.is_dir():
            return []
        return [
            p
            for p in self.layer_dir.iterdir()
            if p.name.startswith("sha256-")
            and p.is_dir()
            and (partial or not p.name.endswith(".partial"))
        ]

    def _blobs(self) -> builtins.list[Path]:
        d = self.blob_dir / "sha256"
        return [p for p in d.iterdir() if p.is_file()] if d.is_dir() else []

    @contextlib.contextmanager
    def _tmp_layout(self) -> Iterator[Path]:
        path = Path(tempfile.mkdtemp(prefix="copy-", dir=self.tmp_dir))
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)


def _normalize(ref: str) -> str:
    try:
        return normalize(ref)
    except ValueError as e:
        raise ImageError(str(e)) from e


def _os_cause(e: OSError, root: Path) -> str:
    if e.errno == errno.ENOSPC:
        return f"no space left on the device of the image store {root}"
    if e.errno == errno.EDQUOT:
        return f"disk quota exceeded in the image store {root}"
    where = f": {e.filename}" if e.filename else ""
    return f"{e.strerror or e}{where}"


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}")
    tmp.write_text(text)
    os.replace(tmp, path)

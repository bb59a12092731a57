"""Building a Dockerfile context (a Harbor task's ``environment/``) into the image store with
buildah, offline.

``build_context(store, context)`` names the image by what goes into it:
``localhost/raas-build/HEX:latest``, HEX the first 32 hex digits of sha256 over the context's
digest (``dockerfile.context_digest``) and the store digests of its base images. A store that
holds that name already answers at once, without buildah: the tasks of a data set that share
one context build it once, and a base image pulled anew makes a new image.

Otherwise, with its own storage (``BuildahDirs``, under raas's cache: never the system's
/var/lib/containers):

1. each base image (``FROM``, ``COPY --from``) is taken from the store, never a registry:
   ``buildah pull oci:STORE:REF`` (the store is an OCI layout whose index names its images by
   their normalized refs), tagged in buildah's storage by its store digest (``base_tag``), the
   name the Dockerfile buildah reads gives it (so no other build's base of the same name can
   stand in for it); a base the store lacks is an ``ImageNotStored`` naming the command that
   gets it;
2. ``buildah build --pull=never`` with RUN steps cut off from the network and unable to
   chroot (``DROPPED_CAPS``). As root, every buildah command runs as root of a user namespace
   whose ids are unprivileged host ids (``BUILD_UID``..: ``raas.images.userns``), with a
   network namespace of its own for the build (``--isolation chroot``, which needs no OCI
   runtime but refuses ``--network none``): a Dockerfile's RUN steps are never the host's root,
   which a chroot does not hold. Its storage is then ``ROOT_DIR`` (which that id can reach),
   it reads a copy of the build context and of each base (the store is raas's alone; the copy
   is removed once pulled).
   As anyone else, ``--isolation rootless --network none`` (crun or runc, and subordinate ids
   in /etc/subuid);
3. ``buildah push`` to an OCI layout, whose manifest is rewritten to name the base layers by
   the store's own blobs (buildah recompresses them, to other digests: the same diff_ids), then
   ``store.import_``: so the base's blobs and unpacked layers are shared, never copied;
4. the built image is removed from buildah's storage (``rmi``); the base images stay there, as
   a cache of the store's, the ``KEEP_BASES`` last used (loading one anew costs a few seconds).

Every buildah process runs in its own process group, killed (SIGTERM, then SIGKILL) when the
build's deadline passes or the caller cancels; ``build_context_async`` runs the build in a
thread, so no event loop waits on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from raas.images import locks, manifests
from raas.images.dockerfile import ContextError, base_refs, context_digest, qualified
from raas.images.errors import ImageError, ImageNotStored
from raas.images.image import StoredImage
from raas.images.store import ImageStore
from raas.paths import host_paths

log = logging.getLogger(__name__)

INSTALL = "apt-get install buildah"
# As root, buildah runs as root of a user namespace whose ids are these host ids
# (``raas.images.userns``): a Dockerfile's RUN steps never run as the host's root. Below the
# sandboxes' ids (``uid_base``, 1,200,000 up), above any account's.
BUILD_UID = 1_100_000
BUILD_IDS = 65536
USERNS = Path(__file__).with_name("userns.py")
# As root, buildah's storage: every directory above it must let BUILD_UID pass (search, not
# list: /var/lib/raas is made 0711).
ROOT_DIR = Path("/var/lib/raas/buildah")
# What a RUN step may not do even as root of its namespace: chroot (the way out of buildah's
# chroot isolation, to the files its mount namespace shares with the host).
DROPPED_CAPS = ("CAP_SYS_CHROOT",)
REF_PREFIX = "localhost/raas-build/"
# Bases in buildah's storage: tagged by store digest, the last KEEP_BASES used kept.
BASE_TAG_PREFIX = "localhost/raas-base:"
KEEP_BASES = 8
Isolation = Literal["auto", "chroot", "rootless", "oci"]
_TAIL_LINES = 12  # of buildah's output, in an ImageError
_KILL_GRACE_S = 5.0


@dataclass(frozen=True)
class BuildResult:
    image: StoredImage
    cached: bool  # the store held it already: buildah did not run
    seconds: float  # wall time of this call
    context_digest: str


@dataclass(frozen=True)
class BuildahDirs:
    """buildah's own storage: ``root`` (images, layers), ``runroot`` (its locks and mounts),
    ``tmp`` (its big temporary files and our push layouts), and the locks of raas's builds."""

    base: Path

    @classmethod
    def default(cls) -> BuildahDirs:
        """``buildah`` in raas's cache dir ($RAAS_CACHE_DIR, else ~/.cache/raas); as root,
        ``ROOT_DIR``: buildah then runs as an unprivileged id, which must reach its storage
        (root's home is closed to it)."""
        if os.geteuid() == 0:
            return cls(ROOT_DIR)
        return cls(host_paths().cache_dir.expanduser() / "buildah")

    @property
    def root(self) -> Path:
        return self.base / "root"

    @property
    def runroot(self) -> Path:
        return self.base / "runroot"

    @property
    def tmp(self) -> Path:
        return self.base / "tmp"

    @property
    def locks(self) -> Path:
        return self.base / "locks"

    @property
    def home(self) -> Path:
        return self.base / "home"


@contextlib.contextmanager
def _reference_safe_tmp(parent: Path, prefix: str) -> Iterator[Path]:
    """A new private directory under ``parent`` whose name is a valid image reference component
    (lowercase hex after ``prefix``), removed after use. buildah names an image pulled from a
    layout after the layout's path and refuses the pull when that path is not a valid
    reference: tempfile's random names may end in ``_`` or hold ``___``."""
    path = parent / f"{prefix}{secrets.token_hex(8)}"
    path.mkdir(mode=0o700)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class Cancelled(ImageError):
    """The caller cancelled the build (``build_context_async``'s task was cancelled)."""


def build_context(
    store: ImageStore,
    context: Path,
    *,
    dockerfile: Path | None = None,
    timeout_s: float = 600.0,
    isolation: Isolation = "auto",
    dirs: BuildahDirs | None = None,
    cancel: threading.Event | None = None,
    cgroup: Sequence[Path] = (),
) -> BuildResult:
    """Build ``context`` (its ``Dockerfile``, or ``dockerfile``) into ``store``, or find it
    there; see the module docstring. ``timeout_s`` bounds the whole build; ``cancel``, once
    set, stops it (its processes killed) with ``Cancelled``; ``cgroup``: the ``cgroup.procs``
    files of a cgroup that holds every buildah process, RUN steps included, to its caps (as
    root; the caller makes and removes it). ImageError, one line, on any failure (buildah's own
    last lines where buildah failed)."""
    started = time.monotonic()
    deadline = started + timeout_s
    dockerfile = dockerfile or context / "Dockerfile"
    try:
        text = dockerfile.read_text()
        bases = base_refs(text)
        digest = context_digest(context, dockerfile)
    except ContextError as e:
        raise ImageError(f"cannot build {context}: {e}") from e
    except OSError as e:
        raise ImageError(f"cannot build {context}: {dockerfile}: {e.strerror or e}") from e
    stored = {ref: _base_image(store, ref, dockerfile) for ref in bases}
    ref = image_ref(digest, [stored[r].digest for r in bases])
    cached = _stored(store, ref)
    if cached is not None:
        return BuildResult(cached, True, time.monotonic() - started, digest)
    dirs = dirs or BuildahDirs.default()
    buildah = Buildah(dirs, deadline, cancel, isolation, cgroup)
    with locks.hold(dirs.locks / f"{ref.rsplit('/', 1)[-1].split(':')[0]}.lock"):
        cached = _stored(store, ref)  # another process built it while this one waited
        if cached is not None:
            return BuildResult(cached, True, time.monotonic() - started, digest)
        image = buildah.build(store, context, dockerfile, ref, stored, digest)
    return BuildResult(image, False, time.monotonic() - started, digest)


async def build_context_async(
    store: ImageStore,
    context: Path,
    *,
    dockerfile: Path | None = None,
    timeout_s: float = 600.0,
    isolation: Isolation = "auto",
    dirs: BuildahDirs | None = None,
    cgroup: Sequence[Path] = (),
) -> BuildResult:
    """``build_context`` in a thread. Cancelling the task kills buildah and waits (briefly:
    its process group's kill) for the thread to end before the CancelledError goes on."""
    cancel = threading.Event()
    work = asyncio.ensure_future(
        asyncio.to_thread(
            build_context,
            store,
            context,
            dockerfile=dockerfile,
            timeout_s=timeout_s,
            isolation=isolation,
            dirs=dirs,
            cancel=cancel,
            cgroup=cgroup,
        )
    )
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        cancel.set()
        with contextlib.suppress(BaseException):
            await work  # the thread ends once its child is killed; nothing runs on unseen
        raise


def base_tag(image: StoredImage) -> str:
    """The name of a stored base image in buildah's storage: its store digest."""
    return f"{BASE_TAG_PREFIX}{image.digest.removeprefix('sha256:')}"


def image_ref(context_digest: str, base_digests: Sequence[str]) -> str:
    """The store name of a build: ``localhost/raas-build/HEX:latest``."""
    h = hashlib.sha256(context_digest.encode())
    for digest in base_digests:
        h.update(b"\0" + digest.encode())
    return f"{REF_PREFIX}{h.hexdigest()[:32]}:latest"


def _stored(store: ImageStore, ref: str) -> StoredImage | None:
    try:
        return store.resolve(ref)
    except ImageNotStored:
        return None


def _base_image(store: ImageStore, ref: str, dockerfile: Path) -> StoredImage:
    if "@" in ref:
        raise ImageError(
            f"{dockerfile}: FROM {ref}: a base image named by digest is not supported; name it"
            " by tag (as it is named in the image store)"
        )
    try:
        return store.resolve(ref)
    except ImageNotStored:
        raise ImageNotStored(
            f"{dockerfile}: base image {ref} is not in the image store {store.root}: get it with"
            f" `raas images pull {ref}` (or `raas images import ARCHIVE --ref {ref}`); builds"
            " never pull"
        ) from None


class Buildah:
    """buildah on one storage (``dirs``), every call within ``deadline`` (monotonic)."""

    def __init__(
        self,
        dirs: BuildahDirs,
        deadline: float,
        cancel: threading.Event | None = None,
        isolation: Isolation = "auto",
        cgroup: Sequence[Path] = (),
    ) -> None:
        binary = shutil.which("buildah")
        if binary is None:
            raise ImageError(f"building a Dockerfile needs buildah: {INSTALL}")
        self.binary = binary
        self.dirs = dirs
        self.deadline = deadline
        self.cancel = cancel or threading.Event()
        self.root = os.geteuid() == 0
        self.cgroup = tuple(cgroup)
        self.isolation = isolation if isolation != "auto" else "chroot" if self.root else "rootless"
        if self.isolation == "chroot" and not self.root:
            raise ImageError("buildah --isolation chroot needs root here (use rootless)")

    # -- the build ---------------------------------------------------------------------------

    def build(
        self,
        store: ImageStore,
        context: Path,
        dockerfile: Path,
        ref: str,
        bases: dict[str, StoredImage],
        digest: str,
    ) -> StoredImage:
        for d in (self.dirs.root, self.dirs.runroot, self.dirs.tmp, self.dirs.locks):
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
        if self.root:
            _passable(self.dirs.base)
            (self.dirs.home / "run").mkdir(parents=True, exist_ok=True, mode=0o700)
            _own(self.dirs, (self.dirs.root, self.dirs.runroot, self.dirs.tmp, self.dirs.home))
        # Legacy: raas kept a copy of each base under bases/ for good (76 MB each, one per base
        # digest); a base now lives only in buildah's storage, pruned (``_prune_bases``).
        shutil.rmtree(self.dirs.base / "bases", ignore_errors=True)
        with contextlib.ExitStack() as using:
            for image in bases.values():
                using.enter_context(self._base_loaded(store, image))
            try:
                return self._build(store, context, dockerfile, ref, bases, digest)
            finally:
                using.close()
                self._prune_bases()

    def _build(
        self,
        store: ImageStore,
        context: Path,
        dockerfile: Path,
        ref: str,
        bases: dict[str, StoredImage],
        digest: str,
    ) -> StoredImage:
        with tempfile.TemporaryDirectory(prefix="build-", dir=self.dirs.tmp) as tmp:
            iid_file = Path(tmp) / "iid"
            # buildah's user (as root: an unprivileged id) reads a copy of the context and a
            # Dockerfile that names each base by its digest's tag in buildah's storage: a name
            # that no other build's base of the same name can move.
            names = {name: base_tag(image) for name, image in bases.items()}
            text = qualified(dockerfile.read_text(), names)
            copy = Path(tmp) / "context"
            shutil.copytree(context, copy, symlinks=True)
            (Path(tmp) / "Dockerfile").write_text(text)
            if self.root:
                _chown_tree(Path(tmp))
            context, dockerfile = copy, Path(tmp) / "Dockerfile"
            self._run(self._build_argv(context, dockerfile, iid_file, digest), what="build")
            image_id = iid_file.read_text().strip()
            try:
                layout = Path(tmp) / "layout"
                self._run(
                    ["push", "--quiet", image_id, f"oci:{layout}:latest"], what="push", net=False
                )
                reuse_base_blobs(layout, store, list(bases.values()))
                return store.import_(layout, ref)
            finally:
                self._remove_image(image_id)

    def _build_argv(self, context: Path, dockerfile: Path, iid: Path, digest: str) -> list[str]:
        argv = [
            "build",
            "--pull=never",  # base images come from the store (loaded above), never a registry
            f"--isolation={self.isolation}",
            "--force-rm",  # a failed build leaves no working container behind
            "--layers=false",  # one image, no intermediate ones to clean up
            "--format=oci",
            "--iidfile",
            str(iid),
            "--label",
            f"io.raas.build.context={digest}",
            "-f",
            str(dockerfile),
        ]
        if self.isolation != "chroot":
            argv.append("--network=none")  # chroot refuses it: its namespace is cut instead
        argv += [f"--cap-drop={cap}" for cap in DROPPED_CAPS]
        return [*argv, str(context)]

    def _base_lock(self, image: StoredImage) -> Path:
        return self.dirs.locks / f"base-{image.digest.replace(':', '-')}.lock"

    @contextlib.contextmanager
    def _base_loaded(self, store: ImageStore, image: StoredImage) -> Iterator[None]:
        """``image`` in buildah's storage as ``base_tag(image)``, for as long as this holds: a
        shared lock on its lock file keeps ``_prune_bases`` off it, while builds in parallel
        (a dataset's tasks) share it. One process loads a missing base (exclusive lock)."""
        lock, tag = self._base_lock(image), base_tag(image)
        for _ in range(3):  # a prune between a load and its use makes one more load
            with locks.hold(lock, shared=True):
                if self._has_image(tag):
                    os.utime(lock)  # its use, which pruning goes by
                    yield
                    return
            with locks.hold(lock):
                if not self._has_image(tag):  # another loader was first
                    self._load_base(store, image)
                os.utime(lock)
        raise ImageError(f"base image {image.ref} was removed from buildah's storage thrice")

    def _has_image(self, name: str) -> bool:
        try:
            self._run(["inspect", "--type", "image", name], what="inspect", net=False)
        except Cancelled:
            raise
        except ImageError:
            return False
        return True

    def _load_base(self, store: ImageStore, image: StoredImage) -> None:
        """The store's ``image`` into buildah's storage, tagged ``base_tag(image)``."""
        with _reference_safe_tmp(self.dirs.tmp, "base-") as tmp:
            layout, tag = store.root, image.ref
            if self.root:  # the store is raas's alone: buildah's user reads a copy
                layout, tag = self._base_copy(store, image, Path(tmp) / "layout"), "base"
            image_id = self._run(
                ["pull", "--quiet", f"oci:{layout}:{tag}"], what=f"load {image.ref}", net=False
            ).strip()
        image_id = image_id.splitlines()[-1]
        self._run(["tag", image_id, base_tag(image)], what="tag", net=False)
        # buildah names an image pulled from a layout after the layout's path; that name is
        # dropped, so the image has only its digest's tag, which ``_prune_bases`` removes.
        stray = f"localhost/{layout.as_posix().strip('/').lower()}:latest"
        with contextlib.suppress(ImageError):
            self._run(["rmi", stray], what="untag", net=False)

    def _base_copy(self, store: ImageStore, image: StoredImage, layout: Path) -> Path:
        """A copy of the stored ``image`` as an OCI layout at ``layout`` that buildah's user may
        read (removed once buildah has pulled it)."""
        skopeo = shutil.which("skopeo")
        if skopeo is None:
            raise ImageError("loading a base image needs skopeo: apt-get install skopeo")
        store_layout = f"oci:{store.root}:{image.ref}"
        argv = [skopeo, "copy", "--quiet", store_layout, f"oci:{layout}:base"]
        with _group(argv, dict(os.environ)) as proc:
            out = _wait(proc, max(self.deadline - time.monotonic(), 1.0), self.cancel)
        if out.timed_out or out.cancelled or proc.returncode != 0:
            raise ImageError(f"copying base image {image.ref} for buildah: {_tail(out.output)}")
        _chown_tree(layout.parent)
        return layout

    def _prune_bases(self) -> None:
        """Remove from buildah's storage the bases beyond the ``KEEP_BASES`` last used that no
        build is using (a base pulled anew into the store is a new digest: without this, every
        old one stays). One in use by another process is skipped (its lock is held); removing
        one costs, at worst, loading it again."""
        for lock in _by_last_use(self.dirs.locks.glob("base-*.lock"))[KEEP_BASES:]:
            try:
                with locks.hold(lock, wait=False):
                    tag = f"{BASE_TAG_PREFIX}{lock.stem.removeprefix('base-sha256-')}"
                    with contextlib.suppress(ImageError):
                        self._run(
                            ["rmi", tag], what="prune", net=False, check_cancel=False, min_s=30.0
                        )
                    lock.unlink()
            except (locks.Busy, FileNotFoundError):
                continue

    def _remove_image(self, image_id: str) -> None:
        try:
            self._run(["rmi", image_id], what="rmi", net=False, check_cancel=False, min_s=30.0)
        except ImageError as e:  # the image is in the store already; a leftover is only space
            log.warning("could not remove built image %s from buildah's storage: %s", image_id, e)

    # -- running buildah ---------------------------------------------------------------------

    def _argv(self, args: Sequence[str], net: bool) -> list[str]:
        argv = [
            self.binary,
            "--root",
            str(self.dirs.root),
            "--runroot",
            str(self.dirs.runroot),
            *args,
        ]
        if self.root:
            # Root of a namespace of unprivileged host ids (and, for the build, without a
            # network: chroot isolation refuses --network none).
            flag = "net" if net else "nonet"
            userns = [sys.executable, "-I", "-S", str(USERNS), str(BUILD_UID), str(BUILD_IDS)]
            joins = [arg for procs in self.cgroup for arg in ("--cgroup", str(procs))]
            argv = [*userns, flag, *joins, "--", *argv]
        return argv

    def _run(
        self,
        args: Sequence[str],
        *,
        what: str,
        net: bool = True,
        check_cancel: bool = True,
        min_s: float = 0.0,
    ) -> str:
        """buildah ``args`` (``net``: the build, whose RUN steps must have no network); its
        stdout. ImageError with its last lines if it fails, or when the deadline passes or the
        build is cancelled (its process group killed)."""
        argv = self._argv(args, net)
        env = {**os.environ, "TMPDIR": str(self.dirs.tmp), "BUILDAH_LAYERS": "false"}
        if self.root:  # buildah's user has no home of the host's: its own, beside its storage
            env |= {"HOME": str(self.dirs.home), "XDG_RUNTIME_DIR": str(self.dirs.home / "run")}
        env.pop("BUILDAH_ISOLATION", None)  # the flag decides
        with _group(argv, env) as proc:
            budget = max(self.deadline - time.monotonic(), min_s)
            out = _wait(proc, budget, self.cancel if check_cancel else None)
        if out.cancelled:
            raise Cancelled(f"buildah {what} cancelled")
        if out.timed_out:
            raise ImageError(
                f"buildah {what} ran past the build's deadline (killed): {_tail(out.output)}"
            )
        if proc.returncode != 0:
            raise ImageError(f"buildah {what} failed ({proc.returncode}): {_tail(out.output)}")
        return out.stdout


@dataclass
class _Outcome:
    stdout: str
    output: str  # stdout, then stderr: buildah says what failed last, on stderr
    timed_out: bool = False
    cancelled: bool = False


@contextlib.contextmanager
def _group(argv: list[str], env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    """``argv`` in a new process group (a session of its own), killed if left running."""
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        env=env,
        start_new_session=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            _kill_group(proc)


def _wait(proc: subprocess.Popen[str], budget_s: float, cancel: threading.Event | None) -> _Outcome:
    """Collect ``proc``'s output until it exits, ``budget_s`` passes or ``cancel`` is set
    (checked every 0.2 s: the communicate below returns at once when the process ends)."""
    end = time.monotonic() + budget_s
    while True:
        step = min(0.2, max(end - time.monotonic(), 0.0)) if cancel is not None else budget_s
        try:
            stdout, stderr = proc.communicate(timeout=max(step, 0.001))
            return _Outcome(stdout, stdout + stderr)
        except subprocess.TimeoutExpired:
            cancelled = cancel is not None and cancel.is_set()
            if cancelled or time.monotonic() >= end:
                _kill_group(proc)
                stdout, stderr = proc.communicate()
                return _Outcome(
                    stdout, stdout + stderr, timed_out=not cancelled, cancelled=cancelled
                )


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGTERM to the group (buildah removes its working container), SIGKILL after a grace."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=_KILL_GRACE_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # what of the group outlived its leader too
    proc.wait()


def _passable(base: Path) -> None:
    """Every directory above ``base`` lets others pass (buildah's unprivileged id must reach
    its storage); /var/lib/raas, raas's own, is made so. An ImageError names one that does
    not."""
    if base.parent == ROOT_DIR.parent:
        base.parent.mkdir(parents=True, exist_ok=True)
        st = base.parent.lstat()
        if stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and not stat.S_ISLNK(st.st_mode):
            os.chmod(base.parent, 0o711)
    for above in base.parents:
        if not os.stat(above).st_mode & stat.S_IXOTH:
            raise ImageError(
                f"buildah's storage {base} is below {above}, which other users cannot pass:"
                f" buildah runs as uid {BUILD_UID} here (put its storage elsewhere, as"
                f" {ROOT_DIR} is)"
            )


def _own(dirs: BuildahDirs, trees: Sequence[Path]) -> None:
    """buildah's storage belongs to the build ids' root (made so once: a storage an older raas
    filled as the host's root is given over whole)."""
    for tree in trees:
        # What a buildah run as the host's root would have made at the top (its overlay's
        # ``l``, say) stops buildah's user: given over again, whole.
        top = [tree, *tree.iterdir(), *(d for d in tree.glob("*/*") if d.is_dir())]
        if any(p.lstat().st_uid != BUILD_UID for p in top):
            _chown_tree(tree)
    _chown_tree(dirs.base, recursive=False)


def _chown_tree(path: Path, recursive: bool = True) -> None:
    """``path`` (and all under it) to the build ids' root; links themselves, never followed."""
    os.chown(path, BUILD_UID, BUILD_UID, follow_symlinks=False)
    if not recursive:
        return
    for top, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            os.chown(os.path.join(top, name), BUILD_UID, BUILD_UID, follow_symlinks=False)


def _by_last_use(paths: Iterator[Path]) -> list[Path]:
    """``paths``, the most recently modified first (one removed meanwhile is left out)."""
    used = []
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            used.append((path.stat().st_mtime, path))
    return [path for _, path in sorted(used, reverse=True)]


def _tail(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return " | ".join(lines[-_TAIL_LINES:]) or "(no output)"


# -- sharing the base's blobs ------------------------------------------------------------------


def reuse_base_blobs(layout: Path, store: ImageStore, bases: Sequence[StoredImage]) -> int:
    """In the one-image OCI ``layout`` buildah pushed, name each layer a base image has (the
    same diff_id) by the base's blob in the store, instead of buildah's recompression of it;
    the number of layers so named. The content is the same (the config's diff_ids are not
    touched); the store then keeps one blob per layer."""
    known: dict[str, dict[str, object]] = {}
    for base in bases:
        image = manifests.read_image(store.blob_dir, base.digest)
        for layer in image.layers:
            known[layer.diff_id] = {
                "mediaType": layer.media_type,
                "digest": layer.digest,
                "size": manifests.blob_path(store.blob_dir, layer.digest).stat().st_size,
            }
    blob_dir = layout / "blobs"
    index = json.loads((layout / "index.json").read_text())
    (descriptor,) = index["manifests"]
    manifest = manifests.read_json(blob_dir, descriptor["digest"])
    config = manifests.read_json(blob_dir, manifest["config"]["digest"])
    diff_ids = config["rootfs"]["diff_ids"]
    replaced = 0
    for i, (layer, diff_id) in enumerate(zip(manifest["layers"], diff_ids, strict=True)):
        ours = known.get(diff_id)
        if ours is None or ours["digest"] == layer["digest"]:
            continue
        manifests.blob_path(blob_dir, layer["digest"]).unlink(missing_ok=True)
        _link_or_copy(manifests.blob_path(store.blob_dir, str(ours["digest"])), blob_dir, ours)
        manifest["layers"][i] = {**layer, **ours}
        replaced += 1
    if replaced:
        body = json.dumps(manifest, separators=(",", ":")).encode()
        new = "sha256:" + hashlib.sha256(body).hexdigest()
        manifests.blob_path(blob_dir, new).write_bytes(body)
        manifests.blob_path(blob_dir, descriptor["digest"]).unlink()
        descriptor.update(digest=new, size=len(body))
        (layout / "index.json").write_text(json.dumps(index))
    return replaced


def _link_or_copy(blob: Path, blob_dir: Path, desc: dict[str, object]) -> None:
    dest = manifests.blob_path(blob_dir, str(desc["digest"]))
    if dest.exists():
        return
    try:
        os.link(blob, dest)  # the store and raas's cache usually share a file system
    except OSError:
        shutil.copyfile(blob, dest)

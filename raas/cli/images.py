"""`raas images`: the OCI image store (pull, import, build-context, ls, rm, prune, prefetch)
and Apptainer images for the apptainer sandbox provider (build, resolve)."""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import click

if TYPE_CHECKING:
    from raas.images.store import ImageStore


@click.group(short_help="Task images: the OCI image store, and Apptainer images.")
def images() -> None:
    """Task images (SWE-bench, SWE-Gym, R2E-Gym environments...).

    The OCI image store (pull, import, build-context, ls, rm, prune, prefetch) keeps images from
    registries, archives or Dockerfiles with each layer unpacked once and shared by every image
    that holds it; sandboxes run on an overlay over an image's layers. It lives in --store DIR,
    default $RAAS_IMAGE_STORE, else $RAAS_CACHE_DIR/oci, else ~/.cache/raas/oci; several servers
    on a node may share it.
    Pulls use skopeo (apt-get install skopeo) and its registry logins (--authfile, else
    $REGISTRY_AUTH_FILE, else `skopeo login`'s file).

    Apptainer images (build, resolve) are for the `apptainer` sandbox provider. Its sandboxes
    run SIF files or sandbox directories from one local directory (the provider's images_dir:
    $RAAS_APPTAINER_IMAGES, default ~/.cache/raas/images). Task images keep their Docker names
    (swebench/sweb.eval.x86_64.django__django-11099:latest) and are found there as NAME.sif or
    a directory NAME, with NAME the image name, every character but letters, digits, '.', '_'
    and '-' made '_' (or only its last part, as `apptainer pull` names it), or through the
    provider's image_map. `raas images resolve NAME` shows which file a name finds.
    """


@images.command("build")
@click.argument("rootfs_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
@click.option(
    "--sif/--sandbox-dir",
    default=None,
    help="A SIF file (one compressed file, read-only, what HPC sites copy around) or a sandbox"
    " directory (a plain copy; starts faster).  [default: SIF when OUT ends in .sif, else a"
    " sandbox directory]",
)
@click.option("--binary", help="apptainer or singularity.  [default: the first on PATH]")
@click.option("--force", is_flag=True, help="Replace OUT if it exists.")
@click.option("--fakeroot", is_flag=True, help="apptainer build --fakeroot (not as root).")
@click.option(
    "--mksquashfs-args",
    help="For a SIF, e.g. '-comp zstd', or '-noI -noD -noF' (no compression: a larger file,"
    " built in seconds instead of minutes).",
)
def images_build(
    rootfs_dir: Path,
    out: Path,
    sif: bool | None,
    binary: str | None,
    force: bool,
    fakeroot: bool,
    mksquashfs_args: str | None,
) -> None:
    """Build an image at OUT from ROOTFS_DIR, a root filesystem directory, offline.

    ROOTFS_DIR is an unpacked root filesystem (from debootstrap, `docker export | tar -x`, a
    SWE-bench environment...); it needs a python3 (3.8+), which runs raas's action server.
    Runs `apptainer build [--sandbox] OUT ROOTFS_DIR`, which reads only the local directory.
    Example: `raas images build ./rootfs ~/.cache/raas/images/my-env.sif`.
    """
    from raas.images.build import build_image
    from raas.images.errors import ImageError
    from raas.sandbox.apptainer import find_binary
    from raas.sandbox.client import SandboxError

    kind: Literal["sif", "sandbox"] = (
        "sif" if (sif if sif is not None else out.suffix == ".sif") else "sandbox"
    )
    try:
        found = find_binary(binary)
        warnings = build_image(
            rootfs_dir, out, kind, found, force, fakeroot, mksquashfs_args=mksquashfs_args
        )
    except (SandboxError, ImageError) as e:  # no apptainer; a build that failed
        raise click.ClickException(str(e)) from e
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)
    click.echo(f"built {'SIF' if kind == 'sif' else 'sandbox directory'} {out}")


@images.command("resolve")
@click.argument("name")
@click.option(
    "--images-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="[default: $RAAS_APPTAINER_IMAGES or ~/.cache/raas/images]",
)
def images_resolve(name: str, images_dir: Path | None) -> None:
    """Print the SIF or sandbox directory that image NAME resolves to."""
    from raas.images.errors import ImageError
    from raas.images.sif_dir import resolve_image
    from raas.sandbox import ApptainerConfig

    config = ApptainerConfig()
    if images_dir is not None:
        config = config.model_copy(update={"images_dir": images_dir})
    try:
        click.echo(resolve_image(config, name))
    except ImageError as e:
        raise click.ClickException(str(e)) from e


def _store_option(f: Any) -> Any:
    return click.option(
        "--store",
        "store_dir",
        type=click.Path(file_okay=False, path_type=Path),
        help="The image store directory.  [default: $RAAS_IMAGE_STORE, else"
        " $RAAS_CACHE_DIR/oci, else ~/.cache/raas/oci]",
    )(f)


def _max_bytes_option(f: Any) -> Any:
    return click.option(
        "--max-gb",
        type=click.FloatRange(min=0, min_open=True),
        help="After pulling, remove the least recently used images no sandbox is using until"
        " the store fits this size.",
    )(f)


def _pull_options(f: Any) -> Any:
    f = click.option(
        "--tls-verify",
        type=bool,
        default=True,
        show_default=True,
        help="Use HTTPS and check the registry's certificate; --tls-verify=false for a"
        " plain-HTTP registry (such as one on 127.0.0.1).",
    )(f)
    return click.option(
        "--authfile",
        type=click.Path(dir_okay=False, path_type=Path),
        help="Registry credentials (skopeo's auth.json).  [default: $REGISTRY_AUTH_FILE, else"
        " skopeo's own]",
    )(f)


def _store(store_dir: Path | None, max_gb: float | None = None) -> ImageStore:
    from raas.images.store import ImageStore

    max_bytes = int(max_gb * 1e9) if max_gb is not None else None
    return ImageStore(store_dir, max_bytes=max_bytes)


@contextlib.contextmanager
def _one_line() -> Iterator[None]:
    from raas.images.errors import ImageError

    try:
        yield
    except ImageError as e:
        raise click.ClickException(str(e)) from e


def human_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def _ago(t: float) -> str:
    if t <= 0:
        return "never"
    s = max(0.0, time.time() - t)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s / size:.0f}{unit} ago"
    return f"{s:.0f}s ago"


@images.command("pull")
@click.argument("ref")
@_pull_options
@_store_option
@_max_bytes_option
def images_pull(
    ref: str, tls_verify: bool, authfile: Path | None, store_dir: Path | None, max_gb: float | None
) -> None:
    """Pull image REF from its registry into the store and unpack its new layers.

    REF is a Docker reference: NAME[:TAG] or NAME@sha256:DIGEST, e.g.
    swebench/sweb.eval.x86_64.django__django-11099 (docker.io and :latest are implied), or
    127.0.0.1:5000/my/env:v1 --tls-verify=false. Digests are checked as layers arrive and again
    as they are unpacked.
    """
    store = _store(store_dir, max_gb)
    with _one_line():
        image = store.pull(ref, tls_verify=tls_verify, authfile=authfile)
    click.echo(f"pulled {image.ref} {image.digest} ({len(image.layers)} layers)")


@images.command("import")
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option("--ref", help="The name to store it under (and which image, in a file of several).")
@_store_option
@_max_bytes_option
def images_import(
    path: Path, ref: str | None, store_dir: Path | None, max_gb: float | None
) -> None:
    """Import the image at PATH: a `docker save` archive, an OCI image layout (a directory or a
    tar) or an Apptainer/Singularity .sif (its root partition as one layer; needs unsquashfs).
    It is named as the archive names it (a .sif: its file name), or --ref."""
    store = _store(store_dir, max_gb)
    with _one_line():
        image = store.import_(path, ref)
    click.echo(f"imported {image.ref} {image.digest} ({len(image.layers)} layers)")


@images.command("build-context")
@click.argument(
    "context", type=click.Path(exists=True, file_okay=False, path_type=Path), metavar="DIR"
)
@click.option(
    "--dockerfile",
    "-f",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The Dockerfile.  [default: DIR/Dockerfile]",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=1),
    default=600.0,
    show_default=True,
    help="Seconds the whole build may take; buildah is killed after them.",
)
@click.option(
    "--isolation",
    type=click.Choice(["auto", "chroot", "rootless", "oci"]),
    default="auto",
    show_default=True,
    help="How buildah runs RUN steps: auto is chroot as root (no OCI runtime needed; the"
    " build runs in a network namespace of its own), rootless otherwise (crun or runc).",
)
@_store_option
def images_build_context(
    context: Path,
    dockerfile: Path | None,
    timeout_s: float,
    isolation: Literal["auto", "chroot", "rootless", "oci"],
    store_dir: Path | None,
) -> None:
    """Build the Dockerfile context DIR (a Harbor task's environment/) into the store, offline.

    The image is named localhost/raas-build/HEX:latest, HEX from the digest of DIR's files
    (paths, contents, executable bits, symlink targets), the Dockerfile and its base images'
    digests in the store: a context built before is found in the store and not built again.
    Base images (FROM, COPY --from) come from the store, never from a registry: get them first
    with `raas images pull REF` or `raas images import`. RUN steps have no network and, as
    root, a sandbox's default caps on memory, processes and CPUs. buildah (apt-get install
    buildah) keeps its own storage in buildah/ of raas's cache dir ($RAAS_CACHE_DIR, else
    ~/.cache/raas; as root /var/lib/raas/buildah), where the 8 base images last used stay
    between builds.
    Prints the stored ref, whether it was cached, and the seconds taken.
    """
    from raas.images.buildah import build_context
    from raas.sandbox import SandboxLimits, cgroups, runtime_root

    store = _store(store_dir)
    # RUN steps held to a sandbox's default caps, as a server's builds are (where raas can
    # write cgroups: as root).
    limits = SandboxLimits()
    caps = cgroups.Caps(limits.sandbox_memory_bytes, limits.sandbox_tasks, limits.cpus)
    group = cgroups.create(runtime_root(), f"build-{secrets.token_hex(8)}", caps)
    try:
        with _one_line():
            result = build_context(
                store,
                context,
                dockerfile=dockerfile,
                timeout_s=timeout_s,
                isolation=isolation,
                cgroup=group.procs_files() if group is not None else (),
            )
    finally:
        if group is not None:
            group.remove()
    how = "cached" if result.cached else "built"
    click.echo(f"{result.image.ref} {how} in {result.seconds:.2f} s ({result.image.digest})")


@images.command("ls")
@_store_option
def images_ls(store_dir: Path | None) -> None:
    """List the stored images, most recently used first, with the store's size and its share
    ratio (the layers' size if every image had its own copy, over their size as stored)."""
    store = _store(store_dir)
    with _one_line():
        infos = store.list()
        usage = store.usage()
    rows = [("REF", "DIGEST", "LAYERS", "SIZE", "LAST USED")]
    for info in infos:
        ref = info.ref if len(info.ref) <= 40 else "..." + info.ref[-37:]
        used = "in use" if info.in_use else _ago(info.last_used)
        digest = info.digest.removeprefix("sha256:")[:12]
        rows.append((ref, digest, str(info.layers), human_bytes(info.size), used))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    click.echo(
        f"{usage.images} images, {usage.layers} layers: {human_bytes(usage.total_bytes)} in all,"
        f" layers {human_bytes(usage.layer_bytes)}, share ratio {usage.share_ratio:.2f}"
    )
    click.echo(f"store: {store.root}")


@images.command("rm")
@click.argument("refs", nargs=-1, required=True)
@_store_option
def images_rm(refs: tuple[str, ...], store_dir: Path | None) -> None:
    """Remove images REFS... from the store, and the layers no other image needs (not an image
    a running sandbox is using)."""
    store = _store(store_dir)
    with _one_line():
        for ref in refs:
            store.remove(ref)
            click.echo(f"removed {ref}")


@images.command("prune")
@_store_option
def images_prune(store_dir: Path | None) -> None:
    """Remove the blobs, layers and half-unpacked layers no image refers to (never those of an
    image a running sandbox is using)."""
    store = _store(store_dir)
    with _one_line():
        result = store.prune()
    click.echo(
        f"removed {result.layers} layers and {result.blobs} blobs ({human_bytes(result.bytes)})"
    )


@images.command("prefetch")
@click.argument("dataset", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_pull_options
@_store_option
@_max_bytes_option
def images_prefetch(
    dataset: Path,
    tls_verify: bool,
    authfile: Path | None,
    store_dir: Path | None,
    max_gb: float | None,
) -> None:
    """Pull every image DATASET's rows run in, once each: a task file (JSONL of tasks or of
    jobs) or a verl Parquet file. A row's image is its `image_name` (SWE-bench), its
    `docker_image` (R2E-Gym), or, for a row with a `repo` and `base_commit` that names none,
    SWE-Gym's image of its `instance_id`, as the swe task finds it. Images already stored are
    not pulled again; a failed pull is reported and the others go on (exit status 1 at the
    end)."""
    from raas.client.task_files import TaskFileError, read_rows

    try:
        refs = dataset_images([row for _, row in read_rows(dataset)])
    except TaskFileError as e:
        raise click.ClickException(str(e)) from e
    if not refs:
        raise click.ClickException(
            f"{dataset} names no images (image_name / docker_image, or SWE-Gym rows: repo and"
            " base_commit)"
        )
    store = _store(store_dir, max_gb)
    failed = 0
    for i, ref in enumerate(refs, 1):
        from raas.images.errors import ImageError

        try:
            store.resolve(ref)
            click.echo(f"[{i}/{len(refs)}] {ref}: stored already")
            continue
        except ImageError:
            pass
        try:
            store.pull(ref, tls_verify=tls_verify, authfile=authfile)
            click.echo(f"[{i}/{len(refs)}] {ref}: pulled")
        except ImageError as e:
            failed += 1
            click.echo(f"[{i}/{len(refs)}] {ref}: FAILED: {e}", err=True)
    if failed:
        raise click.ClickException(f"{failed} of {len(refs)} images could not be pulled")


def dataset_images(rows: list[dict[str, Any]]) -> list[str]:
    """The images task rows run in, in order, once each (an instance's, or in verl's
    extra_info): as the swe task finds a row's image (``raas.images.refs.image_of``), for
    rows that name one or are SWE rows (a repo and a base_commit)."""
    from raas.images.refs import IMAGE_FIELDS, image_of

    found: dict[str, None] = {}
    for row in rows:
        inner = row.get("instance")
        instance: dict[str, Any] = inner if isinstance(inner, dict) else row
        for where in (instance, instance.get("extra_info")):
            if not isinstance(where, dict):
                continue
            named = any(isinstance(where.get(k), str) and where[k] for k in IMAGE_FIELDS)
            name = (
                image_of(where)
                if named or (where.get("repo") and where.get("base_commit"))
                else None
            )
            if name is not None:
                found.setdefault(name, None)
                break
    return list(found)

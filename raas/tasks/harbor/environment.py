"""A Harbor task's image: its ``docker_image`` from the image store, or its ``environment/``
built with buildah into the store (``raas.images.buildah``: named by the build context's digest
and its bases', so the tasks of a dataset that share an environment build it once)."""

from __future__ import annotations

import asyncio
import os
import re
import tempfile
from pathlib import Path

from raas.images.buildah import build_context_async
from raas.images.errors import ImageError, ImageNotStored
from raas.images.store import ImageStore
from raas.tasks.harbor.instance import HarborInstance
from raas.tasks.services import TaskServices

SHIPPED_BASE = "raas/harbor-base:"
IMPORT_BASE = "scripts/harbor/import-base.sh"
SHIPPED_BASE_MISSING = re.compile(r"base image (" + re.escape(SHIPPED_BASE) + r"\S+) is not in")


async def task_image(services: TaskServices, instance: HarborInstance) -> str:
    """The store's name of the task's image, built first where it must be (an ImageError,
    naming the task, where it cannot be)."""
    env = instance.config.environment
    if env.docker_image is not None:
        return env.docker_image
    store = services.image_store
    if not isinstance(store, ImageStore):  # a test's resolver, or none opened yet
        store = ImageStore(services.image_store_dir())
    with tempfile.TemporaryDirectory(prefix="raas-harbor-context-") as tmp:
        context = Path(tmp)
        await asyncio.to_thread(write_context, context, instance.under("environment"))
        try:
            async with services.build_cgroup(instance.config.limits_update()) as cgroup:
                built = await build_context_async(
                    store, context, timeout_s=env.build_timeout_sec, cgroup=cgroup
                )
        except ImageNotStored as e:
            missing = str(e).replace(str(context / "Dockerfile"), "environment/Dockerfile")
            base = SHIPPED_BASE_MISSING.search(missing)
            if base is not None:  # its way in said first: a long line is cut at its end
                missing = (
                    f"run {IMPORT_BASE} (as root, once): the shipped tasks' base {base[1]} is not"
                    f" in the image store {store.root}"
                )
            raise ImageNotStored(f"{instance.label}: {missing}") from e
        except ImageError as e:  # named by the task, not by the build's scratch directory
            said = str(e).replace(str(context / "Dockerfile"), "environment/Dockerfile")
            raise type(e)(f"{instance.label}: {said}") from e
    return built.image.ref


def write_context(root: Path, files: dict[str, tuple[bytes, bool]]) -> None:
    """``files`` (path below environment/ -> bytes, executable) as a directory at ``root``;
    their paths were checked at submission (relative, inside the task)."""
    for rel, (data, executable) in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(path, 0o755 if executable else 0o644)

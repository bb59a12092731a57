"""A Dockerfile context read without building (``raas.images.dockerfile``), and what
``build_context`` refuses before buildah runs: in ``make test``, no buildah, no registry.

The builds themselves are in ``test_dockerfile.py`` (the ``images`` tier)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from raas.images.buildah import build_context, image_ref
from raas.images.dockerfile import ContextError, base_refs, context_digest, instructions
from raas.images.errors import ImageError, ImageNotStored
from raas.images.store import ImageStore

# -- FROM lines ----------------------------------------------------------------------------


def test_multi_stage_froms_name_only_images_not_earlier_stages() -> None:
    text = """\
# syntax=docker/dockerfile:1
FROM python:3.11-slim AS Builder
RUN pip wheel . \\
    -w /wheels
from --platform=linux/amd64 builder as test
FROM 0
FROM scratch
COPY --from=builder /wheels /wheels
COPY --from=ghcr.io/astral-sh/uv:0.4 /uv /bin/uv
RUN --mount=type=cache,from=debian:bookworm,target=/x true
FROM python:3.11-slim
"""
    assert base_refs(text) == ["python:3.11-slim", "ghcr.io/astral-sh/uv:0.4", "debian:bookworm"]


def test_global_args_with_defaults_are_substituted_and_others_refused() -> None:
    text = 'ARG PY=3.12\nARG DISTRO="bookworm"\nFROM python:${PY}-$DISTRO\n'
    assert base_refs(text) == ["python:3.12-bookworm"]
    with pytest.raises(ContextError, match="line 2: FROM python:\\$PY: ARG PY has no default"):
        base_refs("ARG PY\nFROM python:$PY\n")
    with pytest.raises(ContextError, match="ARG TAG is not declared before the first FROM"):
        base_refs("FROM ubuntu\nARG TAG=1\nFROM ubuntu:$TAG\n")


def test_a_dockerfile_without_from_or_ending_mid_line_is_refused() -> None:
    with pytest.raises(ContextError, match="has no FROM"):
        base_refs("# nothing\n")
    with pytest.raises(ContextError, match="line 2: RUN before the first FROM"):
        base_refs("ARG X=1\nRUN true\nFROM a\n")
    with pytest.raises(ContextError, match="ends inside a continued instruction"):
        instructions("FROM a\nRUN echo \\\n")


def test_continued_lines_join_and_keep_their_first_line_number() -> None:
    found = instructions("FROM a\n\nRUN one \\\n  # a comment\n  two\nENV X=1\n")
    assert [(i.line, i.keyword, i.args) for i in found] == [
        (1, "FROM", "a"),
        (3, "RUN", "one two"),
        (6, "ENV", "X=1"),
    ]


# -- the context's digest ------------------------------------------------------------------


def _context(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "Dockerfile").write_text("FROM raas/harbor-base:bookworm\nCOPY . /app\n")
    (root / "a.txt").write_text("a\n")
    (root / "sub" / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (root / "link").symlink_to("sub/run.sh")
    return root


def test_the_digest_changes_with_content_names_exec_bits_links_and_the_dockerfile(
    tmp_path: Path,
) -> None:
    ctx = _context(tmp_path / "ctx")
    first = context_digest(ctx, ctx / "Dockerfile")
    assert first == context_digest(ctx, ctx / "Dockerfile")  # stable
    changes = [
        lambda: (ctx / "a.txt").write_text("b\n"),
        lambda: (ctx / "sub" / "run.sh").chmod(0o755),
        lambda: (ctx / "a.txt").rename(ctx / "b.txt"),
        lambda: ((ctx / "link").unlink(), (ctx / "link").symlink_to("a.txt")),
        lambda: (ctx / "empty").mkdir(),
        lambda: (ctx / "Dockerfile").write_text("FROM raas/harbor-base:bookworm\n"),
    ]
    seen = {first}
    for change in changes:
        change()
        digest = context_digest(ctx, ctx / "Dockerfile")
        assert digest not in seen
        seen.add(digest)


def test_a_copy_of_the_context_elsewhere_has_the_same_digest(tmp_path: Path) -> None:
    one = _context(tmp_path / "one")
    two = _context(tmp_path / "deeper" / "two")
    os.utime(two / "a.txt", (0, 0))  # times are not content
    assert context_digest(one, one / "Dockerfile") == context_digest(two, two / "Dockerfile")


def test_the_build_ref_depends_on_the_base_images_digests() -> None:
    digest = "sha256:" + "0" * 64
    ref = image_ref(digest, ["sha256:" + "1" * 64])
    assert ref.startswith("localhost/raas-build/") and ref.endswith(":latest")
    assert ref != image_ref(digest, ["sha256:" + "2" * 64])
    assert len(ref.removeprefix("localhost/raas-build/").removesuffix(":latest")) == 32


@pytest.mark.parametrize(
    "target", ["../../outside.txt", "/etc/passwd", "../sub/../../../outside.txt"]
)
def test_a_symlink_out_of_the_context_is_refused_naming_it(tmp_path: Path, target: str) -> None:
    ctx = _context(tmp_path / "ctx")
    (tmp_path / "outside.txt").write_text("secret\n")
    (ctx / "sub" / "escape").symlink_to(target)
    with pytest.raises(ContextError, match=r"sub/escape: a symlink to .*outside the build context"):
        context_digest(ctx, ctx / "Dockerfile")


def test_a_chain_of_links_that_ends_outside_is_refused(tmp_path: Path) -> None:
    ctx = _context(tmp_path / "ctx")
    (ctx / "up").symlink_to("..")  # leaves the context
    (ctx / "hop").symlink_to("up")  # inside by its text, outside once followed
    with pytest.raises(ContextError, match="symlink to"):
        context_digest(ctx, ctx / "Dockerfile")
    (ctx / "up").unlink()
    (ctx / "up").symlink_to("sub")
    context_digest(ctx, ctx / "Dockerfile")  # the same chain, inside
    (ctx / "sub" / "out").symlink_to("../../x")
    with pytest.raises(ContextError, match=r"ctx/sub/out: a symlink to \.\./\.\./x, outside"):
        context_digest(ctx, ctx / "Dockerfile")


def test_a_fifo_in_the_context_is_refused_naming_it(tmp_path: Path) -> None:
    ctx = _context(tmp_path / "ctx")
    os.mkfifo(ctx / "sub" / "pipe")
    with pytest.raises(ContextError, match="sub/pipe: not a regular file, directory or symlink"):
        context_digest(ctx, ctx / "Dockerfile")


# -- build_context's refusals before buildah -------------------------------------------------


def test_a_base_the_store_lacks_names_the_command_that_gets_it(tmp_path: Path) -> None:
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text("FROM raas/not-there:v1\nRUN true\n")
    with pytest.raises(ImageNotStored) as e:
        build_context(ImageStore(tmp_path / "store"), ctx)
    message = str(e.value)
    assert "base image raas/not-there:v1 is not in the image store" in message
    assert "raas images pull raas/not-there:v1" in message and "raas images import" in message


def test_an_escaping_symlink_fails_the_build_as_an_image_error(tmp_path: Path) -> None:
    ctx = _context(tmp_path / "ctx")
    (ctx / "leak").symlink_to("/etc/shadow")
    with pytest.raises(ImageError, match=r"cannot build .*ctx/leak: a symlink to /etc/shadow"):
        build_context(ImageStore(tmp_path / "store"), ctx)


def test_a_base_named_by_digest_is_refused_with_the_reason(tmp_path: Path) -> None:
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(f"FROM debian@sha256:{'a' * 64}\n")
    with pytest.raises(ImageError, match="named by digest is not supported; name it by tag"):
        build_context(ImageStore(tmp_path / "store"), ctx)

"""What goes wrong with an image: one line naming it and why.

Not a ``SandboxError``: the image store is below the sandboxes (``raas.sandbox`` imports
``raas.images``, never the reverse). So a caller that turns a sandbox that would not start into
a clean failure catches both (``raas.tasks.swe``); the pipeline fails a job on either as an
infra error, and reads ``retry`` where there is one.
"""

from __future__ import annotations


class ImageError(Exception):
    """An image that cannot be pulled, imported, found or run: one line naming it and why."""


class ImageNotStored(ImageError):
    """The store holds no image of that name: a job that needs it fails at once, since running
    it again cannot make the image appear (``retry``: the pipeline reads it)."""

    retry = False


class ImageUnrunnable(ImageError):
    """An image raas cannot run its action server in (no Python for it, no bash for the
    tools): a job that needs it fails at once, as running it again cannot change the image."""

    retry = False

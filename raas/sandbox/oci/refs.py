"""Image references as Docker spells them out (``raas.image_refs``, which the client and the
tasks share): the store keys images by the normalised reference."""

from raas.image_refs import normalize

__all__ = ["normalize"]

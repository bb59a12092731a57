"""OCI images for sandboxes: a content-addressed store of unpacked layers shared by every image.

``ImageStore`` (``store``) pulls and imports images (skopeo), unpacks each layer once, and
answers ``resolve(ref)`` with a ``StoredImage``: the image's layer directories, bottom first, and
what its config says to run with. A sandbox's root is an overlay over those directories
(``raas.sandbox.rootfs``), so a sandbox writes only its own upper layer.
"""

from raas.sandbox.oci.image import ImageError, ImageNotStored, StoredImage
from raas.sandbox.oci.store import ImageInfo, ImageStore, StoreUsage, default_store_dir

__all__ = [
    "ImageError",
    "ImageInfo",
    "ImageNotStored",
    "ImageStore",
    "StoreUsage",
    "StoredImage",
    "default_store_dir",
]

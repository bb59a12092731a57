"""Task images: where a task's image comes from, in one folder.

- ``refs``: image references, on the standard library only (Docker's spelling of a name, the
  image a SWE row names), so that the image store, the swe task and the trainer's client (its
  placement) share them.
- ``store``: the OCI image store, a content-addressed store of unpacked layers shared by every
  image. ``ImageStore`` pulls and imports images (``sources``: skopeo from a registry or an
  archive, an Apptainer ``.sif``), unpacks each layer once (``layers``: safe unpacking, within
  caps; ``manifests``, ``locks``) and answers ``resolve(ref)`` with a ``StoredImage``
  (``image``): the image's layer directories, bottom first, and what its config says to run
  with. ``errors``: ``ImageError`` and the kinds a job reads (not stored, not runnable).
- ``overlay``: layers as overlayfs reads them (whiteouts, opaque directories), and the copy
  fallback, also run alone by the host's python (standard library only).
- ``sif_dir`` and ``build``: Apptainer's own images, a name looked up as a SIF or sandbox
  directory in a local directory (what an apptainer sandbox runs directly when it is given no
  image of the store), and one built from a root filesystem (``raas images build``).

A sandbox's root is an overlay over an image's layers (``raas.sandbox.rootfs``), so a sandbox
writes only its own upper layer. ``raas.sandbox`` imports this package, never the reverse; this
package imports nothing of raas but ``raas.helpers``. Import from the module that holds a name:
this package re-exports nothing (the trainer's client loads ``refs`` alone).
"""

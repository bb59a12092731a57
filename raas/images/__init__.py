"""Task images: how a task names its image, and (to come) the one store that holds them.

``refs``: image references, on the standard library only (Docker's spelling of a name, the
image a SWE row names), so that the sandbox's image store, the swe task and the trainer's
client (its placement) share them. The OCI store itself is still ``raas.sandbox.oci``.
"""

"""Where the store's images come from: a registry or an image archive, copied by skopeo
(``skopeo``: a ``docker save`` archive or an OCI layout, told apart by ``archive``), and an
Apptainer/Singularity ``.sif`` (``sif``: its squashfs partition as one layer)."""

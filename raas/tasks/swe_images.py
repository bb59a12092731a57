"""Which image a SWE-bench, SWE-Gym or R2E-Gym row runs in: ``raas.image_refs``' rule, which the
client's placement shares (its docstring says how each dataset names images)."""

from raas.image_refs import IMAGE_FIELDS, SWE_GYM_PREFIX, image_of, swe_gym_image

__all__ = ["IMAGE_FIELDS", "SWE_GYM_PREFIX", "image_of", "swe_gym_image"]

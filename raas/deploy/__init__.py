"""Running raas on clusters: Ray actors, Slurm jobs."""

"""Sandboxes (a library that knows nothing of jobs). Filled by the sandbox issue."""

"""LLM backends (a library that knows nothing of jobs). Filled by the LLM backends issue."""

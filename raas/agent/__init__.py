"""The agent loop, tool specs and tool-call parsing."""

"""The agent loop, tool specs, tool-call parsing and the Trajectory type."""

from raas.agent.trajectory import Trajectory

__all__ = ["Trajectory"]

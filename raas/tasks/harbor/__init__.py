"""Harbor tasks: the field's shared task format (``task.toml``, ``instruction.md``,
``environment/``, ``tests/test.sh``, ``solution/solve.sh``), run as the ``harbor`` task."""

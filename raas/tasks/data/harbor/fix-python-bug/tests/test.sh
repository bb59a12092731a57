#!/bin/bash
# Verifier for fix-python-bug. The deciding process (verify.py, read whole before anything of
# the agent's runs) never imports /app: the agent's spans runs in a child of its own, answers
# the hidden cases on a pipe, and everything it left running is killed before the reward is
# written, once, at the end.
exec python3 -I /tests/verify.py

"""Judges: deciding rewards outside the candidate's reach.

A judge never types into the agent's shell: it runs fresh processes (``Sandbox.exec``: argv, a
clean environment, exit status from the kernel, output through pipes) in a sandbox the agent
never touched. The candidate's code runs in a process of its own that cannot read or signal the
one that decides, and no test, expected value or pass mark lies where it can read them.
"""

from raas.judge.code import Case, ContestCases, HumanEvalCheck, Verdict, judge_code

__all__ = ["Case", "ContestCases", "HumanEvalCheck", "Verdict", "judge_code"]

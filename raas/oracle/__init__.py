"""The oracle policy: a vLLM-protocol server that answers raas's bundled tasks with gold
tool-call trajectories (``raas engine --model oracle``), and sabotages a chosen fraction.

It proves the path without a model that acts: sandbox, tools, EVAL and the token bookkeeping
on multi-turn trajectories, every gold answer scoring 1.0 and every sabotaged one 0.0
(``make test-oracle``). ``catalogue`` finds the task a prompt is; ``policy`` says the next step;
``math_solvers`` writes the ipython programs; ``sabotage`` the wrong answers; ``model`` turns a
step into tokens; ``app`` serves it.
"""

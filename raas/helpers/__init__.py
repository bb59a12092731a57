"""Helpers every layer shares, one module per concern: ``ports`` (free ports, binding checks),
``readiness`` (waiting until an HTTP endpoint answers), ``children`` (guarded child processes),
``sigterm`` (SIGTERM as Ctrl-C for a run's coroutine), ``files`` (atomic writes, run
directories), ``server_list`` (the list a deployment writes for the trainer), ``retries``
(honouring ``Retry-After``), ``tokens`` (a request's bearer token and API keys), ``optional``
(a model field's annotation without None), ``terminal`` (text safe to print) and
``suggestions`` ("did you mean").

Standard library, httpx and tenacity only, and nothing of raas, so that the trainer-side client,
the LLM and sandbox libraries and the server can all use them. Import from the module that holds
a name (``from raas.helpers.ports import free_port``): this package re-exports nothing.
"""

"""What the judges' test runners (swe_tests.py, swe_pytest.py, swe_django.py) share: their
results channel.

``serve(run)`` reads the runner's JSON request on stdin, keeps stdout as the results channel (not
inherited by any child: ``os.dup`` makes it non-inheritable) and sends fd 1 to stderr, so nothing
the tests print reaches the channel; ``run(request, channel)`` ends with ``send``; then the
process ends at once, no atexit handler of the tests running after it. A runner that fails itself
sends no record and exits 3.

Standard library only, Python 3.5 or newer (swe_django.py runs on the Python of SWE-bench's
Django images): no f-strings, no variable annotations.
"""

import json
import os
import sys
import traceback
from typing import Any, Callable, Dict

# Bound when the runner starts, before anything of the repository is imported: the patched code
# may replace them in their modules later.
_write, _exit, _dumps = os.write, os._exit, json.dumps


def send(channel: int, record: Dict[str, Any]) -> None:
    """Write ``record`` as one JSON line on the channel."""
    data = (_dumps(record) + "\n").encode()
    while data:
        data = data[_write(channel, data) :]


def serve(run: Callable[[Dict[str, Any], int], None]) -> None:
    request = json.loads(sys.stdin.read())
    channel = os.dup(1)
    os.dup2(2, 1)
    try:
        run(request, channel)
    except BaseException:  # the runner itself failed: no record, and a status that says so
        traceback.print_exc()
        sys.stderr.flush()
        _exit(3)
    sys.stdout.flush()
    sys.stderr.flush()
    _exit(0)

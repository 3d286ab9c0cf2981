"""A snippet run in a child process that already has a second thread, ``early``, running:
a server has threads (started by imports) before it applies process-wide thread settings,
and those must reach them too.  In a child, so the settings do not outlive the test."""

from __future__ import annotations

import subprocess
import sys
import textwrap

_PRELUDE = """
import os, threading
_started, _done = threading.Event(), threading.Event()
def _park():
    _started.set()
    _done.wait(30)
early = threading.Thread(target=_park)
early.start()
_started.wait(30)
def in_new_thread(fn):
    out = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join()
    return out[0]
"""

_EPILOGUE = """
_done.set()
early.join()
"""


def run_with_an_early_thread(body: str) -> list[str]:
    """Run ``body`` (which may use ``early`` and ``in_new_thread(fn)``) after the prelude;
    the lines it printed."""
    script = _PRELUDE + textwrap.dedent(body) + _EPILOGUE
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout.split("\n")[:-1]

"""``OneLineArgumentParser``: the parser of every ``raftlet`` command.

argparse prints the usage block before an error by default; under systemd or ``kubectl
logs`` the cause should be the one line at the end, not buried under 30 flags. So every
usage error is one line, ``prog: error: ... (see --help)``, and exit status 2.
"""

from __future__ import annotations

import argparse
import re
from typing import NoReturn

__all__ = ["OneLineArgumentParser"]


_ALIAS_IN_ERROR = re.compile(r"argument (--[A-Za-z0-9_]+)/--[A-Za-z0-9-]+:")
# argparse's word when a client command names no cluster (``common.add_target_arguments``).
_NO_CLUSTER = "one of the arguments --data-dir --cluster --servers is required"


class OneLineArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (``prog: error: ... (see --help)``), exit 2.

    argparse prints the usage block first by default; under systemd or ``kubectl logs`` the
    cause should be the one line at the end, not buried under 30 flags.
    """

    def error(self, message: str) -> NoReturn:
        one_line = " ".join(message.split())
        # "argument --x_y/--x-y: ..." names the flag twice; once is clearer.
        one_line = _ALIAS_IN_ERROR.sub(r"argument \1:", one_line)
        if one_line.startswith(_NO_CLUSTER):
            one_line += " (or $RAFTLET_CLUSTER or $RAFTLET_SERVERS in the environment)"
        self.exit(2, f"{self.prog}: error: {one_line} (see --help)\n")

"""The open-file limit a server runs under: raised to the hard limit at start (a server
holds a socket per connection and, per tablet, WAL segments, its store and locks), and a
clear refusal below what it needs to start at all -- gRPC crashed (SIGSEGV) when it ran
out of descriptors while starting, and a little above that the error named no file."""

from __future__ import annotations

import resource

__all__ = ["MIN_OPEN_FILES", "raise_open_files_limit"]

# Enough for gRPC's own descriptors, a few tablets and a few connections.
MIN_OPEN_FILES = 256


def raise_open_files_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard one; the soft limit now in force.
    Raises ``OSError`` when even that is below ``MIN_OPEN_FILES``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass  # the kernel's nr_open may be below the hard limit: keep what we have
    if soft != resource.RLIM_INFINITY and soft < MIN_OPEN_FILES:
        raise OSError(
            f"the open-file limit is {soft} (hard {hard}), below the {MIN_OPEN_FILES} a "
            "server needs: raise it (ulimit -n, LimitNOFILE= in systemd)"
        )
    return soft

"""Running raftlet clusters.

The local multi-node launcher, the multi-host (network namespace) launcher, systemd units,
the container image and manifests, and the Grafana dashboard. Used by ``cli`` and by the
integration tests.
"""

from raftlet import require_namespaced

require_namespaced(__name__)

"""The ``raftlet`` command (Kudu's ``tools/``).

Thin subcommands that wire together ``tserver``, ``deploy`` and ``client``. This is the only
package allowed to import all of them; nothing imports ``cli``.
"""

from raftlet import require_namespaced

require_namespaced(__name__)

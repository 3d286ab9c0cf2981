"""The one error type of the cluster config, and the lookup miss that is also a ``LookupError``."""

from __future__ import annotations

__all__ = ["ClusterConfigError", "NotInConfigError"]


class ClusterConfigError(ValueError):
    """The cluster config is invalid. ``str()`` is one line: ``[source[:line]: ][field: ]reason``.

    ``field`` is a path into the config such as ``servers[1].rpc_addr`` or
    ``tables[0].columns[2].type`` (indices 0-based, in file order).
    """

    def __init__(
        self,
        reason: str,
        field: str = "",
        *,
        source: str | None = None,
        line: int | None = None,
    ) -> None:
        self.reason = reason
        self.field = field
        self.source = source
        self.line = line
        super().__init__(self._render())

    def _render(self) -> str:
        where = ""
        if self.source is not None:
            where = f"{self.source}:{self.line}: " if self.line else f"{self.source}: "
        elif self.line:
            where = f"line {self.line}: "
        return f"{where}{self.field}: {self.reason}" if self.field else f"{where}{self.reason}"

    def within(self, prefix: str) -> ClusterConfigError:
        """The same error with ``prefix`` (e.g. ``servers[1]``) put before its field."""
        joined = f"{prefix}.{self.field}" if self.field else prefix
        return ClusterConfigError(self.reason, joined, source=self.source, line=self.line)


class NotInConfigError(ClusterConfigError, LookupError):
    """A server, table or tablet looked up by name is not in the config."""

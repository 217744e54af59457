"""The Agent Client Protocol (ACP) server: a thinkray agent driven by an editor over
stdio (``thinkray acp``), through the official ``agent-client-protocol`` SDK.

- :mod:`thinkray.runtime.acp.server`: :class:`AcpServer` (the ACP agent methods) over an
  :class:`AgentPort`, and :class:`LocalAgentPort` for an agent in this process;
- :mod:`thinkray.runtime.acp.mapping`: chunks and stored messages to ``session/update``,
  prompts to user messages, stop reasons, permission options;
- :mod:`thinkray.runtime.acp.stdio`: the checked newline-delimited JSON transport.

Importing it needs the ``acp`` package (a dependency of thinkray).
"""

from __future__ import annotations

from thinkray.runtime.acp.server import AcpServer, AgentPort, LocalAgentPort
from thinkray.runtime.acp.stdio import serve_stdio

__all__ = ["AcpServer", "AgentPort", "LocalAgentPort", "serve_stdio"]

"""The ingress: a Ray Serve app in front of the session actors that speaks the AI
SDK's HTTP chat stream and the ``cf_agent_*`` WebSocket protocol, with pluggable
authentication and per-principal agent names, and serves a web chat page."""

"""Capabilities attached to an agent: compaction, permission scopes, system prompt assembly."""

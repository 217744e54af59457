"""The ingress's configuration: which agent classes it serves under which URL slug,
where their files live, who may call it, and its limits. A pydantic model so a Serve
config file's ``args`` validate with clear errors before any replica starts."""

from __future__ import annotations

import importlib
from typing import Any

from pydantic import BaseModel, Field, field_validator
from thinkray.storage.layout import validate_name


class AgentRoute(BaseModel):
    """One agent class served at ``/agents/<slug>/<name>``: its namespace (the
    directory actor that hosts its agents) and the namespace's settings, used when
    the ingress creates the namespace (the first replica to start does; the others,
    and later deployments, attach to it)."""

    agent_cls: str = Field(description="import path, 'package.module:Class'")
    namespace: str
    agent_kwargs: dict[str, Any] = Field(default_factory=dict)
    namespace_options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        return validate_name(value, "namespace")

    def load_class(self) -> type:
        """The agent class (raises ValueError with the path for one that is missing)."""
        return load_object(self.agent_cls)


class IngressConfig(BaseModel):
    """Everything a replica needs; replicas keep no session state of their own."""

    storage_root: str
    agents: dict[str, AgentRoute]
    tokens: dict[str, str] = Field(
        default_factory=dict, description="bearer token -> principal (the default authenticator)"
    )
    authenticator: str | None = Field(
        default=None,
        description="'module:callable' returning an Authenticator (replaces `tokens`)",
    )
    cors_origins: list[str] = Field(default_factory=list, description="closed when empty")
    max_body_bytes: int = 1 << 20
    slow_consumer_timeout: float = Field(
        default=30.0, description="seconds a stream may wait on a client before detaching"
    )
    default_agent: str | None = Field(default=None, description="the slug the web page uses")

    @field_validator("agents")
    @classmethod
    def _slugs(cls, value: dict[str, AgentRoute]) -> dict[str, AgentRoute]:
        if not value:
            raise ValueError("serve at least one agent class (agents: {slug: {...}})")
        for slug in value:
            validate_name(slug, "agent slug")
        return value

    def page_agent(self) -> str:
        """The agent slug the web chat page talks to."""
        return self.default_agent or next(iter(self.agents))


def load_object(path: str) -> Any:
    """``'package.module:Name'`` -> the object, with a clear error."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ValueError(f"{path!r} is not an import path of the form 'package.module:Name'")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot import {path!r}: {exc}") from exc

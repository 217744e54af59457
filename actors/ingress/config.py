"""The ingress's configuration: which agent classes it serves under which URL slug,
where their files live, who may call it, and its limits. A pydantic model so a Serve
config file's ``args`` validate with clear errors before any replica starts."""

from __future__ import annotations

import importlib
import os
import re
from typing import Any

from pydantic import Field, field_validator
from thinkray.runtime.typed_model import TypedModel
from thinkray.storage.layout import validate_name

TOKENS_ENV = "THINKRAY_TOKENS"
"""The environment variable with ``PRINCIPAL=TOKEN`` pairs (separated by spaces,
commas or newlines), read when the configuration names neither ``tokens`` nor
``tokens_file``."""

PLACEHOLDER = re.compile(
    r"change[-_]?me|replace[-_]?me|placeholder|your[-_]?token|example|xxxx", re.IGNORECASE
)
"""What the token of an example file looks like: refused, so an example config copied
to a server never serves with a guessable token."""


class AgentRoute(TypedModel):
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


class IngressConfig(TypedModel):
    """Everything a replica needs; replicas keep no session state of their own."""

    storage_root: str
    agents: dict[str, AgentRoute]
    tokens: dict[str, str] = Field(
        default_factory=dict,
        description="bearer token -> principal (the default authenticator); for code that "
        "builds the app itself: a Serve config's args refuse it (Serve shows args to anyone "
        "who can read its REST config), use tokens_file or $THINKRAY_TOKENS",
    )
    tokens_file: str | None = Field(
        default=None,
        description="a file of PRINCIPAL=TOKEN lines ('#' comments), read by every replica",
    )
    ticket_ttl: float = Field(
        default=60.0, gt=0, description="seconds a WebSocket ticket stays valid"
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

    @field_validator("tokens")
    @classmethod
    def _tokens(cls, value: dict[str, str]) -> dict[str, str]:
        for token in value:
            check_token(token)
        return value

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


def check_token(token: str) -> str:
    """``token`` unless it is empty or an example's placeholder (ValueError)."""
    if not token.strip():
        raise ValueError("an empty bearer token")
    if PLACEHOLDER.search(token):
        raise ValueError(
            "a bearer token looks like an example's placeholder: generate real ones "
            "(python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    return token


def parse_token_pairs(text: str, where: str) -> dict[str, str]:
    """``PRINCIPAL=TOKEN`` pairs (whitespace, comma or newline separated; ``#`` starts a
    comment) as token -> principal. ValueError naming ``where`` (never the token)."""
    tokens: dict[str, str] = {}
    for line in text.splitlines():
        for pair in re.split(r"[\s,]+", line.partition("#")[0]):
            if not pair:
                continue
            principal, sep, token = pair.partition("=")
            if not sep or not principal or not token:
                raise ValueError(f"{where}: want PRINCIPAL=TOKEN pairs, got one without '='")
            if token in tokens:
                raise ValueError(f"{where}: two principals share a token")
            tokens[check_token(token)] = principal
    return tokens


def resolve_tokens(config: IngressConfig) -> dict[str, str]:
    """The bearer tokens the default authenticator accepts: ``tokens``, else
    ``tokens_file``'s, else ``$THINKRAY_TOKENS``'s (none: every request is 401)."""
    if config.tokens:
        return dict(config.tokens)
    if config.tokens_file:
        return read_tokens_file(config.tokens_file)
    return parse_token_pairs(os.environ.get(TOKENS_ENV, ""), f"${TOKENS_ENV}")


def read_tokens_file(path: str) -> dict[str, str]:
    """The ``PRINCIPAL=TOKEN`` lines of ``path`` as token -> principal (ValueError)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ValueError(f"cannot read the tokens file {path!r}: {exc}") from exc
    return parse_token_pairs(text, f"tokens file {path!r}")


def load_object(path: str) -> Any:
    """``'package.module:Name'`` -> the object, with a clear error."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ValueError(f"{path!r} is not an import path of the form 'package.module:Name'")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot import {path!r}: {exc}") from exc

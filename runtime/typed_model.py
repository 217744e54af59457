"""The base of thinkray's pydantic models."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

# pydantic builds a model's validator and serializer when its class is defined unless
# told to wait for the first use. A session actor's process imports ~60 models (message
# parts, model events, every built-in tool's input) and uses a handful in a turn; a
# directory's uses none. Building them all at import cost ~70 ms of CPU in each new
# actor process here (~40 ms net of the ones a first turn builds anyway).
DEFERRED = ConfigDict(defer_build=True)


class TypedModel(BaseModel):
    """A pydantic model whose schema is built on first use (validation, dump or
    ``model_json_schema``), not at import. Subclasses add their own ``model_config``
    keys; pydantic merges them with this one."""

    model_config = DEFERRED

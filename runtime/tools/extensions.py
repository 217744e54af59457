"""Extensions: tools the model writes at runtime (seed 000, "Extensions").

An extension is Python source that declares a manifest and registers tools::

    manifest = {
        "name": "textstats",
        "description": "Statistics about text files",
        "permissions": {"network": False, "workspace": "read"},
    }

    @extension_tool(description="Count the words of a workspace file")
    def count_words(path: str) -> int:
        return len(workspace.read_file(path).split())

``extension_tool(description=..., input_schema=...)`` is predefined in the extension's
namespace (``input_schema`` defaults to one derived from annotated parameters), and so
is ``workspace`` (see :mod:`thinkray.runtime.tools.sandbox`). A tool is called with its input as
keyword arguments and returns a JSON-serializable value.

Lifecycle (mirrors the seed's describe/execute RPC):

- :meth:`ExtensionManager.load` runs the source once in a sandbox child in ``describe``
  mode, always with no workspace and no network (discovery must not have side
  effects), validates the manifest and the discovered tools, and persists
  ``{manifest, source}`` in the actor's database (a reserved
  :class:`~thinkray.storage.protocols.WorkspaceStore` namespace, invisible to the workspace
  tools). Loading a name that exists replaces it.
- :meth:`ExtensionManager.get_tools` exposes each tool as ``<extension>__<tool>``.
  Every call runs the source and then the function in a **fresh** sandbox process
  with the extension's declared permissions: workspace ``"none"`` gets no workspace
  operations at all, ``"read"`` only the read operations (the parent refuses writes),
  network per manifest and only if the host allows it: extension code has **no
  network unless the agent opts in** (``ExtensionManager(allow_network=True)``; a
  sub-agent's ``extension_network`` config key). Without that, loading an extension
  that declares network is refused, and one stored while it was allowed is refused
  when called.
- A new manager on the same database (after hibernation) restores every extension
  from the stored manifests without running anything.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from thinkray.runtime.errors import (  # re-exported: the errors live in thinkray.runtime.errors
    ExtensionError as ExtensionError,
)
from thinkray.runtime.errors import InvalidArgumentError
from thinkray.runtime.tools.base import (
    ModelTool,
    ToolContext,
    ToolExecutionError,
    ToolInputError,
    tool_from_model,
)
from thinkray.runtime.tools.sandbox import CodeSandbox, SandboxAccess
from thinkray.runtime.typed_model import TypedModel
from thinkray.storage.protocols import Stores

log = logging.getLogger("thinkray.extensions")

EXTENSIONS_NAMESPACE = "thinkray.extensions"
SEPARATOR = "__"
MAX_SOURCE_BYTES = 256 * 1024
MAX_TOOL_NAME = 64  # Anthropic's limit for a tool name

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
_TOOL_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")


class ExtensionPermissions(TypedModel):
    """What an extension's tools may touch when they run."""

    model_config = ConfigDict(extra="forbid")

    network: bool = False
    workspace: SandboxAccess = "none"


class ExtensionToolSpec(TypedModel):
    """One tool an extension registers (``@extension_tool``): its name within the
    extension, description and the JSON schema of its input (an object)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = Field(default="", max_length=2000)
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not _TOOL_NAME.match(value) or SEPARATOR in value:
            raise InvalidArgumentError(
                f"tool name {value!r} must start with a letter, use only letters, digits "
                f"and single underscores, and be at most 64 characters"
            )
        return value

    @field_validator("input_schema")
    @classmethod
    def _check_schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        value = dict(value)
        value.setdefault("type", "object")
        if value["type"] != "object":
            raise InvalidArgumentError("input_schema must describe an object (type 'object')")
        json.dumps(value)
        return value


class ExtensionManifest(TypedModel):
    """The validated manifest of a loaded extension, with its discovered tools."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = Field(default="", max_length=2000)
    version: str | None = None
    permissions: ExtensionPermissions = Field(default_factory=ExtensionPermissions)
    tools: list[ExtensionToolSpec] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not _NAME.match(value) or SEPARATOR in value:
            raise InvalidArgumentError(
                f"extension name {value!r} must be lowercase letters, digits and single "
                "underscores, start with a letter, at most 32 characters"
            )
        return value


class ExtensionManager:
    """Loads, persists, restores and exposes extensions for one actor.

    ``stores`` are the stores of the actor's database (``agent.store.stores()``):
    records live in its workspace namespace :data:`EXTENSIONS_NAMESPACE`, reserved for
    them. ``ops`` are the workspace operations extensions may be granted (``None``:
    extensions asking for workspace access are refused at load).
    ``allow_network`` (default False: no network) is the agent's explicit opt-in to
    extensions with network access; while it is False, an extension declaring
    ``"network": True`` is refused at load, and one restored from the database is
    refused when its tools are called. Only with it True does such an extension's
    sandbox get the network.
    Extension code runs under the OS sandbox like ``execute``; ``allow_weak_sandbox``
    and ``bwrap`` are passed to every :class:`CodeSandbox` (see there: without the OS
    sandbox and without the opt-in, loading and calling raise
    :class:`~thinkray.runtime.errors.SandboxUnavailableError`).
    """

    def __init__(
        self,
        stores: Stores,
        ops: Any = None,
        *,
        timeout: float = 10.0,
        memory_mb: int = 256,
        allow_network: bool = False,
        max_source_bytes: int = MAX_SOURCE_BYTES,
        network_namespace: bool | None = None,
        allow_weak_sandbox: bool = False,
        bwrap: str | None = None,
    ) -> None:
        self._store = stores.workspace(EXTENSIONS_NAMESPACE, max_entries=1000)
        self.ops = ops
        self.timeout = timeout
        self.memory_mb = memory_mb
        self.allow_network = allow_network
        self.max_source_bytes = max_source_bytes
        self.network_namespace = network_namespace
        self.allow_weak_sandbox = allow_weak_sandbox
        self.bwrap = bwrap
        self._records: dict[str, _Record] = {}
        self._sandboxes: dict[tuple[str, bool], CodeSandbox] = {}
        self._restore()

    # -- public API ----------------------------------------------------------------

    async def load(self, source: str) -> dict[str, Any]:
        """Discover, validate and persist an extension; returns its manifest (with
        ``tools``). Raises :class:`ExtensionError` and changes nothing on failure."""
        if not isinstance(source, str) or not source.strip():
            raise ExtensionError("extension source must be a non-empty string")
        size = len(source.encode("utf-8", errors="replace"))
        if size > self.max_source_bytes:
            raise ExtensionError(
                f"extension source is {size} bytes; the limit is {self.max_source_bytes}"
            )
        try:
            compile(source, "<extension>", "exec")  # compiling runs nothing
        except SyntaxError as exc:
            raise ExtensionError(
                f"extension source has a syntax error at line {exc.lineno}: {exc.msg}"
            ) from None
        discovery = CodeSandbox(
            None,
            timeout=self.timeout,
            memory_mb=self.memory_mb,
            network_namespace=self.network_namespace,
            allow_weak_sandbox=self.allow_weak_sandbox,
            bwrap=self.bwrap,
        )
        outcome = await discovery.describe_extension(source)
        if not outcome.ok:
            raise ExtensionError(f"extension source failed to run:\n{outcome.error}")
        if not isinstance(outcome.result, dict):
            raise ExtensionError(
                "the manifest and the tools' input schemas must be JSON-serializable "
                "(dicts, lists, strings, numbers, booleans, None)"
            )
        described = outcome.result
        manifest = self._validate(described.get("manifest"), described.get("tools") or [])
        record = _Record(manifest=manifest, source=source, loaded_at=time.time())
        self._store.write(_file_name(manifest.name), json.dumps(record.to_json()))
        self._records[manifest.name] = record
        return manifest.model_dump(mode="json")

    def unload(self, name: str) -> dict[str, Any]:
        """Remove an extension and its stored record; returns its manifest."""
        record = self._records.get(name)
        if record is None:
            raise ExtensionError(f"no extension named {name!r} is loaded")
        if self._store.exists(_file_name(name)):
            self._store.delete(_file_name(name))
        del self._records[name]
        return record.manifest.model_dump(mode="json")

    def list(self) -> list[dict[str, Any]]:
        """Manifests of the loaded extensions, sorted by name."""
        return [self._records[n].manifest.model_dump(mode="json") for n in sorted(self._records)]

    def get(self, name: str) -> dict[str, Any] | None:
        """The manifest of the loaded extension ``name`` (JSON-ready), or ``None``."""
        record = self._records.get(name)
        return record.manifest.model_dump(mode="json") if record else None

    def get_tools(self) -> dict[str, ExtensionTool]:
        """Every loaded tool, as ``<extension>__<tool>``."""
        tools: dict[str, ExtensionTool] = {}
        for name in sorted(self._records):
            for spec in self._records[name].manifest.tools:
                t = ExtensionTool(self, name, spec)
                tools[t.name] = t
        return tools

    def sandbox_for(self, manifest: ExtensionManifest) -> CodeSandbox:
        """A sandbox with exactly the extension's declared permissions (one per
        permission set, so its concurrency bound holds across tools); the network only
        when the extension declares it and the manager allows it.

        Raises:
            ExtensionError: the extension declares network and the manager does not
                allow it (a record stored while it was allowed).
        """
        access = manifest.permissions.workspace
        network = manifest.permissions.network
        if network and not self.allow_network:
            raise ExtensionError(
                f"extension {manifest.name!r} declares network access, which is not "
                "permitted for extensions here (the agent has not allowed it)"
            )
        key = (access, network)
        sandbox = self._sandboxes.get(key)
        if sandbox is None:
            sandbox = CodeSandbox(
                self.ops if access != "none" else None,
                access=access,
                allow_network=network,
                timeout=self.timeout,
                memory_mb=self.memory_mb,
                network_namespace=self.network_namespace,
                allow_weak_sandbox=self.allow_weak_sandbox,
                bwrap=self.bwrap,
            )
            self._sandboxes[key] = sandbox
        return sandbox

    # -- internals -----------------------------------------------------------------

    def _validate(self, manifest: Any, tools: Sequence[Any]) -> ExtensionManifest:
        if manifest is None:
            raise ExtensionError(
                "the extension declares no manifest: define a module-level "
                "`manifest = {'name': ..., 'description': ..., 'permissions': {...}}`"
            )
        if not isinstance(manifest, dict):
            raise ExtensionError("`manifest` must be a dict")
        if "tools" in manifest:
            raise ExtensionError(
                "declare tools with @extension_tool, not in the manifest's 'tools' key"
            )
        try:
            parsed = ExtensionManifest.model_validate({**manifest, "tools": [*tools]})
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'manifest'}: {e['msg']}"
                for e in exc.errors()
            )
            raise ExtensionError(f"invalid extension manifest: {problems}") from None
        if not parsed.tools:
            raise ExtensionError("the extension registers no tools (use @extension_tool)")
        for spec in parsed.tools:
            full = f"{parsed.name}{SEPARATOR}{spec.name}"
            if len(full) > MAX_TOOL_NAME:
                raise ExtensionError(f"tool name {full!r} is longer than {MAX_TOOL_NAME}")
        if parsed.permissions.network and not self.allow_network:
            raise ExtensionError("network access is not permitted for extensions here")
        if parsed.permissions.workspace != "none" and self.ops is None:
            raise ExtensionError(
                f"the extension requests workspace access "
                f"({parsed.permissions.workspace!r}) but this agent has no workspace"
            )
        return parsed

    def _restore(self) -> None:
        paths = [e.path for e in self._store.walk("")]
        for info, data in self._store.iter_contents(paths):
            try:
                record = _Record.from_json(json.loads(data))
            except (ValueError, KeyError, ValidationError) as exc:
                log.warning("skipping unreadable extension record %s: %s", info.path, exc)
                continue
            self._records[record.manifest.name] = record


class _Record:
    def __init__(self, manifest: ExtensionManifest, source: str, loaded_at: float) -> None:
        self.manifest = manifest
        self.source = source
        self.loaded_at = loaded_at

    def to_json(self) -> dict[str, Any]:
        return {
            "manifest": self.manifest.model_dump(mode="json"),
            "source": self.source,
            "loaded_at": self.loaded_at,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> _Record:
        return cls(
            ExtensionManifest.model_validate(data["manifest"]),
            str(data["source"]),
            float(data.get("loaded_at", 0.0)),
        )


def _file_name(name: str) -> str:
    return f"{name}.json"


class ExtensionTool:
    """One extension tool (the :class:`~thinkray.runtime.tools.base.Tool` protocol).

    ``validate`` checks the input against the declared JSON schema (types, required,
    properties, ``additionalProperties: false``, enums, items). ``execute`` runs the
    extension's current source in a fresh sandbox; the result is the function's
    return value, or ``{"result", "stdout"}`` when it printed something.
    """

    def __init__(self, manager: ExtensionManager, extension: str, spec: ExtensionToolSpec) -> None:
        self.manager = manager
        self.extension = extension
        self.tool = spec.name
        self.name = f"{extension}{SEPARATOR}{spec.name}"
        self.description = spec.description or f"{spec.name} (from extension {extension})"
        self._schema = spec.input_schema

    @property
    def input_schema(self) -> dict[str, Any]:
        """The JSON schema the extension declared for the tool's input."""
        return self._schema

    def validate(self, raw_input: Any) -> dict[str, Any]:
        """Parse ``raw_input`` (a dict, JSON text or nothing) and check it against the
        declared schema; returns the input dict.

        Raises:
            ToolInputError: invalid JSON, or every way the input misses the schema.
        """
        if isinstance(raw_input, str):
            try:
                raw_input = json.loads(raw_input) if raw_input.strip() else {}
            except json.JSONDecodeError as exc:
                raise ToolInputError(f"input is not valid JSON: {exc}") from exc
        if raw_input is None:
            raw_input = {}
        problems: list[str] = []
        _check(self._schema, raw_input, "input", problems)
        if problems:
            raise ToolInputError(f"invalid input for tool {self.name!r}: " + "; ".join(problems))
        return raw_input

    async def execute(self, input: dict[str, Any], ctx: ToolContext) -> Any:
        """Run the tool in a sandbox with the extension's permissions; returns its value
        (as ``{"result", "stdout", "warning"}`` when it printed or ran without the OS
        sandbox).

        Raises:
            ToolExecutionError: the extension or tool is gone, its permissions are no
                longer allowed here (e.g. network), or the call failed.
        """
        record = self.manager._records.get(self.extension)
        if record is None:
            raise ToolExecutionError(f"extension {self.extension!r} is no longer loaded")
        if not any(t.name == self.tool for t in record.manifest.tools):
            raise ToolExecutionError(
                f"extension {self.extension!r} no longer defines tool {self.tool!r}"
            )
        try:
            sandbox = self.manager.sandbox_for(record.manifest)
        except ExtensionError as exc:
            raise ToolExecutionError(str(exc)) from None
        outcome = await sandbox.call_extension(
            record.source, self.tool, input, filename=f"<extension {self.extension}>"
        )
        if not outcome.ok:
            message = outcome.error or "the extension tool failed"
            if outcome.warning:
                message += f"\n\nwarning: {outcome.warning}"
            raise ToolExecutionError(message)
        if outcome.stdout.strip() or outcome.warning:
            shown: dict[str, Any] = {"result": outcome.result}
            if outcome.stdout.strip():
                shown["stdout"] = outcome.stdout
            if outcome.warning:
                shown["warning"] = outcome.warning
            return shown
        return outcome.result


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


def _type_matches(names: list[Any], value: Any) -> bool:
    """Whether ``value`` has one of the JSON types ``names`` (an unknown type name
    matches anything; a bool is not a number)."""
    for name in names:
        kinds = _JSON_TYPES.get(name)
        if kinds is None:
            return True
        if isinstance(value, bool) and name in ("integer", "number"):
            continue
        if isinstance(value, kinds):
            return True
    return False


def _check_object(
    schema: dict[str, Any], value: dict[str, Any], where: str, problems: list[str]
) -> None:
    props = schema.get("properties") or {}
    for key in schema.get("required") or []:
        if key not in value:
            problems.append(f"{where}.{key}: field required")
    if schema.get("additionalProperties") is False:
        for key in value:
            if key not in props:
                problems.append(f"{where}.{key}: unexpected field")
    for key, sub in props.items():
        if key in value:
            _check(sub, value[key], f"{where}.{key}", problems)


def _check(schema: Any, value: Any, where: str, problems: list[str]) -> None:
    """A small JSON-schema subset: enough to catch a model's malformed arguments."""
    if not isinstance(schema, dict):
        return
    expected = schema.get("type")
    if expected is not None:
        names = expected if isinstance(expected, list) else [expected]
        if not _type_matches(names, value):
            problems.append(f"{where}: expected {' or '.join(map(str, names))}")
            return
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{where}: must be one of {schema['enum']!r}")
    if isinstance(value, dict):
        _check_object(schema, value, where, problems)
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            _check(schema["items"], item, f"{where}[{i}]", problems)


# -- tools for the model --------------------------------------------------------------


# The input models of the tools below carry no docstring on purpose: pydantic would put
# it in the input schema the model is sent (the tools' descriptions say what they do).


class LoadExtensionInput(TypedModel):  # noqa: D101
    model_config = ConfigDict(extra="forbid")

    source: str = Field(min_length=1, description="The extension's Python source")


class UnloadExtensionInput(TypedModel):  # noqa: D101
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, description="The extension's manifest name")


class ListExtensionsInput(TypedModel):  # noqa: D101
    model_config = ConfigDict(extra="forbid")


LOAD_DESCRIPTION = (
    "Load (or replace) an extension: Python source that adds new tools, available from "
    "the next turn as '<extension>__<tool>'. The source must define a module-level "
    "`manifest = {'name': 'lowercase_name', 'description': '...', 'permissions': "
    "{'network': False, 'workspace': 'none' | 'read' | 'read-write'}}` and register "
    "functions with the predefined decorator `@extension_tool(description='...', "
    "input_schema={JSON schema of an object})` (input_schema is optional: type-annotated "
    "parameters are enough). Each tool is called with its input as keyword arguments in "
    "a fresh sandbox (standard library only) and must return a JSON-serializable value. "
    "With workspace permission, the predefined `workspace` object offers read_file, "
    "list_directory, find_files, grep, stat (and write_file, edit_file, delete with "
    "'read-write'). Module-level code runs once at load with no workspace and no network."
)


def extension_tools(manager: ExtensionManager, *, prefix: str = "") -> dict[str, ModelTool]:
    """``load_extension``, ``unload_extension`` and ``list_extensions`` for the model.

    Tools loaded during a turn appear in :meth:`ExtensionManager.get_tools` at once and
    therefore in the next turn's tool set (``Think.get_tools`` is called per turn)."""

    async def load_extension(input: LoadExtensionInput) -> dict[str, Any]:
        try:
            manifest = await manager.load(input.source)
        except ExtensionError as exc:
            raise ToolExecutionError(str(exc)) from None
        return {
            "loaded": manifest["name"],
            "tools": [f"{manifest['name']}{SEPARATOR}{t['name']}" for t in manifest["tools"]],
            "permissions": manifest["permissions"],
            "note": "the new tools are available from the next turn",
        }

    def unload_extension(input: UnloadExtensionInput) -> dict[str, Any]:
        try:
            manifest = manager.unload(input.name)
        except ExtensionError as exc:
            raise ToolExecutionError(str(exc)) from None
        return {"unloaded": manifest["name"]}

    def list_extensions(input: ListExtensionsInput) -> dict[str, Any]:
        return {
            "extensions": [
                {
                    "name": m["name"],
                    "description": m["description"],
                    "permissions": m["permissions"],
                    "tools": [f"{m['name']}{SEPARATOR}{t['name']}" for t in m["tools"]],
                }
                for m in manager.list()
            ]
        }

    specs: list[tuple[str, type[BaseModel], Any, str]] = [
        ("load_extension", LoadExtensionInput, load_extension, LOAD_DESCRIPTION),
        (
            "unload_extension",
            UnloadExtensionInput,
            unload_extension,
            "Unload an extension and remove its tools.",
        ),
        (
            "list_extensions",
            ListExtensionsInput,
            list_extensions,
            "List the loaded extensions, their permissions and tools.",
        ),
    ]
    return {
        prefix + name: tool_from_model(prefix + name, model, fn, description)
        for name, model, fn, description in specs
    }

"""Extensions: model-written tools discovered and run in the sandbox, persisted in the
actor's database."""

from __future__ import annotations

import socket

import pytest
from thinkray.runtime.abort import AbortSignal
from thinkray.runtime.tools.base import Tool, ToolContext, ToolExecutionError, ToolInputError
from thinkray.runtime.tools.extensions import (
    EXTENSIONS_NAMESPACE,
    ExtensionError,
    ExtensionManager,
    extension_tools,
)
from thinkray.runtime.tools.workspace import LocalWorkspace
from thinkray.storage.stores import open_stores

# Runs that are not about timeouts get a generous limit: a loaded CI machine can take
# seconds to start a process.
SLOW_MACHINE_TIMEOUT = 30

TEXTSTATS = '''
manifest = {
    "name": "textstats",
    "description": "Statistics about workspace text files",
    "permissions": {"network": False, "workspace": "read"},
}

@extension_tool(description="Count the words of a workspace file")
def count_words(path: str) -> int:
    return len(workspace.read_file(path).split())

@extension_tool(
    description="Add two numbers",
    input_schema={
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    },
)
def add(a, b):
    print("adding")
    return a + b

@extension_tool
def scribble(path: str):
    """Tries to write although the extension may only read."""
    workspace.write_file(path, "scribbled")
'''

ISOLATED = """
manifest = {"name": "isolated", "description": "No workspace, no network"}

@extension_tool
def peek(path: str):
    return workspace.read_file(path)

@extension_tool
def connect(port: int):
    import socket
    socket.create_connection(("127.0.0.1", port), timeout=1)
    return "connected"
"""


def ctx() -> ToolContext:
    return ToolContext(tool_call_id="c", tool_name="t", signal=AbortSignal())


async def call(tool: Tool, raw: dict) -> object:
    return await tool.execute(tool.validate(raw), ctx())


@pytest.fixture
def stores():
    opened = open_stores(":memory:")  # the persistence tests open files themselves
    yield opened
    opened.close()


@pytest.fixture
def ws(stores):
    workspace = LocalWorkspace(stores.workspace())
    workspace.write_file("doc.txt", "one two three four")
    return workspace


@pytest.fixture
def manager(stores, ws):
    return ExtensionManager(stores, ws, timeout=SLOW_MACHINE_TIMEOUT)


async def test_load_lists_and_calls_tools(manager, ws):
    manifest = await manager.load(TEXTSTATS)
    assert manifest["name"] == "textstats"
    assert manifest["permissions"] == {"network": False, "workspace": "read"}
    assert [t["name"] for t in manifest["tools"]] == ["count_words", "add", "scribble"]

    tools = manager.get_tools()
    assert set(tools) == {"textstats__count_words", "textstats__add", "textstats__scribble"}
    count = tools["textstats__count_words"]
    assert isinstance(count, Tool)
    assert count.description == "Count the words of a workspace file"
    assert count.input_schema == {
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
    }
    assert tools["textstats__scribble"].description.startswith("Tries to write")

    assert await call(count, {"path": "doc.txt"}) == 4
    # Printed output comes back beside the value.
    assert await call(tools["textstats__add"], {"a": 2, "b": 3}) == {
        "result": 5,
        "stdout": "adding\n",
    }


async def test_tool_input_is_validated_against_the_schema(manager):
    await manager.load(TEXTSTATS)
    add = manager.get_tools()["textstats__add"]
    for bad, fragment in [
        ({"a": 1}, "input.b: field required"),
        ({"a": "1", "b": 2}, "input.a: expected integer"),
        ({"a": True, "b": 2}, "input.a: expected integer"),
        ({"a": 1, "b": 2, "c": 3}, "input.c: unexpected field"),
        ([1, 2], "expected object"),
    ]:
        with pytest.raises(ToolInputError, match=fragment):
            add.validate(bad)
    assert add.validate('{"a": 1, "b": 2}') == {"a": 1, "b": 2}


async def test_read_permission_refuses_writes(manager, ws):
    await manager.load(TEXTSTATS)
    scribble = manager.get_tools()["textstats__scribble"]
    with pytest.raises(ToolExecutionError, match="PermissionError: .*read-only"):
        await call(scribble, {"path": "new.txt"})
    assert not ws.exists("new.txt")


async def test_no_workspace_and_no_network_by_default(manager):
    await manager.load(ISOLATED)
    tools = manager.get_tools()
    with pytest.raises(ToolExecutionError, match="no workspace access"):
        await call(tools["isolated__peek"], {"path": "doc.txt"})
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    try:
        with pytest.raises(ToolExecutionError, match="network access is disabled"):
            await call(tools["isolated__connect"], {"port": server.getsockname()[1]})
    finally:
        server.close()


async def test_network_permission_is_granted_only_if_declared_and_allowed(stores, ws):
    source = ISOLATED.replace(
        '"description": "No workspace, no network"',
        '"description": "net", "permissions": {"network": True}',
    )
    strict = ExtensionManager(stores, ws, timeout=SLOW_MACHINE_TIMEOUT, allow_network=False)
    with pytest.raises(ExtensionError, match="network access is not permitted"):
        await strict.load(source)

    manager = ExtensionManager(stores, ws, timeout=SLOW_MACHINE_TIMEOUT, allow_network=True)
    await manager.load(source)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    try:
        result = await call(
            manager.get_tools()["isolated__connect"], {"port": server.getsockname()[1]}
        )
        assert result == "connected"
    finally:
        server.close()


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ("def broken(:\n    pass", "syntax error at line 1"),
        ("@extension_tool\ndef f():\n    return 1", "declares no manifest"),
        (
            "manifest = {'name': 'Bad-Name'}\n@extension_tool\ndef f():\n    return 1",
            "extension name 'Bad-Name'",
        ),
        ("manifest = {'name': 'empty'}", "registers no tools"),
        ("raise RuntimeError('boom at import')", "RuntimeError: boom at import"),
        (
            "manifest = {'name': 'x', 'permissions': {'workspace': 'everything'}}\n"
            "@extension_tool\ndef f():\n    return 1",
            "permissions.workspace",
        ),
        (
            "manifest = {'name': 'x', 'colour': 'red'}\n@extension_tool\ndef f():\n    return 1",
            "colour",
        ),
        (
            "manifest = {'name': 'x'}\n@extension_tool(name='bad__name')\ndef f():\n    return 1",
            "tool name 'bad__name'",
        ),
        (
            "manifest = {'name': 'x', 'extra': {1, 2}}\n@extension_tool\ndef f():\n    return 1",
            "JSON-serializable",
        ),
        ("", "non-empty"),
    ],
)
async def test_invalid_source_is_rejected_cleanly(manager, source, fragment):
    with pytest.raises(ExtensionError, match=fragment):
        await manager.load(source)
    assert manager.list() == []
    assert manager.get_tools() == {}


async def test_workspace_permission_needs_a_workspace(stores):
    manager = ExtensionManager(stores, None, timeout=SLOW_MACHINE_TIMEOUT)
    with pytest.raises(ExtensionError, match="no workspace"):
        await manager.load(TEXTSTATS)


async def test_unload_and_restore_after_reopening(tmp_path):
    path = tmp_path / "hibernating.duckdb"
    stores = open_stores(path)
    ws = LocalWorkspace(stores.workspace())
    ws.write_file("doc.txt", "a b c")
    manager = ExtensionManager(stores, ws, timeout=SLOW_MACHINE_TIMEOUT)
    await manager.load(TEXTSTATS)
    await manager.load(ISOLATED)
    assert [m["name"] for m in manager.list()] == ["isolated", "textstats"]
    manager.unload("isolated")
    assert "isolated__peek" not in manager.get_tools()
    with pytest.raises(ExtensionError, match="no extension named"):
        manager.unload("isolated")
    # Records live in a reserved namespace, not in the agent's workspace.
    assert [e["name"] for e in ws.list_directory()] == ["doc.txt"]
    stores.close()

    stores = open_stores(path)  # the wake: a new manager rebuilds everything from the file
    ws = LocalWorkspace(stores.workspace())
    restored = ExtensionManager(stores, ws, timeout=SLOW_MACHINE_TIMEOUT)
    assert [m["name"] for m in restored.list()] == ["textstats"]
    assert set(restored.get_tools()) == {
        "textstats__count_words",
        "textstats__add",
        "textstats__scribble",
    }
    assert await call(restored.get_tools()["textstats__count_words"], {"path": "doc.txt"}) == 3
    assert stores.workspace(EXTENSIONS_NAMESPACE).usage()["entries"] == 1
    stores.close()


async def test_reloading_replaces_an_extension(manager):
    await manager.load(TEXTSTATS)
    smaller = (
        "manifest = {'name': 'textstats', 'permissions': {'workspace': 'read'}}\n"
        "@extension_tool\ndef shout(text: str):\n    return text.upper()\n"
    )
    await manager.load(smaller)
    assert set(manager.get_tools()) == {"textstats__shout"}
    assert await call(manager.get_tools()["textstats__shout"], {"text": "hi"}) == "HI"


async def test_model_tools_make_new_tools_appear(manager):
    meta = extension_tools(manager)
    assert set(meta) == {"load_extension", "unload_extension", "list_extensions"}
    assert "@extension_tool" in meta["load_extension"].description

    turn_one = manager.get_tools()
    assert turn_one == {}
    loaded = await call(meta["load_extension"], {"source": TEXTSTATS})
    assert loaded["loaded"] == "textstats"
    assert "textstats__add" in loaded["tools"]

    turn_two = manager.get_tools()  # what Think.get_tools() returns on the next turn
    assert "textstats__add" in turn_two
    listed = await call(meta["list_extensions"], {})
    assert listed["extensions"][0]["name"] == "textstats"

    with pytest.raises(ToolExecutionError, match="syntax error"):
        await call(meta["load_extension"], {"source": "def ("})
    assert await call(meta["unload_extension"], {"name": "textstats"}) == {"unloaded": "textstats"}
    with pytest.raises(ToolExecutionError, match="no extension named"):
        await call(meta["unload_extension"], {"name": "textstats"})
    assert manager.get_tools() == {}
    with pytest.raises(ToolExecutionError, match="no longer loaded"):
        await call(turn_two["textstats__add"], {"a": 1, "b": 2})


async def test_tools_loaded_on_one_turn_appear_on_the_next(tmp_path):
    from thinkray.runtime.agents.think import Think
    from thinkray.runtime.models.testing import ScriptedModel, reply, tool_call
    from thinkray.runtime.tools.sandbox import CodeSandbox, execute_tool
    from thinkray.runtime.tools.workspace import workspace_tools

    class Agent(Think):
        def on_start(self) -> None:
            stores = self.store.stores()  # the actor's one database file
            self.workspace = LocalWorkspace(stores.workspace())
            self.extensions = ExtensionManager(stores, self.workspace, timeout=SLOW_MACHINE_TIMEOUT)
            self.sandbox = CodeSandbox(self.workspace, timeout=SLOW_MACHINE_TIMEOUT)

        def get_workspace(self):
            return self.workspace

        def get_tools(self):
            return {
                **workspace_tools(self.workspace),
                "execute": execute_tool(self.sandbox),
                **extension_tools(self.extensions),
                **self.extensions.get_tools(),
            }

    model = ScriptedModel(
        [
            reply(tool_call("load_extension", {"source": TEXTSTATS})),
            reply("loaded"),
            reply(tool_call("textstats__add", {"a": 2, "b": 3})),
            reply("five"),
        ]
    )
    agent = Agent(tmp_path / "agent.duckdb", model=model)
    first = await agent.chat("write me a tool")
    assert first.status == "completed", first.error
    second = await agent.chat("use it")
    assert second.status == "completed", second.error

    names = [[t.name for t in r.tools] for r in model.requests]
    assert "textstats__add" not in names[0]
    assert "textstats__add" in names[2]
    assert {"read_file", "execute", "load_extension"} <= set(names[0])
    outputs = [p.get("output") for p in second.message["parts"] if "output" in p]
    assert outputs == [{"result": 5, "stdout": "adding\n"}]
    agent.store.close()


# -- issue 9 item 16: no network for extension code unless the agent allows it -------------

NETWORKED = ISOLATED.replace(
    '"description": "No workspace, no network"',
    '"description": "net", "permissions": {"network": True}',
)


def test_a_manager_allows_no_network_unless_told(stores, ws):
    assert ExtensionManager(stores, ws).allow_network is False


async def test_sub_agent_extensions_get_no_network_unless_its_config_allows_it(tmp_path):
    """An orchestrator's sub-agent with ``extensions`` on: the model writes an extension
    that declares network access and opens a socket. By default that extension is
    refused; with ``extension_network: True`` it loads and connects; when the config
    takes the permission back, the stored extension is refused when called."""
    from thinkray.actors.orchestrator import SubAgent

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    port = server.getsockname()[1]
    load = [{"tool": "load_extension", "input": {"source": NETWORKED}}]
    use = [{"tool": "isolated__connect", "input": {"port": port}}]

    def config(*steps, **extra):
        model = {"provider": "script", "steps": [*steps, [{"text": "done"}]]}
        return {"model": model, "extensions": True, **extra}

    def tool_part(result):
        [part] = [p for p in result.message["parts"] if p["type"] == "dynamic-tool"]
        return part

    agent = SubAgent(tmp_path / "sub.duckdb")
    try:
        agent.configure(config(load))
        refused = tool_part(await agent.chat("write a tool that can reach the network"))
        assert refused["state"] == "output-error"
        assert "network access is not permitted" in refused["errorText"]
        assert agent.extension_manager().list() == []

        agent.configure(config(load, extension_network=True))
        assert tool_part(await agent.chat("write it"))["state"] == "output-available"
        agent.configure(config(use, extension_network=True))
        connected = tool_part(await agent.chat("use it"))
        assert connected["state"] == "output-available" and connected["output"] == "connected"

        agent.configure(config(use))  # the permission is taken back
        again = tool_part(await agent.chat("use it again"))
        assert again["state"] == "output-error"
        assert "network access" in again["errorText"]
    finally:
        server.close()
        agent.close()

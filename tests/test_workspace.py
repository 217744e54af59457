"""The durable workspace: LocalWorkspace and the seven tools (the store itself:
``thinkray.storage.testing.workspace_store_suite``)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from thinkray.runtime.abort import AbortSignal
from thinkray.runtime.tools.base import Tool, ToolContext, ToolInputError
from thinkray.runtime.tools.workspace import (
    BinaryFileError,
    EditError,
    LocalWorkspace,
    ReadOperations,
    WriteOperations,
    compile_glob,
    error_kind,
    workspace_tools,
)
from thinkray.storage.stores import open_stores
from thinkray.storage.workspace import (
    WorkspaceLimitError,
    WorkspaceNotEmptyError,
    WorkspaceNotFoundError,
)

ALL_TOOLS = {
    "read_file",
    "write_file",
    "edit_file",
    "list_directory",
    "find_files",
    "grep",
    "delete",
}
READ_TOOLS = {"read_file", "list_directory", "find_files", "grep"}


@pytest.fixture
def stores():
    opened = open_stores(":memory:")
    yield opened
    opened.close()


@pytest.fixture
def store(stores):
    return stores.workspace()


@pytest.fixture
def ws(store):
    return LocalWorkspace(store)


@pytest.fixture(params=["local", "remote"])
def tools(request, ws):
    """The tools over the local implementation and over an async proxy of it (what a
    Ray bridge looks like): both must behave the same. A new implementation of the
    operations can be added here to run the tool tests against it."""
    return workspace_tools(ws if request.param == "local" else AsyncOps(ws))


def ctx() -> ToolContext:
    return ToolContext(tool_call_id="call-1", tool_name="t", signal=AbortSignal())


async def call(tool: Tool, raw: Any) -> Any:
    return await tool.execute(tool.validate(raw), ctx())


# -- LocalWorkspace ------------------------------------------------------------------


def test_local_workspace_implements_both_protocols(ws):
    assert isinstance(ws, ReadOperations)
    assert isinstance(ws, WriteOperations)


def test_local_workspace_operations(ws, store):
    assert ws.write_file("/src/a.py", "x = 1\n") == {
        "path": "src/a.py",
        "size": 6,
        "created": True,
    }
    assert ws.write_file("src/a.py", "x = 1\ny = 2\n")["created"] is False
    assert ws.edit_file("src/a.py", "y = 2", "y = 3") == {
        "path": "src/a.py",
        "replacements": 1,
        "size": 12,
    }
    assert ws.read_file("src/a.py") == "x = 1\ny = 3\n"
    store.write("img.png", b"\x89PNG\x00\x00")
    with pytest.raises(BinaryFileError, match="binary"):
        ws.read_file("img.png")
    assert ws.stat("nope") is None
    assert ws.stat("")["type"] == "directory"
    entry = ws.list_directory("src")[0]
    assert set(entry) >= {"path", "name", "type", "size", "modified", "mime_type"}


def test_edit_contract(ws):
    ws.write_file("f.txt", "a a b")
    with pytest.raises(EditError, match="occurs 2 times"):
        ws.edit_file("f.txt", "a", "c")
    with pytest.raises(EditError, match="not found"):
        ws.edit_file("f.txt", "zzz", "c")
    with pytest.raises(EditError, match="identical"):
        ws.edit_file("f.txt", "b", "b")
    with pytest.raises(EditError, match="empty"):
        ws.edit_file("f.txt", "", "c")
    assert ws.read_file("f.txt") == "a a b"
    assert ws.edit_file("f.txt", "a", "c", replace_all=True)["replacements"] == 2
    assert ws.read_file("f.txt") == "c c b"


@pytest.mark.parametrize(
    ("pattern", "path", "matches"),
    [
        ("*.py", "src/a.py", True),
        ("*.py", "a.py", True),
        ("*.py", "src/a.pyc", False),
        ("src/*.py", "src/a.py", True),
        ("src/*.py", "src/sub/a.py", False),
        ("src/**/*.py", "src/a.py", True),
        ("src/**/*.py", "src/x/y/a.py", True),
        ("**", "any/thing", True),
        ("src/**", "src/x/y", True),
        ("*.{ts,tsx}", "web/app.tsx", True),
        ("*.{ts,tsx}", "web/app.js", False),
        ("file?.txt", "file1.txt", True),
        ("file?.txt", "file10.txt", False),
        ("[ab].txt", "b.txt", True),
        ("[!ab].txt", "c.txt", True),
        ("[!ab].txt", "a.txt", False),
        ("/docs/*.md", "docs/x.md", True),
    ],
)
def test_glob_semantics(pattern, path, matches):
    assert bool(compile_glob(pattern).match(path)) is matches


def test_find_and_grep(ws):
    ws.write_file("src/app.py", "import os\nprint('hello')\n")
    ws.write_file("src/lib/util.py", "def hello():\n    return 'HELLO'\n")
    ws.write_file("README.md", "hello world\n")
    assert ws.find_files("*.py") == ["src/app.py", "src/lib/util.py"]
    assert ws.find_files("*.py", "src/lib") == ["src/lib/util.py"]
    assert ws.find_files("**/*.md") == ["README.md"]
    found = ws.grep("hello", glob="*.py")
    assert [(m["path"], m["line"]) for m in found["matches"]] == [
        ("src/app.py", 2),
        ("src/lib/util.py", 1),
    ]
    assert found["files_searched"] == 2
    assert len(ws.grep("hello", ignore_case=True)["matches"]) == 4
    assert ws.grep("hello", ignore_case=True, limit=2)["truncated"] is True
    with pytest.raises(ValueError, match="regular expression"):
        ws.grep("(unclosed")


def test_error_kinds():
    assert error_kind(WorkspaceNotFoundError("x")) == "not_found"
    assert error_kind(EditError("x")) == "edit"
    assert error_kind(PermissionError("x")) == "permission"
    assert error_kind(RuntimeError("x")) == "error"


# -- the seven tools -----------------------------------------------------------------


def test_tool_sets(ws):
    assert set(workspace_tools(ws)) == ALL_TOOLS
    read_only = workspace_tools(ws, access="read")
    assert set(read_only) == READ_TOOLS
    assert not {"write_file", "edit_file", "delete"} & set(read_only)
    prefixed = workspace_tools(ws, prefix="shared_")
    assert set(prefixed) == {"shared_" + n for n in ALL_TOOLS}
    assert prefixed["shared_grep"].name == "shared_grep"
    for t in workspace_tools(ws).values():
        assert isinstance(t, Tool)
        assert t.description
        assert t.input_schema["type"] == "object"
    with pytest.raises(ValueError):
        workspace_tools(ws, access="write")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "raw", "fragment"),
    [
        ("read_file", {}, "path"),
        ("read_file", {"path": "../secret"}, "'..'"),
        ("read_file", {"path": "a.txt", "offset": 0}, "offset"),
        ("read_file", {"path": "a.txt", "bogus": 1}, "bogus"),
        ("read_file", "{not json", "not valid JSON"),
        ("write_file", {"path": "a.txt"}, "content"),
        ("write_file", {"path": "/", "content": "x"}, "empty path"),
        ("write_file", {"path": "%2e%2e/x", "content": "x"}, "percent"),
        ("edit_file", {"path": "a.txt", "old_string": "", "new_string": "x"}, "old_string"),
        ("list_directory", {"path": "C:\\"}, "backslash"),
        ("find_files", {"pattern": "../*"}, "'..'"),
        ("find_files", {"pattern": "*.py", "limit": 0}, "limit"),
        ("grep", {"pattern": "(unclosed"}, "regular expression"),
        ("grep", {"pattern": "x", "glob": "a\\b"}, "backslash"),
        ("delete", {"path": ""}, "empty path"),
        ("delete", {"path": "a", "recursive": "perhaps"}, "recursive"),
    ],
)
def test_tool_validation_errors(tools, name, raw, fragment):
    with pytest.raises(ToolInputError) as info:
        tools[name].validate(raw)
    assert fragment in str(info.value)
    if isinstance(raw, dict):
        assert name in str(info.value)


async def test_read_write_edit_tools(tools, ws):
    created = await call(tools["write_file"], {"path": "/notes/a.txt", "content": "one\ntwo\n"})
    assert created == {"path": "notes/a.txt", "size": 8, "created": True}
    replaced = await call(
        tools["write_file"],
        {"path": "notes/a.txt", "content": "l1\nl2\nl3\nl4\nl5\n"},
    )
    assert replaced["created"] is False

    whole = await call(tools["read_file"], {"path": "notes/a.txt"})
    assert whole["content"] == "l1\nl2\nl3\nl4\nl5\n"
    assert whole["total_lines"] == 5 and "next_offset" not in whole
    page = await call(tools["read_file"], {"path": "notes/a.txt", "offset": 2, "limit": 2})
    assert page["content"] == "l2\nl3\n"
    assert (page["start_line"], page["end_line"], page["next_offset"]) == (2, 3, 4)

    with pytest.raises(WorkspaceNotFoundError):
        await call(tools["read_file"], {"path": "notes/missing.txt"})

    ws.write_file("dup.txt", "x = 1\nx = 1\n")
    with pytest.raises(EditError, match="occurs 2 times.*replace_all"):
        await call(
            tools["edit_file"], {"path": "dup.txt", "old_string": "x = 1", "new_string": "y"}
        )
    with pytest.raises(EditError, match="not found"):
        await call(tools["edit_file"], {"path": "dup.txt", "old_string": "z", "new_string": "y"})
    assert ws.read_file("dup.txt") == "x = 1\nx = 1\n"
    edited = await call(
        tools["edit_file"],
        {"path": "dup.txt", "old_string": "x = 1", "new_string": "y", "replace_all": True},
    )
    assert edited["replacements"] == 2
    assert ws.read_file("dup.txt") == "y\ny\n"


async def test_list_find_grep_delete_tools(tools, ws):
    ws.write_file("src/a.py", "def main():\n    return 42\n")
    ws.write_file("src/deep/b.py", "MAIN = 1\n")
    ws.write_file("src/deep/c.txt", "main\n")
    ws.write_file("top.md", "# main\n")

    listing = await call(tools["list_directory"], {})
    assert [(e["name"], e["type"]) for e in listing["entries"]] == [
        ("src", "directory"),
        ("top.md", "file"),
    ]
    top = listing["entries"][1]
    assert top["size"] == 7 and top["modified"].endswith("Z")

    found = await call(tools["find_files"], {"pattern": "src/**/*.py"})
    assert found == {
        "pattern": "src/**/*.py",
        "files": ["src/a.py", "src/deep/b.py"],
        "truncated": False,
    }
    capped = await call(tools["find_files"], {"pattern": "**", "limit": 2})
    assert len(capped["files"]) == 2 and capped["truncated"] is True

    hits = await call(tools["grep"], {"pattern": r"main\b", "ignore_case": True})
    assert hits["matches"] == [
        "src/a.py:1:def main():",
        "src/deep/b.py:1:MAIN = 1",
        "src/deep/c.txt:1:main",
        "top.md:1:# main",
    ]
    narrowed = await call(tools["grep"], {"pattern": "main", "glob": "*.txt"})
    assert narrowed["matches"] == ["src/deep/c.txt:1:main"]
    capped_grep = await call(tools["grep"], {"pattern": ".", "limit": 1})
    assert len(capped_grep["matches"]) == 1 and capped_grep["truncated"] is True

    with pytest.raises(WorkspaceNotEmptyError, match="recursive"):
        await call(tools["delete"], {"path": "src"})
    assert ws.exists("src/a.py")
    deleted = await call(tools["delete"], {"path": "src/deep", "recursive": True})
    assert deleted == {"path": "src/deep", "deleted": 3}
    assert await call(tools["delete"], {"path": "top.md"}) == {"path": "top.md", "deleted": 1}
    assert ws.find_files("**") == ["src/a.py"]


async def test_write_limit_surfaces_as_tool_error(stores):
    ws = LocalWorkspace(stores.workspace(max_file_bytes=8))
    tools = workspace_tools(ws)
    with pytest.raises(WorkspaceLimitError, match="limit"):
        await call(tools["write_file"], {"path": "big.txt", "content": "123456789"})
    assert not ws.exists("big.txt")


class AsyncOps:
    """What a remote (Ray bridge) implementation looks like to the tools: every
    method returns an awaitable."""

    def __init__(self, inner: LocalWorkspace) -> None:
        self.inner = inner
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)

        async def remote(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            await asyncio.sleep(0)
            return method(*args, **kwargs)

        return remote


async def test_tools_await_async_operations(ws):
    remote = AsyncOps(ws)
    tools = workspace_tools(remote)
    await call(tools["write_file"], {"path": "r.txt", "content": "alpha\nbeta\n"})
    await call(tools["edit_file"], {"path": "r.txt", "old_string": "beta", "new_string": "gamma"})
    assert (await call(tools["read_file"], {"path": "r.txt"}))["content"] == "alpha\ngamma\n"
    assert (await call(tools["grep"], {"pattern": "gam"}))["matches"] == ["r.txt:2:gamma"]
    assert (await call(tools["find_files"], {"pattern": "*.txt"}))["files"] == ["r.txt"]
    assert (await call(tools["list_directory"], {}))["entries"][0]["name"] == "r.txt"
    await call(tools["delete"], {"path": "r.txt"})
    assert remote.calls == [
        "write_file",
        "edit_file",
        "read_file",
        "grep",
        "find_files",
        "list_directory",
        "delete",
    ]
    assert not ws.exists("r.txt")


async def test_read_only_tools_cannot_write(ws):
    ws.write_file("keep.txt", "safe")
    tools = workspace_tools(ws, access="read")
    assert "write_file" not in tools and "delete" not in tools and "edit_file" not in tools
    assert (await call(tools["read_file"], {"path": "keep.txt"}))["content"] == "safe"


@pytest.mark.parametrize(
    "pattern",
    [
        "^foo",
        "foo$",
        "^$",
        r"\bfoo\b",
        r"o\s",
        "[^x]+$",
        r"\Afoo",
        r"bar\z",
        "(?i)FOO",
        "(?-m)^bar",
        "o.b",
        "",
    ],
)
def test_grep_finds_exactly_the_lines_a_per_line_search_finds(ws, pattern):
    # grep skips a file in one multi-line search when nothing can match; line ends of
    # every kind and the anchors must not change which lines it reports.
    from thinkray.runtime.tools.workspace import compile_regex

    text = "xx\r\nfoo bar\r\nbar\rfoo\x0c\n\nxfoo\u2028  foo\nob\nbar x\nlast"
    ws.write_file("mixed.txt", text)
    regex = compile_regex(pattern)
    expected = [n for n, line in enumerate(text.splitlines(), 1) if regex.search(line)]
    found = [m["line"] for m in ws.grep(pattern, limit=1000)["matches"]]
    assert found == expected

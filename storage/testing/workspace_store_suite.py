"""Conformance suite for :class:`thinkray.storage.protocols.WorkspaceStore`. Fixtures:
see :mod:`thinkray.storage.testing.store_helpers`; the suite's own ``workspace`` fixture is
``stores.workspace()`` (the default namespace and limits)."""

from __future__ import annotations

import pytest
from thinkray.storage.errors import (
    InvalidInputError,
    WorkspaceExistsError,
    WorkspaceIsADirectoryError,
    WorkspaceLimitError,
    WorkspaceNotADirectoryError,
    WorkspaceNotEmptyError,
    WorkspaceNotFoundError,
    WorkspacePathError,
)
from thinkray.storage.protocols import Stores, WorkspaceLimits, WorkspaceStore
from thinkray.storage.testing.store_helpers import (
    Reopen,
    inner_failure_caught,
    need_reopen,
    nested_rolled_back,
    rolled_back,
)

__all__ = [
    "TestWorkspaceErrors",
    "TestWorkspaceLimits",
    "TestWorkspaceNamespaces",
    "TestWorkspacePersistence",
    "TestWorkspaceReadsAndWrites",
    "TestWorkspaceTransactions",
    "workspace",
]


@pytest.fixture
def workspace(stores: Stores) -> WorkspaceStore:
    return stores.workspace()


def paths(store: WorkspaceStore, path: str = "") -> list[str]:
    return [e.path for e in store.walk(path, include_dirs=True)]


class TestWorkspaceReadsAndWrites:
    def test_write_read_stat_and_implicit_parents(self, workspace: WorkspaceStore) -> None:
        info = workspace.write("src/pkg/mod.py", "print('hi')\n")
        assert info.kind == "file" and info.size == 12 and info.mime_type == "text/x-python"
        assert workspace.read("src/pkg/mod.py") == b"print('hi')\n"
        assert workspace.read_text("src/pkg/mod.py") == "print('hi')\n"
        assert workspace.stat("src/pkg/mod.py") == info
        assert workspace.stat("src").kind == "dir"
        assert workspace.stat("src/pkg").is_dir
        assert workspace.exists("src/pkg") and workspace.exists("") and not workspace.exists("no")
        assert [e.name for e in workspace.list("")] == ["src"]
        assert [e.path for e in workspace.list("src")] == ["src/pkg"]
        assert paths(workspace) == ["src", "src/pkg", "src/pkg/mod.py"]
        assert workspace.usage() == {"entries": 3, "bytes": 12}

    def test_root(self, workspace: WorkspaceStore) -> None:
        root = workspace.stat("")
        assert root.kind == "dir" and root.path == ""
        assert workspace.try_stat("") == root
        assert workspace.list() == []
        with pytest.raises(WorkspacePathError):
            workspace.write("", "x")
        with pytest.raises(WorkspacePathError):
            workspace.delete("")

    def test_overwrite_keeps_created_and_updates_modified(self, workspace: WorkspaceStore) -> None:
        first = workspace.write("a.txt", "one")
        second = workspace.write("a.txt", b"\x00\x01binary")
        assert second.created == first.created
        assert second.modified >= first.modified
        assert workspace.read("a.txt") == b"\x00\x01binary"
        assert workspace.stat("a.txt").size == 8
        assert workspace.stat("a.txt").mime_type == "text/plain"  # by extension
        assert workspace.write("blob", b"\xff\x00").mime_type == "application/octet-stream"
        assert workspace.write("x.bin", "t", mime_type="application/x-mine").mime_type == (
            "application/x-mine"
        )
        assert workspace.usage()["entries"] == 3

    def test_listings_are_sorted_by_path(self, workspace: WorkspaceStore) -> None:
        for path in ("b/z.txt", "a.txt", "b/a/deep.txt", "c.txt", "b/m.txt"):
            workspace.write(path, path)
        assert [e.path for e in workspace.list()] == ["a.txt", "b", "c.txt"]
        assert [e.path for e in workspace.list("b")] == ["b/a", "b/m.txt", "b/z.txt"]
        assert paths(workspace, "b") == ["b/a", "b/a/deep.txt", "b/m.txt", "b/z.txt"]
        files = [e.path for e in workspace.walk()]
        assert files == ["a.txt", "b/a/deep.txt", "b/m.txt", "b/z.txt", "c.txt"]

    def test_iter_contents_keeps_the_order_and_skips_what_is_not_a_file(
        self, workspace: WorkspaceStore
    ) -> None:
        workspace.write("one.txt", "1")
        workspace.write("dir/two.txt", "2")
        got = list(workspace.iter_contents(["dir/two.txt", "missing", "dir", "one.txt"]))
        assert [(info.path, data) for info, data in got] == [
            ("dir/two.txt", b"2"),
            ("one.txt", b"1"),
        ]
        many = [f"f{i:03d}" for i in range(150)]  # more than one batch
        for p in many:
            workspace.write(p, p)
        assert [i.path for i, _ in workspace.iter_contents(list(reversed(many)))] == many[::-1]

    def test_mkdir(self, workspace: WorkspaceStore) -> None:
        made = workspace.mkdir("x/y/z")
        assert made.kind == "dir" and workspace.stat("x/y").kind == "dir"
        assert workspace.mkdir("x/y").kind == "dir"  # exist_ok
        with pytest.raises(WorkspaceExistsError):
            workspace.mkdir("x/y", exist_ok=False)
        assert workspace.list("x/y/z") == []

    def test_delete(self, workspace: WorkspaceStore) -> None:
        workspace.write("d/one.txt", "1")
        workspace.write("d/sub/two.txt", "2")
        workspace.write("dx.txt", "sibling with a common prefix")
        with pytest.raises(WorkspaceNotEmptyError, match="recursive"):
            workspace.delete("d")
        assert paths(workspace) == ["d", "d/one.txt", "d/sub", "d/sub/two.txt", "dx.txt"]
        assert workspace.delete("d", recursive=True) == 4
        assert paths(workspace) == ["dx.txt"]
        assert workspace.delete("dx.txt") == 1
        workspace.mkdir("empty")
        assert workspace.delete("empty") == 1
        assert workspace.usage() == {"entries": 0, "bytes": 0}

    def test_clear(self, workspace: WorkspaceStore) -> None:
        workspace.write("a/b.txt", "x")
        assert workspace.clear() == 2
        assert workspace.list() == [] and workspace.clear() == 0


class TestWorkspaceErrors:
    def test_type_conflicts(self, workspace: WorkspaceStore) -> None:
        workspace.write("a/b.txt", "x")
        with pytest.raises(WorkspaceIsADirectoryError):
            workspace.write("a", "x")
        with pytest.raises(WorkspaceNotADirectoryError):
            workspace.write("a/b.txt/c", "x")
        with pytest.raises(WorkspaceExistsError):
            workspace.mkdir("a/b.txt")
        with pytest.raises(WorkspaceIsADirectoryError):
            workspace.read("a")
        with pytest.raises(WorkspaceNotADirectoryError):
            workspace.list("a/b.txt")
        with pytest.raises(WorkspaceNotADirectoryError):
            list(workspace.walk("a/b.txt"))
        assert paths(workspace) == ["a", "a/b.txt"]
        assert workspace.read("a/b.txt") == b"x"

    def test_not_found(self, workspace: WorkspaceStore) -> None:
        for call in (
            lambda: workspace.read("missing"),
            lambda: workspace.stat("missing"),
            lambda: workspace.delete("missing"),
            lambda: workspace.list("missing"),
            lambda: list(workspace.walk("missing")),
        ):
            with pytest.raises(WorkspaceNotFoundError):
                call()
        assert workspace.try_stat("missing") is None

    def test_errors_are_the_builtin_os_errors(self) -> None:
        assert issubclass(WorkspaceNotFoundError, FileNotFoundError)
        assert issubclass(WorkspaceExistsError, FileExistsError)
        assert issubclass(WorkspaceIsADirectoryError, IsADirectoryError)
        assert issubclass(WorkspaceNotADirectoryError, NotADirectoryError)
        assert issubclass(WorkspaceNotEmptyError, OSError)

    @pytest.mark.parametrize("bad", ["/abs", "a/../b", "a//b", "a/", "./a", "a/.", "a\x00"])
    def test_non_canonical_paths_are_refused(self, workspace: WorkspaceStore, bad: str) -> None:
        with pytest.raises(WorkspacePathError):
            workspace.write(bad, "x")
        with pytest.raises(WorkspacePathError):
            workspace.mkdir(bad)
        with pytest.raises(WorkspacePathError):
            workspace.exists(bad)
        assert workspace.usage()["entries"] == 0

    def test_content_must_be_text_or_bytes(self, workspace: WorkspaceStore) -> None:
        with pytest.raises(TypeError):  # InvalidTypeError is one
            workspace.write("a.txt", 5)  # type: ignore[arg-type]
        assert not workspace.exists("a.txt")


class TestWorkspaceLimits:
    def test_limits_refuse_and_change_nothing(self, stores: Stores) -> None:
        store = stores.workspace("limited", max_file_bytes=10, max_total_bytes=25, max_entries=4)
        assert store.limits == WorkspaceLimits(10, 25, 4) and store.namespace == "limited"
        with pytest.raises(WorkspaceLimitError, match="limit is 10 bytes"):
            store.write("big.txt", "x" * 11)
        store.write("a.txt", "x" * 10)
        store.write("b.txt", "x" * 10)
        with pytest.raises(WorkspaceLimitError, match="25 bytes"):
            store.write("c.txt", "x" * 6)
        store.write("a.txt", "x" * 5)  # shrinking a file frees room
        store.write("c.txt", "x" * 10)
        with pytest.raises(WorkspaceLimitError, match="entries"):
            store.write("dir/d.txt", "")  # needs two entries: dir and file
        assert store.usage() == {"entries": 3, "bytes": 25}
        assert not store.exists("dir")
        store.write("d.txt", "")
        with pytest.raises(WorkspaceLimitError):
            store.mkdir("e")
        assert not store.exists("e")

    def test_limits_object_and_none_disables(self, stores: Stores) -> None:
        store = stores.workspace("free", limits=WorkspaceLimits(None, None, None))
        assert store.limits == WorkspaceLimits(None, None, None)
        store.write("big.txt", "x" * 100_000)
        assert store.usage()["bytes"] == 100_000

    def test_default_limits(self, workspace: WorkspaceStore) -> None:
        assert workspace.namespace == "default"
        assert workspace.limits == WorkspaceLimits()


class TestWorkspaceNamespaces:
    def test_namespaces_are_isolated(self, stores: Stores) -> None:
        a = stores.workspace("a")
        b = stores.workspace("b")
        a.write("same.txt", "from a")
        b.write("same.txt", "from b")
        assert a.read("same.txt") == b"from a"
        assert a.usage() == {"entries": 1, "bytes": 6}
        assert b.clear() == 1
        assert a.exists("same.txt") and not b.exists("same.txt")

    def test_limits_count_per_namespace(self, stores: Stores) -> None:
        a = stores.workspace("a", max_entries=1)
        stores.workspace("b").write("one.txt", "1")
        a.write("mine.txt", "1")  # b's entry does not count
        with pytest.raises(WorkspaceLimitError):
            a.write("two.txt", "2")

    def test_empty_namespace_is_refused(self, stores: Stores) -> None:
        with pytest.raises(InvalidInputError):
            stores.workspace("")


class TestWorkspaceTransactions:
    def test_rollback_leaves_nothing_written(self, workspace: WorkspaceStore) -> None:
        workspace.write("kept/a.txt", "original")
        before = workspace.usage()

        def writes() -> None:
            workspace.write("kept/a.txt", "changed")
            workspace.write("lost/b.txt", "new")
            workspace.mkdir("lost-dir/x")
            workspace.delete("kept", recursive=True)

        rolled_back(workspace, writes)
        assert paths(workspace) == ["kept", "kept/a.txt"]
        assert workspace.read("kept/a.txt") == b"original"
        assert workspace.usage() == before

    def test_read_modify_write_in_one_block(self, workspace: WorkspaceStore) -> None:
        workspace.write("n.txt", "1")
        with workspace.transaction():
            n = int(workspace.read_text("n.txt"))
            workspace.write("n.txt", str(n + 1))
            assert workspace.read_text("n.txt") == "2"
        assert workspace.read_text("n.txt") == "2"

    def test_nesting(self, workspace: WorkspaceStore) -> None:
        nested_rolled_back(
            workspace,
            lambda: workspace.write("outer.txt", "o"),
            lambda: workspace.write("inner.txt", "i"),
        )
        assert workspace.list() == []
        inner_failure_caught(
            workspace,
            lambda: workspace.write("inner.txt", "i"),
            lambda: workspace.write("after.txt", "a"),
        )
        assert [e.path for e in workspace.list()] == ["after.txt", "inner.txt"]


class TestWorkspacePersistence:
    def test_files_survive_a_reopen(self, stores: Stores, reopen: Reopen) -> None:
        again_of = need_reopen(reopen)
        workspace = stores.workspace()
        stores.workspace("other").write("o.txt", "other")
        info = workspace.write("notes/todo.md", "- ship it\n")
        workspace.mkdir("empty")
        before = [e.to_dict() for e in workspace.walk(include_dirs=True)]

        again_stores = again_of(stores)
        again = again_stores.workspace()
        assert [e.to_dict() for e in again.walk(include_dirs=True)] == before
        assert again.read("notes/todo.md") == b"- ship it\n"
        assert again.stat("notes/todo.md") == info
        assert info.mime_type == "text/markdown"
        assert again_stores.workspace("other").read("o.txt") == b"other"

"""Path safety: every unsafe spelling is refused with a clear error and writes nothing."""

from __future__ import annotations

import pytest
from thinkray.runtime.tools.paths import (
    MAX_PATH_BYTES,
    UnsafePathError,
    is_safe_path,
    normalize_path,
)
from thinkray.runtime.tools.workspace import LocalWorkspace
from thinkray.storage.db import Database
from thinkray.storage.workspace import DuckDBWorkspaceStore

# (bad input, a fragment of the expected reason)
BAD_PATHS: list[tuple[object, str]] = [
    ("..", "'..'"),
    ("../etc/passwd", "'..'"),
    ("a/../../etc/passwd", "'..'"),
    ("a/b/../c", "'..'"),  # refused even though it would stay inside
    ("a/..", "'..'"),
    ("//server/share/file", "UNC"),
    ("C:\\Windows\\system32", "backslash"),
    ("C:/Windows/system32", "drive"),
    ("c:secret.txt", "drive"),
    ("\\\\server\\share", "backslash"),
    ("a\\..\\b", "backslash"),
    ("~", "'~'"),
    ("~/.ssh/id_rsa", "'~'"),
    ("~root/.bashrc", "'~'"),
    ("%2e%2e/etc/passwd", "percent"),
    ("a%2fb", "percent"),
    ("%252e%252e/x", "percent"),
    ("..%2F..%2Fetc", "percent"),
    ("a\x00b", "NUL"),
    ("file.txt\x00.png", "NUL"),
    ("a\nb", "control"),
    ("a\tb", "control"),
    ("a\x1b[31mred", "control"),
    ("a\x7fb", "control"),
    ("a\u202egnp.exe", "format character"),  # right-to-left override
    ("zero\u200bwidth", "format character"),
    ("x" * 256, "255 bytes"),
    ("é" * 128, "255 bytes"),  # 256 bytes in UTF-8
    ("a/" * 2100 + "b", f"{MAX_PATH_BYTES} bytes"),
    ("", "empty"),
    (".", "empty"),
    ("./", "empty"),
    ("/", "empty"),
    ("...", "only of dots"),
    ("a/..../b", "only of dots"),
    ("CON", "reserved"),
    ("nul", "reserved"),
    ("NUL.txt", "reserved"),
    ("dir/com1", "reserved"),
    ("LPT9.log", "reserved"),
    ("file.", "end with a dot"),
    ("file ", "end with a dot or a space"),
    ("dir./x", "end with a dot"),
    (" leading", "start with a space"),
    ("\uff0e\uff0e/etc", "look-alike"),  # fullwidth full stops
    ("a\uff0fb", "look-alike"),  # fullwidth solidus
    ("\u2024\u2024/etc", "look-alike"),  # one-dot leaders
    ("\u2025/etc", "look-alike"),  # two-dot leader
    ("a\u2215b", "look-alike"),  # division slash
    ("a\u2044b", "look-alike"),  # fraction slash
    ("a\uff3cb", "look-alike"),  # fullwidth reverse solidus
    ("a\ufe52b", "look-alike"),  # small full stop
    ("x\uff1ay", "look-alike"),  # fullwidth colon
    (b"\xc0\xae\xc0\xae/etc", "UTF-8"),  # overlong '.'
    (b"a\xc0\xafb", "UTF-8"),  # overlong '/'
    (b"\xff\xfe", "UTF-8"),
    ("a\udcc0b", "surrogates"),  # surrogateescape'd undecodable byte
    ("a\ufffdb", "look-alike"),  # replacement char: undecodable input
    ("a:b", "not allowed"),  # alternate data stream / colon
    ("what?.txt", "not allowed"),
    ("star*.txt", "not allowed"),
    ('quote".txt', "not allowed"),
    ("pipe|x", "not allowed"),
    ("<tag>", "not allowed"),
    (None, "expected a string"),
    (42, "expected a string"),
]


@pytest.mark.parametrize(("bad", "reason"), BAD_PATHS, ids=[repr(b)[:40] for b, _ in BAD_PATHS])
def test_bad_paths_are_refused_with_a_clear_reason(bad: object, reason: str) -> None:
    with pytest.raises(UnsafePathError) as info:
        normalize_path(bad)  # type: ignore[arg-type]
    message = str(info.value)
    assert message.startswith("unsafe path ")
    assert reason in message, message
    assert isinstance(info.value, ValueError)
    assert info.value.reason
    assert not is_safe_path(bad)  # type: ignore[arg-type]


def test_there_are_at_least_twenty_distinct_bad_forms() -> None:
    assert len({repr(b) for b, _ in BAD_PATHS}) >= 20
    assert len({r for _, r in BAD_PATHS}) >= 15


@pytest.mark.parametrize(
    ("good", "expected"),
    [
        ("a.txt", "a.txt"),
        ("src/app.py", "src/app.py"),
        ("/src/app.py", "src/app.py"),  # a leading '/' is the workspace root
        ("/etc/passwd", "etc/passwd"),  # ... so it names a workspace file, never the host's
        ("./src/./app.py", "src/app.py"),
        ("src//app.py", "src/app.py"),
        ("src/", "src"),
        (".gitignore", ".gitignore"),
        ("a/.hidden/b", "a/.hidden/b"),
        ("notes 2024.md", "notes 2024.md"),
        ("a~b/c", "a~b/c"),
        ("100%.txt", "100%.txt"),
        ("pages/[id].tsx", "pages/[id].tsx"),
        ("console.log", "console.log"),
        ("data/日本語.txt", "data/日本語.txt"),
        ("cafe\u0301.txt", "caf\u00e9.txt"),  # NFC
        (b"bytes/ok.txt", "bytes/ok.txt"),
        ("x" * 255, "x" * 255),
    ],
)
def test_good_paths_are_normalized(good: str | bytes, expected: str) -> None:
    assert normalize_path(good) == expected
    assert normalize_path(expected) == expected  # idempotent


def test_root_only_when_allowed() -> None:
    for root in ("", ".", "/", "./", "/./"):
        assert normalize_path(root, allow_root=True) == ""
    with pytest.raises(UnsafePathError):
        normalize_path("..", allow_root=True)


def test_refused_paths_write_nothing(tmp_path) -> None:
    db = Database(tmp_path / "ws.duckdb")
    store = DuckDBWorkspaceStore(db)
    ws = LocalWorkspace(store)
    for bad, _ in BAD_PATHS:
        if not isinstance(bad, str):
            continue
        with pytest.raises(UnsafePathError):
            ws.write_file(bad, "x")
        with pytest.raises(UnsafePathError):
            ws.delete(bad)
    assert store.usage() == {"entries": 0, "bytes": 0}
    assert db.fetchone("SELECT count(*) FROM workspace_files")[0] == 0
    db.close()

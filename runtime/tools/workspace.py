"""Workspace operations and the seven workspace tools (seed 000, "Workspace tools").

Three layers:

- :class:`ReadOperations` / :class:`WriteOperations`: the seam. Arguments and results
  are plain JSON-able values (str, int, bool, None, lists and dicts), so an
  implementation can live in another process: a Ray bridge actor that owns a shared
  workspace implements the same method names and returns awaitables (Ray
  ``ObjectRef``\\ s are awaitable), and every caller here awaits whatever is awaitable.
- :class:`LocalWorkspace`: both protocols over a :class:`~thinkray.storage.protocols.WorkspaceStore`
  in this actor's database.
- :func:`workspace_tools`: ``read_file``, ``write_file``, ``edit_file``,
  ``list_directory``, ``find_files``, ``grep`` and ``delete`` as :class:`~thinkray.runtime.tools.base.Tool`\\ s
  over any implementation.

Errors: operations raise exceptions whose ``str()`` is a message for the model
(``Workspace*Error`` of :mod:`thinkray.storage.errors`, :class:`~thinkray.runtime.tools.paths.UnsafePathError`,
:class:`EditError`, :class:`BinaryFileError`). :func:`error_kind` maps any of them to a
short stable code for transports that cannot carry exception types.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, Protocol, TypedDict, runtime_checkable

import re2
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator
from thinkray.runtime.errors import (
    BinaryFileError as BinaryFileError,
)
from thinkray.runtime.errors import (  # re-exported: the errors live in thinkray.runtime.errors
    EditError as EditError,
)
from thinkray.runtime.errors import InvalidArgumentError, InvalidTypeError
from thinkray.runtime.tools.base import Tool, tool_from_model
from thinkray.runtime.tools.paths import UnsafePathError, normalize_path
from thinkray.runtime.typed_model import TypedModel
from thinkray.storage.errors import (
    WorkspaceExistsError,
    WorkspaceIsADirectoryError,
    WorkspaceLimitError,
    WorkspaceNotADirectoryError,
    WorkspaceNotEmptyError,
    WorkspaceNotFoundError,
    WorkspacePathError,
)
from thinkray.storage.protocols import EntryInfo, WorkspaceStore
from typing_extensions import override

Access = Literal["read", "read-write"]
"""What a tool set or a sandbox may do: ``"read"`` produces only the read tools."""

READ_METHODS = ("read_file", "list_directory", "find_files", "grep", "stat")
WRITE_METHODS = ("write_file", "edit_file", "delete")

DEFAULT_READ_LINES = 2000
MAX_READ_CHARS = 256 * 1024  # one tool result stays far below the 1.8 MB row cap
MAX_LINE_CHARS = 2000
GREP_LINE_CHARS = 300
MAX_FIND_RESULTS = 1000
MAX_GREP_MATCHES = 500


# -- result shapes -------------------------------------------------------------------


class EntryDict(TypedDict):
    """A file or directory's metadata, as :meth:`ReadOperations.stat` and
    :meth:`ReadOperations.list_directory` return it."""

    path: str
    name: str
    type: Literal["file", "directory"]
    size: int
    mime_type: str | None
    created: float  # epoch seconds
    modified: float


class GrepMatch(TypedDict):
    """One matching line of a :meth:`ReadOperations.grep`."""

    path: str
    line: int  # 1-based
    text: str  # the matching line, cut at GREP_LINE_CHARS


class GrepResult(TypedDict):
    """What :meth:`ReadOperations.grep` returns."""

    matches: list[GrepMatch]
    truncated: bool  # more matches exist beyond ``limit``
    files_searched: int


class WriteResult(TypedDict):
    """What :meth:`WriteOperations.write_file` returns."""

    path: str
    size: int
    created: bool  # False when an existing file was replaced


class EditResult(TypedDict):
    """What :meth:`WriteOperations.edit_file` returns: how many occurrences it
    replaced and the file's new size."""

    path: str
    replacements: int
    size: int


class DeleteResult(TypedDict):
    """What :meth:`WriteOperations.delete` returns."""

    path: str
    deleted: int  # entries removed (a directory counts itself and its contents)


# -- the seam ------------------------------------------------------------------------


@runtime_checkable
class ReadOperations(Protocol):
    """Read access to a workspace. Methods may be sync or async (callers await
    awaitables). Paths are workspace-relative; implementations normalize them with
    :func:`thinkray.runtime.tools.paths.normalize_path` and refuse unsafe ones (never touching
    anything). All arguments and results are JSON-able.
    """

    def read_file(self, path: str) -> str:
        """The whole file as UTF-8 text. Raises not-found, is-a-directory, or
        :class:`BinaryFileError` for content that is not UTF-8."""
        ...

    def stat(self, path: str) -> EntryDict | None:
        """Metadata of a file or directory (``""`` is the root), ``None`` if absent."""
        ...

    def list_directory(self, path: str = "") -> list[EntryDict]:
        """Direct children of a directory, sorted by name. Raises not-found /
        not-a-directory."""
        ...

    def find_files(self, pattern: str, path: str = "", limit: int = MAX_FIND_RESULTS) -> list[str]:
        """Files under ``path`` whose path relative to ``path`` matches the glob.

        ``*`` and ``?`` stay within one name, ``**`` spans directories, ``[abc]`` and
        ``{a,b}`` work as in shells; a pattern without ``/`` matches names at any
        depth (``*.py`` == ``**/*.py``). Returns at most ``limit`` full workspace
        paths, sorted; ask for ``limit + 1`` to learn whether there are more.
        """
        ...

    def grep(
        self,
        pattern: str,
        glob: str | None = None,
        path: str = "",
        ignore_case: bool = False,
        limit: int = 100,
    ) -> GrepResult:
        """Lines matching a regular expression (RE2 syntax, linear time: see
        :func:`compile_regex`) in UTF-8 files under ``path``
        (optionally filtered by a :meth:`find_files` glob), in path then line order.
        Binary files are skipped. At most ``limit`` matches; ``truncated`` says if
        there were more. Raises ``ValueError`` for an invalid regex."""
        ...


@runtime_checkable
class WriteOperations(Protocol):
    """Write access. Same conventions as :class:`ReadOperations`. Each call is atomic:
    it applies fully or raises and changes nothing."""

    def write_file(self, path: str, content: str) -> WriteResult:
        """Create or replace a UTF-8 file; missing parent directories are created."""
        ...

    def edit_file(
        self, path: str, old_string: str, new_string: str, replace_all: bool = False
    ) -> EditResult:
        """Replace the exact text ``old_string`` with ``new_string``.

        Raises :class:`EditError` when ``old_string`` is empty, does not occur, occurs
        more than once and ``replace_all`` is false (ambiguous), or equals
        ``new_string``. The read-modify-write happens on the implementation's side,
        so a remote implementation must apply it where the data lives."""
        ...

    def delete(self, path: str, recursive: bool = False) -> DeleteResult:
        """Delete a file, or a directory (non-empty ones need ``recursive=True``).
        The root cannot be deleted."""
        ...


class WorkspaceOperations(ReadOperations, WriteOperations, Protocol):
    """Both halves."""


# -- helpers shared by implementations ------------------------------------------------


def apply_edit(
    text: str, old_string: str, new_string: str, *, replace_all: bool = False, path: str = "file"
) -> tuple[str, int]:
    """The edit contract of :meth:`WriteOperations.edit_file` on a string.

    Returns ``(new_text, replacements)`` or raises :class:`EditError`.
    """
    if not old_string:
        raise EditError("old_string must not be empty (use write_file to create a file)")
    if old_string == new_string:
        raise EditError("old_string and new_string are identical; nothing to change")
    count = text.count(old_string)
    if count == 0:
        raise EditError(
            f"old_string was not found in {path!r}; it must match the file's text exactly, "
            "including whitespace and indentation (read the file first)"
        )
    if count > 1 and not replace_all:
        raise EditError(
            f"old_string occurs {count} times in {path!r}, so the edit is ambiguous; "
            "include more surrounding context to make it unique, or set replace_all=true "
            "to replace every occurrence"
        )
    return text.replace(old_string, new_string), count


class Regex(Protocol):
    """A compiled RE2 pattern (the part of its API the workspace uses)."""

    def search(self, text: str) -> Any:
        """The first match anywhere in ``text``, or ``None``."""

    def match(self, text: str) -> Any:
        """The match at the start of ``text``, or ``None``."""


def compile_regex(pattern: str, *, ignore_case: bool = False, dot_nl: bool = False) -> Regex:
    """Compile ``pattern`` with RE2, whose matching time is linear in the text: a
    pattern from a model (``(a+)+$``) cannot backtrack for seconds and freeze the
    actor's event loop as Python's ``re`` would. RE2 has no backreferences and no
    lookaround; such a pattern is refused.

    Raises:
        InvalidArgumentError: the pattern does not compile (message says why).
    """
    options = re2.Options()
    options.log_errors = False  # errors come back as exceptions, not on stderr
    options.case_sensitive = not ignore_case
    options.dot_nl = dot_nl
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        detail = exc.args[0] if exc.args else exc
        if isinstance(detail, bytes):
            detail = detail.decode("utf-8", errors="replace")
        raise InvalidArgumentError(
            f"invalid regular expression {pattern!r}: {detail} (RE2 syntax: no "
            "backreferences or lookaround)"
        ) from None


@functools.lru_cache(maxsize=256)
def compile_glob(pattern: str) -> Regex:
    """Translate a workspace glob to a regex matched against a relative path (RE2:
    a glob of many stars cannot backtrack either).

    Raises :class:`~thinkray.runtime.tools.paths.UnsafePathError` (a ``ValueError``) for patterns
    that climb (``..``) or use backslashes.
    """
    if not isinstance(pattern, str) or not pattern.strip():
        raise UnsafePathError(pattern, "empty glob pattern")
    if "\\" in pattern or "\x00" in pattern:
        raise UnsafePathError(pattern, "backslashes are not allowed in glob patterns")
    pattern = pattern.lstrip("/")
    segments = [s for s in pattern.split("/") if s not in ("", ".")]
    if any(s == ".." for s in segments):
        raise UnsafePathError(pattern, "'..' segments are not allowed in glob patterns")
    if not segments:
        raise UnsafePathError(pattern, "empty glob pattern")
    if len(segments) == 1 and segments[0] != "**":
        segments = ["**", *segments]  # a bare name matches at any depth
    out = []
    last = len(segments) - 1
    for i, segment in enumerate(segments):
        if segment == "**":
            out.append(".*" if i == last else "(?:[^/]+/)*")
            continue
        out.append(_translate_segment(segment))
        if i != last:
            out.append("/")
    return compile_regex("".join(out) + r"\z", dot_nl=True)


def _translate_segment(segment: str) -> str:
    out: list[str] = []
    i, n = 0, len(segment)
    while i < n:
        ch = segment[i]
        if ch == "*":
            while i + 1 < n and segment[i + 1] == "*":
                i += 1
            out.append("[^/]*")
        elif ch == "?":
            out.append("[^/]")
        elif ch == "[":
            end = segment.find("]", i + 2 if i + 1 < n and segment[i + 1] in "!^" else i + 1)
            if end == -1:
                out.append(re.escape(ch))
            else:
                body = segment[i + 1 : end]
                negate = body[:1] in ("!", "^")
                if negate:
                    body = body[1:]
                body = body.replace("\\", "\\\\")
                out.append(f"[{'^/' if negate else ''}{body}]")
                i = end
        elif ch == "{":
            end = segment.find("}", i)
            if end == -1:
                out.append(re.escape(ch))
            else:
                options = segment[i + 1 : end].split(",")
                out.append("(?:" + "|".join(_translate_segment(o) for o in options) + ")")
                i = end
        else:
            out.append(re.escape(ch))
        i += 1
    return "".join(out)


_ERROR_KINDS: tuple[tuple[type[BaseException], str], ...] = (
    (UnsafePathError, "invalid_path"),
    (WorkspacePathError, "invalid_path"),
    (WorkspaceNotFoundError, "not_found"),
    (WorkspaceExistsError, "exists"),
    (WorkspaceIsADirectoryError, "is_directory"),
    (WorkspaceNotADirectoryError, "not_directory"),
    (WorkspaceNotEmptyError, "not_empty"),
    (WorkspaceLimitError, "limit"),
    (EditError, "edit"),
    (BinaryFileError, "binary"),
    (PermissionError, "permission"),
    (FileNotFoundError, "not_found"),
    (IsADirectoryError, "is_directory"),
    (NotADirectoryError, "not_directory"),
    (FileExistsError, "exists"),
    (re.error, "invalid_argument"),
    (ValueError, "invalid_argument"),
    (TypeError, "invalid_argument"),
)


def error_kind(exc: BaseException) -> str:
    """A stable code for an operation error (``not_found``, ``permission``, ...);
    ``"error"`` for anything unexpected."""
    for cls, kind in _ERROR_KINDS:
        if isinstance(exc, cls):
            return kind
    return "error"


async def call_op(ops: Any, method: str, *args: Any, **kwargs: Any) -> Any:
    """Call ``ops.<method>`` and await the result if it is awaitable (sync, async
    and remote implementations alike)."""
    result = getattr(ops, method)(*args, **kwargs)
    if inspect.isawaitable(result):
        result = await result
    return result


# -- the local implementation ---------------------------------------------------------


class LocalWorkspace(WorkspaceOperations):
    """:class:`ReadOperations` and :class:`WriteOperations` over a
    :class:`~thinkray.storage.protocols.WorkspaceStore` (synchronous: each call is one or a few
    statements on the actor's database)."""

    def __init__(self, store: WorkspaceStore) -> None:
        self.store = store

    # reads

    @override
    def read_file(self, path: str) -> str:
        path = normalize_path(path)
        data = self.store.read(path)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            info = self.store.stat(path)
            raise BinaryFileError(
                f"{path!r} is a binary file ({info.size} bytes, {info.mime_type}); "
                "it cannot be read as text"
            ) from None

    @override
    def stat(self, path: str) -> EntryDict | None:
        info = self.store.try_stat(normalize_path(path, allow_root=True))
        return _entry(info) if info else None

    def exists(self, path: str) -> bool:
        """Whether ``path`` is a file or directory (``""``, the root, always is).

        Raises:
            UnsafePathError: a path that climbs out or is otherwise unsafe.
        """
        return self.store.exists(normalize_path(path, allow_root=True))

    @override
    def list_directory(self, path: str = "") -> list[EntryDict]:
        return [_entry(e) for e in self.store.list(normalize_path(path, allow_root=True))]

    @override
    def find_files(self, pattern: str, path: str = "", limit: int = MAX_FIND_RESULTS) -> list[str]:
        base = normalize_path(path, allow_root=True)
        return [e.path for e in self._glob(pattern, base, limit)]

    @override
    def grep(
        self,
        pattern: str,
        glob: str | None = None,
        path: str = "",
        ignore_case: bool = False,
        limit: int = 100,
    ) -> GrepResult:
        base = normalize_path(path, allow_root=True)
        regex = compile_regex(pattern, ignore_case=ignore_case)
        screen = _file_screen(pattern, ignore_case)
        limit = max(1, int(limit))
        if glob:
            candidates = [e.path for e in self._glob(glob, base, None)]
        else:
            candidates = [e.path for e in self.store.walk(base)]
        matches: list[GrepMatch] = []
        searched = 0
        for info, data in self.store.iter_contents(candidates):
            if b"\x00" in data[:8192]:
                continue
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                continue
            searched += 1
            lines = text.splitlines()
            if screen is not None and not screen.search("\n".join(lines)):
                continue  # one pass in C++ instead of a Python call per line
            for number, line in enumerate(lines, 1):
                if regex.search(line):
                    if len(matches) >= limit:
                        return {"matches": matches, "truncated": True, "files_searched": searched}
                    matches.append({"path": info.path, "line": number, "text": _cut(line)})
        return {"matches": matches, "truncated": False, "files_searched": searched}

    # writes

    @override
    def write_file(self, path: str, content: str) -> WriteResult:
        path = normalize_path(path)
        if not isinstance(content, str):
            raise InvalidTypeError("content must be a string")
        existed = self.store.exists(path)
        info = self.store.write(path, content)
        return {"path": path, "size": info.size, "created": not existed}

    @override
    def edit_file(
        self, path: str, old_string: str, new_string: str, replace_all: bool = False
    ) -> EditResult:
        path = normalize_path(path)
        # Read and write in one transaction: no concurrent writer slips in between.
        with self.store.transaction():
            text = self.read_file(path)
            new_text, count = apply_edit(
                text, old_string, new_string, replace_all=replace_all, path=path
            )
            info = self.store.write(path, new_text)
        return {"path": path, "replacements": count, "size": info.size}

    @override
    def delete(self, path: str, recursive: bool = False) -> DeleteResult:
        path = normalize_path(path)
        return {"path": path, "deleted": self.store.delete(path, recursive=recursive)}

    def mkdir(self, path: str) -> EntryDict:
        """Create a directory and its missing parents (an existing one is fine);
        returns its metadata.

        Raises:
            UnsafePathError: an unsafe path.
            WorkspaceExistsError: a file is at ``path``.
            WorkspaceLimitError: the entry limit would be exceeded.
        """
        return _entry(self.store.mkdir(normalize_path(path)))

    # helpers

    def _glob(self, pattern: str, base: str, limit: int | None) -> list[EntryInfo]:
        regex = compile_glob(pattern)
        cut = len(base) + 1 if base else 0
        found: list[EntryInfo] = []
        for info in self.store.walk(base):
            if regex.match(info.path[cut:]):
                found.append(info)
                if limit is not None and len(found) >= limit:
                    break
        return found


_UNSET_FLAG = re.compile(r"\(\?[a-zA-Z]*-")


def _file_screen(pattern: str, ignore_case: bool) -> Regex | None:
    """A multi-line version of ``pattern`` that finds something in a file's lines
    joined by newlines whenever ``pattern`` matches one of them, so files without a
    match are skipped in one search. ``None`` when that does not hold: text anchors
    (``\\A``, ``\\z``) and flags turned off inside the pattern (``(?-m)``)."""
    if "\\A" in pattern or "\\z" in pattern or _UNSET_FLAG.search(pattern):
        return None
    return compile_regex("(?m)" + pattern, ignore_case=ignore_case)


def _entry(info: EntryInfo) -> EntryDict:
    return info.to_dict()  # type: ignore[return-value]


def _cut(line: str, limit: int = GREP_LINE_CHARS) -> str:
    return line if len(line) <= limit else line[:limit] + "…"


def _iso(ts: float | None) -> str | None:
    if not ts:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


# -- tool inputs ----------------------------------------------------------------------


def _safe_dir(value: str) -> str:
    return normalize_path(value, allow_root=True)


# Unsafe paths fail validation, so they never reach the operations (ToolInputError).
FilePath = Annotated[
    str,
    AfterValidator(normalize_path),
    Field(description="Path relative to the workspace root, e.g. 'src/app.py'"),
]
DirPath = Annotated[
    str,
    AfterValidator(_safe_dir),
    Field(description="Directory relative to the workspace root; empty for the root"),
]


class _Input(TypedModel):
    model_config = ConfigDict(extra="forbid")


class ReadFileInput(_Input):
    """Read a text file from the workspace. Returns its lines; use offset/limit to page
    through long files."""

    path: FilePath
    offset: int | None = Field(
        default=None, ge=1, description="1-based line number to start reading at"
    )
    limit: int | None = Field(
        default=None, ge=1, le=10_000, description=f"Maximum lines (default {DEFAULT_READ_LINES})"
    )


class WriteFileInput(_Input):
    """Create a file or overwrite it entirely (parent directories are created). Prefer
    edit_file for changes to an existing file."""

    path: FilePath
    content: str = Field(description="The complete new content of the file")


class EditFileInput(_Input):
    """Replace an exact snippet of a file. old_string must occur exactly once (include
    enough surrounding lines to make it unique) unless replace_all is true."""

    path: FilePath
    old_string: str = Field(min_length=1, description="The exact text to replace")
    new_string: str = Field(description="The replacement text")
    replace_all: bool = Field(default=False, description="Replace every occurrence")


class ListDirectoryInput(_Input):
    """List a directory's entries with their type, size and modification time."""

    path: DirPath = ""


class FindFilesInput(_Input):
    """Find files by glob pattern: '*' and '?' match within a name, '**' across
    directories, '{a,b}' alternatives; a pattern without '/' matches names at any depth
    (e.g. '*.py', 'src/**/*.ts')."""

    pattern: str = Field(min_length=1, description="Glob pattern")
    path: DirPath = ""
    limit: int = Field(default=200, ge=1, le=MAX_FIND_RESULTS, description="Maximum results")

    @field_validator("pattern")
    @classmethod
    def _check_pattern(cls, value: str) -> str:
        compile_glob(value)
        return value


class GrepInput(_Input):
    """Search file contents with a regular expression (RE2 syntax: Python's re
    without backreferences or lookaround). Returns 'path:line:text' matches."""

    pattern: str = Field(min_length=1, description="Regular expression (RE2 syntax)")
    glob: str | None = Field(default=None, description="Only search files matching this glob")
    path: DirPath = ""
    ignore_case: bool = Field(default=False, description="Case-insensitive search")
    limit: int = Field(default=100, ge=1, le=MAX_GREP_MATCHES, description="Maximum matches")

    @field_validator("pattern")
    @classmethod
    def _check_regex(cls, value: str) -> str:
        compile_regex(value)
        return value

    @field_validator("glob")
    @classmethod
    def _check_glob(cls, value: str | None) -> str | None:
        if value is not None:
            compile_glob(value)
        return value


class DeleteInput(_Input):
    """Delete a file or a directory. A non-empty directory needs recursive=true."""

    path: FilePath
    recursive: bool = Field(default=False, description="Delete a directory with its contents")


# -- tools ----------------------------------------------------------------------------


def _read_page(input: ReadFileInput, text: str) -> dict[str, Any]:
    """The ``read_file`` tool's answer: the lines ``input`` asks for, long lines and the
    page cut to size, with where to go on from."""
    lines = text.splitlines(keepends=True)
    start = (input.offset or 1) - 1
    count = input.limit or DEFAULT_READ_LINES
    chunk: list[str] = []
    size = 0
    truncated = False
    for line in lines[start : start + count]:
        if len(line) > MAX_LINE_CHARS:
            line = line[:MAX_LINE_CHARS] + "… [line truncated]\n"
        if size + len(line) > MAX_READ_CHARS:
            truncated = True
            break
        chunk.append(line)
        size += len(line)
    end = start + len(chunk)
    result: dict[str, Any] = {
        "path": input.path,
        "content": "".join(chunk),
        "start_line": start + 1 if chunk else None,
        "end_line": end if chunk else None,
        "total_lines": len(lines),
    }
    if truncated or end < len(lines):
        result["next_offset"] = end + 1
    if start >= len(lines) and lines:
        result["note"] = f"offset {start + 1} is past the end ({len(lines)} lines)"
    return result


def workspace_tools(
    ops: Any, *, access: Access = "read-write", prefix: str = ""
) -> dict[str, Tool]:
    """The seven workspace tools over ``ops`` (sync or async methods).

    ``access="read"`` returns only ``read_file``, ``list_directory``, ``find_files`` and
    ``grep`` (``ops`` then needs only :class:`ReadOperations`). ``prefix`` is prepended
    to every tool name (e.g. ``"shared_"`` for a sub-agent's view of the parent's
    workspace). Results are JSON-ready dicts.
    """
    if access not in ("read", "read-write"):
        raise InvalidArgumentError(f"access must be 'read' or 'read-write', not {access!r}")

    async def read_file(input: ReadFileInput) -> dict[str, Any]:
        return _read_page(input, await call_op(ops, "read_file", input.path))

    async def list_directory(input: ListDirectoryInput) -> dict[str, Any]:
        entries = await call_op(ops, "list_directory", input.path)
        return {
            "path": input.path or "/",
            "entries": [
                {
                    "name": e["name"],
                    "type": e["type"],
                    "size": e["size"],
                    "modified": _iso(e.get("modified")),
                }
                for e in entries
            ],
        }

    async def find_files(input: FindFilesInput) -> dict[str, Any]:
        files = await call_op(ops, "find_files", input.pattern, input.path, input.limit + 1)
        return {
            "pattern": input.pattern,
            "files": files[: input.limit],
            "truncated": len(files) > input.limit,
        }

    async def grep(input: GrepInput) -> dict[str, Any]:
        found = await call_op(
            ops,
            "grep",
            input.pattern,
            input.glob,
            input.path,
            ignore_case=input.ignore_case,
            limit=input.limit,
        )
        return {
            "matches": [f"{m['path']}:{m['line']}:{m['text']}" for m in found["matches"]],
            "truncated": found["truncated"],
            "files_searched": found["files_searched"],
        }

    async def write_file(input: WriteFileInput) -> dict[str, Any]:
        return dict(await call_op(ops, "write_file", input.path, input.content))

    async def edit_file(input: EditFileInput) -> dict[str, Any]:
        return dict(
            await call_op(
                ops,
                "edit_file",
                input.path,
                input.old_string,
                input.new_string,
                replace_all=input.replace_all,
            )
        )

    async def delete(input: DeleteInput) -> dict[str, Any]:
        return dict(await call_op(ops, "delete", input.path, recursive=input.recursive))

    specs: list[tuple[str, type[BaseModel], Callable[..., Any]]] = [
        ("read_file", ReadFileInput, read_file),
        ("list_directory", ListDirectoryInput, list_directory),
        ("find_files", FindFilesInput, find_files),
        ("grep", GrepInput, grep),
    ]
    if access == "read-write":
        specs += [
            ("write_file", WriteFileInput, write_file),
            ("edit_file", EditFileInput, edit_file),
            ("delete", DeleteInput, delete),
        ]
    tools: dict[str, Tool] = {}
    for name, model, fn in specs:
        t = tool_from_model(prefix + name, model, fn)
        tools[t.name] = t
    return tools

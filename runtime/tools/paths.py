"""Workspace path safety: one canonical form, every unsafe spelling refused.

Every path a model (or a sandboxed program, or a remote agent) hands to the
workspace passes :func:`normalize_path` first. It is a pure function: it touches no
filesystem and either returns the canonical relative form (``"src/app.py"``) or raises
:class:`UnsafePathError` with the reason.

Decisions:

- **A single leading ``/`` means the workspace root.** The workspace is a virtual
  filesystem with no host directory behind it, so ``/etc/passwd`` names the workspace
  file ``etc/passwd`` and cannot reach the host; models write rooted paths out of habit
  (the seed's workspace uses them), and refusing them would only cost retries. A
  *double* leading slash (``//server/share``) is refused as a UNC-style path.
- **Refuse rather than repair.** ``..`` is refused anywhere, even where it would
  normalize away (``a/../b``): a path that tries to climb is a bug or an attack, and
  either way the caller should hear about it. Only ``.`` segments, repeated slashes
  and a trailing slash are collapsed.
- **Refuse anything another layer could decode into a separator or a dot**:
  backslashes, percent escapes (``%2e``, ``%2f``, double-encoded ``%252e``), Unicode
  look-alikes of ``.``, ``/``, ``\\`` and ``:``, malformed or overlong UTF-8.
- **Refuse names that are unportable or dangerous on some host** a file may be
  exported to: Windows device names (``CON``, ``NUL.txt``, ``COM1``), trailing dots
  or spaces, ``< > : " | ? *`` (also glob metacharacters), drive letters, control and
  invisible format characters (bidi overrides, zero-width), ``~`` home expansion.
- Lengths: at most 255 UTF-8 bytes per segment, 4096 per path.

The result is NFC-normalized, so ``café`` typed precomposed or decomposed is one file.
"""

from __future__ import annotations

import re
import unicodedata

from thinkray.runtime.errors import (  # re-exported: the errors live in thinkray.runtime.errors
    UnsafePathError as UnsafePathError,
)

MAX_SEGMENT_BYTES = 255
MAX_PATH_BYTES = 4096

ROOT = ""
"""The canonical form of the workspace root (only with ``allow_root=True``)."""


_PERCENT_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")
_DRIVE = re.compile(r"^[A-Za-z]:")
_FORBIDDEN_CHARS = frozenset('<>:"|?*')
_WINDOWS_RESERVED = frozenset(
    {"CON", "PRN", "AUX", "NUL", "CONIN$", "CONOUT$", "CLOCK$"}
    | {f"COM{i}" for i in [*range(10), "¹", "²", "³"]}
    | {f"LPT{i}" for i in [*range(10), "¹", "²", "³"]}
)
# Characters that look like (or decode to) a path separator, a dot or a colon but
# that NFKC does not fold; the NFKC check below catches the rest (fullwidth forms,
# one-dot leader, small full stop, ...).
_LOOKALIKES = frozenset(
    "\u2215"  # DIVISION SLASH
    "\u2044"  # FRACTION SLASH
    "\u29f8"  # BIG SOLIDUS
    "\u29f9"  # BIG REVERSE SOLIDUS
    "\u2216"  # SET MINUS
    "\u2571"  # BOX DRAWINGS LIGHT DIAGONAL
    "\u2572"  # BOX DRAWINGS LIGHT DIAGONAL (reverse)
    "\u1735"  # PHILIPPINE SINGLE PUNCTUATION
    "\u0338"  # COMBINING LONG SOLIDUS OVERLAY
    "\u0337"  # COMBINING SHORT SOLIDUS OVERLAY
    "\u2236"  # RATIO
    "\ua789"  # MODIFIER LETTER COLON
    "\u02d0"  # MODIFIER LETTER TRIANGULAR COLON
    "\u00b7"  # MIDDLE DOT
    "\u2027"  # HYPHENATION POINT
    "\u2219"  # BULLET OPERATOR
    "\ufffd"  # REPLACEMENT CHARACTER: the trace of undecodable bytes
)
_SPECIAL = frozenset("./\\:%~")


def _decoded(path: object) -> str:
    """``path`` as text within :data:`MAX_PATH_BYTES`: strict UTF-8 for bytes, no lone
    surrogates."""
    if isinstance(path, bytes | bytearray):
        try:
            path = bytes(path).decode("utf-8", errors="strict")
        except UnicodeDecodeError as exc:
            raise UnsafePathError(path, "not valid UTF-8 (malformed or overlong encoding)") from exc
    if not isinstance(path, str):
        raise UnsafePathError(path, f"expected a string, got {type(path).__name__}")
    try:
        raw_bytes = len(path.encode("utf-8", errors="strict"))
    except UnicodeEncodeError as exc:
        raise UnsafePathError(path, "contains lone surrogates (undecodable bytes)") from exc
    if raw_bytes > MAX_PATH_BYTES:
        raise UnsafePathError(path, f"longer than {MAX_PATH_BYTES} bytes")
    return path


def _check_forms(path: str) -> None:
    """Refuse the path forms of other systems: backslashes, percent escapes, drive
    letters, UNC and home-directory paths."""
    if "\\" in path:
        raise UnsafePathError(path, "backslashes are not allowed; use '/' as the separator")
    if _PERCENT_ESCAPE.search(path):
        raise UnsafePathError(path, "percent-encoded sequences (like %2e or %2f) are not allowed")
    if _DRIVE.match(path):
        raise UnsafePathError(path, "drive letters are not allowed; paths are workspace-relative")
    if path.startswith("//"):
        raise UnsafePathError(path, "UNC-style paths ('//host/share') are not allowed")
    if path.startswith("~"):
        raise UnsafePathError(path, "'~' home-directory paths are not allowed")


def normalize_path(path: str | bytes, *, allow_root: bool = False) -> str:
    """Return the canonical relative form of ``path`` or raise :class:`UnsafePathError`.

    ``bytes`` must be strict UTF-8 (overlong encodings such as ``b"\\xc0\\xae"`` are
    refused). ``allow_root=True`` accepts the root (``""``, ``"."``, ``"/"``) and
    returns ``""``; otherwise an empty path is refused, because every operation but
    listing and searching needs a name.
    """
    path = _decoded(path)
    _check_characters(path)
    _check_forms(path)

    text = unicodedata.normalize("NFC", path)
    segments: list[str] = []
    # A single leading '/' is the workspace root (see the module docstring).
    for segment in text.split("/"):
        if segment in ("", "."):
            continue
        _check_segment(path, segment)
        segments.append(segment)

    if not segments:
        if allow_root:
            return ROOT
        raise UnsafePathError(path, "empty path (a file or directory name is required)")
    result = "/".join(segments)
    if len(result.encode("utf-8")) > MAX_PATH_BYTES:
        raise UnsafePathError(path, f"longer than {MAX_PATH_BYTES} bytes")
    return result


def is_safe_path(path: str | bytes, *, allow_root: bool = False) -> bool:
    """Whether :func:`normalize_path` accepts ``path`` (never raises)."""
    try:
        normalize_path(path, allow_root=allow_root)
    except UnsafePathError:
        return False
    return True


def join_path(*parts: str) -> str:
    """Join already-normalized parts (``""`` is the root)."""
    return "/".join(p for p in parts if p)


def parent_path(path: str) -> str:
    """The parent of a normalized path (``""`` for top-level names)."""
    return path.rpartition("/")[0]


def base_name(path: str) -> str:
    """The last segment of a normalized path (``""`` for the root)."""
    return path.rpartition("/")[2]


def _check_characters(path: str) -> None:
    for ch in path:
        category = unicodedata.category(ch)
        if ch == "\x00":
            raise UnsafePathError(path, "contains a NUL byte")
        if category in ("Cc", "Zl", "Zp"):
            raise UnsafePathError(path, f"contains the control character U+{ord(ch):04X}")
        if category == "Cf":
            raise UnsafePathError(path, f"contains the invisible format character U+{ord(ch):04X}")
        if category == "Cs":
            raise UnsafePathError(path, "contains lone surrogates (undecodable bytes)")
        if ch in _SPECIAL or ch.isascii():
            continue
        if ch in _LOOKALIKES or any(c in _SPECIAL for c in unicodedata.normalize("NFKC", ch)):
            raise UnsafePathError(
                path,
                f"contains U+{ord(ch):04X} ({unicodedata.name(ch, 'unnamed')}), "
                "a look-alike of one of . / \\ : % ~",
            )


def _check_segment(path: str, segment: str) -> None:
    if segment == "..":
        raise UnsafePathError(path, "'..' segments are not allowed")
    if set(segment) == {"."}:
        raise UnsafePathError(path, f"a name made only of dots ({segment!r}) is not allowed")
    if segment.startswith("~"):
        raise UnsafePathError(path, "'~' home-directory paths are not allowed")
    if len(segment.encode("utf-8")) > MAX_SEGMENT_BYTES:
        raise UnsafePathError(path, f"a name is longer than {MAX_SEGMENT_BYTES} bytes")
    if segment[-1] in ". ":
        raise UnsafePathError(path, f"names may not end with a dot or a space ({segment!r})")
    if segment[0] == " ":
        raise UnsafePathError(path, f"names may not start with a space ({segment!r})")
    bad = _FORBIDDEN_CHARS.intersection(segment)
    if bad:
        raise UnsafePathError(
            path, f"contains {''.join(sorted(bad))!r} (not allowed in file names)"
        )
    stem = segment.split(".", 1)[0].rstrip(" ").upper()
    if stem in _WINDOWS_RESERVED:
        raise UnsafePathError(path, f"{segment!r} is a reserved device name on Windows")

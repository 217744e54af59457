"""The link tree mypy reads the three packages through, under their installed names
(thinkray.runtime/actors/storage): one path per checkout, so that mypy's cache
(pyproject.toml's ``cache_dir``) stays valid between .ci/typecheck and the typing test
of the handles. Run as a script it prints the tree's path."""

from __future__ import annotations

import contextlib
import hashlib
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def mypy_farm(repo: Path = REPO) -> Path:
    tag = hashlib.sha1(str(repo).encode()).hexdigest()[:12]
    root = Path(tempfile.gettempdir()) / f"thinkray-mypy-farm-{tag}"
    (root / "thinkray").mkdir(parents=True, exist_ok=True)
    for package in ("runtime", "actors", "storage"):
        with contextlib.suppress(FileExistsError):
            (root / "thinkray" / package).symlink_to(repo / package)
    return root


if __name__ == "__main__":
    print(mypy_farm())

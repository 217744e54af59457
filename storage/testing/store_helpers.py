"""What the store suites share: the fixtures they expect and the transaction checks.

Every store suite (``*_store_suite.py``, ``stores_suite.py``) runs against fixtures the
importing module provides:

- ``stores``: a fresh, empty :class:`~thinkray.storage.protocols.Stores`, closed by the
  fixture afterwards (whatever the test did to it).
- ``reopen``: a callable ``reopen(stores) -> Stores`` that closes ``stores`` (through
  whatever owns its database) and opens the same backing file again (the new stores are
  also closed by the fixture), or ``None`` for stores without a file; tests that need
  it then skip.

Each suite derives the store it tests from ``stores`` (``stores.fibers()``, ...) in a
fixture of its own, exported with its test classes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from thinkray.storage.protocols import Stores

Reopen = Callable[[Stores], Stores] | None


class Boom(Exception):
    """Raised inside a transaction block to make it roll back."""


def need_reopen(reopen: Reopen) -> Callable[[Stores], Stores]:
    """``reopen``, or skip the test for stores without a file."""
    if reopen is None:
        pytest.skip("these stores have no file to reopen")
    return reopen


def rolled_back(store: Any, write: Callable[[], object]) -> None:
    """Run ``write`` inside ``store.transaction()`` and raise :class:`Boom` after it:
    the block must roll back and let the exception through."""
    with pytest.raises(Boom), store.transaction():
        write()
        raise Boom


def nested_rolled_back(
    store: Any, outer: Callable[[], object], inner: Callable[[], object]
) -> None:
    """``outer`` in a transaction, ``inner`` in a nested one that exits normally, then
    :class:`Boom` leaves the outer block: both must be undone."""
    with pytest.raises(Boom), store.transaction():
        outer()
        with store.transaction():
            inner()
        raise Boom


def inner_failure_caught(
    store: Any, inner: Callable[[], object], after: Callable[[], object]
) -> None:
    """``inner`` then :class:`Boom` in a nested block whose exception the outer block
    catches; ``after`` runs in the outer block, which then exits normally: everything
    ``inner`` and ``after`` wrote must commit (the nested block joined the outer one)."""
    with store.transaction():
        try:
            with store.transaction():
                inner()
                raise Boom
        except Boom:
            pass
        after()

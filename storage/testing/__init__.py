"""Conformance suites that every storage implementation must pass.

These are pytest test classes written against the protocols of
:mod:`thinkray.storage.protocols` only, so an implementation of another backend
(Postgres, Redis, ...) runs the same checks as the DuckDB one (the pattern of LangGraph's
checkpoint conformance tests). The modules import pytest, which is not a runtime
dependency of thinkray: install pytest to use them (nothing else imports this package;
:mod:`thinkray.storage` does not).

Usage: import the test classes into a test module of your own and provide the fixtures
the suite documents. For :class:`~thinkray.storage.protocols.SessionStore`::

    import pytest
    from thinkray.storage.testing.session_store_suite import *  # noqa: F403

    @pytest.fixture
    def store():
        s = MyStore(...)  # fresh and empty
        yield s
        s.close()

    @pytest.fixture
    def reopen():
        ...  # reopen(store) -> store on the same backing data; or return None

The suites of the other stores (``fiber_store_suite``, ``job_store_suite``,
``tool_call_store_suite``, ``inbox_store_suite``, ``registry_store_suite``,
``kv_store_suite``, ``workspace_store_suite``, ``stores_suite``) take a ``stores``
fixture (a fresh :class:`~thinkray.storage.protocols.Stores`) and the same kind of
``reopen`` instead; :mod:`thinkray.storage.testing.store_helpers` describes them. Each
suite's ``__all__`` lists its test classes and fixtures, so a star import brings in
exactly those. The repository's ``tests/test_store_conformance.py`` and
``tests/test_session_store_conformance.py`` run them on DuckDB.
"""

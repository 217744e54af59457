"""Conformance suites that every storage implementation must pass.

Usage (pattern: langgraph's checkpoint-conformance): import the test classes into a
test module and provide the fixtures the suite documents::

    from conformance.session_store_suite import *  # noqa: F403

    @pytest.fixture
    def store(): ...

    @pytest.fixture
    def reopen(): ...  # or return None for a store without a file

The suites of the other stores (``*_store_suite.py``, ``stores_suite.py``) take a
``stores`` fixture instead (see ``store_helpers.py``); ``tests/test_store_conformance.py``
runs them on DuckDB.
"""

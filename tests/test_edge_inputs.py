"""Input at the edges (issue 26, items 11-13): names and ids that one entry point would
accept and every other refuse, and bodies built to exhaust the parser."""

from __future__ import annotations

import pytest
from thinkray.storage.layout import validate_name
from thinkray.storage.owners import OwnerRegistry
from thinkray.storage.types import InvalidInputError


@pytest.mark.parametrize("name", ["nl-1\n", "nl-1\r\n", "a\nb", "x\x00", "tab\t"])
def test_a_name_with_a_trailing_newline_or_control_is_refused(tmp_path, name):
    # "$" matches before a final newline: "nl-1\n" passed and became ".owners/nl-1\n"
    # and "nl-1\n.duckdb" on disk.
    with pytest.raises(InvalidInputError):
        validate_name(name)
    with pytest.raises(InvalidInputError):
        OwnerRegistry(str(tmp_path)).claim("ns", name, "alice")
    assert list(tmp_path.rglob("*")) == []
    assert validate_name("nl-1") == "nl-1"

"""Agent-name ownership for the ingress's tenancy (issue 11, item 5): the first
principal to claim a name owns it, atomically, across processes."""

from __future__ import annotations

import multiprocessing

import pytest
from thinkray.storage.owners import OwnerRegistry
from thinkray.storage.types import InvalidInputError


def _claim(args: tuple[str, str]) -> bool:
    root, principal = args
    return OwnerRegistry(root).claim("ns", "contested", principal)


def test_the_first_claim_wins_and_others_change_nothing(tmp_path):
    owners = OwnerRegistry(tmp_path)
    assert owners.owner("ns", "a") is None
    assert owners.claim("ns", "a", "alice")
    assert owners.claim("ns", "a", "alice")  # idempotent
    assert not owners.claim("ns", "a", "bob")
    assert owners.owner("ns", "a") == "alice"
    assert owners.names("ns", "alice") == ["a"] and owners.names("ns", "bob") == []
    assert not owners.release("ns", "a", "bob")
    assert owners.release("ns", "a", "alice") and owners.owner("ns", "a") is None
    assert owners.claim("ns", "a", "bob")


def test_concurrent_claims_from_processes_have_exactly_one_winner(tmp_path):
    principals = [f"p{i}" for i in range(8)]
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        won = pool.map(_claim, [(str(tmp_path), p) for p in principals])
    assert sum(won) == 1
    owner = OwnerRegistry(tmp_path).owner("ns", "contested")
    assert owner == principals[won.index(True)]
    assert not [p for p in (tmp_path / "ns" / ".owners").iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("name", ["../x", "", ".hidden", "a/b", "x" * 200])
def test_invalid_names_are_refused_before_touching_the_disk(tmp_path, name):
    owners = OwnerRegistry(tmp_path)
    with pytest.raises(InvalidInputError):
        owners.claim("ns", name, "alice")
    assert not list(tmp_path.iterdir())

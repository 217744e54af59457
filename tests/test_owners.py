"""Agent-name ownership for the ingress's tenancy (issue 11, item 5): the first
principal to claim a name owns it, atomically, across processes. The same tests run
against a local root, a ``file://`` root and an ``s3://`` root on a real S3 API (moto's
server on loopback; issue 13), where a claim is the store's put-if-absent."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
from thinkray.storage.owners import OwnerRegistry, principal_key
from thinkray.storage.types import InvalidInputError


def _claim(args: tuple[str, str]) -> bool:
    root, principal = args
    return OwnerRegistry(root).claim("ns", "contested", principal)


def _everything(root: str) -> list[str]:
    """Every file or object under ``root`` (relative paths)."""
    if "://" in root:
        from thinkray.storage.objectstore import list_objects

        return sorted(rel for rel, _size in list_objects(root, "", recursive=True))
    base = Path(root)
    return sorted(str(p.relative_to(base)) for p in base.rglob("*") if p.is_file())


def test_the_first_claim_wins_and_others_change_nothing(any_root):
    owners = OwnerRegistry(any_root)
    assert owners.owner("ns", "a") is None
    assert owners.names("ns", "alice") == []
    assert owners.claim("ns", "a", "alice")
    assert owners.claim("ns", "a", "alice")  # idempotent
    assert not owners.claim("ns", "a", "bob")
    assert owners.owner("ns", "a") == "alice"
    assert OwnerRegistry(any_root).owner("ns", "a") == "alice"  # another replica sees it
    # in the store, not a local folder: the owner file and alice's index entry
    assert _everything(any_root) == [
        "ns/.owned/.indexed-v1",
        f"ns/.owned/{principal_key('alice')}/a",
        "ns/.owners/a",
    ]
    assert owners.claim("ns", "b", "bob")
    assert owners.names("ns", "alice") == ["a"] and owners.names("ns", "bob") == ["b"]
    assert owners.names("ns", "carol") == [] and owners.names("other", "alice") == []
    assert not owners.release("ns", "a", "bob")
    assert owners.release("ns", "a", "alice") and owners.owner("ns", "a") is None
    assert owners.names("ns", "alice") == []
    assert owners.claim("ns", "a", "bob")
    assert owners.names("ns", "bob") == ["a", "b"]


def test_concurrent_claims_from_processes_have_exactly_one_winner(any_root):
    principals = [f"p{i}" for i in range(8)]
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        won = pool.map(_claim, [(any_root, p) for p in principals])
    assert sum(won) == 1
    owner = OwnerRegistry(any_root).owner("ns", "contested")
    assert owner == principals[won.index(True)]
    assert [p for p in _everything(any_root) if "/.owners/" in f"/{p}"] == [
        "ns/.owners/contested"
    ]  # no temporary file left behind


@pytest.mark.parametrize("name", ["../x", "", ".hidden", "a/b", "x" * 200])
def test_invalid_names_are_refused_before_touching_the_store(any_root, name):
    owners = OwnerRegistry(any_root)
    with pytest.raises(InvalidInputError):
        owners.claim("ns", name, "alice")
    with pytest.raises(InvalidInputError):
        owners.owner(name, "a")
    assert _everything(any_root) == []

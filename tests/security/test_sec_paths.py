"""Attacks on the default folders (issue 21, item 16): with no storage root given,
``thinkray serve`` / ``demo`` used ``/tmp/thinkray-serve`` and the object cache
``/tmp/thinkray-cache``, predictable paths in a folder every user can write, created
with default permissions. Another user could create them first (or a symbolic link
named so) and read or swap every agent's file. Now they are this user's private
folders (0700), and a pre-existing one that is a link, another user's or writable by
others is refused with a clear error, nothing written into it."""

from __future__ import annotations

import argparse
import os
import stat
import tempfile
from pathlib import Path

import pytest
from thinkray.actors.cli import serve_config
from thinkray.storage.errors import StorageRootError
from thinkray.storage.layout import private_dir, user_dir
from thinkray.storage.objectstore import default_cache_dir


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A fresh home; no storage root or cache configured."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for var in ("XDG_DATA_HOME", "XDG_CACHE_HOME", "THINKRAY_STORAGE_ROOT", "THINKRAY_CACHE_DIR"):
        monkeypatch.delenv(var, raising=False)
    return home


def _serve_root() -> str:
    args = argparse.Namespace(
        storage_root=None, agent=None, token=None, token_file=None, cors_origin=None
    )
    return serve_config(args)[0].storage_root


def _mode(path: str | Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_the_default_root_and_cache_are_private_per_user_folders(home):
    root = Path(_serve_root())
    assert root == home / ".local" / "share" / "thinkray" / "serve"
    assert _mode(root) == 0o700 and _mode(root.parent) == 0o700
    cache = default_cache_dir()
    assert cache == home / ".cache" / "thinkray" / "objects"
    assert _mode(cache) == 0o700 and _mode(cache.parent) == 0o700


def test_a_symlink_planted_at_the_default_root_is_refused(home, tmp_path):
    attacker = tmp_path / "attacker"
    attacker.mkdir(mode=0o777)
    (home / ".local" / "share").mkdir(parents=True)
    (home / ".local" / "share" / "thinkray").symlink_to(attacker)
    with pytest.raises(StorageRootError, match="symbolic link"):
        _serve_root()
    (home / ".cache").mkdir()
    (home / ".cache" / "thinkray").symlink_to(attacker)
    with pytest.raises(StorageRootError, match="symbolic link"):
        default_cache_dir()
    assert list(attacker.iterdir()) == []  # nothing was written through the link


def test_a_folder_another_user_made_first_is_refused(home, tmp_path):
    if os.geteuid() == 0:
        planted = home / ".local" / "share" / "thinkray"
        planted.mkdir(parents=True, mode=0o755)
        os.chown(planted, 65534, 65534)  # nobody's
        with pytest.raises(StorageRootError, match="owned by another user"):
            _serve_root()
        assert list(planted.iterdir()) == []
    else:  # not root: a folder root owns stands for another user's
        with pytest.raises(StorageRootError, match="owned by another user"):
            private_dir("/usr")


def test_a_folder_writable_by_others_is_refused_and_a_readable_one_narrowed(home):
    base = home / ".cache" / "thinkray"
    base.mkdir(parents=True)
    base.chmod(0o777)
    with pytest.raises(StorageRootError, match="writable by other users"):
        default_cache_dir()
    assert list(base.iterdir()) == []
    base.chmod(0o755)  # this user's, only readable by others: narrowed, then used
    assert default_cache_dir() == base / "objects"
    assert _mode(base) == 0o700


def test_without_a_usable_home_the_fallback_under_tmp_is_checked_too(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", "/")
    for var in ("XDG_DATA_HOME", "XDG_CACHE_HOME", "THINKRAY_STORAGE_ROOT"):
        monkeypatch.delenv(var, raising=False)
    shared_tmp = tmp_path / "tmp"
    shared_tmp.mkdir(mode=0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(shared_tmp))
    expected = shared_tmp / f"thinkray-{os.geteuid()}-data"
    assert user_dir("data") == expected
    attacker = tmp_path / "attacker"
    attacker.mkdir()
    expected.symlink_to(attacker)  # another user got there first
    with pytest.raises(StorageRootError, match="symbolic link"):
        _serve_root()
    expected.unlink()
    assert Path(_serve_root()) == expected / "serve"
    assert _mode(expected) == 0o700


def test_an_explicit_cache_dir_is_used_as_given(home, tmp_path, monkeypatch):
    monkeypatch.setenv("THINKRAY_CACHE_DIR", str(tmp_path / "mine"))
    assert default_cache_dir() == tmp_path / "mine"

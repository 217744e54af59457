"""Storage roots on object storage, fenced (issue 13, items 1-3): the same behavioural
tests against a real S3 API (moto's server on loopback, started here) and a file://
root; the two-node rounds are tests/objectstore_check.py's, run in tests/two_node_check.py's
cluster."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("pyarrow")
boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto.server")

from thinkray.storage import objectstore as osx  # noqa: E402
from thinkray.storage.errors import StorageRootError  # noqa: E402
from thinkray.storage.layout import ensure_root, list_names, session_path  # noqa: E402
from thinkray.storage.session_store import DuckDBSessionStore  # noqa: E402

from tests.helpers import free_port, round_of  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


_bucket_counter = iter(range(10_000))


@pytest.fixture(params=["s3", "file"])
def root(request, tmp_path):
    if request.param == "s3":
        server = request.getfixturevalue("moto_server")
        bucket = f"bucket{next(_bucket_counter)}"
        boto3.client("s3", endpoint_url=server["endpoint"]).create_bucket(Bucket=bucket)
        return f"s3://{bucket}/pre?endpoint_override={server['endpoint']}"
    return f"file://{tmp_path}/store"


def _session(root, tmp_path, owner, ttl=30.0, name="ada", clock=time.monotonic):
    return osx.RemoteSession(
        root,
        "ns",
        name,
        owner=owner,
        cache_dir=tmp_path / f"cache-{owner}",
        lease_ttl=ttl,
        clock=clock,
    )


def _write(session: osx.RemoteSession, text: str) -> None:
    store = DuckDBSessionStore(session.local_path)
    store.db.execute("CREATE TABLE IF NOT EXISTS t (v VARCHAR)")
    store.db.execute("INSERT INTO t VALUES (?)", [text])
    store.close()


def _read(path: Path) -> list[str]:
    store = DuckDBSessionStore(path)
    try:
        return [r[0] for r in store.db.fetchall("SELECT v FROM t")]
    finally:
        store.close()


def test_round_trip_and_listing(root, tmp_path):
    ensure_root(root, "ns")
    a = _session(root, tmp_path, "a")
    a.acquire()
    assert a.fetch() is False  # new session
    assert session_path(root, "ns", "ada").exists()  # the lease makes it exist
    _write(a, "one")
    assert a.commit().generation == 1
    _write(a, "two")
    assert a.commit().generation == 2
    a.release()
    assert list_names(root, "ns") == ["ada"]
    b = _session(root, tmp_path, "b")
    b.acquire()
    assert b.fetch() is True and b.base is not None and b.base.generation == 3  # the fence
    assert _read(b.local_path) == ["one", "two"]
    # a local copy of the newest generation is reused, not downloaded again
    b.backend, real = _NoDownload(b.backend), b.backend
    assert b.fetch() is True
    b.backend = real
    b.release()
    assert not session_path(root, "ns", "nobody").exists()


class _NoDownload:
    def __init__(self, backend):
        self._backend = backend

    def download(self, *args):
        raise AssertionError("downloaded a valid local copy again")

    def __getattr__(self, name):
        return getattr(self._backend, name)


def test_upload_failure_leaves_previous_generation(root, tmp_path, request, monkeypatch):
    a = _session(root, tmp_path, "a")
    a.acquire()
    a.fetch()
    _write(a, "kept")
    a.commit()
    _write(a, "not uploaded")
    monkeypatch.setattr(osx, "UPLOAD_ATTEMPTS", 2)
    if root.startswith("s3"):
        server = request.getfixturevalue("moto_server")
        server["server"].stop()
        try:
            with pytest.raises(osx.UploadError):
                a.commit()
        finally:
            from tests.helpers import start_moto

            server["server"] = start_moto(server["port"])
    else:
        monkeypatch.setattr(a.backend, "upload", _fail)
        with pytest.raises(osx.UploadError):
            a.commit()
        monkeypatch.undo()
    assert a.latest().generation == 1
    assert a.held and _read(a.local_path) == ["kept", "not uploaded"]  # still ours, live
    assert a.commit().generation == 2  # the retry after recovery
    b = _session(root, tmp_path, "b")
    a.release()
    b.acquire()
    b.fetch()
    assert _read(b.local_path) == ["kept", "not uploaded"]


def _fail(*args):
    raise OSError("disk on fire")


def test_corrupted_download_is_refused_and_keeps_the_good_copy(root, tmp_path):
    a = _session(root, tmp_path, "a")
    a.acquire()
    a.fetch()
    _write(a, "first")
    a.commit()
    a.release()
    b = _session(root, tmp_path, "b")
    b.acquire()
    b.fetch()  # b's cache: generation 1
    b.release()
    a.acquire()
    a.fetch()
    _write(a, "second")
    manifest = a.commit()
    a.release()
    # overwrite the bytes of generation 2's object
    a.backend.write(manifest.data, b"garbage" * 1000)
    b.acquire()
    with pytest.raises(osx.ChecksumError):
        b.fetch()
    assert _read(b.local_path) == ["first"]  # the good local copy is untouched
    b.release()
    c = _session(root, tmp_path, "c")
    c.acquire()
    with pytest.raises(osx.ChecksumError):
        c.fetch()
    assert not c.local_path.exists()


class _Clock:
    """A monotonic clock a test moves by hand."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def test_stale_owner_upload_is_refused(root, tmp_path):
    a = _session(root, tmp_path, "a", ttl=0.5)
    a.acquire()
    a.fetch()
    _write(a, "from a")
    clock = _Clock()
    b = _session(root, tmp_path, "b", clock=clock)
    with pytest.raises(osx.LeaseHeldError):
        b.acquire()  # b sees a's lease: it starts counting on its own clock
    clock.now += 0.6  # a stalls: no renewal for a TTL of b's clock
    b.acquire()
    b.fetch()
    _write(b, "from b")
    # a wakes up and tries to commit: its lease was taken over
    with pytest.raises(osx.StaleOwnerError):
        a.commit()
    assert b.commit().generation == 1
    # The generation key is the fence even if a lease check were skipped:
    c = _session(root, tmp_path, "c")
    c.lease_epoch = b.lease_epoch  # pretend to hold the lease (no check)
    c.renew = lambda: None  # type: ignore[method-assign]
    c.base = None  # a stale base: would commit generation 1 again
    c.local_path.parent.mkdir(parents=True, exist_ok=True)
    c.local_path.write_bytes(b.local_path.read_bytes())
    with pytest.raises(osx.StaleOwnerError):
        c.commit()
    assert b.latest().owner == "b"


def test_dead_owners_lease_lapses_on_the_takers_clock(root, tmp_path):
    a = _session(root, tmp_path, "a", ttl=1.0)
    a.acquire()  # then a dies: no release, no renewal
    clock = _Clock()
    b = _session(root, tmp_path, "b", clock=clock)
    with pytest.raises(osx.LeaseHeldError) as info:
        b.acquire()
    assert info.value.owner == "a"
    clock.now += 0.9
    with pytest.raises(osx.LeaseHeldError):
        b.acquire()  # not a whole TTL of b's clock yet
    clock.now += 0.2
    b.acquire()
    assert b.lease().owner == "b"
    with pytest.raises(osx.LeaseLostError):
        a.renew()


def test_only_one_of_many_racers_takes_the_lease(root, tmp_path):
    racers = [_session(root, tmp_path, f"r{i}") for i in range(6)]
    barrier = threading.Barrier(len(racers))
    won: list[str] = []

    def race(session):
        barrier.wait()
        try:
            session.acquire()
            won.append(session.owner)
        except osx.LeaseHeldError:
            pass

    threads = [threading.Thread(target=race, args=(s,)) for s in racers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1


def test_a_folder_created_while_it_is_listed_is_listed_again(tmp_path):
    """pyarrow's local listing (``allow_not_found``) checks whether a missing folder
    exists only after listing it failed, and raises if it appeared in between: one of
    the racers above once failed its ``acquire`` with that FileNotFoundError when
    another created the session's folder. Injected here at the file system's seam."""
    folder = tmp_path / "store" / "ns" / "ada"
    folder.mkdir(parents=True)
    (folder / "lease-1.json").write_text("{}")
    backend = osx._Backend(osx.RootURI.parse(f"file://{tmp_path}/store"))
    real = backend.fs
    listings: list[str] = []

    class CreatedMeanwhile:
        def __getattr__(self, name: str):
            return getattr(real, name)

        def get_file_info(self, selector):
            listings.append(selector.base_dir)
            if len(listings) == 1:
                raise FileNotFoundError(f"Cannot list directory '{selector.base_dir}'")
            return real.get_file_info(selector)

    backend.fs = CreatedMeanwhile()
    assert backend.children("ns/ada") == [("lease-1.json", False)]
    assert len(listings) == 2


@pytest.mark.timeout(120)  # an unreachable endpoint fails, it does not retry for ever
def test_bad_roots_fail_at_start_with_a_clear_message(moto_server):
    port = free_port()  # nothing listens there
    with pytest.raises(StorageRootError, match="not usable"):
        ensure_root(f"s3://b/p?endpoint_override=http://127.0.0.1:{port}", "ns")
    with pytest.raises(StorageRootError, match="not usable"):
        ensure_root(f"s3://no-such-bucket/p?endpoint_override={moto_server['endpoint']}", "ns")
    with pytest.raises(StorageRootError, match="conditional write"):
        ensure_root("gs://bucket/prefix", "ns")
    with pytest.raises(StorageRootError):
        ensure_root("file://relative/path", "ns")


@pytest.mark.ray
@pytest.mark.xdist_group("two-nodes")  # one worker: one cluster (tests/two_node_check.py)
@pytest.mark.parametrize("kind", ["s3", "file"])
def test_two_nodes_round_trip_race_and_takeover(kind, two_node_report):
    """tests/objectstore_check.py: hibernate on one node, wake on the other; (s3) the
    store goes down during hibernate; two nodes race to bind; a killed owner's lease
    expires and the other node takes over with nothing committed lost."""
    report = round_of(two_node_report[0], f"objectstore-{kind}")
    assert report["first_node"] != report["second_node"]
    assert report["same_history"] and report["messages"] == 4
    assert report["names"] == ["traveller"]
    if kind == "s3":
        assert "UploadError" in report["hibernate_while_down"]
        assert report["live_while_down"] == 6  # the agent stayed live
        assert report["after_recovery"] == 6  # and nothing was lost
    assert sorted(r.split(":")[0] for r in report["race"]) == [
        "RayTaskError(LeaseHeldError)",
        "bound",
    ]
    assert report["refused_while_lease_live"] >= 1
    assert report["takeover_history_same"]
    assert report["takeover_extra_turn"] == ["acknowledged, never hibernated"]


# -- the turn log, fencing and corrupt objects (issue 21, items 9, 10, 15) -------------


def _ship(session: osx.RemoteSession, store: DuckDBSessionStore) -> None:
    """What the session actor does at the end of a turn."""
    upload = session.prepare_ship(lambda: store.db.execute("CHECKPOINT"))
    if upload is not None:
        upload()


def _turn(session: osx.RemoteSession, store: DuckDBSessionStore, text: str) -> None:
    store.db.execute("CREATE TABLE IF NOT EXISTS t (v VARCHAR)")
    store.db.execute("INSERT INTO t VALUES (?)", [text])
    _ship(session, store)


def _taken_over(root, tmp_path, owner, ttl, holder_ttl=None):
    """A second owner that takes the lease after seeing it unrenewed for a TTL of its
    own (injected) clock."""
    clock = _Clock()
    taker = _session(root, tmp_path, owner, clock=clock)
    with pytest.raises(osx.LeaseHeldError):
        taker.acquire()
    clock.now += (holder_ttl or ttl) + 0.01
    taker.acquire()
    return taker


def test_shipped_turns_survive_the_owner_without_any_commit(root, tmp_path):
    a = _session(root, tmp_path, "a", ttl=0.5)
    a.acquire()
    a.fetch()
    store = DuckDBSessionStore(a.local_path)
    for i in range(3):
        _turn(a, store, f"turn {i}")
    assert a.latest().generation == 1  # the first generation, then log entries only
    assert a.log_seq == 2
    store.db.execute("INSERT INTO t VALUES ('never shipped')")
    # a is gone (its file is never closed nor committed); b wakes the session
    b = _taken_over(root, tmp_path, "b", 0.5)
    assert b.fetch() is True
    store.close()  # (releases the file lock of this process only)
    assert _read(b.local_path) == ["turn 0", "turn 1", "turn 2"]
    assert b.base.generation == 2 and b.base.fence


def test_a_takeover_fences_the_previous_owner(root, tmp_path):
    a = _session(root, tmp_path, "a", ttl=0.5)
    a.acquire()
    a.fetch()
    store = DuckDBSessionStore(a.local_path)
    _turn(a, store, "acknowledged by a")
    _turn(a, store, "acknowledged by a too")
    b = _taken_over(root, tmp_path, "b", 0.5)  # a was paused past its TTL
    b.fetch()
    b_store = DuckDBSessionStore(b.local_path)
    _turn(b, b_store, "acknowledged by b")
    # a resumes: its renewal comes too late, and every write it tries is refused
    with pytest.raises(osx.LeaseLostError):
        a.renew()
    store.db.execute("INSERT INTO t VALUES ('zombie turn')")
    with pytest.raises(osx.StaleOwnerError):
        _ship(a, store)
    store.close()
    with pytest.raises(osx.StaleOwnerError):
        a.commit()
    b_store.close()
    b.commit()
    b.release()
    c = _session(root, tmp_path, "c")
    c.acquire()
    c.fetch()
    assert _read(c.local_path) == [
        "acknowledged by a",
        "acknowledged by a too",
        "acknowledged by b",
    ]


def test_a_zombie_sealing_first_still_loses_to_the_fence(root, tmp_path):
    """The zombie gets as far as sealing its log (its hibernation started) and stops:
    the taker's fence generation wins, the zombie's commit is refused, and nothing the
    zombie acknowledged is lost (it was in the log before the seal)."""
    a = _session(root, tmp_path, "a", ttl=0.5)
    a.acquire()
    a.fetch()
    store = DuckDBSessionStore(a.local_path)
    _turn(a, store, "one")
    _turn(a, store, "two")
    store.close()
    a._seal(a.base.generation)  # a's commit, paused right after its seal
    b = _taken_over(root, tmp_path, "b", 0.5)
    b.fetch()
    assert _read(b.local_path) == ["one", "two"]
    with pytest.raises(osx.StaleOwnerError):
        a._put_generation(a.base.generation + 1, a.local_path)  # the rest of a's commit


def test_lease_expiry_ignores_wall_clocks(root, tmp_path, monkeypatch):
    """A holder whose wall clock runs an hour ahead renews as usual; a taker whose
    wall clock runs an hour ahead still waits a whole TTL of its monotonic clock."""
    a = _session(root, tmp_path, "a", ttl=5.0)
    real = time.time
    monkeypatch.setattr(osx.time, "time", lambda: real() + 3600)  # skewed wall clock
    a.acquire()
    clock = _Clock()
    b = _session(root, tmp_path, "b", clock=clock)
    with pytest.raises(osx.LeaseHeldError):
        b.acquire()
    clock.now += 4.0
    a.renew()  # a new version: b starts counting again
    clock.now += 4.0
    with pytest.raises(osx.LeaseHeldError) as info:
        b.acquire()
    assert info.value.expires_in == pytest.approx(5.0)
    clock.now += 5.0
    b.acquire()
    assert b.lease().owner == "b"


@pytest.mark.parametrize("damage", ["empty", "garbled", "deleted-data", "garbled-log"])
def test_a_damaged_object_fails_the_wake_and_keeps_the_local_copy(root, tmp_path, damage):
    a = _session(root, tmp_path, "a")
    a.acquire()
    a.fetch()
    store = DuckDBSessionStore(a.local_path)
    for i in range(4):
        _turn(a, store, f"turn {i}")
    store.close()
    manifest = a.commit()
    a.release()
    b = _session(root, tmp_path, "b")
    b.acquire()
    b.fetch()  # b's cache: the whole history
    store = DuckDBSessionStore(b.local_path)
    _turn(b, store, "turn 4")
    store.close()
    b.release()  # b crashes after a shipped turn: its log entry is what is newest
    manifest = b.base
    key = b._gen_key(manifest.generation)
    log_key = b._log_key(manifest.generation, 1)
    saved = b.backend.read(key)
    if damage == "empty":
        b.backend.write(key, b"")
    elif damage == "garbled":
        b.backend.write(key, b'{"generation": 3, "sha')
    elif damage == "deleted-data":
        b.backend.delete(manifest.data)
        b._drop_local()  # a node without a local copy
    else:
        b.backend.write(log_key, b"\x93garbage")
    before = b.local_path.read_bytes() if b.local_path.exists() else None
    b.acquire()
    with pytest.raises(osx.CorruptObjectError) as info:
        b.fetch()
    assert info.value.session == "ns/ada"
    assert info.value.key in (key, manifest.data, log_key)
    assert info.value.key in str(info.value)
    if before is not None:
        assert b.local_path.read_bytes() == before  # the good local copy is kept
    if damage in ("empty", "garbled"):
        b.backend.write(key, saved)  # restoring the manifest brings the history back
        b.fetch()
        assert _read(b.local_path) == [f"turn {i}" for i in range(5)]

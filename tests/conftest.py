"""Fixtures shared by every test folder: the store implementations (local disk, memory://,
s3:// on a loopback moto server, one per test session), each at a fresh empty location."""

from __future__ import annotations

import logging
import uuid

import pytest
from hypothesis import HealthCheck, settings

from lmdata.storage import FsspecStore, LocalStore

BUCKET = "lmdata-test"

# The suite runs on loaded machines: no hypothesis test fails for time. Every test inherits
# these (a test's own settings(...) replace only what they name); filtering health checks stay
# on, as strategies draw valid inputs by construction.
settings.register_profile(
    "lmdata", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile("lmdata")


@pytest.fixture
def memory_root():
    """A fresh memory:// prefix, removed after the test."""
    root = f"memory://lmdata-test-{uuid.uuid4().hex[:10]}"
    yield root
    store = FsspecStore("memory")
    store.remove("/" + root.split("://", 1)[1])


@pytest.fixture(scope="session")
def s3_server():
    """An S3-compatible server (moto) on 127.0.0.1 for the whole session, with one bucket;
    yields the storage options that point s3fs at it. Nothing talks to any other address."""
    pytest.importorskip("s3fs")
    server_mod = pytest.importorskip("moto.server")
    mp = pytest.MonkeyPatch()
    for k, v in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        mp.setenv(k, v)
    mp.delenv("AWS_PROFILE", raising=False)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a log record per request: slow
    # port 0: the server binds a free port itself (a port found free, then bound later, can be
    # taken in between by another process: the server's thread then fails and start() waits)
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    port = server.get_host_and_port()[1]
    endpoint = f"http://127.0.0.1:{port}"
    options = {"client_kwargs": {"endpoint_url": endpoint}, "key": "testing", "secret": "testing"}
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
    try:
        fs.mkdir(BUCKET)
    except FileExistsError:  # moto keeps one backend per process: a second server shares it
        pass
    mp.setenv("AWS_ENDPOINT_URL", endpoint)  # spawned children and CLI subprocesses find it too
    yield options
    server.stop()
    mp.undo()


@pytest.fixture
def s3_root(s3_server):
    """A fresh s3:// prefix in the test bucket (the server is torn down at session end)."""
    return f"s3://{BUCKET}/t-{uuid.uuid4().hex[:10]}"


@pytest.fixture(params=["local", "memory", "s3"])
def store_root(request, tmp_path, memory_root):
    """(store, root key) of an empty directory in each store."""
    if request.param == "local":
        return LocalStore(), str(tmp_path / "root")
    if request.param == "s3":
        options = request.getfixturevalue("s3_server")
        root = request.getfixturevalue("s3_root")
        return FsspecStore("s3", options), root.split("://", 1)[1]
    return FsspecStore("memory"), "/" + memory_root.split("://", 1)[1]


@pytest.fixture(params=["local", "memory", "s3"])
def where(request, tmp_path, memory_root):
    """A dataset location (local path, memory:// or s3:// URL) that does not exist yet. The
    s3 location needs no storage_options: the session points AWS_ENDPOINT_URL at moto."""
    if request.param == "local":
        return str(tmp_path / "ds")
    if request.param == "s3":
        return f"{request.getfixturevalue('s3_root')}/ds"
    return f"{memory_root}/ds"

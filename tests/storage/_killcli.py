"""Run the lmdata command line (``python _killcli.py VERB ARGS...``) as a job that is stopped
right after its N-th mutating S3 request (env ``KILL_AFTER``; 0: never) by ``KILL_SIGNAL``
(SIGKILL: the whole process group, the job's workers too; SIGINT: the command's process, as
Ctrl-C does). The requests of the command and of its worker processes are counted together
(only those whose key holds ``KILL_MATCH``, if set), in the file ``KILL_COUNT`` (one byte
each), which a run that is not stopped leaves holding the total."""

from __future__ import annotations

import os
import signal
import sys

import s3fs.core
from fsspec.asyn import sync_wrapper

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.storage._faults import MUTATING

AFTER = int(os.environ.get("KILL_AFTER", "0"))
SIGNAL = getattr(signal, os.environ.get("KILL_SIGNAL", "SIGKILL"))
MATCH = os.environ.get("KILL_MATCH", "")  # count only the requests whose key holds this
# the command's process: workers (spawned: they run this module again as __mp_main__) inherit
# its pid through the environment, so a worker's SIGINT reaches the command, not the worker
# itself (workers ignore SIGINT: the job went on and finished)
DRIVER = int(os.environ.setdefault("KILL_DRIVER", str(os.getpid())))
ORIG = s3fs.core.S3FileSystem._call_s3


async def _counted(self, method, *args, **kwargs):
    out = await ORIG(self, method, *args, **kwargs)
    if method in MUTATING and MATCH in kwargs.get("Key", ""):
        fd = os.open(os.environ["KILL_COUNT"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, b"x")
            sent = os.fstat(fd).st_size
        finally:
            os.close(fd)
        if sent == AFTER:
            if SIGNAL == signal.SIGKILL:
                os.killpg(0, signal.SIGKILL)
            os.kill(DRIVER, SIGNAL)
    return out


s3fs.core.S3FileSystem._call_s3 = _counted
s3fs.core.S3FileSystem.call_s3 = sync_wrapper(_counted)


if __name__ == "__main__":
    from lmdata.cli.main import cli

    cli(args=sys.argv[1:], prog_name="lmdata")

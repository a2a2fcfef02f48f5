"""A throwaway PostgreSQL cluster: initdb in a new folder, a free loopback port, removed after.

Used by section 10 (PostgreSQL's own group commit, ``fsync=on``: a durable server, as
the SQLite rows beside it are durable) when ``TOOLKIT_TEST_PG`` names no server, and by
the server-restart test (``fsync=off``: it measures nothing, and stops its own server).
initdb refuses to run as root: as root the cluster belongs to the ``postgres`` account.
"""

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path


def program(name: str) -> str | None:
    """The newest installed PostgreSQL's ``name`` (Debian keeps them off PATH), or PATH's."""
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else shutil.which(name)


@contextlib.contextmanager
def throwaway(fsync: bool, parent: Path | None = None):
    """``(url, pg_ctl)`` of a new cluster under ``parent`` (default: the system temp folder,
    which must be traversable by the cluster's owner); ``pg_ctl("stop", ...)`` runs
    pg_ctl on it. Raises ``FileNotFoundError`` without initdb."""
    initdb = program("initdb")
    if initdb is None:
        raise FileNotFoundError("no initdb: install PostgreSQL's server (Debian: postgresql)")
    root = Path(tempfile.mkdtemp(prefix="toolkit-pg-", dir=parent))
    owner = {}
    if os.getuid() == 0:
        import pwd

        account = pwd.getpwnam("postgres")
        os.chown(root, account.pw_uid, account.pw_gid)
        owner = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}
    try:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        data = root / "data"
        subprocess.run([initdb, "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                        "--no-sync"], check=True, capture_output=True, **owner)
        with open(data / "postgresql.conf", "a") as conf:
            conf.write(f"listen_addresses = '127.0.0.1'\nport = {port}\n"
                       f"unix_socket_directories = '{root}'\n"
                       f"fsync = {'on' if fsync else 'off'}\n")

        def pg_ctl(*args):
            subprocess.run([program("pg_ctl"), "-D", str(data), "-l", str(root / "server.log"),
                            "-w", *args], check=True, capture_output=True, **owner)

        pg_ctl("start")
        try:
            yield f"postgresql://postgres@127.0.0.1:{port}/postgres", pg_ctl
        finally:
            with contextlib.suppress(subprocess.CalledProcessError):
                pg_ctl("stop", "-m", "immediate")
    finally:
        shutil.rmtree(root, ignore_errors=True)

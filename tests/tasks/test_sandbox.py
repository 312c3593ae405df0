"""The code scorer's sandbox: clean runs pass, everything else fails without harm."""

from __future__ import annotations

import os
import textwrap
import uuid

import psutil
import pytest

from relaxspec_audit.tasks.sandbox import Limits, isolation, run_program


def _run(src: str, timeout_s: float = 5.0, **kw):
    return run_program(textwrap.dedent(src), timeout_s=timeout_s, **kw)


def test_clean_program_passes_and_output_is_captured():
    res = _run("print('hello'); assert 1 + 1 == 2")
    assert res.passed and res.returncode == 0 and not res.timed_out
    assert res.stdout.strip() == "hello"


def test_failing_assertion_fails_with_traceback():
    res = _run("assert 1 + 1 == 3, 'arith is broken'")
    assert not res.passed and res.returncode == 1
    assert "AssertionError: arith is broken" in res.stderr


def test_infinite_loop_is_killed_at_the_wall_clock_timeout():
    res = _run("while True:\n    pass\n", timeout_s=1.0)
    assert not res.passed and res.timed_out
    assert res.wall_s < 4.0


def test_sleeping_program_is_killed_at_the_timeout():
    # CPU limits do not catch sleeping; the wall clock must.
    res = _run("import time\ntime.sleep(60)\n", timeout_s=1.0)
    assert res.timed_out and not res.passed and res.wall_s < 4.0


def test_fork_bomb_is_stopped_and_leaves_no_process():
    marker = f"forkbomb-{uuid.uuid4().hex}"
    src = f"""
    import os
    MARK = {marker!r}
    n = 0
    try:
        while n < 200:
            if os.fork() == 0:
                import time
                time.sleep(30)
            n += 1
    finally:
        print("forked", n)
    """
    res = _run(src, timeout_s=5.0)
    assert not res.passed
    assert "forked 0" in res.stdout
    assert "not allowed" in res.stderr
    # No survivor of the run anywhere on the machine.
    leftovers = [
        p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])
    ]
    assert leftovers == []


def test_subprocess_and_system_are_blocked():
    res = _run("import subprocess\nsubprocess.run(['sleep', '30'])\n")
    assert not res.passed and "not allowed" in res.stderr
    res = _run("import os\nos.system('sleep 30')\n")
    assert not res.passed and "not allowed" in res.stderr


def test_ten_gigabyte_allocation_fails_inside_the_limit():
    res = _run("x = bytearray(10 * 1024**3)\nprint('allocated')\n", timeout_s=10.0)
    assert not res.passed and not res.timed_out
    assert "MemoryError" in res.stderr and "allocated" not in res.stdout
    assert res.wall_s < 8.0


def test_growing_list_hits_the_address_space_limit():
    limits = Limits(cpu_s=10, memory_bytes=256 << 20)
    res = _run("x = []\nwhile True:\n    x.append(' ' * 10**6)\n", timeout_s=10.0, limits=limits)
    assert not res.passed and not res.timed_out
    assert "MemoryError" in res.stderr


def test_segfault_scores_zero_without_core_dump():
    res = _run("import ctypes\nctypes.string_at(0)\n")
    assert not res.passed and res.returncode is not None and res.returncode < 0


def test_output_flood_is_capped_by_the_file_size_limit():
    limits = Limits(cpu_s=10, file_bytes=1 << 20)
    res = _run("while True:\n    print('x' * 10000)\n", timeout_s=8.0, limits=limits)
    assert not res.passed and not res.timed_out  # killed by SIGXFSZ, not the clock
    assert len(res.stdout) <= 4096


def test_environment_is_minimal_and_cwd_is_a_fresh_temporary_folder(monkeypatch):
    monkeypatch.setenv("RELAXSPEC_TEST_SECRET", "hunter2")
    src = """
    import os, json
    try:
        with open(f"/proc/{os.getppid()}/environ", "rb") as fh:
            parent = fh.read().decode("latin-1")
    except OSError as exc:
        parent = type(exc).__name__
    print(json.dumps([dict(os.environ), os.getcwd(), parent]))
    """
    res = _run(src)
    assert res.passed
    import json

    env, cwd, parent = json.loads(res.stdout)
    assert "RELAXSPEC_TEST_SECRET" not in env and "hunter2" not in res.stdout
    if isolation().pid_namespace:
        # The parent is outside the namespace: no /proc entry at all (issue 13, item 8;
        # the end-to-end check with a secret in a caller's environ is in
        # test_sandbox_attacks.py).
        assert parent == "FileNotFoundError"
    threads = {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"}  # set to 1
    assert set(env) <= {"PATH", "HOME", "LANG", "TMPDIR", "LC_CTYPE", *threads}
    assert cwd != os.getcwd() and not os.path.exists(cwd)  # deleted afterwards


@pytest.mark.parametrize("limit", ["RLIMIT_CPU", "RLIMIT_AS", "RLIMIT_FSIZE", "RLIMIT_CORE"])
def test_rlimits_are_set_in_the_child(limit):
    res = _run(f"import resource\nprint(resource.getrlimit(resource.{limit})[0])\n")
    value = int(res.stdout)
    expected = {
        "RLIMIT_CPU": 6,  # timeout 5 s + 1
        "RLIMIT_AS": 1 << 30,
        "RLIMIT_FSIZE": 16 << 20,
        "RLIMIT_CORE": 0,
    }[limit]
    assert value == expected


def test_child_sees_only_its_own_processes():
    if not isolation().pid_namespace:
        pytest.skip("unshare is unavailable here: the documented fallback shares /proc")
    res = _run(
        "import os\n"
        "print(os.getpid(), os.getppid(), sorted(p for p in os.listdir('/proc') if p.isdigit()))\n"
    )
    assert res.passed and res.stdout.strip() == "1 0 ['1']"

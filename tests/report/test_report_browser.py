"""The batch's ``index.html`` and a task report open in headless Chromium, offline, cleanly.

Chromium (Debian ``chromium``, ``/usr/bin/chromium``; ``.ci/run`` installs it) is driven
over the DevTools protocol on a pipe (``--remote-debugging-pipe``: no port, no network).
For each page we collect console messages of level error/warning, uncaught exceptions,
log entries (which include "Failed to load resource") and every request the page makes;
then take a screenshot and check that it is not blank. The pages come from the same
batch runs as ``test_notebooks.py`` (fixture runs) and ``test_report_pages.py`` (a
demo-like batch on the embedded pair), each shared once per session. At the report width
(1280 px) no page may scroll sideways.

Chromium missing: the tests skip, except under ``CI=true``, where they fail (CI installs
Chromium through ``.ci/run``; a silent skip there would hide a broken report).
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from test_notebooks import render_all
from test_report_pages import demo_like_batch

from relaxspec_audit.collect.config import EMBEDDED_DIR

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--window-size=1280,1000",
]
#: The report width: no page may be wider than this (document scrollWidth).
WIDTH = 1280
_HAVE_CHROMIUM = Path(CHROMIUM).is_file() or shutil.which("chromium") is not None
_MISSING = f"Chromium not found at {CHROMIUM} (apt-get install -y chromium; .ci/run does it)"


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


@pytest.fixture(autouse=True, scope="module")
def _chromium():
    """Skip without Chromium; under CI=true, fail instead (CI is meant to have it)."""
    if not _HAVE_CHROMIUM:
        if _in_ci():
            pytest.fail(f"CI=true but {_MISSING}")
        pytest.skip(_MISSING)


_LOADED_IMAGES = "Array.from(document.images).filter(i => i.complete && i.naturalWidth > 0).length"


class _Pipe:
    """Minimal DevTools client over --remote-debugging-pipe (fd 3 in, fd 4 out, NUL-framed)."""

    def __init__(self, user_data_dir: Path):
        import fcntl

        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        # Chromium reads commands on fd 3 and writes replies on fd 4. Move the child's ends
        # above 9 first so the dup2 calls below cannot clobber each other.
        child_r = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD, 10)
        child_w = fcntl.fcntl(from_chrome_w, fcntl.F_DUPFD, 10)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        binary = CHROMIUM if Path(CHROMIUM).is_file() else shutil.which("chromium")
        args = [binary, *FLAGS, f"--user-data-dir={user_data_dir}", "--remote-debugging-pipe"]
        self.proc = subprocess.Popen(
            [*args, "about:blank"],
            close_fds=False,  # dup2 in preexec_fn makes 3 and 4 inheritable; keep them
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=lambda: (os.dup2(child_r, 3), os.dup2(child_w, 4)),
        )
        os.close(child_r)
        os.close(child_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict] = []

    def _read_message(self, deadline: float) -> dict:
        import select

        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no message from Chromium")
            ready, _, _ = select.select([self._from_chrome], [], [], left)
            if ready:
                chunk = os.read(self._from_chrome, 1 << 20)
                if not chunk:
                    raise RuntimeError("Chromium closed the pipe")
                self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 30.0) -> dict:  # fmt: skip
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, timeout: float = 30.0) -> dict:
        deadline = time.monotonic() + timeout
        for i, ev in enumerate(self.events):
            if ev.get("method") == method:
                return self.events.pop(i)
        while True:
            ev = self._read_message(deadline)
            if ev.get("method") == method:
                return ev
            self.events.append(ev)

    def drain(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        try:
            while True:
                self.events.append(self._read_message(deadline))
        except TimeoutError:
            pass

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=5)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_chrome)
        os.close(self._from_chrome)


_PROBES = {
    "scroll_width": "document.documentElement.scrollWidth",
    # Diverged tokens the relaxation alone accepted, drawn with a background colour.
    "relax_tokens": "Array.from(document.querySelectorAll('.tok-relax')).filter(e => "
    "getComputedStyle(e).backgroundColor !== 'rgba(0, 0, 0, 0)').length",
}


def open_page(url: str, tmp: Path) -> dict:
    """Load ``url`` offline at the report width; return console problems, requests,
    screenshot pixels, text, loaded images, the page's scroll width and coloured
    ``tok-relax`` tokens."""
    cdp = _Pipe(tmp / "chromium-profile")
    try:
        target = cdp.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = cdp.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        for domain in ("Page", "Runtime", "Log", "Network"):
            cdp.send(f"{domain}.enable", session=session)
        cdp.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": WIDTH, "height": 1000, "deviceScaleFactor": 1, "mobile": False},
            session=session,
        )
        # Offline: any request to the network would fail (and is reported below anyway).
        cdp.send(
            "Network.emulateNetworkConditions",
            {"offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1},
            session=session,
        )
        cdp.events.clear()
        cdp.send("Page.navigate", {"url": url}, session=session)
        cdp.wait_for("Page.loadEventFired")
        cdp.drain(0.5)  # late console messages and failed loads
        shot = cdp.send("Page.captureScreenshot", {"format": "png"}, session=session)
        text = cdp.send(
            "Runtime.evaluate",
            {"expression": "document.body.innerText", "returnByValue": True},
            session=session,
        )["result"]["value"]
        images = cdp.send(
            "Runtime.evaluate",
            {"expression": _LOADED_IMAGES, "returnByValue": True},
            session=session,
        )["result"]["value"]
        probes = {
            name: cdp.send(
                "Runtime.evaluate", {"expression": expr, "returnByValue": True}, session=session
            )["result"]["value"]
            for name, expr in _PROBES.items()
        }
    finally:
        cdp.close()
    problems = []
    requests = []
    for ev in cdp.events:
        method, params = ev.get("method"), ev.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in (
            "error",
            "warning",
            "assert",
        ):
            problems.append(f"console.{params['type']}: {params.get('args')}")
        elif method == "Runtime.exceptionThrown":
            problems.append(f"exception: {params.get('exceptionDetails', {}).get('text')}")
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") in (
            "error",
            "warning",
        ):
            problems.append(f"log: {params['entry'].get('text')} {params['entry'].get('url', '')}")
        elif method == "Network.requestWillBeSent":
            requests.append(params.get("request", {}).get("url", ""))
        elif method == "Network.loadingFailed":
            problems.append(f"failed load: {params.get('errorText')}")
    png = base64.b64decode(shot["data"])
    return {"problems": problems, "requests": requests, "png": png, "text": text,
            "images": images, **probes}  # fmt: skip


def _pixels(png: bytes) -> np.ndarray:
    import matplotlib.image as mpimg

    return mpimg.imread(io.BytesIO(png), format="png")[..., :3]  # [H, W, 3] floats in [0, 1]


def _assert_not_blank(png: bytes, min_ink: float = 0.01) -> None:
    px = _pixels(png)
    assert px.shape[0] > 100 and px.shape[1] > 100
    ink = np.mean(np.abs(px - px[0, 0]).sum(axis=-1) > 0.1)  # share of pixels unlike the corner
    assert ink > min_ink, f"screenshot looks blank: {ink:.4f} of pixels differ from background"
    assert px.std() > 0.02


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    result, _ = render_all(tmp_path_factory)
    return result


@pytest.mark.slow
def test_index_opens_cleanly(pages, tmp_path):
    page = open_page(pages.index.as_uri(), tmp_path)
    assert page["problems"] == []
    # Self-contained: only the page itself (and data: URIs) is loaded.
    assert [u for u in page["requests"] if not u.startswith(("file:", "data:"))] == []
    assert "arith" in page["text"] and "nucleus vs exact" in page["text"]
    _assert_not_blank(page["png"])


@pytest.mark.slow
def test_task_report_opens_cleanly(pages, tmp_path):
    signoff = pages.report_dir / "arith" / "signoff.html"
    page = open_page(signoff.as_uri(), tmp_path)
    assert page["problems"] == []
    assert [u for u in page["requests"] if not u.startswith(("file:", "data:"))] == []
    assert "Sign-off" in page["text"] and "asd vs greedy" in page["text"]
    assert page["images"] >= 1  # the frontier figure decoded and rendered
    _assert_not_blank(page["png"])


@pytest.fixture(scope="module")
def demo_pages(tmp_path_factory):
    if not (EMBEDDED_DIR / "target" / "config.json").exists():
        pytest.skip(f"embedded pair not built ({EMBEDDED_DIR} missing; `make models`)")
    return demo_like_batch(tmp_path_factory)


def _clean(page: dict) -> None:
    assert page["problems"] == []
    assert [u for u in page["requests"] if not u.startswith(("file:", "data:"))] == []
    _assert_not_blank(page["png"])
    assert page["scroll_width"] <= WIDTH, f"page is {page['scroll_width']} px wide"


@pytest.mark.slow
def test_demo_index_fits_the_report_width(demo_pages, tmp_path):
    page = open_page(demo_pages.index.as_uri(), tmp_path)
    _clean(page)
    assert "arith" in page["text"] and "story" in page["text"] and "δ = 10 pt" in page["text"]


@pytest.mark.slow
def test_demo_signoff_fits_the_report_width(demo_pages, tmp_path):
    page = open_page((demo_pages.report_dir / "arith" / "signoff.html").as_uri(), tmp_path)
    _clean(page)
    assert "Sign-off" in page["text"] and page["images"] >= 1


@pytest.mark.slow
def test_story_divergence_page_colours_a_diverged_request(demo_pages, tmp_path):
    # ASD on `story` at temperature 0 diverges from greedy on most requests.
    divergence = demo_pages.report_dir / "story" / "divergence-asd.html"
    page = open_page(divergence.as_uri(), tmp_path)
    _clean(page)
    assert page["relax_tokens"] >= 1


@pytest.mark.slow
def test_overflow_probe_catches_a_wide_page(tmp_path):
    """The width check can fail: a page with an unwrapped 3000 px table is caught."""
    wide = tmp_path / "wide.html"
    wide.write_text(
        "<!DOCTYPE html><html><head><link rel='icon' href='data:,'></head><body>"
        "<table><tr><td style='min-width:3000px'>wide</td></tr></table></body></html>"
    )
    assert open_page(wide.as_uri(), tmp_path)["scroll_width"] > WIDTH


def test_detector_catches_console_errors_and_blank_pages(tmp_path):
    """The checks above can fail: a page with a console error, a CDN script, and nothing."""
    bad = tmp_path / "bad.html"
    bad.write_text(
        "<!DOCTYPE html><html><head><link rel='icon' href='data:,'>"
        "<script>console.error('boom')</script>"
        "<script src='https://cdn.example.com/lib.js'></script></head><body></body></html>"
    )
    page = open_page(bad.as_uri(), tmp_path)
    assert any("boom" in p for p in page["problems"])
    assert any("cdn.example.com" in u for u in page["requests"])
    with pytest.raises(AssertionError, match="blank"):
        _assert_not_blank(page["png"])

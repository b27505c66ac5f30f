"""Headless Chromium (Debian's ``chromium``) driven over the DevTools protocol on a pipe
(``--remote-debugging-pipe``: commands on fd 3, answers on fd 4, NUL-separated JSON), so a test
can keep one page open and read it again as it changes — no WebDriver, no websocket library.

    with Chromium(tmp_path / "profile") as browser:
        browser.navigate("http://127.0.0.1:8000/status")
        browser.evaluate("document.title")
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

BINARY = "chromium"


class Chromium:
    def __init__(self, profile: Path, *, timeout_s: float = 30.0) -> None:
        path = shutil.which(BINARY)
        if path is None:
            raise RuntimeError(f"{BINARY} is not installed (Debian: apt-get install chromium; make system-deps)")
        profile.mkdir(parents=True, exist_ok=True)
        self.timeout_s = timeout_s
        cmd_r, self._cmd_w = os.pipe()
        self._out_r, out_w = os.pipe()
        # The browser expects the pipe on fds 3 and 4 exactly: let a shell put them there.
        argv = [path, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--remote-debugging-pipe",
                f"--user-data-dir={profile}", "about:blank"]
        closes = " ".join(f"{fd}>&-" for fd in (cmd_r, out_w) if fd not in (3, 4))
        shell = f'exec "$@" 3<&{cmd_r} 4>&{out_w} {closes}'
        # Chromium leaves its singleton socket's folder (org.chromium.*) in TMPDIR: give it one of
        # its own, removed on close (short: a socket's path has a limit the profile's can pass).
        self._tmp = tempfile.mkdtemp(prefix="ordq-chromium-")
        env = {**os.environ, "TMPDIR": self._tmp}
        with (profile / "chromium.log").open("wb") as log:
            self.proc = subprocess.Popen(["bash", "-c", shell, "chromium", *argv], pass_fds=(cmd_r, out_w),
                                         stdout=subprocess.DEVNULL, stderr=log, env=env)
        os.close(cmd_r)
        os.close(out_w)
        self._buf = b""
        self._next_id = 0
        self._session: str | None = None
        try:
            targets = self.call("Target.getTargets")["targetInfos"]
            page = next(t for t in targets if t["type"] == "page")
            self._session = self.call("Target.attachToTarget", targetId=page["targetId"], flatten=True)["sessionId"]
            self.call("Runtime.enable")
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        for fd in (self._cmd_w, self._out_r):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self._tmp, ignore_errors=True)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one command (to the attached page, once attached) and return its result."""
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if self._session is not None:
            msg["sessionId"] = self._session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout_s
        while True:
            for answer in self._read(deadline):
                if answer.get("id") == self._next_id:
                    if "error" in answer:
                        raise RuntimeError(f"{method}: {answer['error']}")
                    return dict(answer.get("result", {}))

    def _read(self, deadline: float) -> list[dict[str, Any]]:
        left = deadline - time.monotonic()
        if left <= 0 or self.proc.poll() is not None:
            raise TimeoutError(f"chromium did not answer (exit code {self.proc.poll()})")
        ready, _, _ = select.select([self._out_r], [], [], left)
        if not ready:
            return []
        chunk = os.read(self._out_r, 1 << 20)
        if not chunk:
            raise EOFError("chromium closed its DevTools pipe")
        self._buf += chunk
        *messages, self._buf = self._buf.split(b"\0")
        return [json.loads(m) for m in messages if m]

    def navigate(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (None when it threw)."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            return None
        return result.get("result", {}).get("value")

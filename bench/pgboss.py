"""pg-boss (Node.js) as a peer of the cold-start scenarios: bench/pgboss/driver.js in a process
of its own per cell, on a fresh database of the same server.

pg-boss 10.4.2 is pinned (bench/pgboss/package.json and package-lock.json): the last release
whose ``engines`` accepts Node 20, the Node of this machine (pg-boss 11 and later need Node 22).
Its modules are installed into bench/pgboss/node_modules (git-ignored) with ``npm ci`` the first
time they are needed. When node or the install is missing, :func:`unavailable` says why and the
scenarios print "pg-boss unavailable: <why>" instead of a row.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

DIRECTORY = Path(__file__).resolve().parent / "pgboss"
NODE_MAJOR = 20
INSTALL_TIMEOUT = 300.0
_checked: list[str | None] = []


def _install() -> str | None:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None:
        return "node is not installed"
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=False)
    try:
        major = int(version.stdout.strip().lstrip("v").split(".")[0])
    except ValueError:
        return f"node --version said {version.stdout.strip()!r}"
    if major < NODE_MAJOR:
        return f"node {version.stdout.strip()} is older than the {NODE_MAJOR} pg-boss 10 needs"
    if (DIRECTORY / "node_modules" / "pg-boss" / "package.json").exists():
        return None
    if npm is None:
        return "npm is not installed (needed once, to install pg-boss into bench/pgboss)"
    try:
        done = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--prefer-offline"],
                              cwd=DIRECTORY, capture_output=True, text=True, check=False,
                              timeout=INSTALL_TIMEOUT)
    except subprocess.TimeoutExpired:
        return f"npm ci in {DIRECTORY} took more than {INSTALL_TIMEOUT:.0f} s"
    if done.returncode != 0:
        return f"npm ci in {DIRECTORY} failed: {(done.stderr or done.stdout).strip()[-300:]}"
    return None


def unavailable() -> str | None:
    """Why pg-boss cannot run here (checked, and installed if need be, once), else None."""
    if not _checked:
        _checked.append(_install())
    return _checked[0]


async def run(dsn: str, *, mode: str, seconds: float, concurrency: int, rate: float = 0.0,
              depth: int = 0, drain: float = 30.0, batch: int = 1,
              ready: asyncio.Event | None = None) -> dict[str, Any]:
    """One cell: the driver's result (``sent``, ``acked`` and ``started`` as [n, seconds since
    the producer's start]); ``ready`` is set when the producer starts."""
    config = json.dumps({"dsn": dsn, "mode": mode, "seconds": seconds,
                         "concurrency": concurrency, "rate": rate, "depth": depth,
                         "drain": drain, "batch": batch})
    proc = await asyncio.create_subprocess_exec(
        "node", str(DIRECTORY / "driver.js"), config, cwd=DIRECTORY,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, limit=2**26)
    assert proc.stdout is not None
    assert proc.stderr is not None
    errors_read = asyncio.create_task(proc.stderr.read())
    result: dict[str, Any] | None = None
    async for line in proc.stdout:
        text = line.decode().strip()
        if text == "ready":
            if ready is not None:
                ready.set()
        elif text.startswith("{"):
            result = json.loads(text)
    errors = (await errors_read).decode()
    if await proc.wait() != 0 or result is None:
        raise RuntimeError(f"the pg-boss driver failed (exit {proc.returncode}): "
                           f"{errors.strip()[-1000:]}")
    return result

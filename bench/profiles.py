"""py-spy profiles of a process under load: recorded as raw collapsed stacks of the GIL's
holder (Python CPU), and read back as the frames that took it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

PY_SPY = Path(sys.executable).with_name("py-spy")


def start_spy(pid: int, out: Path) -> subprocess.Popen[bytes]:
    """py-spy recording `pid` (raw collapsed stacks of the GIL's holder: Python CPU) into `out`,
    attached by the time it returns; SIGINT ends it and writes the file."""
    if not PY_SPY.exists():
        raise SystemExit(f"{PY_SPY} is missing: profiles need the bench extra "
                         "(make .venv/.installed-bench)")
    rate = os.environ.get("BENCH_SPY_RATE", "200")
    process = subprocess.Popen([str(PY_SPY), "record", "-p", str(pid), "-f", "raw", "-r", rate,
                                "--gil", "-o", str(out)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # attached before the load starts
    return process


@contextlib.contextmanager
def profiled(pid: int, out: Path | None) -> Iterator[None]:
    """py-spy (sampling, collapsed stacks) on `pid` for the block; nothing when out is None."""
    if out is None:
        yield
        return
    recording = start_spy(pid, out)
    try:
        yield
    finally:
        recording.send_signal(signal.SIGINT)
        recording.wait(60)


def top_frames(raw: Path, n: int = 12) -> list[tuple[str, float, float]]:
    """(frame, self %, inclusive %) of a py-spy raw profile (`--gil`: samples of the thread
    holding the GIL, i.e. Python CPU), by self time."""
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        k = int(count)
        total += k
        frames = stack.split(";")
        own[frames[-1]] += k
        for f in set(frames):
            incl[f] += k
    return [(f, 100 * k / total, 100 * incl[f] / total) for f, k in own.most_common(n)]

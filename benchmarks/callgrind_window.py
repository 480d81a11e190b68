"""A window of a server's instructions, counted by callgrind.

The server runs under `valgrind --tool=callgrind --instr-atstart=no`; `control` zeroes the
count and switches counting on and off around the work to measure, and `dumped_total` reads
what was counted since the last zero. Used by `token_instructions.py` and
`turn_instructions.py`. Benchmark-only: nothing here is part of the library.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path


def control(pid: int, *flags: str) -> None:
    """`callgrind_control FLAGS PID` (`--zero`, `-i on`, `-i off`, `--dump`)."""
    subprocess.run(
        ["callgrind_control", *flags, str(pid)],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def dumped_total(work: Path, pid: int) -> int:
    """Instructions counted since the last zero: dumps them into `work` (the server's
    `--callgrind-out-file` directory), then reads the newest dump's total."""
    before = set(work.glob("callgrind.out*"))
    control(pid, "--dump")
    deadline = time.time() + 120
    while time.time() < deadline:
        new = set(work.glob("callgrind.out*")) - before
        if new:
            time.sleep(1)  # (the dump is written after the command returns)
            text = max(new, key=lambda p: p.stat().st_mtime).read_text(errors="replace")
            match = re.search(r"^totals: (\d+)", text, re.M)
            if match:
                return int(match.group(1))
        time.sleep(0.5)
    raise RuntimeError("no dump")

"""Running a benchmark script the way a user does, on a tiny workload, for its tests."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def run_benchmark(
    script: str, *arguments: str, env: Mapping[str, str] | None = None, timeout: float = 300
) -> Any:
    """The JSON document `benchmarks/{script}` prints with `arguments` (it must exit 0)."""
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *arguments],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
        env=env,
    )
    return json.loads(done.stdout)

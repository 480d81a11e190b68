"""Instructions a streamed token costs the real server (callgrind): steadier than CPU time.

    python benchmarks/token_instructions.py [--runs 5] [--tokens 200] [--tokens-per-s 10]
        [--fast] [--checkout PATH]

CPU time a token moves with the machine's load (a server short of CPU handles more tokens a turn
of its loop, and each costs less), so two versions are compared here by instructions (they move
too when the machine is busy enough that frames queue up: alternate the two). The server
(`inflight.py --serve`: one uvicorn process, asyncio + h11, `--fast` for uvloop + httptools) runs
under `valgrind --tool=callgrind` with its counting off; the fake model (`inflight.py --fake`) and
the clients are plain processes. After a warm-up two windows are counted (`callgrind_control -i
on/off`): `--runs` runs at once of a 3-token answer, then as many of `--tokens` tokens. One more
token costs (B - A) / (runs x (tokens - 3)) user-space instructions: the runs' own start and end
cancel out, and the kernel's work (the sockets) is not counted. `--checkout` measures another
checkout's code (its `benchmarks/inflight.py` and package) with this script. The model paces
`--tokens-per-s` a run, slow enough for the server under callgrind to keep up. Prints one line.
"""

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--checkout", default=str(Path(__file__).resolve().parent.parent))
parser.add_argument("--runs", type=int, default=5)
parser.add_argument("--tokens", type=int, default=200)
parser.add_argument("--tokens-per-s", type=float, default=10.0)
parser.add_argument("--fast", action="store_true")
args = parser.parse_args()

root = Path(args.checkout)
bench = root / "benchmarks"
sys.path.insert(0, str(bench))
sys.path.insert(0, str(root))
import callgrind_window  # noqa: E402
import inflight  # noqa: E402

work = Path(tempfile.mkdtemp(prefix="token-instructions-"))
model_port, port = inflight.free_port(), inflight.free_port()
env = inflight.environment({})
model = subprocess.Popen(
    [
        sys.executable,
        str(bench / "inflight.py"),
        "--fake",
        str(model_port),
        str(args.tokens_per_s),
        str(args.tokens / args.tokens_per_s),
        "text",
    ],
    env=env,
    stdout=subprocess.DEVNULL,
)
out = work / "callgrind.out"
(work / "ws").mkdir()
server_env = inflight.environment(
    {
        "ATMOSPHERE_WORKSPACE_ROOT": str(work / "ws"),
        "ATMOSPHERE_AI_CONVERSATION_IDLE_TIMEOUT": "0",
        "ATMOSPHERE_DURABLE_RUNS_ENABLED": "false",
        "LLM_RUNTIME": "openai",
        "LLM_MODEL": "fake",
        "LLM_BASE_URL": f"http://127.0.0.1:{model_port}/v1",
        "LLM_API_KEY": "unused",
    }
)
server = subprocess.Popen(
    [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={out}",
        sys.executable,
        str(bench / "inflight.py"),
        "--serve",
        str(port),
        "1",
        "fast" if args.fast else "plain",
    ],
    env=server_env,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
)


async def runs(message: str, n: int) -> None:
    loop = asyncio.get_running_loop()
    done = []
    for _ in range(n):
        future = loop.create_future()
        data = inflight.request_bytes(port, inflight.PATH, message, f"run-{uuid.uuid4().hex[:12]}")
        await loop.create_connection(
            lambda d=data, f=future: inflight.Stream(d, f), "127.0.0.1", port
        )
        done.append(future)
    outcomes = await asyncio.gather(*(asyncio.wait_for(f, 600) for f in done))
    assert all(o == "complete" for o in outcomes), outcomes


def control(*flags: str) -> None:
    callgrind_window.control(server.pid, *flags)


try:
    inflight.wait_for_port(model_port, model)
    inflight.wait_for_port(port, server, timeout=600)
    asyncio.run(runs("short warm-up", 3))
    asyncio.run(runs("stream please", 2))
    figures = {}
    for name, message in (("short", "short please"), ("long", "stream please")):
        control("--zero")
        control("-i", "on")
        started = time.time()
        asyncio.run(runs(message, args.runs))
        control("-i", "off")
        figures[name] = callgrind_window.dumped_total(work, server.pid)
        figures[name + "_s"] = round(time.time() - started, 1)
    per_token = (figures["long"] - figures["short"]) / (args.runs * (args.tokens - 3))
    print(
        f"{root} runs {args.runs} tokens {args.tokens}: short {figures['short']:,} "
        f"long {figures['long']:,} -> {per_token:,.0f} instructions a token "
        f"(windows {figures['short_s']} s, {figures['long_s']} s)"
    )
finally:
    server.terminate()
    model.terminate()
    server.wait(60)
    model.wait(60)
    shutil.rmtree(work, ignore_errors=True)

"""`python -m samples.coding_agent`: serve the sample and print where to reach it."""

from __future__ import annotations

import os
from pathlib import Path

import uvicorn


def main() -> None:
    host = os.environ.get("HOST", "127.0.0.1")
    port = int(os.environ.get("PORT", "8001"))
    workspace = Path(os.environ.setdefault("ATMOSPHERE_WORKSPACE_ROOT", ".workspace")).resolve()
    # A durable `memory/` slice shared by every conversation, beside the per-conversation scratch.
    os.environ.setdefault("ATMOSPHERE_AI_FILESYSTEM_ROUTES", f"memory/={workspace / 'memory'}")
    from .app import app

    base = f"http://{host}:{port}"
    print(
        "\n".join(
            [
                "",
                "atmosphere-harness coding agent",
                f"  prompt:       POST {base}/atmosphere/agent/coder",
                f"  runtime info: GET  {base}/api/console/info",
                f"  files:        {workspace}/agents/coder/files/<conversationId>/",
                f"  memory route: {os.environ['ATMOSPHERE_AI_FILESYSTEM_ROUTES']}",
                "",
                f"  try: curl -N -X POST {base}/atmosphere/agent/coder "
                "-H 'content-type: application/json' "
                '-d \'{"message": "fix the calculator"}\'',
                "",
            ]
        ),
        flush=True,
    )
    uvicorn.run(app, host=host, port=port, log_level="info", timeout_graceful_shutdown=5)


if __name__ == "__main__":
    main()

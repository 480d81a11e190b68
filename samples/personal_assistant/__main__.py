"""`python -m samples.personal_assistant`: serve the sample and print where to reach it."""

from __future__ import annotations

import os

import uvicorn

from .app import app


def main() -> None:
    host = os.environ.get("HOST", "127.0.0.1")
    port = int(os.environ.get("PORT", "8000"))
    base = f"http://{host}:{port}"
    print(
        "\n".join(
            [
                "",
                "atmosphere-harness personal assistant",
                f"  prompt:       POST {base}/atmosphere/agent/assistant",
                f"  runtime info: GET  {base}/api/console/info",
                f"  API docs:          {base}/docs",
                "",
                "  try: curl -N -X POST "
                f"{base}/atmosphere/agent/assistant -H 'content-type: application/json' "
                '-d \'{"message": "plan a short task and save the result to a file"}\'',
                "",
            ]
        ),
        flush=True,
    )
    uvicorn.run(app, host=host, port=port, log_level="info", timeout_graceful_shutdown=5)


if __name__ == "__main__":
    main()

"""`python -m samples.personal_assistant`: serve the sample and print where to reach it."""

from __future__ import annotations

import os
import secrets

import uvicorn

from .app import app


def main() -> None:
    host = os.environ.get("HOST", "127.0.0.1")
    port = int(os.environ.get("PORT", "8000"))
    base = f"http://{host}:{port}"
    # The console's Workspace tab reads the admin API, which needs a token: make one for this
    # run unless the environment already sets it (the app reads it when it starts, below).
    token = os.environ.get("ATMOSPHERE_ADMIN_TOKEN") or secrets.token_urlsafe(24)
    os.environ["ATMOSPHERE_ADMIN_TOKEN"] = token
    print(
        "\n".join(
            [
                "",
                "atmosphere-harness personal assistant",
                f"  console:      {base}/atmosphere/console/#token={token}",
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

"""The agent the peer servers (Aegra, `langgraph dev`) serve in `servers.py` and `inflight.py`.

A LangGraph ReAct agent (`create_react_agent`) on `ChatOpenAI` pointed at the benchmarks' fake
OpenAI-compatible model (`FAKE_MODEL_URL`), streaming, with one tool, `ls`, that answers at once:
the same model, the same answers and the same one tool call as our side's `@agent`, so both
servers do the same work per run. It runs in the peers' own environments (Python >= 3.12).
"""

import os

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent


@tool
def ls(path: str = "/") -> str:
    """List the files under a directory of the workspace."""
    return "[]"


model = ChatOpenAI(
    model="fake",
    base_url=os.environ.get("FAKE_MODEL_URL", "http://127.0.0.1:9/v1"),
    api_key="unused",
    streaming=True,
    max_retries=0,
)
graph = create_react_agent(model, [ls])

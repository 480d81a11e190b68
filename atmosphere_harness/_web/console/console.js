// atmosphere-harness console: plain JavaScript, no build step, no third-party code.
// It talks only to this app: /api/console/info, the admin API and each endpoint's routes
// (a prompt streams from POST P; Stop is POST P/runs/{runId}/cancel; the sidebar lists
// GET P/conversations and deletes with DELETE P/conversations/{id}).
// Every value from the server is written with textContent, never parsed as HTML.
"use strict";

(() => {
  const TOKEN_KEY = "atmosphere-admin-token";
  const ENDPOINT_KEY = "atmosphere-console-endpoint";
  const AUTH_HEADER = "X-Atmosphere-Auth";
  const BASE = new URL("../../", window.location.href);
  const OFFLOAD = /Full output saved to (\S+?) —/;

  const state = {
    token: null,
    info: null,
    endpoint: null,
    conversation: "",
    run: null,
    spoke: null,
    listCursor: null,
    listLoads: 0,
    busy: false,
    bubble: null,
    tools: new Map(),
    subagents: new Map(),
    planEvents: null,
    filesPath: "",
    owners: [],
  };

  const $ = (selector) => document.querySelector(selector);

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key === "class") node.className = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  // --- ids, urls and the admin token -------------------------------------------------------

  function newId() {
    // A v4 UUID from getRandomValues (randomUUID needs a secure context; this does not).
    const bytes = crypto.getRandomValues(new Uint8Array(16));
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    const hex = Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
    return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
  }

  function url(path, params) {
    const target = new URL(path.replace(/^\//, ""), BASE);
    for (const [key, value] of Object.entries(params || {})) {
      if (value !== undefined && value !== null && value !== "") target.searchParams.set(key, value);
    }
    return target;
  }

  function readToken() {
    const fragment = new URLSearchParams(window.location.hash.slice(1));
    const given = fragment.get("token");
    if (given) {
      sessionStorage.setItem(TOKEN_KEY, given);
      // Keep the token out of the address bar, the history and screenshots.
      history.replaceState(null, "", window.location.pathname + window.location.search);
    }
    return sessionStorage.getItem(TOKEN_KEY);
  }

  async function getJson(path, params, admin) {
    const headers = { Accept: "application/json" };
    if (admin && state.token) headers[AUTH_HEADER] = state.token;
    const response = await fetch(url(path, params), { headers });
    let body = null;
    try {
      body = await response.json();
    } catch (_) {
      body = null;
    }
    return { status: response.status, body };
  }

  function errorText(result) {
    const body = result.body || {};
    return body.error || (typeof body.detail === "string" ? body.detail : `HTTP ${result.status}`);
  }

  // --- tabs and status ---------------------------------------------------------------------

  function showTab(name) {
    for (const tab of document.querySelectorAll("[role=tab]")) {
      tab.setAttribute("aria-selected", String(tab.dataset.tab === name));
    }
    for (const panel of document.querySelectorAll(".tab")) panel.hidden = panel.id !== `tab-${name}`;
    if (name === "workspace") refreshWorkspace();
  }

  function setStatus(kind, text, title) {
    const status = $("#status");
    status.dataset.state = kind;
    status.textContent = text;
    status.title = title || "";
  }

  // The badge tells the truth before the first message too: the server answered the info
  // endpoint ("ready"; each message streams its run: "streaming") or it did not.
  async function probe() {
    try {
      const result = await getJson("/api/console/info");
      if (result.status === 200) {
        setStatus("ready", "ready", "The server answers; each message streams its run.");
        return result.body;
      }
      setStatus("failed", `console info: HTTP ${result.status}`);
    } catch (error) {
      setStatus("failed", "server unreachable");
    }
    return null;
  }

  // --- endpoints and conversations ---------------------------------------------------------

  function selectEndpoint(path) {
    state.endpoint = state.info.endpoints.find((endpoint) => endpoint.path === path) || null;
    if (state.endpoint) sessionStorage.setItem(ENDPOINT_KEY, path);
    newConversation();
    loadConversations(false);
  }

  function newConversation() {
    setConversation(newId());
    clearTranscript(el("p", { class: "hint" }, "A new conversation: nothing said yet."));
    renderSuggestions();
  }

  // A conversation typed into the header box: the chat follows it, and its earlier turns are
  // read from the history route (GET P/conversations/{id}/messages, page after page up to
  // HISTORY_PAGES) and drawn as the live frames would have drawn them.
  const HISTORY_PAGE = 100;
  const HISTORY_PAGES = 20;

  async function openConversation(id) {
    setConversation(id);
    const hint = el("p", { class: "hint", id: "history-hint" }, "Loading earlier turns of ", el("code", {}, id), "…");
    clearTranscript(hint);
    renderSuggestions();
    $("#suggestions").open = false;
    if (!state.endpoint) return;
    const messages = [];
    let cursor = null;
    let failure = null;
    for (let page = 0; page < HISTORY_PAGES; page++) {
      const result = await getJson(`${state.endpoint.path}/conversations/${encodeURIComponent(id)}/messages`, {
        limit: HISTORY_PAGE,
        cursor,
      });
      if (state.conversation !== id) return; // switched again while it loaded
      if (result.status === 404) break; // nobody's yet (or another user's): a new conversation
      if (result.status !== 200) {
        failure = errorText(result);
        break;
      }
      messages.push(...result.body.messages);
      cursor = result.body.nextCursor;
      if (!cursor) break;
    }
    if (failure) {
      hint.replaceChildren(`Earlier turns of `, el("code", {}, id), ` could not be read: ${failure}`);
    } else if (messages.length === 0) {
      hint.replaceChildren("Nothing said yet in ", el("code", {}, id), ": the next message starts it.");
    } else {
      hint.replaceChildren(
        `Earlier turns of `,
        el("code", {}, id),
        cursor ? ` (the first ${messages.length} messages):` : ":",
      );
      drawHistory(messages);
    }
  }

  function drawHistory(messages) {
    for (const message of messages) {
      if (message.role === "user") {
        addBubble("user", message.content);
      } else if (message.role === "assistant") {
        if (message.content) addBubble("assistant", message.content);
        for (const call of message.toolCalls || []) {
          toolStarted({ tool: call.name, toolCallId: call.id, arguments: call.arguments });
        }
      } else if (message.role === "tool") {
        toolFinished({ tool: "tool", toolCallId: message.toolCallId, result: message.content });
      }
    }
    state.bubble = null;
    scrollTranscript();
  }

  function clearTranscript(first) {
    $("#transcript").replaceChildren(first);
    state.tools.clear();
    state.subagents.clear();
    state.bubble = null;
  }

  // --- the conversation list (the sidebar) ------------------------------------------------

  // GET P/conversations: the caller's conversations, newest first, a page at a time ("More"
  // follows nextCursor). Each opens on a click and has a delete control behind a confirmation.
  // A reload (after a prompt: its conversation moves to the top, or joins the list) asks for
  // one more than are shown, so the entries loaded with "More" stay.
  const LIST_PAGE = 20;
  const CONVERSATION_ITEMS = "#conversations li[data-conversation-id]";
  const LIST_MAX = 100;

  async function loadConversations(more) {
    if (!state.endpoint) return;
    const load = ++state.listLoads;
    const path = state.endpoint.path;
    const shown = document.querySelectorAll(CONVERSATION_ITEMS).length;
    const limit = more ? LIST_PAGE : Math.min(LIST_MAX, Math.max(LIST_PAGE, shown + 1));
    const result = await getJson(`${path}/conversations`, { limit, cursor: more ? state.listCursor : null });
    if (load !== state.listLoads || !state.endpoint || state.endpoint.path !== path) return; // a newer load
    if (result.status !== 200) {
      listNote(`Conversations could not be listed: ${errorText(result)}`);
      return;
    }
    listNote("");
    const list = $("#conversations");
    const items = result.body.conversations.map(conversationItem);
    if (more) list.append(...items);
    else {
      list.replaceChildren(...items);
      list.scrollTop = 0;
    }
    if (!list.querySelector(CONVERSATION_ITEMS)) {
      list.replaceChildren(el("li", { class: "empty" }, "No conversations yet."));
    }
    state.listCursor = result.body.nextCursor;
    $("#conversations-more").hidden = !state.listCursor;
    markCurrent();
  }

  function conversationItem(entry) {
    const id = entry.conversationId;
    const name = entry.title || id;
    return el(
      "li",
      { "data-conversation-id": id },
      el(
        "button",
        { type: "button", class: "open", title: id, onclick: () => id !== state.conversation && openConversation(id) },
        el("span", { class: "title" }, name),
        el("span", { class: "muted when" }, new Date(entry.updatedAt * 1000).toLocaleString()),
      ),
      el("button", { type: "button", class: "delete", title: "Delete", "aria-label": `Delete ${name}`, onclick: () => askDelete(id, name) }, "×"),
    );
  }

  function markCurrent() {
    for (const item of document.querySelectorAll(CONVERSATION_ITEMS)) {
      if (item.dataset.conversationId === state.conversation) item.setAttribute("aria-current", "true");
      else item.removeAttribute("aria-current");
    }
  }

  function listNote(text) {
    const note = $("#conversations-note");
    note.hidden = !text;
    note.textContent = text;
  }

  // Delete asks first, in the page (a <dialog>), then DELETE P/conversations/{id}: 204 removes
  // it from the list (404: it was gone already); any other answer (409 while a run is in flight)
  // is shown and the conversation stays.
  function askDelete(id, name) {
    const dialog = $("#confirm-delete");
    dialog.dataset.conversationId = id;
    $("#confirm-delete-name").textContent = name;
    $("#confirm-delete-note").textContent = "";
    $("#confirm-delete-ok").disabled = false;
    dialog.showModal();
  }

  async function confirmDelete() {
    const dialog = $("#confirm-delete");
    const id = dialog.dataset.conversationId;
    $("#confirm-delete-ok").disabled = true;
    let status = 0;
    let body = null;
    try {
      const response = await fetch(url(`${state.endpoint.path}/conversations/${encodeURIComponent(id)}`), {
        method: "DELETE",
        headers: { Accept: "application/json" },
      });
      status = response.status;
      if (status !== 204) body = await response.json().catch(() => null);
    } catch (error) {
      body = { error: "the server could not be reached" };
    }
    if (status !== 204 && status !== 404) {
      $("#confirm-delete-note").textContent = `Not deleted: ${errorText({ status, body })}`;
      $("#confirm-delete-ok").disabled = false;
      return;
    }
    dialog.close();
    const item = document.querySelector(`#conversations li[data-conversation-id="${CSS.escape(id)}"]`);
    if (item) item.remove();
    if (!document.querySelector(CONVERSATION_ITEMS)) loadConversations(false);
    if (state.conversation === id) {
      if (state.spoke && state.spoke.conversation === id) state.spoke = null; // nothing left to close
      newConversation();
    }
  }

  // --- suggested prompts: open on a new conversation, collapsed under the input after that ---

  const TASK_PROMPT =
    "Use the task tool to spawn a general-purpose subagent to brainstorm three team-building ideas, then give me its report";

  function suggestionsFor(endpoint) {
    const tools = new Set((endpoint && endpoint.tools) || []);
    const prompts = [];
    if (tools.has("write_todos") && tools.has("write_file")) prompts.push("plan a short task and save the result to a file");
    if (tools.has("task")) prompts.push(TASK_PROMPT);
    prompts.push("hello");
    return prompts;
  }

  function renderSuggestions() {
    const prompts = suggestionsFor(state.endpoint);
    const list = $("#suggestion-list");
    list.replaceChildren(
      ...prompts.map((text) =>
        el("button", { type: "button", class: "suggestion", title: text, onclick: () => useSuggestion(text) }, text),
      ),
    );
    const box = $("#suggestions");
    box.hidden = prompts.length === 0;
    box.open = true;
  }

  function useSuggestion(text) {
    if (state.busy) {
      $("#message").value = text;
      $("#message").focus();
      return;
    }
    sendPrompt(text);
  }

  function setConversation(id) {
    leaveConversation();
    state.conversation = id;
    $("#conversation").value = id;
    // The chat header names the conversation the next message goes to. Run controls (a Stop
    // button) belong in #chat-actions next to it.
    $("#chat-conversation").textContent = id;
    state.filesPath = "";
    renderPlan($("#plan-live"), null, "No plan yet in this conversation.");
    $("#plan-stored").replaceChildren(el("p", { class: "empty" }, "Nothing loaded."));
    viewerHint(NO_FILE_SELECTED);
    watchPlan();
    markCurrent();
    if (!$("#tab-workspace").hidden) refreshWorkspace();
  }

  // A conversation this console prompted in is closed when the chat leaves it (and when the
  // page goes), so long-term memory extracts its facts; one whose run still streams is left open.
  function leaveConversation(keepalive) {
    const spoke = state.spoke;
    if (!spoke || (state.run && state.run.conversation === spoke.conversation)) return;
    state.spoke = null;
    fetch(url(`${spoke.path}/conversations/${encodeURIComponent(spoke.conversation)}/close`), {
      method: "POST",
      keepalive: Boolean(keepalive),
    }).catch(() => {});
  }

  // --- a run: the streamed POST P, and Stop -------------------------------------------------

  // The frames of a `text/event-stream` body, one `data:` payload (a JSON frame) at a time.
  async function readFrames(response, each) {
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      let end;
      while ((end = buffer.search(/\r?\n\r?\n/)) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end).replace(/^\r?\n\r?\n/, "");
        const data = block
          .split(/\r?\n/)
          .filter((line) => line.startsWith("data:"))
          .map((line) => line.slice(line.startsWith("data: ") ? 6 : 5));
        if (data.length) each(JSON.parse(data.join("\n")));
      }
    }
  }

  async function sendPrompt(text) {
    if (!state.endpoint || state.busy) return;
    const message = text.trim();
    if (!message) return;
    addBubble("user", message);
    $("#suggestions").open = false;
    const run = { id: null, path: state.endpoint.path, conversation: state.conversation };
    state.run = run;
    state.busy = true;
    $("#send").disabled = true;
    setStatus("connecting", "sending…");
    let response;
    try {
      response = await fetch(url(run.path), {
        method: "POST",
        headers: { "Content-Type": "application/json", Accept: "text/event-stream" },
        body: JSON.stringify({ message, conversationId: run.conversation }),
      });
    } catch (error) {
      finishRun("The server could not be reached.", true);
      probe();
      return;
    }
    if (!response.ok) {
      let body = null;
      try {
        body = await response.json();
      } catch (_) {
        body = null;
      }
      finishRun(`Error: ${errorText({ status: response.status, body })}`, true);
      setStatus("ready", "ready");
      return;
    }
    run.id = response.headers.get("X-Run-Id");
    state.spoke = { path: run.path, conversation: run.conversation };
    setStatus("live", "streaming", `run ${run.id}`);
    showStop(run);
    loadConversations(false); // the conversation's last prompt is now: it moves to the top
    try {
      await readFrames(response, onFrame);
    } catch (error) {
      console.warn("the stream broke", error);
    }
    if (state.run === run) finishRun("The connection closed before the run ended.", true);
  }

  // Stop: POST P/runs/{runId}/cancel with the id the stream's X-Run-Id header gave. The stream
  // then ends with its RunCancelled error frame, which frees the composer.
  function showStop(run) {
    const stop = $("#stop");
    stop.hidden = !run.id;
    stop.disabled = false;
    stop.textContent = "Stop";
  }

  async function stopRun() {
    const run = state.run;
    if (!run || !run.id) return;
    const stop = $("#stop");
    stop.disabled = true;
    stop.textContent = "Stopping…";
    let result;
    try {
      const response = await fetch(url(`${run.path}/runs/${encodeURIComponent(run.id)}/cancel`), {
        method: "POST",
        headers: { Accept: "application/json" },
      });
      let body = null;
      try {
        body = await response.json();
      } catch (_) {
        body = null;
      }
      result = { status: response.status, body };
    } catch (error) {
      result = { status: 0, body: { error: "the server could not be reached" } };
    }
    if (result.status !== 202 && state.run === run) {
      $("#transcript").append(el("p", { class: "run-end failed" }, `Stop failed: ${errorText(result)}`));
      showStop(run);
    }
  }

  function finishRun(note, failed) {
    state.busy = false;
    state.bubble = null;
    state.run = null;
    $("#send").disabled = false;
    $("#stop").hidden = true;
    if ($("#status").dataset.state === "live") setStatus("ready", "ready");
    if (note) $("#transcript").append(el("p", { class: failed ? "run-end failed" : "run-end" }, note));
    scrollTranscript();
    refreshWorkspace();
  }

  // --- frames ------------------------------------------------------------------------------

  function onFrame(frame) {
    const data = frame.data || {};
    if (frame.conversationId && frame.conversationId !== state.conversation) {
      // A run of the conversation the chat has left (the box was switched while it ran): it is
      // not drawn into the one now shown; its end frees the composer.
      if (frame.event === "complete" || frame.event === "error") finishRun(null, false);
      return;
    }
    switch (frame.event) {
      case "text":
        appendText(data.text || "");
        break;
      case "tool-start":
        state.bubble = null;
        toolStarted(data);
        break;
      case "tool-result":
        toolFinished(data);
        break;
      case "plan-update":
        planUpdated(data);
        break;
      case "approval-required":
        approvalRequired(data);
        break;
      case "subagent-start":
        subagentStarted(data);
        break;
      case "subagent-end":
        subagentEnded(data);
        break;
      case "complete":
        finishRun(usageNote(data.usage), false);
        return;
      case "error":
        if (data.type === "RunCancelled") finishRun("Stopped.", false);
        else finishRun(`Error: ${data.message || "the run failed"}`, true);
        return;
      default:
        $("#transcript").append(card("event", frame.event, el("pre", {}, pretty(data))));
    }
    scrollTranscript();
  }

  function usageNote(usage) {
    if (!usage) return "Done.";
    return `Done · ${usage.inputTokens || 0} tokens in, ${usage.outputTokens || 0} out`;
  }

  function scrollTranscript() {
    const transcript = $("#transcript");
    transcript.scrollTop = transcript.scrollHeight;
  }

  function addBubble(role, text) {
    const bubble = el("div", { class: `bubble ${role}` }, text);
    $("#transcript").append(bubble);
    scrollTranscript();
    return bubble;
  }

  function appendText(text) {
    if (!state.bubble) state.bubble = addBubble("assistant", "");
    state.bubble.textContent += text;
  }

  function pretty(value) {
    return typeof value === "string" ? value : JSON.stringify(value, null, 2);
  }

  function card(kind, title, ...body) {
    return el("div", { class: `card ${kind}` }, el("div", { class: "card-title" }, title), ...body);
  }

  function toolServer(tool) {
    // Which MCP server a tool came from (GET /api/console/info, per endpoint), if any.
    const servers = (state.endpoint && state.endpoint.toolServers) || {};
    return Object.prototype.hasOwnProperty.call(servers, tool) ? servers[tool] : null;
  }

  function toolStarted(data) {
    const status = el("span", { class: "badge running" }, "running");
    const result = el("pre", { class: "result" }, "…");
    const server = toolServer(data.tool);
    const origin = server ? el("span", { class: "badge mcp", title: "MCP server" }, `mcp: ${server}`) : null;
    const node = card(
      "tool",
      el("span", {}, el("strong", {}, data.tool), " ", status, origin ? " " : null, origin),
      el("details", { class: "arguments" }, el("summary", {}, "arguments"), el("pre", {}, pretty(data.arguments))),
      result,
    );
    node.dataset.tool = data.tool;
    node.dataset.toolCallId = data.toolCallId;
    if (server) node.dataset.mcpServer = server;
    state.tools.set(data.toolCallId, { node, status, result });
    $("#transcript").append(node);
  }

  function toolFinished(data) {
    let entry = state.tools.get(data.toolCallId);
    if (!entry) {
      toolStarted({ ...data, arguments: {} });
      entry = state.tools.get(data.toolCallId);
    }
    const text = String(data.result ?? "");
    const outcome = toolOutcome(text);
    entry.status.textContent = outcome;
    entry.status.className = `badge ${outcome === "done" ? "done" : "failed"}`;
    entry.node.dataset.outcome = outcome;
    entry.result.textContent = text;
    const offloaded = OFFLOAD.exec(text);
    if (offloaded) {
      entry.node.append(
        el(
          "p",
          { class: "offload" },
          "Full output offloaded to ",
          el("button", { type: "button", class: "link", onclick: () => openFile(offloaded[1]) }, offloaded[1]),
        ),
      );
    }
  }

  // What a tool card's badge says: a call governance (or a person) refused never ran.
  function toolOutcome(text) {
    if (text.startsWith("Error:") || text.startsWith('{"error"')) return "error";
    if (text.startsWith('{"status"')) {
      try {
        const status = JSON.parse(text).status;
        if (status === "cancelled") return "denied";
        if (status === "timeout" || status === "interrupted") return status;
      } catch (error) {
        // not JSON after all: an ordinary result
      }
    }
    return "done";
  }

  async function openFile(path) {
    showTab("workspace");
    await showFile(path);
  }

  function openFolder(path) {
    state.filesPath = path;
    showTab("workspace");
  }

  function approvalRequired(data) {
    const outcome = el("span", { class: "badge running" }, "waiting");
    const buttons = el("div", { class: "actions" });
    const answer = async (approve) => {
      for (const button of buttons.querySelectorAll("button")) button.disabled = true;
      try {
        const response = await fetch(url(`${state.endpoint.path}/approvals/${encodeURIComponent(data.approvalId)}`), {
          method: "POST",
          headers: { "Content-Type": "application/json" },
          body: JSON.stringify({ approve }),
        });
        if (response.ok) {
          outcome.textContent = approve ? "approved" : "denied";
          outcome.className = `badge ${approve ? "done" : "failed"}`;
        } else {
          outcome.textContent = response.status === 404 ? "expired" : response.status === 409 ? "already answered" : `HTTP ${response.status}`;
          outcome.className = "badge failed";
        }
      } catch (error) {
        outcome.textContent = "not sent";
        outcome.className = "badge failed";
        for (const button of buttons.querySelectorAll("button")) button.disabled = false;
      }
    };
    buttons.append(
      el("button", { type: "button", class: "approve", onclick: () => answer(true) }, "Approve"),
      el("button", { type: "button", class: "deny", onclick: () => answer(false) }, "Deny"),
    );
    const node = card(
      "approval",
      el("span", {}, "Approval needed: ", el("strong", {}, data.tool), " ", outcome),
      el("pre", {}, pretty(data.arguments)),
      data.expiresAt ? el("p", { class: "muted" }, `expires ${new Date(data.expiresAt).toLocaleString()}`) : null,
      buttons,
    );
    node.dataset.approvalId = data.approvalId;
    const call = state.tools.get(data.toolCallId);
    if (call) call.node.after(node);
    else $("#transcript").append(node);
  }

  function subagentStarted(data) {
    const status = el("span", { class: "badge running" }, "running");
    const plan = el("div", { class: "plan mini" });
    const report = el("div", { class: "report" });
    const node = card(
      "subagent",
      el("span", {}, "Sub-agent ", el("strong", {}, data.agentId || "task"), " ", status),
      el("p", { class: "muted" }, data.description || ""),
      plan,
      report,
    );
    node.dataset.subagentId = data.subagentId;
    state.subagents.set(data.subagentId, { node, status, plan, report, agentId: data.agentId, parent: data.parentSubagentId });
    $("#transcript").append(node);
  }

  function subagentEnded(data) {
    const entry = state.subagents.get(data.subagentId);
    if (!entry) return;
    const failed = Boolean(data.error) || ["error", "failed", "timeout", "denied", "cancelled"].includes(String(data.status));
    entry.status.textContent = data.status || (failed ? "failed" : "completed");
    entry.status.className = `badge ${failed ? "failed" : "done"}`;
    entry.report.replaceChildren(el("pre", {}, data.error || data.report || ""));
    if (data.files) {
      // The sub-agent's files, kept in its parent's workspace when it ended: a nested one's
      // folder is inside its parent sub-agent's, which is kept in this conversation in turn.
      let folder = data.files;
      for (let up = state.subagents.get(entry.parent); up; up = state.subagents.get(up.parent)) {
        folder = `subagents/${up.agentId}/${folder}`;
      }
      // A fleet member's sub-agent keeps them in that member's own conversation, which this
      // console does not browse: the folder is named, not linked.
      const where = data.fleetAgent
        ? [el("code", {}, `${folder}/`), ` in ${data.fleetAgent}'s workspace`]
        : [el("button", { type: "button", class: "link", "data-path": folder, onclick: () => openFolder(folder) }, `${folder}/`)];
      entry.node.append(el("p", { class: "offload" }, "Its files: ", ...where));
    }
  }

  // --- plans -------------------------------------------------------------------------------

  const MARKERS = { pending: "○", in_progress: "◐", completed: "✓", abandoned: "✕" };

  function renderPlan(target, plan, emptyText) {
    const steps = (plan && plan.steps) || [];
    if (!plan || (!steps.length && !plan.goal)) {
      target.replaceChildren(el("p", { class: "empty" }, emptyText || "No plan."));
      return;
    }
    const items = steps.map((step) => {
      const label = step.status === "in_progress" && step.activeForm ? step.activeForm : step.content;
      return el(
        "li",
        { class: `step ${step.status}`, "data-status": step.status },
        el("span", { class: "marker", "aria-hidden": "true" }, MARKERS[step.status] || "•"),
        el("span", { class: "content" }, label),
      );
    });
    const done = steps.filter((step) => step.status === "completed").length;
    target.replaceChildren(
      plan.goal ? el("p", { class: "goal" }, plan.goal) : "",
      el("ol", { class: "steps" }, ...items),
      el("p", { class: "muted progress" }, `${done} of ${steps.length} completed`),
    );
  }

  function planUpdated(plan) {
    if (plan.subagentId) {
      const entry = state.subagents.get(plan.subagentId);
      if (entry) renderPlan(entry.plan, plan);
      return;
    }
    if (plan.conversationId && plan.conversationId !== state.conversation) return;
    renderPlan($("#plan-live"), plan);
    $("#plan-live-source").textContent = "from the chat stream";
  }

  function watchPlan() {
    if (state.planEvents) state.planEvents.close();
    state.planEvents = null;
    if (!state.token || !state.endpoint || !ownerHas("plan")) return;
    const source = new EventSource(
      url(`/api/admin/agents/${encodeURIComponent(state.endpoint.owner)}/plan/events`, {
        conversationId: state.conversation,
        [AUTH_HEADER]: state.token,
      }),
    );
    const show = (message) => {
      const plan = JSON.parse(message.data);
      renderPlan($("#plan-live"), plan, "No plan yet in this conversation.");
      $("#plan-live-source").textContent = "from the plan event stream";
    };
    source.addEventListener("plan-snapshot", show);
    source.addEventListener("plan-update", show);
    state.planEvents = source;
  }

  // --- the workspace tab -------------------------------------------------------------------

  function ownerHas(surface) {
    const owners = state.owners || [];
    const entry = owners.find((owner) => owner.owner === (state.endpoint && state.endpoint.owner));
    return Boolean(entry && entry[surface]);
  }

  function notice(text) {
    const box = $("#workspace-notice");
    box.hidden = !text;
    box.textContent = text || "";
  }

  const NO_FILE_SELECTED = "No file selected: pick one under Files.";

  // The file viewer is never a blank box: it says why it shows nothing.
  function viewerHint(text) {
    const viewer = $("#viewer");
    viewer.replaceChildren(el("span", { class: "empty" }, text));
    viewer.dataset.empty = "true";
    delete viewer.dataset.path;
    $("#viewer-path").textContent = "";
  }

  async function refreshWorkspace() {
    if (!state.endpoint || $("#tab-workspace").hidden) return;
    if (!state.token) {
      notice("Workspace reads need the admin token: open the console as /atmosphere/console/#token=<ATMOSPHERE_ADMIN_TOKEN>.");
      viewerHint("Files can be read with the admin token only.");
      return;
    }
    if (!ownerHas("plan") && !ownerHas("filesystem")) {
      notice(`${state.endpoint.owner} has no plan store or filesystem attached.`);
      viewerHint(`${state.endpoint.owner} has no filesystem attached.`);
      return;
    }
    notice("");
    await Promise.all([loadStoredPlan(), loadFiles()]);
  }

  async function loadStoredPlan() {
    const target = $("#plan-stored");
    if (!ownerHas("plan")) {
      target.replaceChildren(el("p", { class: "empty" }, "No plan store attached."));
      return;
    }
    const result = await getJson(
      `/api/admin/agents/${encodeURIComponent(state.endpoint.owner)}/plan`,
      { conversationId: state.conversation },
      true,
    );
    if (result.status === 200) renderPlan(target, result.body);
    else if (result.status === 404) target.replaceChildren(el("p", { class: "empty" }, "No plan stored for this conversation."));
    else showDenied(result, target);
  }

  function showDenied(result, target) {
    if (result.status === 401) notice(`${errorText(result)}. ${(result.body && result.body.hint) || ""}`);
    target.replaceChildren(el("p", { class: "empty" }, errorText(result)));
  }

  async function loadFiles() {
    const list = $("#files");
    $("#files-path").textContent = state.filesPath || ".";
    if (!ownerHas("filesystem")) {
      list.replaceChildren(el("li", { class: "empty" }, "No filesystem attached."));
      viewerHint(`${state.endpoint.owner} has no filesystem attached.`);
      return;
    }
    const result = await getJson(
      `/api/admin/agents/${encodeURIComponent(state.endpoint.owner)}/files`,
      { conversationId: state.conversation, path: state.filesPath },
      true,
    );
    if (result.status === 404) {
      list.replaceChildren(el("li", { class: "empty" }, "No files in this conversation yet."));
      if ($("#viewer").dataset.empty === "true") viewerHint("This conversation has no files yet.");
      return;
    }
    if (result.status !== 200) {
      showDenied(result, list);
      return;
    }
    const entries = result.body.entries;
    if ($("#viewer").dataset.empty === "true") viewerHint(NO_FILE_SELECTED);
    if (!entries.length) {
      list.replaceChildren(el("li", { class: "empty" }, "(empty directory)"));
      return;
    }
    list.replaceChildren(
      ...entries.map((entry) =>
        el(
          "li",
          { class: entry.directory ? "dir" : "file" },
          el(
            "button",
            {
              type: "button",
              class: "link",
              "data-path": entry.path,
              onclick: () => (entry.directory ? openDirectory(entry.path) : showFile(entry.path)),
            },
            entry.directory ? `${entry.path}/` : entry.path,
          ),
          entry.directory ? "" : el("span", { class: "muted size" }, `${entry.size} B`),
        ),
      ),
    );
  }

  function openDirectory(path) {
    state.filesPath = path;
    loadFiles();
  }

  async function showFile(path) {
    $("#viewer-path").textContent = path;
    const viewer = $("#viewer");
    viewer.textContent = "loading…";
    viewer.dataset.empty = "false";
    const result = await getJson(
      `/api/admin/agents/${encodeURIComponent(state.endpoint.owner)}/files/content`,
      { conversationId: state.conversation, path },
      true,
    );
    viewer.textContent = result.status === 200 ? result.body.content : errorText(result);
    viewer.dataset.path = path;
  }

  // --- the harness tab ---------------------------------------------------------------------

  // Keys the tab lays out itself; any other key of the info (app-wide or per endpoint) is shown
  // generically, so a new runtime fact appears without a console change.
  const INFO_SHOWN = new Set(["version", "runtime", "harness", "backends", "endpoints"]);
  const ENDPOINT_SHOWN = new Set(["path", "kind", "owner", "features", "harness", "tools", "skills", "toolServers"]);

  function valueView(value) {
    // A list (a model chain: first choice first) is an ordered row; a map (`mcp`: one state per
    // server) is a nested table; anything else is one state.
    if (Array.isArray(value)) {
      if (!value.length) return el("span", { class: "muted" }, "none");
      return el("ol", { class: "values" }, ...value.map((item) => el("li", {}, valueView(item))));
    }
    if (typeof value === "object" && value !== null) return truthTable(value);
    return stateBadge(String(value));
  }

  function truthTable(truth) {
    const rows = Object.keys(truth || {})
      .sort()
      .map((key) => el("tr", {}, el("th", { scope: "row" }, key), el("td", {}, valueView(truth[key]))));
    return el("table", { class: "truth" }, el("tbody", {}, ...rows));
  }

  function stateBadge(value) {
    const kind = value.startsWith("ACTIVE") ? "active" : value.startsWith("INACTIVE") ? "inactive" : "setting";
    return el("span", { class: `state ${kind}` }, value);
  }

  function otherKeys(source, shown) {
    const rest = Object.fromEntries(Object.entries(source).filter(([key]) => !shown.has(key)));
    return Object.keys(rest).length ? rest : null;
  }

  function skillList(skills) {
    if (!skills || !skills.length) return el("p", { class: "muted" }, "skills: none");
    return el(
      "div",
      { class: "skills" },
      el("p", { class: "muted" }, `skills (${skills.length}):`),
      el("ul", {}, ...skills.map((skill) => el("li", { title: skill.path }, el("strong", {}, skill.name), " — ", skill.description))),
    );
  }

  function mcpServers(endpoint) {
    // server -> its tools, from `toolServers`; the server's state is in the truth table (`mcp`).
    const servers = new Map();
    for (const [tool, server] of Object.entries(endpoint.toolServers || {})) {
      servers.set(server, [...(servers.get(server) || []), tool]);
    }
    const states = (endpoint.harness && endpoint.harness.mcp) || {};
    for (const server of Object.keys(states)) if (!servers.has(server)) servers.set(server, []);
    if (!servers.size) return el("p", { class: "muted mcp-servers" }, "MCP servers: none");
    return el(
      "p",
      { class: "muted mcp-servers" },
      "MCP servers: ",
      ...[...servers.keys()].sort().flatMap((server, index) => [
        index ? "; " : "",
        el("strong", {}, server),
        ` (${servers.get(server).sort().join(", ") || "no tools"})`,
      ]),
    );
  }

  function renderHarness(info) {
    const runtime = info.runtime || { name: "?", capabilities: [] };
    const blocks = [
      el("p", { class: "muted" }, `atmosphere-harness ${info.version} · runtime `, el("strong", {}, runtime.name), ` (${runtime.capabilities.join(", ")})`),
      el("h2", {}, "App-wide runtime truth"),
      info.harness ? truthTable(info.harness) : el("p", { class: "empty" }, "No endpoint resolved the harness."),
      el("h2", {}, "Backends"),
      info.backends ? truthTable(info.backends) : el("p", { class: "empty" }, "Not reported."),
    ];
    const extra = otherKeys(info, INFO_SHOWN);
    if (extra) blocks.push(el("h2", {}, "Other runtime facts"), truthTable(extra));
    for (const endpoint of info.endpoints) {
      const more = otherKeys(endpoint, ENDPOINT_SHOWN);
      blocks.push(
        el(
          "div",
          { class: "panel endpoint", "data-path": endpoint.path },
          el("h2", {}, el("code", {}, endpoint.path), " ", el("span", { class: "badge" }, endpoint.kind)),
          el("p", {}, "owner ", el("strong", {}, endpoint.owner), " · features ", endpoint.features.length ? endpoint.features.join(", ") : "none"),
          truthTable(endpoint.harness),
          more ? truthTable(more) : null,
          el("p", { class: "muted tools" }, `tools: ${endpoint.tools.join(", ") || "none"}`),
          mcpServers(endpoint),
          skillList(endpoint.skills),
        ),
      );
    }
    $("#harness").replaceChildren(...blocks);
  }

  // --- start -------------------------------------------------------------------------------

  async function start() {
    state.token = readToken();
    for (const tab of document.querySelectorAll("[role=tab]")) tab.addEventListener("click", () => showTab(tab.dataset.tab));
    $("#composer").addEventListener("submit", (event) => {
      event.preventDefault();
      const box = $("#message");
      sendPrompt(box.value);
      box.value = "";
    });
    $("#message").addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey) {
        event.preventDefault();
        $("#composer").requestSubmit();
      }
    });
    $("#endpoint").addEventListener("change", (event) => selectEndpoint(event.target.value));
    $("#new-conversation").addEventListener("click", newConversation);
    $("#conversation").addEventListener("change", (event) => {
      const value = event.target.value.trim();
      if (value && value !== state.conversation) openConversation(value);
    });
    $("#stop").addEventListener("click", stopRun);
    $("#conversations-more").addEventListener("click", () => loadConversations(true));
    $("#conversations-refresh").addEventListener("click", () => loadConversations(false));
    $("#confirm-delete-ok").addEventListener("click", confirmDelete);
    $("#confirm-delete-cancel").addEventListener("click", () => $("#confirm-delete").close());
    window.addEventListener("pagehide", () => leaveConversation(true));
    $("#plan-refresh").addEventListener("click", loadStoredPlan);
    $("#files-refresh").addEventListener("click", loadFiles);
    $("#files-up").addEventListener("click", () => {
      openDirectory(state.filesPath.includes("/") ? state.filesPath.slice(0, state.filesPath.lastIndexOf("/")) : "");
    });

    const info = await probe();
    if (!info) return;
    state.info = info;
    const owners = await getJson("/api/admin/workspace/owners", {}, true);
    state.owners = owners.status === 200 ? owners.body : [];
    renderHarness(state.info);
    const select = $("#endpoint");
    select.replaceChildren(
      ...state.info.endpoints.map((endpoint) => el("option", { value: endpoint.path }, `${endpoint.owner} · ${endpoint.path}`)),
    );
    if (!state.info.endpoints.length) {
      setStatus("failed", "no endpoint is hosted");
      $("#send").disabled = true;
      return;
    }
    const remembered = sessionStorage.getItem(ENDPOINT_KEY);
    const initial = state.info.endpoints.some((endpoint) => endpoint.path === remembered) ? remembered : state.info.endpoints[0].path;
    select.value = initial;
    selectEndpoint(initial);
    document.body.dataset.ready = "true";
  }

  document.addEventListener("DOMContentLoaded", start);
})();

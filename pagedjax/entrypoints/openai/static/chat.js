// The chat playground: streams /v1/chat/completions, renders Markdown safely,
// stop / regenerate / edit, sampling settings, per-message timing, reasoning
// and tool calls shown apart, images as image_url parts.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const conv = [];  // {role, content, image, reasoning, toolCalls, timing}
  let controller = null;

  function num(id, parse) {
    const raw = $(id).value.trim();
    if (raw === "") return undefined;
    const v = parse(raw);
    return Number.isFinite(v) ? v : undefined;
  }

  function samplingParams() {
    const p = {
      temperature: num("temperature", parseFloat), top_p: num("top_p", parseFloat),
      top_k: num("top_k", (s) => parseInt(s, 10)), max_tokens: num("max_tokens", (s) => parseInt(s, 10)),
      seed: num("seed", (s) => parseInt(s, 10)),
    };
    Object.keys(p).forEach((k) => p[k] === undefined && delete p[k]);
    return p;
  }

  function apiMessages() {
    const out = [];
    const system = $("system").value.trim();
    if (system) out.push({ role: "system", content: system });
    for (const m of conv) {
      if (m.role === "user" && m.image) {
        out.push({ role: "user", content: [{ type: "text", text: m.content },
          { type: "image_url", image_url: { url: m.image } }] });
      } else if (m.role === "assistant" && m.toolCalls.length) {
        out.push({ role: "assistant", content: m.content || null, tool_calls: m.toolCalls });
      } else {
        out.push({ role: m.role, content: m.content });
      }
    }
    return out;
  }

  function showError(text) {
    $("error").textContent = text;
    $("error").hidden = !text;
  }

  // ------------------------------------------------------------ rendering
  function timingText(t) {
    if (!t || t.ttft === undefined) return "";
    const parts = ["TTFT " + Math.round(t.ttft) + " ms"];
    if (t.tokens) parts.push(t.tokens + " tokens");
    if (t.tps) parts.push(t.tps.toFixed(1) + " tok/s");
    return parts.join(" · ");
  }

  function renderToolCalls(box, calls) {
    for (const c of calls) {
      const d = PJ.el("div", "tool-call");
      d.appendChild(PJ.el("span", "tool-name", "tool call: " + (c.function.name || "?")));
      d.appendChild(PJ.el("pre", "tool-args", c.function.arguments || ""));
      box.appendChild(d);
    }
  }

  function fillMessage(node, m) {
    const body = node.querySelector(".content");
    body.replaceChildren();
    if (m.image) {
      const img = document.createElement("img");
      img.src = m.image;  // a data: URL the user picked
      img.className = "thumb";
      img.alt = "attached image";
      body.appendChild(img);
    }
    if (m.reasoning) {
      const d = PJ.el("details", "reasoning");
      d.appendChild(PJ.el("summary", null, "Reasoning"));
      d.appendChild(Markdown.render(m.reasoning));
      body.appendChild(d);
    }
    body.appendChild(Markdown.render(m.content || ""));
    if (m.toolCalls && m.toolCalls.length) renderToolCalls(body, m.toolCalls);
    node.querySelector(".timing").textContent = timingText(m.timing);
  }

  function renderAll() {
    const box = $("messages");
    box.replaceChildren();
    conv.forEach((m, i) => {
      const node = PJ.el("div", "msg " + m.role);
      node.dataset.index = i;
      node.dataset.state = m.state || "done";
      const head = PJ.el("div", "head");
      head.appendChild(PJ.el("span", "role", m.role));
      const actions = PJ.el("span", "actions");
      if (m.role === "user") actions.appendChild(button("Edit", "edit", () => startEdit(i, node)));
      if (m.role === "assistant" && i === conv.length - 1) {
        actions.appendChild(button("Regenerate", "regenerate", regenerate));
      }
      head.appendChild(actions);
      node.appendChild(head);
      node.appendChild(PJ.el("div", "content"));
      node.appendChild(PJ.el("div", "timing"));
      fillMessage(node, m);
      m.node = node;
      box.appendChild(node);
    });
    box.scrollTop = box.scrollHeight;
  }

  function button(text, cls, onclick) {
    const b = PJ.el("button", cls, text);
    b.type = "button";
    b.onclick = onclick;
    b.disabled = controller !== null;
    return b;
  }

  function startEdit(i, node) {
    const body = node.querySelector(".content");
    const area = document.createElement("textarea");
    area.className = "edit-box";
    area.value = conv[i].content;
    body.replaceChildren(area, button("Save and resend", "save", () => {
      conv[i].content = area.value;
      conv.length = i + 1;
      generate();
    }), button("Cancel", "cancel", renderAll));
    area.focus();
  }

  // ------------------------------------------------------------ streaming
  function mergeToolCall(calls, d) {
    const i = d.index || 0;
    if (!calls[i]) calls[i] = { id: d.id || "", type: "function", function: { name: "", arguments: "" } };
    if (d.id) calls[i].id = d.id;
    if (d.function) {
      if (d.function.name) calls[i].function.name += d.function.name;
      if (d.function.arguments) calls[i].function.arguments += d.function.arguments;
    }
  }

  // Add one stream chunk to the message; true when it carried output.
  function applyChunk(msg, chunk) {
    if (chunk.error) throw new Error(chunk.error.message || "stream error");
    if (chunk.usage) msg.timing.tokens = chunk.usage.completion_tokens;
    const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
    if (!delta) return false;
    const reasoning = delta.reasoning_content || delta.reasoning;
    if (delta.content) msg.content += delta.content;
    if (reasoning) msg.reasoning += reasoning;
    (delta.tool_calls || []).forEach((d) => mergeToolCall(msg.toolCalls, d));
    return Boolean(delta.content || reasoning || (delta.tool_calls && delta.tool_calls.length));
  }

  function setBusy(busy) {
    $("send").disabled = busy;
    $("stop").disabled = !busy;
    document.querySelectorAll(".msg button").forEach((b) => { b.disabled = busy; });
  }

  async function generate() {
    showError("");
    const msg = { role: "assistant", content: "", reasoning: "", toolCalls: [], timing: {},
                  state: "streaming" };
    const messages = apiMessages();
    conv.push(msg);
    controller = new AbortController();
    renderAll();
    setBusy(true);
    const body = Object.assign({ model: $("model").value, messages, stream: true,
                                 stream_options: { include_usage: true } }, samplingParams());
    const t0 = performance.now();
    let first = null;
    let pending = false;
    const redraw = () => {
      if (pending) return;
      pending = true;
      requestAnimationFrame(() => { pending = false; fillMessage(msg.node, msg); });
    };
    try {
      const r = await PJ.apiFetch("/v1/chat/completions", {
        method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify(body), signal: controller.signal });
      if (!r.ok) throw new Error(await PJ.errorText(r));
      for await (const chunk of PJ.sseEvents(r)) {
        if (applyChunk(msg, chunk) && first === null) {
          first = performance.now();
          msg.timing.ttft = first - t0;
        }
        redraw();
      }
      msg.state = "done";
    } catch (e) {
      if (e.name === "AbortError") {
        msg.state = "stopped";
      } else {
        msg.state = "error";
        showError(e.message);
      }
    } finally {
      const end = performance.now();
      if (first !== null && msg.timing.tokens > 1 && end > first) {
        msg.timing.tps = (msg.timing.tokens - 1) / ((end - first) / 1000);
      }
      controller = null;
      renderAll();
      setBusy(false);
    }
  }

  function regenerate() {
    if (conv.length && conv[conv.length - 1].role === "assistant") conv.pop();
    generate();
  }

  let image = null;
  $("image").onchange = () => {
    const f = $("image").files[0];
    image = null;
    $("image-name").textContent = "";
    if (!f) return;
    const reader = new FileReader();
    reader.onload = () => { image = reader.result; $("image-name").textContent = f.name; };
    reader.readAsDataURL(f);
  };

  $("composer").onsubmit = (ev) => {
    ev.preventDefault();
    const text = $("input").value;
    if (!text.trim() || controller) return;
    conv.push({ role: "user", content: text, image });
    $("input").value = "";
    image = null;
    $("image").value = "";
    $("image-name").textContent = "";
    generate();
  };
  $("input").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey) {
      ev.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").onclick = () => { if (controller) controller.abort(); };
  $("clear").onclick = () => { if (!controller) { conv.length = 0; renderAll(); } };

  async function loadModels() {
    const r = await PJ.apiFetch("/v1/models");
    if (!r.ok) { showError(await PJ.errorText(r)); return; }
    const data = (await r.json()).data || [];
    const sel = $("model");
    sel.replaceChildren();
    for (const m of data) {
      const o = PJ.el("option", null, m.id);
      o.value = m.id;
      sel.appendChild(o);
    }
    document.body.dataset.ready = "1";
  }

  PJ.forgetKeyButton();
  loadModels();
})();

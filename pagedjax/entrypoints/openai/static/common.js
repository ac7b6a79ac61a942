// Shared by both pages: the API key (sessionStorage, sent as a bearer token,
// never put in a URL) and fetch helpers. No page inserts text as HTML.
"use strict";

const PJ = (() => {
  const KEY_NAME = "pagedjax.apiKey";
  let waiting = null;

  function getKey() {
    return sessionStorage.getItem(KEY_NAME) || "";
  }

  function headers(extra) {
    const h = Object.assign({}, extra || {});
    const key = getKey();
    if (key) h["Authorization"] = "Bearer " + key;
    return h;
  }

  // Show the key form and resolve once the user saved a key.
  function askKey(message) {
    const dialog = document.getElementById("key-dialog");
    const input = document.getElementById("key-input");
    const note = document.getElementById("key-note");
    note.textContent = message || "This server needs an API key.";
    dialog.hidden = false;
    input.focus();
    if (!waiting) {
      waiting = new Promise((resolve) => {
        document.getElementById("key-form").onsubmit = (ev) => {
          ev.preventDefault();
          sessionStorage.setItem(KEY_NAME, input.value.trim());
          input.value = "";
          dialog.hidden = true;
          waiting = null;
          resolve();
        };
      });
    }
    return waiting;
  }

  // fetch with the key; on 401 ask for a key and try again.
  async function apiFetch(path, opts) {
    for (;;) {
      const o = Object.assign({}, opts || {});
      o.headers = headers(o.headers);
      const r = await fetch(path, o);
      if (r.status !== 401) return r;
      let msg = "This server needs an API key.";
      if (getKey()) msg = "The API key was refused; enter it again.";
      await askKey(msg);
    }
  }

  async function errorText(r) {
    try {
      const body = await r.json();
      if (body && body.error && body.error.message) return body.error.message;
    } catch (e) { /* not JSON */ }
    return "HTTP " + r.status;
  }

  // Yield the JSON of each server-sent event of a fetch response body.
  async function* sseEvents(response) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const block = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        const data = block.split("\n").filter((l) => l.startsWith("data:"))
          .map((l) => l.slice(5).trim()).join("\n");
        if (!data) continue;
        if (data === "[DONE]") return;
        yield JSON.parse(data);
      }
    }
  }

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  function forgetKeyButton() {
    const b = document.getElementById("forget-key");
    if (b) b.onclick = () => { sessionStorage.removeItem(KEY_NAME); location.reload(); };
  }

  return { getKey, headers, askKey, apiFetch, errorText, sseEvents, el, forgetKeyButton };
})();

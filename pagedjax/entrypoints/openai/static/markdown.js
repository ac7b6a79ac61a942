// A small Markdown renderer that builds DOM nodes: text only ever goes in as
// textContent, so markup in a message (<script>, <img onerror>) shows as text.
// Handles fenced code blocks, headings, lists, block quotes, rules, paragraphs,
// and inline code, bold, italics and http(s) links.
"use strict";

const Markdown = (() => {
  const SAFE_URL = /^(https?:\/\/|mailto:)/i;
  const INLINE = /(`+)([\s\S]*?[^`])\1(?!`)|\*\*([^*]+)\*\*|__([^_]+)__|\*([^*\s][^*]*)\*|_([^_\s][^_]*)_|\[([^\]]+)\]\(([^)\s]+)\)/;

  function inline(parent, text) {
    while (text) {
      const m = INLINE.exec(text);
      if (!m) { parent.appendChild(document.createTextNode(text)); return; }
      if (m.index) parent.appendChild(document.createTextNode(text.slice(0, m.index)));
      let node;
      if (m[1]) {
        node = document.createElement("code");
        node.textContent = m[2];
      } else if (m[3] || m[4]) {
        node = document.createElement("strong");
        inline(node, m[3] || m[4]);
      } else if (m[5] || m[6]) {
        node = document.createElement("em");
        inline(node, m[5] || m[6]);
      } else if (SAFE_URL.test(m[8])) {
        node = document.createElement("a");
        node.href = m[8];
        node.rel = "noopener noreferrer nofollow";
        node.target = "_blank";
        node.textContent = m[7];
      } else {
        node = document.createTextNode(m[0]);
      }
      parent.appendChild(node);
      text = text.slice(m.index + m[0].length);
    }
  }

  function codeBlock(lang, lines) {
    const pre = document.createElement("pre");
    const code = document.createElement("code");
    if (lang) {
      pre.dataset.lang = lang;
      code.className = "lang-" + lang.replace(/[^\w-]/g, "");
    }
    code.textContent = lines.join("\n");
    pre.appendChild(code);
    return pre;
  }

  function render(src) {
    const root = document.createElement("div");
    root.className = "md";
    const lines = String(src).replace(/\r\n?/g, "\n").split("\n");
    let i = 0;
    let para = [];
    let list = null;
    const flush = () => {
      if (para.length) {
        const p = document.createElement("p");
        inline(p, para.join("\n"));
        root.appendChild(p);
        para = [];
      }
    };
    while (i < lines.length) {
      const line = lines[i];
      const fence = /^\s*(```|~~~)\s*([\w+#.-]*)\s*$/.exec(line);
      if (fence) {
        flush(); list = null;
        const body = [];
        i++;
        while (i < lines.length && !lines[i].trim().startsWith(fence[1])) body.push(lines[i++]);
        root.appendChild(codeBlock(fence[2], body));
        i++;  // the closing fence (or the end: a block still streaming)
        continue;
      }
      const head = /^(#{1,6})\s+(.*)$/.exec(line);
      const item = /^\s*([-*+]|\d+[.)])\s+(.*)$/.exec(line);
      if (head) {
        flush(); list = null;
        const h = document.createElement("h" + Math.min(6, head[1].length + 2));
        inline(h, head[2]);
        root.appendChild(h);
      } else if (item) {
        flush();
        const ordered = /\d/.test(item[1]);
        const tag = ordered ? "OL" : "UL";
        if (!list || list.tagName !== tag) {
          list = document.createElement(tag);
          root.appendChild(list);
        }
        const li = document.createElement("li");
        inline(li, item[2]);
        list.appendChild(li);
      } else if (/^\s*>/.test(line)) {
        flush(); list = null;
        const q = document.createElement("blockquote");
        inline(q, line.replace(/^\s*>\s?/, ""));
        root.appendChild(q);
      } else if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(line)) {
        flush(); list = null;
        root.appendChild(document.createElement("hr"));
      } else if (!line.trim()) {
        flush(); list = null;
      } else {
        list = null;
        para.push(line);
      }
      i++;
    }
    flush();
    return root;
  }

  return { render };
})();

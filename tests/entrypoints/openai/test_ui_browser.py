"""The browser pages in a real headless Chromium against the shared server (API key on).

The chat page asks for the key before anything works, then streams an answer
that matches the API's own; Stop ends the stream and the server frees the
request's pages; markup in a message renders as text; the dashboard's grid
changes while 8 requests run and is all free after. Screenshots of both pages
are saved as test artifacts (``tests/utils/browser.py``).
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request

import pytest
from tests.utils.browser import Browser, need_browser

pytestmark = pytest.mark.slow

HOSTILE = '<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2"> hi'


@pytest.fixture(scope="module")
def browser():
    need_browser()
    b = Browser()
    yield b
    b.quit()


def open_page(b: Browser, server, path: str, key: str | None = None) -> None:
    b.driver.get(server.url + path)
    if key is None:
        key = server.api_key
    b.wait(lambda: not b.find("#key-dialog").get_attribute("hidden")
           or b.find("body").get_attribute("data-ready"), what="the page to ask or load")
    if b.find("body").get_attribute("data-ready"):
        return
    b.find("#key-input").send_keys(key)
    b.find("#key-save").click()


def set_field(b: Browser, field: str, value) -> None:
    b.js("document.getElementById(arguments[0]).value = arguments[1]", field, str(value))


def send(b: Browser, text: str) -> None:
    b.find("#input").send_keys(text)
    b.find("#send").click()


def last_answer(b: Browser) -> tuple:
    """(state, rendered text, timing text) of the newest answer, or None (read in one
    script: the page re-renders its messages, so element handles go stale)."""
    return b.js("""const all = document.querySelectorAll('.msg.assistant');
        if (!all.length) return null;
        const m = all[all.length - 1];
        return [m.dataset.state, m.querySelector('.content').innerText,
                m.querySelector('.timing').innerText];""")


def wait_answer_done(b: Browser, timeout: float = 120.0) -> tuple:
    return b.wait(lambda: (last_answer(b) or ("streaming",))[0] != "streaming" and last_answer(b),
                  timeout, what="the answer to finish")


def snapshot(server) -> dict:
    """The first snapshot of the server's event stream."""
    req = urllib.request.Request(server.url + "/dashboard/events",
                                 headers={"Authorization": f"Bearer {server.api_key}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        for line in r:
            if line.startswith(b"data: "):
                return json.loads(line[6:])["snapshot"]
    raise AssertionError("no event")


def norm(text: str) -> str:
    return re.sub(r"[\s*_`#]+", "", text)


def test_chat_needs_the_key_then_streams_the_answer(browser, server):
    b = browser
    b.driver.get(server.url + "/")
    b.js("sessionStorage.clear()")
    b.driver.refresh()
    b.wait(lambda: not b.find("#key-dialog").get_attribute("hidden"), what="the key form")
    assert b.find("#model").text == ""  # nothing loaded without the key
    b.find("#key-input").send_keys("wrong-key")
    b.find("#key-save").click()
    b.wait(lambda: "refused" in b.find("#key-note").text, what="the refusal")
    assert not b.find("#key-dialog").get_attribute("hidden")
    b.find("#key-input").send_keys(server.api_key)
    b.find("#key-save").click()
    b.wait(lambda: b.find("body").get_attribute("data-ready"), what="the model list")
    assert server.model in b.find("#model").text
    assert server.api_key not in b.driver.current_url
    set_field(b, "temperature", 0)
    set_field(b, "max_tokens", 32)
    prompt = "Name three colours of the rainbow."
    send(b, prompt)
    b.wait(lambda: last_answer(b), what="an answer")
    seen = set()
    while (ans := last_answer(b))[0] == "streaming":
        seen.add(ans[1])
        time.sleep(0.03)
    state, text, timing = ans
    assert state == "done"
    assert len({s for s in seen if s}) >= 2, "the answer arrived in one piece, not streamed"
    assert re.search(r"TTFT \d+ ms · \d+ tokens · [\d.]+ tok/s", timing), timing
    ref = server.client().chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": prompt}], temperature=0,
        top_p=0.95, max_tokens=32, extra_body={"top_k": -1})
    assert norm(text) == norm(ref.choices[0].message.content)
    b.screenshot("chat.png")


def test_stop_ends_the_stream_and_frees_the_pages(browser, server):
    b = browser
    open_page(b, server, "/")
    server.wait_idle()
    set_field(b, "max_tokens", 400)
    set_field(b, "temperature", 0.8)
    send(b, "Write a long story about a lighthouse keeper.")
    b.wait(lambda: len((last_answer(b) or ("", ""))[1]) > 20, what="tokens")
    held = snapshot(server)
    assert held["counts"]["running"] == 1 and held["counts"]["used"] > 0
    assert sum(len(r["pages"]) for r in held["requests"]) > 0
    b.find("#stop").click()
    stopped = wait_answer_done(b)
    assert stopped[0] == "stopped"
    server.wait_idle(timeout=30)
    after = snapshot(server)
    assert after["counts"]["used"] == 0 and after["requests"] == []
    time.sleep(0.5)  # nothing more arrives after Stop
    assert last_answer(b) == stopped
    assert b.find("#send").is_enabled() and not b.find("#stop").is_enabled()


def test_markup_in_messages_renders_as_text(browser, server):
    b = browser
    open_page(b, server, "/")
    b.find("#clear").click()
    set_field(b, "max_tokens", 8)
    send(b, HOSTILE)
    b.wait(lambda: last_answer(b), what="an answer")
    wait_answer_done(b)
    user = b.find_all(".msg.user")[-1].find_element("css selector", ".content")
    assert HOSTILE in user.text
    assert not b.find_all("#messages script") and not b.find_all("#messages img")
    assert b.js("return window.pwned") is None
    # The renderer itself, on Markdown mixed with markup and a script link.
    out = b.js("""const n = Markdown.render(arguments[0]); document.body.appendChild(n);
                  return [n.querySelectorAll('script,img,iframe').length,
                          n.querySelectorAll('a').length, n.querySelector('strong').textContent,
                          n.querySelector('pre code').textContent, n.textContent]""",
               "**bold** <iframe src=x></iframe> [bad](javascript:alert(1)) [ok](https://a.b)\n"
               "```html\n<script>window.pwned = 3</script>\n```")
    assert out[0] == 0 and out[1] == 1 and out[2] == "bold"
    assert out[3] == "<script>window.pwned = 3</script>"
    assert "<iframe src=x></iframe>" in out[4] and "[bad](javascript:alert(1))" in out[4]
    assert b.js("return window.pwned") is None


def test_dashboard_grid_follows_eight_requests(browser, server):
    b = browser
    open_page(b, server, "/dashboard")
    server.wait_idle()
    grid = b.find("#grid")
    b.wait(lambda: grid.get_attribute("data-total"), what="the first snapshot")
    total = int(grid.get_attribute("data-total"))
    assert int(grid.get_attribute("data-used")) == 0
    client = server.client()
    errors = []

    def one(i):
        try:
            client.completions.create(model=server.model, prompt=f"Story {i}: once upon a time",
                                      max_tokens=48, temperature=0.8,
                                      extra_body={"ignore_eos": True})
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    states, best = set(), (0, 0)
    while any(t.is_alive() for t in threads):
        used, reqs = int(grid.get_attribute("data-used")), int(grid.get_attribute("data-requests"))
        states.add((used, reqs))
        if (reqs, used) > best:
            best = (reqs, used)
            if reqs >= 6:
                b.screenshot("dashboard.png")
        time.sleep(0.1)
    assert not errors, errors
    assert best[0] >= 6 and best[1] > 0, f"the grid never showed the requests: {states}"
    assert len(states) >= 3, f"the grid did not change while they ran: {states}"
    b.wait(lambda: grid.get_attribute("data-used") == "0", timeout=30, what="all pages free")
    assert int(grid.get_attribute("data-free")) + int(grid.get_attribute("data-cached")) == total
    assert b.find("#c-running").text == "0"
    assert b.find("#status").text == "live"


def test_regenerate_and_edit(browser, server):
    b = browser
    open_page(b, server, "/")
    b.find("#clear").click()
    set_field(b, "temperature", 0)
    set_field(b, "max_tokens", 12)
    send(b, "Say the word apple.")
    b.wait(lambda: last_answer(b), what="an answer")
    first = wait_answer_done(b)
    b.find(".msg.assistant .regenerate").click()
    again = wait_answer_done(b)
    assert again[0] == "done" and again[1] == first[1]  # greedy: the same answer, in its place
    assert len(b.find_all(".msg")) == 2
    b.find(".msg.user .edit").click()
    box = b.find(".msg.user .edit-box")
    box.clear()
    box.send_keys("Say the word banana.")
    b.find(".msg.user .save").click()
    b.wait(lambda: b.find_all(".msg.user")[0].text.endswith("banana."), what="the edit")
    edited = wait_answer_done(b)
    assert edited[0] == "done" and len(b.find_all(".msg")) == 2
    ref = server.client().chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": "Say the word banana."}],
        temperature=0, top_p=0.95, max_tokens=12, extra_body={"top_k": -1})
    assert norm(edited[1]) == norm(ref.choices[0].message.content)


def test_settings_sent_and_reasoning_and_tool_calls_shown_apart(browser, server):
    """The page's request carries the side panel's settings; a stream with reasoning and
    tool-call deltas (served by a stand-in for fetch) renders them in their own boxes."""
    b = browser
    open_page(b, server, "/")
    b.find("#clear").click()
    b.find("#system").send_keys("You are terse.")
    for field, value in (("temperature", 0.3), ("top_p", 0.8), ("top_k", 20),
                         ("max_tokens", 40), ("seed", 7)):
        set_field(b, field, value)
    b.js("""
      const chunks = [
        {choices: [{delta: {role: 'assistant', reasoning_content: 'The user wants '}}]},
        {choices: [{delta: {reasoning_content: 'the <b>weather</b>.'}}]},
        {choices: [{delta: {tool_calls: [{index: 0, id: 'call_1', type: 'function',
                    function: {name: 'get_weather', arguments: '{"city": '}}]}}]},
        {choices: [{delta: {tool_calls: [{index: 0, function: {arguments: '"Paris"}'}}]}}]},
        {choices: [{delta: {}, finish_reason: 'tool_calls'}],
         usage: {prompt_tokens: 9, completion_tokens: 12, total_tokens: 21}}];
      const real = window.fetch;
      window.sentBodies = [];
      window.fetch = (url, opts) => {
        if (!String(url).endsWith('/v1/chat/completions')) return real(url, opts);
        window.sentBodies.push(JSON.parse(opts.body));
        const text = chunks.map((c) => 'data: ' + JSON.stringify(c) + '\\n\\n').join('')
                     + 'data: [DONE]\\n\\n';
        return Promise.resolve(new Response(text, {status: 200,
                               headers: {'Content-Type': 'text/event-stream'}}));
      };""")
    send(b, "Weather in Paris?")
    b.wait(lambda: last_answer(b), what="an answer")
    assert wait_answer_done(b)[0] == "done"
    sent = b.js("return window.sentBodies")[0]
    assert sent["messages"] == [{"role": "system", "content": "You are terse."},
                                {"role": "user", "content": "Weather in Paris?"}]
    assert (sent["temperature"], sent["top_p"], sent["top_k"], sent["max_tokens"],
            sent["seed"], sent["stream"]) == (0.3, 0.8, 20, 40, 7, True)
    assert sent["model"] == server.model
    msg = b.find_all(".msg.assistant")[-1]
    reasoning = msg.find_element("css selector", "details.reasoning")
    assert "The user wants the <b>weather</b>." in reasoning.get_attribute("textContent")
    call = msg.find_element("css selector", ".tool-call")
    assert "get_weather" in call.text and '{"city": "Paris"}' in call.text
    assert not b.find_all("#messages b")  # the reasoning's markup stayed text
    b.driver.refresh()  # the real fetch again for the tests after this one

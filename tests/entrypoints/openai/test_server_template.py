"""The sandbox for client-supplied chat templates (no server needed, fast)."""

from __future__ import annotations

import time

import pytest

from pagedjax.entrypoints.openai.chat_render import TemplateError, render_user_template

MSGS = [{"role": "user", "content": "hi"}]


def test_renders_a_normal_template():
    src = ("{% for m in messages %}<|{{ m.role }}|>{{ m['content'] | upper }}{% endfor %}"
           "{% if add_generation_prompt %}<|assistant|>{% endif %}{{ bos_token }}"
           "{{ messages | tojson }}")
    out = render_user_template(src, MSGS, True, {"bos_token": "<s>"})
    assert out == '<|user|>HI<|assistant|><s>[{"role": "user", "content": "hi"}]'


@pytest.mark.parametrize("src,match", [
    ("{{ 'x' * 10**9 }}", "too large"),
    ("{{ 2 ** 100000000 }}", "exponents"),
    ("{{ '%0999999999d'|format(1) }}", "format widths"),
    ("{{ 'x'|center(1000000000) }}", "too large"),
    ("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
     "{% endfor %}", "too large"),
    ("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}"
     "{% endfor %}", "too large"),
    ("{{ ''.__class__.__mro__ }}", "unsafe"),
    ("{{ raise_exception('no system role') }}", "no system role"),
    ("{% for %}", "does not compile"),
    ("{{ undefined_fn() }}", "could not apply"),
])
def test_refused_quickly(src, match):
    t0 = time.perf_counter()
    with pytest.raises(TemplateError, match=match):
        render_user_template(src, MSGS, True, {})
    assert time.perf_counter() - t0 < 0.5


@pytest.mark.parametrize("src", [
    "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
    "{% set r = range(100000)|list %}{% for a in r %}{% for b in r %}{% for c in r %}"
    "{% endfor %}{% endfor %}{% endfor %}",
])
def test_long_loops_stop_at_the_time_limit(src):
    t0 = time.perf_counter()
    with pytest.raises(TemplateError, match="longer than 0.3 s"):
        render_user_template(src, MSGS, True, {}, time_limit_s=0.3)
    assert time.perf_counter() - t0 < 2.0

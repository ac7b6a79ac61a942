"""Chat prompts for the server: the model's template, or a user's with limits.

Both run in AsyncLLM's worker pool, never on the event loop. The model's own
template is trusted and goes through ``pagedjax.engine.tokenizer.apply_chat_template``.
A ``chat_template`` sent by a client is untrusted: it is compiled in a
sandboxed Jinja environment (no attribute access to internals, ``range``
capped, arithmetic that would build huge values refused) and rendered under a
wall-clock limit enforced by a trace function on the rendering thread, which
raises ``TemplateError`` (HTTP 400) once the deadline has passed.
"""

from __future__ import annotations

import functools
import json
import re
import sys
import time
from typing import Any, Optional

from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

# Largest string / list an untrusted template may build with one operator or
# ask for through a numeric argument, and the largest rendered prompt.
MAX_VALUE_LEN = 1_000_000
MAX_RENDERED_CHARS = 4_000_000
DEFAULT_TIME_LIMIT_S = 1.0


class TemplateError(ValueError):
    """The template failed, ran too long or tried something refused (HTTP 400)."""


class _Deadline(BaseException):
    """Raised by the trace function; BaseException so template code cannot swallow it."""


def _sized(v: Any) -> int:
    return len(v) if isinstance(v, (str, bytes, list, tuple, dict)) else 0


def _check_args(args, kwargs) -> None:
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, int) and not isinstance(a, bool) and abs(a) > MAX_VALUE_LEN:
            raise SecurityError(f"numeric argument {a} is too large for a chat template")


class _LimitedEnv(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset(["*", "**", "+"])

    def call_binop(self, context, operator, left, right):
        if operator == "**":
            if abs(right) > 64 if isinstance(right, (int, float)) else True:
                raise SecurityError("exponents above 64 are refused in chat templates")
        elif operator == "*":
            for seq, n in ((left, right), (right, left)):
                if _sized(seq) and isinstance(n, int) and _sized(seq) * n > MAX_VALUE_LEN:
                    raise SecurityError("the template builds a value that is too large")
        elif operator == "+" and _sized(left) + _sized(right) > MAX_VALUE_LEN:
            raise SecurityError("the template builds a value that is too large")
        return super().call_binop(context, operator, left, right)

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - jinja's signature
        _check_args(args, kwargs)
        return super().call(__context, __obj, *args, **kwargs)


_BIG_WIDTH = re.compile(r"%[^a-zA-Z%]*\d{7}")


def _guard_filter(fn):
    @functools.wraps(fn)  # keeps jinja's pass_context / pass_environment marks
    def guarded(*args, **kwargs):
        _check_args(args[1:], kwargs)
        if any(isinstance(a, str) and _BIG_WIDTH.search(a) for a in args):
            raise SecurityError("format widths above 999999 are refused in chat templates")
        out = fn(*args, **kwargs)
        if _sized(out) > MAX_VALUE_LEN:
            raise SecurityError("a filter built a value that is too large")
        return out
    return guarded


def _make_env() -> _LimitedEnv:
    env = _LimitedEnv(trim_blocks=True, lstrip_blocks=True,
                      extensions=["jinja2.ext.loopcontrols"])

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def raise_exception(message):
        raise TemplateError(f"the chat template raised: {str(message)[:200]}")

    env.filters["tojson"] = tojson
    env.filters = {k: _guard_filter(f) for k, f in env.filters.items()}
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: time.strftime(str(fmt)[:64])
    return env


def _too_big(v: Any, depth: int) -> bool:
    """A value (or, ``depth`` levels down, a dict value or attribute) over MAX_VALUE_LEN."""
    if _sized(v) > MAX_VALUE_LEN:
        return True
    if depth == 0:
        return False
    try:  # object.__getattribute__: jinja's Namespace hides its __dict__ from getattr
        inner = v if isinstance(v, dict) else object.__getattribute__(v, "__dict__")
    except AttributeError:
        return False
    if not isinstance(inner, dict) or len(inner) > 64:
        return False
    return any(_too_big(x, depth - 1) for x in inner.values())


def _tracer(deadline: float):
    count = [0]

    def local(frame, event, arg):
        count[0] += 1
        if time.monotonic() > deadline:
            raise _Deadline()
        if count[0] % 8 == 0:  # a value grown by '~' (not interceptable) is caught here
            if any(_too_big(v, 2) for v in frame.f_locals.values()):
                raise SecurityError("the template builds a value that is too large")
        return local

    def global_(frame, event, arg):
        if time.monotonic() > deadline:
            raise _Deadline()
        return local if frame.f_code.co_filename == "<template>" else None

    return global_


def render_user_template(source: str, messages: list[dict], add_generation_prompt: bool,
                         special_tokens: dict, time_limit_s: float = DEFAULT_TIME_LIMIT_S,
                         tools: Optional[list[dict]] = None,
                         template_kwargs: Optional[dict] = None) -> str:
    """Render an untrusted chat template; TemplateError (a ValueError) on any failure."""
    env = _make_env()
    try:
        tmpl = env.from_string(source)
    except Exception as e:  # noqa: BLE001 - syntax errors
        raise TemplateError(f"chat_template does not compile: {str(e)[:200]}") from e
    old = sys.gettrace()
    sys.settrace(_tracer(time.monotonic() + time_limit_s))
    try:
        text = tmpl.render(**{**special_tokens, **(template_kwargs or {})}, messages=messages,
                           add_generation_prompt=add_generation_prompt, tools=tools)
    except _Deadline:
        raise TemplateError(f"chat_template took longer than {time_limit_s:g} s to render; "
                            "simplify it") from None
    except TemplateError:
        raise
    except Exception as e:  # noqa: BLE001 - jinja errors, SecurityError, undefined names
        raise TemplateError(f"could not apply chat_template: {type(e).__name__}: "
                            f"{str(e)[:200]}") from e
    finally:
        sys.settrace(old)
    if len(text) > MAX_RENDERED_CHARS:
        raise TemplateError(f"the rendered chat prompt has {len(text)} characters, more than "
                            f"{MAX_RENDERED_CHARS}")
    return text


RESERVED_TEMPLATE_KWARGS = frozenset({"messages", "add_generation_prompt", "tools",
                                      "chat_template", "tokenize", "conversation"})


def check_template_kwargs(template_kwargs: Optional[dict]) -> dict:
    """``chat_template_kwargs`` as extra template variables; ValueError for a name the
    renderer sets itself."""
    kw = dict(template_kwargs or {})
    bad = sorted(RESERVED_TEMPLATE_KWARGS & set(kw))
    if bad:
        raise TemplateError(f"chat_template_kwargs may not set {bad}; those are given by "
                            "the request's own fields")
    return kw


def render_chat_text(tokenizer, messages: list[dict], add_generation_prompt: bool,
                     chat_template: Optional[str], time_limit_s: float,
                     tools: Optional[list[dict]] = None,
                     template_kwargs: Optional[dict] = None) -> str:
    """The rendered chat prompt (worker pool). ValueError for anything the client caused.

    ``tools`` (OpenAI's tool list) reaches the template as ``tools``, as with
    transformers' ``apply_chat_template(tools=...)``; a template that does not
    mention them renders without them."""
    from pagedjax.engine.tokenizer import apply_chat_template

    extra = check_template_kwargs(template_kwargs)  # e.g. {"enable_thinking": False}
    if chat_template is None:
        try:
            return apply_chat_template(tokenizer, messages, tokenize=False,
                                       add_generation_prompt=add_generation_prompt, tools=tools,
                                       **extra)
        except ValueError:
            raise
        except Exception as e:  # noqa: BLE001 - the model's template rejects these messages
            raise TemplateError(f"could not apply the chat template: {type(e).__name__}: "
                                f"{str(e)[:200]}") from e
    special = {k: v for k, v in (tokenizer.special_tokens_map or {}).items()
               if isinstance(v, str)}
    return render_user_template(chat_template, messages, add_generation_prompt, special,
                                time_limit_s, tools, extra)


def render_chat_ids(tokenizer, messages: list[dict], add_generation_prompt: bool,
                    chat_template: Optional[str], time_limit_s: float,
                    tools: Optional[list[dict]] = None,
                    add_special_tokens: bool = False,
                    template_kwargs: Optional[dict] = None) -> list[int]:
    """Token ids of the rendered chat prompt (the template writes its own special
    tokens, so none are added unless ``add_special_tokens``)."""
    text = render_chat_text(tokenizer, messages, add_generation_prompt, chat_template,
                            time_limit_s, tools, template_kwargs)
    return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))

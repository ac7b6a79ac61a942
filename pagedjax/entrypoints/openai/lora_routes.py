"""LoRA adapters in the server: ``--lora-modules``, ``/v1/models``, the ``model``
field, and vLLM's runtime load/unload endpoints.

* ``--lora-modules name=path ...`` (or vLLM's JSON form
  ``{"name": ..., "path": ..., "base_model_name": ...}``) serves adapters from
  start-up; they need ``--enable-lora``.
* ``GET /v1/models`` lists each adapter with ``parent`` = the base model.
* A request whose ``model`` is an adapter's name runs with that adapter.
* ``POST /v1/load_lora_adapter`` ``{"lora_name", "lora_path"}`` and
  ``POST /v1/unload_lora_adapter`` ``{"lora_name"}`` (vLLM's routes) change the
  served set at run time; they answer only with ``--enable-lora`` and
  ``--allow-runtime-lora-updating`` (or vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING=true),
  404 otherwise. An unloaded adapter is no longer served; requests already
  running with it finish.
* Runtime loading reads only adapter folders inside the folders given by
  ``--allowed-lora-paths`` (none by default: every load is refused). A path
  outside them (symbolic links resolved) and a path that does not exist get
  the same 404, so the endpoint does not reveal what exists on the server.
  Every other failure (a config that is not a JSON object, rank 0, missing
  weights, ...) is a 400 naming the problem; never a 500.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import threading
from typing import Optional

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from pagedjax.entrypoints.openai import request_body as rb
from pagedjax.entrypoints.openai import responses as R
from pagedjax.entrypoints.openai.errors import OpenAIError, short
from pagedjax.lora.request import LoRARequest

logger = logging.getLogger("pagedjax.server")

MAX_BODY_BYTES = 65536
_ERRORS = R.error_responses(400, 401, 403, 404, 413, 415, 503)
_TEXT = {200: {"description": "Success message.",
               "content": {"text/plain": {"schema": {"type": "string"}}}}}


def _schema(required: list[str], optional: tuple[str, ...] = ()) -> dict:
    props = {k: {"type": "string", "minLength": 1} for k in [*required, *optional]}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": {
        "type": "object", "required": required, "properties": props}}}}}


def parse_lora_modules(values: Optional[list[str]]) -> list[dict]:
    """``name=path`` or JSON ``{"name", "path", "base_model_name"?}`` -> dicts (ValueError)."""
    out = []
    for v in values or ():
        v = v.strip()
        if v.startswith("{"):
            try:
                d = json.loads(v)
            except ValueError as e:
                raise ValueError(f"--lora-modules: {v[:80]!r} is not valid JSON: {e}") from e
            if not isinstance(d, dict) or not d.get("name") or not d.get("path"):
                raise ValueError(f"--lora-modules: {v[:80]!r} needs \"name\" and \"path\"")
            out.append({"name": str(d["name"]), "path": str(d["path"]),
                        "base_model_name": d.get("base_model_name")})
        elif "=" in v:
            name, path = v.split("=", 1)
            if not name or not path:
                raise ValueError(f"--lora-modules: {v[:80]!r} is not name=path")
            out.append({"name": name, "path": path, "base_model_name": None})
        else:
            raise ValueError(f"--lora-modules: {v[:80]!r} is not name=path or JSON")
    return out


def allowed_folders(values: Optional[list[str]]) -> tuple[str, ...]:
    """``--allowed-lora-paths`` as resolved folder paths (ValueError if one is not a folder)."""
    out = []
    for v in values or ():
        real = os.path.realpath(os.path.expanduser(v))
        if not os.path.isdir(real):
            raise ValueError(f"--allowed-lora-paths: {v!r} is not a folder")
        out.append(real)
    return tuple(out)


def is_loadable(path: str, folders: tuple[str, ...]) -> bool:
    """``path`` (resolved) is an existing folder inside one of ``folders``."""
    real = os.path.realpath(path)
    inside = any(os.path.commonpath([real, f]) == f for f in folders)
    return inside and os.path.isdir(real)


def runtime_updates_allowed(flag: bool) -> bool:
    env = os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "")
    return flag or env.strip().lower() in ("1", "true", "yes")


class LoRARegistry:
    """Served adapter names -> LoRARequest (ids assigned here, never reused)."""

    def __init__(self, base_model: str, reserved: tuple[str, ...] = ()):
        self.base_model = base_model
        self.reserved = frozenset(reserved)  # the base model's served names
        self._by_name: dict[str, LoRARequest] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def make(self, name: str, path: str, base_model_name: Optional[str] = None) -> LoRARequest:
        with self._lock:
            return LoRARequest(name, next(self._ids), os.path.abspath(os.path.expanduser(path)),
                               base_model_name)

    def add(self, req: LoRARequest) -> None:
        with self._lock:
            if req.lora_name in self._by_name or req.lora_name in self.reserved:
                raise ValueError(f"The lora adapter {short(req.lora_name)} has already been "
                                 "loaded.")
            self._by_name[req.lora_name] = req

    def remove(self, name: str) -> Optional[LoRARequest]:
        with self._lock:
            return self._by_name.pop(name, None)

    def get(self, name: Optional[str]) -> Optional[LoRARequest]:
        return self._by_name.get(name) if name is not None else None

    def cards(self, max_model_len: int) -> list[dict]:
        from pagedjax.entrypoints.openai.protocol import ModelCard

        return [ModelCard(id=r.lora_name, root=r.lora_path,
                          parent=r.base_model_name or self.base_model,
                          max_model_len=max_model_len).model_dump()
                for r in list(self._by_name.values())]


async def _body(request: Request) -> dict:
    rb.check_content_type(request.headers.get("content-type"))
    body = rb.parse_json(await rb.read_body(request, MAX_BODY_BYTES))
    if not isinstance(body, dict):
        raise OpenAIError("the body must be a JSON object", 400)
    return body


def _name(body: dict, key: str) -> str:
    v = body.get(key)
    if not isinstance(v, str) or not v:
        raise OpenAIError(f"{key} is required (a non-empty string)", 400, param=key)
    return v


def _not_loadable(path: str) -> OpenAIError:
    return OpenAIError(f"LoRA adapter path {short(path)} does not exist or is not inside a "
                       "folder the server loads adapters from (--allowed-lora-paths)", 404,
                       param="lora_path", code="not_found")


async def _check(llm, req: LoRARequest) -> None:
    try:
        await llm.check_lora(req)
    except ValueError as e:
        raise OpenAIError(str(e), 400, param="lora_path") from e
    except Exception as e:  # noqa: BLE001 - a file the reader did not expect: still a 400
        logger.warning("LoRA adapter %s could not be read", req.lora_path, exc_info=True)
        raise OpenAIError(f"the LoRA adapter could not be read ({type(e).__name__}); give a "
                          "PEFT adapter folder", 400, param="lora_path") from e


def add_lora_routes(app: FastAPI, llm, registry: LoRARegistry, allow_updates: bool,
                    allowed: tuple[str, ...] = ()) -> None:
    """vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter (loads only from
    the resolved folders ``allowed``)."""

    def error(e: OpenAIError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status)

    def gate() -> None:
        if not allow_updates:
            raise OpenAIError("runtime LoRA updates are off: start the server with --enable-lora "
                              "--allow-runtime-lora-updating", 404, code="not_found")

    @app.post("/v1/load_lora_adapter",
              responses={**_TEXT, **_ERRORS},
              openapi_extra=_schema(["lora_name", "lora_path"], ("base_model_name",)))
    async def load_lora_adapter(request: Request):
        try:
            gate()
            body = await _body(request)
            name, path = _name(body, "lora_name"), _name(body, "lora_path")
            if registry.get(name) is not None or name in registry.reserved:
                raise OpenAIError(f"The lora adapter {short(name)} has already been loaded.",
                                  400, param="lora_name")
            base = body.get("base_model_name")
            if base is not None and not isinstance(base, str):
                raise OpenAIError("base_model_name must be a string", 400,
                                  param="base_model_name")
            req = registry.make(name, path, base)
            if not is_loadable(req.lora_path, allowed):
                raise _not_loadable(path)
            await _check(llm, req)
            try:
                registry.add(req)
            except ValueError as e:
                raise OpenAIError(str(e), 400, param="lora_name") from e
        except OpenAIError as e:
            return error(e)
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    @app.post("/v1/unload_lora_adapter",
              responses={**_TEXT, **_ERRORS}, openapi_extra=_schema(["lora_name"]))
    async def unload_lora_adapter(request: Request):
        try:
            gate()
            name = _name(await _body(request), "lora_name")
            if registry.remove(name) is None:
                raise OpenAIError(f"The lora adapter {short(name)} cannot be found.", 404,
                                  param="lora_name", code="not_found")
        except OpenAIError as e:
            return error(e)
        return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")

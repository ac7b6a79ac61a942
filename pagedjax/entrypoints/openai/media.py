"""Images in chat requests: OpenAI ``image_url`` content parts -> image bytes.

    fetcher = MediaFetcher.from_args(engine_args)
    data = await fetcher.fetch(url)            # bytes, or OpenAIError 400

* ``data:`` URLs (base64) always work;
* ``http(s)://`` URLs only from the hosts named in ``--allowed-media-domains``
  (checked before any connection is made; redirects are not followed), read
  with ``--media-fetch-timeout`` seconds and at most ``--max-media-bytes`` bytes;
* ``file://`` URLs only for files under ``--allowed-local-media-path``.

Anything else is a 400 naming ``messages``, as in vLLM: the server cannot be made
to fetch arbitrary internal addresses or read arbitrary files.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Optional

from pagedjax.entrypoints.openai.errors import OpenAIError


def _bad(message: str) -> OpenAIError:
    return OpenAIError(message, 400, param="messages")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        raise urllib.error.HTTPError(req.full_url, code, "redirects are not followed",
                                     headers, fp)


class MediaFetcher:
    def __init__(self, allowed_domains: Optional[str] = None,
                 allowed_local_path: Optional[str] = None, timeout: float = 10.0,
                 max_bytes: int = 20 * 2**20):
        self.allowed_domains = {d.strip().lower() for d in (allowed_domains or "").split(",")
                                if d.strip()}
        self.allowed_local_path = (os.path.realpath(allowed_local_path)
                                   if allowed_local_path else None)
        self.timeout = float(timeout)
        self.max_bytes = int(max_bytes)
        self._opener = urllib.request.build_opener(_NoRedirect)

    @classmethod
    def from_args(cls, args) -> "MediaFetcher":
        return cls(getattr(args, "allowed_media_domains", None),
                   getattr(args, "allowed_local_media_path", None),
                   getattr(args, "media_fetch_timeout", 10.0),
                   getattr(args, "max_media_bytes", 20 * 2**20))

    async def fetch(self, url: str) -> bytes:
        if not isinstance(url, str) or not url:
            raise _bad("image_url.url must be a non-empty string.")
        scheme = url.split(":", 1)[0].lower()
        if scheme == "data":
            return self._data_url(url)
        if scheme in ("http", "https"):
            host = (urllib.parse.urlsplit(url).hostname or "").lower()
            if host not in self.allowed_domains:
                raise _bad(f"image_url: the host {host!r} is not in --allowed-media-domains "
                           f"({', '.join(sorted(self.allowed_domains)) or 'none allowed'}); "
                           "send the image as a data: URL or ask the operator to allow it.")
            return await asyncio.get_running_loop().run_in_executor(None, self._http, url)
        if scheme == "file":
            return self._file(url)
        raise _bad(f"image_url: URL scheme {scheme!r} is not supported "
                   "(data:, http(s):// or file://).")

    def _data_url(self, url: str) -> bytes:
        head, sep, payload = url.partition(",")
        if not sep or ";base64" not in head:
            raise _bad("image_url: a data: URL must be base64 (data:image/png;base64,...).")
        if len(payload) * 3 // 4 > self.max_bytes:
            raise _bad(f"image_url: the image is larger than {self.max_bytes} bytes.")
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise _bad("image_url: the data: URL is not valid base64.") from None

    def _http(self, url: str) -> bytes:
        try:
            with self._opener.open(url, timeout=self.timeout) as r:
                data = r.read(self.max_bytes + 1)
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise _bad(f"image_url: could not fetch {url[:200]!r}: {e}") from None
        if len(data) > self.max_bytes:
            raise _bad(f"image_url: the image is larger than {self.max_bytes} bytes.")
        return data

    def _file(self, url: str) -> bytes:
        if self.allowed_local_path is None:
            raise _bad("image_url: file:// URLs need --allowed-local-media-path.")
        path = os.path.realpath(urllib.parse.unquote(urllib.parse.urlsplit(url).path))
        if os.path.commonpath([path, self.allowed_local_path]) != self.allowed_local_path:
            raise _bad("image_url: the file is outside --allowed-local-media-path.")
        if not os.path.isfile(path):
            raise _bad("image_url: no such file under --allowed-local-media-path.")
        if os.path.getsize(path) > self.max_bytes:
            raise _bad(f"image_url: the image is larger than {self.max_bytes} bytes.")
        with open(path, "rb") as f:
            return f.read()


def image_parts(chat_messages, placeholder: Optional[str]) -> tuple[list, list[str]]:
    """(messages with each ``image_url`` part replaced by ``placeholder`` text, the
    image URLs in order). ``placeholder`` None: the model takes no images (400)."""
    urls: list[str] = []
    out = []
    for m in chat_messages:
        content = getattr(m, "content", None)
        if not isinstance(content, list):
            out.append(m)
            continue
        parts = []
        for part in content:
            if part.get("type") != "image_url":
                parts.append(part)
                continue
            if placeholder is None:
                raise _bad("this model is text-only and takes no images; send text content "
                           "parts only.")
            iu = part.get("image_url")
            url = iu.get("url") if isinstance(iu, dict) else iu
            urls.append(url)
            parts.append({"type": "text", "text": placeholder})
        out.append(m.model_copy(update={"content": parts}))
    return out, urls

"""A loopback HTTP server answering in the Hugging Face hub's URL layout, so that
``huggingface_hub`` (pointed at it by ``HF_ENDPOINT``) downloads from it:

    GET  /api/models/{repo}[/revision/{rev}]         repo info (sha, siblings)
    GET  /api/models/{repo}/tree/{rev}[/{path}]      file listing
    HEAD /{repo}/resolve/{rev}/{file}                X-Repo-Commit, ETag, size
    GET  /{repo}/resolve/{rev}/{file}                the bytes

Errors carry the hub's ``X-Error-Code`` header (RepoNotFound, RevisionNotFound,
EntryNotFound, GatedRepo). A gated repository answers only to ``Authorization:
Bearer <token>``. Every file GET is counted in ``downloads``.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeHub:
    def __init__(self):
        self.repos: dict[str, dict] = {}  # repo -> {"refs", "commits", "token"}
        self.downloads: list[tuple[str, str]] = []  # (repo, file)
        self._server = None

    def publish(self, repo: str, folder: str, revision: str = "main",
                token: str | None = None) -> str:
        """Publish every file of ``folder`` as a new commit of ``repo`` at branch or tag
        ``revision`` (``token``: gated, readable only with it). Returns the commit sha."""
        files = {}
        for root, _, names in os.walk(folder):
            for n in names:
                p = os.path.join(root, n)
                with open(p, "rb") as f:
                    files[os.path.relpath(p, folder)] = f.read()
        sha = hashlib.sha1(repr(sorted((k, hashlib.sha1(v).hexdigest())
                                       for k, v in files.items())).encode()
                           + repo.encode() + revision.encode()).hexdigest()
        r = self.repos.setdefault(repo, {"refs": {}, "commits": {}, "token": token})
        r["refs"][revision] = sha
        r["commits"][sha] = files
        return sha

    @property
    def url(self) -> str:
        host, port = self._server.server_address
        return f"http://{host}:{port}"

    def start(self) -> "FakeHub":
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_HEAD(self):
                hub._answer(self, head=True)

            def do_GET(self):
                hub._answer(self, head=False)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # -- request handling -------------------------------------------------------------

    def _answer(self, h: BaseHTTPRequestHandler, head: bool) -> None:
        path = urllib.parse.urlparse(h.path).path
        parts = [urllib.parse.unquote(p) for p in path.strip("/").split("/")]
        try:
            if parts[:2] == ["api", "models"]:
                self._api(h, parts[2:])
            elif len(parts) >= 5 and parts[2] == "resolve":
                self._file(h, "/".join(parts[:2]), parts[3], "/".join(parts[4:]), head)
            else:
                self._error(h, 404, "EntryNotFound")
        except LookupError as e:
            self._error(h, *e.args)

    def _commit(self, h, repo: str, rev: str) -> tuple[str, dict]:
        r = self.repos.get(repo)
        if r is None:
            raise LookupError(401, "RepoNotFound")
        if r["token"] and h.headers.get("Authorization") != f"Bearer {r['token']}":
            raise LookupError(401, "GatedRepo")
        sha = r["refs"].get(rev, rev if rev in r["commits"] else None)
        if sha is None:
            raise LookupError(404, "RevisionNotFound")
        return sha, r["commits"][sha]

    def _api(self, h, rest: list[str]) -> None:
        repo = "/".join(rest[:2])
        if len(rest) >= 4 and rest[2] == "tree":
            sha, files = self._commit(h, repo, rest[3])
            sub = "/".join(rest[4:])
            body = [{"type": "file", "path": p, "size": len(b),
                     "oid": hashlib.sha1(b).hexdigest()}
                    for p, b in sorted(files.items()) if p.startswith(sub)]
        else:
            rev = rest[3] if len(rest) >= 4 and rest[2] == "revision" else "main"
            sha, files = self._commit(h, repo, rev)
            body = {"id": repo, "modelId": repo, "sha": sha, "private": False,
                    "gated": bool(self.repos[repo]["token"]),
                    "siblings": [{"rfilename": p} for p in sorted(files)]}
        self._send(h, 200, json.dumps(body).encode(), {"Content-Type": "application/json"})

    def _file(self, h, repo: str, rev: str, name: str, head: bool) -> None:
        sha, files = self._commit(h, repo, rev)
        if name not in files:
            raise LookupError(404, "EntryNotFound")
        data = files[name]
        headers = {"X-Repo-Commit": sha, "ETag": f'"{hashlib.sha1(data).hexdigest()}"',
                   "Content-Type": "application/octet-stream"}
        if not head:
            self.downloads.append((repo, name))
        self._send(h, 200, b"" if head else data, headers, length=len(data))

    @staticmethod
    def _error(h, status: int, code: str) -> None:
        FakeHub._send(h, status, json.dumps({"error": code}).encode(),
                      {"X-Error-Code": code, "Content-Type": "application/json"})

    @staticmethod
    def _send(h, status: int, body: bytes, headers: dict, length: int | None = None) -> None:
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body) if length is None else length))
        h.end_headers()
        if body:
            h.wfile.write(body)

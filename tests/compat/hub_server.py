"""A tiny local stand-in for the Hugging Face Hub's HTTP API: one gated repo, served over real HTTP.

Only what ``huggingface_hub.snapshot_download`` asks for: the revision and its file list
(``/api/models/{repo}/revision/{rev}``, ``/api/models/{repo}/tree/{rev}``) and each file (``/{repo}/resolve/{rev}/{file}``, HEAD and
GET); a dataset repo (``repo_type="dataset"``) under ``/api/datasets/…`` and ``/datasets/{repo}/resolve/…``. Requests without ``Authorization: Bearer <token>`` get 401, as a gated repo does.

``mode`` makes it a Hub in trouble: ``"silent"`` accepts every connection and never answers,
``"slow"`` answers each request after ``delay_s`` seconds, ``"404"`` answers 404 to everything.
"""
from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class HubServer:
    def __init__(self, repo_id: str, files: dict[str, bytes], token: str, repo_type: str = "model",
                 more: dict[tuple[str, str], dict[str, bytes]] | None = None, mode: str = "ok", delay_s: float = 0.0):
        """``repo_id``'s ``files``, and ``more`` repos keyed by (repo_type, repo_id)."""
        assert mode in ("ok", "silent", "slow", "404"), mode
        self.repo_id, self.files, self.token, self.mode, self.delay_s = repo_id, files, token, mode, delay_s
        repos = {(repo_type, repo_id): files, **(more or {})}
        self.requests: list[str] = []
        self.stopping = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_HEAD(self):
                self._serve(body=False)

            def do_GET(self):
                self._serve(body=True)

            def _serve(self, body: bool):
                server.requests.append(f"{self.command} {self.path}")
                if server.mode == "silent":  # the connection stays open, no byte ever comes
                    server.stopping.wait()
                    return
                if server.mode == "slow":
                    server.stopping.wait(server.delay_s)
                if server.mode == "404":
                    return self._reply(404, b'{"error": "not found"}', {"X-Error-Code": "RepoNotFound"}, body)
                if self.headers.get("authorization") != f"Bearer {server.token}":
                    return self._reply(401, b'{"error": "gated repo: log in"}', {"X-Error-Code": "GatedRepo"}, body)
                path = self.path.split("?")[0]
                for (kind, repo), files in repos.items():
                    api_root, file_root = ("/api/models", "") if kind == "model" else ("/api/datasets", "/datasets")
                    api = f"{api_root}/{repo}/revision/"
                    tree = f"{api_root}/{repo}/tree/"
                    resolve = f"{file_root}/{repo}/resolve/"
                    if path.startswith(tree):
                        entries = [{"type": "file", "path": name, "size": len(data),
                                    "oid": hashlib.sha1(data).hexdigest()} for name, data in files.items()]
                        return self._reply(200, json.dumps(entries).encode(), {"Content-Type": "application/json"},
                                           body)
                    if path.startswith(api):
                        info = {"id": repo, "sha": COMMIT, "siblings": [{"rfilename": name} for name in files]}
                        return self._reply(200, json.dumps(info).encode(), {"Content-Type": "application/json"}, body)
                    if path.startswith(resolve):
                        name = path[len(resolve):].split("/", 1)[1]
                        if name in files:
                            data = files[name]
                            etag = hashlib.sha1(data).hexdigest()
                            return self._reply(200, data, {"X-Repo-Commit": COMMIT, "ETag": f'"{etag}"'}, body)
                return self._reply(404, b'{"error": "not found"}', {"X-Error-Code": "EntryNotFound"}, body)

            def _reply(self, status: int, data: bytes, headers: dict[str, str], body: bool):
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if body:
                    self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "HubServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()  # release the silent / slow handlers
        self.httpd.shutdown()
        self.httpd.server_close()

#!/usr/bin/env python3
"""A model hub on loopback with the Hugging Face hub's URL layout, for the e2e suites: what
`gelo model fetch` (hf-hub) asks of huggingface.co, served from local folders.

  GET /api/models/<repo>/revision/<commit>      {"id", "sha", "siblings": [{"rfilename"}]}
  GET /<repo>/resolve/<commit>/<file>           the file; Range requests answered with 206,
                                                ETag (SHA-256 of the file), X-Repo-Commit

Each repository is served at the commits given for it and nowhere else: any other revision,
branch names included, is 404, as on the hub for an unknown commit. Every request line is
appended to --log, so a suite can check which revisions were asked for.

  hub.py --listen 127.0.0.1:0 --port-file F --log L \
         --repo sentence-transformers/all-MiniLM-L6-v2@<40 hex>=<folder> [--repo ...]
"""

import argparse
import hashlib
import json
import os
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote


def files_of(folder):
    out = []
    for root, _, names in os.walk(folder, followlinks=True):
        for n in names:
            path = os.path.join(root, n)
            out.append(os.path.relpath(path, folder).replace(os.sep, "/"))
    return sorted(out)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class Hub:
    def __init__(self, specs, log):
        self.repos = {}  # (repo, commit) -> folder
        for spec in specs:
            m = re.fullmatch(r"([^@=]+)@([0-9a-f]{40})=(.+)", spec)
            if not m:
                raise SystemExit(f"--repo {spec}: expected REPO@COMMIT=FOLDER")
            self.repos[(m[1], m[2])] = os.path.realpath(m[3])
        self.etags = {}
        self.log = log
        self.lock = threading.Lock()

    def etag(self, path):
        with self.lock:
            if path not in self.etags:
                self.etags[path] = sha256(path)
            return self.etags[path]

    def record(self, line):
        with self.lock, open(self.log, "a") as f:
            f.write(line + "\n")


def handler(hub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def send(self, code, body=b"", headers=()):
            self.send_response(code)
            for k, v in headers:
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_HEAD(self):
            self.do_GET()

        def do_GET(self):
            path = unquote(self.path.split("?", 1)[0])
            hub.record(f"{self.command} {path}")
            m = re.fullmatch(r"/api/models/(.+)/revision/([^/]+)", path)
            if m:
                folder = hub.repos.get((m[1], m[2]))
                if folder is None:
                    return self.send(404, b'{"error":"Revision Not Found"}', [("Content-Type", "application/json")])
                body = json.dumps({"id": m[1], "modelId": m[1], "sha": m[2],
                                   "siblings": [{"rfilename": f} for f in files_of(folder)]}).encode()
                return self.send(200, body, [("Content-Type", "application/json")])
            m = re.fullmatch(r"/(.+)/resolve/([^/]+)/(.+)", path)
            if m:
                folder = hub.repos.get((m[1], m[2]))
                file = os.path.join(folder, m[3]) if folder and ".." not in m[3].split("/") else None
                if not file or not os.path.isfile(file):
                    return self.send(404, b"Entry not found", [("X-Error-Code", "EntryNotFound")])
                return self.serve_file(file, m[2])
            self.send(404, b"not found")

        def serve_file(self, file, commit):
            size = os.path.getsize(file)
            start, end, code = 0, size - 1, 200
            r = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
            if r:
                start = int(r[1])
                end = min(int(r[2]), size - 1) if r[2] else size - 1
                code = 206
                if start >= size and size > 0:
                    return self.send(416, b"", [("Content-Range", f"bytes */{size}")])
            headers = [("ETag", f'"{hub.etag(file)}"'), ("X-Repo-Commit", commit),
                       ("Accept-Ranges", "bytes"), ("Content-Type", "application/octet-stream")]
            if code == 206:
                headers.append(("Content-Range", f"bytes {start}-{end}/{size}"))
            length = max(0, end - start + 1)
            self.send_response(code)
            for k, v in headers:
                self.send_header(k, v)
            self.send_header("Content-Length", str(length))
            self.end_headers()
            if self.command == "HEAD":
                return
            with open(file, "rb") as f:
                f.seek(start)
                left = length
                while left > 0:
                    chunk = f.read(min(left, 1 << 20))
                    if not chunk:
                        break
                    self.wfile.write(chunk)
                    left -= len(chunk)

    return Handler


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        # A client closing its kept-alive connection is not an error worth a traceback.
        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            super().handle_error(request, client_address)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--listen", default="127.0.0.1:0")
    p.add_argument("--port-file", required=True, help="the bound port is written here once serving")
    p.add_argument("--log", required=True, help="request lines are appended here")
    p.add_argument("--repo", action="append", default=[], help="REPO@COMMIT=FOLDER")
    a = p.parse_args()
    host, port = a.listen.rsplit(":", 1)
    server = Server((host, int(port)), handler(Hub(a.repo, a.log)))
    tmp = a.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(server.server_address[1]))
    os.replace(tmp, a.port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()

"""``kubectl create --dry-run=client --validate=false -o yaml -f FILE`` without a cluster.

kubectl maps each object's kind to a REST resource through the API server's discovery
documents even for a client-side dry run, so it needs a server to answer them. This serves
exactly those documents (static JSON naming the kinds ddlaunch renders) on 127.0.0.1; kubectl
then parses and decodes the manifest itself and prints the objects it would create. Every
request is recorded so a test can check that nothing but discovery GETs reached it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

# (group, version, kind, plural); "" is the core group.
KINDS = [
    ("", "v1", "Pod", "pods"),
    ("", "v1", "Service", "services"),
    ("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets"),
    ("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs"),
    ("scheduling.x-k8s.io", "v1alpha1", "PodGroup", "podgroups"),
]


def _resource_list(group_version: str) -> dict[str, Any]:
    resources = [
        {
            "name": plural,
            "singularName": kind.lower(),
            "namespaced": True,
            "kind": kind,
            "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
        }
        for group, version, kind, plural in KINDS
        if (f"{group}/{version}" if group else version) == group_version
    ]
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    }


def discovery_documents() -> dict[str, dict[str, Any]]:
    docs: dict[str, dict[str, Any]] = {
        "/version": {"major": "1", "minor": "32", "gitVersion": "v1.32.0", "platform": "linux"},
        "/api": {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []},
        "/api/v1": _resource_list("v1"),
    }
    groups = []
    for group, version, _, _ in KINDS:
        if not group or any(g["name"] == group for g in groups):
            continue
        gv = {"groupVersion": f"{group}/{version}", "version": version}
        groups.append({"name": group, "versions": [gv], "preferredVersion": gv})
        docs[f"/apis/{group}/{version}"] = _resource_list(f"{group}/{version}")
    docs["/apis"] = {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
    return docs


@contextmanager
def discovery_server() -> Iterator[tuple[str, list[tuple[str, str]]]]:
    """(server URL, the requests it received as (method, path))."""
    docs = discovery_documents()
    seen: list[tuple[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            path = self.path.split("?", 1)[0]
            seen.append((self.command, path))
            body = docs.get(path) if self.command == "GET" else None
            data = json.dumps(body or {"kind": "Status", "status": "Failure", "code": 404})
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data.encode())

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _answer

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def kubectl() -> str | None:
    return shutil.which("kubectl")


def dry_run_create(manifest: Path, home: Path) -> tuple[subprocess.CompletedProcess[str], list]:
    """Run the client-side dry run of ``manifest``; (the process, the requests served)."""
    with discovery_server() as (url, seen):
        kubeconfig = home / "kubeconfig"
        kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "offline", "cluster": {"server": url}}],
                    "users": [{"name": "me", "user": {}}],
                    "contexts": [
                        {"name": "offline", "context": {"cluster": "offline", "user": "me"}}
                    ],
                    "current-context": "offline",
                }
            )
        )
        env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "KUBECONFIG": str(kubeconfig)}
        proc = subprocess.run(
            [
                kubectl() or "kubectl",
                "create",
                "--dry-run=client",
                "--validate=false",
                "-o",
                "yaml",
                "-f",
                str(manifest),
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )
    return proc, seen

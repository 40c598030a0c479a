#!/usr/bin/env python3
"""Plays the kubelet for one namespace of the e2e control plane (there is no kubelet and no
container runtime here). For every Pod the controllers create it starts the container's
command — the real `gelo` binary for the image — with the pod spec's args and environment
(downward-API fields resolved), on a loopback address of its own, and writes the Pod's
status back through the API: its IP, Running, Ready once the readiness probe passes (an
HTTP GET answered 2xx or 3xx on the named or numbered container port, or a TCP port that
accepts; Ready once started when the container has no readiness probe). Deleted pods are
stopped and their deletion confirmed. An exited process is restarted under restartPolicy
Always (a Deployment's pods), and under OnFailure when it failed; otherwise the pod ends
Succeeded or Failed with the exit code, which is what a Job's controller counts.

What a container runtime would do by mounts is done by rewriting paths: a volume mount's
path in an argument or environment value becomes the host folder behind the volume
(persistentVolumeClaim: --claim NAME=DIR, or else a folder of its own under --work/claims,
as a dynamic provisioner would give; emptyDir: a fresh folder; secret: its keys written out), and `0.0.0.0:` in a listen address becomes the pod's IP. A pod's service
account token (automountServiceAccountToken) is given as a kubeconfig (KUBECONFIG) holding
a token of that account. Pod security contexts (the user to run as) are not applied.

Test hook: the annotation `e2e.gelo.dev/env` (JSON object) adds environment variables and
restarts the pod's process, e.g. a different mock launch measurement for a swapped image.
"""

import argparse
import base64
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ENV_HOOK = "e2e.gelo.dev/env"


def kubectl(args, kubeconfig, check=True, input=None):
    r = subprocess.run(["kubectl", "--kubeconfig", kubeconfig, *args], capture_output=True, text=True, input=input)
    if check and r.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


class Pod:
    def __init__(self, obj, ip, work):
        self.name = obj["metadata"]["name"]
        self.uid = obj["metadata"]["uid"]
        self.ip = ip
        self.dir = tempfile.mkdtemp(prefix=f"{self.name}-", dir=work)
        self.proc = None
        self.hook = None
        self.done = False
        self.ready = False
        self.probed = 0.0
        self.log = os.path.join(work, f"{self.name}.log")


class Kubelet:
    def __init__(self, a):
        self.a = a
        self.pods = {}
        self.next_ip = 10
        self.claims = dict(c.split("=", 1) for c in a.claim)

    def status(self, pod, phase, ready, exit_code=None):
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        cond = lambda t, s: {"type": t, "status": "True" if s else "False", "lastTransitionTime": now}
        body = {
            "status": {
                "phase": phase,
                "podIP": pod.ip,
                "podIPs": [{"ip": pod.ip}],
                "hostIP": "127.0.0.1",
                "startTime": now,
                "conditions": [cond("PodScheduled", True), cond("Initialized", True), cond("ContainersReady", ready), cond("Ready", ready)],
            }
        }
        if exit_code is not None:
            state = {"terminated": {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error",
                                    "startedAt": now, "finishedAt": now}}
            body["status"]["containerStatuses"] = [{"name": pod.container, "image": pod.image, "imageID": "", "ready": False,
                                                    "restartCount": 0, "started": False, "state": state}]
        kubectl(["-n", self.a.namespace, "patch", "pod", pod.name, "--subresource=status", "--type=merge", "-p", json.dumps(body)],
                self.a.kubeconfig, check=False)

    def volumes(self, obj, pod):
        """Host folder of each volume of the pod."""
        out = {}
        for v in obj["spec"].get("volumes", []):
            name = v["name"]
            if "emptyDir" in v:
                out[name] = os.path.join(pod.dir, "emptydir-" + name)
                os.makedirs(out[name], exist_ok=True)
            elif "persistentVolumeClaim" in v:
                claim = v["persistentVolumeClaim"]["claimName"]
                if claim not in self.claims:
                    self.claims[claim] = os.path.join(self.a.work, "claims", claim)
                    os.makedirs(self.claims[claim], exist_ok=True)
                out[name] = self.claims[claim]
            elif "projected" in v:
                # The service account token volume the ServiceAccount admission adds.
                d = os.path.join(pod.dir, "projected-" + name)
                os.makedirs(d, exist_ok=True)
                for src in v["projected"].get("sources", []):
                    if "serviceAccountToken" in src:
                        account = obj["spec"].get("serviceAccountName", "default")
                        token = kubectl(["-n", self.a.namespace, "create", "token", account, "--duration=1h"], self.a.kubeconfig).strip()
                        with open(os.path.join(d, src["serviceAccountToken"]["path"]), "w") as f:
                            f.write(token)
                    elif "configMap" in src:
                        cm = json.loads(kubectl(["-n", self.a.namespace, "get", "configmap", src["configMap"]["name"], "-o", "json"],
                                                self.a.kubeconfig))
                        for item in src["configMap"].get("items", []):
                            with open(os.path.join(d, item["path"]), "w") as f:
                                f.write((cm.get("data") or {}).get(item["key"], ""))
                    elif "downwardAPI" in src:
                        for item in src["downwardAPI"].get("items", []):
                            if item.get("fieldRef", {}).get("fieldPath") == "metadata.namespace":
                                with open(os.path.join(d, item["path"]), "w") as f:
                                    f.write(obj["metadata"]["namespace"])
                out[name] = d
            elif "secret" in v:
                secret = json.loads(kubectl(["-n", self.a.namespace, "get", "secret", v["secret"]["secretName"], "-o", "json"],
                                            self.a.kubeconfig))
                d = os.path.join(pod.dir, "secret-" + name)
                os.makedirs(d, exist_ok=True)
                for k, b64 in (secret.get("data") or {}).items():
                    with open(os.path.join(d, k), "wb") as f:
                        f.write(base64.b64decode(b64))
                out[name] = d
        return out

    def start(self, obj, pod):
        c = obj["spec"]["containers"][0]
        pod.container, pod.image = c["name"], c.get("image", "")
        pod.restart = obj["spec"].get("restartPolicy", "Always")
        pod.probed_port = "readinessProbe" in c
        pod.probe_spec = c.get("readinessProbe") or {}
        pod.ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
        vols = self.volumes(obj, pod)
        mounts = []
        for m in c.get("volumeMounts", []):
            host = vols.get(m["name"])
            if host is None:
                raise RuntimeError(f"{pod.name}: volume {m['name']} has no host folder (pass --claim)")
            if m.get("subPath"):
                host = os.path.join(host, m["subPath"])
            mounts.append((m["mountPath"].rstrip("/"), host))
        mounts.sort(key=lambda x: -len(x[0]))

        def rewrite(s):
            s = s.replace("0.0.0.0:", f"{pod.ip}:")
            for path, host in mounts:
                if s == path or s.startswith(path + "/"):
                    return host + s[len(path):]
            return s

        env = {"PATH": os.environ.get("PATH", ""), "HOME": pod.dir}
        for e in c.get("env", []):
            if "value" in e:
                env[e["name"]] = rewrite(e["value"])
            elif "valueFrom" in e and "fieldRef" in e["valueFrom"]:
                field = e["valueFrom"]["fieldRef"]["fieldPath"]
                env[e["name"]] = {"metadata.name": obj["metadata"]["name"], "metadata.namespace": obj["metadata"]["namespace"],
                                  "status.podIP": pod.ip}.get(field, "")
        if obj["spec"].get("automountServiceAccountToken") and obj["spec"].get("serviceAccountName"):
            env["KUBECONFIG"] = self.token_kubeconfig(obj["spec"]["serviceAccountName"], pod)
        hook = (obj["metadata"].get("annotations") or {}).get(ENV_HOOK)
        if hook:
            env.update(json.loads(hook))
        pod.hook = hook
        args = [rewrite(x) for x in (c.get("command") or []) + (c.get("args") or [])]
        log = open(pod.log, "ab")
        log.write(f"--- start: gelo {' '.join(args)}\n".encode())
        log.flush()
        pod.proc = subprocess.Popen([self.a.gelo, *args], env=env, cwd=pod.dir, stdout=log, stderr=log)
        pod.ready = False
        self.status(pod, "Running", False)

    def token_kubeconfig(self, account, pod):
        token = kubectl(["-n", self.a.namespace, "create", "token", account, "--duration=1h"], self.a.kubeconfig).strip()
        view = json.loads(kubectl(["config", "view", "--minify", "--raw", "-o", "json"], self.a.kubeconfig))
        cluster = view["clusters"][0]["cluster"]
        path = os.path.join(pod.dir, "serviceaccount.kubeconfig")
        with open(path, "w") as f:
            json.dump({"apiVersion": "v1", "kind": "Config",
                       "clusters": [{"name": "c", "cluster": {"server": cluster["server"],
                                                              "certificate-authority": cluster["certificate-authority"]}}],
                       "users": [{"name": account, "user": {"token": token}}],
                       "contexts": [{"name": "c", "context": {"cluster": "c", "user": account, "namespace": self.a.namespace}}],
                       "current-context": "c"}, f)
        return path

    def stop(self, pod):
        if pod.proc and pod.proc.poll() is None:
            pod.proc.send_signal(signal.SIGTERM)
            try:
                pod.proc.wait(10)
            except subprocess.TimeoutExpired:
                pod.proc.kill()
                pod.proc.wait()

    def probe(self, pod):
        spec = getattr(pod, "probe_spec", {})
        if "httpGet" in spec:
            get = spec["httpGet"]
            port = get.get("port")
            port = pod.ports.get(port, port) if isinstance(port, str) else port
            try:
                with urllib.request.urlopen(f"http://{pod.ip}:{port}{get.get('path', '/')}", timeout=0.5) as r:
                    return 200 <= r.status < 400
            except (OSError, ValueError):
                return False
        port = spec.get("tcpSocket", {}).get("port", self.a.port)
        port = pod.ports.get(port, self.a.port) if isinstance(port, str) else port
        try:
            with socket.create_connection((pod.ip, port), timeout=0.5):
                return True
        except OSError:
            return False

    def step(self):
        items = json.loads(kubectl(["-n", self.a.namespace, "get", "pods", "-o", "json"], self.a.kubeconfig))["items"]
        seen = set()
        for obj in items:
            uid = obj["metadata"]["uid"]
            seen.add(uid)
            pod = self.pods.get(uid)
            if obj["metadata"].get("deletionTimestamp"):
                if pod:
                    self.stop(pod)
                    del self.pods[uid]
                kubectl(["-n", self.a.namespace, "delete", "pod", obj["metadata"]["name"], "--grace-period=0", "--force", "--wait=false"],
                        self.a.kubeconfig, check=False)
                continue
            if pod is None:
                pod = Pod(obj, f"127.0.0.{self.next_ip}", self.a.work)
                self.next_ip += 1
                self.start(obj, pod)
                self.pods[uid] = pod
                continue
            if pod.done:
                continue
            hook = (obj["metadata"].get("annotations") or {}).get(ENV_HOOK)
            code = pod.proc.poll()
            if code is not None and (pod.restart == "Never" or (pod.restart == "OnFailure" and code == 0)):
                pod.done = True
                self.status(pod, "Succeeded" if code == 0 else "Failed", False, exit_code=code)
                continue
            if hook != pod.hook or code is not None:
                self.stop(pod)
                self.start(obj, pod)
                continue
            # Like the pod's probe period (5 s) once ready; fast until then.
            if pod.ready and time.monotonic() - pod.probed < 5:
                continue
            pod.probed = time.monotonic()
            ready = self.probe(pod) if pod.probed_port else True
            if ready != pod.ready:
                pod.ready = ready
                self.status(pod, "Running", ready)
        for uid in [u for u in self.pods if u not in seen]:
            self.stop(self.pods.pop(uid))

    def run(self):
        stop = []
        signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
        while not stop:
            try:
                self.step()
            except Exception as e:  # the API server restarting, a pod deleted mid-step
                print(f"kubelet: {e}", file=sys.stderr, flush=True)
            time.sleep(0.5)
        for pod in self.pods.values():
            self.stop(pod)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--namespace", required=True)
    p.add_argument("--gelo", required=True, help="the binary every container image stands for")
    p.add_argument("--claim", action="append", default=[], help="NAME=DIR: the folder behind a PersistentVolumeClaim")
    p.add_argument("--port", type=int, default=50051, help="a TCP readiness probe's port when it names none")
    p.add_argument("--work", required=True, help="folder for the pods' files and logs")
    a = p.parse_args()
    os.makedirs(a.work, exist_ok=True)
    Kubelet(a).run()


if __name__ == "__main__":
    main()

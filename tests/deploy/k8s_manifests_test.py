#!/usr/bin/python3
"""deploy/k8s (docs/deploy-k8s.md), checked with no cluster and no network (ctest deploy_k8s_manifests).

1. The kustomization renders (tests/deploy/k8s_render.py) from keys made as the docs say
   (`strata keygen deploy/k8s/keys`, a token file), and every object passes the Kubernetes v1.29.0
   standalone-strict schema of its kind and the cross-reference checks.
2. The checker has teeth: each of a set of broken copies (a misspelt field, a wrong type, a Service
   that selects nothing, a probe on a port the container lacks, a mount of a missing volume, a
   missing Secret, an undefined $(VAR), another image) is rejected with the expected message, and
   a kustomization key the renderer does not implement is refused.
3. The pods' entry points, as the manifests write them, run: each pod's volumes become
   directories (a Secret volume holds the rendered Secret's files with its defaultMode, a claim
   template one directory per pod), init containers run to completion, then the coordinator and
   2 workers start from build/bin with the manifests' command, args and env ($(POD_NAME),
   $(POD_IP)). The only rewrites, as a cluster would do them: mount paths -> those directories,
   container ports -> free local ports, the Service name strata-coordinator -> 127.0.0.1 and its
   port, the pod IP -> 127.0.0.1; and cuda:0 -> cpu (no GPU here). Then: the coordinator's
   probes answer 200 as the kubelet asks them; both workers register under their pod names; a
   dp=2 run submitted with the coordinator container's keys (as `kubectl exec` does) trains to the
   end with its checkpoints committed; the CLI from outside with the keygen directory (as through
   `kubectl port-forward`) sees it; the coordinator restarted on the same state volume still has
   it; a worker killed and started again on its claim with new ports (a new pod IP) comes back as
   itself with its checkpoints complete, and another dp=2 run trains with it. And the init
   container is needed: the secret volume's keys as mounted are refused.

Exit 77 (ctest: skipped) after parts 1-2 when build/bin has no binaries (part 3 needs them).
Environment: STRATA_BUILD_DIR (default build/), STRATA_KEEP_TEST_DIRS=1 keeps the temp dir.
"""
import base64
import copy
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k8s_render  # noqa: E402

REPO = k8s_render.REPO
BUILD = os.environ.get("STRATA_BUILD_DIR", os.path.join(REPO, "build"))
BIN = os.path.join(BUILD, "bin")
T0 = time.time()


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def phase(name):
    print(f"PHASE {name:<50} {time.time() - T0:6.1f} s", flush=True)


def find(docs, kind, name):
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def container(docs, kind, name, cname):
    return next(c for c in k8s_render.pod_specs(find(docs, kind, name))["containers"] if c["name"] == cname)


# ---- 1. render and validate ---------------------------------------------------------------------

def render_with_keys(work):
    kdir = os.path.join(work, "k8s")
    shutil.copytree(os.path.join(REPO, "deploy", "k8s"), kdir, ignore=shutil.ignore_patterns("keys", "http.token"))
    try:
        k8s_render.render(kdir)
        fail("the kustomization rendered with no keys: its Secrets would be empty")
    except k8s_render.RenderError as e:
        if "strata keygen" not in str(e):
            fail(f"a missing key file should say to run strata keygen: {e}")
    if os.path.exists(os.path.join(BIN, "strata")):
        subprocess.run([os.path.join(BIN, "strata"), "keygen", os.path.join(kdir, "keys")], check=True, stdout=subprocess.DEVNULL)
    else:  # parts 1-2 only need files of the right names
        os.makedirs(os.path.join(kdir, "keys"))
        for f in ("coordinator.key", "coordinator.pub", "client.key", "client.pub", "authorized_keys"):
            with open(os.path.join(kdir, "keys", f), "w") as out:
                out.write("placeholder\n")
    with open(os.path.join(kdir, "http.token"), "w") as f:
        f.write(os.urandom(16).hex())
    return kdir, k8s_render.render(kdir)


def check_rendered(docs):
    image = k8s_render.compose_image_name()
    if image != "strata":
        fail(f"deploy/docker/compose.yaml's default image is {image!r}; the test expects the name 'strata'")
    found = k8s_render.problems(copy.deepcopy(docs), expect_image=image)
    if found:
        fail("the rendered manifests have problems:\n  " + "\n  ".join(found))
    kinds = sorted(f"{d['kind']}/{d['metadata']['name']}" for d in docs)
    print("rendered and valid:", ", ".join(kinds))
    # What the deployment relies on, beyond validity.
    worker = find(docs, "StatefulSet", "strata-worker")
    w = container(docs, "StatefulSet", "strata-worker", "worker")
    if w["resources"]["limits"].get("nvidia.com/gpu") != 1:
        fail("a worker pod does not take exactly one GPU (resources.limits nvidia.com/gpu: 1)")
    if [t["metadata"]["name"] for t in worker["spec"].get("volumeClaimTemplates", [])] != ["store"]:
        fail("the workers' stores are not a volumeClaimTemplate")
    if "--coordinator=tcp://strata-coordinator:5555" not in w["args"]:
        fail("workers do not reach the coordinator through the Service strata-coordinator")
    if not any(a.startswith("--data-address=tcp://$(POD_IP):") for a in w["args"]):
        fail("workers do not advertise their pod IP as data address")
    keys = {s["metadata"]["name"]: set(s["data"]) for s in docs if s["kind"] == "Secret"}
    if "coordinator.key" in keys.get("strata-worker-keys", {"coordinator.key"}):
        fail("the workers' key Secret holds coordinator.key (docs/security.md: the coordinator's only)")
    c = container(docs, "Deployment", "strata-coordinator", "coordinator")
    for probe in ("readinessProbe", "livenessProbe"):
        if "httpGet" not in c.get(probe, {}):
            fail(f"the coordinator has no HTTP {probe} on its dashboard")


# ---- 2. broken copies are rejected --------------------------------------------------------------

def check_rejects(docs, kdir):
    def mutate(what, edit, expect):
        broken = copy.deepcopy(docs)
        edit(broken)
        found = k8s_render.problems(broken, expect_image="strata")
        if not any(expect in p for p in found):
            fail(f"the checker accepted a broken manifest ({what}); expected a problem containing {expect!r}, got {found}")
        print(f"rejected as expected: {what}: {next(p for p in found if expect in p)}")

    def coord(d):
        return k8s_render.pod_specs(find(d, "Deployment", "strata-coordinator"))

    def worker(d):
        return k8s_render.pod_specs(find(d, "StatefulSet", "strata-worker"))

    mutate("misspelt field containerport",
           lambda d: coord(d)["containers"][0]["ports"][0].update(containerport=coord(d)["containers"][0]["ports"][0].pop("containerPort")),
           "'containerport' was unexpected")
    mutate("replicas as a string", lambda d: find(d, "StatefulSet", "strata-worker")["spec"].update(replicas="2"),
           "replicas: '2' is not of type")
    mutate("Service selector matching no pod",
           lambda d: find(d, "Service", "strata-coordinator")["spec"]["selector"].update({"app.kubernetes.io/component": "coordinatr"}),
           "selects no pod")
    mutate("Service targetPort not a container port",
           lambda d: find(d, "Service", "strata-coordinator")["spec"]["ports"][1].update(targetPort="dashboard"),
           "not a container port")
    mutate("probe on a port the container lacks",
           lambda d: coord(d)["containers"][0]["livenessProbe"]["httpGet"].update(port=9090), "livenessProbe port 9090")
    mutate("volumeMount of a missing volume",
           lambda d: worker(d)["containers"][0]["volumeMounts"].append({"name": "scratch", "mountPath": "/scratch"}),
           "volumeMount scratch names no volume")
    mutate("Secret that is not rendered",
           lambda d: next(v for v in worker(d)["volumes"] if "secret" in v)["secret"].update(secretName="strata-keys"),
           "Secret strata-keys, which is not rendered")
    mutate("undefined $(VAR) in args", lambda d: worker(d)["containers"][0]["args"].append("--host=$(NODE_NAME)"),
           "$(NODE_NAME)")
    mutate("another image", lambda d: coord(d)["containers"][0].update(image="strata-coordinator:0.1.0"),
           "different images")
    mutate("selector not matching the pod labels",
           lambda d: find(d, "StatefulSet", "strata-worker")["spec"]["template"]["metadata"]["labels"].pop("app.kubernetes.io/component"),
           "does not match its pod labels")
    with open(os.path.join(kdir, "kustomization.yaml"), "a") as f:
        f.write("namePrefix: prod-\n")
    try:
        k8s_render.render(kdir)
        fail("the renderer accepted namePrefix, which it does not implement")
    except k8s_render.RenderError as e:
        print(f"rejected as expected: unimplemented kustomization key: {e}")


# ---- 3. the entry points ------------------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Pod:
    """A pod of a workload on this machine: its volumes as directories, its ports mapped."""

    def __init__(self, docs, workload, name, root, shared):
        self.docs, self.workload, self.name = docs, workload, name
        self.spec = k8s_render.pod_specs(workload)
        self.env = {"POD_NAME": name, "POD_IP": "127.0.0.1"}
        self.dirs = {}  # volume name -> directory
        self.ports = {}  # containerPort -> local port
        self.procs = []
        for v in self.spec.get("volumes") or []:
            if "persistentVolumeClaim" in v:  # one claim, one directory, whichever pod mounts it
                d = os.path.join(shared, "pvc", v["persistentVolumeClaim"]["claimName"])
            else:
                d = os.path.join(root, name, "volumes", v["name"])
            os.makedirs(d, exist_ok=True)
            if "secret" in v:
                secret = find(docs, "Secret", v["secret"]["secretName"])
                for key, value in secret["data"].items():
                    path = os.path.join(d, key)
                    with open(path, "wb") as f:
                        f.write(base64.b64decode(value))
                    os.chmod(path, v["secret"].get("defaultMode", 0o644))
            self.dirs[v["name"]] = d
        for t in workload["spec"].get("volumeClaimTemplates") or []:  # PVC <template>-<pod>
            d = os.path.join(shared, "pvc", f"{t['metadata']['name']}-{name}")
            os.makedirs(d, exist_ok=True)
            self.dirs[t["metadata"]["name"]] = d
        for c in k8s_render.containers_of(self.spec):
            for p in c.get("ports") or []:
                self.ports[p["containerPort"]] = free_port()

    def host_path(self, c, path):
        """Where `path` inside container c is on this machine (its longest matching mount)."""
        for m in sorted(c.get("volumeMounts") or [], key=lambda m: -len(m["mountPath"])):
            mp = m["mountPath"]
            if path == mp or path.startswith(mp + "/"):
                return self.dirs[m["name"]] + path[len(mp):]
        return None

    def argv(self, c, pods):
        env = dict(self.env)
        for e in c.get("env") or []:
            field = e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
            env[e["name"]] = {"metadata.name": self.name, "status.podIP": "127.0.0.1"}.get(field, e.get("value", ""))
        out = []
        for arg in (c.get("command") or []) + (c.get("args") or []):
            arg = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), arg)
            arg = arg.replace("--device=cuda:0", "--device=cpu")
            arg = self.rewrite_endpoints(c, arg, pods)
            arg = re.sub(r"(?<![\w.-])(/[\w./-]*)", lambda m: self.host_path(c, m.group(1)) or m.group(1), arg)
            out.append(arg)
        if out[0].startswith("strata"):
            out[0] = os.path.join(BIN, out[0])
        return out

    def rewrite_endpoints(self, c, arg, pods):
        def endpoint(m):
            host, port = m.group(1), int(m.group(2))
            if host in ("0.0.0.0", "127.0.0.1") and port in self.ports:
                # Only the port moves: a wildcard bind stays one (the dashboard treats loopback
                # binds differently, and in the pod it is not one).
                return f"{host}:{self.ports[port]}"
            svc = next((d for d in self.docs if d["kind"] == "Service" and d["metadata"]["name"] == host), None)
            if svc is None:
                fail(f"{self.name}: {arg} names {host}:{port}, neither one of its own ports nor a Service")
            sp = next((p for p in svc["spec"]["ports"] if p["port"] == port), None)
            if sp is None:
                fail(f"{self.name}: {arg}: Service {host} has no port {port}")
            for pod in pods:
                if k8s_render.selects(svc["spec"]["selector"], pod.workload["spec"]["template"]["metadata"]["labels"]):
                    for pc in pod.spec["containers"]:
                        for p in pc.get("ports") or []:
                            if sp.get("targetPort", port) in (p["containerPort"], p.get("name")):
                                return f"127.0.0.1:{pod.ports[p['containerPort']]}"
            fail(f"{self.name}: {arg}: Service {host} port {port} leads to no running pod's port")
        # tcp://HOST:PORT anywhere, or --flag=HOST:PORT (the dashboard's --http).
        return re.sub(r"(?:(?<=tcp://)|(?<==))([\w.-]+):(\d+)\b", endpoint, arg)

    def start(self, pods, logdir):
        for c in self.spec.get("initContainers") or []:
            r = subprocess.run(self.argv(c, pods), capture_output=True, text=True)
            if r.returncode != 0:
                fail(f"{self.name}: init container {c['name']} failed ({r.returncode}): {r.stderr}")
        for c in self.spec["containers"]:
            argv = self.argv(c, pods)
            print(f"{self.name}/{c['name']}: {' '.join(argv)}")
            log = open(os.path.join(logdir, f"{self.name}-{c['name']}.log"), "ab")
            self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def stop(self, sig=signal.SIGTERM):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(sig)
        for p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []


def http_status(url):
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def run_entry_points(docs, kdir, work):
    shared = os.path.join(work, "cluster")
    logdir = os.path.join(work, "logs")
    os.makedirs(logdir)
    coord_w = find(docs, "Deployment", "strata-coordinator")
    worker_w = find(docs, "StatefulSet", "strata-worker")
    coord = Pod(docs, coord_w, "strata-coordinator-0", os.path.join(work, "pods"), shared)
    workers = [Pod(docs, worker_w, f"strata-worker-{i}", os.path.join(work, "pods"), shared)
               for i in range(worker_w["spec"]["replicas"])]
    pods = [coord] + workers

    def logs():
        for f in sorted(os.listdir(logdir)):
            with open(os.path.join(logdir, f), errors="replace") as fh:
                print(f"== {f}\n" + "".join(fh.readlines()[-25:]))

    try:
        # The secret volume's files as mounted (defaultMode 0440) are refused: hence install-keys.
        c = coord.spec["containers"][0]
        argv = coord.argv(c, pods)
        secret_dir = coord.dirs[next(v["name"] for v in coord.spec["volumes"] if "secret" in v
                                     and v["secret"]["secretName"] == "strata-coordinator-keys")]
        argv = [re.sub(r"^--keys=.*", f"--keys={secret_dir}", a) for a in argv]
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=20)
        except subprocess.TimeoutExpired:
            fail("the coordinator started with the keys straight from the secret volume (0440): the init container "
                 "would be unnecessary, or the key check changed")
        if r.returncode == 0 or "readable by other users" not in r.stdout + r.stderr:
            fail(f"the coordinator took the keys straight from the secret volume (rc {r.returncode}): the init container "
                 f"would be unnecessary, or the check changed: {r.stdout}{r.stderr}")
        phase("keys as the secret volume mounts them: refused")

        coord.start(pods, logdir)
        # The kubelet's probes: HTTP GET on the pod's address, 200-399 is success.
        deadline = time.time() + 20
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            get = c[probe]["httpGet"]
            port = next(p["containerPort"] for p in c["ports"] if get["port"] in (p["containerPort"], p.get("name")))
            url = f"http://127.0.0.1:{coord.ports[port]}{get['path']}"
            while not (200 <= (http_status(url) or 0) < 400):
                if time.time() > deadline or coord.procs[0].poll() is not None:
                    logs()
                    fail(f"the coordinator's {probe} ({url}) did not succeed")
                time.sleep(0.2)
        api = f"http://127.0.0.1:{coord.ports[8080]}/api/state"
        if http_status(api) != 401:
            fail(f"{api} answered {http_status(api)} without the token; the dashboard beyond loopback must want it")
        phase("coordinator up, its probes answer 200")

        for w in workers:
            w.start(pods, logdir)
        outside_keys = os.path.join(kdir, "keys")  # the CLI outside the cluster: the keygen directory
        control = f"tcp://127.0.0.1:{coord.ports[5555]}"  # what `kubectl port-forward svc/strata-coordinator 5555` gives

        def cli(*args, keys=outside_keys, timeout=60):
            return subprocess.run([os.path.join(BIN, "strata"), "--cluster", control, "--keys", keys, *args],
                                  capture_output=True, text=True, timeout=timeout)

        deadline = time.time() + 30
        while True:
            r = cli("workers", "--json")
            listed = json.loads(r.stdout) if r.returncode == 0 else []
            # Each under its pod name, and as a host of its own (--host): checkpoints get copied.
            names = sorted(x["worker_id"] for x in listed if x["state"] == "idle" and x["host"] == x["worker_id"])
            if names == [w.name for w in workers]:
                break
            if time.time() > deadline:
                logs()
                fail(f"workers {[w.name for w in workers]} did not register idle under their pod names: {r.stdout}{r.stderr}")
            time.sleep(0.3)
        phase(f"{len(workers)} workers registered as {', '.join(names)}")

        # A run, submitted inside the coordinator's container (kubectl exec): its keys, its /data.
        data = coord.host_path(c, "/data")
        shutil.copy("/usr/share/common-licenses/GPL-3", os.path.join(data, "corpus.txt"))
        spec = os.path.join(work, "run.toml")
        with open(spec, "w") as f:
            f.write(f"""name = "k8s-tiny"
[model]
layers = 2
hidden = 32
heads = 4
vocab = 256
sequence = 32
[data]
path = "{data}/corpus.txt"
[train]
steps = 4
global_batch = 8
lr = 3e-3
seed = 7
checkpoint_every = 2
[parallel]
dp = 2
[worker]
threads = 1
""")
        inside_keys = coord.host_path(c, "/run/strata/keys")
        r = cli("submit", spec, "--follow", keys=inside_keys, timeout=120)
        if r.returncode != 0:
            logs()
            fail(f"submit --follow failed ({r.returncode}): {r.stdout}{r.stderr}")
        run = r.stdout.splitlines()[0]
        status = json.loads(cli("status", run, "--json").stdout)
        if status.get("state") != "finished" or status.get("step") != 4:
            fail(f"run {run} did not finish at step 4: {status}")
        if re.search(r"checkpoint-incomplete|checkpoint-not-copied", r.stdout + r.stderr):
            fail(f"a checkpoint of {run} was not committed whole, with its copies: {r.stdout}{r.stderr}")
        cps = json.loads(cli("checkpoints", run, "--json").stdout)
        if [(x["step"], x["state"]) for x in cps] != [(2, "complete"), (4, "complete")]:
            fail(f"expected complete checkpoints at steps 2 and 4, got {[(x['step'], x['state']) for x in cps]}")
        # Each rank's shard is in its own pod's claim (PVC store-strata-worker-N).
        stores = sorted(sh["store_path"] for sh in cps[-1]["shards"])
        expect = sorted(w.host_path(w.spec["containers"][0], f"/var/lib/strata/worker/{w.name}") for w in workers)
        if stores != expect:
            fail(f"the shards of step 4 are in {stores}, not in the workers' own volumes {expect}")
        phase(f"dp=2 run {run} finished, 2 checkpoints")

        # The coordinator pod replaced (new process, same state volume): the run is still there.
        coord.stop()
        coord.start(pods, logdir)
        deadline = time.time() + 30
        while True:
            r = cli("status", run, "--json", timeout=20)
            if r.returncode == 0 and json.loads(r.stdout).get("state") == "finished":
                break
            if time.time() > deadline:
                logs()
                fail(f"after a coordinator restart on its state volume, run {run} is gone: {r.stdout}{r.stderr}")
            time.sleep(0.3)
        if [(x["step"], x["state"]) for x in json.loads(cli("checkpoints", run, "--json").stdout)] != [(2, "complete"), (4, "complete")]:
            fail(f"after a coordinator restart the checkpoints of {run} are not both complete")
        phase("coordinator restarted on its volume: the run and its checkpoints are kept")

        # A worker pod killed and started again (same name, same claim): it comes back as itself
        # and its store still holds its shards (a lost shard would read missing-shard).
        workers[0].stop(signal.SIGKILL)
        # A pod that comes back elsewhere gets a new IP: here, new ports for its data endpoints.
        workers[0].ports = {p: free_port() for p in workers[0].ports}
        workers[0].start(pods, logdir)
        deadline = time.time() + 30
        while True:
            r = cli("workers", "--json")
            listed = {x["worker_id"]: x for x in json.loads(r.stdout)} if r.returncode == 0 else {}
            back = listed.get(workers[0].name, {})
            # The new process (its pid), not the killed one the coordinator has not missed yet.
            if back.get("pid") == workers[0].procs[0].pid and back.get("state") == "idle" and len(listed) == len(workers):
                break
            if time.time() > deadline:
                logs()
                fail(f"{workers[0].name} did not come back as itself after a restart: {r.stdout}{r.stderr}")
            time.sleep(0.3)
        if [(x["step"], x["state"]) for x in json.loads(cli("checkpoints", run, "--json").stdout)] != [(2, "complete"), (4, "complete")]:
            fail(f"after {workers[0].name} restarted, the checkpoints of {run} are not both complete")
        phase(f"{workers[0].name} killed and restarted on its claim: back as itself, checkpoints complete")

        # Its peers reach it at the address it registered this time: another dp=2 run trains.
        with open(spec) as f:
            again = f.read().replace('name = "k8s-tiny"', 'name = "k8s-again"').replace("steps = 4", "steps = 2")
        with open(spec, "w") as f:
            f.write(again)
        r = cli("submit", spec, "--follow", keys=inside_keys, timeout=120)
        second = r.stdout.splitlines()[0] if r.returncode == 0 else ""
        if r.returncode != 0 or json.loads(cli("status", second, "--json").stdout).get("state") != "finished":
            logs()
            fail(f"a dp=2 run after {workers[0].name} came back with a new address did not finish: {r.stdout}{r.stderr}")
        phase(f"dp=2 run {second} finished with the restarted worker's new address")
    finally:
        for p in pods:
            p.stop()


def main():
    work = tempfile.mkdtemp(prefix="strata-k8s-test.")
    try:
        kdir, docs = render_with_keys(work)
        check_rendered(docs)
        phase("rendered, schema and cross-reference checks")
        check_rejects(docs, shutil.copytree(kdir, os.path.join(work, "k8s-broken")))
        phase("broken manifests rejected")
        if not all(os.access(os.path.join(BIN, b), os.X_OK) for b in ("strata", "strata-coordinator", "strata-worker")):
            print(f"SKIP: {BIN} has no strata binaries; the entry points were not run (build first)")
            return 77
        run_entry_points(docs, kdir, work)
        print("PASS")
        return 0
    finally:
        if os.environ.get("STRATA_KEEP_TEST_DIRS"):
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

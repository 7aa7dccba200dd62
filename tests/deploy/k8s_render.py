#!/usr/bin/python3
"""Renders deploy/k8s/kustomization.yaml and checks the result, with no cluster and no network.

  k8s_render.py DIR            prints the rendered manifests (what `kubectl apply -k DIR` would send)
  k8s_render.py --check DIR    also validates them (below); exit 1 with every problem listed

Only the kustomize features deploy/k8s uses are implemented (`resources`, `images`,
`secretGenerator` with `files`, `generatorOptions.disableNameSuffixHash: true`); any other key is
refused rather than silently ignored, so a manifest change that needs more fails here first.
Debian 12 packages no kustomize/kubectl, hence this renderer.

Checks (problems() returns them as sentences):
  - each object against the Kubernetes v1.29.0 standalone-strict JSON schema of its kind
    (tests/deploy/k8s-schemas/: unknown or misplaced fields and wrong types are errors);
  - what a schema cannot see: a workload's selector matches its pod labels; every Service selects
    some pod and its target ports are container ports of those pods; a StatefulSet's serviceName
    is a headless Service selecting its pods; every volumeMount names a volume (or claim template);
    every Secret and PersistentVolumeClaim a volume names is among the rendered objects; probe ports
    are ports of their container; $(VAR) in command/args is an env var of the container (else
    Kubernetes passes it on literally); every container runs the image of deploy/docker.
"""
import base64
import copy
import json
import os
import re
import sys

import jsonschema
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCHEMA_DIR = os.path.join(REPO, "tests", "deploy", "k8s-schemas", "v1.29.0-standalone-strict")
KUSTOMIZATION_KEYS = {"apiVersion", "kind", "resources", "images", "secretGenerator", "generatorOptions"}


class RenderError(Exception):
    pass


def split_image(image):
    """'reg:5000/strata:0.1' -> ('reg:5000/strata', '0.1'); a digest or no tag -> (name, None)."""
    if "@" in image:
        return image.split("@", 1)[0], None
    slash = image.rfind("/")
    colon = image.rfind(":")
    if colon > slash:
        return image[:colon], image[colon + 1:]
    return image, None


def pod_specs(doc):
    """The pod spec of a workload (Deployment, StatefulSet), else None."""
    if doc.get("kind") in ("Deployment", "StatefulSet"):
        return doc.get("spec", {}).get("template", {}).get("spec")
    return None


def containers_of(pod_spec):
    return list(pod_spec.get("initContainers") or []) + list(pod_spec.get("containers") or [])


def render(kdir):
    """The objects `kubectl apply -k kdir` would create, in file order, generated Secrets last."""
    path = os.path.join(kdir, "kustomization.yaml")
    with open(path) as f:
        k = yaml.safe_load(f)
    unknown = sorted(set(k) - KUSTOMIZATION_KEYS)
    if unknown:
        raise RenderError(f"{path}: this renderer does not implement {', '.join(unknown)}; "
                          f"implement it in {os.path.relpath(__file__, REPO)} or keep to {sorted(KUSTOMIZATION_KEYS)}")
    options = k.get("generatorOptions") or {}
    if set(options) - {"disableNameSuffixHash"} or (k.get("secretGenerator") and options.get("disableNameSuffixHash") is not True):
        raise RenderError(f"{path}: generatorOptions other than disableNameSuffixHash: true are not implemented "
                          "(the name hash kustomize would add is not computed here)")
    docs = []
    for resource in k.get("resources") or []:
        with open(os.path.join(kdir, resource)) as f:
            docs.extend(d for d in yaml.safe_load_all(f) if d is not None)
    for image in k.get("images") or []:
        if set(image) - {"name", "newName", "newTag"}:
            raise RenderError(f"{path}: images: only name, newName and newTag are implemented")
        for doc in docs:
            spec = pod_specs(doc)
            for c in containers_of(spec) if spec else []:
                name, tag = split_image(c["image"])
                if name == image["name"]:
                    c["image"] = image.get("newName", name) + (f":{image['newTag']}" if "newTag" in image else f":{tag}" if tag else "")
    for gen in k.get("secretGenerator") or []:
        if set(gen) - {"name", "files", "type"}:
            raise RenderError(f"{path}: secretGenerator {gen.get('name')}: only name, files and type are implemented")
        data = {}
        for entry in gen.get("files") or []:
            key, _, file = entry.partition("=") if "=" in entry else (os.path.basename(entry), "", entry)
            try:
                with open(os.path.join(kdir, file), "rb") as f:
                    data[key] = base64.b64encode(f.read()).decode()
            except OSError as e:
                raise RenderError(f"secret {gen['name']} needs {os.path.join(kdir, file)} ({e.strerror}): make the keys with "
                                  f"`strata keygen {os.path.join(kdir, 'keys')}` and the token file as docs/deploy-k8s.md says")
        docs.append({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": gen["name"]},
                     "type": gen.get("type", "Opaque"), "data": data})
    return docs


def schema_file(doc):
    group_version = doc.get("apiVersion", "")
    group, _, version = group_version.rpartition("/")
    group = group.split(".")[0]
    return f"{doc.get('kind', '').lower()}-{group + '-' if group else ''}{version}.json"


_schemas = {}


def schema_problems(doc):
    name = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
    path = os.path.join(SCHEMA_DIR, schema_file(doc))
    if not os.path.exists(path):
        return [f"{name}: no schema {os.path.relpath(path, REPO)} (tests/deploy/k8s-schemas/README.md says where to get it)"]
    if path not in _schemas:
        with open(path) as f:
            _schemas[path] = jsonschema.Draft7Validator(json.load(f))
    return [f"{name}: {'.'.join(str(p) for p in e.absolute_path) or '(top)'}: {e.message}"
            for e in sorted(_schemas[path].iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))]


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def port_matches(port, container):
    """A probe's or Service's port (number or name) names one of the container's ports."""
    return any(port in (p.get("containerPort"), p.get("name")) for p in container.get("ports") or [])


def compose_image_name():
    """The image name deploy/docker/compose.yaml runs by default (${STRATA_IMAGE:-strata})."""
    with open(os.path.join(REPO, "deploy", "docker", "compose.yaml")) as f:
        m = re.search(r"image: \$\{STRATA_IMAGE:-([^}]+)\}", f.read())
    return m.group(1) if m else None


def reference_problems(docs, expect_image=None):
    problems = []
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d.get("kind"), {})[d.get("metadata", {}).get("name")] = d
    workloads = {f"{d['kind']}/{d['metadata']['name']}": d for d in docs if pod_specs(d)}
    images = set()
    for wname, w in workloads.items():
        spec = w["spec"]
        labels = spec.get("template", {}).get("metadata", {}).get("labels") or {}
        if not selects(spec.get("selector", {}).get("matchLabels"), labels):
            problems.append(f"{wname}: selector {spec.get('selector')} does not match its pod labels {labels}")
        pod = pod_specs(w)
        volumes = {v["name"]: v for v in pod.get("volumes") or []}
        claim_templates = {t["metadata"]["name"] for t in spec.get("volumeClaimTemplates") or []}
        for vname, v in volumes.items():
            if "secret" in v and v["secret"].get("secretName") not in by_kind.get("Secret", {}):
                problems.append(f"{wname}: volume {vname} uses Secret {v['secret'].get('secretName')}, which is not rendered")
            if "persistentVolumeClaim" in v and v["persistentVolumeClaim"].get("claimName") not in by_kind.get("PersistentVolumeClaim", {}):
                problems.append(f"{wname}: volume {vname} uses PersistentVolumeClaim {v['persistentVolumeClaim'].get('claimName')}, "
                                "which is not rendered")
        for c in containers_of(pod):
            cname = f"{wname} container {c['name']}"
            images.add(c.get("image"))
            for m in c.get("volumeMounts") or []:
                if m["name"] not in volumes and m["name"] not in claim_templates:
                    problems.append(f"{cname}: volumeMount {m['name']} names no volume of the pod")
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                p = c.get(probe)
                if not p:
                    continue
                action = p.get("httpGet") or p.get("tcpSocket") or p.get("grpc")
                if action is not None and not port_matches(action.get("port"), c):
                    problems.append(f"{cname}: {probe} port {action.get('port')} is not a port of the container")
            env = {e["name"] for e in c.get("env") or []}
            for arg in (c.get("command") or []) + (c.get("args") or []):
                for var in re.findall(r"(?<!\$)\$\(([A-Za-z_][A-Za-z0-9_]*)\)", arg):
                    if var not in env:
                        problems.append(f"{cname}: $({var}) in {arg!r} is not in its env (Kubernetes would pass it literally)")
        if w["kind"] == "StatefulSet":
            svc = by_kind.get("Service", {}).get(spec.get("serviceName"))
            if svc is None or svc["spec"].get("clusterIP") != "None" or not selects(svc["spec"].get("selector"), labels):
                problems.append(f"{wname}: serviceName {spec.get('serviceName')} is not a headless Service selecting its pods")
    for sname, svc in (by_kind.get("Service") or {}).items():
        selected = [w for w in workloads.values()
                    if selects(svc["spec"].get("selector"), w["spec"]["template"]["metadata"].get("labels") or {})]
        if not selected:
            problems.append(f"Service/{sname}: selector {svc['spec'].get('selector')} selects no pod")
        for p in svc["spec"].get("ports") or []:
            target = p.get("targetPort", p.get("port"))
            for w in selected:
                if not any(port_matches(target, c) for c in pod_specs(w).get("containers") or []):
                    problems.append(f"Service/{sname}: port {p.get('name')} targets {target}, not a container port of "
                                    f"{w['kind']}/{w['metadata']['name']}")
    names = {split_image(i)[0] for i in images}
    if len(images) != 1:
        problems.append(f"the containers run different images: {sorted(images)}; all run deploy/docker's one image")
    if expect_image is not None and names != {expect_image}:
        problems.append(f"the containers run {sorted(names)}, not {expect_image!r}")
    return problems


def problems(docs, expect_image=None):
    out = []
    for d in docs:
        out.extend(schema_problems(d))
    return out + reference_problems(docs, expect_image)


def main(argv):
    check = "--check" in argv
    args = [a for a in argv if a != "--check"]
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        docs = render(args[0])
    except RenderError as e:
        print(f"k8s_render: {e}", file=sys.stderr)
        return 1
    yaml.safe_dump_all(docs, sys.stdout, sort_keys=False)
    if check:
        found = problems(copy.deepcopy(docs))
        for p in found:
            print(f"PROBLEM: {p}", file=sys.stderr)
        return 1 if found else 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Checks docker/k8s/, docker/kserve/, docker/compose.yaml and docker/nginx.conf.

1. Schemas, offline: Kubernetes objects against the schemas bundled with
   kubernetes-validate (strict: unknown fields are errors) for the oldest and
   newest Kubernetes versions we claim; KServe objects against
   kserve.schema.json, with their containers checked as Kubernetes Containers.
2. References: selectors, names, ports, mounts and timeouts agree across files
   and with docker/Dockerfile.
3. The daemon: build/attnd is started with the configs the manifests ship
   (their weights written here) and every probe path answers 200; the KServe
   runtime's container args are run as KServe would, and /v2 inference
   answers under the InferenceService's name; nginx's body limit equals
   attnd's.
"""

import copy
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import jsonschema
import yaml
from kubernetes_validate import utils as kv

import deploylib as dl

DOCKER = os.path.join(dl.ROOT, "docker")
K8S_VERSIONS = ("1.28.0", kv.latest_version())
KSERVE_KEYS = {"modelFormat", "runtime", "storageUri", "runtimeVersion", "protocolVersion", "storage"}


def load_docs():
    docs = []
    for path in sorted(glob.glob(os.path.join(DOCKER, "k8s", "*.yaml")) +
                       glob.glob(os.path.join(DOCKER, "kserve", "*.yaml"))):
        with open(path) as f:
            for d in yaml.safe_load_all(f):
                if d:
                    docs.append((os.path.relpath(path, dl.ROOT), d))
    return docs


def k8s_errors(doc):
    errs = []
    for v in K8S_VERSIONS:
        try:
            kv.validate(doc, v, strict=True)
        except kv.ValidationError as e:
            errs.append(f"k8s {v}: {'.'.join(map(str, e.path))}: {e.message}")
        except kv.SchemaNotFoundError as e:
            errs.append(f"k8s {v}: {e.message}")
    return errs


def container_errors(container):
    """A Container checked by wrapping it in a Pod."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "check"},
           "spec": {"containers": [container]}}
    return k8s_errors(pod)


def dockerfile_facts():
    text = open(os.path.join(DOCKER, "Dockerfile")).read()
    text = re.sub(r"\\\n", " ", text)
    user = re.findall(r"^USER\s+(\S+)", text, re.M)
    expose = re.findall(r"^EXPOSE\s+(\d+)", text, re.M)
    port = re.findall(r"ATTND_PORT=(\d+)", text)
    return {"uid": int(user[-1].split(":")[0]) if user else None,
            "expose": int(expose[-1]) if expose else None,
            "port": int(port[-1]) if port else None}


def named_port(container, port):
    if isinstance(port, int):
        return port
    for p in container.get("ports", []):
        if p.get("name") == port:
            return p["containerPort"]
    return None


def probes(container):
    out = []
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        g = (container.get(kind) or {}).get("httpGet")
        if g:
            out.append((kind, g.get("path"), named_port(container, g.get("port"))))
    return out


def attnd_help():
    r = subprocess.run([dl.attnd_bin(), "--help"], capture_output=True, text=True, timeout=10)
    return r.stdout + r.stderr


def help_default(text, env):
    m = re.search(rf"{env}\s.*\(default (\d+)\)", text)
    return int(m.group(1)) if m else None


def serve_config(c, what, cfg, folder, args=None, env=None):
    """Writes weights for every model of cfg into folder (at the path the
    config names, moved under folder when absolute), starts build/attnd with
    that config and returns (process, port, cfg as rewritten)."""
    cfg = copy.deepcopy(cfg)
    os.makedirs(folder, exist_ok=True)
    for i, m in enumerate(cfg.get("models", [])):
        w = m["weights"]
        if os.path.isabs(w):
            w = m["weights"] = os.path.join(folder, os.path.basename(w))
        else:
            w = os.path.join(folder, w)
        dl.write_model(os.path.dirname(w), os.path.basename(w), m["embed_dim"], m["num_heads"],
                       seed=100 + i)
    path = os.path.join(folder, "config.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    port = dl.free_port()
    args = list(args) if args is not None else ["--config", path]
    try:
        p = dl.start_attnd(port, args, env)
    except RuntimeError as e:
        c.check(False, f"{what}: build/attnd starts with it", str(e))
        return None, None, cfg
    c.check(True, f"{what}: build/attnd starts with it")
    return p, port, cfg


def main():
    c = dl.Checks("manifests")
    docs = load_docs()
    schema = json.load(open(os.path.join(os.path.dirname(__file__), "kserve.schema.json")))
    kserve_defs = {"ServingRuntime": "servingRuntime", "InferenceService": "inferenceService"}
    objs = {}
    for path, d in docs:
        kind, name = d.get("kind"), (d.get("metadata") or {}).get("name")
        objs[(kind, name)] = d
        if str(d.get("apiVersion", "")).startswith("serving.kserve.io/"):
            s = dict(schema, **{"$ref": f"#/$defs/{kserve_defs.get(kind, 'none')}"})
            errs = [f"{'.'.join(map(str, e.path))}: {e.message}"
                    for e in jsonschema.Draft202012Validator(s).iter_errors(d)]
            c.check(not errs, f"{path}: {kind}/{name} matches the KServe schema", "; ".join(errs))
            if kind == "ServingRuntime":
                for ct in d["spec"].get("containers", []):
                    errs = container_errors(ct)
                    c.check(not errs, f"{path}: container {ct.get('name')} is a valid Container",
                            "; ".join(errs))
            if kind == "InferenceService":
                model = (d["spec"].get("predictor") or {}).get("model") or {}
                ct = {k: v for k, v in model.items() if k not in KSERVE_KEYS}
                ct["name"] = "kserve-container"
                errs = container_errors(ct)
                c.check(not errs, f"{path}: predictor.model's container fields are valid",
                        "; ".join(errs))
        else:
            errs = k8s_errors(d)
            c.check(not errs, f"{path}: {kind}/{name} matches Kubernetes {'/'.join(K8S_VERSIONS)}"
                    " (strict)", "; ".join(errs))

    need = [("Deployment", "attnd"), ("Service", "attnd"), ("HorizontalPodAutoscaler", "attnd"),
            ("ConfigMap", "attnd-config"), ("PersistentVolumeClaim", "attnd-weights"),
            ("ServingRuntime", "attnd"), ("InferenceService", "encoder0")]
    for k in need:
        c.check(k in objs, f"{k[0]}/{k[1]} exists", fatal=True)

    # --- references across files ---
    df = dockerfile_facts()
    dep = objs[("Deployment", "attnd")]
    pod = dep["spec"]["template"]
    ct = pod["spec"]["containers"][0]
    labels = pod["metadata"]["labels"]
    sel = dep["spec"]["selector"]["matchLabels"]
    c.check(all(labels.get(k) == v for k, v in sel.items()), "Deployment selector matches its pods")
    svc = objs[("Service", "attnd")]
    c.check(all(labels.get(k) == v for k, v in svc["spec"]["selector"].items()),
            "Service selects the Deployment's pods")
    c.check(all(named_port(ct, p["targetPort"]) == df["port"] for p in svc["spec"]["ports"]),
            "Service targetPort is the container's port, the image's ATTND_PORT",
            str(svc["spec"]["ports"]))
    c.check(df["port"] == df["expose"] == 8080, "image: ATTND_PORT = EXPOSE = 8080", str(df))
    c.check(all(p["containerPort"] == df["port"] for p in ct["ports"]),
            "Deployment containerPort = image's ATTND_PORT", str(ct["ports"]))
    hpa = objs[("HorizontalPodAutoscaler", "attnd")]
    ref = hpa["spec"]["scaleTargetRef"]
    c.check(ref == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "attnd"},
            "HPA scales the Deployment", str(ref))
    c.check(bool(ct.get("resources", {}).get("requests", {}).get("cpu")),
            "container requests CPU (HPA utilization needs it)")
    if ("PodDisruptionBudget", "attnd") in objs:
        pdb = objs[("PodDisruptionBudget", "attnd")]
        c.check(pdb["spec"]["selector"]["matchLabels"] == sel, "PDB selects the Deployment's pods")
    sc = pod["spec"].get("securityContext", {})
    c.check(sc.get("runAsNonRoot") is True and sc.get("runAsUser") == df["uid"],
            "pods run as non-root, as the image's user", f"{sc} vs uid {df['uid']}")

    env = {e["name"]: e.get("value") for e in ct.get("env", [])}
    mounts = {m["name"]: m["mountPath"] for m in ct.get("volumeMounts", [])}
    vols = {v["name"]: v for v in pod["spec"].get("volumes", [])}
    cm = objs[("ConfigMap", "attnd-config")]
    cfg_path = env.get("ATTND_CONFIG", "")
    cfg_vol = [n for n, mp in mounts.items() if cfg_path.startswith(mp.rstrip("/") + "/")]
    c.check(len(cfg_vol) == 1 and vols[cfg_vol[0]].get("configMap", {}).get("name") == "attnd-config"
            and os.path.basename(cfg_path) in cm["data"],
            "ATTND_CONFIG names config.json of the mounted ConfigMap", cfg_path)
    kcfg = json.loads(cm["data"]["config.json"])
    weights_vol = [n for n, v in vols.items() if "persistentVolumeClaim" in v]
    c.check(len(weights_vol) == 1 and
            vols[weights_vol[0]]["persistentVolumeClaim"]["claimName"] == "attnd-weights",
            "weights volume is the attnd-weights claim")
    wmount = mounts.get(weights_vol[0]) if weights_vol else None
    c.check(all(wmount and m["weights"].startswith(wmount.rstrip("/") + "/")
                for m in kcfg["models"]),
            "every weights path of the ConfigMap lies in the weights volume", str(wmount))

    timeout_s = kcfg.get("server", {}).get("request_timeout_ms", 30000) / 1000
    pre = (ct.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command") or [])
    sleep_s = int(pre[1]) if len(pre) == 2 and pre[0] == "sleep" else 0
    grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
    c.check(sleep_s > 0, "preStop sleeps so endpoints go before SIGTERM", str(pre))
    c.check(grace >= sleep_s + timeout_s + 5,
            "terminationGracePeriodSeconds covers preStop + request timeout + 5 s",
            f"{grace} < {sleep_s} + {timeout_s} + 5")

    sr = objs[("ServingRuntime", "attnd")]
    isvc = objs[("InferenceService", "encoder0")]
    model = isvc["spec"]["predictor"]["model"]
    fmts = [f["name"] for f in sr["spec"]["supportedModelFormats"]]
    c.check(model["modelFormat"]["name"] in fmts and model.get("runtime") == "attnd",
            "InferenceService picks the attnd runtime and its model format")
    c.check(model.get("protocolVersion") == "v2" and sr["spec"]["protocolVersions"] == ["v2"],
            "runtime and InferenceService speak v2")
    src = sr["spec"]["containers"][0]
    c.check(src["name"] == "kserve-container", "runtime container is kserve-container")
    c.check(any(a.startswith("/mnt/models") for a in src.get("args", [])),
            "runtime args point into /mnt/models", str(src.get("args")))
    srenv = {e["name"]: e.get("value") for e in src.get("env", [])}
    c.check([p["containerPort"] for p in src["ports"]] == [int(srenv.get("ATTND_PORT", df["port"]))],
            "runtime containerPort is the port attnd listens on", str(src["ports"]))
    c.check(isvc["spec"]["predictor"].get("timeout", 0) > timeout_s,
            "InferenceService timeout exceeds attnd's request timeout")

    # compose and nginx
    comp = yaml.safe_load(open(os.path.join(DOCKER, "compose.yaml")))
    svcs = comp.get("services", {})
    a = svcs.get("attnd", {})
    lb = svcs.get("lb", {})
    c.check(a.get("deploy", {}).get("replicas") == 3, "compose runs three attnd replicas")
    c.check(a.get("build", {}).get("dockerfile") == "docker/Dockerfile",
            "compose builds docker/Dockerfile")
    c.check(any(str(v).startswith("./nginx.conf:/etc/nginx/nginx.conf") for v in lb.get("volumes", [])),
            "compose's nginx uses docker/nginx.conf")
    g = re.fullmatch(r"(\d+)s", str(a.get("stop_grace_period", "")))
    c.check(bool(g) and int(g.group(1)) >= timeout_s + 5, "compose stop_grace_period covers a drain")
    c.check("/health" in " ".join(a.get("healthcheck", {}).get("test", [])),
            "compose healthcheck is on /health")
    nginx = open(os.path.join(DOCKER, "nginx.conf")).read()
    m = re.search(r"^\s*client_max_body_size\s+(\d+)([kmg]?);", nginx, re.M)
    mult = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    body_limit = int(m.group(1)) * mult[m.group(2)] if m else None
    help_text = attnd_help()
    c.check(body_limit is not None and body_limit == help_default(help_text, "ATTND_MAX_BODY_BYTES"),
            "nginx client_max_body_size = attnd's max_body_bytes default",
            f"{body_limit} vs {help_default(help_text, 'ATTND_MAX_BODY_BYTES')}")
    m = re.search(r"^\s*proxy_read_timeout\s+(\d+)s;", nginx, re.M)
    req_ms = help_default(help_text, "ATTND_REQUEST_TIMEOUT_MS")
    c.check(bool(m) and req_ms is not None and int(m.group(1)) > req_ms / 1000,
            "nginx waits longer than attnd's request timeout", f"{m and m.group(1)} s vs {req_ms} ms")

    # --- the daemon serves what the manifests expect ---
    tmp = tempfile.mkdtemp(prefix="attnd-manifests-")
    procs = []
    try:
        p, port, _ = serve_config(c, "k8s ConfigMap config.json", kcfg, os.path.join(tmp, "k8s"))
        if p:
            procs.append(p)
            for kind, path, pport in probes(ct):
                st = dl.http("GET", f"http://127.0.0.1:{port}{path}")[0]
                c.check(st == 200 and pport == df["port"],
                        f"Deployment {kind} GET {path} on port {pport}: 200", f"status {st}")
            st, body, _ = dl.http("GET", f"http://127.0.0.1:{port}/v1/models")
            names = [x.get("name") for x in body.get("models", [])] if isinstance(body, dict) else []
            c.check(names == [x["name"] for x in kcfg["models"]],
                    "attnd serves the ConfigMap's models", str(body))

        # KServe: /mnt/models is the storage folder; run the runtime's args.
        scfg = json.load(open(os.path.join(DOCKER, "kserve", "config.json")))
        mnt = os.path.join(tmp, "mnt-models")
        args = [x.replace("/mnt/models", mnt) for x in src.get("args", [])]
        senv = {k: v for k, v in srenv.items() if k != "ATTND_PORT"}
        p, port, _ = serve_config(c, "KServe runtime args with docker/kserve/config.json", scfg, mnt,
                                  args=args, env=senv)
        if p:
            procs.append(p)
            for kind, path, pport in probes(src):
                st = dl.http("GET", f"http://127.0.0.1:{port}{path}")[0]
                c.check(st == 200, f"ServingRuntime {kind} GET {path}: 200", f"status {st}")
            name = isvc["metadata"]["name"]
            st = dl.http("GET", f"http://127.0.0.1:{port}/v2/models/{name}/ready")[0]
            c.check(st == 200, f"GET /v2/models/{name}/ready (the InferenceService's name): 200",
                    f"status {st}")
            e = scfg["models"][0]["embed_dim"]
            q = sum(dl.query(2, e, seed=5), [])
            st, body, _ = dl.http("POST", f"http://127.0.0.1:{port}/v2/models/{name}/infer",
                                  {"inputs": [{"name": "query", "shape": [1, 2, e],
                                               "datatype": "FP32", "data": q}]})
            outs = body.get("outputs", []) if isinstance(body, dict) else []
            out = next((o for o in outs if o.get("name") == "output"), {})
            c.check(st == 200 and out.get("shape") == [1, 2, e] and len(out.get("data", [])) == 2 * e,
                    f"POST /v2/models/{name}/infer answers output [1, 2, {e}]",
                    f"{st} {str(body)[:300]}")
    finally:
        for p in procs:
            dl.stop(p)
        shutil.rmtree(tmp, ignore_errors=True)
    return c.finish()


if __name__ == "__main__":
    sys.exit(main())

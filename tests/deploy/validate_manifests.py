"""Checks docker/k8s/, docker/kserve/, docker/compose.yaml and docker/nginx.conf.

1. Schemas, offline: Kubernetes objects against the schemas bundled with
   kubernetes-validate (strict: unknown fields are errors) for the oldest and
   newest Kubernetes versions we claim; KServe objects against
   kserve.schema.json, with their containers checked as Kubernetes Containers.
2. References: selectors, names, ports, mounts and timeouts agree across files
   and with docker/Dockerfile; sessions.save_dir, wherever a manifest sets it,
   is a subfolder of a writable volume, never the volume's mount path (an
   emptyDir is mounted 0777, which attnd refuses as a save_dir).
3. The daemon: build/attnd is started with the configs the manifests ship
   (their weights written here) and every probe path answers 200; with the
   Deployment's save_dir in a 0777 folder standing for its emptyDir, it makes
   the subfolder 0700, saves a session there on SIGTERM and the next start
   steps it on, while the volume's own folder as save_dir is refused (exit 2);
   the KServe runtime's container args are run as KServe would, and /v2
   inference answers under the InferenceService's name; nginx's body limit
   equals attnd's.
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
                       glob.glob(os.path.join(DOCKER, "k8s", "ingress-nginx", "*.yaml")) +
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
    expose = re.findall(r"^EXPOSE\s+([\d ]+)$", text, re.M)
    port = re.findall(r"ATTND_PORT=(\d+)", text)
    grpc = re.findall(r"ATTND_GRPC_PORT=(\d+)", text)
    return {"uid": int(user[-1].split(":")[0]) if user else None,
            "expose": [int(x) for x in expose[-1].split()] if expose else None,
            "port": int(port[-1]) if port else None,
            "grpc": int(grpc[-1]) if grpc else None}


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


def check_ingress(c, objs):
    """ingress.yaml: the hashed session routes and the round robin through
    Services of their own (ingress-nginx makes one upstream per Service),
    each taking attnd's body limit; a session step never sent twice."""
    ing = {n: o for (k, n), o in objs.items() if k == "Ingress"}
    if not ing:
        return
    backends = {n: {p["backend"]["service"]["name"] for r in o["spec"]["rules"]
                    for p in r["http"]["paths"]} for n, o in ing.items()}
    c.check(backends.get("attnd-sessions") == {"attnd-sessions"} and
            backends.get("attnd") == {"attnd"} and ("Service", "attnd-sessions") in objs,
            "the session Ingress and the round-robin one name Services of their own",
            str(backends))
    ann = {n: o["metadata"].get("annotations", {}) for n, o in ing.items()}
    pre = "nginx.ingress.kubernetes.io/"
    c.check(all(a.get(pre + "proxy-body-size") == "64m" for a in ann.values()),
            "every Ingress lets attnd's 64 MiB bodies through (ingress-nginx's default is 1m)")
    c.check(ann["attnd-sessions"].get(pre + "proxy-next-upstream") == "off",
            "session steps are never sent to a second pod")
    c.check("http_504" not in ann["attnd"].get(pre + "proxy-next-upstream", ""),
            "attnd's own 504 (a passed deadline) is not retried")
    cm = objs.get(("ConfigMap", "ingress-nginx-controller"), {}).get("data", {})
    c.check(cm.get("annotations-risk-level") == "Critical" and
            cm.get("allow-snippet-annotations") == "true",
            "the controller's ConfigMap allows the configuration-snippet (Critical since 1.12)")


def attnd_help():
    r = subprocess.run([dl.attnd_bin(), "--help"], capture_output=True, text=True, timeout=10)
    return r.stdout + r.stderr


def help_default(text, env):
    m = re.search(rf"{env}\s.*\(default (\d+)\)", text)
    return int(m.group(1)) if m else None


SAVE_ENV = "ATTND_SESSIONS_SAVE_DIR"


def save_dir_of(env, cfg):
    """Where attnd saves its sessions: ATTND_SESSIONS_SAVE_DIR over the
    config's sessions.save_dir (variables override the file); None: nowhere."""
    return env.get(SAVE_ENV) or ((cfg or {}).get("sessions") or {}).get("save_dir")


def holding_mount(path, mounts):
    """The mount ({name, mountPath, readOnly}) whose folder is path or holds
    it, the deepest; None when none does."""
    p = os.path.normpath(path)
    held = [m for m in mounts if p == os.path.normpath(m["mountPath"])
            or p.startswith(os.path.normpath(m["mountPath"]).rstrip("/") + "/")]
    return max(held, key=lambda m: len(os.path.normpath(m["mountPath"])), default=None)


def volume_kind(vol):
    """emptyDir, persistentVolumeClaim, configMap, ...: a volume's source."""
    return next((k for k in vol if k != "name"), "unknown")


def check_save_dir(c, where, save, mounts, kinds):
    """sessions.save_dir lies in a writable volume, strictly below its mount
    path. A volume's own folder has the platform's owner and mode (Kubernetes
    mounts an emptyDir 0777; a fresh claim's folder is root's), which attnd
    refuses as a save_dir (exit 2); a subfolder it makes itself, 0700."""
    m = holding_mount(save, mounts)
    c.check(m is not None and not m.get("readOnly"),
            f"{where}: sessions.save_dir {save} lies in a writable volume", str(mounts))
    if m is None:
        return None
    kind = kinds.get(m["name"], "unknown")
    c.check(os.path.normpath(save) != os.path.normpath(m["mountPath"]),
            f"{where}: sessions.save_dir is a subfolder of volume {m['name']} ({kind}), "
            "not its mount path",
            f"{save} is where volume {m['name']} is mounted: attnd refuses a folder another user "
            "owns or its group or others may enter"
            f"{' (an emptyDir is mounted 0777)' if kind == 'emptyDir' else ''}")
    return m


def compose_mounts(service):
    """A compose service's volumes as mounts: short ("src:dst[:ro]") and long
    syntax; kinds by name: "bind" or "volume"."""
    mounts, kinds = [], {}
    for v in service.get("volumes", []):
        if isinstance(v, str):
            parts = v.split(":")
            src, dst, mode = parts[0], parts[1] if len(parts) > 1 else parts[0], parts[2:]
            ro = "ro" in ",".join(mode).split(",")
            kind = "bind" if src.startswith((".", "/", "~")) else "volume"
        else:
            src, dst, ro, kind = v.get("source", ""), v.get("target", ""), \
                bool(v.get("read_only")), v.get("type", "volume")
        mounts.append({"name": src, "mountPath": dst, "readOnly": ro})
        kinds[src] = kind
    return mounts, kinds


def compose_env(service):
    e = service.get("environment") or {}
    if isinstance(e, list):
        e = dict(x.split("=", 1) if "=" in x else (x, None) for x in e)
    return {k: (str(v) if v is not None else None) for k, v in e.items()}


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


def refused_save_dir(cfg_path, save):
    """(exit code, output) of build/attnd started with save as its save_dir;
    None for the code when it was still running after 30 s."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("ATTND_")}
    e.update({SAVE_ENV: save, "ATTND_HOST": "127.0.0.1", "ATTND_PORT": str(dl.free_port()),
              "ATTND_GRPC_PORT": "-1"})
    p = subprocess.Popen([dl.attnd_bin(), "--config", cfg_path], env=e, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        out, _ = p.communicate(timeout=30)
        return p.returncode, out
    except subprocess.TimeoutExpired:
        dl.stop(p)
        return None, ""


def check_sessions_kept(c, folder, cfg, save, mount):
    """The Deployment's save_dir, run here: a folder of mode 0777 stands for
    its volume (Kubernetes mounts an emptyDir so) and save_dir maps into it.
    attnd makes the subfolder 0700, saves an open session there on SIGTERM,
    and the next start steps it on; the volume's own folder is refused."""
    vol = os.path.join(folder, "volume")
    os.makedirs(vol)
    os.chmod(vol, 0o777)
    rel = os.path.relpath(os.path.normpath(save), os.path.normpath(mount["mountPath"]))
    local = os.path.normpath(os.path.join(vol, rel))
    env = {SAVE_ENV: local}
    p, port, cfg = serve_config(c, f"Deployment's save_dir {save}, its volume 0777", cfg,
                                os.path.join(folder, "models"), env=env)
    if not p:
        return
    cfg_path = os.path.join(folder, "models", "config.json")
    try:
        mode = os.stat(local).st_mode & 0o777 if os.path.isdir(local) else None
        c.check(mode == 0o700, "attnd made save_dir, mode 0700, in the 0777 volume",
                oct(mode) if mode else "missing")
        m = cfg["models"][0]
        url = f"http://127.0.0.1:{port}"
        st, body, _ = dl.http("POST", url + "/v1/sessions",
                              {"model": m["name"], "query": dl.query(3, m["embed_dim"], seed=7)})
        sid = body.get("session") if isinstance(body, dict) else None
        c.check(st == 201 and bool(sid), "a session opens", f"{st} {str(body)[:200]}")
        rc = dl.stop(p)
        files = sorted(os.listdir(local)) if os.path.isdir(local) else []
        c.check(rc == 0 and files == [f"{sid}.safetensors"], "SIGTERM saves it into save_dir",
                f"exit {rc}, files {files}")
        p = dl.start_attnd(port, ["--config", cfg_path], env)
        st, body, _ = dl.http("POST", f"{url}/v1/sessions/{sid}/attention",
                              {"query": dl.query(1, m["embed_dim"], seed=8)})
        c.check(st == 200 and body.get("cached_tokens") == 4,
                "the next start steps the saved session on", f"{st} {str(body)[:200]}")
    except RuntimeError as e:
        c.check(False, "attnd starts again with the saved session", str(e))
    finally:
        dl.stop(p)
    rc, out = refused_save_dir(cfg_path, vol)
    c.check(rc == 2 and "open to its group or others" in out,
            "the volume's own 0777 folder as save_dir is refused (exit 2)", f"exit {rc}: {out[-300:]}")


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
    sports = {p["name"]: named_port(ct, p["targetPort"]) for p in svc["spec"]["ports"]}
    c.check(sports == {"http": df["port"], "grpc": df["grpc"]},
            "Service targets the container's HTTP and gRPC ports, the image's ATTND_PORT and "
            "ATTND_GRPC_PORT", str(svc["spec"]["ports"]))
    c.check(any(p["name"] == "grpc" and p.get("appProtocol") == "kubernetes.io/h2c"
                for p in svc["spec"]["ports"]), "Service says gRPC is HTTP/2 without TLS (h2c)")
    c.check(df["port"] == 8080 and df["grpc"] == 8081 and df["expose"] == [8080, 8081],
            "image: ATTND_PORT 8080, ATTND_GRPC_PORT 8081, EXPOSE both", str(df))
    c.check({p["name"]: p["containerPort"] for p in ct["ports"]}
            == {"http": df["port"], "grpc": df["grpc"]},
            "Deployment containerPorts = image's ATTND_PORT and ATTND_GRPC_PORT", str(ct["ports"]))
    c.check(pod["spec"].get("enableServiceLinks") is False,
            "Deployment turns service links off (the Service attnd would set "
            "ATTND_PORT=tcp://...)", str(pod["spec"].get("enableServiceLinks")))
    want = {"readinessProbe": "/v2/health/ready", "livenessProbe": "/v2/health/live"}
    got = {kind: path for kind, path, pport in probes(ct) if pport == df["port"]}
    c.check(all(got.get(k) == v for k, v in want.items()),
            "Deployment readiness and liveness probes on the v2 health routes (SPEC 6), "
            "on the HTTP port", str(got))
    check_ingress(c, objs)
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

    kinds = {n: volume_kind(v) for n, v in vols.items()}
    dsave = save_dir_of(env, kcfg)
    c.check(dsave is not None, "the Deployment keeps sessions across a container restart "
            "(sessions.save_dir set)")
    dmount = check_save_dir(c, "Deployment", dsave, ct.get("volumeMounts", []), kinds) \
        if dsave else None

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
    # the same over gRPC: a runtime whose one port is attnd's gRPC port, named
    # h2c as KServe asks of a grpc-v2 runtime, and a service that picks it
    gsr = objs.get(("ServingRuntime", "attnd-grpc"))
    gisvc = objs.get(("InferenceService", "encoder0-grpc"))
    c.check(gsr is not None and gisvc is not None,
            "ServingRuntime/attnd-grpc and InferenceService/encoder0-grpc exist", fatal=True)
    gsrc = gsr["spec"]["containers"][0]
    genv = {e["name"]: e.get("value") for e in gsrc.get("env", [])}
    c.check(gsr["spec"]["protocolVersions"] == ["grpc-v2"] and
            [(p.get("name"), p["containerPort"]) for p in gsrc["ports"]]
            == [("h2c", int(genv.get("ATTND_GRPC_PORT", df["grpc"])))],
            "gRPC runtime speaks grpc-v2 on attnd's gRPC port, named h2c", str(gsrc["ports"]))
    c.check((gsrc.get("readinessProbe") or {}).get("grpc", {}).get("port")
            == int(genv.get("ATTND_GRPC_PORT", df["grpc"])),
            "gRPC runtime's readiness is the gRPC probe", str(gsrc.get("readinessProbe")))
    gmodel = gisvc["spec"]["predictor"]["model"]
    c.check(gmodel.get("runtime") == "attnd-grpc" and gmodel.get("protocolVersion") == "grpc-v2",
            "InferenceService encoder0-grpc picks the gRPC runtime and grpc-v2")
    # KServe mounts the model's folder read-only at /mnt/models
    scfg = json.load(open(os.path.join(DOCKER, "kserve", "config.json")))
    srmounts = src.get("volumeMounts", []) + [{"name": "kserve-provision-location",
                                               "mountPath": "/mnt/models", "readOnly": True}]
    srkinds = {v["name"]: volume_kind(v) for v in sr["spec"].get("volumes", [])}
    ssave = save_dir_of(srenv, scfg)
    if ssave:
        check_save_dir(c, "ServingRuntime", ssave, srmounts, srkinds)

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
    csave = save_dir_of(compose_env(a), None)
    if csave:
        check_save_dir(c, "compose", csave, *compose_mounts(a))
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

        if dmount:
            check_sessions_kept(c, os.path.join(tmp, "k8s-sessions"), kcfg, dsave, dmount)

        # KServe: /mnt/models is the storage folder; run the runtime's args.
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

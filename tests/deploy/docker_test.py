"""Runs the attnd image (built by docker_test.sh) and checks what an operator
relies on: it serves the embedded default model with nothing mounted and
gives the same answers as build/attnd; its HEALTHCHECK works; it runs as a
non-root user with attnd as PID 1; SIGTERM makes it exit 0; a mounted folder
with a config.json is served; ATTND_* variables configure it; arguments
after the image (as KServe's ServingRuntime passes them) reach attnd; a bad
config stops it.

Only 127.0.0.1 ports are published. Containers are removed at the end.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import yaml

import deploylib as dl

IMAGE = os.environ.get("ATTND_IMAGE", "localhost/attnd:test")
PODMAN = ["podman", "--runtime", "runc"]
# Limits the container runtime may set here; the host refuses higher ones.
ULIMITS = ["--ulimit", "nofile=20000:20000", "--ulimit", "nproc=32768:32768"]
E_DEFAULT = 512
# Queue delay of the drain check: requests wait this long (us) for company,
# so podman stop finds them in flight.
DRAIN_DELAY_US = 600000


def podman(*args, check=False, timeout=120):
    r = subprocess.run([*PODMAN, *args], capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args)}: {r.stderr.strip()}")
    return r


class Container:
    """One detached container publishing its port on 127.0.0.1."""

    def __init__(self, name, host_port, container_port=8080, env=None, mounts=(), args=(),
                 opts=(), grpc_port=None):
        self.name = name
        self.host_port = host_port
        self.grpc_port = grpc_port
        cmd = ["run", "-d", "--name", name, *ULIMITS, *opts,
               "-p", f"127.0.0.1:{host_port}:{container_port}"]
        if grpc_port:  # the image's gRPC port, 8081
            cmd += ["-p", f"127.0.0.1:{grpc_port}:8081"]
        for k, v in (env or {}).items():
            cmd += ["-e", f"{k}={v}"]
        for m in mounts:
            cmd += ["-v", m]
        podman("rm", "-f", name)
        podman(*cmd, IMAGE, *args, check=True)

    def url(self, path):
        return f"http://127.0.0.1:{self.host_port}{path}"

    def wait_healthy(self, timeout=60):
        """Runs the image's HEALTHCHECK until it passes."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if podman("healthcheck", "run", self.name).returncode == 0:
                return True
            if self.state() not in ("running", "created", "configured"):
                return False
            time.sleep(0.5)
        return False

    def state(self):
        return podman("inspect", "--format", "{{.State.Status}}", self.name).stdout.strip()

    def exit_code(self):
        r = podman("inspect", "--format", "{{.State.ExitCode}}", self.name)
        return int(r.stdout.strip()) if r.returncode == 0 else None

    def exec(self, *cmd):
        return podman("exec", self.name, *cmd)

    def logs(self):
        r = podman("logs", self.name)
        return r.stdout + r.stderr

    def remove(self):
        podman("rm", "-f", "-t", "0", self.name)


def grpc_health(port):
    """grpc.health.v1.Health/Check's answer bytes from 127.0.0.1:port (b"\\x08\\x01":
    SERVING), or the failure's text. grpcio is the test venv's (tests/requirements.txt)."""
    import grpc
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            return ch.unary_unary("/grpc.health.v1.Health/Check")(b"", timeout=10)
    except grpc.RpcError as e:
        return f"{e.code()}: {e.details()}"


def attention(url, q):
    status, body, _ = dl.http("POST", url, {"query": q}, timeout=60)
    out = body.get("output") if status == 200 and isinstance(body, dict) else None
    return status, out, body


def main():
    c = dl.Checks("docker-test")
    tmp = tempfile.mkdtemp(prefix="attnd-docker-test-")
    containers = []
    extra = []  # names of containers run without Container
    local = None
    try:
        # Image metadata: user, healthcheck, stop signal, exposed port.
        r = podman("image", "inspect", IMAGE, check=True)
        top = json.loads(r.stdout)[0]
        cfg = top.get("Config", {})
        c.check(cfg.get("User") == "10001:10001", "image runs as user 10001:10001",
                cfg.get("User"))
        # podman shows it beside Config, docker inside it
        hc = (cfg.get("Healthcheck") or top.get("Healthcheck") or {}).get("Test") or []
        c.check(any("/health" in part for part in hc), "image has a HEALTHCHECK on /health", hc)
        c.check(cfg.get("StopSignal") in ("SIGTERM", "15"), "STOPSIGNAL is SIGTERM",
                cfg.get("StopSignal"))
        c.check({"8080/tcp", "8081/tcp"} <= set(cfg.get("ExposedPorts") or {}),
                "EXPOSE 8080 (HTTP) and 8081 (gRPC)", cfg.get("ExposedPorts"))
        c.check(cfg.get("Entrypoint") == ["/usr/local/bin/attnd-entrypoint"],
                "entrypoint in exec form", cfg.get("Entrypoint"))

        # Runtime stage: its libraries resolve, and no toolchain or curl came along.
        r = podman("run", "--rm", *ULIMITS, "--entrypoint", "/usr/bin/ldd", IMAGE,
                   "/usr/local/bin/attnd")
        c.check(r.returncode == 0 and "not found" not in r.stdout,
                "every shared library of attnd resolves in the image", r.stdout + r.stderr)
        r = podman("run", "--rm", *ULIMITS, "--entrypoint", "/bin/sh", IMAGE, "-c",
                   "ldconfig -p | grep -F libopenblas.so.0")
        c.check(r.returncode == 0 and "libopenblas.so.0" in r.stdout,
                "libopenblas.so.0, which attnd loads at start-up, is in the image",
                r.stdout + r.stderr)
        r = podman("run", "--rm", *ULIMITS, "--entrypoint", "/bin/sh", IMAGE, "-c",
                   "command -v gcc cc make curl wget || true")
        c.check(r.returncode == 0 and r.stdout.strip() == "",
                "runtime image has no compiler, make or curl", r.stdout + r.stderr)

        # 1. Nothing mounted: the embedded default model, under the
        # restrictions docker/k8s/deployment.yaml sets (read-only root
        # filesystem, no capabilities, no privilege escalation).
        port = dl.free_port()
        d = Container(f"attnd-test-default-{os.getpid()}", port,
                      opts=["--read-only", "--cap-drop=ALL",
                            "--security-opt", "no-new-privileges"], grpc_port=dl.free_port())
        containers.append(d)
        c.check(d.wait_healthy(), "default container (read-only, no capabilities) becomes healthy"
                " (podman healthcheck run)",
                d.logs()[-2000:], fatal=True)
        c.check(dl.http("GET", d.url("/health"))[0] == 200, "GET /health through the published port")
        health = grpc_health(d.grpc_port)
        c.check(health == b"\x08\x01", "gRPC grpc.health.v1.Health/Check through the published "
                "port 8081: SERVING", repr(health))
        status, body, _ = dl.http("GET", d.url("/v1/models"))
        cmodels = body
        names = [m.get("name") for m in body.get("models", [])] if isinstance(body, dict) else []
        c.check(status == 200 and names == ["default"], "serves the embedded model 'default'",
                f"{status} {body}")

        uid = d.exec("id", "-u")
        c.check(uid.returncode == 0 and uid.stdout.strip() not in ("", "0"),
                "runs as a non-root user", uid.stdout + uid.stderr)
        comm = d.exec("cat", "/proc/1/comm")
        c.check(comm.stdout.strip() == "attnd", "attnd is PID 1 (the entrypoint exec'd it)",
                comm.stdout + comm.stderr)
        puid = d.exec("awk", "/^Uid:/{print $2}", "/proc/1/status")
        c.check(puid.stdout.strip() not in ("", "0"), "PID 1 runs with a non-zero uid",
                puid.stdout + puid.stderr)

        dep = yaml.safe_load(open(os.path.join(dl.ROOT, "docker", "k8s", "deployment.yaml")))
        pre = dep["spec"]["template"]["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"]
        r = d.exec(*pre["command"])
        c.check(r.returncode == 0, f"the Deployment's preStop command {pre['command']} runs in the image",
                r.stdout + r.stderr)

        q = dl.query(5, E_DEFAULT, seed=7)
        status, out, body = attention(d.url("/v1/attention"), q)
        ok, why = dl.output_ok(out, 5, E_DEFAULT) if status == 200 else (False, f"{status} {body}")
        c.check(ok, "POST /v1/attention answers a 5 x 512 finite output", why)

        lport = dl.free_port()
        local = dl.start_attnd(lport)
        lstatus, lout, lbody = attention(f"http://127.0.0.1:{lport}/v1/attention", q)
        err = dl.rel_err(out, lout) if status == lstatus == 200 else float("inf")
        c.check(err < 1e-6, "the image's answer equals build/attnd's (same default model)",
                f"relative error {err}; local {lstatus}")
        # OpenBLAS's kernels: chosen from the CPU's features in the image as
        # outside it (the image loads its own libopenblas0-pthread)
        _, lmodels, _ = dl.http("GET", f"http://127.0.0.1:{lport}/v1/models")
        ccore = (cmodels.get("compute") or {}).get("blas_core") if isinstance(cmodels, dict) else None
        lcore = (lmodels.get("compute") or {}).get("blas_core") if isinstance(lmodels, dict) else None
        c.check(ccore is not None and ccore == lcore and
                f"blas core {ccore} (chosen from the cpu features)" in d.logs(),
                "the image computes with the OpenBLAS kernels build/attnd chooses here, "
                "and logs them", f"image {ccore}, build/attnd {lcore}; {d.logs()[:600]}")
        dl.stop(local)
        local = None

        # SIGTERM: podman stop sends the image's STOPSIGNAL; attnd drains, exits 0.
        t0 = time.monotonic()
        r = podman("stop", "-t", "40", d.name, timeout=60)
        took = time.monotonic() - t0
        code = d.exit_code()
        c.check(r.returncode == 0 and code == 0, "podman stop (SIGTERM) -> exit code 0",
                f"exit code {code} after {took:.1f} s; {r.stderr.strip()}")

        # The compute pool follows the container's CPU quota: --cpus 1 means one
        # compute thread (the cgroup quota is read inside the container).
        qport = dl.free_port()
        qc = Container(f"attnd-test-cpus-{os.getpid()}", qport, opts=["--cpus", "1"])
        containers.append(qc)
        ok = qc.wait_healthy()
        status, qbody, _ = dl.http("GET", qc.url("/v1/models")) if ok else (0, {}, None)
        qcomp = (qbody.get("compute") or {}) if isinstance(qbody, dict) else {}
        c.check(ok and qcomp.get("threads") == 1 and qcomp.get("cpus") == 1,
                "--cpus 1: the image's compute pool has 1 thread (cgroup quota)",
                f"{status} {qcomp}; {qc.logs()[:600]}")
        podman("stop", "-t", "40", qc.name, timeout=60)

        # Model control with nothing mounted: the working directory, /models,
        # is server.model_dir, so a load reads nothing else of the image.
        xport = dl.free_port()
        xc = Container(f"attnd-test-explicit-{os.getpid()}", xport,
                       env={"ATTND_MODEL_CONTROL": "explicit"})
        containers.append(xc)
        ok = xc.wait_healthy()
        entry = json.dumps({"name": "x", "embed_dim": 64, "num_heads": 4,
                            "weights": "/etc/passwd"})
        st, body, _ = dl.http("POST", xc.url("/v2/repository/models/x/load"),
                              {"parameters": {"config": entry}}) if ok else (0, {}, None)
        err = body.get("error", "") if isinstance(body, dict) else str(body)
        c.check(st == 400 and "/models" in err and "header" not in err,
                "no config, model_control explicit: a load of /etc/passwd is refused as outside "
                "model_dir /models", f"{st} {err}")
        podman("stop", "-t", "40", xc.name, timeout=60)

        # 2. A mounted folder with config.json and weights, an ATTND_* port,
        # and the HEALTHCHECK following ATTND_PORT.
        models = os.path.join(tmp, "models")
        dl.write_model_dir(models, "mounted", 64, 4, seed=11)
        port2 = dl.free_port()
        m = Container(f"attnd-test-mounted-{os.getpid()}", port2, container_port=9000,
                      env={"ATTND_PORT": "9000", "ATTND_MAX_QUEUE_DELAY_US": str(DRAIN_DELAY_US)},
                      mounts=[f"{models}:/models:ro"])
        containers.append(m)
        c.check(m.wait_healthy(), "mounted-config container becomes healthy on ATTND_PORT=9000",
                m.logs()[-2000:], fatal=True)
        status, body, _ = dl.http("GET", m.url("/v1/models"))
        names = [x.get("name") for x in body.get("models", [])] if isinstance(body, dict) else []
        c.check(status == 200 and names == ["mounted"],
                "serves the model of /models/config.json", f"{status} {body}")
        c.check(" warn " not in m.logs(),
                "the mounted container (ATTND_CONFIG set by the entrypoint) logs no warning",
                m.logs()[:1500])
        q2 = dl.query(3, 64, seed=13)
        status, out, body = attention(m.url("/v1/attention"), q2)
        ok, why = dl.output_ok(out, 3, 64) if status == 200 else (False, f"{status} {body}")
        c.check(ok, "mounted model answers a 3 x 64 finite output", why)
        lport = dl.free_port()
        local = dl.start_attnd(lport, ["--config", os.path.join(models, "config.json")])
        lstatus, lout, _ = attention(f"http://127.0.0.1:{lport}/v1/attention", q2)
        err = dl.rel_err(out, lout) if status == lstatus == 200 else float("inf")
        c.check(err < 1e-6, "mounted model's answer equals build/attnd with the same config",
                f"relative error {err}; local {lstatus}")
        dl.stop(local)
        local = None
        # Drain: requests wait DRAIN_DELAY_US in the queue for company; stop
        # the container while they wait. Each must still get its answer.
        answers = []
        threads = [threading.Thread(target=lambda: answers.append(
            attention(m.url("/v1/attention"), q2)[0])) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(DRAIN_DELAY_US / 1e6 / 3)
        r = podman("stop", "-t", "40", m.name, timeout=60)
        for t in threads:
            t.join()
        c.check(m.exit_code() == 0, "mounted container exits 0 on SIGTERM", str(m.exit_code()))
        c.check(answers == [200] * 4,
                "requests in flight when podman stop sent SIGTERM were all answered 200",
                str(answers))

        # 3. As KServe runs it: the folder at /mnt/models, the ServingRuntime's
        # args after the image name (they reach attnd through the entrypoint).
        port3 = dl.free_port()
        k = Container(f"attnd-test-kserve-{os.getpid()}", port3,
                      mounts=[f"{models}:/mnt/models:ro"],
                      args=["--config", "/mnt/models/config.json"])
        containers.append(k)
        c.check(k.wait_healthy(), "container with --config /mnt/models/config.json becomes healthy",
                k.logs()[-2000:])
        st = dl.http("GET", k.url("/v2/models/mounted/ready"))[0]
        c.check(st == 200, "GET /v2/models/mounted/ready on the KServe-style container: 200",
                str(st))
        k.remove()

        # 4. A bad mounted config is refused: non-zero exit, message names the file.
        bad = os.path.join(tmp, "bad")
        os.makedirs(bad)
        with open(os.path.join(bad, "config.json"), "w") as f:
            f.write('{"server": {"no_such_key": 1}}')
        os.chmod(bad, 0o755)
        os.chmod(os.path.join(bad, "config.json"), 0o644)
        name = f"attnd-test-bad-{os.getpid()}"
        podman("rm", "-f", name)
        extra.append(name)
        r = podman("run", "--name", name, *ULIMITS, "-v", f"{bad}:/models:ro", IMAGE, timeout=60)
        c.check(r.returncode != 0 and "config.json" in (r.stdout + r.stderr),
                "a bad /models/config.json stops the container with a message naming it",
                f"rc {r.returncode}: {(r.stdout + r.stderr)[-500:]}")
    finally:
        if local is not None:
            dl.stop(local)
        for x in containers:
            x.remove()
        for name in extra:
            podman("rm", "-f", name)
        shutil.rmtree(tmp, ignore_errors=True)
    return c.finish()


if __name__ == "__main__":
    sys.exit(main())

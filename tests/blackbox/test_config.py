"""Config (SPEC section 3, and the weights loading it drives): flags and
ATTND_* variables, relative weight paths, prefixes, layouts and tensor maps,
F16/BF16 weights; a bad config or bad weights file is refused at start-up,
naming the file and the key (or tensor), with a non-zero exit."""
import json
import os
import re
import subprocess

import numpy as np
import pytest

import support
from support import BIN, Model, b64_tensor, from_b64_tensor, rel_err

GOLDENS = {g["name"]: m for g, m in support.load_goldens()}
SMALL = GOLDENS["self_e16_h1"]


# The exit codes, one meaning each (docs/config.md, "Signals and exit codes").
EXIT_CONFIG, EXIT_WEIGHTS, EXIT_LISTEN = 2, 3, 4


def refused(tmp_path, cfg, must_name=(), args=None, env=None, code=EXIT_CONFIG):
    """Starts attnd with a bad config; asserts it exits with code within 30 s
    and that its output names every string in must_name."""
    path = tmp_path / "bad-config.json"
    path.write_text(cfg if isinstance(cfg, str) else json.dumps(cfg))
    cmd = [str(BIN), "--host", "127.0.0.1", "--port", str(support.free_port()),
           "--config", str(path)] + list(args or [])
    e = {k: v for k, v in os.environ.items() if not k.startswith("ATTND_")}
    e.update(env or {})
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e,
                         cwd=tmp_path)
    try:
        out, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        raise AssertionError("attnd started with a bad config: %s" % cfg)
    text = (out + err).decode(errors="replace")
    assert p.returncode != 0, "exit code 0 for a bad config:\n" + text
    assert p.returncode > 0, "killed by signal %d:\n%s" % (-p.returncode, text)
    assert p.returncode == code, "exit code %d, not %d:\n%s" % (p.returncode, code, text)
    assert "bad-config.json" in text, "the message does not name the config file:\n" + text
    # one line that says why (docs/config.md), not the same error twice
    errors = [ln for ln in text.splitlines() if " error " in ln]
    assert len(errors) == 1, "not one error line:\n" + text
    for w in must_name:
        assert w in text, "the message does not name %r:\n%s" % (w, text)
    for m in support.SANITIZER_MARKS:
        assert m not in text, text
    return text


def model_cfg(**kw):
    c = SMALL.config()
    c.update(kw)
    return c


BAD = [
    ("not_json", '{"server": {"port": 8080,}', ()),
    ("top_unknown_key", {"sevrer": {}, "models": [model_cfg()]}, ("sevrer",)),
    ("server_unknown_key", {"server": {"prot": 1}, "models": [model_cfg()]}, ("prot",)),
    ("batching_unknown_key", {"batching": {"max_batch": 3}, "models": [model_cfg()]},
     ("max_batch",)),
    ("wrong_type", {"server": {"max_body_bytes": "big"}, "models": [model_cfg()]},
     ("max_body_bytes",)),
    ("negative_limit", {"limits": {"max_tokens_per_request": -1}, "models": [model_cfg()]},
     ("max_tokens_per_request",)),
    ("negative_workers", {"workers": {"threads": -1}, "models": [model_cfg()]}, ("threads",)),
    ("pin_threads_unknown_word", {"workers": {"pin_threads": "yes"}, "models": [model_cfg()]},
     ("pin_threads", '"auto", "on" or "off"')),
    ("cors_not_list", {"server": {"cors_origins": "*"}, "models": [model_cfg()]},
     ("cors_origins",)),
    ("model_unknown_key", {"models": [model_cfg(heads=1)]}, ("heads",)),
    ("model_heads_do_not_divide", {"models": [model_cfg(num_heads=3)]}, ("num_heads",)),
    ("kv_heads_do_not_divide", {"models": [model_cfg(num_heads=8, num_kv_heads=3)]},
     ("models[0].num_kv_heads", "3 does not divide num_heads 8")),
    # rope.dim left out is the head width, here 7: odd, refused as the config's
    ("rope_dim_default_odd", {"models": [model_cfg(embed_dim=56, num_heads=8, layout="llama",
                                                   rope={})]},
     ("models[0].rope.dim", "7 is odd")),
    ("models_not_list", {"models": {"name": "x"}}, ("models",)),
    ("duplicate_model_names", {"models": [model_cfg(), model_cfg()]}, ("self_e16_h1",)),
    ("server_key_in_wrong_section", {"server": {"max_batch_tokens": 3},
                                     "models": [model_cfg()]}, ("belongs in \"batching\"",)),
    ("did_you_mean_section", {"sevrer": {}, "models": [model_cfg()]},
     ('did you mean "server"',)),
    ("did_you_mean_model_key", {"models": [model_cfg(num_head=1)]},
     ('did you mean "num_heads"',)),
    ("did_you_mean_server_key", {"server": {"max_conections": 3}, "models": [model_cfg()]},
     ('did you mean "max_connections"',)),
    ("did_you_mean_role", {"models": [model_cfg(tensors={"q_wieght": "x"})]},
     ('did you mean "q_weight"',)),
    ("bad_log_format", {"server": {"log_format": "xml"}, "models": [model_cfg()]},
     ("log_format",)),
]

BAD_WEIGHTS = [
    ("weights_file_missing", {"models": [model_cfg(weights="no-such-file.safetensors")]},
     ("no-such-file.safetensors",)),
    # every tensor is named in one message, not only the first
    ("embed_dim_disagrees_with_weights", {"models": [model_cfg(embed_dim=32, num_heads=1, kdim=32,
                                                               vdim=32)]},
     ("4 tensors do not fit", '"in_proj_weight" has shape [48, 16] but needs [96, 32]',
      '"in_proj_bias"', '"out_proj.weight"', '"out_proj.bias"')),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_config_refused(tmp_path, case):
    _, cfg, words = case
    refused(tmp_path, cfg, words)


@pytest.mark.parametrize("case", BAD_WEIGHTS, ids=[c[0] for c in BAD_WEIGHTS])
def test_bad_weights_config_exit_3(tmp_path, case):
    _, cfg, words = case
    refused(tmp_path, cfg, words, code=EXIT_WEIGHTS)


def weights_file_cases(tmp_path):
    """(id, bytes of a broken safetensors file, tensor the message must name)."""
    good = tmp_path / "good.safetensors"
    SMALL.save(good)
    raw = good.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])

    def with_header(h, body=None):
        hb = json.dumps(h).encode()
        return len(hb).to_bytes(8, "little") + hb + (raw[8 + n:] if body is None else body)
    lie = json.loads(json.dumps(header))
    a, b = lie["out_proj.weight"]["data_offsets"]
    lie["out_proj.weight"]["data_offsets"] = [a, b + 4096]
    overlap = json.loads(json.dumps(header))
    overlap["out_proj.bias"]["data_offsets"] = [0, 64]
    shape = json.loads(json.dumps(header))
    shape["in_proj_weight"]["shape"] = [48, 16, 1]
    dtype = json.loads(json.dumps(header))
    dtype["in_proj_bias"]["dtype"] = "I64"
    missing = {k: v for k, v in header.items() if k != "out_proj.weight"}
    return [
        ("truncated", raw[: len(raw) - 100], None),
        ("header_length_lies", (10 ** 9).to_bytes(8, "little") + raw[8:], None),
        ("offsets_past_end", with_header(lie), "out_proj.weight"),
        ("offsets_overlap_size", with_header(overlap), "out_proj.bias"),
        ("wrong_shape", with_header(shape), "in_proj_weight"),
        ("unsupported_dtype", with_header(dtype), "in_proj_bias"),
        ("missing_tensor", with_header(missing), "out_proj.weight"),
        ("header_not_json", len(b"{nope").to_bytes(8, "little") + b"{nope", None),
        ("empty_file", b"", None),
    ]


@pytest.mark.parametrize("which", range(9))
def test_bad_weights_refused(tmp_path, which):
    cid, data, tensor = weights_file_cases(tmp_path)[which]
    w = tmp_path / ("broken-%s.safetensors" % cid)
    w.write_bytes(data)
    words = ["broken-%s.safetensors" % cid] + ([tensor] if tensor else [])
    refused(tmp_path, {"models": [model_cfg(weights=str(w))]}, words, code=EXIT_WEIGHTS)


@pytest.mark.parametrize("extra", [("bias_k",), ("bias_v",), ("bias_k", "bias_v")])
@pytest.mark.parametrize("prefix", ["", "layers.0.attn."])
def test_add_bias_kv_refused(tmp_path, extra, prefix):
    """nn.MultiheadAttention(add_bias_kv=True) keeps bias_k and bias_v (1, 1, E)
    beside its other tensors; attnd does not serve them, so such a file is
    refused at start-up (exit 3) naming the file and the tensor, not served
    without them."""
    w = tmp_path / "biaskv.safetensors"
    tensors = {prefix + k: v for k, v in SMALL.sd.items()}
    for name in extra:
        tensors[prefix + name] = np.full((1, 1, SMALL.E), 0.5, np.float32)
    support.write_safetensors(w, tensors)
    text = refused(tmp_path, {"models": [model_cfg(weights=str(w), prefix=prefix)]},
                   ["biaskv.safetensors", prefix + extra[0], "add_bias_kv"], code=EXIT_WEIGHTS)
    assert "does not serve" in text, text


def test_help_lists_flags():
    p = subprocess.run([str(BIN), "--help"], capture_output=True, timeout=30)
    text = (p.stdout + p.stderr).decode(errors="replace")
    assert p.returncode == 0, text
    for flag in ("--config", "--host", "--port", "--workers"):
        assert flag in text, "--help does not list %s:\n%s" % (flag, text)
    assert "ATTND_API_KEY" in text or "ATTND_" in text, text


def test_unknown_flag_refused():
    p = subprocess.run([str(BIN), "--no-such-flag"], capture_output=True, timeout=30)
    text = (p.stdout + p.stderr).decode(errors="replace")
    assert p.returncode == EXIT_CONFIG, text
    assert "--no-such-flag" in text, text


@pytest.mark.parametrize("flag,near", [("--prot", "--port"), ("--worker", "--workers"),
                                       ("--log-fromat", "--log-format")])
def test_unknown_flag_suggests_nearest(flag, near):
    p = subprocess.run([str(BIN), flag, "1"], capture_output=True, timeout=30)
    text = (p.stdout + p.stderr).decode(errors="replace")
    assert p.returncode == EXIT_CONFIG, text
    assert 'did you mean "%s"' % near in text, text


def test_version():
    p = subprocess.run([str(BIN), "--version"], capture_output=True, timeout=30)
    text = p.stdout.decode()
    assert p.returncode == 0, text
    assert re.fullmatch(r"attnd \d+\.\d+\.\d+\n", text), text


def check_serves(d, m):
    q = np.random.default_rng(1).standard_normal((4, m.E)).astype(np.float32)
    r = d.post("/v1/attention", {"query": b64_tensor(q), "encoding": "base64",
                                 "attention": "heads"})
    assert r.status_code == 200, r.text[:300]
    ref, w = m.forward(q)
    assert rel_err(from_b64_tensor(r.json()["output"]), ref) <= 1e-5
    assert rel_err(from_b64_tensor(r.json()["attention"]), w) <= 1e-5


def test_relative_weights_path_and_env_config(fresh_daemons, tmp_path):
    """ATTND_CONFIG names the file; its relative weights path resolves against
    the config's folder, not the working directory."""
    cdir = tmp_path / "conf"
    cdir.mkdir()
    m = Model.random("rel", 24, 4, seed=21)
    m.save(cdir / "rel.safetensors")
    cfg = m.config(weights="rel.safetensors")
    (cdir / "attnd.json").write_text(json.dumps({"models": [cfg]}))
    d = fresh_daemons(env={"ATTND_CONFIG": str(cdir / "attnd.json")})
    assert d.workdir != cdir
    check_serves(d, m)


def test_env_host_port(fresh_daemons):
    port = support.free_port()
    d = fresh_daemons({"models": [SMALL.config()]}, flags=False, port=port,
                      env={"ATTND_HOST": "127.0.0.1", "ATTND_PORT": str(port),
                           "ATTND_WORKERS": "1"})
    assert d.get("/health").status_code == 200


def test_flags_override_env_and_config(fresh_daemons):
    cfg_port, env_port = support.free_port(), support.free_port()
    d = fresh_daemons({"server": {"host": "127.0.0.1", "port": cfg_port},
                       "models": [SMALL.config()]},
                      env={"ATTND_PORT": str(env_port)})
    assert d.port not in (cfg_port, env_port)
    assert d.get("/health").status_code == 200


def test_config_file_with_a_byte_order_mark(fresh_daemons, tmp_path):
    """A config file that starts with a UTF-8 byte order mark (Notepad
    writes one) reads as without it."""
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"models": [SMALL.config()]}).encode())
    d = fresh_daemons(env={"ATTND_CONFIG": str(path)})
    check_serves(d, SMALL)


def test_kubernetes_service_links_are_not_ports(fresh_daemons):
    """A Service named "attnd" (or "attnd-grpc") makes Kubernetes set
    ATTND_PORT=tcp://ADDR:PORT (ATTND_GRPC_PORT=...) and its kin in every pod
    of the namespace: attnd ignores those addresses with a warn line each,
    serves on the config's ports, and says nothing of the kin."""
    port, gport = support.free_port(), support.free_port()
    link = {"ATTND_SERVICE_HOST": "10.96.0.12", "ATTND_SERVICE_PORT": "8080",
            "ATTND_SERVICE_PORT_HTTP": "8080", "ATTND_PORT": "tcp://10.96.0.12:8080",
            "ATTND_PORT_8080_TCP": "tcp://10.96.0.12:8080", "ATTND_PORT_8080_TCP_PROTO": "tcp",
            "ATTND_PORT_8080_TCP_PORT": "8080", "ATTND_PORT_8080_TCP_ADDR": "10.96.0.12",
            "ATTND_GRPC_SERVICE_HOST": "10.96.0.13", "ATTND_GRPC_PORT": "tcp://10.96.0.13:8081",
            "ATTND_GRPC_PORT_8081_TCP": "tcp://10.96.0.13:8081"}
    d = fresh_daemons({"server": {"host": "127.0.0.1", "port": port, "grpc_port": gport},
                       "models": [SMALL.config()]}, flags=False, port=port, env=link)
    assert d.get("/health").status_code == 200
    out = d.stdout()
    for var, key in (("ATTND_PORT", "server.port"), ("ATTND_GRPC_PORT", "server.grpc_port")):
        assert re.search(r" warn environment variable %s: .*service link.*not a value for %s; "
                         r"ignored" % (var, key), out), out
    assert "listening on 127.0.0.1:%d" % port in out, out
    assert not re.search(r"ATTND_(SERVICE|PORT_|GRPC_SERVICE|GRPC_PORT_)", out), out


def test_unknown_env_variables_are_named(fresh_daemons):
    """A misspelt ATTND_* variable does nothing, so the log says so, with
    the variable meant; the API key's own variable is not unknown, nor is
    ATTND_CONFIG (read when --config is not given, as here it is)."""
    d = fresh_daemons({"server": {"api_key_env": "ATTND_MY_KEY"}, "models": [SMALL.config()]},
                      env={"ATTND_WORKER": "3", "ATTND_MY_KEY": "k1",
                           "ATTND_CONFIG": "/nonexistent/attnd.json", "ATTND_CONFG": "x"})
    assert d.get("/health").status_code == 200
    out = d.stdout()
    assert re.search(r' warn environment variable ATTND_WORKER is not one attnd reads \(did '
                     r'you mean "ATTND_WORKERS"\?\); ignored', out), out
    assert re.search(r' warn environment variable ATTND_CONFG is not one attnd reads \(did '
                     r'you mean "ATTND_CONFIG"\?\); ignored', out), out
    assert "ATTND_CONFIG is not" not in out, out
    assert "ATTND_MY_KEY" not in out, out
    assert "ATTND_GRPC_PORT" not in out, out


def test_env_overrides_config(fresh_daemons):
    cfg_port, env_port = support.free_port(), support.free_port()
    d = fresh_daemons({"server": {"host": "127.0.0.1", "port": cfg_port},
                       "models": [SMALL.config()]}, flags=False, port=env_port,
                      env={"ATTND_PORT": str(env_port)})
    assert d.get("/health").status_code == 200


def split_in_proj(m):
    E = m.E
    w, b = m.sd["in_proj_weight"], m.sd["in_proj_bias"]
    return (w[:E], w[E:2 * E], w[2 * E:], b[:E], b[E:2 * E], b[2 * E:],
            m.sd["out_proj.weight"], m.sd["out_proj.bias"])


def test_prefix_layouts_and_tensor_map(fresh_daemons, tmp_path):
    """One checkpoint holding four layers, named the ways real models name
    them; each served through prefix, layout or tensors map."""
    torch_m = Model.random("torch_prefixed", 32, 4, seed=31)
    bert_m = Model.random("bert_layer", 32, 2, seed=32)
    bart_m = Model.random("bart_layer", 32, 8, seed=33)
    llama_m = Model.random("llama_layer", 32, 4, bias=False, seed=34)
    t = {}
    t.update({"encoder.layers.3.self_attn." + k: v for k, v in torch_m.sd.items()})
    t["encoder.layers.3.linear1.weight"] = np.ones((8, 32), dtype=np.float32)
    qw, kw, vw, qb, kb, vb, ow, ob = split_in_proj(bert_m)
    p = "bert.encoder.layer.0.attention."
    t.update({p + "self.query.weight": qw, p + "self.query.bias": qb,
              p + "self.key.weight": kw, p + "self.key.bias": kb,
              p + "self.value.weight": vw, p + "self.value.bias": vb,
              p + "output.dense.weight": ow, p + "output.dense.bias": ob})
    qw, kw, vw, qb, kb, vb, ow, ob = split_in_proj(bart_m)
    p = "model.decoder.layers.1.self_attn."
    t.update({p + "q_proj.weight": qw, p + "q_proj.bias": qb, p + "k_proj.weight": kw,
              p + "k_proj.bias": kb, p + "v_proj.weight": vw, p + "v_proj.bias": vb,
              p + "out_proj.weight": ow, p + "out_proj.bias": ob})
    E = 32
    w = llama_m.sd["in_proj_weight"]
    p = "model.layers.0.self_attn."
    t.update({p + "q_proj.weight": w[:E], p + "k_proj.weight": w[E:2 * E],
              p + "v_proj.weight": w[2 * E:], p + "o_proj.weight": llama_m.sd["out_proj.weight"]})
    ckpt = tmp_path / "checkpoint.safetensors"
    support.write_safetensors(ckpt, t)
    models = [
        dict(torch_m.config(weights=str(ckpt)), prefix="encoder.layers.3.self_attn."),
        dict(bert_m.config(weights=str(ckpt)), prefix="bert.encoder.layer.0.", layout="bert"),
        dict(bart_m.config(weights=str(ckpt)), prefix="model.decoder.layers.1.self_attn.",
             layout="hf_proj"),
        dict(llama_m.config(weights=str(ckpt)), prefix="model.layers.0.self_attn.",
             tensors={"q_weight": "q_proj.weight", "k_weight": "k_proj.weight",
                      "v_weight": "v_proj.weight", "out_weight": "o_proj.weight"}),
    ]
    d = fresh_daemons({"models": models})
    for m in (torch_m, bert_m, bart_m, llama_m):
        q = np.random.default_rng(2).standard_normal((5, m.E)).astype(np.float32)
        r = d.post("/v1/models/%s/attention" % m.name, {"query": b64_tensor(q),
                                                         "encoding": "base64"})
        assert r.status_code == 200, (m.name, r.text[:300])
        assert rel_err(from_b64_tensor(r.json()["output"]), m.forward(q)[0]) <= 1e-5, m.name


@pytest.mark.parametrize("dtype", ["F16", "BF16"])
def test_half_precision_weights(fresh_daemons, tmp_path, dtype):
    m = Model.random("half", 16, 2, seed=41)
    # values exactly representable in both formats: the load must be exact
    m.sd = {k: (np.round(v * 64) / 64).astype(np.float32) for k, v in m.sd.items()}
    m.save(tmp_path / "half.safetensors", dtype=dtype)
    d = fresh_daemons({"models": [m.config()]})
    check_serves(d, m)


def test_cross_weights_with_kdim_vdim(fresh_daemons, tmp_path):
    m = Model.random("kv", 24, 3, kdim=10, vdim=7, seed=51)
    m.save(tmp_path / "kv.safetensors")
    d = fresh_daemons({"models": [m.config()]})
    rng = np.random.default_rng(3)
    q = rng.standard_normal((3, 24)).astype(np.float32)
    k = rng.standard_normal((5, 10)).astype(np.float32)
    v = rng.standard_normal((5, 7)).astype(np.float32)
    r = d.post("/v1/attention", {"query": b64_tensor(q), "key": b64_tensor(k),
                                 "value": b64_tensor(v), "encoding": "base64"})
    assert r.status_code == 200, r.text[:300]
    assert rel_err(from_b64_tensor(r.json()["output"]), m.forward(q, k, v)[0]) <= 1e-5


def start_refused(args, env=None, must_name=(), code=EXIT_CONFIG):
    """Runs attnd with args (no config file); asserts a prompt exit with code
    whose output names every string in must_name."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("ATTND_")}
    e.update(env or {})
    try:
        p = subprocess.run([str(BIN)] + args, capture_output=True, env=e, timeout=30)
    except subprocess.TimeoutExpired:
        raise AssertionError("attnd kept running with %s %s" % (args, env))
    text = (p.stdout + p.stderr).decode(errors="replace")
    assert p.returncode == code, "exit %d for %s %s:\n%s" % (p.returncode, args, env, text)
    for w in must_name:
        assert w in text, "the message does not name %r:\n%s" % (w, text)
    return text


def test_port_in_use_refused():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    port = s.getsockname()[1]
    try:
        start_refused(["--host", "127.0.0.1", "--port", str(port)], must_name=(str(port),),
                      code=EXIT_LISTEN)
    finally:
        s.close()


@pytest.mark.parametrize("reuse", [False, True], ids=["plain", "so_reuseport"])
def test_grpc_port_in_use_refused(reuse):
    """The HTTP port free, the gRPC one held: exit 4 naming the gRPC address,
    with nothing of gRPC's left behind (under ASan a leak turns the code to 1).
    Held with SO_REUSEPORT too, as gRPC servers (another attnd, Triton) hold
    theirs: the daemon does not join it, which would split the calls."""
    import socket
    s = socket.socket()
    if reuse:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    port = s.getsockname()[1]
    try:
        text = start_refused(["--host", "127.0.0.1", "--port", str(support.free_port())],
                             env={"ATTND_GRPC_PORT": str(port)},
                             must_name=("cannot listen for gRPC on 127.0.0.1:%d" % port,),
                             code=EXIT_LISTEN)
    finally:
        s.close()
    assert not [m for m in support.SANITIZER_MARKS if m in text], text


@pytest.mark.parametrize("args,env,word", [
    (["--port", "eighty"], None, "--port"),
    (["--port", "70000"], None, "--port"),
    (["--workers", "-2"], None, "--workers"),
    ([], {"ATTND_PORT": "x1"}, "ATTND_PORT"),
    ([], {"ATTND_WORKERS": "many"}, "ATTND_WORKERS"),
    (["--config", "/nonexistent/attnd.json"], None, "/nonexistent/attnd.json"),
    (["--config", "/"], None, "/"),
], ids=["port-word", "port-range", "workers-negative", "env-port", "env-workers", "config-missing",
        "config-dir"])
def test_bad_flags_and_env_refused(args, env, word):
    start_refused(["--host", "127.0.0.1"] + args, env=env, must_name=(word,))

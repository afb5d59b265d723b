"""KServe v2 over gRPC (SPEC section 13, issue 30) against the real daemon,
through tritonclient.grpc and grpcio: every call of
inference.GRPCInferenceService and grpc.health.v1.Health; raw and `contents`
inputs; answers bit-identical to the HTTP v2 route's for the same inputs
(masks, cross-attention, attention outputs, selections) and torch's goldens
to 1e-5; each error code with the HTTP route's sentence; the API key;
deadlines; mixed HTTP and gRPC load sharing batches; sessions over ModelInfer
and ModelStreamInfer against the whole causal sequence; drain on SIGTERM;
grpc_port 0 and -1; /metrics counts, access log lines and traceparent."""
import json
import queue
import re
import signal
import socket
import threading
import time

import grpc
import numpy as np
import pytest
import requests
from google.protobuf import descriptor_pool
from tritonclient.utils import InferenceServerException

# tritonclient's messages and kserve's (test_kserve_client.py imports kserve,
# which loads its grpc_predict_v2 protos) both define the package "inference":
# one pytest process cannot hold both in protobuf's default pool, so
# tritonclient's generated modules register in a pool of their own
_default_pool = descriptor_pool.Default
_own_pool = descriptor_pool.DescriptorPool()
descriptor_pool.Default = lambda: _own_pool
try:
    import tritonclient.grpc as grpcclient
    from tritonclient.grpc import service_pb2, service_pb2_grpc
finally:
    descriptor_pool.Default = _default_pool

import support
from support import rel_err, v2_ranked, wait_until

TOL = 1e-5
GOLDENS = support.load_goldens()
BY_NAME = {g["name"]: (g, m) for g, m in GOLDENS}
DEC_DIR = support.GOLDEN_DIR / "decoder"
DECODERS = [json.loads(p.read_text()) for p in sorted(DEC_DIR.glob("*.json"))]
KEY = "grpc-key-7d41e2"
CASES = [pytest.param(g["name"], i, id="%s-%d" % (g["name"], i))
         for g, _ in GOLDENS for i in range(len(g["sequences"]))]
SEL_CASES = [pytest.param(g["name"], i, j, id="%s-%d-%d" % (g["name"], i, j))
             for g, _ in GOLDENS for i, s in enumerate(g["sequences"])
             for j in range(len(s.get("selections", [])))]
CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
         403: grpc.StatusCode.PERMISSION_DENIED, 404: grpc.StatusCode.NOT_FOUND,
         409: grpc.StatusCode.ABORTED, 413: grpc.StatusCode.RESOURCE_EXHAUSTED,
         429: grpc.StatusCode.RESOURCE_EXHAUSTED, 503: grpc.StatusCode.UNAVAILABLE,
         504: grpc.StatusCode.DEADLINE_EXCEEDED}
DT_NP = {"FP32": "<f4", "BOOL": "?", "INT32": "<i4", "INT64": "<i8", "FP16": "<f2",
         "BF16": "<u2", "FP64": "<f8"}


def decoder_entry(g, **extra):
    c = dict(g["config"])
    c["weights"] = str(DEC_DIR / c["weights"])
    c.update(extra)
    return c


def full_config(**sections):
    cfg = {"models": [m.config() for _, m in GOLDENS] + [decoder_entry(g) for g in DECODERS]}
    for k, v in sections.items():
        cfg[k] = v
    return cfg


@pytest.fixture(scope="module")
def d(daemons):
    return daemons(full_config())


@pytest.fixture(scope="module")
def client(d):
    c = grpcclient.InferenceServerClient(d.grpc_target)
    yield c
    c.close()


@pytest.fixture(scope="module")
def stub(d):
    ch = grpc.insecure_channel(d.grpc_target)
    yield service_pb2_grpc.GRPCInferenceServiceStub(ch)
    ch.close()


# ---------------------------------------------------------------- requests

def seq_tensors(seq, batch=True):
    """The inputs of one golden sequence, (name, array, datatype), as the
    v2 tests send them: query/key/value (1, n, width), key_padding_mask
    (1, S), attn_mask (L, S) BOOL or FP32."""
    out = []
    for f in ("query", "key", "value"):
        if seq.get(f) is not None:
            a = np.asarray(seq[f], dtype=np.float32)
            out.append((f, a[None] if batch else a, "FP32"))
    if seq.get("key_padding_mask") is not None:
        out.append(("key_padding_mask", np.asarray(seq["key_padding_mask"], bool)[None], "BOOL"))
    if seq.get("attn_mask") is not None:
        if seq.get("attn_mask_kind") == "bool":
            out.append(("attn_mask", np.asarray(seq["attn_mask"], bool), "BOOL"))
        else:
            out.append(("attn_mask", np.asarray(seq["attn_mask"], np.float32), "FP32"))
    return out


def seq_params(seq, sel=None):
    p = {"causal": bool(seq.get("causal", False)), "attention": seq.get("attention", "none")}
    if sel:
        p["attention"] = sel["attention"]
        if "attention_heads" in sel:
            p["attention_heads"] = ",".join(str(h) for h in sel["attention_heads"])
        if "attention_rows" in sel:
            p["attention_rows"] = "%d:%d" % tuple(sel["attention_rows"])
        if "attention_top_k" in sel:
            p["attention_top_k"] = sel["attention_top_k"]
    return p


def grpc_inputs(tensors):
    ins = []
    for name, a, dt in tensors:
        i = grpcclient.InferInput(name, list(a.shape), dt)
        i.set_data_from_numpy(a)
        ins.append(i)
    return ins


def grpc_raw(res):
    """{name: (datatype, shape, raw bytes)} of a ModelInferResponse."""
    resp = res.get_response() if hasattr(res, "get_response") else res
    assert len(resp.raw_output_contents) == len(resp.outputs), resp
    return {o.name: (o.datatype, list(o.shape), bytes(b))
            for o, b in zip(resp.outputs, resp.raw_output_contents)}


def http_binary(d, model, tensors, params, headers=None):
    """POST /v2/models/{model}/infer with the binary extension both ways:
    (status, {name: (datatype, shape, raw bytes)} or the error sentence,
    parameters)."""
    ins, blobs = [], []
    for name, a, dt in tensors:
        raw = np.ascontiguousarray(a, dtype=DT_NP[dt]).tobytes()
        ins.append({"name": name, "shape": list(a.shape), "datatype": dt,
                    "parameters": {"binary_data_size": len(raw)}})
        blobs.append(raw)
    # no "outputs": every output, in binary (binary_data_output)
    head = json.dumps({"inputs": ins,
                       "parameters": dict(params, binary_data_output=True)}).encode()
    hdr = {"Inference-Header-Content-Length": str(len(head)),
           "Content-Type": "application/octet-stream"}
    hdr.update(headers or {})
    r = requests.post("%s/v2/models/%s/infer" % (d.url, model), data=head + b"".join(blobs),
                      headers=hdr, timeout=60)
    if r.status_code != 200:
        return r.status_code, r.json().get("error"), None
    n = int(r.headers.get("Inference-Header-Content-Length", len(r.content)))
    a = json.loads(r.content[:n])
    at, outs = n, {}
    for o in a["outputs"]:
        size = o.get("parameters", {}).get("binary_data_size")
        if size is None:
            data = np.asarray(o["data"], dtype=DT_NP[o["datatype"]])
            outs[o["name"]] = (o["datatype"], o["shape"], data.tobytes())
        else:
            outs[o["name"]] = (o["datatype"], o["shape"], r.content[at:at + size])
            at += size
    return 200, outs, a.get("parameters", {})


def as_array(out):
    dt, shape, raw = out
    return np.frombuffer(raw, dtype=DT_NP[dt]).reshape(shape)


def rpc_error(fn, *a, **kw):
    with pytest.raises(grpc.RpcError) as e:
        fn(*a, **kw)
    return e.value


def pb_request(model, tensors, params, raw=True):
    """A ModelInferRequest by hand: raw_input_contents, or each input's contents."""
    req = service_pb2.ModelInferRequest(model_name=model)
    for k, v in params.items():
        p = req.parameters[k]
        if isinstance(v, bool):
            p.bool_param = v
        elif isinstance(v, int):
            p.int64_param = v
        else:
            p.string_param = v
    for name, a, dt in tensors:
        t = req.inputs.add(name=name, datatype=dt, shape=list(a.shape))
        if raw:
            req.raw_input_contents.append(np.ascontiguousarray(a, dtype=DT_NP[dt]).tobytes())
        elif dt == "FP32":
            t.contents.fp32_contents.extend(np.asarray(a, np.float32).reshape(-1).tolist())
        elif dt == "BOOL":
            t.contents.bool_contents.extend(np.asarray(a, bool).reshape(-1).tolist())
        elif dt == "INT64":
            t.contents.int64_contents.extend(np.asarray(a, np.int64).reshape(-1).tolist())
        elif dt == "INT32":
            t.contents.int_contents.extend(np.asarray(a, np.int32).reshape(-1).tolist())
        else:
            raise ValueError(dt)
    return req


def health_check(target, service="", timeout=10, metadata=None):
    """grpc.health.v1.Health/Check with the message's bytes written out:
    HealthCheckRequest{1: service}; returns HealthCheckResponse's status."""
    with grpc.insecure_channel(target) as ch:
        call = ch.unary_unary("/grpc.health.v1.Health/Check")
        s = service.encode()
        req = (b"\x0a" + bytes([len(s)]) + s) if s else b""
        resp = call(req, timeout=timeout, metadata=metadata)
    if not resp:
        return 0  # UNKNOWN, the default
    assert resp[0] == 0x08 and len(resp) == 2, resp
    return resp[1]


def health_watch(ch, service="", timeout=60, metadata=None):
    """grpc.health.v1.Health/Watch on channel ch: an iterator of the
    HealthCheckResponses' statuses (0 for UNKNOWN, the default)."""
    call = ch.unary_stream("/grpc.health.v1.Health/Watch")
    s = service.encode()
    req = (b"\x0a" + bytes([len(s)]) + s) if s else b""
    for resp in call(req, timeout=timeout, metadata=metadata):
        assert not resp or (resp[0] == 0x08 and len(resp) == 2), resp
        yield resp[1] if resp else 0


def grpc_count(d, method, code):
    """attnd_grpc_calls_total{method, code} now (0 when absent)."""
    total = 0.0
    for line in d.get("/metrics").text.splitlines():
        if line.startswith("attnd_grpc_calls_total{") and 'method="%s"' % method in line \
                and 'code="%s"' % code in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


# ---------------------------------------------------------------- every call

def test_server_live_ready_metadata(client, d):
    assert client.is_server_live() is True
    assert client.is_server_ready() is True
    md = client.get_server_metadata()
    http = d.get("/v2").json()
    assert md.name == http["name"] and md.version == http["version"]
    assert list(md.extensions) == http.get("extensions", [])


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_model_ready_and_metadata_equal_http(client, d, name):
    assert client.is_model_ready(name) is True
    md = client.get_model_metadata(name)
    http = d.get("/v2/models/" + name).json()
    assert md.name == name and md.platform == http["platform"] == "attnd_safetensors"
    for mine, theirs in ((md.inputs, http["inputs"]), (md.outputs, http["outputs"])):
        assert [(t.name, t.datatype, list(t.shape)) for t in mine] == \
            [(t["name"], t["datatype"], t["shape"]) for t in theirs]


def test_unknown_model_is_not_found(stub, d):
    r = d.get("/v2/models/nope/ready")
    assert r.status_code == 404
    e = rpc_error(stub.ModelReady, service_pb2.ModelReadyRequest(name="nope"), timeout=10)
    assert e.code() == grpc.StatusCode.NOT_FOUND, e
    e = rpc_error(stub.ModelMetadata, service_pb2.ModelMetadataRequest(name="nope"), timeout=10)
    assert e.code() == grpc.StatusCode.NOT_FOUND
    assert e.details() == d.get("/v2/models/nope").json()["error"]


def test_unknown_version_is_not_found_in_http_words(stub, d):
    """A version other than the one serving: NOT_FOUND with the HTTP route's
    sentence, for ModelReady, ModelMetadata and ModelInfer alike."""
    name = "self_e16_h1"
    g, _ = BY_NAME[name]
    r = d.get("/v2/models/%s/versions/7" % name)
    assert r.status_code == 404 and "version '7'" in r.json()["error"], r.text
    st, msg, _ = http_binary(d, name + "/versions/7", seq_tensors(g["sequences"][0]), {})
    assert st == 404 and msg == r.json()["error"], msg
    calls = [(stub.ModelReady, service_pb2.ModelReadyRequest(name=name, version="7")),
             (stub.ModelMetadata, service_pb2.ModelMetadataRequest(name=name, version="7"))]
    infer = pb_request(name, seq_tensors(g["sequences"][0]), {})
    infer.model_version = "7"
    for call, req in calls + [(stub.ModelInfer, infer)]:
        e = rpc_error(call, req, timeout=10)
        assert e.code() == grpc.StatusCode.NOT_FOUND and e.details() == msg, e


def test_health_check(d):
    assert health_check(d.grpc_target) == 1
    assert health_check(d.grpc_target, "inference.GRPCInferenceService") == 1
    e = rpc_error(health_check, d.grpc_target, "no.such.Service")
    assert e.code() == grpc.StatusCode.NOT_FOUND


# ---------------------------------------------------------------- numbers

@pytest.mark.parametrize("name,i", CASES)
def test_model_infer_bit_identical_to_http_and_torch(client, d, name, i):
    """tritonclient's raw inputs; the same inputs as HTTP v2 binary: the
    same outputs, datatypes, shapes and bits; torch's numbers to 1e-5."""
    g, _ = BY_NAME[name]
    seq = g["sequences"][i]
    tensors, params = seq_tensors(seq), seq_params(seq)
    res = client.infer(name, grpc_inputs(tensors), parameters=params)
    got = grpc_raw(res)
    status, want, _ = http_binary(d, name, tensors, params)
    assert status == 200, want
    assert got == want
    out = as_array(got["output"])
    assert rel_err(out, v2_ranked(seq["output"])) <= TOL
    if params["attention"] != "none" and seq.get("attn_weights") is not None:
        assert rel_err(as_array(got["attention"]),
                       v2_ranked(seq["attn_weights"], params["attention"])) <= TOL
    assert res.as_numpy("output").shape == out.shape


@pytest.mark.parametrize("name,i", [c for c in CASES if c.values[0] in ("self_e30_h3",
                                                                         "cross_e48_h4_k40_v24",
                                                                         "nobias_e32_h4")])
def test_contents_inputs_equal_raw_inputs(stub, name, i):
    """Inputs in contents (fp32_contents, bool_contents) answer the bits of
    the same inputs raw."""
    g, _ = BY_NAME[name]
    seq = g["sequences"][i]
    tensors, params = seq_tensors(seq), seq_params(seq)
    raw = grpc_raw(stub.ModelInfer(pb_request(name, tensors, params, raw=True), timeout=60))
    typed = grpc_raw(stub.ModelInfer(pb_request(name, tensors, params, raw=False), timeout=60))
    assert raw == typed
    assert rel_err(as_array(typed["output"]), v2_ranked(seq["output"])) <= TOL


def test_contents_that_do_not_fit_are_named(stub):
    """Values in another type's contents field, or fewer or more values than
    the shape holds: INVALID_ARGUMENT naming the input and the field."""
    g, _ = BY_NAME["self_e16_h1"]
    q = np.asarray(g["sequences"][0]["query"], np.float32)[None]
    n = q.size
    cases = []
    req = pb_request("self_e16_h1", [("query", q, "FP32")], {}, raw=False)
    del req.inputs[0].contents.fp32_contents[:]
    req.inputs[0].contents.int_contents.extend([1] * n)
    cases.append((req, "inputs[0] (query).contents.int_contents: FP32 values go in fp32_contents"))
    for k in (n - 3, n + 1):
        req = pb_request("self_e16_h1", [("query", q, "FP32")], {}, raw=False)
        del req.inputs[0].contents.fp32_contents[:]
        req.inputs[0].contents.fp32_contents.extend([0.5] * k)
        cases.append((req, "inputs[0] (query).contents.fp32_contents: %d values where the shape "
                           "needs %d" % (k, n)))
    for req, said in cases:
        e = rpc_error(stub.ModelInfer, req, timeout=30)
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and e.details() == said, e


@pytest.mark.parametrize("dt", ["INT64", "INT32"])
def test_integer_contents_positions(stub, client, dt):
    """A rope model's positions input in int64_contents / int_contents, and
    raw through tritonclient: 0..L-1 given answer the bits of none given."""
    g = DECODERS[0]
    q = np.asarray(g["sequences"][0]["query"], np.float32)[None]
    pos = np.arange(q.shape[1], dtype=np.int64 if dt == "INT64" else np.int32)
    none = grpc_raw(stub.ModelInfer(pb_request(g["name"], [("query", q, "FP32")], {}),
                                    timeout=60))
    tensors = [("query", q, "FP32"), ("positions", pos, dt)]
    typed = grpc_raw(stub.ModelInfer(pb_request(g["name"], tensors, {}, raw=False), timeout=60))
    raw = grpc_raw(client.infer(g["name"], grpc_inputs(tensors)))
    assert typed == none and raw == none
    assert rel_err(as_array(none["output"])[0], np.asarray(g["sequences"][0]["output"])) <= TOL
    # shifted positions change the answer: the input is read, not ignored
    moved = [("query", q, "FP32"), ("positions", pos + 3, dt)]
    assert grpc_raw(stub.ModelInfer(pb_request(g["name"], moved, {}, raw=False),
                                    timeout=60)) != none


@pytest.mark.parametrize("name,i,j", SEL_CASES)
@pytest.mark.parametrize("datatype", [None, "FP16", "BF16"])
def test_selections_bit_identical_to_http(client, d, name, i, j, datatype):
    g, _ = BY_NAME[name]
    seq = g["sequences"][i]
    sel = seq["selections"][j]
    tensors, params = seq_tensors(seq), seq_params(seq, sel)
    if datatype:
        params["attention_datatype"] = datatype
    got = grpc_raw(client.infer(name, grpc_inputs(tensors), parameters=params))
    status, want, _ = http_binary(d, name, tensors, params)
    assert status == 200, want
    assert got == want
    if sel.get("attention_top_k"):
        assert {"attention_topk_indices", "attention_topk_values"} <= set(got)
    else:
        assert got["attention"][0] == (datatype or "FP32")


# ---------------------------------------------------------------- errors

def bad_bodies():
    """(model, tensors, params, status) that the HTTP v2 route refuses."""
    g, _ = BY_NAME["self_e16_h1"]
    q = np.asarray(g["sequences"][0]["query"], np.float32)[None]
    return [
        ("self_e16_h1", [("query", q[:, :, :8].copy(), "FP32")], {}, 400),
        ("self_e16_h1", [("query", q, "FP32")], {"attention": "sideways"}, 400),
        ("self_e16_h1", [("query", q, "FP32")], {"attention_top_k": 99,
                                                 "attention": "mean"}, 400),
        ("self_e16_h1", [("nonsense", q, "FP32")], {}, 400),
        ("no_such_model", [("query", q, "FP32")], {}, 404),
        ("self_e16_h1", [("query", q, "FP32")],
         {"session_id": "0123456789abcdef0123456789abcdef"}, 404),
    ]


@pytest.mark.parametrize("k", range(6))
def test_refusals_carry_the_http_sentence(stub, d, k):
    model, tensors, params, status = bad_bodies()[k]
    st, msg, _ = http_binary(d, model, tensors, params)
    assert st == status, (st, msg)
    e = rpc_error(stub.ModelInfer, pb_request(model, tensors, params), timeout=30)
    assert e.code() == CODES[status], (e.code(), e.details())
    assert e.details() == msg


def test_message_over_max_body_bytes(daemons):
    """A message over server.max_body_bytes: RESOURCE_EXHAUSTED with HTTP's
    413 sentence for a body of its size, counted as a 413 (too_large, the
    access log's status=413), unary and on a stream (which goes on); a 413
    (limits.max_tokens_per_request): RESOURCE_EXHAUSTED with the HTTP
    sentence."""
    dd = daemons(full_config(server={"max_body_bytes": 4096},
                             limits={"max_tokens_per_request": 32}))
    q = np.zeros((1, 64, 16), np.float32)  # 4 KiB of floats and the rest
    big = pb_request("self_e16_h1", [("query", q, "FP32")], {})
    said = "body of %d bytes, the limit is 4096" % big.ByteSize()
    with grpc.insecure_channel(dd.grpc_target) as ch:
        s = service_pb2_grpc.GRPCInferenceServiceStub(ch)
        e = rpc_error(s.ModelInfer, big, timeout=30,
                      metadata=[("x-request-id", "grpc-too-large-1")])
        assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
        assert e.details() == said, e
        small = pb_request("self_e16_h1", [("query", q[:, :4], "FP32")], {})
        got = list(s.ModelStreamInfer(iter([small, big, small]), timeout=30))
        assert [a.error_message for a in got] == ["", said, ""], got
        assert wait_until(lambda: grpc_count(dd, "ModelInfer", "RESOURCE_EXHAUSTED") == 1, 10)
        assert grpc_count(dd, "ModelInfer", "CANCELLED") == 0
        assert grpc_count(dd, "ModelStreamInfer", "OK") == 1
        assert refusal_counts(dd)["too_large"] == 2
        log = [ln for ln in dd.stdout().splitlines() if "grpc-too-large-1" in ln]
        assert log and "status=413" in log[-1], log
        ok = s.ModelInfer(pb_request("self_e16_h1", [("query", q[:, :4], "FP32")], {}),
                          timeout=30)
        assert as_array(grpc_raw(ok)["output"]).shape == (1, 4, 16)
        many = [("query", q[:, :40].copy(), "FP32")]  # 2560 bytes, 80 tokens
        st, msg, _ = http_binary(dd, "self_e16_h1", many, {})
        assert st == 413, msg
        e = rpc_error(s.ModelInfer, pb_request("self_e16_h1", many, {}), timeout=30)
        assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and e.details() == msg


def test_queue_full_is_resource_exhausted(daemons):
    """429 (max_queue_requests 1 with a long queue delay: the second request
    finds the queue full) is RESOURCE_EXHAUSTED with the HTTP sentence; 409
    is in the x-session-id test."""
    dd = daemons(full_config(batching={"max_queue_delay_us": 1500000, "max_queue_requests": 1}))
    g, _ = BY_NAME["self_e16_h1"]
    q = np.asarray(g["sequences"][0]["query"], np.float32)[None]
    with grpc.insecure_channel(dd.grpc_target) as ch:
        s = service_pb2_grpc.GRPCInferenceServiceStub(ch)
        first = s.ModelInfer.future(pb_request("self_e16_h1", [("query", q, "FP32")], {}),
                                    timeout=60)
        # queued, waiting out the delay
        assert wait_until(lambda: queue_depth(dd) == 1, 10), dd.get("/metrics").text[-2000:]
        st, msg, _ = http_binary(dd, "self_e16_h1", [("query", q, "FP32")], {})
        e = rpc_error(s.ModelInfer, pb_request("self_e16_h1", [("query", q, "FP32")], {}),
                      timeout=60)
        assert first.result().outputs
        assert st == 429, msg
        assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
        assert e.details() == msg


def queue_depth(d):
    total = 0.0
    for line in d.get("/metrics").text.splitlines():
        if line.startswith("attnd_queue_depth"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_permission_denied_without_model_control(stub, d):
    r = d.post("/v2/repository/index", {})
    assert r.status_code == 403
    e = rpc_error(stub.RepositoryIndex, service_pb2.RepositoryIndexRequest(), timeout=10)
    assert e.code() == grpc.StatusCode.PERMISSION_DENIED and e.details() == r.json()["error"]
    e = rpc_error(stub.RepositoryModelUnload,
                  service_pb2.RepositoryModelUnloadRequest(model_name="self_e16_h1"), timeout=10)
    assert e.code() == grpc.StatusCode.PERMISSION_DENIED


# ---------------------------------------------------------------- the key

def test_api_key(daemons):
    dd = daemons(full_config(), env={"ATTND_API_KEY": KEY})
    g, _ = BY_NAME["self_e16_h1"]
    tensors = seq_tensors(g["sequences"][0])
    with grpc.insecure_channel(dd.grpc_target) as ch:
        s = service_pb2_grpc.GRPCInferenceServiceStub(ch)
        # the open calls, as /v2/health/*
        assert s.ServerLive(service_pb2.ServerLiveRequest(), timeout=10).live
        assert s.ServerReady(service_pb2.ServerReadyRequest(), timeout=10).ready
        assert health_check(dd.grpc_target) == 1
        assert next(health_watch(ch)) == 1
        req = pb_request("self_e16_h1", tensors, {})
        st, msg, _ = http_binary(dd, "self_e16_h1", tensors, {})
        assert st == 401
        for md in (None, [("authorization", "Bearer wrong")], [("authorization", KEY)]):
            e = rpc_error(s.ModelInfer, req, timeout=10, metadata=md)
            assert e.code() == grpc.StatusCode.UNAUTHENTICATED, (md, e)
            # the HTTP sentence (Authorization travels as gRPC metadata)
            assert e.details() == msg, \
                (e.details(), msg)
        e = rpc_error(s.ServerMetadata, service_pb2.ServerMetadataRequest(), timeout=10)
        assert e.code() == grpc.StatusCode.UNAUTHENTICATED
        # a model's readiness needs the key, as GET /v2/models/{name}/ready does
        assert dd.get("/v2/models/self_e16_h1/ready").status_code == 401
        for name in ("self_e16_h1", "nope"):
            e = rpc_error(s.ModelReady, service_pb2.ModelReadyRequest(name=name), timeout=10)
            assert e.code() == grpc.StatusCode.UNAUTHENTICATED and "nope" not in e.details(), e
        good = [("authorization", "Bearer " + KEY)]
        assert s.ModelReady(service_pb2.ModelReadyRequest(name="self_e16_h1"), timeout=10,
                            metadata=good).ready
        out = grpc_raw(s.ModelInfer(req, timeout=30, metadata=good))
        assert rel_err(as_array(out["output"]), v2_ranked(g["sequences"][0]["output"])) <= TOL
        assert s.ServerMetadata(service_pb2.ServerMetadataRequest(), timeout=10,
                                metadata=good).name


# ---------------------------------------------------------------- deadlines

@pytest.fixture(scope="module")
def slow(daemons):
    """A queue delay of 2 s while compute is idle: a lone request waits it."""
    return daemons(full_config(batching={"max_queue_delay_us": 2000000}))


def test_client_deadline_is_deadline_exceeded(slow):
    g, _ = BY_NAME["self_e16_h1"]
    tensors = seq_tensors(g["sequences"][0])
    c = grpcclient.InferenceServerClient(slow.grpc_target)
    with pytest.raises(InferenceServerException) as e:
        c.infer("self_e16_h1", grpc_inputs(tensors), client_timeout=0.3)
    assert "DEADLINE_EXCEEDED" in str(e.value.status()), e.value
    c.close()


def test_timeout_ms_is_504_and_deadline_exceeded(slow):
    g, _ = BY_NAME["self_e16_h1"]
    tensors = seq_tensors(g["sequences"][0])
    st, msg, _ = http_binary(slow, "self_e16_h1", tensors, {"timeout_ms": 200})
    assert st == 504, msg
    with grpc.insecure_channel(slow.grpc_target) as ch:
        s = service_pb2_grpc.GRPCInferenceServiceStub(ch)
        e = rpc_error(s.ModelInfer, pb_request("self_e16_h1", tensors, {"timeout_ms": 200}),
                      timeout=30)
        assert e.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert e.details() == msg


# ---------------------------------------------------------------- one queue

def test_mixed_http_and_grpc_load_share_batches(daemons):
    dd = daemons(full_config(batching={"max_queue_delay_us": 20000}))
    work = [(name, i) for name in ("self_e30_h3", "nobias_e32_h4", "self_e64_h8")
            for i in range(len(BY_NAME[name][0]["sequences"]))]
    wants = {}
    for name, i in work:
        seq = BY_NAME[name][0]["sequences"][i]
        st, out, _ = http_binary(dd, name, seq_tensors(seq), seq_params(seq))
        assert st == 200
        wants[(name, i)] = out
    errors, batches = [], []
    c = grpcclient.InferenceServerClient(dd.grpc_target)

    def run(k):
        try:
            for rep in range(3):
                for n, (name, i) in enumerate(work):
                    seq = BY_NAME[name][0]["sequences"][i]
                    tensors, params = seq_tensors(seq), seq_params(seq)
                    if (k + n + rep) % 2:
                        res = c.infer(name, grpc_inputs(tensors), parameters=params)
                        got = grpc_raw(res)
                        batches.append(("grpc", res.get_response().parameters["batch"]
                                        .int64_param))
                    else:
                        st, got, p = http_binary(dd, name, tensors, params)
                        assert st == 200, got
                        batches.append(("http", p.get("batch")))
                    assert got == wants[(name, i)], (name, i)
        except Exception as e:  # reported below
            errors.append(repr(e))

    ts = [threading.Thread(target=run, args=(k,)) for k in range(6)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(300)
    c.close()
    assert not errors, errors[:3]
    assert any(b and b > 1 for kind, b in batches if kind == "grpc"), batches[:20]
    assert any(b and b > 1 for kind, b in batches if kind == "http"), batches[:20]


# ---------------------------------------------------------------- sessions

def dec_rows(g):
    return np.asarray(g["sequences"][0]["query"], np.float32)


def q_in(rows):
    return grpc_inputs([("query", rows[None], "FP32")])


@pytest.mark.parametrize("g", DECODERS, ids=[g["name"] for g in DECODERS])
def test_session_unary_steps_equal_whole(client, g):
    q = dec_rows(g)
    name = g["name"]
    whole = client.infer(name, q_in(q), parameters={"causal": True}).as_numpy("output")
    assert rel_err(whole[0], np.asarray(g["sequences"][0]["output"])) <= TOL
    first = client.infer(name, q_in(q[:5]), parameters={"session_open": True})
    p = first.get_response().parameters
    sid = p["session_id"].string_param
    assert p["cached_tokens"].int64_param == 5
    outs = [first.as_numpy("output")]
    at = 5
    for n in (1, 2, 1, 3):
        # the last step closes the session once it is answered
        r = client.infer(name, q_in(q[at:at + n]),
                         parameters={"session_id": sid, "session_close": n == 3})
        assert r.get_response().parameters["cached_tokens"].int64_param == at + n
        outs.append(r.as_numpy("output"))
        at += n
    got = np.concatenate(outs, axis=1)
    assert np.array_equal(got.view(np.uint32), whole[:, :at].view(np.uint32))
    # closed with its last step: a step now is NOT_FOUND
    with pytest.raises(InferenceServerException) as e:
        client.infer(name, q_in(q[at:at + 1]), parameters={"session_id": sid})
    assert "NOT_FOUND" in str(e.value.status())


def test_session_over_model_stream_infer(client, d):
    g = DECODERS[0]
    q = dec_rows(g)
    name = g["name"]
    whole = client.infer(name, q_in(q), parameters={"causal": True}).as_numpy("output")
    answers = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer(name, q_in(q[:3]), parameters={"session_open": True},
                                  request_id="open")
        res, err = answers.get(timeout=60)
        assert err is None, err
        sid = res.get_response().parameters["session_id"].string_param
        outs = [res.as_numpy("output")]
        # every step sent at once: answered one by one, in order
        for at in range(3, len(q)):
            client.async_stream_infer(name, q_in(q[at:at + 1]),
                                      parameters={"session_id": sid}, request_id="s%d" % at)
        # a refused message answers error_message and the stream goes on
        client.async_stream_infer("no_such_model", q_in(q[:1]), request_id="bad")
        client.async_stream_infer(name, grpc_inputs([]),
                                  parameters={"session_id": sid, "session_close": True},
                                  request_id="close")
        for at in range(3, len(q)):
            res, err = answers.get(timeout=60)
            assert err is None, err
            assert res.get_response().id == "s%d" % at
            assert res.get_response().parameters["cached_tokens"].int64_param == at + 1
            outs.append(res.as_numpy("output"))
        res, err = answers.get(timeout=60)
        assert res is None and err is not None
        st, msg, _ = http_binary(d, "no_such_model", [("query", q[None, :1], "FP32")], {})
        assert st == 404 and err.message() == msg, (err.message(), msg)
        res, err = answers.get(timeout=60)
        assert err is None, err
        p = res.get_response().parameters
        assert p["session_closed"].bool_param is True and p["session_id"].string_param == sid
        assert len(res.get_response().outputs) == 0
    finally:
        client.stop_stream()
    got = np.concatenate(outs, axis=1)
    assert np.array_equal(got.view(np.uint32), whole.view(np.uint32))


def test_stream_ended_by_the_client_with_steps_out(stub, client):
    """Every step sent and the stream half-closed at once: the daemon reads
    ahead while a step computes, and still answers each step in order,
    then ends the stream OK (not before its last answer)."""
    g = DECODERS[1]
    q = dec_rows(g)
    name = g["name"]
    whole = client.infer(name, q_in(q), parameters={"causal": True}).as_numpy("output")
    opened = stub.ModelInfer(pb_request(name, [("query", q[None, :2], "FP32")],
                                        {"session_open": True}), timeout=30)
    sid = opened.parameters["session_id"].string_param
    steps = [pb_request(name, [("query", q[None, at:at + 1], "FP32")], {"session_id": sid})
             for at in range(2, len(q))]
    for at, req in zip(range(2, len(q)), steps):
        req.id = "s%d" % at
    answers = list(stub.ModelStreamInfer(iter(steps), timeout=60))  # raises unless OK
    assert [a.error_message for a in answers] == [""] * len(steps)
    assert [a.infer_response.id for a in answers] == [r.id for r in steps]
    outs = [np.frombuffer(opened.raw_output_contents[0], np.float32).reshape(1, 2, -1)]
    outs += [np.frombuffer(a.infer_response.raw_output_contents[0], np.float32).reshape(1, 1, -1)
             for a in answers]
    got = np.concatenate(outs, axis=1)
    assert np.array_equal(got.view(np.uint32), whole.view(np.uint32))
    stub.ModelInfer(pb_request(name, [], {"session_id": sid, "session_close": True}), timeout=30)


def test_stream_answers_wait_for_a_slow_reader(stub, client):
    """Sixty steps sent at once and their answers (1 MiB) left unread for a
    second: the daemon computes each step as soon as the one before it is
    answered and queues its answer behind the send that waits for the
    reader (HTTP/2 flow control), so every answer still comes once, in
    order, with the bits of the whole causal sequence."""
    name, prefix, n, rows = "gqa_half", 16, 60, 64
    q = np.random.RandomState(7).uniform(-1, 1, (prefix + n * rows, 64)).astype(np.float32)
    whole = client.infer(name, q_in(q), parameters={"causal": True}).as_numpy("output")
    opened = stub.ModelInfer(pb_request(name, [("query", q[None, :prefix], "FP32")],
                                        {"session_open": True}), timeout=30)
    sid = opened.parameters["session_id"].string_param
    steps = []
    for k in range(n):
        at = prefix + k * rows
        steps.append(pb_request(name, [("query", q[None, at:at + rows], "FP32")],
                                {"session_id": sid}))
        steps[-1].id = "s%d" % k
    answers = stub.ModelStreamInfer(iter(steps), timeout=120)
    time.sleep(1.0)  # nothing read: the daemon's sends wait, its answers queue
    got = list(answers)  # raises unless the stream ends OK
    assert [a.error_message for a in got] == [""] * n
    assert [a.infer_response.id for a in got] == [r.id for r in steps]
    assert [a.infer_response.parameters["cached_tokens"].int64_param for a in got] == [
        prefix + (k + 1) * rows for k in range(n)]
    outs = [np.frombuffer(opened.raw_output_contents[0], np.float32).reshape(1, prefix, -1)]
    outs += [np.frombuffer(a.infer_response.raw_output_contents[0], np.float32)
             .reshape(1, rows, -1) for a in got]
    got_all = np.concatenate(outs, axis=1)
    assert np.array_equal(got_all.view(np.uint32), whole.view(np.uint32))
    stub.ModelInfer(pb_request(name, [], {"session_id": sid, "session_close": True}), timeout=30)


def merged_steps(d):
    """attnd_grpc_stream_merged_steps_total now."""
    for line in d.get("/metrics").text.splitlines():
        if line.startswith("attnd_grpc_stream_merged_steps_total "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no attnd_grpc_stream_merged_steps_total in /metrics")


@pytest.fixture(scope="module")
def held(daemons):
    """A daemon whose batches wait 100 ms for company: a stream's steps
    sent at once queue behind the one in flight, as they do behind a
    longer step on a busy server."""
    return daemons(full_config(batching={"max_queue_delay_us": 100000}))


def open_session(s, name, rows):
    r = s.ModelInfer(pb_request(name, [("query", rows[None], "FP32")], {"session_open": True}),
                     timeout=30)
    return r, r.parameters["session_id"].string_param


def step_requests(name, sid, rows, extra=lambda k: {}):
    """A one-row step of session sid for each of rows, parameters
    session_id and extra(k)."""
    return [pb_request(name, [("query", row[None, None], "FP32")], dict({"session_id": sid},
                                                                       **extra(k)))
            for k, row in enumerate(rows)]


def one_by_one(s, name, prefix, rows):
    """Each of rows as a step of its own (unary ModelInfer) after prefix,
    on a session of its own: each step's output, one row of bits."""
    _, sid = open_session(s, name, prefix)
    outs = []
    for row in rows:
        r = s.ModelInfer(pb_request(name, [("query", row[None, None], "FP32")],
                                    {"session_id": sid}), timeout=30)
        outs.append(r.raw_output_contents[0])
    s.ModelInfer(pb_request(name, [], {"session_id": sid, "session_close": True}), timeout=30)
    return outs


def avx512f(d):
    """The daemon found AVX-512F (its start line's cpu features; not so
    under valgrind, whose CPU has none)."""
    log = d.stderr_path.read_text() + d.stdout_path.read_text()
    m = re.search(r"cpu features (\S+);", log)
    assert m, log[:2000]
    return "avx512f" in m.group(1).split(",")


# (model, merges): a decoder model's rows are computed alone, the fused
# AVX-512 block's (head width a multiple of 16) never depend on their
# block; plain MHA on OpenBLAS tiles (head width 8) does, so it never merges
MERGES = [("gqa_half", True), ("self_e16_h1", None), ("self_e64_h8", False)]


@pytest.mark.parametrize("name,merges", MERGES, ids=[m for m, _ in MERGES])
def test_stream_steps_sent_ahead_merge(held, stub, name, merges):
    """Forty one-row steps sent at once on a stream: those that wait
    behind a step go as one step of all their rows (the metric counts
    them) where that gives each row the same bits, and each still gets its
    own answer, in order, with its id, its cached_tokens, and the bits it
    gets as a step alone."""
    prefix, n = 8, 40
    E = BY_NAME[name][0]["embed_dim"] if name in BY_NAME else 64
    q = np.random.RandomState(11).uniform(-1, 1, (prefix + n, E)).astype(np.float32)
    alone = one_by_one(stub, name, q[:prefix], q[prefix:])
    with grpc.insecure_channel(held.grpc_target) as ch:
        s = service_pb2_grpc.GRPCInferenceServiceStub(ch)
        _, sid = open_session(s, name, q[:prefix])
        before = merged_steps(held)
        steps = step_requests(name, sid, q[prefix:])
        for k, r in enumerate(steps):
            r.id = "m%d" % k
        got = list(s.ModelStreamInfer(iter(steps), timeout=60))
        assert [a.error_message for a in got] == [""] * n
        assert [a.infer_response.id for a in got] == [r.id for r in steps]
        assert [a.infer_response.parameters["cached_tokens"].int64_param for a in got] == [
            prefix + k + 1 for k in range(n)]
        assert all(list(a.infer_response.outputs[0].shape) == [1, 1, E] for a in got)
        assert [a.infer_response.raw_output_contents[0] for a in got] == alone
        # the first step goes alone; the rest came while it waited (16 held at most)
        if merges is None:
            merges = avx512f(held)
        if merges:
            assert merged_steps(held) - before >= n // 2
        else:
            assert merged_steps(held) == before


def test_stream_merged_step_refused_goes_again_alone(held, stub):
    """Steps sent at once where one holds a NaN and one's bytes are not its
    shape's: the first is refused within a merged step, which then goes
    again message by message; the second never merges. Each gets the
    answer it gets alone (the HTTP route's sentence for the two refused),
    and the others the bits of the same steps alone without them."""
    name, prefix, n, nan_at, short_at = "gqa_half", 4, 24, 9, 17
    q = np.random.RandomState(12).uniform(-1, 1, (prefix + n, 64)).astype(np.float32)
    bad = q[prefix + nan_at].copy()
    bad[5] = np.nan
    ok = [k for k in range(n) if k not in (nan_at, short_at)]
    alone = one_by_one(stub, name, q[:prefix], q[[prefix + k for k in ok]])
    with grpc.insecure_channel(held.grpc_target) as ch:
        s = service_pb2_grpc.GRPCInferenceServiceStub(ch)
        _, sid = open_session(s, name, q[:prefix])
        before = merged_steps(held)
        rows = [bad if k == nan_at else q[prefix + k] for k in range(n)]
        # 12 and 13 alike among themselves, not with the rest
        steps = step_requests(name, sid, rows, lambda k: {"timeout_ms": 60000} if k in (12, 13)
                              else {})
        steps[short_at].raw_input_contents[0] = steps[short_at].raw_input_contents[0][:-4]
        got = list(s.ModelStreamInfer(iter(steps), timeout=60))
        st, msg, _ = http_binary(held, name, [("query", bad[None, None], "FP32")],
                                 {"session_id": sid})
        assert st == 400 and got[nan_at].error_message == msg, (msg, got[nan_at].error_message)
        short = rpc_error(s.ModelInfer, steps[short_at], timeout=30)
        assert short.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert got[short_at].error_message == short.details()
        assert [got[k].error_message for k in ok] == [""] * len(ok)
        assert [got[k].infer_response.parameters["cached_tokens"].int64_param for k in ok] == [
            prefix + j + 1 for j in range(len(ok))]
        assert [got[k].infer_response.raw_output_contents[0] for k in ok] == alone
        assert merged_steps(held) - before >= 2


def test_stream_of_refusals_answered_in_order(stub, d):
    """Three thousand requests on one stream sent without waiting, all but
    one in 500 refused at once (no such model): each gets its answer, in
    order, and the daemon serves on. The refusals that queue behind a
    computing request are answered in a loop on the thread that answers
    it, not each inside the call of the one before."""
    n, q = 3000, np.zeros((1, 64, 64), np.float32)
    reqs = [pb_request("self_e64_h8" if k % 500 == 0 else "no_such_model_%d" % k,
                       [("query", q, "FP32")], {}) for k in range(n)]
    got = list(stub.ModelStreamInfer(iter(reqs), timeout=120))
    assert len(got) == n
    for k, a in enumerate(got):
        if k % 500:
            assert "no_such_model_%d" % k in a.error_message, (k, a.error_message)
        else:
            assert not a.error_message and a.infer_response.outputs[0].shape == [1, 64, 64], k
    assert d.get("/v2/health/ready").status_code == 200


def test_stream_refusals_name_their_request(stub, d):
    """A refusal on a stream carries its request's id and model_name in
    infer_response, beside error_message, so a client with several requests
    in flight can match it to its request (a request with neither gets
    none); the answers between keep theirs."""
    q = np.zeros((1, 4, 64), np.float32)
    bad = q.copy()
    bad[0, 1, 3] = np.nan
    reqs = [pb_request("no_such_model", [("query", q, "FP32")], {}),
            pb_request("self_e64_h8", [("query", q, "FP32")], {}),
            pb_request("self_e64_h8", [("query", bad, "FP32")], {}),
            pb_request("self_e64_h8", [("query", q, "FP32")], {"attention": "sideways"}),
            pb_request("", [("query", q, "FP32")], {}),
            pb_request("self_e64_h8", [("query", bad, "FP32")], {})]
    for k, r in enumerate(reqs[:5]):
        r.id = "req-%d" % k
    got = list(stub.ModelStreamInfer(iter(reqs), timeout=60))
    assert [bool(a.error_message) for a in got] == [True, False, True, True, True, True], got
    for k in (0, 1, 2, 3, 4):
        assert got[k].infer_response.id == "req-%d" % k, (k, got[k])
    for k in (0, 1, 2, 3):
        assert got[k].infer_response.model_name == reqs[k].model_name, (k, got[k])
    assert got[4].infer_response.model_name == "" and "model_name" in got[4].error_message
    assert not got[5].infer_response.id and got[5].infer_response.model_name == "self_e64_h8"
    assert "NaN" in got[2].error_message and "attention" in got[3].error_message


def test_session_close_alone_over_http_v2_and_x_session_id(stub, client, d):
    g = DECODERS[1]
    q = dec_rows(g)
    name = g["name"]
    sid = "00112233445566778899aabbccddeeff"
    md = [("x-session-id", sid)]
    r = stub.ModelInfer(pb_request(name, [("query", q[None, :4], "FP32")],
                                   {"session_open": True}), timeout=30, metadata=md)
    assert r.parameters["session_id"].string_param == sid
    # taken: 409 ABORTED with the HTTP sentence
    e = rpc_error(stub.ModelInfer, pb_request(name, [("query", q[None, :4], "FP32")],
                                              {"session_open": True}), timeout=30, metadata=md)
    st, msg, _ = http_binary(d, name, [("query", q[None, :4], "FP32")], {"session_open": True},
                             headers={"X-Session-Id": sid})
    assert st == 409 and e.code() == grpc.StatusCode.ABORTED and e.details() == msg
    # a step over HTTP v2 with session_close: answered, then closed
    st, out, p = http_binary(d, name, [("query", q[None, 4:5], "FP32")],
                             {"session_id": sid, "session_close": True})
    assert st == 200 and p["cached_tokens"] == 5
    whole = client.infer(name, q_in(q[:5]), parameters={"causal": True}).as_numpy("output")
    assert as_array(out["output"]).tobytes() == whole[:, 4:5].tobytes()
    st, msg, _ = http_binary(d, name, [("query", q[None, 5:6], "FP32")], {"session_id": sid})
    assert st == 404, msg
    # session_close alone over HTTP v2 (JSON body, no inputs)
    r = stub.ModelInfer(pb_request(name, [("query", q[None, :2], "FP32")],
                                   {"session_open": True}), timeout=30)
    sid2 = r.parameters["session_id"].string_param
    h = d.post("/v2/models/%s/infer" % name,
               {"inputs": [], "parameters": {"session_id": sid2, "session_close": True}})
    assert h.status_code == 200, h.text
    a = h.json()
    assert a["parameters"]["session_closed"] is True and a["parameters"]["session_id"] == sid2
    assert not a.get("outputs")
    e = rpc_error(stub.ModelInfer, pb_request(name, [("query", q[None, 2:3], "FP32")],
                                              {"session_id": sid2}), timeout=30)
    assert e.code() == grpc.StatusCode.NOT_FOUND


# ---------------------------------------------------------------- operations

def test_metrics_access_log_and_traceparent(d, stub):
    before_ok = grpc_count(d, "ModelInfer", "OK")
    before_nf = grpc_count(d, "ModelInfer", "NOT_FOUND")
    before_live = grpc_count(d, "ServerLive", "OK")
    g, _ = BY_NAME["self_e16_h1"]
    tensors = seq_tensors(g["sequences"][0])
    trace, span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    md = [("traceparent", "00-%s-%s-01" % (trace, span)), ("x-request-id", "grpc-trace-1")]
    stub.ModelInfer(pb_request("self_e16_h1", tensors, {}), timeout=30, metadata=md)
    stub.ModelInfer(pb_request("self_e16_h1", tensors, {}), timeout=30)
    rpc_error(stub.ModelInfer, pb_request("nope", tensors, {}), timeout=30,
              metadata=[("x-request-id", "grpc-nf-1")])
    stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=10)
    assert wait_until(lambda: grpc_count(d, "ModelInfer", "OK") == before_ok + 2, 10), \
        grpc_count(d, "ModelInfer", "OK")
    assert grpc_count(d, "ModelInfer", "NOT_FOUND") == before_nf + 1
    assert grpc_count(d, "ServerLive", "OK") == before_live + 1

    def line(rid):
        ls = [ln for ln in d.stdout().splitlines() if rid in ln and "path=" in ln]
        return ls[-1] if ls else None
    assert wait_until(lambda: line("grpc-trace-1") and line("grpc-nf-1"), 10), d.stdout()[-2000:]
    ok = line("grpc-trace-1")
    assert "method=GRPC" in ok and "path=/inference.GRPCInferenceService/ModelInfer" in ok, ok
    assert "status=200" in ok
    assert "trace_id=%s" % trace in ok, ok
    assert "span_id=%s" % span not in ok  # the call's own span, a child of the caller's
    nf = line("grpc-nf-1")
    assert "status=404" in nf, nf


def test_drain_with_calls_in_flight(fresh_daemons):
    dd = fresh_daemons(full_config(batching={"max_queue_delay_us": 1000000},
                                   server={"drain_grace_s": 30}))
    g, _ = BY_NAME["self_e30_h3"]
    seqs = g["sequences"]
    c = grpcclient.InferenceServerClient(dd.grpc_target)
    ch = grpc.insecure_channel(dd.grpc_target)
    s = service_pb2_grpc.GRPCInferenceServiceStub(ch)
    futs = [(seq, s.ModelInfer.future(pb_request(g["name"], seq_tensors(seq), seq_params(seq)),
                                      timeout=60)) for seq in seqs[:4]]
    # an HTTP request whose body is still coming holds the drain open, so
    # that the late call below arrives while the daemon drains, however slow
    # the machine (the queued calls alone may all be answered first)
    body = json.dumps({"query": [[0.5] * 30]}).encode()
    held = socket.create_connection(("127.0.0.1", dd.port), timeout=30)
    held.sendall(b"POST /v1/models/self_e30_h3/attention HTTP/1.1\r\nHost: x\r\n"
                 b"Content-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body[:5])
    time.sleep(0.3)  # the calls are queued behind the 1 s delay
    dd.send_signal(signal.SIGTERM)
    # once the daemon drains (its health check says NOT_SERVING: the signal
    # is handled; a slow build takes a while), a new call is not taken:
    # UNAVAILABLE, with the HTTP side's 503 sentence
    until = time.monotonic() + 30
    while health_check(dd.grpc_target, timeout=10) != 2 and time.monotonic() < until:
        time.sleep(0.02)
    late = rpc_error(s.ModelInfer, pb_request(g["name"], seq_tensors(seqs[0]), {}), timeout=30)
    held.sendall(body[5:])  # answered (its header lines came before the drain); the drain ends
    answer = held.recv(4096)
    held.close()
    for seq, f in futs:
        out = grpc_raw(f.result())
        assert rel_err(as_array(out["output"]), v2_ranked(seq["output"])) <= TOL
    assert dd.wait_exit(60) == 0, dd.logs(3000)
    ch.close()
    c.close()
    assert late.code() == grpc.StatusCode.UNAVAILABLE, late
    assert late.details() == "the server is draining", late
    assert answer.startswith(b"HTTP/1.1 200") and b"Connection: close" in answer, answer


def test_health_watch(fresh_daemons):
    """Health/Watch sends the status at once: SERVING, or SERVICE_UNKNOWN
    for a service not served, whose call stays open as the health protocol
    asks. When the daemon drains, the server's watchers are sent
    NOT_SERVING; open watches do not hold the drain (30 s here), and end
    with the daemon. Each Watch is counted and has its access line."""
    dd = fresh_daemons(full_config())
    ch = grpc.insecure_channel(dd.grpc_target)
    w, svc, other = health_watch(ch), health_watch(ch, "inference.GRPCInferenceService"), \
        health_watch(ch, "no.such.Service")
    assert (next(w), next(svc), next(other)) == (1, 1, 3)
    dd.send_signal(signal.SIGTERM)
    assert (next(w), next(svc)) == (2, 2)
    for it in (w, svc, other):  # nothing more: the call ends with the daemon
        with pytest.raises(grpc.RpcError):
            print("after NOT_SERVING:", next(it))
    assert dd.wait_exit(20) == 0, dd.logs(3000)
    ch.close()
    assert len(re.findall(r"path=/grpc\.health\.v1\.Health/Watch ", dd.stdout())) == 3, \
        dd.logs(3000)


def test_grpc_port_zero_and_free_port(fresh_daemons):
    off = fresh_daemons(full_config(), env={"ATTND_GRPC_PORT": "0"})
    assert off.get("/v2/health/ready").status_code == 200
    g, _ = BY_NAME["self_e16_h1"]
    st, out, _ = http_binary(off, "self_e16_h1", seq_tensors(g["sequences"][0]), {})
    assert st == 200
    e = rpc_error(health_check, off.grpc_target, timeout=2)
    assert e.code() == grpc.StatusCode.UNAVAILABLE
    free = fresh_daemons(full_config(), env={"ATTND_GRPC_PORT": "-1"})
    # the log says which port it took: "grpc: ... on 127.0.0.1:0 (port N)"
    found = re.findall(r"grpc: .* \(port (\d+)\)", free.stdout() + free.stderr())
    assert found, (free.stdout() + free.stderr())[-2000:]
    assert _answers(int(found[-1]))


def _answers(port):
    try:
        return health_check("127.0.0.1:%d" % port, timeout=3) == 1
    except grpc.RpcError:
        return False


# ---------------------------------------------------------------- the repository

def test_repository_calls_with_explicit_model_control(daemons):
    """RepositoryIndex, RepositoryModelLoad (config parameter) and
    RepositoryModelUnload through tritonclient: the index equals
    POST /v2/repository/index, a loaded model answers torch's numbers of its
    weights, an unloaded one is no longer ready."""
    folder = daemons.next_workdir()
    a = support.Model.random("a", 32, 4, seed=1)
    a.save(str(folder / "a.safetensors"))
    b = support.Model.random("b", 32, 4, seed=2)
    b.save(str(folder / "b.safetensors"))
    dd = daemons({"server": {"model_control": "explicit", "model_dir": str(folder)},
                  "models": [{"name": "a", "embed_dim": 32, "num_heads": 4,
                              "weights": str(a.path)}]})
    c = grpcclient.InferenceServerClient(dd.grpc_target)

    def index():
        got = c.get_model_repository_index().models
        return sorted((m.name, m.version, m.state) for m in got)

    def http_index():
        return sorted((m["name"], m.get("version", ""), m.get("state", ""))
                      for m in dd.post("/v2/repository/index", {}).json())

    assert index() == http_index() and ("a", "1", "READY") in index()
    c.load_model("b", config=json.dumps({"name": "b", "embed_dim": 32, "num_heads": 4,
                                         "weights": str(b.path)}))
    assert c.is_model_ready("b")
    assert index() == http_index() and ("b", "1", "READY") in index()
    q = np.round(np.random.default_rng(3).standard_normal((1, 5, 32)), 3).astype(np.float32)
    out = c.infer("b", grpc_inputs([("query", q, "FP32")])).as_numpy("output")
    assert rel_err(out[0], b.forward(q[0])[0]) <= TOL
    c.unload_model("a")
    # unloaded: ModelReady NOT_FOUND, as GET /v2/models/a/ready is 404
    assert dd.get("/v2/models/a/ready").status_code == 404
    with pytest.raises(InferenceServerException) as e:
        c.is_model_ready("a")
    assert "NOT_FOUND" in str(e.value.status())
    assert index() == http_index() and ("a", "1", "READY") not in index()
    with pytest.raises(InferenceServerException) as e:
        c.infer("a", grpc_inputs([("query", q, "FP32")]))
    st, msg, _ = http_binary(dd, "a", [("query", q, "FP32")], {})
    assert str(e.value.status()).endswith(CODES[st].name), (e.value, st)
    assert msg in str(e.value)
    c.close()


def test_repository_calls_refuse_as_http_does(daemons):
    """RepositoryModelLoad and RepositoryModelUnload name the model by the
    whole model_name: a name over 63 characters is the HTTP route's 400
    (load with config) or 404 (load from the file, unload), never the model
    of its first 63 characters; parameters the HTTP route does not take are
    INVALID_ARGUMENT with its sentence (tritonclient's `files` too)."""
    folder = daemons.next_workdir()
    b = support.Model.random("b", 16, 4, seed=2)
    b.save(str(folder / "b.safetensors"))
    dd = daemons({"server": {"model_control": "explicit", "model_dir": str(folder)},
                  "models": [{"name": "m" * 63, "embed_dim": 16, "num_heads": 4,
                              "weights": str(b.path)}]})
    entry = json.dumps({"embed_dim": 16, "num_heads": 4, "weights": "b.safetensors"})
    rp = service_pb2.ModelRepositoryParameter
    with grpc.insecure_channel(dd.grpc_target) as ch:
        s = service_pb2_grpc.GRPCInferenceServiceStub(ch)

        def index():
            return sorted((m.name, m.version, m.state)
                          for m in s.RepositoryIndex(service_pb2.RepositoryIndexRequest()).models)

        before = index()
        assert before == [("m" * 63, "1", "READY")]
        for n in (64, 100, 300):
            name = "m" * n
            http = [dd.post("/v2/repository/models/%s/load" % name[:127],
                            json={"parameters": {"config": entry}}),
                    dd.post("/v2/repository/models/%s/load" % name[:127]),
                    dd.post("/v2/repository/models/%s/unload" % name[:127])]
            calls = [(s.RepositoryModelLoad, service_pb2.RepositoryModelLoadRequest(
                          model_name=name, parameters={"config": rp(string_param=entry)})),
                     (s.RepositoryModelLoad, service_pb2.RepositoryModelLoadRequest(
                          model_name=name)),
                     (s.RepositoryModelUnload, service_pb2.RepositoryModelUnloadRequest(
                          model_name=name))]
            for (fn, rq), h in zip(calls, http):
                e = rpc_error(fn, rq, timeout=30)
                if n < 128:  # the HTTP route takes a {name} of up to 127 bytes
                    assert e.code() == CODES[h.status_code], (n, e, h.text)
                    assert e.details() == h.json()["error"].replace(name[:127], name), (n, e)
                else:
                    assert e.code() in (grpc.StatusCode.INVALID_ARGUMENT,
                                        grpc.StatusCode.NOT_FOUND), (n, e)
            assert index() == before, n  # the 63-character model untouched
        # parameters: refused with the HTTP route's sentence
        cases = [(s.RepositoryModelLoad, service_pb2.RepositoryModelLoadRequest(
                      model_name="g", parameters={"bogus": rp(string_param="x")}),
                  "/v2/repository/models/g/load", {"parameters": {"bogus": "x"}}),
                 (s.RepositoryModelLoad, service_pb2.RepositoryModelLoadRequest(
                      model_name="g", parameters={"config": rp(int64_param=5)}),
                  "/v2/repository/models/g/load", {"parameters": {"config": 5}}),
                 (s.RepositoryModelUnload, service_pb2.RepositoryModelUnloadRequest(
                      model_name="m" * 63, parameters={"x": rp(string_param="y")}),
                  "/v2/repository/models/%s/unload" % ("m" * 63), {"parameters": {"x": "y"}})]
        for fn, rq, path, body in cases:
            h = dd.post(path, json=body)
            assert h.status_code == 400, h.text
            e = rpc_error(fn, rq, timeout=30)
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert e.details() == h.json()["error"], (e, h.text)
        assert index() == before
        # config as bytes, and unload_dependents, are taken as before
        s.RepositoryModelLoad(service_pb2.RepositoryModelLoadRequest(
            model_name="g", parameters={"config": rp(bytes_param=entry.encode())}), timeout=30)
        s.RepositoryModelUnload(service_pb2.RepositoryModelUnloadRequest(
            model_name="g", parameters={"unload_dependents": rp(bool_param=True)}), timeout=30)
    c = grpcclient.InferenceServerClient(dd.grpc_target)
    with pytest.raises(InferenceServerException) as e:
        c.load_model("g2", config=entry, files={"file:1/model.bin": b"xx"})
    assert "INVALID_ARGUMENT" in str(e.value.status())
    assert "parameters.file:1/model.bin: unknown parameter (a load takes 'config')" in str(e.value)
    c.close()


def refusal_counts(d):
    """attnd_rejected_total by reason, with attnd_timeouts_total as "504"."""
    _, samples = support.parse_prometheus(d.get("/metrics").text)
    got = {lab["reason"]: v for name, lab, v in samples if name == "attnd_rejected_total"}
    got["504"] = next(v for name, _, v in samples if name == "attnd_timeouts_total")
    return got


def test_refusals_counted_as_http_ones(fresh_daemons):
    """A gRPC call's refusal counts in attnd_rejected_total by reason, and
    its 504s in attnd_timeouts_total, as the same HTTP request's would:
    timeout_ms and the client's deadline (timeout, 504), a full queue
    (queue_full), an unknown model unary and on a stream (not_found, once
    each), a client that leaves (disconnected). Each call once."""
    dd = fresh_daemons(full_config(batching={"max_queue_delay_us": 1500000,
                                             "max_queue_requests": 1}))
    g, _ = BY_NAME["self_e16_h1"]
    q = np.asarray(g["sequences"][0]["query"], np.float32)[None]
    one = [("query", q, "FP32")]
    base = refusal_counts(dd)
    assert base["504"] == 0 and base["timeout"] == 0 and base["queue_full"] == 0

    def grew():
        now = refusal_counts(dd)
        return {k: now[k] - base[k] for k in now if now[k] != base[k]}

    with grpc.insecure_channel(dd.grpc_target) as ch:
        s = service_pb2_grpc.GRPCInferenceServiceStub(ch)
        e = rpc_error(s.ModelInfer, pb_request("self_e16_h1", one, {"timeout_ms": 300}),
                      timeout=30)
        assert e.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        e = rpc_error(s.ModelInfer, pb_request("self_e16_h1", one, {}), timeout=0.3)
        assert e.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert wait_until(lambda: grew() == {"timeout": 2, "504": 2}, 10), grew()
        first = s.ModelInfer.future(pb_request("self_e16_h1", one, {}), timeout=60)
        assert wait_until(lambda: queue_depth(dd) == 1, 10)
        e = rpc_error(s.ModelInfer, pb_request("self_e16_h1", one, {}), timeout=60)
        assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert first.result().outputs
        e = rpc_error(s.ModelInfer, pb_request("no_such_model", one, {}), timeout=30)
        assert e.code() == grpc.StatusCode.NOT_FOUND
        got = list(s.ModelStreamInfer(iter([pb_request("no_such_model", one, {})]), timeout=30))
        assert len(got) == 1 and "no_such_model" in got[0].error_message
        assert wait_until(lambda: grew() == {"timeout": 2, "504": 2, "queue_full": 1,
                                             "not_found": 2}, 10), grew()
        # a client that leaves before its answer: disconnected, as HTTP's 499
        gone = s.ModelInfer.future(pb_request("self_e16_h1", one, {}), timeout=60)
        assert wait_until(lambda: queue_depth(dd) == 1, 10)
        gone.cancel()
        assert wait_until(lambda: grew().get("disconnected") == 1, 10), grew()
        time.sleep(0.5)
        assert grew() == {"timeout": 2, "504": 2, "queue_full": 1, "not_found": 2,
                          "disconnected": 1}


def test_session_close_without_session_id_is_refused(stub, d):
    """parameters.session_close with inputs but no session_id closes
    nothing: 400 naming parameters.session_close over HTTP v2 (JSON and
    binary), INVALID_ARGUMENT with the same sentence over gRPC (unary and on
    a stream), as it is without inputs; session_close false is an ordinary
    infer, and session_open with session_close opens the session it closes."""
    said = "parameters.session_close: closes the session of parameters.session_id, which is missing"
    g, _ = BY_NAME["self_e16_h1"]
    q = np.asarray(g["sequences"][0]["query"], np.float32)[None]
    one = [("query", q, "FP32")]
    st, msg, _ = http_binary(d, "self_e16_h1", one, {"session_close": True})
    assert st == 400 and msg == said, (st, msg)
    r = d.post("/v2/models/self_e16_h1/infer",
               {"inputs": [{"name": "query", "shape": list(q.shape), "datatype": "FP32",
                            "data": q.ravel().tolist()}],
                "parameters": {"session_close": True}})
    assert r.status_code == 400 and r.json()["error"] == said, r.text
    r = d.post("/v2/models/self_e16_h1/infer", {"inputs": [], "parameters": {"session_close": True}})
    assert r.status_code == 400 and r.json()["error"] == said, r.text
    e = rpc_error(stub.ModelInfer, pb_request("self_e16_h1", one, {"session_close": True}),
                  timeout=30)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and e.details() == said, e
    got = list(stub.ModelStreamInfer(iter([pb_request("self_e16_h1", one,
                                                      {"session_close": True})]), timeout=30))
    assert [a.error_message for a in got] == [said]
    st, _, _ = http_binary(d, "self_e16_h1", one, {"session_close": False})
    assert st == 200
    dec = DECODERS[1]
    r = stub.ModelInfer(pb_request(dec["name"], [("query", dec_rows(dec)[None, :3], "FP32")],
                                   {"session_open": True, "session_close": True}), timeout=30)
    sid = r.parameters["session_id"].string_param
    assert r.parameters["session_closed"].bool_param is True
    st, msg, _ = http_binary(d, dec["name"], [("query", dec_rows(dec)[None, 3:4], "FP32")],
                             {"session_id": sid})
    assert st == 404, msg


def test_wrong_width_names_the_shape_index(stub, d):
    """Rows of the wrong width: INVALID_ARGUMENT naming the input and the
    shape's index, the sentence HTTP v2 gives for the same input."""
    q = np.ones((1, 2, 17), np.float32)
    said = "inputs[0] (query).shape[2]: rows of 17 numbers, model 'self_e16_h1' has embed_dim 16"
    st, msg, _ = http_binary(d, "self_e16_h1", [("query", q, "FP32")], {})
    assert st == 400 and msg == said, (st, msg)
    e = rpc_error(stub.ModelInfer, pb_request("self_e16_h1", [("query", q, "FP32")], {}), timeout=30)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and e.details() == said, e

# attnd - build, test, run, bench.
#   make            build/attnd and the libraries
#   make test       install missing packages, build, run every suite
#   make layers-check  no cycle between files, no call up a layer, short functions
#   make asan       the same suites under AddressSanitizer + UBSan
#   make tsan       the core and concurrency suites under ThreadSanitizer
#   make valgrind   the Check suites and a short black-box run under valgrind's memcheck
#   make test-abuse the abuse suite alone; make soak  ten minutes of mixed load
#   make test-client  the Python client (clients/python) against the daemon and torch
#   make test-js      the JavaScript client (clients/js) against the daemon and the goldens
#   make run        serve the embedded default model on port 8080
#   make bench      the core, onnxruntime and torch: tables (never part of the tests),
#                   and the core at 1 to 64 threads simulated (bench/bench_scale.c)
#   make bench-http     wrk against the daemon, and codec costs
#   make bench-decode   KV-cache session steps against re-sending the prefix
#   make bench-grpc     gRPC (ghz, ModelStreamInfer) against HTTP base64, one table
#   make bench-client   the Python and JavaScript clients' round trips against raw HTTP
#   make bench-reload   a steady load's latency while a large layer reloads every second
#   make docker-test, make scaleout-test   the image, and replicas behind nginx
#   make golden-decoder-check  the decoder goldens against Hugging Face transformers
#   make format-check, make format   clang-format over every tracked .c and .h

CC      ?= cc
OPT     ?= -O3
SAN     ?=
BUILD   ?= build
CFLAGS  += $(OPT) -g -std=c11 -ffp-contract=fast -D_GNU_SOURCE -Wall -Wextra -fPIC $(SAN)
PKGS     = libmicrohttpd jansson libcurl libprotobuf-c
# OpenBLAS: its header only. core/blas.c loads the library at run time, after
# choosing its kernels (docs/performance.md), so nothing links it.
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) openblas 2>/dev/null)
CHECK_CFLAGS := $(shell pkg-config --cflags check 2>/dev/null)
# gRPC's C core without TLS (libgrpc_unsecure; docs/api.md, "gRPC"): the
# daemon serves plain HTTP/2, as it serves plain HTTP/1.1.
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lgrpc_unsecure -lgpr
CHECK_LIBS := $(shell pkg-config --libs check 2>/dev/null)
LDLIBS   = $(PKG_LIBS) -ldl -lpthread -lm
PYTHON  ?= python3
VENV    ?= .venv
# Compiles run on every CPU (the suites themselves run one at a time).
JOBS    ?= $(shell nproc 2>/dev/null || echo 2)

CORE_SRC   := $(wildcard core/*.c core/*/*.c)
CONFIG_SRC := $(wildcard config/*.c)
# server/ is folders by part (README.md, Layout); main.c alone at its top.
SERVER_SRC := $(filter-out server/main.c,$(wildcard server/*.c server/*/*.c))
# The sources' headers only: */*/*.h would also match build*/gen/, so that
# protoc-c's output for one build (build-tsan/gen) would put every object of
# another out of date. The generated headers are named where used (below).
HEADERS    := $(wildcard core/*.h core/*/*.h config/*.h server/*.h server/*/*.h tests/*.h)
TEST_SRC   := $(wildcard tests/test_*.c)
BENCH_SRC  := $(wildcard bench/*.c)

# The gRPC messages: protoc-c makes C of server/grpc/*.proto at build time,
# into $(BUILD)/gen/ (never edited, never committed), compiled into the
# server library.
PROTO      := $(wildcard server/grpc/*.proto)
PROTO_C    := $(PROTO:server/grpc/%.proto=$(BUILD)/gen/%.pb-c.c)
PROTO_OBJ  := $(PROTO_C:.c=.o)
CFLAGS     += -I$(BUILD)/gen

CORE_OBJ   := $(CORE_SRC:%.c=$(BUILD)/%.o)
CONFIG_OBJ := $(CONFIG_SRC:%.c=$(BUILD)/%.o)
SERVER_OBJ := $(SERVER_SRC:%.c=$(BUILD)/%.o)
LIBS       := $(BUILD)/libattnd_server.a $(BUILD)/libattnd_config.a $(BUILD)/libattncore.a
TESTS      := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
BENCHES    := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

.PHONY: all deps deps-run deps-bench test test-unit test-blackbox test-abuse soak asan tsan valgrind run bench bench-http bench-decode clean fuzz fuzz-smoke fuzz-long venv
.PHONY: test-client test-js bench-client bench-reload bench-grpc layers-check
.PHONY: docker-test scaleout-test golden-decoder-check format format-check otelcol

all: $(BUILD)/attnd $(LIBS)

$(BUILD)/%.o: %.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(PKG_CFLAGS) -c $< -o $@

# server/http/openapi.c embeds server/http/openapi.json (.incbin), server/ui/ui.c
# the viewer's files in server/ui/
$(BUILD)/server/http/openapi.o: server/http/openapi.json
$(BUILD)/server/ui/ui.o: $(wildcard server/ui/*.html server/ui/*.js server/ui/*.css)

$(BUILD)/libattncore.a: $(CORE_OBJ)
	rm -f $@; ar rcs $@ $^
$(BUILD)/libattnd_config.a: $(CONFIG_OBJ)
	rm -f $@; ar rcs $@ $^
$(BUILD)/gen/%.pb-c.c $(BUILD)/gen/%.pb-c.h: server/grpc/%.proto
	@mkdir -p $(BUILD)/gen
	protoc-c --c_out=$(BUILD)/gen -I server/grpc $<
$(BUILD)/gen/%.pb-c.o: $(BUILD)/gen/%.pb-c.c
	$(CC) $(CFLAGS) $(PKG_CFLAGS) -c $< -o $@
$(filter $(BUILD)/server/grpc/%,$(SERVER_OBJ)) $(BUILD)/server/server.o: $(PROTO_C)

$(BUILD)/libattnd_server.a: $(SERVER_OBJ) $(PROTO_OBJ)
	rm -f $@; ar rcs $@ $^

$(BUILD)/attnd: $(BUILD)/server/main.o $(LIBS)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: tests/%.c $(LIBS) $(wildcard tests/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(PKG_CFLAGS) $(CHECK_CFLAGS) -o $@ $< $(LIBS) $(CHECK_LIBS) $(LDLIBS)

$(BUILD)/bench/%: bench/%.c $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(PKG_CFLAGS) -o $@ $< $(LIBS) $(LDLIBS)

# The OpenTelemetry Collector the tracing tests export to: tests/otel/ holds
# its main.go (the collector's command with the OTLP receiver and contrib's
# file exporter) and go.mod/go.sum pinning every module; Go fetches them
# from the module proxy. Test infrastructure, built once into build/otelcol/
# (Go's build cache makes a rebuild quick; make, an unchanged one instant).
OTELCOL := build/otelcol/otelcol
$(OTELCOL): tests/otel/main.go tests/otel/go.mod tests/otel/go.sum
	@command -v go >/dev/null || { echo "go is missing: the tracing tests build an OpenTelemetry Collector with it (README: Tests)"; exit 1; }
	cd tests/otel && go build -buildvcs=false -trimpath -o $(abspath $@) .
otelcol: $(OTELCOL)

# Installs the Debian packages the build and tests need when root; otherwise
# prints the one apt-get line to run. deps-run: what building and running
# the daemon need, nothing of the test bench (make run).
deps:
	@sh tests/deps.sh test
deps-run:
	@sh tests/deps.sh build

# A venv for the black-box suites' PyPI tools, pinned in tests/requirements.txt.
$(VENV)/.stamp: tests/requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q -r tests/requirements.txt
	touch $@
venv: $(VENV)/.stamp

# The Python client (clients/python, docs/clients.md), built once as a wheel
# by pip from clients/python (what `pip install ./clients/python` builds)
# and installed into two venvs: .venv, where the black-box suites and the
# docs' Python blocks import it, and $(CLIENT_VENV), a venv of Debian's
# python that sees python3-torch (the reference) with the pins of
# tests/requirements-client.txt, where tests/client, the docs' torch blocks
# and bench/bench_client.py run. The wheel's folder is emptied first, and
# so is the in-tree build folder, so that no removed file lingers in it.
# CLIENT_SRC is all the wheel is built from: clients/python holds its own
# files (config/export_safetensors.py and config/safetensors_header.py load
# the package's modules from there, not the other way round).
CLIENT_VENV ?= .venv-client
CLIENT_SRC  := clients/python/pyproject.toml clients/python/README.md \
               $(wildcard clients/python/attnd/*)
CLIENT_WHEEL = build/client-wheel
$(CLIENT_VENV)/.stamp: tests/requirements-client.txt bench/requirements.txt
	/usr/bin/python3 -m venv --system-site-packages $(CLIENT_VENV)
	$(CLIENT_VENV)/bin/pip install -q -r tests/requirements-client.txt
	touch $@
$(CLIENT_WHEEL)/.stamp: $(CLIENT_SRC) $(CLIENT_VENV)/.stamp
	rm -rf $(CLIENT_WHEEL) clients/python/build
	$(CLIENT_VENV)/bin/pip wheel -q --no-deps -w $(CLIENT_WHEEL) ./clients/python
	touch $@
$(CLIENT_VENV)/.client: $(CLIENT_WHEEL)/.stamp
	$(CLIENT_VENV)/bin/pip install -q --no-deps --force-reinstall $(CLIENT_WHEEL)/attnd-*.whl
	touch $@
$(VENV)/.client: $(CLIENT_WHEEL)/.stamp $(VENV)/.stamp
	$(VENV)/bin/pip install -q --no-deps --force-reinstall $(CLIENT_WHEEL)/attnd-*.whl
	touch $@

test: deps
	$(MAKE) -j$(JOBS) all $(TESTS) $(FUZZERS)
	$(MAKE) layers-check
	$(MAKE) test-unit
	$(MAKE) fuzz-smoke
	$(MAKE) test-blackbox
	$(MAKE) test-client
	$(MAKE) test-js

# The shape of the code (tests/check_layers.py, docs/architecture.md): no
# cycle of calls or includes between files, no call up a layer, no function
# over 60 lines, no file over 900; read from the objects of $(BUILD).
layers-check: $(CORE_OBJ) $(CONFIG_OBJ) $(SERVER_OBJ) $(BUILD)/server/main.o
	$(PYTHON) tests/check_layers.py $(BUILD)

# Check suites; CK_FORK=yes isolates a crashing test. The OTLP collector
# suite runs the collector built above (ATTND_OTELCOL).
test-unit: $(TESTS) $(OTELCOL)
	@set -e; for t in $(TESTS); do echo "== $$t"; s=$$(date +%s); \
	  ATTND_OTELCOL=$(abspath $(OTELCOL)) CK_FORK=yes $$t; echo "   $$t: $$(( $$(date +%s) - s )) s"; done

# The docs' Python blocks that need torch run with $(CLIENT_VENV)'s python
# (tests/blackbox/test_docs.py); the tracing suite and docs/deploy.md export
# spans to the collector built above (ATTND_OTELCOL).
test-blackbox: $(BUILD)/attnd $(VENV)/.client $(CLIENT_VENV)/.client $(OTELCOL)
	ATTND_BIN=$(abspath $(BUILD)/attnd) ATTND_TORCH_PYTHON=$(abspath $(CLIENT_VENV)/bin/python) \
	  ATTND_OTELCOL=$(abspath $(OTELCOL)) $(VENV)/bin/python -m pytest -q tests/blackbox $(PYTEST_ARGS)

# The Python client against the real daemon and torch (tests/client): its
# numerics, errors and retries, sessions, AsyncClient, attnd.torch, and the
# FastAPI example; installed from its wheel, as a user installs it.
test-client: $(BUILD)/attnd $(CLIENT_VENV)/.client
	ATTND_BIN=$(abspath $(BUILD)/attnd) $(CLIENT_VENV)/bin/python -m pytest -q tests/client $(PYTEST_ARGS)

# The JavaScript client (clients/js, docs/clients.md) with Node's own test
# runner (tests/js) against the real daemon and the goldens. npm ci
# installs its dev dependencies from clients/js/package-lock.json:
# typescript (the tests run tsc over tests/js/types) and express (the
# docs' web-backend example, which test-blackbox's docs test runs);
# the package itself is packed with npm pack and installed from that
# tarball into $(JS_PROJECT), as a user installs it, and the suites import
# it from there (ATTND_JS_PROJECT).
JS_SRC     := clients/js/package.json clients/js/index.js clients/js/index.d.ts clients/js/README.md
JS_PROJECT  = build/js-project
JS_TSC      = clients/js/node_modules/.bin/tsc
$(JS_TSC): clients/js/package.json clients/js/package-lock.json
	@command -v npm >/dev/null || { echo "npm is missing: run make deps (nodejs, npm)"; exit 1; }
	cd clients/js && npm ci --no-audit --no-fund --loglevel=error
	touch $@
$(JS_PROJECT)/.stamp: $(JS_SRC)
	@command -v npm >/dev/null || { echo "npm is missing: run make deps (nodejs, npm)"; exit 1; }
	rm -rf $(JS_PROJECT); mkdir -p $(JS_PROJECT)
	cd $(JS_PROJECT) && npm pack --silent $(abspath clients/js) > /dev/null && echo '{"private": true}' > package.json \
	  && npm install --no-audit --no-fund --offline --loglevel=error ./attnd-*.tgz
	touch $@
test-js: $(BUILD)/attnd $(JS_TSC) $(JS_PROJECT)/.stamp
	ATTND_BIN=$(abspath $(BUILD)/attnd) ATTND_JS_PROJECT=$(abspath $(JS_PROJECT)) ATTND_TSC=$(abspath $(JS_TSC)) \
	  node --test --test-reporter=spec tests/js/
# the docs test imports express from clients/js/node_modules
test-blackbox: $(JS_TSC)

# The abuse suite alone (it also runs in test-blackbox, so in make test and
# make asan): slow and flooding clients, odd HTTP, JSON bombs, isolation,
# memory, drain deadlines.
test-abuse: $(BUILD)/attnd $(VENV)/.stamp
	ATTND_BIN=$(abspath $(BUILD)/attnd) $(VENV)/bin/python -m pytest -q tests/blackbox/test_abuse.py $(PYTEST_ARGS)

# Ten minutes of steady mixed load on 127.0.0.1 (tests/soak.py): RSS at the
# start, every minute and at the end; fails past 5 % growth after warm-up.
# SOAK_SECONDS=N for another length; BUILD=build-asan (after make asan) for
# the same under AddressSanitizer.
soak: $(BUILD)/attnd $(VENV)/.stamp
	ATTND_BIN=$(abspath $(BUILD)/attnd) $(VENV)/bin/python tests/soak.py

# The unit and black-box suites under ASan + UBSan with leak checks, then a
# minute of mixed valid and invalid load (at least 3,000 requests, or it
# fails: about 4,800 here) and SIGTERM: no leak, no report.
asan: deps
	$(MAKE) -j$(JOBS) BUILD=build-asan OPT=-O1 SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" all
	$(MAKE) -j$(JOBS) BUILD=build-asan OPT=-O1 SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" $(TESTS:$(BUILD)/%=build-asan/%)
	ASAN_OPTIONS=detect_leaks=1 CK_FORK=no $(MAKE) BUILD=build-asan OPT=-O1 SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" test-unit
	ASAN_OPTIONS=detect_leaks=1 $(MAKE) BUILD=build-asan OPT=-O1 SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" test-blackbox
	ASAN_OPTIONS=detect_leaks=1 SOAK_SECONDS=60 SOAK_MAX_GROWTH=0.5 SOAK_MIN_REQUESTS=3000 $(MAKE) BUILD=build-asan OPT=-O1 SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" soak

# The pool suite checks the core's own thread pool alone (1 to 4 threads),
# the core suite uses it (2 and 3 threads), the answer suite writes answers
# on it, the pipeline suite runs session steps and whole sequences through
# one batch on it, the bf16 and int8 forward suites' invariance cases run
# bf16 and int8 models on 1 to 3 threads; the daemon's concurrency suite
# exercises the queue, batcher and workers; the OTLP suites submit from several threads while the
# exporter's thread sends, to a peer and to the real collector; the model
# table's suite gets and finds versions on threads while another reloads,
# and the loader thread loads and frees them; the repository suite's
# reloads under load, sessions across reloads and SIGHUP change models
# while requests hold their versions; gRPC's mixed load, drain and stream of
# session steps run on the poller and the workers at once. The daemons of the black-box part
# serve gRPC too; tests/tsan.supp holds the reports from inside gRPC's
# library, which is not built with ThreadSanitizer (each with why).
tsan: deps
	$(MAKE) -j$(JOBS) BUILD=build-tsan OPT=-O1 SAN="-fsanitize=thread" all build-tsan/tests/test_pool build-tsan/tests/test_core build-tsan/tests/test_server_session build-tsan/tests/test_decoder \
	  build-tsan/tests/test_server_guard build-tsan/tests/test_invariance build-tsan/tests/test_server_sched \
	  build-tsan/tests/test_server_answer build-tsan/tests/test_server_pipeline build-tsan/tests/test_server_otlp \
	  build-tsan/tests/test_server_otlp_collector build-tsan/tests/test_bf16_forward \
	  build-tsan/tests/test_int8_forward build-tsan/tests/test_server_models $(OTELCOL)
	TSAN_OPTIONS="halt_on_error=1 suppressions=$(abspath tests/tsan.supp)" CK_FORK=no build-tsan/tests/test_pool
	TSAN_OPTIONS="halt_on_error=1 suppressions=$(abspath tests/tsan.supp)" CK_FORK=no build-tsan/tests/test_core
	TSAN_OPTIONS="halt_on_error=1 suppressions=$(abspath tests/tsan.supp)" CK_FORK=no build-tsan/tests/test_invariance
	TSAN_OPTIONS="halt_on_error=1 suppressions=$(abspath tests/tsan.supp)" CK_FORK=no CK_RUN_CASE=invariance build-tsan/tests/test_bf16_forward
	TSAN_OPTIONS="halt_on_error=1 suppressions=$(abspath tests/tsan.supp)" CK_FORK=no CK_RUN_CASE=invariance build-tsan/tests/test_int8_forward
	TSAN_OPTIONS="halt_on_error=1 suppressions=$(abspath tests/tsan.supp)" CK_FORK=no build-tsan/tests/test_server_sched
	TSAN_OPTIONS="halt_on_error=1 suppressions=$(abspath tests/tsan.supp)" CK_FORK=no build-tsan/tests/test_server_answer
	TSAN_OPTIONS="halt_on_error=1 suppressions=$(abspath tests/tsan.supp)" CK_FORK=no build-tsan/tests/test_server_pipeline
	TSAN_OPTIONS="halt_on_error=1 suppressions=$(abspath tests/tsan.supp)" CK_FORK=no build-tsan/tests/test_server_session
	TSAN_OPTIONS="halt_on_error=1 suppressions=$(abspath tests/tsan.supp)" CK_FORK=no build-tsan/tests/test_server_models
	TSAN_OPTIONS="halt_on_error=1 suppressions=$(abspath tests/tsan.supp)" CK_FORK=no build-tsan/tests/test_decoder
	TSAN_OPTIONS="halt_on_error=1 suppressions=$(abspath tests/tsan.supp)" CK_FORK=no build-tsan/tests/test_server_guard
	TSAN_OPTIONS="halt_on_error=1 suppressions=$(abspath tests/tsan.supp)" CK_FORK=no build-tsan/tests/test_server_otlp
	TSAN_OPTIONS="halt_on_error=1 suppressions=$(abspath tests/tsan.supp)" CK_FORK=no ATTND_OTELCOL=$(abspath $(OTELCOL)) build-tsan/tests/test_server_otlp_collector
	TSAN_OPTIONS="halt_on_error=1 suppressions=$(abspath tests/tsan.supp)" $(MAKE) BUILD=build-tsan OPT=-O1 SAN="-fsanitize=thread" test-blackbox PYTEST_ARGS="-k 'concurrency or perf or slowloris or flood or drain_deadline or isolation or reload_under_steady_load or admitted_requests_finish or sessions_keep_their_version or sighup_applies or mixed_http_and_grpc or drain_with_calls_in_flight or session_over_model_stream_infer or stream_ended_by_the_client or stream_answers_wait_for_a_slow_reader or sent_ahead_merge or merged_step_refused or health_watch or starting_while_the_models_load'"

# valgrind's memcheck (Debian's valgrind) sees what ASan and UBSan do not:
# a branch, an address or a system call that depends on bytes nothing set
# (issue 34; MemorySanitizer would need every library rebuilt with it). It
# runs what make all built in $(BUILD), as shipped: memcheck needs no build
# of its own. --leak-check=no: make asan checks leaks, and memcheck's own
# search at every exit would only add time. Under memcheck no CPU has
# AVX-512 or AMX (valgrind 3.19 runs neither, and its CPUID says so), so
# attnd and OpenBLAS choose their AVX2 kernels from it (OPENBLAS_CORETYPE is
# unset for the suites, and the fixtures unset it for the daemon: the choice
# is attnd's, never a preset AVX-512 one) on one OpenBLAS thread (attnd asks
# for one), and the bf16 suites skip the AVX512-BF16 and AMX paths with a
# line that says so. memcheck runs code 20 to 50 times slower, and the FMA
# instructions of those kernels, which valgrind computes in software, about
# 30 times slower again (a forward: hundreds of times), so the suites whose
# cases are forwards by the hundred run part (VALGRIND_PART: suite:case) or none
# (VALGRIND_SKIP, each with its reason printed); every other suite runs
# whole, a new one too. The cases left out are forwards by the hundred as
# well (test_core's errors case, its workspace loop, ran past 4 minutes
# alone; test_int8_forward's cases but its kernels', with no int8 kernel
# under memcheck, are int8 models computed as fp32 ones: 5 minutes for its
# model case alone, 10 for the suite; its kernels case runs the row
# quantizer and the int8 formula), and a case named here that a suite no longer has fails the suite
# (tests/check_run.h: no test ran). Then the daemon itself under memcheck
# (ATTND_WRAP; its timeouts times ATTND_SLOW): sessions opened, stepped, exported,
# restored (where its model is served, with other weights, not served, and
# from sessions.save_dir across a restart) and closed, native and v2
# requests, JSON and base64, and attention selections. Reports are errors
# (exit code 1; the black-box fixtures fail on the marker). tests/valgrind.supp
# holds suppressions for the libraries' own reports, each with its reason.
# --fair-sched=yes: valgrind runs one thread at a time, and by default a
# thread spinning on an atomic can keep the turn from the one it waits for
# (test_server_models' readers starved its reloads for over 14 minutes, 16 s
# with fair turns; the compute pool's helpers spin between loops too).
# --vex-guest-max-insns=25: memcheck translates code in blocks of up to 50
# instructions by default, and a block of the AVX2 projection kernel's run
# ends (12 masked loads, adds and masked stores, with origin tracking) ran
# out of VEX's translation storage ("VEX temporary storage exhausted");
# blocks of 25 translate (test_core:golden, 32 s).
VALGRIND_OPTS := -q --fair-sched=yes --error-exitcode=1 --track-origins=yes --leak-check=no \
  --vex-guest-max-insns=25 \
  --error-markers=valgrind-error,valgrind-error-end --suppressions=$(abspath tests/valgrind.supp)
VALGRIND_PART := test_core:golden test_select:refusals test_bf16:rounding test_bf16:layout \
  test_invariance:kernel test_int8_forward:kernels
VALGRIND_SKIP := test_server_codec test_bf16_forward test_plan test_fp32_bits test_server_answer \
  test_server_otlp_collector
VALGRIND_WHY_test_server_codec := every float32 printed and read back (exhaustive loops: a minute alone, an hour or more under memcheck); the codec reads and writes every request of the black-box run
VALGRIND_WHY_test_bf16_forward := bf16 models through whole forwards, and memcheck offers no bf16 path: the fp32 fallback alone, 5 minutes for its smallest case
VALGRIND_WHY_test_plan := the forward's task plans run as forwards (90 s), the same kernels as test_core:golden
VALGRIND_WHY_test_fp32_bits := its hashes are those of AVX-512 builds, so on memcheck's AVX2 kernels it could only compare 1 thread with 3: 40 s of forwards for what test_core:golden runs
VALGRIND_WHY_test_server_otlp_collector := the exporter against a real collector, a Go process memcheck does not run; the exporter's code runs under memcheck in test_server_otlp against an in-process peer, and the collector's timing is what this suite adds (under memcheck on a CI machine it failed where nothing else ever did, its report hidden in the captured log: now printed on failure)
VALGRIND_WHY_test_server_answer := answers of large forwards written in chunks over the pool (2 minutes); the black-box run writes answers to real sockets
VALGRIND_BLACKBOX := \
  'tests/blackbox/test_state.py::test_state_file_and_restored_steps_bit_for_bit[gqa_half]' \
  tests/blackbox/test_state.py::test_restore_ids \
  tests/blackbox/test_state.py::test_state_for_other_weights_or_models \
  tests/blackbox/test_state.py::test_malformed_states_refused_daemon_healthy \
  tests/blackbox/test_state.py::test_save_dir_keeps_sessions_across_a_restart \
  'tests/blackbox/test_sessions.py::test_session_replays_whole_sequence[llama3_head_dim]' \
  tests/blackbox/test_sessions.py::test_v2_sessions_through_parameters \
  tests/blackbox/test_sessions.py::test_unknown_and_deleted_sessions \
  tests/blackbox/test_sessions.py::test_bad_session_bodies \
  'tests/blackbox/test_select.py::test_native_json_against_torch[select_e32_h4-0-0]' \
  'tests/blackbox/test_select.py::test_v2_json_against_torch[select_e32_h4-0-0]' \
  'tests/blackbox/test_select.py::test_v2_tritonclient_binary[select_e32_h4-0-0-BF16]' \
  'tests/blackbox/test_select.py::test_session_step_selection[native]' \
  'tests/blackbox/test_select.py::test_session_step_selection[v2]' \
  'tests/blackbox/test_numerics.py::test_golden_native[json-cross_e48_h4_k40_v24-0]' \
  'tests/blackbox/test_numerics.py::test_golden_native[b64_both-cross_e48_h4_k40_v24-0]' \
  'tests/blackbox/test_numerics.py::test_golden_v2[explicit_outputs-cross_e48_h4_k40_v24-0]' \
  tests/blackbox/test_numerics.py::test_batched_matches_single \
  'tests/blackbox/test_v2_client.py::test_infer_golden[cross_e48_h4_k40_v24-0]' \
  tests/blackbox/test_v2_client.py::test_unknown_model \
  tests/blackbox/test_grpc.py::test_stream_steps_sent_ahead_merge \
  tests/blackbox/test_grpc.py::test_stream_merged_step_refused_goes_again_alone
valgrind:
	@sh tests/deps.sh test valgrind
	$(MAKE) -j$(JOBS) all $(TESTS)
	$(MAKE) $(OTELCOL) $(VENV)/.stamp
	@$(foreach t,$(VALGRIND_SKIP),echo "== $(t): not under memcheck: $(VALGRIND_WHY_$(t))";)
	@set -e; for t in $(notdir $(TESTS)); do \
	  case " $(VALGRIND_SKIP) " in *" $$t "*) continue;; esac; \
	  cases=$$(for p in $(VALGRIND_PART); do case $$p in $$t:*) echo "$${p#*:}";; esac; done); \
	  for c in $${cases:-all}; do echo "== $$t ($$c)"; \
	    run=$$([ $$c = all ] && echo "-u CK_RUN_CASE" || echo "CK_RUN_CASE=$$c"); \
	    s=$$(date +%s); env -u OPENBLAS_CORETYPE $$run CK_FORK=no ATTND_OTELCOL=$(abspath $(OTELCOL)) \
	      valgrind $(VALGRIND_OPTS) $(BUILD)/tests/$$t; echo "   $$t ($$c): $$(( $$(date +%s) - s )) s"; done; done
	ATTND_BIN=$(abspath $(BUILD)/attnd) ATTND_WRAP="valgrind $(VALGRIND_OPTS)" ATTND_SLOW=20 \
	  $(VENV)/bin/python -m pytest -q $(VALGRIND_BLACKBOX) $(PYTEST_ARGS)

# libFuzzer targets (clang): tests/fuzz/fuzz_*.c, each linked with one archive
# of the core, config and server objects built for fuzzing. ASan and UBSan
# stop at the first report, so undefined behaviour is a finding too.
# fuzz-smoke runs each FUZZ_SECONDS (make test); fuzz-long runs each to
# FUZZ_RUNS executions (README: Tests). Seeds: tests/fuzz/seeds/<target>/,
# dictionaries: tests/fuzz/<target>.dict. Run from the repository's root.
FUZZ_SRC   := $(wildcard tests/fuzz/fuzz_*.c)
FUZZERS    := $(FUZZ_SRC:tests/fuzz/%.c=build-fuzz/%)
FUZZ_SECONDS ?= 10
FUZZ_RUNS  ?= 10000000
FUZZ_SAN   := -fsanitize=address,undefined -fno-sanitize-recover=all
FUZZ_CFLAGS := -g -O1 -std=c11 -D_GNU_SOURCE -fno-omit-frame-pointer $(FUZZ_SAN)
FUZZ_OBJ   := $(CORE_SRC:%.c=build-fuzz/obj/%.o) $(CONFIG_SRC:%.c=build-fuzz/obj/%.o) \
              $(SERVER_SRC:%.c=build-fuzz/obj/%.o) $(PROTO:server/grpc/%.proto=build-fuzz/obj/gen/%.pb-c.o)
FUZZ_CFLAGS += -Ibuild-fuzz/obj/gen
build-fuzz/obj/%.o: %.c $(HEADERS)
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link $(PKG_CFLAGS) -c $< -o $@
build-fuzz/obj/gen/%.pb-c.c: server/grpc/%.proto
	@mkdir -p build-fuzz/obj/gen
	protoc-c --c_out=build-fuzz/obj/gen -I server/grpc $<
build-fuzz/obj/gen/%.pb-c.o: build-fuzz/obj/gen/%.pb-c.c
	clang $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link $(PKG_CFLAGS) -c $< -o $@
$(filter build-fuzz/obj/server/grpc/%,$(FUZZ_OBJ)) build-fuzz/obj/server/server.o: $(PROTO:server/grpc/%.proto=build-fuzz/obj/gen/%.pb-c.c)
build-fuzz/obj/server/http/openapi.o: server/http/openapi.json
build-fuzz/obj/server/ui/ui.o: $(wildcard server/ui/*.html server/ui/*.js server/ui/*.css)
build-fuzz/libattnd_fuzz.a: $(FUZZ_OBJ)
	rm -f $@; ar rcs $@ $^
build-fuzz/%: tests/fuzz/%.c build-fuzz/libattnd_fuzz.a $(wildcard tests/fuzz/*.h) tests/test_models.h
	clang $(FUZZ_CFLAGS) -fsanitize=fuzzer $(PKG_CFLAGS) -o $@ $< build-fuzz/libattnd_fuzz.a \
	  $(PKG_LIBS) -ldl -lm -lpthread
fuzz: $(FUZZERS)
fuzz-smoke: $(FUZZERS)
	@set -e; for f in $(FUZZERS); do n=$$(basename $$f); mkdir -p build-fuzz/corpus-$$n; \
	  echo "== $$n ($(FUZZ_SECONDS)s)"; \
	  d=; [ -f tests/fuzz/$$n.dict ] && d=-dict=tests/fuzz/$$n.dict; \
	  $$f -max_total_time=$(FUZZ_SECONDS) -max_len=4096 -artifact_prefix=build-fuzz/$$n- $$d build-fuzz/corpus-$$n tests/fuzz/seeds/$$n \
	    > build-fuzz/$$n.log 2>&1 || { tail -60 build-fuzz/$$n.log; exit 1; }; \
	  grep -E '^Done|#[0-9]+.*(DONE|pulse)' build-fuzz/$$n.log | tail -1; done
# Each target to FUZZ_RUNS executions (10 M by default: hours on 2 cores);
# FUZZ_TARGETS="fuzz_v2 fuzz_json" picks some.
FUZZ_TARGETS ?= $(notdir $(FUZZERS))
fuzz-long: $(FUZZERS)
	@set -e; for n in $(FUZZ_TARGETS); do mkdir -p build-fuzz/corpus-$$n; \
	  echo "== $$n ($(FUZZ_RUNS) runs)"; \
	  d=; [ -f tests/fuzz/$$n.dict ] && d=-dict=tests/fuzz/$$n.dict; \
	  build-fuzz/$$n -runs=$(FUZZ_RUNS) -max_len=4096 -print_final_stats=1 -artifact_prefix=build-fuzz/$$n- $$d \
	    build-fuzz/corpus-$$n tests/fuzz/seeds/$$n > build-fuzz/$$n.long.log 2>&1 \
	    || { tail -60 build-fuzz/$$n.long.log; exit 1; }; \
	  grep -E '^stat::number_of_executed_units' build-fuzz/$$n.long.log; done

run: deps-run
	$(MAKE) all
	$(BUILD)/attnd --port 8080

# attnd's core, onnxruntime's CPU attention, OpenVINO's (f32 and bf16) and
# torch's on the same six shapes at 1 thread, 2 threads and every CPU; a
# lone forward after pauses of none, 10 ms and 1 s, in the core alone
# (bench_core --pauses) and through the daemon (bench/bench_lone.py); then
# the comparison tables (bench/RESULTS.md). Between them, bench_scale: the
# core's six shapes at 1 to 64 threads simulated from the task graph, next
# to what bench_core measured (docs/performance.md). onnxruntime and OpenVINO come
# from PyPI, pinned in
# bench/requirements-ort.txt, in $(BENCH_VENV); torch is Debian's python3-torch,
# run on the OpenBLAS kernels the core chose.
BENCH_VENV ?= .venv-bench
$(BENCH_VENV)/.stamp: bench/requirements-ort.txt
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install -q -r bench/requirements-ort.txt
	touch $@

# perf (bench_json.sh's profile) is needed by the benches alone; Debian's
# torch (the numerics reference, and a speed baseline) is in the test bench.
deps-bench:
	@sh tests/deps.sh test linux-perf

# Every implementation times a shape before any times the next one: the
# machine's speed drifts over the minutes of a run, and a row's ratios then
# compare cells timed seconds apart, not minutes.
bench: deps-bench
	$(MAKE) all $(BENCHES) $(BENCH_VENV)/.stamp
	rm -f $(BUILD)/bench/cells.json
	@core="env -u OPENBLAS_CORETYPE $(BUILD)/bench/bench_core"; \
	threads=$$($$core --print threads); blas=$$($$core --print blas-core); \
	torch=$$(/usr/bin/python3 -c 'import torch' 2>/dev/null && echo yes); \
	[ -n "$$torch" ] || echo "torch: not installed (apt-get install python3-torch), its column is left out"; \
	for i in $$($$core --print shapes); do \
	  once=$$([ $$i = 0 ] || echo --no-memory); \
	  $$core --shape $$i $$once $$([ $$i = 0 ] || echo --no-rates) \
	    --json $(BUILD)/bench/cells.json || exit 1; \
	  $(BENCH_VENV)/bin/python bench/bench_ort.py --shape $$i --json $(BUILD)/bench/cells.json \
	    --threads $$threads || exit 1; \
	  $(BENCH_VENV)/bin/python bench/bench_ort.py --int8 --shape $$i \
	    --json $(BUILD)/bench/cells.json --threads $$threads || exit 1; \
	  $(BENCH_VENV)/bin/python bench/bench_openvino.py --shape $$i \
	    --json $(BUILD)/bench/cells.json --threads $$threads || exit 1; \
	  [ -z "$$torch" ] || OPENBLAS_CORETYPE=$$blas /usr/bin/python3 bench/bench_torch.py \
	    --shape $$i $$once --json $(BUILD)/bench/cells.json --threads $$threads || exit 1; \
	done; \
	$$core --shape 0 --pauses 0,10,1000 --json $(BUILD)/bench/cells.json || exit 1; \
	$(BENCH_VENV)/bin/python bench/bench_lone.py --attnd $(BUILD)/attnd --pauses 0,10,1000 \
	  --json $(BUILD)/bench/cells.json
	env -u OPENBLAS_CORETYPE $(BUILD)/bench/bench_scale --measured $(BUILD)/bench/cells.json
	env -u OPENBLAS_CORETYPE $(BUILD)/bench/bench_select
	$(PYTHON) bench/compare.py $(BUILD)/bench/cells.json

# The decoder goldens against Hugging Face transformers (LlamaAttention,
# Qwen2Attention, the rotary rules): tests/gen_golden_decoder.py --check in a
# venv that sees Debian's python3-torch (--system-site-packages) and holds
# the transformers pinned in tests/requirements-golden.txt. It regenerates
# the goldens in memory and fails if any file differs or any cross-check
# misses; it writes nothing.
GOLDEN_VENV ?= .venv-golden
$(GOLDEN_VENV)/.stamp: tests/requirements-golden.txt
	/usr/bin/python3 -m venv --system-site-packages $(GOLDEN_VENV)
	$(GOLDEN_VENV)/bin/pip install -q -r tests/requirements-golden.txt
	touch $@
golden-decoder-check:
	@sh tests/deps.sh test python3-torch
	$(MAKE) $(GOLDEN_VENV)/.stamp
	$(GOLDEN_VENV)/bin/python tests/gen_golden_decoder.py --check --require-transformers

# KV-cache session steps at cache lengths 128..8192, 1 and 64 sessions,
# against re-sending the whole prefix, on a pool of every CPU, and whether a
# step's cost grows linearly with the cache (bench/bench_decode.c).
# BENCH_DECODE_ARGS="--max-len 512 --seconds 0.1 --threads 1" for a short run;
# "--shape mha" for the default model's shape (E=512, 8 heads of 64).
BENCH_DECODE_ARGS ?=
bench-decode: deps
	$(MAKE) all $(BUILD)/bench/bench_decode
	env -u OPENBLAS_CORETYPE $(BUILD)/bench/bench_decode $(BENCH_DECODE_ARGS)

# The Python client's median round trips against raw HTTP (http.client)
# with the same bodies: a large request (1, 512, 1024, 16 heads) and a small
# one (4 rows, E=512); bench/bench_client.py, BENCH_CLIENT_ARGS passes options.
# The JavaScript client's against raw fetch, on the same daemon
# (bench/bench_client.mjs, run by bench_client.py; the package installed
# from its tarball as test-js does).
BENCH_CLIENT_ARGS ?=
bench-client: deps-bench
	$(MAKE) $(BUILD)/attnd $(CLIENT_VENV)/.client $(JS_PROJECT)/.stamp
	ATTND_BIN=$(abspath $(BUILD)/attnd) ATTND_JS_PROJECT=$(abspath $(JS_PROJECT)) \
	  $(CLIENT_VENV)/bin/python bench/bench_client.py $(BENCH_CLIENT_ARGS)

# A steady open-loop load (100 small requests a second) on one model while
# another, a large layer (E=2048, fp32, 64 MiB), is reloaded every second
# through POST /v2/repository/models/{name}/load, against the same load with
# no reloads: p50, p99, max and errors per phase, the ratio of the p99s and
# the load calls' times (bench/bench_reload.py, which starts the daemon;
# numpy from the black-box suites' venv). BENCH_RELOAD_ARGS passes options,
# e.g. "--seconds 5 --rate 50" for a short run.
BENCH_RELOAD_ARGS ?=
bench-reload: deps-bench
	$(MAKE) $(BUILD)/attnd $(VENV)/.stamp
	$(VENV)/bin/python bench/bench_reload.py --attnd $(BUILD)/attnd $(BENCH_RELOAD_ARGS)

# HTTP throughput and latency with wrk, batching on and off, the large
# request's round trip, and the codec costs (bench/bench_http.sh).
bench-http: deps-bench
	$(MAKE) all $(BUILD)/bench/bench_codec
	ATTND_BIN=$(BUILD)/attnd BENCH_CODEC=$(BUILD)/bench/bench_codec sh bench/bench_http.sh
	ATTND_BIN=$(BUILD)/attnd BENCH_VENV=$(BUILD)/bench-venv sh bench/bench_json.sh

# ghz, the gRPC load generator of make bench-grpc: bench/ghz/ pins it and
# every module it pulls in (go.mod, go.sum); Go fetches them from the module
# proxy, as for build/otelcol. Bench infrastructure, built once into build/ghz/.
GHZ := build/ghz/ghz
$(GHZ): bench/ghz/tools.go bench/ghz/go.mod bench/ghz/go.sum
	@command -v go >/dev/null || { echo "go is missing: make bench-grpc builds ghz with it (README: Tests)"; exit 1; }
	cd bench/ghz && go build -buildvcs=false -trimpath -o $(abspath $@) github.com/bojand/ghz/cmd/ghz

# The bench's Python side (grpcio, grpcio-tools), pinned in
# bench/requirements-grpc.txt.
GRPC_BENCH_VENV ?= $(BUILD)/bench-grpc-venv
$(GRPC_BENCH_VENV)/.stamp: bench/requirements-grpc.txt
	$(PYTHON) -m venv $(GRPC_BENCH_VENV)
	$(GRPC_BENCH_VENV)/bin/pip install -q -r bench/requirements-grpc.txt
	touch $@

# gRPC against HTTP base64 on one daemon build, in one table: small
# requests' requests/s (grpc_load and ghz against wrk, 64 in flight), a large request's
# round trip, session steps over ModelStreamInfer against HTTP steps, the
# same forwards and steps with no transport at all (bench_core --dims,
# bench_decode: what no transport can pass), and
# whether issue 30's goals are met (bench/bench_grpc.py; nothing asserted).
# BENCH_GRPC_ARGS passes options, e.g. "--seconds 3 --runs 1" for a short run.
BENCH_GRPC_ARGS ?=
bench-grpc: deps-bench
	$(MAKE) all $(BUILD)/bench/grpc_load $(BUILD)/bench/bench_core $(BUILD)/bench/bench_decode \
	  $(GHZ) $(GRPC_BENCH_VENV)/.stamp
	$(GRPC_BENCH_VENV)/bin/python bench/bench_grpc.py --attnd $(BUILD)/attnd --ghz $(GHZ) \
	  --load $(BUILD)/bench/grpc_load --core $(BUILD)/bench/bench_core \
	  --decode $(BUILD)/bench/bench_decode $(BENCH_GRPC_ARGS)

# Deployment (tests/deploy/): docker-test lints docker/, checks the Kubernetes
# and KServe manifests against schemas and the daemon, builds the image with
# podman and runs it; scaleout-test runs three replicas behind nginx
# (docker/nginx.conf) on 127.0.0.1 and kills and stops replicas under load.
docker-test: deps
	$(MAKE) $(BUILD)/attnd venv
	ATTND_BIN=$(abspath $(BUILD)/attnd) PYTHON=$(abspath $(VENV)/bin/python) bash tests/deploy/docker_test.sh

scaleout-test: deps
	$(MAKE) $(BUILD)/attnd venv
	ATTND_BIN=$(abspath $(BUILD)/attnd) $(VENV)/bin/python tests/deploy/scaleout_test.py

# Debian's clang-format with the checked-in .clang-format, over every .c and
# .h that git tracks: format-check prints every difference and fails when
# any file has one; format rewrites the files in place.
FORMAT_FILES = $(shell git ls-files '*.c' '*.h')
format-check:
	@command -v clang-format >/dev/null || { echo "clang-format is missing: run make deps"; exit 1; }
	clang-format --dry-run -Werror $(FORMAT_FILES)
format:
	@command -v clang-format >/dev/null || { echo "clang-format is missing: run make deps"; exit 1; }
	clang-format -i $(FORMAT_FILES)

clean:
	rm -rf build build-asan build-tsan build-fuzz

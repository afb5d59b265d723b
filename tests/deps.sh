#!/bin/sh
# Installs the Debian packages a make target needs, when they are missing:
# as root with apt-get, otherwise by printing the one line to run.
#   tests/deps.sh build [PKG...]   what building and running the daemon need
#   tests/deps.sh test [PKG...]    that, and what the test suites use
# More arguments name more packages (make bench adds linux-perf, make
# valgrind adds valgrind). make run asks for `build` alone, so a new user's
# first command installs no test bench (nginx, prometheus, wrk, clang,
# chromium, torch). python3-torch (with the python3-numpy it is built
# against) is the numerics reference of the Python client's suite
# (tests/client) and of the docs' torch blocks.
BUILD_PKGS="build-essential pkg-config libmicrohttpd-dev libjansson-dev libopenblas-dev libcurl4-openssl-dev \
libgrpc-dev libprotobuf-c-dev protobuf-c-compiler"
TEST_PKGS="check python3 python3-venv python3-pip curl clang libclang-rt-14-dev clang-format \
nginx wrk prometheus nodejs chromium chromium-driver python3-torch"
case "$1" in
build) shift; PKGS="$BUILD_PKGS $*" ;;
test) shift; PKGS="$BUILD_PKGS $TEST_PKGS $*" ;;
*) PKGS="$BUILD_PKGS $TEST_PKGS $*" ;;
esac
# npm (the JavaScript client's tests and docs): Debian's nodejs leaves it to
# the npm package; a NodeSource nodejs holds it itself (and conflicts with
# that package), so it is asked for only when no npm is on the PATH.
case " $PKGS " in
*" nodejs "*) command -v npm > /dev/null 2>&1 || PKGS="$PKGS npm" ;;
esac
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" = 0 ]; then
    echo "installing:$missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends $missing
else
    echo "missing packages; run:"
    echo "  sudo apt-get install -y$missing"
    exit 1
fi

#!/bin/sh
# Installs the Debian packages attnd's build and tests need, when they are
# missing: as root with apt-get, otherwise by printing the one line to run.
# Arguments name more packages (make bench adds python3-torch and linux-perf).
PKGS="$* build-essential pkg-config libmicrohttpd-dev libjansson-dev libopenblas-dev check \
python3 python3-venv python3-pip curl clang libclang-rt-14-dev clang-format nginx wrk prometheus nodejs"
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

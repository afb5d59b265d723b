#!/bin/sh
# The image's entrypoint. When a folder with a config.json is mounted on
# /models and neither ATTND_CONFIG nor --config says otherwise, serve it;
# with nothing mounted, attnd serves its embedded default model.
# It then replaces itself with attnd (exec), so attnd is PID 1 and receives
# SIGTERM directly.
set -eu
case " $* " in
*" --config "* | *" --config="*) ;;
*)
    if [ -z "${ATTND_CONFIG:-}" ] && [ -f /models/config.json ]; then
        ATTND_CONFIG=/models/config.json
        export ATTND_CONFIG
    fi
    ;;
esac
exec /usr/local/bin/attnd "$@"

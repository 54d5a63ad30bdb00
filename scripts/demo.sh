#!/usr/bin/env bash
# Start zeropilot on the embedded defaults, submit examples/tiny-gpt.yaml, follow it to the end.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
case $VENV in /*) ;; *) VENV=$PWD/$VENV ;; esac
export PATH="$VENV/bin:$PATH"
# DeepSpeed's JIT-built ops are tied to the interpreter: one cache per venv avoids rebuilds.
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$VENV/torch_extensions}
export ZEROPILOT_DATA_DIR=${ZEROPILOT_DATA_DIR:-$PWD/.zeropilot/data}
export ZEROPILOT_API__PORT=${ZEROPILOT_API__PORT:-8321}
export ZEROPILOT_URL="http://127.0.0.1:${ZEROPILOT_API__PORT}"
# The demo keeps its CLI credentials next to its data, away from your own ~/.config.
export XDG_CONFIG_HOME=${XDG_CONFIG_HOME_DEMO:-$PWD/.zeropilot/config}
mkdir -p "$ZEROPILOT_DATA_DIR"

if curl -fsS "$ZEROPILOT_URL/healthz" >/dev/null 2>&1; then
  echo "something already answers on $ZEROPILOT_URL; stop it or set ZEROPILOT_API__PORT" >&2
  exit 1
fi

zeropilot up >"$ZEROPILOT_DATA_DIR/up.log" 2>&1 &
up_pid=$!
trap 'kill $up_pid 2>/dev/null; wait $up_pid 2>/dev/null || true' EXIT

printf 'starting zeropilot (API, worker, scheduler)'
for _ in $(seq 1 60); do
  if curl -fsS "$ZEROPILOT_URL/readyz" >/dev/null 2>&1; then break; fi
  if ! kill -0 "$up_pid" 2>/dev/null; then echo; cat "$ZEROPILOT_DATA_DIR/up.log" >&2; exit 1; fi
  printf '.'; sleep 1
done
echo
cat "$ZEROPILOT_DATA_DIR/up.log"
if [ ! -d "$TORCH_EXTENSIONS_DIR" ]; then
  echo "note: the first DeepSpeed run on this machine compiles its CPU communication op (about a minute)"
fi

status=0
zeropilot submit examples/tiny-gpt.yaml --wait || status=$?
job_id=$(zeropilot list --limit 1 --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')
echo
zeropilot status "$job_id"
cat <<MORE

The demo's server stops now; its database, logs and checkpoints stay in $ZEROPILOT_DATA_DIR.
To look at job $job_id again (Ctrl-C, or kill %1, stops \`zeropilot up\`):
  export ZEROPILOT_DATA_DIR=$ZEROPILOT_DATA_DIR XDG_CONFIG_HOME=$XDG_CONFIG_HOME PATH=$VENV/bin:\$PATH
  zeropilot up &                 # wait for "zeropilot is up", then:
  zeropilot status $job_id       # or: zeropilot metrics $job_id, zeropilot logs $job_id
and open $ZEROPILOT_URL/console in a browser: sign in with the token in
$XDG_CONFIG_HOME/zeropilot/credentials.json to see the job and its loss curve.
MORE
exit $status

# Sourced by measure.sh and variants.sh, from the repository root: the bundle unpacked on the machine (bundle.sh),
# and a `dlm serve` started and stopped.
[ -d /tmp/b/site ] || { mkdir -p /tmp/b && tar xJf .gpu/bundle.tar.xz -C /tmp/b; }
export PYTHONPATH=/tmp/b/site:$PWD REDIS_SERVER=/tmp/b/redis-server PYTHONUNBUFFERED=1
PY=python3; DLM="$PY -m services.cli.cli"

SERVING='serving on|models loaded: SERVING'  # once it serves: what `dlm serve` prints, what `--local` logs

serve_up() {  # CONFIG LOG [FLAGS]: `dlm serve FLAGS` in a session of its own; $waited s later, 0 once it serves, else 1
  setsid $DLM --config $1 serve "${@:3}" > $2 2>&1 < /dev/null &
  local srv=$! i
  for i in $(seq 1 90); do
    sleep 2; grep -qE "$SERVING" $2 && break; grep -q Traceback $2 && break; kill -0 $srv 2> /dev/null || break
  done
  waited=$((i * 2)); grep -qE "$SERVING" $2
}

serve_down() {  # CONFIG: Ctrl-C to its `dlm serve`, then whatever of Ray and Redis is left
  local i
  pkill -INT -f "$1 serve"; for i in $(seq 1 15); do sleep 1; pgrep -f "$1 serve" > /dev/null || break; done
  $PY -m ray.scripts.scripts stop --force > /dev/null 2>&1; pkill -9 -f redis-server
}

# Shared by the bench scripts that start deployments with `pdq up`: source it
# after setting bin= (the build's bin directory), model= and work= (a
# scratch directory). Provides pids (processes to stop), cleanup (the EXIT
# trap), log, up and down.
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
log() { echo "+ $*" >&2; }

# up NAME WORKERS-JSON [ROUTER-ARGS-JSON]: starts pdq up on a config of
# those workers; sets router= (gRPC host:port) and url= (the OpenAI HTTP API).
up() {
  printf '{"model": "%s", "listen": "127.0.0.1:0", "kv_transport": "tcp", "router_args": %s, "workers": %s}\n' \
    "$model" "${3:-[]}" "$2" >"$work/$1.json"
  rm -f "$work/addr" "$work/http"
  "$bin/pdq" up --config "$work/$1.json" --address-file "$work/addr" \
    --http-address-file "$work/http" >"$work/up.out" 2>"$work/up.err" &
  pids=("$!")
  for _ in $(seq 600); do
    [ -s "$work/addr" ] && [ -s "$work/http" ] && break
    kill -0 "${pids[0]}" 2>/dev/null || { cat "$work/up.err" >&2; exit 1; }
    sleep 0.5
  done
  router="$(cat "$work/addr")"
  url="http://$(cat "$work/http")/v1"
}
down() { kill "${pids[0]}"; wait "${pids[0]}" || true; pids=(); }

# llama_up SERVER GGUF SLOTS CTX: starts llama.cpp's llama-server (2 threads)
# on a free port and waits for its health check; sets llama_url= (its
# OpenAI API). Stop it with down.
llama_up() {
  local port=$((20000 + RANDOM % 20000))
  "$1" -m "$2" -t 2 -tb 2 -np "$3" -c "$4" --host 127.0.0.1 --port "$port" \
    >"$work/llama.out" 2>&1 &
  pids=("$!")
  for _ in $(seq 120); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
    sleep 0.5
  done
  llama_url="http://127.0.0.1:$port/v1"
}

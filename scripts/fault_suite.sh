#!/usr/bin/env bash
# The long fault drill on the live local stack (CPU, a few minutes; not part of `make test`):
#   1. `zipkv up --routers 2 --redis ...` (Ray Serve, two tiny-model worker replicas, two routers)
#   2. locust, mixed streamed / non-streamed completions and chats over both routers, DURATION s: 0 errors
#   3. locust on router 0 while router 1 is SIGKILLed (zipkv up restarts it) and Redis is SIGKILLed
#      and restarted empty (routers serve from their snapshot, /readyz degraded, Redis repopulated)
# Figures land in $OUT (summary.json, locust CSVs, /readyz samples); docs/reliability.md quotes a run.
#   DURATION=180 FAULT_S=90 OUT=/tmp/zipkv-faults bash scripts/fault_suite.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
OUT=${OUT:-/tmp/zipkv-faults}; DURATION=${DURATION:-180}; FAULT_S=${FAULT_S:-90}; USERS=${USERS:-8}
mkdir -p "$OUT"
log() { printf '[faults %s] %s\n' "$(date +%T)" "$*"; }
free_port() { $PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
REDIS_PORT=$(free_port); PORT=$(free_port); export ZIPKV_STATE_DIR="$OUT/state"
R0=http://127.0.0.1:$PORT; R1=http://127.0.0.1:$((PORT + 1))
start_redis() { redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$OUT" >/dev/null & REDIS_PID=$!; }
readyz() { curl -s -o /dev/null -w '%{http_code}' "$1/readyz" || true; }
cleanup() {
  [ -n "${UP_PID:-}" ] && kill -INT "$UP_PID" 2>/dev/null && wait "$UP_PID" 2>/dev/null || true
  [ -n "${REDIS_PID:-}" ] && kill "$REDIS_PID" 2>/dev/null || true
}
trap cleanup EXIT
start_redis
log "zipkv up --routers 2 --redis redis://127.0.0.1:$REDIS_PORT/0 --port $PORT"
$PY -m zipkv.stack.cli up --routers 2 --redis "redis://127.0.0.1:$REDIS_PORT/0" --port "$PORT" --workers 2 \
  --device cpu >"$OUT/up.log" 2>&1 & UP_PID=$!
for _ in $(seq 600); do grep -q "zipkv is ready" "$OUT/up.log" && break; sleep 0.5; done
grep -q "zipkv is ready" "$OUT/up.log" || { tail -30 "$OUT/up.log"; exit 1; }
log "stack ready; clean load: $USERS users, ${DURATION}s, both routers"
ZIPKV_ROUTERS="$R0,$R1" $PY -m locust -f bench/router/locustfile.py --headless -u "$USERS" -r "$USERS" -t "${DURATION}s" \
  --host "$R0" --csv "$OUT/clean" --only-summary >"$OUT/clean.log" 2>&1 || true
log "fault load on router 0 for ${FAULT_S}s: router 1 SIGKILL at 15 s, Redis SIGKILL at 40 s, back at 60 s"
$PY -m locust -f bench/router/locustfile.py --headless -u "$USERS" -r "$USERS" -t "${FAULT_S}s" --host "$R0" \
  --csv "$OUT/faults" --only-summary >"$OUT/faults.log" 2>&1 & LOCUST_PID=$!
sleep 15
ROUTER1=$($PY -c "import json,sys; print(json.load(open(sys.argv[1]))['routers'][1])" "$ZIPKV_STATE_DIR/pids-$PORT.json")
kill -9 "$ROUTER1"; log "killed router 1 (pid $ROUTER1)"
for i in $(seq 60); do [ "$(readyz "$R1")" = 200 ] && break; sleep 0.5; done
RESTART_S=$(( i / 2 )); log "router 1 serving again after ~${RESTART_S}s: $(readyz "$R1")"
sleep $(( 40 - 15 - RESTART_S > 0 ? 40 - 15 - RESTART_S : 1 ))
kill -9 "$REDIS_PID"; wait "$REDIS_PID" 2>/dev/null || true; log "killed redis"
sleep 2; curl -s "$R0/readyz" >"$OUT/readyz-redis-down.json"; log "router 0 /readyz: $(cat "$OUT/readyz-redis-down.json")"
sleep 18; start_redis; log "redis restarted empty"
for _ in $(seq 50); do [ "$(redis-cli -p "$REDIS_PORT" scard zipkv:workers 2>/dev/null)" = 2 ] && break; sleep 0.1; done
echo "{\"workers_in_redis_after_restart\": $(redis-cli -p "$REDIS_PORT" scard zipkv:workers)}" >"$OUT/redis-repopulated.json"
log "redis repopulated: $(cat "$OUT/redis-repopulated.json")"
wait "$LOCUST_PID" || true
$PY - "$OUT" <<'PY'
import csv, json, sys
out = sys.argv[1]
def agg(name):
    rows = list(csv.DictReader(open(f"{out}/{name}_stats.csv")))
    row = next(r for r in rows if r["Name"] == "Aggregated")
    return {"requests": int(row["Request Count"]), "failures": int(row["Failure Count"]),
            "p50_ms": float(row["50%"]), "p99_ms": float(row["99%"]), "rps": float(row["Requests/s"])}
summary = {"clean": agg("clean"), "faults": agg("faults"),
           "redis": json.load(open(f"{out}/redis-repopulated.json")),
           "readyz_while_redis_down": json.load(open(f"{out}/readyz-redis-down.json"))}
json.dump(summary, open(f"{out}/summary.json", "w"), indent=2)
print(json.dumps(summary, indent=2))
PY

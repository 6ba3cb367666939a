#!/usr/bin/env bash
# The long fault drill on the live local stack (CPU, a few minutes; not part of `make test`):
#   1. `zipkv up --routers 2 --redis ...` (Ray Serve, two tiny-model worker replicas, two routers)
#   2. locust, mixed streamed / non-streamed completions and chats over both routers, DURATION s: 0 errors
#   3. locust on router 0 while router 1 is SIGKILLed (zipkv up restarts it) and Redis is SIGKILLed
#      and restarted empty (routers serve from their snapshot, /readyz degraded, Redis repopulated)
#   4. locust on both routers while one Ray Serve worker replica is SIGKILLed mid-stream (its streams end
#      with an error, its non-streamed requests are dispatched again; 8 long probes make sure some run on
#      it; Serve places a replacement; the routers drop the dead worker when its reports stop, count the
#      new one when it reports, and /readyz stays 200 meanwhile)
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

# 4. A worker replica SIGKILLed mid-stream. First both routers must see 2 ready workers again.
# router_counters FILE: both routers' retry (by reason) and stream-error counters, summed, from /metrics.
router_counters() {
  $PY - "$1" "$R0" "$R1" <<'PY'
import json, sys, urllib.request
from prometheus_client.parser import text_string_to_metric_families
totals = {}
for url in sys.argv[2:]:
    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "zipkv_router_retries_total":
                key = "retries_" + s.labels["reason"]
            elif s.name == "zipkv_router_stream_errors_total":
                key = "stream_errors"
            else:
                continue
            totals[key] = totals.get(key, 0) + int(s.value)
json.dump(totals, open(sys.argv[1], "w"))
PY
}
ready_workers() {
  curl -s "$1/readyz" | $PY -c 'import json,sys; print(json.load(sys.stdin)["models"]["zipkv-tiny"]["ready"])' \
    2>/dev/null || echo 0
}
for _ in $(seq 120); do [ "$(ready_workers "$R0")" = 2 ] && [ "$(ready_workers "$R1")" = 2 ] && break; sleep 0.5; done
log "replica kill: $USERS users on both routers for ${FAULT_S}s; one worker replica SIGKILLed at 15 s, 8 long probes from 13 s"
ZIPKV_ROUTERS="$R0,$R1" $PY -m locust -f bench/router/locustfile.py --headless -u "$USERS" -r "$USERS" -t "${FAULT_S}s" \
  --host "$R0" --csv "$OUT/replica" --only-summary >"$OUT/replica.log" 2>&1 & LOCUST_PID=$!
sleep 13
# Probes, so that the kill surely lands mid-generation (locust's replies take ~0.1 s): 4 non-streamed and
# 4 streamed completions of 600 tokens (ignore_eos) over both routers, 2 s before the kill. Each must come
# back whole (200, 600 tokens; a stream with [DONE] and no error event): a non-streamed one whose worker
# dies starts again on the other, a streamed one goes on there from the tokens it sent.
$PY - "$OUT/probes.json" "$R0" "$R1" <<'PY' & PROBES_PID=$!
import json, sys, threading, time, httpx
out, routers = sys.argv[1], sys.argv[2:]
results = []
def probe(i: int) -> None:
    url, stream = routers[i % 2] + "/v1/completions", i >= 4
    body = {"model": "zipkv-tiny", "prompt": f"probe {i}", "max_tokens": 600, "ignore_eos": True, "stream": stream,
            "stream_options": {"include_usage": True}} if stream else {
            "model": "zipkv-tiny", "prompt": f"probe {i}", "max_tokens": 600, "ignore_eos": True}
    rec = {"probe": i, "stream": stream, "t_start": time.time()}
    try:
        with httpx.stream("POST", url, json=body, timeout=120) as r:
            rec.update(status=r.status_code, worker=r.headers.get("x-zipkv-worker"))
            if stream:
                lines = [ln for ln in r.iter_lines() if ln]
                rec.update(done=lines[-1:] == ["data: [DONE]"], error_event=any('"error"' in ln for ln in lines))
                usage = [json.loads(ln[6:])["usage"] for ln in lines if ln.startswith("data: {") and '"usage"' in ln]
                rec.update(completion_tokens=usage[-1]["completion_tokens"] if usage else None)
            else:
                r.read()
                rec.update(completion_tokens=r.json().get("usage", {}).get("completion_tokens"))
    except httpx.HTTPError as e:
        rec.update(status=0, error=str(e))
    rec["t_end"] = time.time()  # against killed_at_s: which probes were running at the kill
    results.append(rec)
threads = [threading.Thread(target=probe, args=(i,)) for i in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
json.dump(sorted(results, key=lambda r: r["probe"]), open(out, "w"), indent=1)
PY
sleep 2
# Which process is a replica: Ray names each actor's process after it (`ray::ServeReplica:<app>:<deployment>`,
# `.method` appended while it runs one), and the replicas are the raylet's children, so descendants of this
# stack's `zipkv up`: another Ray on the machine (a test run) cannot be picked. Which worker id it is: the
# gRPC port it listens on, matched against the addresses in the status tap's reports. The victim is the one
# whose last report (at most ~0.65 s old) shows the most running requests, so that it dies mid-stream;
# up to 10 s of waiting for one that runs any.
REPLICA=$($PY - "$UP_PID" "$ZIPKV_STATE_DIR/status-$PORT.json" <<'PY'
import json, sys, time
import psutil
title = "ray::ServeReplica:zipkv:zipkv-worker"
procs = []
for p in psutil.Process(int(sys.argv[1])).children(recursive=True):
    try:
        if " ".join(p.cmdline()).startswith(title):
            procs.append(p)
    except psutil.Error:
        pass
if not procs:
    sys.exit(f"no process titled {title!r} under zipkv up (pid {sys.argv[1]})")
listen = psutil.CONN_LISTEN
ports = {p.pid: {c.laddr.port for c in p.net_connections("tcp") if c.status == listen} for p in procs}
deadline = time.monotonic() + 10
while True:
    workers = json.load(open(sys.argv[2]))["workers"]
    found = [(w.get("running_requests", 0), pid, w["worker_id"]) for pid, listening in ports.items()
             for w in workers if int(w["address"].rsplit(":", 1)[1]) in listening]
    if not found:
        sys.exit(f"no replica process {sorted(ports)} listens on a reported worker address")
    running, pid, worker_id = max(found)
    if running > 0 or time.monotonic() > deadline:
        print(pid, worker_id, running)
        break
    time.sleep(0.2)
PY
)
read -r REPLICA_PID REPLICA_ID REPLICA_RUNNING <<<"$REPLICA"
router_counters "$OUT/counters-before-replica-kill.json"
kill -9 "$REPLICA_PID"; KILLED_AT=$(date +%s.%N); echo "$KILLED_AT" >"$OUT/killed_at_s"
log "killed worker replica $REPLICA_ID (pid $REPLICA_PID; $REPLICA_RUNNING running requests at its last report)"
# Both routers' /readyz every 0.25 s until each has counted 2 ready workers again after its count left 2
# (dead worker expired, replacement reporting: either order) and the status tap (written every 0.5 s) has
# shown the replacement, a worker id not seen before the kill; at most 150 s.
RECOVERY=$($PY - "$OUT" "$KILLED_AT" "$REPLICA_PID" "$REPLICA_ID" "$REPLICA_RUNNING" "$ZIPKV_STATE_DIR/status-$PORT.json" \
  "$R0" "$R1" <<'PY'
import json, sys, time, urllib.error, urllib.request
out, killed_at, pid, dead_id, running, tap, *routers = sys.argv[1:]
killed_at = float(killed_at)
before = {w["worker_id"] for w in json.load(open(tap))["workers"]}
def readyz(url):
    try:
        with urllib.request.urlopen(url + "/readyz", timeout=2) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)
    except OSError as e:
        return 0, {"error": str(e)}
state = {u: {"codes": {}, "min_ready": 2, "left_2_s": None, "ready_again_s": None} for u in routers}
outage, replacement, replacement_s = None, None, None
with open(f"{out}/readyz-replica-kill.jsonl", "w") as samples:
    while time.time() - killed_at < 150 and (
        replacement is None or any(s["ready_again_s"] is None for s in state.values())
    ):
        t = round(time.time() - killed_at, 2)
        for u in routers:
            code, body = readyz(u)
            s = state[u]
            s["codes"][str(code)] = s["codes"].get(str(code), 0) + 1
            ready = body.get("models", {}).get("zipkv-tiny", {}).get("ready", 0)
            s["min_ready"] = min(s["min_ready"], ready)
            samples.write(json.dumps({"t_s": t, "router": u, "code": code, "body": body}) + "\n")
            if ready != 2 and s["left_2_s"] is None:
                s["left_2_s"] = t
            if ready == 2 and s["left_2_s"] is not None and s["ready_again_s"] is None:
                s["ready_again_s"] = t
            if u == routers[0] and ready < 2 and outage is None:
                outage = {"t_s": t, "code": code, "body": body}
        if replacement is None:
            try:
                new = {w["worker_id"] for w in json.load(open(tap))["workers"]} - before
            except (OSError, ValueError):
                new = set()
            if new:
                replacement, replacement_s = sorted(new)[0], t
        time.sleep(0.25)
result = {
    "killed_worker": dead_id, "killed_pid": int(pid), "killed_worker_running_requests": int(running),
    "killed_at": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(killed_at)), "killed_s_into_phase": 15,
    "replacement_worker": replacement, "replacement_first_report_s": replacement_s,
    "router0_ready_again_s": state[routers[0]]["ready_again_s"],
    "router1_ready_again_s": state[routers[1]]["ready_again_s"],
    "router0_dropped_dead_worker_s": state[routers[0]]["left_2_s"],
    "readyz_codes_until_recovered": {k: state[u]["codes"] for k, u in zip(("router0", "router1"), routers)},
    "router0_min_ready": state[routers[0]]["min_ready"],
    "router0_readyz_during_outage": outage,
}
json.dump(result, open(f"{out}/replica-kill.json", "w"), indent=2)
print(f"replacement {replacement} first reported {replacement_s} s after the kill; 2 ready workers again after "
      f"{result['router0_ready_again_s']} s (router 0), {result['router1_ready_again_s']} s (router 1); "
      f"/readyz codes meanwhile {result['readyz_codes_until_recovered']}")
PY
)
log "replica kill: $RECOVERY"
wait "$LOCUST_PID" || true
wait "$PROBES_PID" || true
router_counters "$OUT/counters-after-replica-kill.json"
$PY - "$OUT" <<'PY'
import csv, json, sys
out = sys.argv[1]
def agg(name):
    rows = list(csv.DictReader(open(f"{out}/{name}_stats.csv")))
    row = next(r for r in rows if r["Name"] == "Aggregated")
    return {"requests": int(row["Request Count"]), "failures": int(row["Failure Count"]),
            "p50_ms": float(row["50%"]), "p99_ms": float(row["99%"]), "rps": float(row["Requests/s"])}
def failures(name):  # what failed, and how often (the locust failure CSV, messages cut short)
    rows = csv.DictReader(open(f"{out}/{name}_failures.csv"))
    return [{"name": r["Name"], "error": r["Error"][:160], "count": int(r["Occurrences"])} for r in rows]
summary = {"clean": agg("clean"), "faults": agg("faults"),
           "redis": json.load(open(f"{out}/redis-repopulated.json")),
           "readyz_while_redis_down": json.load(open(f"{out}/readyz-redis-down.json"))}
before, after = (json.load(open(f"{out}/counters-{w}-replica-kill.json")) for w in ("before", "after"))
counters = {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}
summary["replica_kill"] = {**agg("replica"), "failed": failures("replica"),
                           "killed_at_s": float(open(f"{out}/killed_at_s").read()),
                           "probes": json.load(open(f"{out}/probes.json")),
                           "router_counters_from_kill_to_end": counters,
                           **json.load(open(f"{out}/replica-kill.json"))}
json.dump(summary, open(f"{out}/summary.json", "w"), indent=2)
print(json.dumps(summary, indent=2))
PY

#!/usr/bin/env bash
# The trace table of docs/stress.md (#replaying-a-trace): `kvsched stress --trace` on the bundled
# Mooncake trace with each store, release build; prints a Markdown table, one row a run, with the
# prompt tokens by source against the trace's own reference (computed by the tool on the
# requests replayed), finished/s, step overhead and time to first token. Each row is the median
# of REPEAT runs (default 1) by the served share.
#
#   scripts/trace-table.sh                          # memory, disk, redis; clean and faulty
#   REQUESTS=1000 ROWS="memory disk" scripts/trace-table.sh
#
# Rows: memory, disk, redis (the store, defaults otherwise: verify on, the 16,384-block device
# pool), and memory-faults, disk-faults, redis-faults (the same with store faults: corrupt=0.01,
# truncate=0.01, evict=0.01, and --faults deadline=0.01 on the asynchronous loads).
set -euo pipefail
cd "$(dirname "$0")/.."

requests="${REQUESTS:-2000}"
repeat="${REPEAT:-1}"
rows=(${ROWS:-memory disk redis memory-faults disk-faults redis-faults})
trace=traces/mooncake_conversation_trace.jsonl

cargo build --release --quiet -p kvsched-cli
bin="${CARGO_TARGET_DIR:-target}/release/kvsched"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

faults="corrupt=0.01,truncate=0.01,evict=0.01,deadline=0.01"
args_of() {
  case "$1" in
    memory) echo "--store memory" ;;
    disk) echo "--store disk=$out/disk-$2" ;;
    redis) echo "--store redis" ;;
    memory-faults) echo "--store memory --faults $faults" ;;
    disk-faults) echo "--store disk=$out/diskf-$2 --faults $faults" ;;
    redis-faults) echo "--store redis --faults $faults" ;;
    *) echo "unknown row $1" >&2; exit 2 ;;
  esac
}

echo "$(date -u +%FT%TZ), load average $(cut -d' ' -f1-3 /proc/loadavg), $trace, first $requests requests, $repeat run(s) a row"
echo
echo "| store | device hit | tier hit | computed (after a failed load) | served / unbounded reference | device-pool LRU · device + tier LRU | garbage | finished/s | step p50 / p99 (µs) | TTFT p50 / p99 (ms) |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for row in "${rows[@]}"; do
  for i in $(seq 1 "$repeat"); do
    # shellcheck disable=SC2046
    "$bin" stress --trace "$trace" --trace-requests "$requests" $(args_of "$row" "$i") --json >"$out/$row-$i.json"
  done
  python3 - "$row" "$out" "$repeat" <<'PY'
import json, sys
row, out, repeat = sys.argv[1], sys.argv[2], int(sys.argv[3])
runs = [json.load(open(f"{out}/{row}-{i}.json")) for i in range(1, repeat + 1)]
def served(d):
    p = d["prompt_tokens"]
    return (p["device_hit"] + p["tier_hit"]) / max(p["total"], 1)
runs.sort(key=served)
d = runs[len(runs) // 2]
p, ref, kv = d["prompt_tokens"], d["config"]["trace_reference"], d["kv"]
t = max(p["total"], 1)
pct = lambda n: f"{100 * n / t:.1f}%"
inf = ref["infinite_cache_share"]
share = served(d)
ttft = d["load_policy"]["time_to_first_token_us"]
so = d["step_overhead_us"]
garbage = kv["garbage_reads"]
print(f"| {row} | {pct(p['device_hit'])} | {pct(p['tier_hit'])} | {pct(p['computed'])} ({pct(p['computed_after_failed_load'])}) "
      f"| {100 * share:.1f}% / {100 * inf:.1f}% = **{share / inf:.0%}** "
      f"| {100 * ref['device_pool_lru_share']:.1f}% · {100 * ref['device_and_tier_lru_share']:.1f}% "
      f"| {garbage} | {d['finished_per_s']:,.1f} | {so['p50']:,.1f} / {so['p99']:,.0f} "
      f"| {ttft['p50'] / 1e3:,.1f} / {ttft['p99'] / 1e3:,.0f} |")
if d["timed_out"] or d["requests"]["finished"] < 0.99 * d["requests"]["submitted"]:
    print(f"<!-- {row}: timed out or fell behind: {d['requests']} -->")
PY
done

#!/usr/bin/env bash
# The trace table of docs/stress.md (#replaying-a-trace): `kvsched stress --trace` on the bundled
# Mooncake trace with each store, release build; prints a Markdown table, one row a run, with the
# prompt tokens by source against the trace's own reference (computed by the tool on the
# requests replayed), finished/s, step overhead and time to first token. Each figure is the
# median of REPEAT runs (default 1), the garbage the most of them; with REPEAT > 1 each run's
# TTFT p99 follows in brackets.
#
#   scripts/trace-table.sh                          # memory, disk, redis; clean and faulty
#   REQUESTS=1000 ROWS="memory disk" scripts/trace-table.sh
#
# Rows: memory, disk, redis (the store, defaults otherwise: verify on, the 16,384-block device
# pool), sim (the sim store: a share --failure-rate 0.01 of the chunks it returns damaged in
# transfer), and memory-faults, disk-faults, redis-faults (store faults: a share 0.001 of
# chunks corrupt, truncated and evicted each, so a load of n chunks meets one with probability
# 1 - 0.997^n, and --faults deadline=0.01 on the asynchronous loads).
# Geometry rows (memory store): dense, hybrid-mamba. Load-policy rows (memory store):
# always, cost, never, and slow-always, slow-cost, slow-never with --faults slow=0.05 (a
# twentieth of chunk reads delay their load 4x past its deadline). BIN=PATH runs another
# build (a plant's, to measure "before"); ARGS="..." is added to every run.
set -euo pipefail
cd "$(dirname "$0")/.."

requests="${REQUESTS:-2000}"
repeat="${REPEAT:-1}"
rows=(${ROWS:-memory disk redis sim memory-faults disk-faults redis-faults})
trace=traces/mooncake_conversation_trace.jsonl

if [ -z "${BIN:-}" ]; then cargo build --release --quiet -p kvsched-cli; fi
bin="${BIN:-${CARGO_TARGET_DIR:-target}/release/kvsched}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

faults="corrupt=0.001,truncate=0.001,evict=0.001,deadline=0.01"
args_of() {
  case "$1" in
    memory) echo "--store memory" ;;
    sim) echo "--store sim" ;;
    disk) echo "--store disk=$out/disk-$2" ;;
    redis) echo "--store redis" ;;
    memory-faults) echo "--store memory --faults $faults" ;;
    disk-faults) echo "--store disk=$out/diskf-$2 --faults $faults" ;;
    redis-faults) echo "--store redis --faults $faults" ;;
    dense) echo "--store memory --groups dense" ;;
    hybrid-mamba) echo "--store memory --groups hybrid-mamba" ;;
    always|cost|never) echo "--store memory --load-policy $1" ;;
    slow-always|slow-cost|slow-never) echo "--store memory --faults slow=0.05 --load-policy ${1#slow-}" ;;
    *) echo "unknown row $1" >&2; exit 2 ;;
  esac
}

echo "$(date -u +%FT%TZ), load average $(cut -d' ' -f1-3 /proc/loadavg), $trace, first $requests requests, $repeat run(s) a row"
echo
echo "| row | device hit | tier hit | computed (after a failed load) | served / unbounded reference | device-pool LRU · device + tier LRU | garbage | finished/s | step p50 / p99 (µs) | TTFT p50 / p99 (ms) | async loads (failed) | hits not loaded whole | tokens given back to alignment |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for row in "${rows[@]}"; do
  for i in $(seq 1 "$repeat"); do
    # shellcheck disable=SC2046
    "$bin" stress --trace "$trace" --trace-requests "$requests" $(args_of "$row" "$i") ${ARGS:-} --json >"$out/$row-$i.json"
  done
  python3 - "$row" "$out" "$repeat" <<'PY'
import json, sys
row, out, repeat = sys.argv[1], sys.argv[2], int(sys.argv[3])
runs = [json.load(open(f"{out}/{row}-{i}.json")) for i in range(1, repeat + 1)]
def med(f):
    v = sorted(f(d) for d in runs)
    return v[len(v) // 2]
def share(d, *keys):
    p = d["prompt_tokens"]
    return sum(p[k] for k in keys) / max(p["total"], 1)
d = runs[0]
ref = d["config"]["trace_reference"]
inf = ref["infinite_cache_share"]
pct = lambda x: f"{100 * x:.1f}%"
served = med(lambda d: share(d, "device_hit", "tier_hit"))
ttft = lambda q: med(lambda d: d["load_policy"]["time_to_first_token_us"][q]) / 1e3
ttft99_runs = " / ".join(f"{d['load_policy']['time_to_first_token_us']['p99'] / 1e3:,.0f}" for d in runs)
each = f" ({ttft99_runs})" if repeat > 1 else ""
print(f"| {row} | {pct(med(lambda d: share(d, 'device_hit')))} | {pct(med(lambda d: share(d, 'tier_hit')))} "
      f"| {pct(med(lambda d: share(d, 'computed')))} ({pct(med(lambda d: share(d, 'computed_after_failed_load')))}) "
      f"| {pct(served)} / {pct(inf)} = **{served / inf:.0%}** "
      f"| {pct(ref['device_pool_lru_share'])} · {pct(ref['device_and_tier_lru_share'])} "
      f"| {max(d['kv']['garbage_reads'] or 0 for d in runs)} | {med(lambda d: d['finished_per_s']):,.1f} "
      f"| {med(lambda d: d['step_overhead_us']['p50']):,.1f} / {med(lambda d: d['step_overhead_us']['p99']):,.0f} "
      f"| {ttft('p50'):,.1f} / {ttft('p99'):,.0f}{each} "
      f"| {med(lambda d: d['loads']['dispatched']):,} ({med(lambda d: d['loads']['failed']):,}) "
      f"| {med(lambda d: d['load_policy']['declined_requests']):,} "
      f"| {med(lambda d: d['events'].get('aligned_chunk_tokens', 0)):,} |")
for d in runs:
    if d["timed_out"] or d["requests"]["finished"] < 0.99 * d["requests"]["submitted"]:
        print(f"<!-- {row}: a run timed out or fell behind: {d['requests']} -->")
PY
done

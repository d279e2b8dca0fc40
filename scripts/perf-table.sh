#!/usr/bin/env bash
# The performance table of README (#performance; details in docs/performance.md): `kvsched stress --baseline mutex --repeat N`
# on each load of the table, release build; prints a Markdown table of medians, each cell
# kvsched / mutex. Step figures are the scheduler's: `schedule()` + `update()` on the engine
# thread, wall and the thread's CPU time; CPU per finished request is the whole process.
#
#   scripts/perf-table.sh              # every row, 3 runs of each scheduler
#   REPEAT=5 ROWS="open live4k" scripts/perf-table.sh
#   PLOT=docs/stress-example.svg scripts/perf-table.sh   # also plot the live4k-fail row
#
# Rows: open (the defaults: 2,000/s open loop), open-off (--verify off), open-1 (--verify off
# --shards 1), live256, live1k, live4k, live16k, live64k (--rate max --live N --verify off;
# 16k and 64k with 80,000 requests, so that a run is mostly at its live count, not ramping up
# to it and draining), live4k-fail (--rate max --live 4096 --requests 30000, verify on).
# Not in the default list: same256, same4k, same16k — the closed loop with instant loads
# waited for before every step (`--lockstep --load-latency-us 0..0 --failure-rate 0`), so
# both schedulers take the same steps and their step percentiles compare the same work.
set -euo pipefail
cd "$(dirname "$0")/.."

repeat="${REPEAT:-3}"
rows=(${ROWS:-open open-off open-1 live256 live1k live4k live16k live64k live4k-fail})

cargo build --release --quiet -p kvsched-cli
bin="${CARGO_TARGET_DIR:-target}/release/kvsched"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

args_of() {
  case "$1" in
    open) echo "" ;;
    open-off) echo "--verify off" ;;
    open-1) echo "--verify off --shards 1" ;;
    live256) echo "--rate max --live 256 --verify off" ;;
    live1k) echo "--rate max --live 1024 --verify off" ;;
    live4k) echo "--rate max --live 4096 --verify off" ;;
    live16k) echo "--rate max --live 16384 --requests 80000 --verify off" ;;
    live64k) echo "--rate max --live 65536 --requests 80000 --verify off" ;;
    live4k-fail) echo "--rate max --live 4096 --requests 30000 --failure-rate 0.01" ;;
    same256) echo "--rate max --live 256 --requests 20000 --verify off --lockstep --load-latency-us 0..0 --failure-rate 0 --seed 7" ;;
    same4k) echo "--rate max --live 4096 --requests 30000 --verify off --lockstep --load-latency-us 0..0 --failure-rate 0 --seed 7" ;;
    same16k) echo "--rate max --live 16384 --requests 40000 --verify off --lockstep --load-latency-us 0..0 --failure-rate 0 --seed 7" ;;
    *) echo "unknown row $1" >&2; exit 2 ;;
  esac
}

echo "$(date -u +%FT%TZ), load average $(cut -d' ' -f1-3 /proc/loadavg), --repeat $repeat"
echo
echo "| run | step wall p50 | step wall p99 | step CPU p50 | step CPU p99 | scheduler CPU µs / finished | process CPU µs / finished | finished/s | scheduled / step |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for row in "${rows[@]}"; do
  plot=()
  if [ -n "${PLOT:-}" ] && [ "$row" = live4k-fail ]; then plot=(--plot "$PLOT"); fi
  # shellcheck disable=SC2046
  "$bin" stress $(args_of "$row") --baseline mutex --repeat "$repeat" --json "${plot[@]}" >"$out/run.json"
  python3 - "$out/run.json" "$row" "$(args_of "$row")" <<'PY'
import json, sys
path, row, args = sys.argv[1:]
f = json.load(open(path))["figures"]
def cell(key, digits=1):
    v = f[key]
    a, b = v["kvsched"]["median"], v["baseline"]["median"]
    fmt = (lambda x: f"{x:,.{digits}f}") if digits else (lambda x: f"{x:,.0f}")
    return f"{fmt(a)} / {fmt(b)}"
name = f"`{args}`" if args else "defaults (2,000/s open loop, verify on)"
print(f"| {name} | {cell('step_overhead_us.p50')} | {cell('step_overhead_us.p99', 0)} "
      f"| {cell('step_cpu_us.p50')} | {cell('step_cpu_us.p99', 0)} "
      f"| {cell('cost.step_cpu_us_per_finished')} | {cell('cpu.us_per_finished', 0)} "
      f"| {cell('finished_per_s', 0)} | {cell('scheduled_per_step')} |")
PY
done
echo
echo "load average at the end $(cut -d' ' -f1-3 /proc/loadavg)"

#!/usr/bin/env bash
# The scheduler's cost in instructions, kvsched against the mutex baseline: each row of
# perf-table.sh's loads run under callgrind twice, once counting only the runtime's
# `schedule()` + `update()` and once only the baseline's step and output recording, and
# printed as instructions per finished request. Instruction counts do not move with the
# machine's load (valgrind runs the threads one at a time and counts, not times), so two
# builds compare here within a fraction of a percent on a machine too busy for
# perf-table.sh; they do not see cache misses or the cost of atomic instructions, which is
# what perf-table.sh's CPU times add.
#
#   scripts/instr-table.sh                       # every row
#   ROWS="live256 live4k" scripts/instr-table.sh
#   ROWS="same32 same32-1 same256-1" scripts/instr-table.sh   # the same steps in both
#   BIN=/path/to/kvsched scripts/instr-table.sh  # another build
#
# Under valgrind a run is about 50 times slower, so the rows submit fewer requests than
# perf-table.sh's (the open loop's arrivals then outpace the steps: its steps are larger
# than on a real run, the same for both schedulers), and `--duration` is raised so that
# every run ends by its request count, never cut short. `stress --baseline mutex` runs the
# baseline once unmeasured before its measured run; both go through the counted calls, so
# the baseline's count is halved (its warm-up run does the same work).
set -euo pipefail
cd "$(dirname "$0")/.."

command -v valgrind >/dev/null || { echo "instr-table.sh: valgrind is not installed" >&2; exit 2; }
rows=(${ROWS:-open open-1 live256 live1k live4k live4k-fail})
if [ -z "${BIN:-}" ]; then
  cargo build --release --quiet -p kvsched-cli
  BIN="${CARGO_TARGET_DIR:-target}/release/kvsched"
fi
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

args_of() {
  case "$1" in
    open) echo "--verify off --requests 3000 --duration 3600" ;;
    open-1) echo "--verify off --shards 1 --requests 3000 --duration 3600" ;;
    live256) echo "--rate max --live 256 --verify off --requests 6000 --duration 3600" ;;
    live1k) echo "--rate max --live 1024 --verify off --requests 8000 --duration 3600" ;;
    live4k) echo "--rate max --live 4096 --verify off --requests 16000 --duration 3600" ;;
    live4k-fail) echo "--rate max --live 4096 --requests 16000 --failure-rate 0.01 --duration 3600" ;;
    # The same steps in both schedulers: a closed loop, instant loads, every load landed
    # before the next step (`--lockstep`), no sim-store damage (docs/stress.md, "Same
    # decisions"). One shard makes the baseline's decisions step for step; two split the
    # step's budget, so their steps may differ a little.
    same32) echo "--rate max --live 32 --verify off --requests 3000 $SAME" ;;
    same32-1) echo "--rate max --live 32 --verify off --requests 3000 --shards 1 $SAME" ;;
    same256-1) echo "--rate max --live 256 --verify off --requests 4000 --shards 1 $SAME" ;;
    *) echo "unknown row $1" >&2; exit 2 ;;
  esac
}

SAME="--lockstep --load-latency-us 0..0 --failure-rate 0 --seed 7 --duration 3600"

counted() { grep -o 'Collected : [0-9]*' "$1" | awk '{print $3}'; }

echo "$(date -u +%FT%TZ), $BIN"
echo
echo "| run | kvsched instructions / finished | baseline | kvsched / baseline | steps, kvsched / baseline |"
echo "| --- | ---: | ---: | ---: | ---: |"
for row in "${rows[@]}"; do
  # shellcheck disable=SC2046
  valgrind --tool=callgrind --callgrind-out-file="$out/rt.cg" \
    '--toggle-collect=kvsched::runtime::step::Runtime::schedule' \
    '--toggle-collect=kvsched::runtime::step::Runtime::update' \
    "$BIN" stress $(args_of "$row") --baseline mutex --repeat 1 --json >"$out/rt.json" 2>"$out/rt.log"
  # shellcheck disable=SC2046
  valgrind --tool=callgrind --callgrind-out-file="$out/bl.cg" \
    '--toggle-collect=kvsched::baseline::scheduler::MutexScheduler::step' \
    '--toggle-collect=*State>::record_output' \
    "$BIN" stress $(args_of "$row") --baseline mutex --repeat 1 --json >"$out/bl.json" 2>"$out/bl.log"
  python3 - "$row" "$(args_of "$row")" "$(counted "$out/rt.log")" "$(counted "$out/bl.log")" \
    "$out/rt.json" "$out/bl.json" <<'PY'
import json, sys
row, args, rt, bl, rt_json, bl_json = sys.argv[1:]
finished = json.load(open(rt_json))["requests"]["finished"]
base = json.load(open(bl_json))["baseline"]
base_finished = base["requests"]["finished"]
for name, run in (("kvsched", json.load(open(rt_json))), ("baseline", base)):
    if run.get("timed_out"):
        sys.exit(f"instr-table.sh: {row}: the {name} run reached --duration")
a = int(rt) / finished
b = int(bl) / 2 / base_finished
steps = json.load(open(rt_json))["steps"]
args = args.replace(" --duration 3600", "")
print(f"| `{args}` | {a:,.0f} | {b:,.0f} | {a / b:.3f} | {steps:,} / {base['steps']:,} |", flush=True)
PY
done

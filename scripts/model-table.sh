#!/usr/bin/env bash
# The closing table of docs/model.md: `kvsched stress --engine model` on its default workload,
# preset × store × failure rate × mode → tokens checked, wrong tokens (by cause), wrong logits,
# tokens recomputed, time to first token p50/p99. Release build; prints a Markdown table.
#
#   scripts/model-table.sh               # 3 presets × 2 stores × 2 failure rates × 2 modes
#   SEED=2 scripts/model-table.sh        # another seed
#
# "Failure" is --failure-rate on the sim store and --faults corrupt=R (chunks damaged at
# rest) on the memory store. The two modes of a row pair run back to back, so read them
# against each other: on a loaded machine the rows are not comparable in time.
set -euo pipefail
cd "$(dirname "$0")/.."

seed="${SEED:-1}"
presets=(${PRESETS:-hybrid-swa hybrid-mamba hybrid-swa-mamba})
stores=(${STORES:-sim memory})
rates=(${RATES:-0 0.05})

cargo build --release --quiet -p kvsched-cli
bin="${CARGO_TARGET_DIR:-target}/release/kvsched"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

echo "seed $seed, $(date -u +%FT%TZ), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| preset | store | failure | mode | tokens checked | wrong tokens (#49250 / cached) | wrong logits | tokens recomputed | TTFT p50 / p99 (s) |"
echo "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |"
for preset in "${presets[@]}"; do
  for store in "${stores[@]}"; do
    for rate in "${rates[@]}"; do
      for mode in safe vllm; do
        args=(stress --engine model --groups "$preset" --mode "$mode" --seed "$seed" --json)
        if [ "$store" = sim ]; then
          args+=(--failure-rate "$rate")
        else
          args+=(--store "$store" --failure-rate 0)
          if [ "$rate" != 0 ]; then args+=(--faults "corrupt=$rate"); fi
        fi
        json="$out/run.json"
        code=0
        "$bin" "${args[@]}" >"$json" || code=$?
        python3 - "$json" "$preset" "$store" "$rate" "$mode" "$code" <<'EOF'
import json, sys
path, preset, store, rate, mode, code = sys.argv[1:]
r = json.load(open(path))
m = r["model"]
c = m["wrong_tokens_by_cause"]
t = m["time_to_first_token_us"]
checked = f'{m["tokens_checked"]:,}'
if r.get("timed_out"):
    checked += " (timed out)"
if code != "0":
    checked += f" (exit {code})"
wrong = f'{m["token_mismatches"]:,} ({c["sharers_read_failed_load"]} / {c["rolled_back_blocks_cached"]})'
if c["unattributed"]:
    wrong += f' + {c["unattributed"]} unattributed'
print(f'| {preset} | {store} | {rate} | {mode} | {checked} | {wrong} | {m["logit_mismatches"]:,} '
      f'| {r["tokens_recomputed"]:,} | {t["p50"] / 1e6:.1f} / {t["p99"] / 1e6:.1f} |')
EOF
      done
    done
  done
done
echo
echo "load average at the end $(cut -d' ' -f1-3 /proc/loadavg)"

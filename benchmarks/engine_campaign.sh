#!/usr/bin/env bash
# The engine's H100 campaign in one call: train the tiny pair, run the engine's GPU tests on it,
# and compare decode strategies at 16K. Everything lands under $OUT in at most 8 files of at
# most 16 MiB (the device tool's limits): the target's weight shards as they are, the rest in
# two tarballs. Usage: OUT=dir bash benchmarks/engine_campaign.sh [train_seconds]
set -uo pipefail
export PYTHONUNBUFFERED=1
budget=${1:-220}
ck=$OUT/ckpt
mkdir -p "$ck" "$OUT/logs"
timeout 360 python3 -m ssvkit.cli train-tiny --out "$ck" --time-budget-s "$budget" --json \
  > "$OUT/logs/train_summary_stdout.json" 2> "$OUT/logs/train.log"
echo "train rc=$?"; tail -3 "$OUT/logs/train.log"
mkdir -p engine/checkpoints && cp -r "$ck"/tiny-target "$ck"/tiny-draft engine/checkpoints/
timeout 150 python3 -m pytest -m gpu tests/engine -q -p no:cacheprovider > "$OUT/logs/gpu_tests.log" 2>&1
echo "engine gpu tests rc=$?"; tail -4 "$OUT/logs/gpu_tests.log"
run() {  # name, then decode options
  local name=$1; shift
  timeout 60 python3 -m ssvkit.cli decode --model tiny --context 16K --max-new-tokens 256 --json \
    "$@" > "$OUT/logs/decode_$name.json" 2> "$OUT/logs/decode_$name.err"
  python3 - "$OUT/logs/decode_$name.json" "$name" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"{sys.argv[2]:28s} failed: {e}")
    raise SystemExit
m = d.get("measured", d)
tps = m.get("tokens_per_s", {})
acc = m.get("mean_accepted", {})
val = lambda x: x.get("value") if isinstance(x, dict) else x
print(f"{sys.argv[2]:28s} tokens/s {val(tps)}  mean accepted {val(acc)}")
PY
}
run ar_dense --strategy ar_dense
run sd_chain4 --strategy sd_dense --tree chain:4
run sd_best16 --strategy sd_dense --tree best:16:6
run ssv_chain4 --strategy ssv --tree chain:4 --metadata mean --trace "$OUT/logs/trace_ssv_chain4.jsonl"
run ssv_best16 --strategy ssv --tree best:16:6 --metadata mean
run sd_ngram --strategy sd_dense --tree chain:4 --drafter-kind ngram
run ar_sparse --strategy ar_sparse --metadata mean
# Weights: the target's shards as files of their own, everything else in one tarball.
for f in "$ck"/tiny-target/model-*.safetensors; do mv "$f" "$OUT/"; done
[ -f "$ck/tiny-target/model.safetensors" ] && mv "$ck/tiny-target/model.safetensors" "$OUT/"
tar czf "$OUT/checkpoint_rest.tgz" -C "$ck" .
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$ck" "$OUT/logs"
ls -la "$OUT"

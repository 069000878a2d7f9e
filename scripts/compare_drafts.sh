#!/usr/bin/env bash
# Plain vs speculative decoding of SmolLM2 at temperature 0, for each draft, on one chat and one
# grounded prompt of data/dev_prompts.jsonl (evaluation only); one line per (prompt, draft). Usage:
#   scripts/compare_drafts.sh [MAX_NEW_TOKENS]
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,/^set /{/^set /d;s/^# \{0,1\}//;p}' "$0"; exit 0;; esac
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
MAX_NEW=${1:-128}
CHAT="Explain in three sentences why leaves change color in autumn."
GROUNDED=$($PY -c 'import json; print([json.loads(l)["prompt"] for l in open("data/dev_prompts.jsonl") if "Rewrite the following" in l][0])')
printf '%-9s %-22s %3s %8s %8s %7s %7s %6s %9s\n' prompt draft K plain spec speedup accept tok/pass identical
for kind in chat grounded; do
  if [ $kind = chat ]; then prompt=$CHAT; else prompt=$GROUNDED; fi
  for pair in "ngram 4" "early-exit:24 2" "drafts/smollm2_exit 1"; do
    set -- $pair
    $PY scripts/decode.py --prompt "$prompt" --draft "$1" --num-draft-tokens "$2" --temperature 0 \
        --max-new-tokens "$MAX_NEW" --compare --json |
      $PY -c 'import json, sys; r = json.load(sys.stdin); print("%-9s %-22s %3d %8.1f %8.1f %6.2fx %7.3f %6.2f %9s" % (sys.argv[1], r["draft"], r["num_draft_tokens"], r["baseline_tokens_per_second"], r["tokens_per_second"], r["speedup"], r["acceptance_rate"], r["mean_accepted_length"], r["identical_to_baseline"]))' "$kind"
  done
done

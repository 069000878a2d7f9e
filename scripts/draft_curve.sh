#!/usr/bin/env bash
# Held-out acceptance against data size (issue 11), one slice of the corpus's answer shards a
# session (docs/draft_curve.md: the teacher pass and training of the whole corpus do not fit one
# session on a 2-core CPU, and the teacher pass's features cannot be kept in the repository).
#
# 1. the teacher pass of shards SLICE (A:B), two processes side by side (resumable by shard);
# 2. EAGLE trained on each FRACTIONS share of the slice's training rows (`train_draft.py --shards
#    --train-fraction`, STEPS x fraction steps, at least MIN_STEPS; `--unroll UNROLL`), continuing
#    INIT_FROM when given (`--init-from`: the draft of the slices before);
# 3. scripts/eval_draft.py over every point made so far (CURVE_DIR/eagle_*, and the committed
#    drafts/curve/eagle_* of earlier sessions), on the dev chat and
#    grounded prompts (never trained on) and on 16 of each draft's own training prompts (the
#    gap), K=1 and K=3, T=0 -> OUT/{acceptance.md,acceptance.json,curve.png}.
# Defaults: CORPUS data/draft_corpus, CURVE_DIR runs/curve, OUT docs/draft_curve, UNROLL 3,
# MIN_STEPS 200, NUM_PROMPTS (eval_draft.py's default: all).
# A finished point is skipped (its draft.json exists); training resumes from its checkpoint.
# Usage (environment):
#   SLICE=0:22 FRACTIONS="0.25 1" STEPS=1400 scripts/draft_curve.sh                # from scratch
#   SLICE=22:43 INIT_FROM=drafts/curve/eagle_0-22_1 FRACTIONS=1 STEPS=1400 scripts/draft_curve.sh
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,/^set /{/^set /d;s/^# \{0,1\}//;p}' "$0"; exit 0;; esac
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
SLICE=${SLICE:-0:22}
FRACTIONS=${FRACTIONS:-0.25 1}
STEPS=${STEPS:-1400}
UNROLL=${UNROLL:-3}
CORPUS=${CORPUS:-data/draft_corpus}
CURVE_DIR=${CURVE_DIR:-runs/curve}
OUT=${OUT:-docs/draft_curve}
MIN_STEPS=${MIN_STEPS:-200}
NUM_PROMPTS=${NUM_PROMPTS:-}
INIT_FROM=${INIT_FROM:-}
tag=${SLICE/:/-}

$PY scripts/make_draft_corpus.py --stage teacher --out "$CORPUS" --shards "$SLICE" --part 0/2 &
teacher=$!
$PY scripts/make_draft_corpus.py --stage teacher --out "$CORPUS" --shards "$SLICE" --part 1/2
wait "$teacher"

for f in $FRACTIONS; do
  out=$CURVE_DIR/eagle_${tag}_$f
  if [ ! -f "$out/draft.json" ]; then
    steps=$($PY -c "print(max($MIN_STEPS, round($STEPS * $f)))")
    $PY scripts/train_draft.py --kind eagle --corpus "$CORPUS" --shards "$SLICE" \
        --train-fraction "$f" --steps "$steps" --batch-size 8 --unroll "$UNROLL" \
        --feature-noise 0.1 ${INIT_FROM:+--init-from "$INIT_FROM"} \
        --out "$out" --ckpt-dir "$CURVE_DIR/ckpt_${tag}_$f"
  fi
done

# the points made here, and the committed ones (drafts/curve) not remade here
drafts=$({ ls -d "$CURVE_DIR"/eagle_*/; ls -d drafts/curve/eagle_*/ 2>/dev/null || true; } \
         | sed 's:/$::' | awk -F/ '!seen[$NF]++' | paste -sd, -)
$PY scripts/eval_draft.py --drafts "$drafts" --num-draft-tokens 1,3 --temperatures 0 \
    ${NUM_PROMPTS:+--num-prompts "$NUM_PROMPTS"} --out "$OUT"

#!/usr/bin/env bash
# The README demo: train a Spanish->English Transformer on the bundled Bible corpus
# (data/bible-es-en) for 4 minutes on the CPU, translate the test set with beam search, print
# BLEU and chrF, and show three test sentences beside their references.
#
#   bash scripts/demo.sh                     # writes runs/demo
#   SAVE=runs/demo2 THREADS=4 bash scripts/demo.sh
#
# The recipe was chosen by measurement (bench/demo.py; the sweep is in bench/results.md): in a
# 4-minute budget the number of updates decides, so the tiny preset with small batches, a high
# learning rate, pre-norm (stable at that rate) and no dropout (the run sees the data about twice),
# decaying linearly to zero at the time limit (--lr-schedule auto). --precision auto trains in
# bf16 on CPUs with AVX512-BF16 or AMX, in fp32 elsewhere.
#
# Nothing is deleted. When SAVE already holds a run, `seqtool train` resumes it if the settings
# match (the --max-time budget counts the time already trained, so a finished demo goes straight
# to translating) or stops with the differences; set SAVE to another folder for a fresh run.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

SAVE=${SAVE:-runs/demo}
THREADS=${THREADS:-2}
DATA=data/bible-es-en

if ! command -v seqtool >/dev/null 2>&1; then
    echo "demo: no seqtool command; activate the virtual environment that has 'pip install -e .'" >&2
    exit 1
fi
if [ -e "$SAVE/last.pt" ]; then
    echo "demo: $SAVE already holds a run; resuming it (SAVE=runs/other bash scripts/demo.sh for a fresh one)" >&2
fi

echo "demo: training (4 minutes, then a final validation) into $SAVE" >&2
seqtool train --src es --tgt en --train "$DATA/train" --valid "$DATA/valid" --vocab-size 8000 \
    --arch tiny --pre-norm --dropout 0 --max-tokens 2048 --lr 3e-3 --max-time 4m \
    --save-dir "$SAVE" --threads "$THREADS"

echo "demo: translating $DATA/test.es.gz (2251 lines, beam 5) into $SAVE/test.hyp" >&2
# a model trained for minutes can ramble: cap outputs at 1.5 x source length + 10 tokens
seqtool translate -c "$SAVE/best.pt" -i "$DATA/test.es.gz" -o "$SAVE/test.hyp" --beam 5 \
    --max-len-a 1.5 --max-len-b 10 --threads "$THREADS"

echo "demo: scoring against $DATA/test.en.gz" >&2
seqtool score --ref "$DATA/test.en.gz" --hyp "$SAVE/test.hyp"

echo
for n in 3 1000 2000; do
    echo "source:    $(gzip -dc "$DATA/test.es.gz" | sed -n "${n}p")"
    echo "seqtool:   $(sed -n "${n}p" "$SAVE/test.hyp")"
    echo "reference: $(gzip -dc "$DATA/test.en.gz" | sed -n "${n}p")"
    echo
done

echo "demo: done. Model: $SAVE/best.pt, translations: $SAVE/test.hyp. Try:" >&2
echo "  echo 'Oye, hijo mío, la doctrina de tu padre.' | seqtool translate -c $SAVE/best.pt" >&2

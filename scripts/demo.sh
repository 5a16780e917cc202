#!/usr/bin/env bash
# The README demo: train a small Spanish->English Transformer on the bundled Bible corpus
# (data/bible-es-en) for 4 minutes on the CPU (a short warmup, as the run is short), translate the test set with beam search,
# and print BLEU and chrF.
#
#   bash scripts/demo.sh                     # writes runs/demo
#   SAVE=runs/demo2 THREADS=4 bash scripts/demo.sh
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
    --arch small --max-time 4m --warmup 300 --save-dir "$SAVE" --threads "$THREADS"

echo "demo: translating $DATA/test.es.gz (2251 lines, beam 5) into $SAVE/test.hyp" >&2
# a model trained for minutes can ramble: cap outputs at 1.5 x source length + 10 tokens
seqtool translate -c "$SAVE/best.pt" -i "$DATA/test.es.gz" -o "$SAVE/test.hyp" --beam 5 \
    --max-len-a 1.5 --max-len-b 10 --threads "$THREADS"

echo "demo: scoring against $DATA/test.en.gz" >&2
seqtool score --ref "$DATA/test.en.gz" --hyp "$SAVE/test.hyp"

echo "demo: done. Model: $SAVE/best.pt, translations: $SAVE/test.hyp. Try:" >&2
echo "  echo 'Oye, hijo mío, la doctrina de tu padre.' | seqtool translate -c $SAVE/best.pt" >&2

#!/usr/bin/env python
"""Imported models (issue 31): decoding speed on a model of OPUS-MT en-de's shape, seqtool against
transformers and CTranslate2 on the very same model, in one run on an idle machine.

    pip install 'seqtool[hf]' ctranslate2
    python bench/imported.py                 # 500 sentences, beam 4, 30 output tokens each, 2 threads

- the model: transformers' MarianMTModel with opus-mt-en-de's shape (6 + 6 layers, d_model 512,
  8 heads, feed-forward 2048, swish, scaled embeddings, 58,101 ids, tied embeddings), random
  weights, saved with save_pretrained; its source.spm and target.spm are trained on the loc en-de
  corpus (8,000 pieces each) and vocab.json fills the rest of the 58,101 ids with pieces no text
  encodes to, as a larger joint vocabulary would (every id is a possible output);
- the input: the first 500 lines of loc-en-de's English test set;
- every system on the same weights and sentences, each in a process of its own, the decode timed
  alone (loading excluded), each output exactly --tokens tokens and EOS (seqtool: min_len =
  max_len; transformers: min_new_tokens / max_new_tokens; CTranslate2: min/max_decoding_length),
  so that the work is the same whatever the random weights prefer;
  - seqtool fp32, int8 and bf16 (`seqtool import` of the directory, then Translator);
  - transformers' `generate` (fp32, batches of --batch sentences);
  - CTranslate2 int8 and float32, through its own Marian converter (TransformersConverter);
- reported: target tokens/s (EOS included; where CTranslate2 ends by length rather than EOS, its
  last token counts as the EOS step it takes the place of) and x transformers; the goal:
  seqtool's best mode >= CTranslate2's best mode, and >= 4x transformers. The published anchor
  (CTranslate2's README, OPUS-MT en-de, 4 threads, Xeon 8275CL): CT2 int8 696 target tokens/s,
  fp32 525, Marian 345, transformers 147.

Prints the CPU capability and a markdown table, appended to bench/results.md unless --no-results.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOC = REPO.parent / "shared" / "data" / "loc-en-de"
V = 58101  # opus-mt-en-de's ids: 58,100 pieces and <pad>
SHAPE = dict(d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8, decoder_attention_heads=8,
             encoder_ffn_dim=2048, decoder_ffn_dim=2048, activation_function="swish", scale_embedding=True,
             max_position_embeddings=512, vocab_size=V, pad_token_id=V - 1, eos_token_id=0, decoder_start_token_id=V - 1,
             forced_eos_token_id=0, share_encoder_decoder_embeddings=True)
SYSTEMS = ("transformers", "seqtool fp32", "seqtool int8", "seqtool bf16", "ct2 float32", "ct2 int8")


def log(msg: str) -> None:
    print(f"[{datetime.datetime.now():%H:%M:%S}] {msg}", file=sys.stderr, flush=True)


def read_lines(path: Path, n: int) -> list[str]:
    with open(path, encoding="utf-8") as fh:
        return [line.rstrip("\n") for _, line in zip(range(n), fh)]


def build(W: Path) -> Path:
    """The Marian directory (made once per work dir)."""
    d = W / "opus-mt-shape"
    if (d / "done").exists():
        return d
    import sentencepiece as spm
    import torch
    from transformers import MarianConfig, MarianMTModel

    d.mkdir(parents=True, exist_ok=True)
    for side, lang in (("source", "en"), ("target", "de")):
        spm.SentencePieceTrainer.train(input=str(LOC / f"train.{lang}"), model_prefix=str(d / side), vocab_size=8000,
                                       model_type="unigram", input_sentence_size=200000, shuffle_input_sentence=True, minloglevel=2)
        (d / f"{side}.model").rename(d / f"{side}.spm")
    pieces = ["</s>", "<unk>"]
    seen = set(pieces)
    for side in ("source", "target"):
        sp = spm.SentencePieceProcessor(model_file=str(d / f"{side}.spm"))
        for p in (sp.id_to_piece(i) for i in range(sp.get_piece_size())):
            if p not in seen and p != "<s>":
                pieces.append(p)
                seen.add(p)
    pieces += [f"▁filler{i}" for i in range(V - 1 - len(pieces))] + ["<pad>"]
    (d / "vocab.json").write_text(json.dumps({p: i for i, p in enumerate(pieces)}, ensure_ascii=False))
    (d / "tokenizer_config.json").write_text(json.dumps({"source_lang": "en", "target_lang": "de", "tokenizer_class": "MarianTokenizer"}))
    torch.manual_seed(0)
    MarianMTModel(MarianConfig(**SHAPE)).save_pretrained(d)
    (d / "done").touch()
    return d


def worker(system: str, W: Path, lines_path: Path, beam: int, tokens: int, batch: int, threads: int, out: Path) -> None:
    """One system's decode, timed alone, in this process."""
    import torch

    torch.set_num_threads(threads)
    lines = read_lines(lines_path, 10 ** 9)
    d = W / "opus-mt-shape"
    if system == "transformers":
        from transformers import MarianMTModel, MarianTokenizer

        model, tok = MarianMTModel.from_pretrained(d).eval(), MarianTokenizer.from_pretrained(d)
        order = sorted(range(len(lines)), key=lambda k: len(lines[k]))  # batches of similar lengths, as the others make
        t0 = time.perf_counter()
        produced = 0
        with torch.inference_mode():
            for k in range(0, len(order), batch):
                chunk = [lines[i] for i in order[k: k + batch]]
                ids = model.generate(**tok(chunk, return_tensors="pt", padding=True), num_beams=beam, early_stopping=True,
                                     min_new_tokens=tokens, max_new_tokens=tokens + 1, do_sample=False)
                produced += int(ids[:, 1:].ne(tok.pad_token_id).sum())
        seconds = time.perf_counter() - t0
    elif system.startswith("seqtool"):
        from seqtool.translate import Translator

        precision = "bf16" if system.endswith("bf16") else "fp32"
        quantize = "int8" if system.endswith("int8") else "none"
        with Translator.load(W / "imported.pt", beam=beam, min_len=tokens, max_len_a=0, max_len_b=tokens, loop_guard=0, device="cpu",
                             precision=precision, quantize=quantize, threads=threads, chunk_lines=len(lines)) as t:
            t0 = time.perf_counter()
            done = t.translate_chunk(0, lines)
            seconds = time.perf_counter() - t0
        produced = sum(len(x.hypotheses[0].tokens) + 1 for x in done)
    else:
        import ctranslate2
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_file=str(d / "source.spm"))
        pieces = [sp.encode(x, out_type=str) + ["</s>"] for x in lines]
        tr = ctranslate2.Translator(str(W / "ct2"), device="cpu", compute_type=system.split()[1], intra_threads=threads, inter_threads=1)
        t0 = time.perf_counter()
        res = tr.translate_batch(pieces, beam_size=beam, max_batch_size=batch, min_decoding_length=tokens,
                                 max_decoding_length=tokens + 1, length_penalty=1.0)
        seconds = time.perf_counter() - t0
        # decoder steps, as the others count them: a hypothesis that max_decoding_length stopped
        # took no EOS step (CTranslate2 fills all tokens + 1 steps with tokens there)
        produced = sum(min(len(r.hypotheses[0]) + 1, tokens + 1) for r in res)
    out.write_text(json.dumps({"system": system, "seconds": round(seconds, 3), "target_tokens_incl_eos": produced,
                               "sentences": len(lines)}))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lines", type=int, default=500)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--tokens", type=int, default=30, help="output tokens per sentence (then EOS)")
    p.add_argument("--batch", type=int, default=32, help="sentences per batch for transformers and CTranslate2")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    p.add_argument("--work", type=Path, default=REPO / "bench" / "out" / "imported")
    p.add_argument("--no-results", action="store_true")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args()
    W = a.work.resolve()
    sys.path.insert(0, str(REPO))
    if a.worker:
        worker(a.worker, W, W / "input.en", a.beam, a.tokens, a.batch, a.threads, a.out)
        return 0
    from seqtool.device import cpu_bf16_instructions, cpu_capability

    capability = f"{cpu_capability()}{', bf16 instructions' if cpu_bf16_instructions() else ''}"
    log(f"torch dispatches {capability}; {a.threads} threads; work dir {W}")
    W.mkdir(parents=True, exist_ok=True)
    (W / "input.en").write_text("\n".join(read_lines(LOC / "test.en", a.lines)) + "\n", encoding="utf-8")
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads), PYTHONPATH=str(REPO))
    d = build(W)
    if not (W / "imported.pt").exists():
        log("seqtool import")
        subprocess.run([sys.executable, "-m", "seqtool", "import", str(d), "--output", str(W / "imported.pt")], check=True, env=env)
    if not (W / "ct2" / "model.bin").exists() and any(s.startswith("ct2") for s in a.systems):
        log("CTranslate2's TransformersConverter")
        from ctranslate2.converters import TransformersConverter

        TransformersConverter(str(d)).convert(str(W / "ct2"), force=True)
    rows = {}
    for system in a.systems:
        out = W / f"{system.replace(' ', '-')}.json"
        log(f"{system}: {a.lines} sentences, beam {a.beam}, {a.tokens} tokens + EOS each")
        r = subprocess.run([sys.executable, __file__, "--worker", system, "--out", str(out), "--work", str(W), "--beam", str(a.beam),
                            "--tokens", str(a.tokens), "--batch", str(a.batch), "--threads", str(a.threads)],
                           env=env, capture_output=True, text=True)
        if r.returncode != 0:
            log(f"{system} FAILED: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}")
            continue
        rows[system] = json.loads(out.read_text())
        rows[system]["tok_s"] = rows[system]["target_tokens_incl_eos"] / rows[system]["seconds"]
        log(f"{system}: {rows[system]['seconds']} s, {rows[system]['tok_s']:.1f} target tokens/s")
    base = rows.get("transformers", {}).get("tok_s")
    lines = [f"| {s} | {r['target_tokens_incl_eos']:,} | {r['seconds']:.1f} | {r['tok_s']:,.1f} | "
             f"{(r['tok_s'] / base) if base else float('nan'):.2f}x |" for s, r in rows.items()]
    best = {k: max((r["tok_s"], s) for s, r in rows.items() if s.startswith(k)) for k in ("seqtool", "ct2") if any(s.startswith(k) for s in rows)}
    table = (f"## imported, {datetime.datetime.now():%Y-%m-%d %H:%M}, CPU {capability}, {a.threads} threads, a random model of "
             f"opus-mt-en-de's shape (6+6, d 512, 58,101 ids), {a.lines} loc-en-de test lines, beam {a.beam}, "
             f"{a.tokens} tokens + EOS each\n\n"
             "| system | target tokens | seconds | target tokens/s | x transformers |\n|---|---|---|---|---|\n" + "\n".join(lines) + "\n")
    if "seqtool" in best and "ct2" in best and base:
        s, c = best["seqtool"], best["ct2"]
        table += (f"\nGoals: seqtool's best ({s[1]}, {s[0]:,.1f}) against CTranslate2's best ({c[1]}, {c[0]:,.1f}): {s[0] / c[0]:.2f}x "
                  f"(goal >= 1); against transformers: {s[0] / base:.2f}x (goal >= 4). Anchor (CTranslate2's README, 4 threads, "
                  "Xeon 8275CL): CT2 int8 696, fp32 525, Marian 345, transformers 147 target tokens/s.\n")
    print(table)
    if not a.no_results:
        with open(REPO / "bench" / "results.md", "a", encoding="utf-8") as fh:
            fh.write("\n" + table)
    return 0 if len(rows) == len(a.systems) else 1


if __name__ == "__main__":
    sys.exit(main())

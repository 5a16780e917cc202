#!/usr/bin/env python
"""Why half-precision decoding is slow on CUDA: time fp32/bf16/fp16 beam search on one GPU and
profile the bf16 run (torch.profiler, top ops by self CUDA and self CPU time).

bench/gpu.py measured bf16 and fp16 decoding of the test set 12x slower than fp32 on an H200
(49.8 / 54.4 s against 4.0 s). This script needs no trained model: the small preset with random
weights and a tokenizer trained on 20,000 lines of the bundled corpus, decoding 256 test lines
with beam 5 to a fixed 40 tokens (random weights rarely stop), so every precision does the same
steps. About a minute on an H200:

    python bench/gpu_decode_profile.py          # on the GPU machine
    python bench/gpu_decode_profile.py --cpu    # here: checks the script (figures mean nothing)
"""

from __future__ import annotations

import argparse
import gzip
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--lines", type=int, default=256)
    a = parser.parse_args()

    import torch

    from seqtool import checkpoint
    from seqtool.config import DecodeConfig, OptimConfig, TokenizerConfig, TrainConfig, model_config_for
    from seqtool.model import Transformer
    from seqtool.tokenizer import train_tokenizer
    from seqtool.translate import Translator

    data = REPO / "data" / "bible-es-en"
    work = Path(tempfile.mkdtemp(prefix="decode-profile-"))
    for lang in ("es", "en"):
        lines = gzip.open(data / f"train.{lang}.gz", "rt", encoding="utf-8").read().splitlines()[:20000]
        (work / f"train.{lang}").write_text("\n".join(lines) + "\n")
    spm = train_tokenizer([work / "train.es", work / "train.en"], str(work / "spm"), TokenizerConfig(vocab_size=4000))
    torch.manual_seed(0)
    config = model_config_for("small", vocab_size=4000, dropout=0.0)
    configs = {"model": config.to_dict(), "optim": OptimConfig().to_dict(), "train": TrainConfig().to_dict()}
    path = work / "model.pt"
    checkpoint.save(checkpoint.build(configs, Path(spm).read_bytes(), checkpoint.model_state(Transformer(config))), path)
    source = gzip.open(data / "test.es.gz", "rt", encoding="utf-8").read().splitlines()[: a.lines]

    device = "cpu" if a.cpu else "cuda"
    precisions = ("fp32", "bf16") if a.cpu else ("fp32", "bf16", "fp16")
    for precision in precisions:
        t = Translator.load(path, beam=5, max_len_a=0.0, max_len_b=40, device=device, precision=precision,
                                               batch_size=64)
        t.translate_chunk(0, source[:64])  # warm-up
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        t.translate_chunk(0, source)
        if device == "cuda":
            torch.cuda.synchronize()
        print(f"{precision}: {time.perf_counter() - start:.2f} s for {len(source)} lines, beam 5, 40 tokens", flush=True)
        if precision == "bf16":
            activities = [torch.profiler.ProfilerActivity.CPU] + ([] if a.cpu else [torch.profiler.ProfilerActivity.CUDA])
            with torch.profiler.profile(activities=activities) as prof:
                t.translate_chunk(0, source[:64])
            key = "self_cpu_time_total" if a.cpu else "self_cuda_time_total"
            print(prof.key_averages().table(sort_by=key, row_limit=20), flush=True)
            if not a.cpu:
                print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20), flush=True)


if __name__ == "__main__":
    main()

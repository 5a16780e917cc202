#!/usr/bin/env python
"""Why GPU training runs at a few percent MFU: the base preset's training speed with and without
SDPA's cuDNN backend, a torch.profiler table of a short bf16 run, and the fp32/bf16 loss check in
a configuration that leaves the unigram plateau (bench/gpu.py's check at lr 7e-4 with a
20-update warmup stayed at loss 6.59 in every precision, so it compared nothing).

Uses bench/gpu.py's data preparation and run_one (seqtool.training.train.train, what `seqtool train`
runs). About three minutes on an H200; `--dry-run` checks the script on CPU (figures mean nothing).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import gpu  # noqa: E402  bench/gpu.py


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("/tmp/gpu-train-profile"))
    parser.add_argument("--speed-updates", type=int, default=80)
    parser.add_argument("--loss-updates", type=int, default=300)
    parser.add_argument("--dry-run", action="store_true")
    a = parser.parse_args()
    import torch

    arch, limit, vocab = "base", 0, 8000
    ns = argparse.Namespace(lr=7e-4, warmup=100, max_tokens=16384, skip=10, compile=False, threads=0, dry_run=a.dry_run)
    if a.dry_run:
        arch, limit, vocab = "tiny", 2000, 1000
        ns.max_tokens, ns.skip, ns.threads = 1024, 1, 2
        a.speed_updates, a.loss_updates = 6, 8
    a.work.mkdir(parents=True, exist_ok=True)
    bin_dir = gpu.prepare(REPO / "data" / "bible-es-en", a.work, limit, vocab)
    rows = []

    def speed(label: str, precision: str, cudnn: bool, updates: int, **over) -> None:
        enable = getattr(torch.backends.cuda, "enable_cudnn_sdp", None)
        if enable is not None:
            enable(cudnn)
        run = argparse.Namespace(**{**vars(ns), **over})
        try:
            r = gpu.run_one(bin_dir, a.work, arch, precision, updates, run)
            rows.append((label, precision, r["tokens_per_s"], r["loss_last10"], r["wall_s"], r["peak_gib"]))
        except Exception as error:  # keep going: the other variants still say something
            gpu.log(f"{label}: FAILED {type(error).__name__}: {error}")
            rows.append((label, precision, float("nan"), float("nan"), float("nan"), None))

    speed("cudnn sdp on", "bf16", True, a.speed_updates)
    speed("cudnn sdp off", "bf16", False, a.speed_updates)
    speed("cudnn sdp off", "fp32", False, a.speed_updates)

    # profile a short bf16 run (cuDNN SDPA on, as train runs today)
    if hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
        torch.backends.cuda.enable_cudnn_sdp(True)
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([] if a.dry_run else [ProfilerActivity.CUDA])
    with profile(activities=activities) as prof:
        gpu.run_one(bin_dir, a.work, arch, "bf16", 20 if not a.dry_run else 3, ns)
    key = "cpu_time_total" if a.dry_run else "cuda_time_total"
    for sort in (("self_" + key) if not a.dry_run else "self_cpu_time_total", "self_cpu_time_total"):
        print(f"\n## profile: top ops by {sort}\n")
        print(prof.key_averages().table(sort_by=sort, row_limit=25, max_name_column_width=60))

    # the loss check in a configuration that learns: lr 5e-4, warmup over 30% of the horizon
    for precision in ("fp32", "bf16"):
        speed("loss check lr 5e-4 warmup 0.3", precision, False, a.loss_updates, lr=5e-4, warmup=0.3)

    print("\n| variant | precision | target tok/s | loss (last 10) | wall s | peak GiB |\n|---|---|---|---|---|---|")
    for label, precision, tps, loss, wall, peak in rows:
        print(f"| {label} | {precision} | {tps:,.0f} | {loss:.4f} | {wall:.1f} | {peak if peak is None else f'{peak:.1f}'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

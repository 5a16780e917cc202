"""The training loop.

Owns one training run: model and optimizer set-up, autocast (bf16, or fp16 with a gradient
scaler), the inverse-square-root LR schedule, gradient clipping, validation, early stopping
limits (updates, epochs, wall clock), checkpoints (last.pt with training state, best.pt without,
update-numbered copies), and resuming a run from last.pt when the configuration matches. What a
validation measures and when it stops a run is validate.py's; where the numbers go, metrics.py's;
what --finetune takes from its checkpoint, finetune.py's. Training on raw parallel files first
trains a tokenizer (or takes the --finetune checkpoint's) and binarizes into SAVE_DIR/data
through the same code.
"""

from __future__ import annotations

import hashlib
import json
import math
import signal
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from . import checkpoint, finetune, log, validate
from .binarize import SplitSpec, binarize
from .config import ConfigError, ModelConfig, OptimConfig, RunPaths, TokenizerConfig, TrainConfig, config_diff
from .data import ParallelDataset, collate, epoch_batches, min_pair_length, read_meta
from .metrics import MetricsLog
from .model import Transformer, label_smoothed_nll
from .textio import InputError
from .tokenizer import Tokenizer, train_tokenizer

# Settings that may change when a run is resumed: limits and where/how fast it runs.
RESUMABLE_CHANGES = {"max_updates", "max_epochs", "max_time", "log_interval", "device", "threads", "validate_interval_updates",
                     "patience", "save_interval_updates", "keep_last", "tensorboard_dir", "eval_bleu", "eval_bleu_beam",
                     "eval_bleu_lenpen", "eval_bleu_max_len_a", "eval_bleu_max_len_b"}


@dataclass
class RawData:
    """Raw parallel files to tokenize and binarize into SAVE_DIR/data before training."""

    train_prefix: str
    valid_prefix: str
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    workers: int = 1


@dataclass
class TrainJob:
    save_dir: Path
    model: ModelConfig  # vocab_size and special ids are taken from the data
    optim: OptimConfig
    train: TrainConfig
    data_dir: Optional[Path] = None
    raw: Optional[RawData] = None
    force: bool = False  # start afresh in a SAVE_DIR that holds another run (instead of resuming or refusing)
    finetune: Optional[finetune.Finetune] = None  # start from these weights (and tokenizer), with fresh training state


@dataclass
class TrainResult:
    updates: int
    epochs: float
    best_valid_loss: float
    last_valid_loss: float
    train_tokens: int
    train_seconds: float
    skipped_too_long: int
    save_dir: Path
    stopped_by: str
    best_metric: str = "loss"
    best_value: float = float("nan")  # of best_metric

    @property
    def tokens_per_second(self) -> float:
        return self.train_tokens / max(self.train_seconds, 1e-9)


def inverse_sqrt_lr(update: int, lr: float, warmup: int) -> float:
    """Linear warmup from 0 to lr over `warmup` updates, then lr * sqrt(warmup / update)."""
    if warmup and update < warmup:
        return lr * update / warmup
    return lr * math.sqrt(max(warmup, 1) / max(update, 1))


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is available (this torch build or machine has none); use --device cpu")
    return torch.device(name)


def autocast_for(device: torch.device, precision: str):
    if precision == "fp32":
        return nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def prepare_raw(job: TrainJob, source: Optional[finetune.Source] = None) -> Path:
    """Tokenizer + binarized data in SAVE_DIR/data (reused when a previous run made them); with
    --finetune, the checkpoint's tokenizer instead of a new one."""
    assert job.raw is not None
    data_dir = Path(job.save_dir) / "data"
    src, tgt = job.train.src_lang, job.train.tgt_lang
    if not src or not tgt:
        raise ConfigError("training on raw files needs --src and --tgt")
    from .textio import find_split_file

    files = [find_split_file(job.raw.train_prefix, src), find_split_file(job.raw.train_prefix, tgt)]
    find_split_file(job.raw.valid_prefix, src), find_split_file(job.raw.valid_prefix, tgt)  # fail early
    if (data_dir / "meta.json").exists() and not job.force:
        earlier = read_meta(data_dir)["splits"].get("train", {})
        if [earlier.get("src_file"), earlier.get("tgt_file")] != [str(f) for f in files]:
            raise InputError(f"{data_dir}: was prepared from {earlier.get('src_file')} and {earlier.get('tgt_file')}, not "
                             f"{files[0]} and {files[1]}; use another --save-dir or pass --force to start over")
        log.info(f"using the data prepared earlier in {data_dir}")
        return data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    if source is not None:
        log.info(f"using the tokenizer of {source.path}")
        model_path = finetune.write_tokenizer(source, data_dir)
    else:
        log.info(f"training a {job.raw.tokenizer.model_type} tokenizer ({job.raw.tokenizer.vocab_size} pieces) on {', '.join(map(str, files))}")
        model_path = train_tokenizer(files, str(data_dir / "tokenizer"), job.raw.tokenizer)
    log.info(f"binarizing into {data_dir}")
    binarize(src, tgt, [SplitSpec("train", job.raw.train_prefix), SplitSpec("valid", job.raw.valid_prefix)],
             model_path, data_dir, workers=job.raw.workers, force=job.force)
    return data_dir


class Trainer:
    def __init__(self, job: TrainJob):
        self.job = job
        self.paths = RunPaths(job.save_dir)
        cfg = job.train
        self.device = pick_device(cfg.device)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        source = finetune.load_source(job.finetune) if job.finetune is not None else None
        data_dir = prepare_raw(job, source) if job.raw is not None else Path(job.data_dir)
        self.data_dir = data_dir
        self.meta = read_meta(data_dir)
        check_languages(data_dir, self.meta, cfg)
        self.tokenizer = Tokenizer.load(data_dir / "tokenizer.model")
        if self.tokenizer.vocab_size != self.meta["vocab_size"]:
            raise InputError(f"{data_dir}/tokenizer.model has {self.tokenizer.vocab_size} pieces but meta.json says {self.meta['vocab_size']}; binarize again")
        if self.meta.get("tokenizer_sha256") not in (None, hashlib.sha256(self.tokenizer.model_bytes).hexdigest()):
            raise InputError(f"{data_dir}/tokenizer.model is not the tokenizer the data was binarized with (sha256 differs from meta.json); binarize again with it")
        if source is not None:
            finetune.check_data(source, self.tokenizer, data_dir)
        self.train_set = ParallelDataset(data_dir, "train", self.meta)
        self.valid_set = ParallelDataset(data_dir, "valid", self.meta) if "valid" in self.meta["splits"] else None
        if self.valid_set is None and (cfg.eval_bleu or cfg.patience or cfg.best_metric != "loss"):
            raise ConfigError(f"{data_dir}: has no valid split, which --eval-bleu, --patience and --best-metric need; binarize one with --valid")
        sp = self.meta["special_ids"]
        base_model = source.model_config if source is not None else job.model
        self.model_config = base_model.replace(vocab_size=self.meta["vocab_size"], pad_id=sp["pad"], bos_id=sp["bos"], eos_id=sp["eos"])
        self.train_config = cfg.replace(src_lang=self.meta["src_lang"], tgt_lang=self.meta["tgt_lang"])
        self.configs = {"model": self.model_config.to_dict(), "optim": job.optim.to_dict(), "train": self.train_config.to_dict()}
        if source is not None:
            self.configs["finetune"] = source.describe()
        if cfg.precision == "fp16" and self.device.type == "cpu":
            log.warn("fp16 on CPU is slow and only useful for testing; bf16 is the fast CPU format")

        torch.manual_seed(cfg.seed)
        self.model = Transformer(self.model_config)
        if source is not None:
            finetune.load_weights(self.model, source)
            log.info(f"fine-tuning the weights of {source.path}")
        self.model.to(self.device)
        o = job.optim
        kwargs: dict[str, Any] = dict(lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay)
        try:  # one fused kernel for all parameters (CPU and CUDA in torch >= 2.4)
            self.optimizer = torch.optim.Adam(self.model.parameters(), fused=True, **kwargs)
        except (RuntimeError, TypeError):
            self.optimizer = torch.optim.Adam(self.model.parameters(), foreach=True, **kwargs)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=cfg.precision == "fp16")
        self.state = {"updates": 0, "epoch": 1, "batch_in_epoch": 0, "best_valid_loss": float("inf"),
                      "train_seconds": 0.0, "train_tokens": 0, "last_valid_loss": float("nan")}
        self.early_stopping = validate.EarlyStopping(cfg.best_metric, cfg.patience, self.state)  # keeps its state in self.state
        self._resume_or_start()
        self.metrics = MetricsLog(self.paths.metrics, Path(cfg.tensorboard_dir) if cfg.tensorboard_dir else None)

    # ---- set-up ---------------------------------------------------------------------------
    def _resume_or_start(self) -> None:
        save_dir = self.paths.save_dir
        save_dir.mkdir(parents=True, exist_ok=True)
        for stale in checkpoint.remove_stale_temps(save_dir):
            log.info(f"removed {stale.name}, left by a save that was killed")
        if self.job.force and (self.paths.last.exists() or self.paths.best.exists()):
            # start afresh: the old checkpoints are replaced by the first save, the old metrics now
            log.warn(f"--force: starting a new run in {save_dir}; its checkpoints will be replaced")
            for path in (self.paths.last, self.paths.best, self.paths.metrics):
                path.unlink(missing_ok=True)
            checkpoint.prune_numbered(save_dir, 0)
        if not self.paths.last.exists():
            if self.paths.best.exists():
                raise InputError(f"{save_dir}: holds best.pt from another run but no last.pt to resume; pick another --save-dir or pass --force to replace it")
            self.paths.config.write_text(json.dumps(self.configs, indent=2) + "\n")
            return
        ckpt = checkpoint.load(self.paths.last)
        saved = ckpt["configs"]
        diffs = [d for d in config_diff(_without(saved), _without(self.configs))]
        if diffs:
            raise ConfigError(
                f"{self.paths.last}: saved with a different configuration, so it cannot be resumed: "
                + "; ".join(diffs) + ". Use the same settings, another --save-dir, or --force to start over"
            )
        if checkpoint.tokenizer_bytes(ckpt) != self.tokenizer.model_bytes:
            raise InputError(f"{self.paths.last}: was trained with another tokenizer than {self.data_dir}/tokenizer.model")
        self.model.load_state_dict(ckpt["weights"], strict=False)
        ts = ckpt["train_state"]
        self.optimizer.load_state_dict(ts["optimizer"])
        if ts.get("scaler"):
            self.scaler.load_state_dict(ts["scaler"])
        torch.set_rng_state(ts["rng_cpu"])
        if self.device.type == "cuda" and ts.get("rng_cuda") is not None:
            torch.cuda.set_rng_state(ts["rng_cuda"])
        self.state.update(ts["progress"])
        log.info(f"resuming {self.paths.last}: update {self.state['updates']}, epoch {self.state['epoch']}")

    # ---- one update ---------------------------------------------------------------------
    def _step(self, batch) -> tuple[torch.Tensor, torch.Tensor, int]:
        """One update; returns the summed loss and NLL as tensors (no host sync) and the token count."""
        model, cfg = self.model, self.train_config
        src = batch.src.to(self.device, non_blocking=True)
        tgt_in = batch.tgt_in.to(self.device, non_blocking=True)
        tgt_out = batch.tgt_out.to(self.device, non_blocking=True)
        lr = inverse_sqrt_lr(self.state["updates"] + 1, self.job.optim.lr, self.job.optim.warmup)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        with autocast_for(self.device, cfg.precision):
            memory, src_pad = model.encode(src)
            features = model.decode_features(tgt_in, memory, src_pad)
            loss, nll, n = label_smoothed_nll(features, model.output, tgt_out, self.model_config.pad_id, self.job.optim.label_smoothing)
        self.scaler.scale(loss / n).backward()
        if self.job.optim.clip_norm > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), self.job.optim.clip_norm, foreach=True)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach(), nll, n

    def validate(self) -> validate.ValidResult:
        """Loss (and, with --eval-bleu, BLEU/chrF) on the validation split; nan without one."""
        if self.valid_set is None:
            return validate.ValidResult(float("nan"), float("nan"))
        return validate.evaluate(self.model, self.valid_set, self.tokenizer, self.model_config, self.train_config,
                                 self.job.optim.label_smoothing, self.device,
                                 autocast=lambda: autocast_for(self.device, self.train_config.precision))

    def _save(self, result: Optional[validate.ValidResult] = None, improved: bool = False) -> None:
        """last.pt always (and the update-numbered copy at --save-interval-updates points); best.pt
        after a validation that improved --best-metric, after the first validation of a run (so
        there is one to translate with), and after every validation when there is no validation
        split. An unvalidated save (interval, Ctrl-C, SIGTERM) never writes best.pt. best.pt is
        written first: a kill between the two leaves last.pt behind it, never ahead."""
        st, cfg = self.state, self.train_config
        weights = checkpoint.model_state(self.model)
        train_state = {
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler.is_enabled() else {},
            "rng_cpu": torch.get_rng_state(),
            "rng_cuda": torch.cuda.get_rng_state() if self.device.type == "cuda" else None,
            "progress": dict(st),
        }
        valid = None if result is None else {"loss": result.loss, "nll": result.nll, "bleu": result.bleu, "chrf": result.chrf}
        ckpt = checkpoint.build(self.configs, self.tokenizer.model_bytes, weights, train_state=train_state,
                                valid_loss=None if result is None else result.loss, updates=st["updates"],
                                progress=dict(st), valid=valid)
        if result is not None and (improved or self.valid_set is None or not self.paths.best.exists()):
            best = {k: v for k, v in ckpt.items() if k != "train_state"}
            checkpoint.save(best, self.paths.best)
        checkpoint.save(ckpt, self.paths.last)
        if cfg.keep_last and st["updates"] % cfg.save_interval_updates == 0:
            checkpoint.save(ckpt, checkpoint.numbered_path(self.paths.save_dir, st["updates"]))
            checkpoint.prune_numbered(self.paths.save_dir, cfg.keep_last)

    # ---- the loop ----------------------------------------------------------------------
    def run(self) -> TrainResult:
        cfg, st = self.train_config, self.state
        mc = self.model_config
        log.info(f"model: {sum(p.numel() for p in self.model.parameters()):,} parameters, "
                 f"{mc.encoder_layers}+{mc.decoder_layers} layers, d_model {mc.d_model}, {mc.n_heads} heads, "
                 f"device {self.device}, precision {cfg.precision}, threads {torch.get_num_threads()}")
        total, unit = (cfg.max_updates, "update") if cfg.max_updates else ((cfg.max_time, "second") if cfg.max_time else (cfg.max_epochs or None, "epoch"))
        progress = log.Progress(total, unit, cfg.log_interval)
        start = time.monotonic() - st["train_seconds"]
        window_tokens, window_start = 0, time.monotonic()
        window_loss: Any = 0.0
        window_nll: Any = 0.0
        stopped_by, skipped = "", 0
        self.model.train()
        previous_sigterm = None
        if threading.current_thread() is threading.main_thread():  # SIGTERM saves like Ctrl-C
            previous_sigterm = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
        try:
            while not stopped_by:
                batches, skipped = epoch_batches(self.train_set, cfg.max_tokens, mc.max_positions, cfg.seed, st["epoch"])
                if not batches:
                    shortest = int(min_pair_length(self.train_set))
                    raise InputError(f"{self.data_dir}: no training pair fits --max-tokens {cfg.max_tokens} and {mc.max_positions} positions "
                                     f"(the shortest pair needs {shortest}); raise --max-tokens to at least {shortest}")
                if st["updates"] == 0 and st["batch_in_epoch"] == 0 and skipped:
                    log.warn(f"skipping {skipped} training pairs longer than {min(mc.max_positions, cfg.max_tokens)} tokens")
                # whether the state as it is now has been validated (and saved); a run resumed at the
                # end of an epoch was saved by the validation of that epoch's last update
                validated = 0 < st["batch_in_epoch"] == len(batches)
                for k in range(st["batch_in_epoch"], len(batches)):
                    batch = collate(self.train_set, batches[k], mc.pad_id, mc.bos_id, mc.eos_id)
                    loss, nll, n = self._step(batch)
                    st["updates"] += 1
                    st["batch_in_epoch"] = k + 1
                    st["train_tokens"] += n
                    window_tokens += n
                    window_loss, window_nll = window_loss + loss, window_nll + nll
                    now = time.monotonic()
                    st["train_seconds"] = now - start
                    if now - window_start >= cfg.log_interval or st["updates"] == 1:
                        # the only host sync of the loop: once per log interval, not per update
                        loss_avg, nll_avg = float(window_loss) / window_tokens, float(window_nll) / window_tokens
                        rate = window_tokens / max(now - window_start, 1e-9)
                        lr = self.optimizer.param_groups[0]["lr"]
                        ppl = math.exp(min(nll_avg, 50))
                        self.metrics.write({"kind": "train", "update": st["updates"], "epoch": st["epoch"], "loss": loss_avg,
                                           "ppl": ppl, "lr": lr, "tokens_per_s": rate, "seconds": st["train_seconds"]})
                        window_tokens, window_start, window_loss, window_nll = 0, now, 0.0, 0.0
                        stats = f"epoch {st['epoch']} | update {st['updates']} | loss {loss_avg:.3f} | ppl {ppl:.1f} | lr {lr:.2e} | {rate:,.0f} tok/s"
                        done = {"update": st["updates"], "second": st["train_seconds"], "epoch": st["epoch"] - 1 + (k + 1) / len(batches)}[unit]
                        progress.update(done, stats)
                    stopped_by = self._limit_reached(epoch_done=False)
                    validated = False
                    if cfg.validate_interval_updates and st["updates"] % cfg.validate_interval_updates == 0 and not stopped_by:
                        stopped_by, validated = self._validate_and_save(), True
                    elif (cfg.save_interval_updates and st["updates"] % cfg.save_interval_updates == 0
                          and not stopped_by and k + 1 < len(batches)):  # else the validation just below saves
                        self._save()
                    if stopped_by:
                        break
                else:
                    st["epoch"] += 1
                    st["batch_in_epoch"] = 0
                    stopped_by = self._limit_reached(epoch_done=True)
                if not validated:  # (an interval validation of the epoch's last update counts)
                    stopped_by = self._validate_and_save() or stopped_by
        except KeyboardInterrupt:
            progress.close()
            self._save()  # not validated: last.pt only, never best.pt
            log.warn(f"interrupted at update {st['updates']}: saved {self.paths.last}; run the same command again to resume")
            raise
        finally:
            progress.close()
            self.metrics.close()
            if previous_sigterm is not None:
                signal.signal(signal.SIGTERM, previous_sigterm)
        st["train_seconds"] = time.monotonic() - start
        return TrainResult(
            updates=st["updates"], epochs=st["epoch"] - 1 + st["batch_in_epoch"] / max(len(batches), 1),
            best_valid_loss=st["best_valid_loss"], last_valid_loss=st["last_valid_loss"],
            train_tokens=st["train_tokens"], train_seconds=st["train_seconds"], skipped_too_long=skipped,
            save_dir=self.paths.save_dir, stopped_by=stopped_by,
            best_metric=cfg.best_metric, best_value=st["best_metric_value"],
        )

    def _limit_reached(self, epoch_done: bool) -> str:
        cfg, st = self.train_config, self.state
        if cfg.max_updates and st["updates"] >= cfg.max_updates:
            return "max-updates"
        if cfg.max_time and st["train_seconds"] >= cfg.max_time:
            return "max-time"
        if epoch_done and cfg.max_epochs and st["epoch"] > cfg.max_epochs:
            return "max-epochs"
        return ""

    def _validate_and_save(self) -> str:
        """Validate, update early stopping, save, log; returns "patience" when it says stop."""
        st, cfg = self.state, self.train_config
        result = self.validate()
        st["last_valid_loss"] = result.loss
        improved = self.early_stopping.update(result)
        self._save(result, improved)
        self.metrics.write({"kind": "valid", "update": st["updates"], "epoch": st["epoch"], "loss": result.loss,
                            "nll": result.nll, "ppl": result.ppl, "bleu": result.bleu, "chrf": result.chrf,
                            "best_loss": st["best_valid_loss"], "best_metric": cfg.best_metric, "best": self.early_stopping.best,
                            "bad_validations": st["bad_validations"], "seconds": st["train_seconds"],
                            "valid_seconds": result.seconds})
        log.info(validate.summary_line(result, st["updates"], self.early_stopping))
        if self.early_stopping.should_stop:
            log.info(f"stopping: {cfg.best_metric} has not improved for {cfg.patience} validations (--patience)")
            return "patience"
        return ""


def check_languages(data_dir: Path, meta: dict, cfg: TrainConfig) -> None:
    """--src/--tgt, when given, must be the languages DATA_DIR holds (never trained the wrong way silently)."""
    for option, asked, held in (("--src", cfg.src_lang, meta["src_lang"]), ("--tgt", cfg.tgt_lang, meta["tgt_lang"])):
        if asked and asked != held:
            raise ConfigError(f"{option} {asked}, but {data_dir} holds {meta['src_lang']} -> {meta['tgt_lang']} data; "
                              f"drop {option} or binarize {asked} data")


def _raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt


def _without(configs: dict) -> dict:
    out = json.loads(json.dumps(configs))
    # settings added since a run was saved count as their defaults (it ran with that behaviour)
    out["train"] = {**json.loads(json.dumps(TrainConfig().to_dict())), **out.get("train", {})}
    for key in RESUMABLE_CHANGES:
        out.get("train", {}).pop(key, None)
    return out


def train(job: TrainJob) -> TrainResult:
    return Trainer(job).run()


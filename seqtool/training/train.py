"""The training loop.

Owns one training run: model and optimizer set-up, validation, early stopping limits (updates,
epochs, wall clock), checkpoints (last.pt with training state, best.pt without, update-numbered
copies), and resuming a run from last.pt when the configuration matches. One update (precision,
loss scaling, accumulation, clipping, --compile) is update.py's; several processes (torchrun,
DDP, which rank gets which batch) distributed.py's; what a validation measures and when it stops
a run, validate.py's; where the numbers go, metrics.py's; the learning rate of each update,
schedule.py's; the weights' moving average, ema.py's; what --finetune takes from its checkpoint,
finetune.py's. Training on raw parallel files first trains a tokenizer (or takes the --finetune
checkpoint's) and binarizes into SAVE_DIR/data through the same code.
"""

from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path
from typing import Iterator, Optional

import torch

from .. import allocator, checkpoint, kernels, log
from . import distill, distributed, finetune, multilingual, schedule, update, validate
from ..config import RunPaths
from ..data import ParallelDataset, collate, length_profile
from ..device import pick_device, resolve_precision, sdpa_without_cudnn
from .ema import EMA
from ..interrupts import Interrupts
from ..errors import ConfigError
from .metrics import MetricsLog, ThroughputWindow
from ..model import Transformer
from ..runlock import RunLock
from .job import RawData, TrainJob, TrainResult, check_teachers, open_data, plan_epoch, prepare_raw
from .savedir import RunFiles

__all__ = ["RawData", "TrainJob", "TrainResult", "Trainer", "train"]  # the job's types, for callers of train()
from .update import autocast as autocast_for

HEAP_TRIM_SECONDS = 60.0  # CPU training: at most one heap trim a minute (allocator.HeapTrimmer; each costs re-faulted pages)


class Trainer:
    def __init__(self, job: TrainJob):
        self.job = job
        env = distributed.environment()
        self.lock = RunLock(job.save_dir)  # one run per SAVE_DIR (runlock.py); held by rank 0 until run() ends
        save_dir = Path(job.save_dir)
        created = not save_dir.exists()
        if env.rank == 0:
            save_dir.mkdir(parents=True, exist_ok=True)
            self.lock.acquire()
        try:
            self._set_up(job, env)
        except BaseException:
            self.lock.release()
            if created and save_dir.is_dir() and not any(save_dir.iterdir()):
                save_dir.rmdir()  # a run that never started leaves no empty directory behind
            raise

    def _set_up(self, job: TrainJob, env: distributed.Env) -> None:
        self.paths = RunPaths(job.save_dir)
        cfg = job.train
        self.device = distributed.device_for(env, pick_device(cfg.device))
        # CPU training returns the heap's free pages between updates (allocator.HeapTrimmer)
        self.trim_heap = allocator.HeapTrimmer(HEAP_TRIM_SECONDS if self.device.type == "cpu" else 0.0)
        if self.device.type == "cuda":
            sdpa_without_cudnn()  # no cuDNN plan built per batch shape (device.py)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        source = finetune.load_source(job.finetune) if job.finetune is not None else None
        teachers = distill.Teachers(job.distill) if job.distill is not None else None
        if teachers is not None:
            check_teachers(job, teachers, source)  # before any work (data prepared or opened), on every rank
        self.dist = distributed.start(env, self.device, cfg.dist_timeout)
        if job.raw is not None:  # rank 0 prepares SAVE_DIR/data, the others wait for it
            if self.dist.is_main:
                distributed.slow_preparation_point(self.dist)
                prepare_raw(job, source or teachers)  # (a teacher's tokenizer: the student learns its token ids)
            self.dist.barrier(f"waiting for rank 0 to prepare {job.save_dir}/data", patient=True)  # not bounded by --dist-timeout
        data = open_data(job, source)
        self.data_dir, self.meta, self.tokenizer = data.data_dir, data.meta, data.tokenizer
        self.train_set, self.valid_set = data.train_set, data.valid_set
        self.pairs = data.pairs  # several pairs (multilingual.py): a new mixture every epoch, a validation per pair
        if teachers is not None:
            if self.pairs is not None:
                multilingual.refuse("--teacher")
            teachers.check(self.meta, self.tokenizer.model_bytes, self.data_dir)
        sp = self.meta["special_ids"]
        base_model = source.model_config if source is not None else job.model
        self.model_config = base_model.replace(vocab_size=self.meta["vocab_size"], pad_id=sp["pad"], bos_id=sp["bos"], eos_id=sp["eos"],
                                               language_tags=self.pairs.languages.tags if self.pairs else 0)
        precision = resolve_precision(cfg.precision, self.device, "train")  # "auto" -> what this device runs
        self.train_config = cfg.replace(src_lang=self.meta["src_lang"], tgt_lang=self.meta["tgt_lang"], precision=precision)
        self.schedule = schedule.resolve(job.optim, self.train_config)
        # the resolved schedule is written down too (derived from the settings compared on resume)
        self.configs = {"model": self.model_config.to_dict(), "optim": job.optim.to_dict(), "train": self.train_config.to_dict(),
                        "schedule": self.schedule.describe()}
        if source is not None:
            self.configs["finetune"] = source.describe()
        if self.pairs is not None:
            self.configs["languages"] = self.pairs.languages.to_dict()  # translate's --tgt-lang tags; info's shares
        if teachers is not None:
            self.configs["distill"] = teachers.describe()
            self.configs["decoding"] = dict(distill.DECODING)  # translate's and serve's defaults for this model
        self.source_lengths = length_profile(self.train_set.src.lengths)  # kept in every checkpoint (translate's --split-sentences auto)
        if precision == "fp16" and self.device.type == "cpu":
            log.warn("fp16 on CPU is slow and only useful for testing; bf16 is the fast CPU format")

        torch.manual_seed(cfg.seed)  # the same initial weights on every rank
        self.model = Transformer(self.model_config)
        if source is not None:
            finetune.load_weights(self.model, source)
            log.info(f"fine-tuning the weights of {source.path}")
        self.model.to(self.device)
        self.model.activation_dtype = update.activation_dtype(self.device, precision)
        if self.dist.rank:  # dropout differs between ranks; data order is shared (seeded by cfg.seed)
            torch.manual_seed(distributed.rank_seed(cfg.seed, self.dist.rank))
        self.optimizer = update.build_optimizer(self.model.parameters(), job.optim)
        loss_fn = update.TrainingLoss(self.model, job.optim.label_smoothing)
        self.updater = update.Updater(loss_fn, self.optimizer, self.device, precision, job.optim.clip_norm,
                                      ddp=self.dist.wrap(loss_fn), compile=cfg.compile)
        self.scaler = self.updater.scaler
        self.ema = EMA(self.model.parameters(), cfg.ema_decay) if cfg.ema_decay else None
        self.state = checkpoint.TrainingState()
        self.early_stopping = validate.EarlyStopping(cfg.best_metric, cfg.patience, self.state)  # keeps its state in self.state
        self.files = RunFiles(job.save_dir, self.configs, self.dist.is_main)
        self._resume_or_start()
        self.distill_seconds = 0.0
        if teachers is not None:  # after the resume check: a run that cannot go on does not translate first
            self._distill(teachers, cfg)
        self.interrupts = Interrupts()
        self.saved_progress: Optional[dict] = None  # the TrainingState last.pt holds (state_dict)
        self.metrics = MetricsLog(self.files.metrics_path, Path(cfg.tensorboard_dir) if cfg.tensorboard_dir else None,
                                  enabled=self.dist.is_main)
        self.updater.skipped = self.state.skipped_updates

    # ---- set-up ---------------------------------------------------------------------------
    def _distill(self, teachers: distill.Teachers, cfg) -> None:
        """The training set becomes the teachers' translations of its source (with
        --distill-original, those and the original pairs)."""
        out, self.distill_seconds = distill.prepare(teachers, self.train_set, self.meta, self.data_dir, self.job.save_dir,
                                                    self.dist, str(self.device), cfg.threads)
        taught = ParallelDataset(out, "train")
        self.train_set = ParallelDataset.joined([taught, self.train_set]) if teachers.spec.original else taught

    def _resume_or_start(self) -> None:
        """A fresh run, or last.pt's state resumed: weights, optimizer, loss scale, progress, each
        rank's RNG stream (savedir.RunFiles decides which, and checks that it may)."""
        ckpt = self.files.open(self.job.force, self.dist, self.tokenizer.model_bytes, f"{self.data_dir}/tokenizer.model")
        if ckpt is None:
            return
        self.model.load_state_dict(ckpt["weights"], strict=False)
        rngs, saved_world = checkpoint.unpack_train_state(ckpt["train_state"], self.optimizer, self.scaler, self.state, self.ema)
        if self.dist.rank < len(rngs):  # each rank continues its own dropout stream
            distributed.set_rng_state(rngs[self.dist.rank], self.device)
        if saved_world != self.dist.world_size:
            self.state.batch_in_epoch = distributed.resume_position(self.state.batch_in_epoch, saved_world,
                                                                       self.dist.world_size)
            log.warn(f"{self.paths.last} was trained by {saved_world} process(es), now {self.dist.world_size}: the batch per "
                     f"update changes, and the run is not the one it would have been (resumed at update "
                     f"{self.state.batch_in_epoch} of epoch {self.state.epoch})")
        valid = self.files.best_valid()  # after a kill between best.pt and last.pt, best.pt knows better
        if valid is not None:
            saved = validate.ValidResult(valid["loss"], valid.get("nll", valid["loss"]), bleu=valid.get("bleu"), chrf=valid.get("chrf"))
            if self.early_stopping.beats_best(saved):
                log.warn(f"{self.paths.best} holds a better validation than {self.paths.last} records (a save was cut "
                         f"short): continuing from its {self.early_stopping.metric} {saved.value(self.early_stopping.metric):.4g}")
                self.state.best_metric_value = saved.value(self.early_stopping.metric)
                self.state.best_valid_loss = min(self.state.best_valid_loss, saved.loss)
        log.info(f"resuming {self.paths.last}: update {self.state.updates}, epoch {self.state.epoch}")

    # ---- one update ---------------------------------------------------------------------
    def _step(self, batches: list, global_tokens: int, epoch_batches: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One update over this rank's micro-batches; returns this rank's summed loss and NLL as
        tensors (no host sync). global_tokens: target tokens of the update on all ranks;
        epoch_batches: updates in this epoch (the --max-epochs share of the schedule)."""
        st = self.state
        done = schedule.progress(self.train_config, st.updates, st.train_seconds,
                                 st.epoch - 1 + st.batch_in_epoch / epoch_batches)
        lr = self.schedule.lr(st.updates + 1, done)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        on_device = [(b.src.to(self.device, non_blocking=True), b.tgt_in.to(self.device, non_blocking=True),
                      b.tgt_out.to(self.device, non_blocking=True)) for b in batches]
        # DDP averages gradients over ranks: world / tokens makes it the mean over all tokens
        losses = self.updater.step(on_device, self.dist.world_size / global_tokens)
        if self.ema is not None:
            self.ema.update()
        return losses

    @property
    def validates(self) -> bool:
        """Whether there is a validation set (one pair's, or some pair's of several)."""
        return self.valid_set is not None or bool(self.pairs and self.pairs.valid)

    def validate(self) -> validate.ValidResult:
        """Loss (and, with --eval-bleu, BLEU/chrF) on the validation split; nan without one. Several
        pairs: each pair's validation (its sources led by its tag), and their mean."""
        def one(dataset, tag=None) -> validate.ValidResult:
            return validate.evaluate(self.model, dataset, self.tokenizer, self.model_config, self.train_config,
                                     self.job.optim.label_smoothing, self.device,
                                     autocast=lambda: autocast_for(self.device, self.train_config.precision),
                                     share=self.dist if self.dist.world_size > 1 else None, tag=tag)  # each rank validates a share

        if self.pairs is not None and self.pairs.valid:
            return validate.mean({pair: one(dataset, tag) for pair, (dataset, tag) in self.pairs.valid.items()})
        if self.valid_set is None:
            return validate.ValidResult(float("nan"), float("nan"))
        return one(self.valid_set)

    def _save(self, result: Optional[validate.ValidResult] = None, improved: bool = False, gather: bool = True) -> None:
        """last.pt always (and the update-numbered copy at --save-interval-updates points); best.pt
        after a validation that improved --best-metric, after the first validation of a run (so
        there is one to translate with), and after every validation when there is no validation
        split. An unvalidated save (interval, Ctrl-C, SIGTERM) never writes best.pt. best.pt is
        written first: a kill between the two leaves last.pt behind it, never ahead."""
        # every rank's RNG state goes into last.pt (gather=False: an interrupt, no collectives)
        own = distributed.rng_state(self.device)
        rngs = self.dist.gather(own) if gather else [own]
        if not self.dist.is_main:
            return
        with self.interrupts.held():
            self._write_checkpoints(result, improved, rngs)
            self.saved_progress = self.state.state_dict()  # what last.pt now holds

    def _write_checkpoints(self, result: Optional[validate.ValidResult], improved: bool, rngs: list) -> None:
        st, cfg = self.state, self.train_config
        weights = checkpoint.model_state(self.model)
        train_state = checkpoint.pack_train_state(self.optimizer, self.scaler, st, rngs, self.dist.world_size, self.ema, self.device)
        valid = None if result is None else {"loss": result.loss, "nll": result.nll, "bleu": result.bleu, "chrf": result.chrf}
        ckpt = checkpoint.build(self.configs, self.tokenizer.model_bytes, weights, train_state=train_state,
                                source_lengths=self.source_lengths,
                                valid_loss=None if result is None else result.loss, updates=st.updates,
                                progress=st.state_dict(), valid=valid)
        best = result is not None and (improved or not self.validates or not self.paths.best.exists())
        self.files.write(ckpt, best, cfg.keep_last if cfg.keep_last and st.updates % cfg.save_interval_updates == 0 else 0)
        self.metrics.path = self.files.metrics_path  # (a --force run's first save moved its metrics into place)

    # ---- the loop ----------------------------------------------------------------------
    def run(self) -> TrainResult:
        """Epochs of updates until a limit (or --patience) stops the run; then the weight average is
        offered as best.pt. Each update: lr -> micro-batches forward/backward -> clip -> step -> log,
        then validate/save at the intervals (_train_epoch)."""
        cfg, st = self.train_config, self.state
        self._log_setup()
        total, unit = (cfg.max_updates, "update") if cfg.max_updates else ((cfg.max_time, "second") if cfg.max_time else (cfg.max_epochs or None, "epoch"))
        progress = log.Progress(total, unit, cfg.log_interval)
        self.clock_start = time.monotonic() - st.train_seconds  # train_seconds counts across resumes
        window = ThroughputWindow(time.monotonic())
        stopped_by, skipped, n_batches = "", 0, 1
        self.model.train()
        self.interrupts.install()
        try:
            with self._errors_explained(progress):
                while not stopped_by:
                    if self.pairs is not None:  # this epoch's draw of every pair, in their shares
                        self.train_set = self.pairs.mixture.epoch(cfg.seed, st.epoch)
                    batches, skipped = plan_epoch(self.train_set, self.data_dir, cfg, self.model_config.max_positions, st.epoch,
                                                  self.dist.rank, self.dist.world_size, first=st.updates == 0 and st.batch_in_epoch == 0)
                    n_batches = len(batches)
                    stopped_by = self._train_epoch(batches, window, progress, unit)
                if self.ema is not None and self.validates:
                    self._offer_average()
        finally:
            progress.close()
            self.metrics.close()
            self.interrupts.restore()
            self.lock.release()
        st.train_seconds = time.monotonic() - self.clock_start
        return TrainResult(
            updates=st.updates, epochs=st.epoch - 1 + st.batch_in_epoch / max(n_batches, 1),
            best_valid_loss=st.best_valid_loss, last_valid_loss=st.last_valid_loss,
            train_tokens=st.train_tokens, train_seconds=st.train_seconds, skipped_too_long=skipped,
            save_dir=self.paths.save_dir, stopped_by=stopped_by,
            best_metric=cfg.best_metric, best_value=st.best_metric_value, distill_seconds=self.distill_seconds,
        )

    def _train_epoch(self, batches: list, window: ThroughputWindow, progress: log.Progress, unit: str) -> str:
        """The rest of the current epoch (from batch_in_epoch on); returns what stopped the run, or ""."""
        cfg, st = self.train_config, self.state
        # whether the state as it is now has been validated (and saved); a run resumed at the end
        # of an epoch was saved by the validation of that epoch's last update
        validated = 0 < st.batch_in_epoch == len(batches)
        stopped_by = ""
        for k in range(st.batch_in_epoch, len(batches)):
            self._update(batches[k], len(batches), window)
            st.batch_in_epoch = k + 1
            self._log(window, progress, unit, (k + 1) / len(batches))
            stopped_by = self._limit_reached(epoch_done=False)
            validated = False
            if cfg.validate_interval_updates and st.updates % cfg.validate_interval_updates == 0 and not stopped_by:
                stopped_by, validated = self._validate_and_save(), True
            elif (cfg.save_interval_updates and st.updates % cfg.save_interval_updates == 0
                  and not stopped_by and k + 1 < len(batches)):  # else the validation just below saves
                self._save()
            if stopped_by:
                break
        else:
            st.epoch += 1
            st.batch_in_epoch = 0
            stopped_by = self._limit_reached(epoch_done=True)
        if not validated:  # (an interval validation of the epoch's last update counts)
            stopped_by = self._validate_and_save() or stopped_by
        return stopped_by

    def _update(self, ids: list, epoch_updates: int, window: ThroughputWindow) -> None:
        """Collate, step, count: one update of the run."""
        mc, st = self.model_config, self.state
        distributed.fault_point(self.dist, st.updates)
        micro = [collate(self.train_set, b, mc.pad_id, mc.bos_id, mc.eos_id, mc.max_positions) for b in ids]
        n = sum(b.ntokens for b in micro)
        n_all = self.dist.sum_int(n)  # the loss is normalised by the tokens of all ranks
        loss, nll = self._step(micro, n_all, epoch_updates)
        st.updates += 1
        self.trim_heap(time.monotonic())
        st.train_tokens += n_all
        st.skipped_updates = self.updater.skipped
        window.add(loss, nll, n, n_all)
        st.train_seconds = time.monotonic() - self.clock_start
        if self.train_config.max_time and self.dist.world_size > 1:  # clocks differ: rank 0's decides the lr and the stop
            st.train_seconds = self.dist.from_main(st.train_seconds)

    def _log(self, window: ThroughputWindow, progress: log.Progress, unit: str, epoch_share: float) -> None:
        """Once per log interval (and after the first update): a train record and the progress line."""
        st = self.state
        now = time.monotonic()
        if now - window.start < self.train_config.log_interval and st.updates != 1:
            return
        loss, nll, rate = window.figures(now)  # the only host sync of the loop
        lr = self.optimizer.param_groups[0]["lr"]
        ppl = math.exp(min(nll, 50))
        record = {"kind": "train", "update": st.updates, "epoch": st.epoch, "loss": loss, "ppl": ppl, "lr": lr,
                  "tokens_per_s": rate, "seconds": st.train_seconds}
        if self.scaler.is_enabled():
            record.update(loss_scale=self.scaler.get_scale(), skipped_updates=self.updater.skipped)
        self.metrics.write(record)
        window.reset(now)
        stats = f"epoch {st.epoch} | update {st.updates} | loss {loss:.3f} | ppl {ppl:.1f} | lr {lr:.2e} | {rate:,.0f} tok/s"
        if self.updater.skipped:
            stats += f" | {self.updater.skipped} skipped (fp16 overflow)"
        progress.update({"update": st.updates, "second": st.train_seconds, "epoch": st.epoch - 1 + epoch_share}[unit], stats)

    def _log_setup(self) -> None:
        cfg, mc = self.train_config, self.model_config
        log.info(f"learning rate: peak {self.schedule.peak:g}, {self.schedule.summary()}")
        log.info(f"model: {sum(p.numel() for p in self.model.parameters()):,} parameters, "
                 f"{mc.encoder_layers}+{mc.decoder_layers} layers, d_model {mc.d_model}, {mc.n_heads} heads, "
                 f"device {self.device}, precision {cfg.precision}, threads {torch.get_num_threads()}"
                 + (f", {self.dist.world_size} processes" if self.dist.world_size > 1 else "")
                 + (f", update-freq {cfg.update_freq}" if cfg.update_freq > 1 else ""))

    @contextlib.contextmanager
    def _errors_explained(self, progress: log.Progress) -> Iterator[None]:
        """Ctrl-C/SIGTERM: save last.pt (not validated, never best.pt) and say how to resume; out of
        memory: what to lower; a lost rank: which and why."""
        st = self.state
        try:
            yield
        except KeyboardInterrupt:
            progress.close()
            self.interrupts.stopping = True  # a second signal no longer interrupts the save below
            if self.saved_progress != st.state_dict():  # (a signal held back by a save stops the run right after it)
                self._save(gather=False)
            log.warn(f"interrupted at update {st.updates}: saved {self.paths.last}; run the same command again to resume")
            raise
        except update.OutOfMemoryError:
            progress.close()
            raise update.OutOfMemory(update.out_of_memory_advice(self.device, self.train_config.max_tokens,
                                                                 self.train_config.update_freq, self.train_config.precision)) from None
        except RuntimeError as error:  # e.g. DDP's all-reduce in backward when another rank died or hangs
            if self.dist.world_size > 1 and distributed.is_comm_error(error) and not isinstance(error, ConfigError):
                raise self.dist.lost(error) from None
            raise

    def _offer_average(self) -> None:
        """At the end of a run: validate the weights' moving average; when it beats the best
        validation so far it becomes best.pt (last.pt keeps the trained weights and the average)."""
        st, stopping = self.state, self.early_stopping
        with self.ema.applied():
            result = self.validate()
            better = stopping.beats_best(result)
            if better and self.dist.is_main:
                ckpt = checkpoint.build(self.configs, self.tokenizer.model_bytes, checkpoint.model_state(self.model),
                                        source_lengths=self.source_lengths, valid_loss=result.loss, updates=st.updates, progress=st.state_dict(), averaged=True,
                                        valid={"loss": result.loss, "nll": result.nll, "bleu": result.bleu, "chrf": result.chrf})
                with self.interrupts.held():
                    checkpoint.save(ckpt, self.paths.best)
        self.metrics.write({"kind": "valid_ema", "update": st.updates, "loss": result.loss, "nll": result.nll,
                            "ppl": result.ppl, "bleu": result.bleu, "chrf": result.chrf, "best_before": stopping.best,
                            "kept": better, "ema_decay": self.ema.decay, "seconds": st.train_seconds})
        value = result.value(stopping.metric)
        if better:
            stopping.update(result)
            self._save()  # last.pt records the new best, so a resumed run compares against it
        log.info(f"weight average (EMA {self.ema.decay:g}) | {stopping.metric} {value:.3f} | "
                 + (f"better: saved as {self.paths.best.name}" if better else f"not better than {stopping.best:.3f}: best.pt unchanged"))

    def _limit_reached(self, epoch_done: bool) -> str:
        cfg, st = self.train_config, self.state
        if cfg.max_updates and st.updates >= cfg.max_updates:
            return "max-updates"
        if cfg.max_time and st.train_seconds >= cfg.max_time:
            return "max-time"
        if epoch_done and cfg.max_epochs and st.epoch > cfg.max_epochs:
            return "max-epochs"
        return ""

    def _validate_and_save(self) -> str:
        """Validate, update early stopping, save, log; returns "patience" when it says stop."""
        st, cfg = self.state, self.train_config
        # the heap's free pages go back before and after: validation's batches and the checkpoint's
        # copies would otherwise land on top of the last updates' churn (the run's peak RSS)
        self.trim_heap(time.monotonic(), force=True)
        result = self.validate()
        st.last_valid_loss = result.loss
        improved = self.early_stopping.update(result)
        self._save(result, improved)
        self.trim_heap(time.monotonic(), force=True)
        self.metrics.write({"kind": "valid", "update": st.updates, "epoch": st.epoch, "loss": result.loss,
                            "nll": result.nll, "ppl": result.ppl, "bleu": result.bleu, "chrf": result.chrf,
                            "best_loss": st.best_valid_loss, "best_metric": cfg.best_metric, "best": self.early_stopping.best,
                            "bad_validations": st.bad_validations, "seconds": st.train_seconds,
                            "valid_seconds": result.seconds, **({"pairs": validate.pair_figures(result)} if result.pairs else {})})
        log.info(validate.summary_line(result, st.updates, self.early_stopping))
        if self.dist.from_main(self.early_stopping.should_stop):  # one decision for every rank
            log.info(f"stopping: {cfg.best_metric} has not improved for {cfg.patience} validations (--patience)")
            return "patience"
        return ""


def train(job: TrainJob) -> TrainResult:
    kernels.limit_primitive_cache()
    result = Trainer(job).run()
    # after an error the process exits instead: leaving a group whose other ranks died can block
    distributed.close()
    return result


"""train --teacher: sequence-level distillation (training/distill.py), the student preset and the
decoding defaults a distilled checkpoint records (translate.settings)."""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from seqtool import checkpoint
from seqtool.binarize import SplitSpec, binarize
from seqtool.cli import app
from seqtool.config import ConfigError, OptimConfig, TrainConfig, model_config_for
from seqtool.data import ParallelDataset, shard_paths
from seqtool.errors import InputError
from seqtool.languages import Languages
from seqtool.training import distill
from seqtool.training.distill import Distill
from seqtool.training.train import Trainer, TrainJob, train
from seqtool.translate import Translator, settings

from conftest import seqtool

runner = CliRunner()
N_TRAIN = 120


@pytest.fixture(scope="module")
def taught(reverse_run, tmp_path_factory):
    """A teacher that reverses letter sequences (reverse_run's model), and a DATA_DIR of 120 of its
    training pairs and 20 validation pairs binarized with its tokenizer."""
    d = tmp_path_factory.mktemp("distill")
    for split, n in (("train", N_TRAIN), ("valid", 20)):
        sources, targets = reverse_run.texts[split]
        (d / f"{split}.src").write_text("\n".join(sources[:n]) + "\n")
        (d / f"{split}.tgt").write_text("\n".join(targets[:n]) + "\n")
    spm = reverse_run.directory / "spm.model"
    binarize("src", "tgt", [SplitSpec("train", str(d / "train")), SplitSpec("valid", str(d / "valid"))], spm, d / "bin")
    return d, reverse_run.directory / "run" / "best.pt"


def _job(data_dir, save_dir, teachers, original=False, force=False, arch="tiny", **train):
    train.setdefault("max_updates", 2)
    train.setdefault("threads", 2)
    return TrainJob(save_dir=save_dir, model=model_config_for(arch), optim=OptimConfig(warmup=2),
                    train=TrainConfig(max_tokens=600, device="cpu", **train), data_dir=data_dir, force=force,
                    distill=Distill(tuple(teachers), original))


@pytest.mark.integration
def test_the_student_learns_what_translate_gives_and_a_second_run_reuses_it(taught, tmp_path, monkeypatch):
    d, teacher = taught
    result = train(_job(d / "bin", tmp_path / "s", [teacher]))
    assert result.updates == 2 and result.distill_seconds > 0
    (made,) = (tmp_path / "s" / "distill").iterdir()
    taught_set = ParallelDataset(made, "train")
    original = ParallelDataset(d / "bin", "train")
    assert len(taught_set) == N_TRAIN
    assert all(np.array_equal(taught_set.src[i], original.src[i]) for i in range(N_TRAIN))  # the same sources, in order
    # the targets are the teacher's translations, as `seqtool translate` makes them (its defaults)
    sources = (d / "train.src").read_text().splitlines()
    with Translator.load(teacher, device="cpu", threads=2) as translator:
        expected = [t.hypotheses[0].tokens for t in translator.translate_chunk(0, sources)]
    assert [taught_set.tgt[i].tolist() for i in range(N_TRAIN)] == expected
    # a teacher that learnt to reverse: most of what it teaches is the reference itself
    assert sum(np.array_equal(taught_set.tgt[i], original.tgt[i]) for i in range(N_TRAIN)) >= 0.9 * N_TRAIN

    # the checkpoint names its teacher and decodes greedily unless told otherwise
    best = checkpoint.load(tmp_path / "s" / "best.pt")
    assert best["configs"]["distill"] == {"teachers": [f"{teacher}@{checkpoint.load(teacher)['weights_sha256'][:16]}"],
                                          "original": False}
    assert best["configs"]["decoding"] == distill.DECODING and distill.DECODING["beam"] == 1

    # a second student in that SAVE_DIR (--force) from the same teacher: no second pass
    def translated_again(*args, **kwargs):
        raise AssertionError("the teacher's translations were made again")

    monkeypatch.setattr(distill, "translate_chunks", translated_again)
    again = train(_job(d / "bin", tmp_path / "s", [teacher], force=True, arch="student", max_updates=1))
    assert again.updates == 1 and again.distill_seconds == 0
    assert [p.name for p in (tmp_path / "s" / "distill").iterdir()] == [made.name]


@pytest.mark.integration
def test_distill_original_trains_on_both_target_sides(taught, tmp_path):
    d, teacher = taught
    trainer = Trainer(_job(d / "bin", tmp_path / "s", [teacher], original=True))
    try:
        original = ParallelDataset(d / "bin", "train")
        assert len(trainer.train_set) == 2 * N_TRAIN
        for i in (0, 7, N_TRAIN - 1):
            assert np.array_equal(trainer.train_set.src[N_TRAIN + i], original.src[i])
            assert np.array_equal(trainer.train_set.tgt[N_TRAIN + i], original.tgt[i])  # the references
            assert np.array_equal(trainer.train_set.src[i], original.src[i])
    finally:
        trainer.lock.release()


@pytest.mark.integration
def test_a_teacher_that_does_not_fit_the_data_is_one_line_naming_what_differs(taught, small_corpus, tmp_path):
    d, teacher = taught
    with pytest.raises(InputError, match=r"--teacher .*best\.pt: its tokenizer differs from the one .* was binarized with"):
        train(_job(small_corpus / "bin", tmp_path / "a", [teacher]))
    # the same tokenizer, the languages the other way round
    binarize("tgt", "src", [SplitSpec("train", str(d / "train")), SplitSpec("valid", str(d / "valid"))],
             taught[1].parents[1] / "spm.model", tmp_path / "swapped")
    with pytest.raises(InputError, match=r"translates src -> tgt, but the training data is tgt -> src"):
        train(_job(tmp_path / "swapped", tmp_path / "b", [teacher]))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b" / "distill").exists()  # refused before any work


@pytest.mark.integration
def test_a_teacher_changed_between_runs_is_refused_on_resume(taught, tmp_path):
    d, teacher = taught
    mine = tmp_path / "teacher.pt"
    shutil.copy(teacher, mine)
    train(_job(d / "bin", tmp_path / "s", [mine]))
    ckpt = checkpoint.load(mine)
    weights = {k: v + 0.01 for k, v in ckpt["weights"].items()}  # retrained, say
    checkpoint.save(checkpoint.build(ckpt["configs"], checkpoint.tokenizer_bytes(ckpt), weights), mine)
    with pytest.raises(ConfigError, match=r"distill\.teachers: saved .*teacher\.pt@.*, now .*teacher\.pt@"):
        train(_job(d / "bin", tmp_path / "s", [mine], max_updates=4))


@pytest.mark.unit
def test_recorded_decoding_defaults_yield_to_what_is_given():
    recorded = {"beam": 1}
    assert settings(recorded=recorded)[1].beam == 1
    assert settings(recorded=recorded, beam=4)[1].beam == 4
    assert settings(recorded=recorded, nbest=3)[1].beam == 5  # beam 1 cannot give 3 best: seqtool's default
    assert settings(recorded={"beam": 1, "quantize": "int8"})[0].quantize == "int8"
    config, options = settings(recorded={"beam": 1, "quantize": "int8"}, precision="bf16")  # int8 cannot run in bf16
    assert (config.quantize, config.precision, options.beam) == ("none", "bf16", 1)  # only the clashing default goes
    assert settings(recorded=None)[1].beam == 5


@pytest.mark.unit
def test_joined_datasets_read_as_one(small_corpus):
    one = ParallelDataset(small_corpus / "bin", "train")
    two = ParallelDataset(small_corpus / "bin", "valid")
    both = ParallelDataset.joined([one, two])
    assert len(both) == len(one) + len(two)
    assert np.array_equal(both.src.lengths, np.concatenate([one.src.lengths, two.src.lengths]))
    assert np.array_equal(both.tgt[len(one) + 3], two.tgt[3]) and np.array_equal(both.src[len(one) - 1], one.src[len(one) - 1])


@pytest.mark.system
def test_the_cli_trains_a_student_whose_checkpoint_decodes_greedily_unless_told(taught, tmp_path):
    d, teacher = taught
    seqtool("train", d / "bin", "--save-dir", "s", "--teacher", teacher, "--arch", "student", "--max-updates", "3",
            "--max-tokens", "600", "--threads", "2", "--device", "cpu", cwd=tmp_path)
    info = seqtool("info", "s/best.pt", cwd=tmp_path).stdout
    assert json.loads((tmp_path / "s" / "config.json").read_text())["distill"]["original"] is True  # the default
    assert "decoding" in info and "beam=1 batch_size=256 quantize=int8" in info and "encoder_layers=4" in info and "decoder_layers=1" in info
    test = "\n".join(d.joinpath("valid.src").read_text().splitlines()) + "\n"

    def translate(*options):
        return seqtool("translate", "-c", "s/best.pt", "--print-scores", "--device", "cpu", "--threads", "2", *options,
                       cwd=tmp_path, stdin=test).stdout

    default = translate()
    assert default == translate("--beam", "1", "--quantize", "int8", "--batch-size", "256")  # the recorded defaults
    assert default != translate("--beam", "5")  # an option still wins (a 3-update model's beam finds other outputs)
    assert translate("--nbest", "2").count("\n") == 2 * test.count("\n")  # n-best needs a beam: seqtool's default


@pytest.mark.system
def test_distill_original_without_a_teacher_is_a_one_line_error(tmp_path):
    result = runner.invoke(app, ["train", str(tmp_path), "--save-dir", str(tmp_path / "s"), "--distill-original"])
    assert result.exit_code == 1 and "add --teacher" in result.output
    result = runner.invoke(app, ["train", str(tmp_path), "--save-dir", str(tmp_path / "s"), "--teacher-only"])
    assert result.exit_code == 1 and "add --teacher" in result.output


@pytest.mark.system
def test_two_processes_share_the_teachers_pass_and_make_the_same_split(taught, tmp_path):
    # torchrun on the raw files (prepared with the teacher's tokenizer) against one process on the DATA_DIR
    # binarized with it: the same source ids, so the same cache key and the same translations. The two
    # processes translate chunks of 40 sentences (the one process one of 2,048): a round of two, then one
    d, teacher = taught
    raw = ["--src", "src", "--tgt", "tgt", "--train", str(d / "train"), "--valid", str(d / "valid")]
    script = tmp_path / "chunks_of_40.py"
    script.write_text("import sys\nfrom seqtool.training import distill\ndistill.CHUNK = 40\nfrom seqtool.cli import main\n"
                      "sys.argv[0] = 'seqtool'\nmain()\n")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script), "train",
               *raw, "--save-dir", str(tmp_path / "two"), "--teacher", str(teacher), "--arch", "tiny",
               "--max-updates", "1", "--max-tokens", "600", "--threads", "1", "--device", "cpu"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=240, env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "distillation: 120 sentences translated by 1 teacher(s)" in result.stderr and "earlier pass" not in result.stderr
    (two,) = (tmp_path / "two" / "distill").iterdir()  # (the chunks it kept are gone)
    seqtool("train", d / "bin", "--save-dir", "one", "--teacher", teacher, "--arch", "tiny", "--max-updates", "1",
            "--max-tokens", "600", "--threads", "1", "--device", "cpu", cwd=tmp_path)
    (one,) = (tmp_path / "one" / "distill").iterdir()
    assert one.name == two.name  # the same teacher, data and search: the same cache key
    a, b = ParallelDataset(one, "train"), ParallelDataset(two, "train")
    assert [a.tgt[i].tolist() for i in range(N_TRAIN)] == [b.tgt[i].tolist() for i in range(N_TRAIN)]
    assert json.loads((two / "meta.json").read_text())["distill"]["teachers"] == [f"{teacher}@{checkpoint.load(teacher)['weights_sha256'][:16]}"]


@pytest.mark.integration
def test_a_finetuned_student_learns_from_its_teacher(taught, tmp_path):
    # --finetune and --teacher together: the checkpoint's model and tokenizer, the teacher's translations
    from seqtool.training.finetune import Finetune

    d, teacher = taught
    job = _job(d / "bin", tmp_path / "s", [teacher])
    job.finetune = Finetune(teacher)
    result = train(job)
    assert result.updates == 2 and result.distill_seconds > 0
    saved = json.loads((tmp_path / "s" / "config.json").read_text())
    assert saved["finetune"]["checkpoint"] == str(teacher) and saved["distill"]["teachers"][0].startswith(f"{teacher}@")
    assert len(list((tmp_path / "s" / "distill").iterdir())) == 1


# ---- a damaged cache, a pass killed part way, a teacher no student can learn from yet ---------------------------
def _damage(kind: str, cache) -> str:
    """Damage the teacher's side of a distilled split as `kind` says; what the warning must name."""
    meta = json.loads((cache / "meta.json").read_text())
    tokens, offsets = shard_paths(cache, "train", meta["tgt_lang"])
    if kind == "flipped bytes":
        data = bytearray(tokens.read_bytes())
        data[len(data) // 2] ^= 0x5A
        tokens.write_bytes(bytes(data))
        return "train.tgt.bin does not match its sha256"
    if kind == "truncated idx":
        offsets.write_bytes(offsets.read_bytes()[:-8])  # one pair short: the rest would be trained on shifted targets
        return "train.tgt.idx does not match its sha256"
    if kind == "out-of-vocabulary id":  # written with its sha256 updated: only the ids themselves tell
        ids = np.fromfile(tokens, dtype=meta["dtype"])
        ids[5] = meta["vocab_size"] + 7
        ids.tofile(tokens)
        if "sha256" in meta["distill"]:
            meta["distill"]["sha256"][tokens.name] = hashlib.sha256(tokens.read_bytes()).hexdigest()
        (cache / "meta.json").write_text(json.dumps(meta))
        return f"holds token id {meta['vocab_size'] + 7}, outside the student's vocabulary of {meta['vocab_size']}"
    assert kind == "no digest"  # a cache an earlier seqtool made
    del meta["distill"]["sha256"]
    (cache / "meta.json").write_text(json.dumps(meta))
    return "records no sha256 of its files"


@pytest.fixture(scope="module")
def distilled(taught, tmp_path_factory):
    """SAVE_DIR/distill as a one-update run left it: its one cache, made once for the damage tests."""
    d, teacher = taught
    save_dir = tmp_path_factory.mktemp("distilled") / "s"
    train(_job(d / "bin", save_dir, [teacher], max_updates=1, threads=1))
    (cache,) = (save_dir / "distill").iterdir()
    return cache


@pytest.mark.integration
@pytest.mark.parametrize("kind", ["flipped bytes", "truncated idx", "out-of-vocabulary id", "no digest"])
def test_a_damaged_cache_is_made_again_saying_why(taught, distilled, kind, tmp_path, capsys):
    d, teacher = taught
    shutil.copytree(distilled.parent, tmp_path / "s" / "distill")  # (a copy: the source shards are links to the data's)
    cache = tmp_path / "s" / "distill" / distilled.name
    why = _damage(kind, cache)
    capsys.readouterr()
    result = train(_job(d / "bin", tmp_path / "s", [teacher], max_updates=1, threads=1))
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and f"{cache} are damaged (" in warnings[0] and why in warnings[0], warnings
    assert result.updates == 1 and result.distill_seconds > 0  # translated again, then trained on
    meta = json.loads((cache / "meta.json").read_text())
    for name in distill.cache_files(meta):  # the same split as the one first made
        assert (cache / name).read_bytes() == (distilled / name).read_bytes(), name
    assert set(meta["distill"]["sha256"]) == set(distill.cache_files(meta))


# `seqtool train --teacher` whose pass translates (and keeps) chunks of 40 sentences, killed (SIGKILL) while it
# translates the third
KILLED_IN_THE_THIRD_CHUNK = """
import os, signal, sys
from seqtool import pipeline
from seqtool.training import distill
distill.CHUNK = 40
calls, run = [], pipeline.run
def killed_in_the_third(*args, **kwargs):
    calls.append(1)
    if len(calls) == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    return run(*args, **kwargs)
pipeline.run = killed_in_the_third
from seqtool.cli import main
sys.argv[0] = "seqtool"
main()
"""


@pytest.mark.system
def test_a_pass_killed_part_way_continues_from_its_last_complete_chunk(taught, tmp_path, monkeypatch, capsys):
    d, teacher = taught
    options = ["--arch", "tiny", "--max-updates", "1", "--max-tokens", "600", "--threads", "1", "--device", "cpu"]
    killed = subprocess.run([sys.executable, "-c", KILLED_IN_THE_THIRD_CHUNK, "train", str(d / "bin"), "--save-dir",
                             str(tmp_path / "s"), "--teacher", str(teacher), *options], capture_output=True, text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    (partial,) = (tmp_path / "s" / "distill").iterdir()  # no cache: only the chunks kept so far
    assert partial.name.endswith(".partial")
    assert sorted(p.name for p in partial.iterdir()) == ["chunk000000.npz", "chunk000001.npz"]

    monkeypatch.setattr(distill, "CHUNK", 40)
    real = distill.translate_chunk
    translated: list[int] = []

    def counted(translator, train_set, ids, options):
        translated.extend(int(i) for i in ids)
        return real(translator, train_set, ids, options)

    monkeypatch.setattr(distill, "translate_chunk", counted)
    capsys.readouterr()
    result = train(_job(d / "bin", tmp_path / "s", [teacher], max_updates=1, threads=1))
    err = capsys.readouterr().err
    assert "reusing 80 of 120 sentences translated by an earlier pass (2 chunk(s)" in err and "translating the other 40" in err
    assert "distillation: 40 sentences translated by 1 teacher(s)" in err and "80 more by an earlier pass" in err
    order = np.argsort(-ParallelDataset(d / "bin", "train").src.lengths, kind="stable")
    assert translated == order[80:].tolist() and result.updates == 1  # only the third chunk's sentences

    # the split equals an uninterrupted pass's (in one chunk), and the kept chunks are gone
    monkeypatch.setattr(distill, "CHUNK", 2048)
    train(_job(d / "bin", tmp_path / "whole", [teacher], max_updates=1, threads=1))
    (cache,) = (tmp_path / "s" / "distill").iterdir()
    (whole,) = (tmp_path / "whole" / "distill").iterdir()
    assert cache.name == whole.name and cache.name + ".partial" == partial.name
    meta = json.loads((cache / "meta.json").read_text())
    for name in distill.cache_files(meta):
        assert (cache / name).read_bytes() == (whole / name).read_bytes(), name
    assert meta["distill"]["sha256"] == json.loads((whole / "meta.json").read_text())["distill"]["sha256"]


def _teacher_with_more_ids(teacher, path, languages=None):
    """The teacher with 2 ids past its tokenizer's pieces: a multilingual model's target-language tags
    (languages: its pairs), or ids its tokenizer lacks."""
    ckpt = checkpoint.load(teacher)
    configs = json.loads(json.dumps(ckpt["configs"]))
    vocab = configs["model"]["vocab_size"]
    configs["model"].update(vocab_size=vocab + 2, language_tags=2 if languages else 0)
    if languages:
        configs["languages"] = Languages(languages, vocab).to_dict()
        configs["train"].update(src_lang="", tgt_lang="")  # as a multilingual run records them
    weights = {k: torch.cat([v, v[:2]]) if v.shape[0] == vocab else v for k, v in ckpt["weights"].items()}
    checkpoint.save(checkpoint.build(configs, checkpoint.tokenizer_bytes(ckpt), weights), path)
    return path


@pytest.mark.system
def test_a_teacher_no_student_can_learn_from_is_refused_before_the_data_is_prepared(taught, tmp_path):
    d, teacher = taught
    multi = _teacher_with_more_ids(teacher, tmp_path / "multi.pt", languages=(("src", "tgt"), ("tgt", "src")))
    raw = ["--src", "src", "--tgt", "tgt", "--train", str(d / "train"), "--valid", str(d / "valid")]
    result = runner.invoke(app, ["train", *raw, "--save-dir", str(tmp_path / "s"), "--teacher", str(multi), "--max-updates", "1"])
    assert result.exit_code == 1, result.output
    (line,) = result.output.strip().splitlines()
    assert "multi.pt: a multilingual model (src-tgt, tgt-src; 47 ids, 2 of them target-language tags)" in line
    assert "distillation from a multilingual teacher is not supported" in line
    assert not (tmp_path / "s").exists()  # nothing binarized (and no tokenizer written)
    # the same refusal for a DATA_DIR, before it is opened; and a teacher whose ids its tokenizer lacks
    odd = _teacher_with_more_ids(teacher, tmp_path / "odd.pt")
    for given, says in ((multi, "distillation from a multilingual teacher is not supported"),
                        (odd, "its model has 47 token ids but its tokenizer 45 pieces")):
        result = runner.invoke(app, ["train", str(d / "bin"), "--save-dir", str(tmp_path / "s"), "--teacher", str(given)])
        assert result.exit_code == 1 and says in result.output and len(result.output.strip().splitlines()) == 1, result.output
    assert not (tmp_path / "s").exists()


@pytest.mark.unit
def test_only_whole_chunks_of_the_sentences_asked_for_are_taken_from_an_unfinished_pass(tmp_path, capsys):
    partial = tmp_path / "KEY.partial"
    partial.mkdir()
    chunks = [np.arange(k, k + 3) for k in (0, 3, 6, 9, 12)]
    for c in range(5):
        distill.keep_chunk(partial, c, chunks[c], distill.pack([[4, 5 + c], [], [6] * c]))
    with np.load(distill.chunk_path(partial, 1)) as kept:  # a translation changed, its sha256 kept
        np.savez(distill.chunk_path(partial, 1), **{**kept, "tokens": kept["tokens"] + 1})
    path = distill.chunk_path(partial, 2)
    path.write_bytes(path.read_bytes()[:200])  # cut short
    distill.keep_chunk(partial, 3, chunks[3], distill.pack([[4], [44], [6]]))  # an id past a vocabulary of 40
    distill.keep_chunk(partial, 4, chunks[3], distill.pack([[4], [5], [6]]))  # other sentences (another chunk size)
    stale = partial / ".chunk000005.npz.tmp999999999"  # a chunk being written when its pass was killed
    stale.write_bytes(b"half")
    capsys.readouterr()
    done = distill.kept_chunks(partial, chunks, 40)
    err = capsys.readouterr().err
    assert list(done) == [0] and [done[0][1][done[0][0][k]: done[0][0][k + 1]].tolist() for k in range(3)] == [[4, 5], [], []]
    (warning,) = [line for line in err.splitlines() if line.startswith("warning:")]
    assert "4 chunk(s) kept in" in warning and "chunk000001.npz: does not match its sha256" in warning
    assert "chunk000002.npz: unreadable" in warning and "chunk000003.npz: sentence 2 holds token id 44" in warning
    assert "reusing 3 of 15 sentences translated by an earlier pass (1 chunk(s)" in err and not stale.exists()

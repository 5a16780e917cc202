"""Ensembles: probabilities averaged at every step, caches kept in step, one tokenizer."""

import math
import subprocess
import sys

import pytest
import torch

from seqtool import checkpoint
from seqtool.config import TokenizerConfig, model_config_for
from seqtool.ensemble import Ensemble
from seqtool.model import Transformer
from seqtool.search import Sampling, beam_search, greedy_search, sample
from seqtool.textio import InputError
from seqtool.tokenizer import train_tokenizer
from seqtool.translate import Translator

EOS, PAD, BOS = 3, 0, 2


def _model(seed):
    torch.manual_seed(seed)
    model = Transformer(model_config_for("tiny", vocab_size=50, dropout=0.0)).eval()
    with torch.no_grad():
        model.embed.weight.mul_(3.0)  # sharper: hypotheses of different lengths
    return model


@pytest.fixture(scope="module")
def models():
    return _model(3), _model(4)


def _sources(n=5, seed=1):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, 50, (n, 8), generator=g)
    src[:, -1] = EOS
    src[2, 5:] = PAD
    src[2, 4] = EOS
    return src


def _flat(hyps):
    return [[(h.tokens, h.score) for h in sent] for sent in hyps]


def _assert_same(a, b):
    assert [[t for t, _ in sent] for sent in a] == [[t for t, _ in sent] for sent in b]
    for sa, sb in zip(a, b):
        for (_, x), (_, y) in zip(sa, sb):
            assert x == pytest.approx(y, abs=1e-5)


@pytest.mark.unit
def test_an_ensemble_of_a_model_with_itself_is_that_model(models):
    model = models[0]
    pair = Ensemble([model, model])
    src = _sources()
    _assert_same(_flat(greedy_search(pair, src, max_len_a=0.0, max_len_b=12)), _flat(greedy_search(model, src, max_len_a=0.0, max_len_b=12)))
    _assert_same(_flat(beam_search(pair, src, beam=4, nbest=4, max_len_a=0.0, max_len_b=12)), _flat(beam_search(model, src, beam=4, nbest=4, max_len_a=0.0, max_len_b=12)))
    options = dict(nbest=3, sampling=Sampling(seed=9), max_len_a=0.0, max_len_b=12)
    _assert_same(_flat(sample(pair, src, **options)), _flat(sample(model, src, **options)))


def _ensemble_logprob(models, src_row, tokens):
    """log p(tokens + EOS | src) under the mean of the models' probabilities, recomputed from scratch
    (no cache): one teacher-forced pass per model."""
    tgt_in = torch.tensor([[BOS] + tokens])
    target = torch.tensor(tokens + [EOS])
    with torch.no_grad():
        lps = torch.stack([m(src_row, tgt_in).float().log_softmax(-1)[0] for m in models])  # (M, T, V)
    mixed = torch.logsumexp(lps, dim=0) - math.log(len(models))  # (T, V)
    return mixed[torch.arange(len(target)), target].sum().item()


@pytest.mark.parametrize("lenpen", [1.0, 0.0])
@pytest.mark.unit
def test_ensemble_beam_scores_match_full_recomputation(models, lenpen):
    """Beams are reordered and finished sentences leave the batch at every step; if any member's
    cache went out of step, a hypothesis's score would not be the ensemble's probability of it."""
    pair = Ensemble(list(models))
    src = _sources()
    # the length limit follows the source (a * source + b): sentences leave the batch at different steps
    hyps = beam_search(pair, src, beam=3, nbest=3, max_len_a=1.0, max_len_b=1, lenpen=lenpen)
    lengths = {len(h.tokens) for sent in hyps for h in sent}
    assert len(lengths) > 1
    for b, sent in enumerate(hyps):
        assert len(sent) == 3
        for h in sent:
            total = _ensemble_logprob(models, src[b : b + 1], h.tokens)
            assert h.score == pytest.approx(total / (len(h.tokens) + 1) ** lenpen, abs=1e-4)


@pytest.mark.unit
def test_ensemble_differs_from_each_member(models):
    src = _sources()
    pair = _flat(beam_search(Ensemble(list(models)), src, beam=3, max_len_a=0.0, max_len_b=12))
    for m in models:
        assert pair != _flat(beam_search(m, src, beam=3, max_len_a=0.0, max_len_b=12))


@pytest.fixture(scope="module")
def other_tokenizer_checkpoint(tiny_checkpoint, tmp_path_factory):
    """The tiny checkpoint's weights with a tokenizer trained on other text."""
    d = tmp_path_factory.mktemp("other")
    (d / "text.txt").write_text("".join(f"{w} k l m n o p q r s t\n" for w in "klmnopqrst" * 20))
    spm = train_tokenizer([d / "text.txt"], str(d / "spm"), TokenizerConfig(vocab_size=24))
    ckpt = checkpoint.load(tiny_checkpoint)
    path = d / "other.pt"
    checkpoint.save(checkpoint.build(ckpt["configs"], spm.read_bytes(), ckpt["weights"]), path)
    return path


@pytest.mark.system
def test_checkpoints_with_different_tokenizers_are_refused(tiny_checkpoint, other_tokenizer_checkpoint):
    with pytest.raises(InputError) as error:
        Translator.load([tiny_checkpoint, other_tokenizer_checkpoint], device="cpu")
    message = str(error.value)
    assert str(other_tokenizer_checkpoint) in message and str(tiny_checkpoint) in message and "tokenizer" in message
    result = subprocess.run([sys.executable, "-m", "seqtool", "translate", "-c", str(tiny_checkpoint), "-c",
                             str(other_tokenizer_checkpoint), "--device", "cpu"], input=b"a b\n", capture_output=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr.decode().strip().count("\n") == 0 and "tokenizer differs" in result.stderr.decode()
    assert result.stdout == b""


@pytest.mark.system
def test_cli_ensemble_of_a_checkpoint_with_itself_prints_the_same(tiny_checkpoint):
    def run(*checkpoints):
        args = [a for c in checkpoints for a in ("-c", str(c))]
        result = subprocess.run([sys.executable, "-m", "seqtool", "translate", *args, "--beam", "3", "--nbest", "2",
                                 "--max-len-a", "0", "--max-len-b", "6", "--device", "cpu"], input=b"a b c\n\nd e\nf\n", capture_output=True,
                                timeout=120)
        assert result.returncode == 0, result.stderr.decode()
        return result.stdout.decode()

    single = run(tiny_checkpoint)
    assert single.count("\n") == 8
    assert run(tiny_checkpoint, tiny_checkpoint) == single


@pytest.mark.integration
def test_translator_loads_an_ensemble(tiny_checkpoint):
    t = Translator.load([tiny_checkpoint, tiny_checkpoint], beam=2, max_len_a=0.0, max_len_b=6, device="cpu", alignments=True)
    assert isinstance(t.model, Ensemble) and len(t.model.models) == 2
    out = t.translate_chunk(0, ["a b c", ""])
    assert len(out) == 2 and out[0].alignments is not None  # alignments from the first member

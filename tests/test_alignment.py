"""Attention weights and alignments: the real weights of the model, masked where they must be,
alignments that find the mirrored positions of a learnt reversal, pictures with a panel per head."""

import io
import sys

import pytest
import torch

from seqtool.alignment import force_decode, format_alignment, hard_alignment, pairs
from seqtool.config import ConfigError, DecodeConfig, SearchOptions, TranslateConfig, model_config_for
from seqtool.model import MultiHeadAttention
from seqtool.steps import Hypothesis
from seqtool.files import format_translation
from seqtool.translate import Translator

from conftest import seqtool


def _batch():
    g = torch.Generator().manual_seed(3)
    src = torch.randint(4, 40, (2, 7), generator=g)
    src[0, 6] = 3  # EOS
    src[1, 4] = 3
    src[1, 5:] = 0  # row 1: 2 padding positions
    tgt_in = torch.randint(4, 40, (2, 6), generator=g)
    tgt_in[:, 0] = 2  # BOS
    return src, tgt_in


def _record_attention_internals(model):
    """Hooks that keep, per attention module, its projected values and the concatenated heads
    that enter W^O (the attention output before the final projection)."""
    seen, hooks = {}, []
    for name, module in model.named_modules():
        if isinstance(module, MultiHeadAttention):
            proj = module.kv_proj if module.cross else module.qkv_proj

            def keep_v(mod, args, out, name=name, module=module):
                v = out.chunk(2 if module.cross else 3, dim=-1)[-1]  # (B, Tk, D)
                seen.setdefault(name, {})["v"] = module._heads(v)  # (B, H, Tk, K)

            def keep_heads(mod, args, out, name=name):
                seen.setdefault(name, {})["heads"] = args[0]  # (B, T, D)

            hooks += [proj.register_forward_hook(keep_v), module.out_proj.register_forward_hook(keep_heads)]
    return seen, hooks


@pytest.mark.unit
def test_weights_times_values_reproduce_the_fused_attention_of_every_layer(tiny_model):
    src, tgt_in = _batch()
    with torch.no_grad():
        weights = force_decode(tiny_model, src, tgt_in)
        seen, hooks = _record_attention_internals(tiny_model)
        memory, pad = tiny_model.encode(src)  # the fused path translation uses (no need_weights)
        tiny_model.decode_features(tgt_in, memory, pad)
    for h in hooks:
        h.remove()
    named = {f"encoder.{i}.self_attn": w for i, w in enumerate(weights.encoder)}
    named |= {f"decoder.{i}.self_attn": w for i, w in enumerate(weights.decoder)}
    named |= {f"decoder.{i}.cross_attn": w for i, w in enumerate(weights.cross)}
    assert set(named) == set(seen) and len(named) == 6
    for name, w in named.items():
        B, H, T, _ = w.shape
        by_hand = (w @ seen[name]["v"]).transpose(1, 2).reshape(B, T, -1)  # (B, T, D)
        torch.testing.assert_close(by_hand, seen[name]["heads"], rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.unit
def test_masked_positions_get_exactly_zero(tiny_model):
    src, tgt_in = _batch()
    weights = force_decode(tiny_model, src, tgt_in)
    future = torch.ones(6, 6, dtype=torch.bool).triu(1)
    for w in weights.encoder + weights.cross:
        assert torch.all(w[1, :, :, 5:] == 0)  # source padding of row 1
        assert torch.all(w[0] > 0)  # nothing else is masked
    for w in weights.decoder:
        assert torch.all(w[..., future] == 0) and torch.all(w[..., ~future] > 0)
    for w in weights.encoder + weights.decoder + weights.cross:
        torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))


@pytest.mark.unit
def test_hard_alignment_averages_heads_and_never_aligns_eos():
    cross = torch.zeros(2, 3, 4)  # (H, T, S): 2 target tokens + EOS, 3 source tokens + EOS
    cross[0, 0] = torch.tensor([0.6, 0.0, 0.0, 0.4])
    cross[1, 0] = torch.tensor([0.0, 0.5, 0.0, 0.5])  # head 1 alone would say source 1; the mean says 0
    cross[:, 1] = torch.tensor([0.1, 0.0, 0.3, 0.6])  # EOS has the most: the best real token is 2
    cross[:, 2] = torch.tensor([0.0, 1.0, 0.0, 0.0])  # the target EOS row is not aligned
    assert hard_alignment(cross, src_len=3, tgt_len=2) == [(0, 0), (2, 1)]
    assert format_alignment([(0, 0), (2, 1)]) == "0-0 2-1"
    assert hard_alignment(cross, 3, 0) == []


def _forced_alignment(model, src_row, tokens, layer):
    """fairseq's hard alignment of a given output, from a teacher-forced pass over one sentence alone."""
    c = model.config
    n = int((src_row.ne(c.pad_id) & src_row.ne(c.eos_id)).sum())
    with torch.no_grad():
        cross = force_decode(model, src_row[: n + 1][None], torch.tensor([[c.bos_id, *tokens]])).cross[layer][0]
    return hard_alignment(cross, n, len(tokens))


@pytest.mark.unit
@pytest.mark.parametrize("how", ["greedy", "beam", "sampling", "prefix", "greedy prefix", "constraint"])
def test_the_searchs_own_alignments_are_the_forced_pass_of_each_sentence_alone(tiny_model, how):
    """search(align_layer=...) records one layer's attention as it decodes and carries each
    hypothesis's alignment with its beams: every hypothesis's equals the hard alignment of a
    forced pass over its sentence alone (so no batch neighbour, beam reorder or finished
    sentence leaving the batch changes it), for either layer."""
    from seqtool.config import Sampling
    from seqtool.search import search

    g = torch.Generator().manual_seed(5)
    src = torch.randint(4, 40, (4, 9), generator=g)
    for b, n in enumerate([8, 3, 6, 1]):  # n source tokens, EOS, padding
        src[b, n] = 3
        src[b, n + 1 :] = 0
    options = {"greedy": SearchOptions(beam=1, max_len_a=0.0, max_len_b=7), "beam": SearchOptions(beam=3, nbest=3, max_len_a=0.0, max_len_b=7),
               "sampling": SearchOptions(nbest=2, max_len_a=0.0, max_len_b=7, sampling=Sampling(seed=1)),
               "prefix": SearchOptions(beam=2, nbest=2, max_len_a=0.0, max_len_b=7), "greedy prefix": SearchOptions(beam=1, max_len_a=0.0, max_len_b=7),
               "constraint": SearchOptions(beam=2, max_len_a=0.0, max_len_b=7)}[how]
    prefix = torch.tensor([[7, 8]] * 4) if "prefix" in how else None
    constraints = [[[[9, 10]]]] * 4 if how == "constraint" else None
    for layer in range(tiny_model.config.decoder_layers):
        with torch.no_grad():
            found = search(tiny_model, src, options, keys=torch.arange(4), prefix=prefix, constraints=constraints, align_layer=layer)
        assert sum(len(h) for h in found) == 4 * options.nbest
        for b, hyps in enumerate(found):
            for h in hyps:
                assert len(h.alignment) == len(h.tokens) > 0
                assert h.alignment == [i for i, _ in _forced_alignment(tiny_model, src[b], h.tokens, layer)]
        with torch.no_grad():
            plain = search(tiny_model, src, options, keys=torch.arange(4), prefix=prefix, constraints=constraints)
        assert [[(h.tokens, h.score, h.alignment) for h in hyps] for hyps in plain] == \
            [[(h.tokens, h.score, None) for h in hyps] for hyps in found]  # recording changes nothing else


@pytest.mark.unit
def test_alignment_pairs_and_a_layer_the_model_lacks(tiny_checkpoint):
    assert pairs([2, 0, 0]) == [(2, 0), (0, 1), (0, 2)]
    with pytest.raises(ConfigError, match="--alignment-layer 3: the model has layers 1 to 2"):
        Translator.load(tiny_checkpoint, device="cpu", alignments=True, alignment_layer=3)


def _need_weights_calls(monkeypatch):
    calls = []
    forward = MultiHeadAttention.forward

    def spy(self, *args, need_weights=False, **kwargs):
        calls.append(need_weights)
        return forward(self, *args, need_weights=need_weights, **kwargs)

    monkeypatch.setattr(MultiHeadAttention, "forward", spy)
    return calls


@pytest.mark.integration
def test_print_alignment_fields_and_no_cost_when_not_asked(tiny_checkpoint, monkeypatch):
    from seqtool.cache import KVCache

    calls = _need_weights_calls(monkeypatch)
    recorded = []
    record = KVCache.record
    monkeypatch.setattr(KVCache, "record", lambda self, layer: recorded.append(layer) or record(self, layer))
    plain = Translator.load(tiny_checkpoint, beam=2, max_len_a=0.0, max_len_b=6, device="cpu")
    plain.translate(["a b c", "d"])
    assert calls and not any(calls) and not recorded  # search never asks for weights unless alignments are wanted
    t = Translator.load(tiny_checkpoint, beam=2, nbest=2, max_len_a=0.0, max_len_b=6, device="cpu", alignments=True)
    calls.clear()
    results = t.translate_chunk(0, ["a b c", "", "d"])
    assert not any(calls) and recorded == [1]  # no second pass: the search's own weights, the last layer's
    lines = "".join(format_translation(r, TranslateConfig(print_alignment=True), 2) for r in results).splitlines()
    fields = [line.split("\t") for line in lines]
    assert [f[0] for f in fields] == ["0", "0", "1", "1", "2", "2"] and all(len(f) == 4 for f in fields)
    assert fields[2][2:] == ["", ""]  # the empty line
    for r in results:
        for hyp, pairs in zip(r.hypotheses, r.alignments or []):
            src_len = len(t.tokenizer.encode(r.source))
            assert [j for _, j in pairs] == list(range(len(hyp.tokens)))  # one source token per target token
            assert all(0 <= i < src_len for i, _ in pairs)


@pytest.mark.slow
@pytest.mark.system
def test_alignment_of_a_learnt_reversal_finds_the_mirrored_positions(reverse_run):
    """A model trained to reverse sequences writes target token j from source token n-1-j; the
    alignment from the last decoder layer's attention (the documented default) must say so."""
    src, _ = reverse_run.texts["test"]
    src = src[:100]
    out = seqtool("translate", "-c", "run/best.pt", "--beam", "5", "--print-alignment", "--threads", "2",
                  cwd=reverse_run.directory, stdin="\n".join(src) + "\n")
    rows = [line.split("\t") for line in out.stdout.splitlines()]
    assert len(rows) == len(src) and all(len(r) == 4 for r in rows)
    mirrored = total = 0
    for source, (index, _, _, alignment) in zip(src, rows):
        n = len(source.split())  # one token per letter (see the fixture's vocabulary)
        pairs = [tuple(map(int, p.split("-"))) for p in alignment.split()]
        total += len(pairs)
        mirrored += sum(i == n - 1 - j for i, j in pairs)
    assert total >= 0.9 * sum(len(s.split()) for s in src)
    assert mirrored / total >= 0.8, f"only {mirrored / total:.1%} of target tokens aligned to the mirrored source token"


# ---- pictures ------------------------------------------------------------------------------


def _heatmap_panels(fig):
    return [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]


@pytest.mark.integration
def test_png_has_one_panel_per_head_of_each_attention(tiny_checkpoint, tmp_path):
    from matplotlib.image import imread

    from seqtool.plot import show_attention

    out = tmp_path / "attn.png"
    att, fig = show_attention(tiny_checkpoint, "a b c d", DecodeConfig(device="cpu"), SearchOptions(beam=2, max_len_a=0.0, max_len_b=5), output=out)
    assert imread(out).ndim == 3
    panels = _heatmap_panels(fig)
    assert len(panels) == 3 * 4  # encoder self, decoder self, encoder-decoder x 4 heads, last layer
    titles = [ax.get_title() for ax in panels]
    assert titles[0] == "encoder self-attention\nlayer 2, head 1" and titles[-1] == "encoder-decoder attention\nlayer 2, head 4"
    cross = panels[-1]
    assert [t.get_text() for t in cross.get_xticklabels()] == att.source == ["▁a", "▁b", "▁c", "▁d", "</s>"]
    assert [t.get_text() for t in cross.get_yticklabels()] == att.target_out and att.target_out[-1] == "</s>"
    assert len(fig.axes) - len(panels) == 3  # a colour bar per row


@pytest.mark.integration
def test_given_target_all_layers_and_other_formats(tiny_checkpoint, tmp_path):
    from seqtool.plot import show_attention

    config = DecodeConfig(device="cpu")
    att, fig = show_attention(tiny_checkpoint, "a b", config, target="b a", output=tmp_path / "a.svg", all_layers=True)
    assert att.target_in == ["<s>", "▁b", "▁a"] and att.translation == "b a"
    assert len(_heatmap_panels(fig)) == 3 * 2 * 4  # 3 attentions x 2 layers x 4 heads
    assert b"<svg" in (tmp_path / "a.svg").read_bytes()[:500]
    _, fig = show_attention(tiny_checkpoint, "a b", config, target="b a", output=tmp_path / "a.pdf", layer=1)
    assert (tmp_path / "a.pdf").read_bytes().startswith(b"%PDF")
    assert all("layer 1," in ax.get_title() for ax in _heatmap_panels(fig))
    with pytest.raises(ConfigError, match=r"--layer \(encoder\) 3: the model has layers 1 to 2"):
        show_attention(tiny_checkpoint, "a b", config, output=tmp_path / "b.png", layer=3)
    with pytest.raises(ConfigError, match="must end in .png, .svg, .pdf"):
        show_attention(tiny_checkpoint, "a b", config, output=tmp_path / "b.gif")
    assert not (tmp_path / "b.png").exists()


@pytest.mark.integration
def test_terminal_heatmap_shades_follow_the_weights(tiny_checkpoint):
    from rich.console import Console

    from seqtool.plot import SHADES, heatmap_text, show_attention

    buffer = io.StringIO()
    console = Console(file=buffer, width=400, color_system=None)
    att, fig = show_attention(tiny_checkpoint, "a b c", DecodeConfig(device="cpu"), target="c b a", terminal=True, console=console)
    assert fig is None
    text = buffer.getvalue()
    assert "layer 2, mean of 4 heads" in text and "layer 2, head 4" in text
    w = torch.tensor([[0.05, 0.95], [0.5, 0.5]])
    lines = heatmap_text(w, ["x", "</s>"], ["▁a", "b"], "t").plain.splitlines()
    assert lines == ["t", "     ▁ b ", "     a   ", "   x " + SHADES[0] * 2 + SHADES[4] * 2, "</s> " + SHADES[2] * 4]


# ---- command line --------------------------------------------------------------------------


@pytest.mark.integration
def test_without_matplotlib_the_command_says_how_to_install_it(tiny_checkpoint, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from seqtool.cli import app

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    result = CliRunner().invoke(app, ["attention", "a b", "-c", str(tiny_checkpoint), "-o", str(tmp_path / "x.png"), "--device", "cpu"])
    assert result.exit_code == 1
    assert result.output.strip() == "error: drawing attention needs matplotlib: pip install 'seqtool[plot]' (or use --terminal)"
    assert not (tmp_path / "x.png").exists()
    result = CliRunner().invoke(app, ["attention", "a b", "-c", str(tiny_checkpoint), "--terminal", "--device", "cpu"])
    assert result.exit_code == 0 and "mean of 4 heads" in result.stdout


@pytest.mark.unit
def test_attention_options_reach_the_library_call(monkeypatch):
    from pathlib import Path

    from typer.testing import CliRunner

    import seqtool.plot
    from seqtool.cli import app

    seen = {}

    def fake(checkpoint, source, config, search, **options):
        seen.update(checkpoint=checkpoint, source=source, config=config, search=search, **options)
        return None, None

    monkeypatch.setattr(seqtool.plot, "show_attention", fake)
    result = CliRunner().invoke(app, ["attention", "hola mundo", "-c", "m.pt", "--target", "hello world", "--layer", "2",
                                      "--all-layers", "--terminal", "--beam", "3", "--lenpen", "0.5", "--device", "cpu",
                                      "--precision", "bf16", "--threads", "1"])
    assert result.exit_code == 0, result.output
    assert seen["checkpoint"] == Path("m.pt") and seen["source"] == "hola mundo" and seen["target"] == "hello world"
    assert (seen["layer"], seen["all_layers"], seen["terminal"], seen["output"]) == (2, True, True, None)
    c, o = seen["config"], seen["search"]
    assert (o.beam, o.lenpen, c.device, c.precision, c.threads) == (3, 0.5, "cpu", "bf16", 1)


@pytest.mark.integration
def test_attention_without_output_or_terminal_and_a_missing_layer_are_refused(tiny_checkpoint):
    from typer.testing import CliRunner

    from seqtool.cli import app

    result = CliRunner().invoke(app, ["attention", "a b", "-c", str(tiny_checkpoint)])
    assert result.exit_code == 1 and "give --output FILE (.png, .svg or .pdf), --terminal, or both" in result.output
    result = CliRunner().invoke(app, ["translate", "-c", str(tiny_checkpoint), "--print-alignment", "--alignment-layer", "3",
                                      "--device", "cpu"], input="a b\n")
    assert result.exit_code == 1 and result.output.strip() == "error: --alignment-layer 3: the model has layers 1 to 2"


@pytest.mark.parametrize("n, heads, layers", [(8, 4, 1), (60, 4, 1), (200, 4, 1), (200, 16, 6)])
@pytest.mark.unit
def test_a_picture_stays_bounded_and_legible_whatever_the_lengths(n, heads, layers):
    # a 200-token translation once drew 16,428 x 12,433 pixels: the canvas is capped, labels thinned
    from seqtool.alignment import AttentionWeights
    from seqtool.plot import MAX_FIGURE_INCHES, SentenceAttention, draw_figure, selected_layers

    weights = AttentionWeights([torch.rand(1, heads, n, n)] * layers, [torch.rand(1, heads, n, n)] * layers,
                               [torch.rand(1, heads, n, n)] * layers)
    pieces = [f"t{i}" for i in range(n)]
    att = SentenceAttention(pieces, pieces, pieces, "x", weights)
    config = model_config_for("tiny", n_heads=heads, d_model=16 * heads, encoder_layers=layers, decoder_layers=layers)
    fig = draw_figure(att, selected_layers(config, 0, all_layers=True))
    width, height = fig.get_size_inches()
    assert width <= MAX_FIGURE_INCHES[0] + 1e-6 and height <= MAX_FIGURE_INCHES[1] + 1e-6
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels[0] == "t0" and len(labels) <= max(1, (fig.get_size_inches()[0] / heads) / 0.1)  # >= ~0.1 inch each
    if n <= 60:
        assert len(labels) == n  # short sentences: every token labelled

"""The Transformer: masking, padding, cached decoding, attention weights, initialisation."""

import math

import pytest
import torch

from seqtool.config import ModelConfig, model_config_for
from seqtool.training.loss import label_smoothed_nll
from seqtool.cache import KVCache
from seqtool.model import MultiHeadAttention, Transformer, sinusoidal_positions

pytestmark = pytest.mark.unit


def _src_tgt(batch=3, S=7, T=6, vocab=40):
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, vocab, (batch, S), generator=g)
    tgt = torch.randint(4, vocab, (batch, T), generator=g)
    tgt[:, 0] = 2  # BOS
    return src, tgt


def test_no_position_attends_to_a_later_one(tiny_model):
    src, tgt = _src_tgt()
    with torch.no_grad():
        base = tiny_model(src, tgt)
        for t in range(1, tgt.size(1)):
            changed = tgt.clone()
            changed[:, t:] = torch.randint(4, 40, changed[:, t:].shape)
            out = tiny_model(src, changed)
            # positions before t are untouched by what follows them
            torch.testing.assert_close(out[:, :t], base[:, :t], rtol=0, atol=1e-5)


def test_decoder_self_attention_weights_are_zero_on_the_future(tiny_model):
    src, tgt = _src_tgt()
    with torch.no_grad():
        memory, pad = tiny_model.encode(src)
        _, self_w, _ = tiny_model.decode_features(tgt, memory, pad, need_weights=True)
    T = tgt.size(1)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    for w in self_w:
        assert torch.all(w[..., future] == 0)
        torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))


def test_source_padding_changes_nothing(tiny_model):
    src, tgt = _src_tgt(batch=2, S=5)
    padded = torch.cat([src, torch.zeros(2, 4, dtype=torch.long)], dim=1)  # 4 pad positions
    with torch.no_grad():
        a = tiny_model(src, tgt)
        b = tiny_model(padded, tgt)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_target_padding_changes_nothing_for_real_positions(tiny_model):
    src, tgt = _src_tgt(batch=2, T=5)
    padded = torch.cat([tgt, torch.zeros(2, 3, dtype=torch.long)], dim=1)
    with torch.no_grad():
        a = tiny_model(src, tgt)
        b = tiny_model(src, padded)[:, :5]
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_batch_rows_are_independent(tiny_model):
    src, tgt = _src_tgt(batch=3)
    with torch.no_grad():
        together = tiny_model(src, tgt)
        alone = tiny_model(src[1:2], tgt[1:2])
    torch.testing.assert_close(together[1:2], alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pre_norm", [False, True])
def test_cached_decoding_equals_full_forward(pre_norm):
    torch.manual_seed(0)
    model = Transformer(model_config_for("tiny", vocab_size=40, dropout=0.0, pre_norm=pre_norm)).eval()
    src, tgt = _src_tgt()
    src[0, 4:] = 0  # one padded source
    with torch.no_grad():
        full = model(src, tgt).log_softmax(-1)
        memory, pad = model.encode(src)
        cache = model.new_cache(memory, pad)
        steps = [model.decode(tgt[:, t : t + 1], memory, pad, cache) for t in range(tgt.size(1))]
        cached = torch.cat(steps, dim=1).log_softmax(-1)
        # several positions at once on top of a cache (prefix forcing) too
        cache = model.new_cache(memory, pad)
        first = model.decode(tgt[:, :2], memory, pad, cache)
        rest = model.decode(tgt[:, 2:], memory, pad, cache)
    torch.testing.assert_close(cached, full, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(torch.cat([first, rest], 1).log_softmax(-1), full, rtol=1e-4, atol=1e-4)


def test_cache_reorder_moves_rows(tiny_model):
    src, tgt = _src_tgt(batch=3)
    with torch.no_grad():
        memory, pad = tiny_model.encode(src)
        cache = tiny_model.new_cache(memory, pad)
        tiny_model.decode(tgt[:, :3], memory, pad, cache)
        order = torch.tensor([2, 0, 0])
        cache.reorder(order)
        step = tiny_model.decode(tgt[order, 3:4], None, None, cache)
        full = tiny_model(src[order], tgt[order, :4])[:, 3:4]
    torch.testing.assert_close(step, full, rtol=1e-4, atol=1e-4)


def test_reorders_not_yet_applied_compose_and_apply_layer_by_layer(tiny_model):
    """reorder only records its index; two reorders in a row must act as their composition, and
    each layer gathers its rows at its own next step (the cache's lazy reorder)."""
    src, tgt = _src_tgt(batch=3)
    first, second = torch.tensor([2, 0, 1]), torch.tensor([1, 1, 0])
    with torch.no_grad():
        memory, pad = tiny_model.encode(src)
        cache = tiny_model.new_cache(memory, pad)
        cache.reorder(torch.tensor([1, 2, 0]))  # before any step: nothing to gather yet
        assert cache.pending is None
        cache.reorder(torch.tensor([2, 0, 1]))  # ...and back to the original order
        tiny_model.decode(tgt[:, :3], memory, pad, cache)
        cache.reorder(first)
        cache.reorder(second)
        both = first[second]
        assert torch.equal(cache.pending, both) and cache.unsettled == list(range(len(tiny_model.decoder)))
        step = tiny_model.decode(tgt[both, 3:4], None, None, cache)
        assert cache.pending is None and cache.unsettled == []
        full = tiny_model(src[both], tgt[both, :4])[:, 3:4]
    torch.testing.assert_close(step, full, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("grow", [1, 32])
def test_grouped_cache_reorders_drops_and_splits_like_the_full_forward(tiny_model, monkeypatch, grow):
    """Beams of a sentence share one copy of the encoder's keys/values (group 2). Turning one row
    per sentence into two (beam search's first step), swapping beams, dropping a sentence, and
    splitting a sentence's rows (the cache falls back to one copy per row) must all leave every
    row's next-token logits equal to a full forward of its history; GROW=1 makes the
    self-attention buffers grow at every step."""
    monkeypatch.setattr(KVCache, "GROW", grow)
    src, _ = _src_tgt(batch=3)
    src[1, 5:] = 0  # padded sources: the cache's padding bias must follow the sentences as they move
    src[2, 3:] = 0
    G = 2
    g = torch.Generator().manual_seed(3)
    rows_src = src  # (3, S): row r decodes sentence r, then after the regroup row r decodes r // G
    history = torch.full((3, 1), 2, dtype=torch.long)  # BOS
    reorders = [(torch.tensor([0, 0, 1, 1, 2, 2]), True, G, G),  # one row per sentence becomes G
                (torch.tensor([1, 0, 3, 2, 5, 4]), False, None, G),  # beams swap parents within each sentence
                (torch.tensor([0, 0, 4, 5]), True, None, G),  # sentence 1 leaves; one beam of sentence 0 copied
                (torch.tensor([1, 2, 3]), True, None, 1),  # sentence 0 keeps one row of its two: groups split
                (torch.tensor([2, 0]), True, None, 1)]
    with torch.no_grad():
        memory, pad = tiny_model.encode(src)
        cache = tiny_model.new_cache(memory, pad, group=1)
        for index, cross, group, expected_group in reorders + [(None,) * 4]:
            step = tiny_model.decode(history[:, -1:], None, None, cache)[:, 0]  # (rows, V)
            full = tiny_model(rows_src, history)[:, -1]
            torch.testing.assert_close(step, full, rtol=1e-4, atol=1e-4)
            if index is None:
                break
            history = torch.cat([history, torch.randint(4, 40, (history.size(0), 1), generator=g)], 1)[index]
            rows_src = rows_src[index]
            cache.reorder(index, cross, group)
            assert cache.group == expected_group
            assert len(cache.cross_k[0]) == len(index) // expected_group  # one copy per group of rows


def test_need_weights_path_gives_the_fused_output():
    torch.manual_seed(0)
    attn = MultiHeadAttention(32, 4, 0.0, cross=True).eval()
    x, memory = torch.randn(2, 5, 32), torch.randn(2, 7, 32)
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[1, 4:] = True
    fused, none = attn(x, memory, key_pad=pad)
    explicit, weights = attn(x, memory, key_pad=pad, need_weights=True)
    assert none is None
    torch.testing.assert_close(fused, explicit, rtol=1e-5, atol=1e-5)
    assert torch.all(weights[1, :, :, 4:] == 0)  # padding gets exactly zero weight
    # the weights are softmax(QK^T/sqrt(d_k)): recompute by hand
    q = attn.q_proj(x).view(2, 5, 4, 8).transpose(1, 2)
    k, v = attn.project_kv(memory)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(8)
    scores = scores.masked_fill(pad[:, None, None, :], float("-inf"))
    torch.testing.assert_close(weights, scores.softmax(-1), rtol=1e-5, atol=1e-6)
    by_hand = (weights @ v).transpose(1, 2).reshape(2, 5, 32)
    torch.testing.assert_close(attn.out_proj(by_hand), fused, rtol=1e-5, atol=1e-5)


def test_first_loss_is_close_to_ln_vocab():
    torch.manual_seed(0)
    V = 1000
    model = Transformer(model_config_for("tiny", vocab_size=V, dropout=0.0)).eval()
    src = torch.randint(4, V, (8, 12))
    tgt_in = torch.randint(4, V, (8, 10))
    tgt_out = torch.randint(4, V, (8, 10))
    with torch.no_grad():
        memory, pad = model.encode(src)
        feats = model.decode_features(tgt_in, memory, pad)
        loss, nll, n = label_smoothed_nll(feats, model.output, tgt_out, 0, 0.0)
    assert abs(float(nll) / n - math.log(V)) < 0.15 * math.log(V)


def test_embeddings_are_tied_and_scaled():
    model = Transformer(model_config_for("tiny", vocab_size=40))
    assert model.output.weight is model.embed.weight is model.tgt_embed.weight
    assert torch.all(model.embed.weight[0] == 0)  # padding row
    std = model.embed.weight[4:].std().item()
    assert abs(std - 128 ** -0.5) < 0.2 * 128 ** -0.5


def test_sinusoidal_positions_follow_the_paper():
    pe = sinusoidal_positions(50, 16)
    pos, i = 7, 3
    assert pe[pos, 2 * i].item() == pytest.approx(math.sin(pos / 10000 ** (2 * i / 16)), abs=1e-6)
    assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(pos / 10000 ** (2 * i / 16)), abs=1e-6)


def test_presets_match_the_paper():
    base = model_config_for("base")
    assert (base.d_model, base.n_heads, base.d_ff, base.encoder_layers) == (512, 8, 2048, 6)
    big = model_config_for("big")
    assert (big.d_model, big.n_heads, big.d_ff) == (1024, 16, 4096)
    with pytest.raises(ValueError):
        ModelConfig(d_model=100, n_heads=3)


def test_too_long_input_is_refused_clearly(tiny_model):
    with pytest.raises(ValueError, match="max_positions"):
        tiny_model.encode(torch.randint(4, 40, (1, 65)))


def test_bf16_autocast_runs_on_cpu(tiny_model):
    src, tgt = _src_tgt()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = tiny_model(src, tgt)
    assert torch.isfinite(out.float()).all()
    full = tiny_model(src, tgt).detach()
    assert (out.float().argmax(-1) == full.argmax(-1)).float().mean() > 0.8


# ---- bf16 training on CPU: dropout masks, attention path, loss over bf16 logits -------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dropout_mask_drops_p_and_keeps_the_expectation_in_any_dtype(dtype):
    from seqtool.kernels import _keep_mask

    torch.manual_seed(0)
    mask = _keep_mask(torch.empty(400_000, dtype=dtype), 0.1)
    assert mask.dtype == dtype
    dropped = (mask == 0).float().mean().item()
    assert dropped == pytest.approx(0.1, abs=0.003)  # a bf16 torch.rand drops ~10.2%
    values = mask.unique().float().tolist()
    assert len(values) == 2 and values[0] == 0.0 and values[1] == pytest.approx(1 / 0.9, rel=4e-3)
    assert mask.float().mean().item() == pytest.approx(1.0, abs=0.005)


@pytest.mark.parametrize("causal, cross", [(True, False), (False, False), (False, True)])
def test_bf16_training_attention_matches_the_fused_kernel(causal, cross):
    # bf16 training on CPU takes the explicit matmul path (faster there); it must compute what SDPA does
    torch.manual_seed(0)
    attn = MultiHeadAttention(32, 4, dropout=0.0, cross=cross).to(torch.bfloat16)
    x = torch.randn(3, 5, 32, dtype=torch.bfloat16)
    memory = torch.randn(3, 7, 32, dtype=torch.bfloat16)
    key_pad = torch.zeros(3, 7 if cross else 5, dtype=torch.bool)
    key_pad[1, -2:] = True
    kwargs = dict(memory=memory) if cross else dict(causal=causal)
    attn.train()
    explicit, _ = attn(x, key_pad=key_pad, **kwargs)
    attn.eval()
    fused, _ = attn(x, key_pad=key_pad, **kwargs)
    assert explicit.dtype == torch.bfloat16
    torch.testing.assert_close(explicit.float(), fused.float(), atol=2e-2, rtol=2e-2)

"""The `seqtool attention` command: the attention of one sentence, as pictures.

Owns turning a sentence into labelled attention maps (tokenize; translate with the same search
as `translate`, or take the given target; one forced pass through attention.force_decode) and
drawing them: a matplotlib figure with one panel per head (PNG, SVG or PDF), or a compact rich
heatmap of encoder-decoder attention in the terminal. matplotlib is an optional extra
(`pip install 'seqtool[plot]'`), imported only to draw a file.

Axes: encoder self-attention is source x source; decoder self-attention is `<s> y1 .. yn`
(what the decoder reads) on both axes; encoder-decoder attention has the token being written
(`y1 .. yn </s>`) on the rows and the source on the columns. Rows attend to columns.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from . import log
from .alignment import AttentionWeights, force_decode, resolve_layer
from .errors import ConfigError
from .config import DecodeConfig, ModelConfig, SearchOptions
from .search import search
from .errors import InputError
from .textio import atomic_write
from .translate import Translator

FORMATS = (".png", ".svg", ".pdf")
SHADES = " ░▒▓█"  # terminal cells: weight 0-0.2, 0.2-0.4, ..., 0.8-1


@dataclass
class SentenceAttention:
    source: list[str]  # source pieces + "</s>"
    target_in: list[str]  # "<s>" + target pieces: the decoder's input
    target_out: list[str]  # target pieces + "</s>": the tokens written
    translation: str  # the target as text (the best hypothesis, or the given target)
    weights: AttentionWeights  # per layer, batch of one

    def maps(self, kind: str, layer: int) -> tuple[torch.Tensor, list[str], list[str]]:
        """(H, rows, columns) weights of one attention, with row and column labels."""
        if kind == "encoder":
            return self.weights.encoder[layer][0], self.source, self.source
        if kind == "decoder":
            return self.weights.decoder[layer][0], self.target_in, self.target_in
        return self.weights.cross[layer][0], self.target_out, self.source


KINDS = {"encoder": "encoder self-attention", "decoder": "decoder self-attention", "cross": "encoder-decoder attention"}


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ConfigError("drawing attention needs matplotlib: pip install 'seqtool[plot]' (or use --terminal)") from None


def sentence_attention(translator, source: str, target: Optional[str] = None) -> SentenceAttention:
    """Translate `source` with the search `translate` uses (or take `target`) and fetch every weight."""
    model, tokenizer, c = translator.model, translator.tokenizer, translator.model.config
    src_ids = translator.encode(0, [source])[0]  # cropped to the model's positions, with a warning; a tag first
    if len(src_ids) == (translator.tag is not None):
        raise InputError("the source sentence is empty: nothing to attend to")
    if target is not None:
        tgt_ids = tokenizer.encode_batch([target], "target")[0]
        if len(tgt_ids) + 1 > c.max_positions:
            raise InputError(f"--target has {len(tgt_ids)} tokens; this model takes at most {c.max_positions - 1}")
    src = translator.source_tensor([src_ids])  # (1, S)
    with torch.inference_mode():  # Translator.load already put the model in its decoding precision
        if target is None:
            tgt_ids = search(model, src, translator.options)[0][0].tokens  # the best
        tgt_in = torch.tensor([[c.bos_id] + tgt_ids], device=translator.device)  # (1, T)
        weights = force_decode(model, src, tgt_in)
    pieces = [tokenizer.id_to_piece(i) for i in tgt_ids]
    return SentenceAttention([translator.piece(i) for i in src_ids] + ["</s>"], ["<s>"] + pieces, pieces + ["</s>"],
                             target if target is not None else tokenizer.decode(tgt_ids),
                             AttentionWeights(*([w.cpu() for w in ws] for ws in (weights.encoder, weights.decoder, weights.cross))))


def selected_layers(config: ModelConfig, layer: int, all_layers: bool) -> dict[str, list[int]]:
    """0-based layers to show per kind: all, or the 1-based `layer` (0 = last) of each stack."""
    out = {}
    for kind, name, n in (("encoder", "encoder", config.encoder_layers), ("decoder", "decoder", config.decoder_layers),
                          ("cross", "decoder", config.decoder_layers)):
        out[kind] = list(range(n)) if all_layers else [resolve_layer(layer, n, f"--layer ({name})")]
    return out


def draw_figure(att: SentenceAttention, layers: dict[str, list[int]]):
    """A matplotlib Figure: one row per (kind, layer), one panel per head, a colour bar per row."""
    require_matplotlib()
    from matplotlib.figure import Figure

    rows = [(kind, layer) for kind in KINDS for layer in layers[kind]]
    H = att.weights.cross[0].size(1)
    n = max(len(att.source), len(att.target_in))
    side, step = panel_layout(n, H, len(rows))
    fontsize = 8 if n <= 30 else 7
    fig = Figure(figsize=(side * H + 1.0, (side + 0.5) * len(rows)), layout="constrained")
    axes = fig.subplots(len(rows), H, squeeze=False)
    for r, (kind, layer) in enumerate(rows):
        weights, row_labels, col_labels = att.maps(kind, layer)  # (H, rows, columns)
        for h in range(H):
            ax = axes[r, h]
            image = ax.imshow(weights[h].numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
            ax.set_title(f"{KINDS[kind]}\nlayer {layer + 1}, head {h + 1}", fontsize=fontsize + 1)
            ax.set_xticks(range(0, len(col_labels), step), col_labels[::step], rotation=90, fontsize=fontsize)
            ax.set_yticks(range(0, len(row_labels), step), row_labels[::step], fontsize=fontsize)
        fig.colorbar(image, ax=list(axes[r]), label="attention weight", shrink=0.9)
    return fig


INCH_PER_TOKEN = 0.13  # a 7 pt label needs ~0.1 inch; at 150 dpi ~15 pixels
MAX_FIGURE_INCHES = (40.0, 40.0)  # width, height: at most 6,000 x 6,000 pixels at 150 dpi, whatever the lengths


def panel_layout(n: int, heads: int, rows: int) -> tuple[float, int]:
    """(inches per panel side, label every step-th token). Panels grow with the sentence so that its
    tokens keep legible labels, until the figure reaches MAX_FIGURE_INCHES; past that the panels stay
    that size and only every step-th token is labelled (a 200-token translation once drew 16,428 x
    12,433 pixels)."""
    cap = min((MAX_FIGURE_INCHES[0] - 1.0) / heads, MAX_FIGURE_INCHES[1] / rows - 0.5)
    side = max(1.0, min(max(2.4, INCH_PER_TOKEN * n + 1.0), cap))
    fits = max(1, int((side - 1.0) / INCH_PER_TOKEN))  # labels that fit along one side
    return side, -(-n // fits)


def save_figure(fig, path: Path) -> None:
    fmt = path.suffix.lower().lstrip(".")
    atomic_write(path, lambda handle: fig.savefig(handle, format=fmt, dpi=150))


def render_terminal(att: SentenceAttention, layers: list[int]):
    """Encoder-decoder attention as text: per layer, the heads' mean (what --print-alignment uses)
    and each head, side by side where they fit. Cells are shade characters (readable without
    colour) coloured by weight where the terminal has colour."""
    from rich.columns import Columns
    from rich.console import Group
    from rich.text import Text

    blocks = []
    for layer in layers:
        weights, rows, cols = att.maps("cross", layer)  # (H, T, S)
        panels = [heatmap_text(weights.mean(0), rows, cols, f"layer {layer + 1}, mean of {weights.size(0)} heads")]
        panels += [heatmap_text(weights[h], rows, cols, f"layer {layer + 1}, head {h + 1}") for h in range(weights.size(0))]
        blocks.append(Text(f"encoder-decoder attention, layer {layer + 1} (rows: target written, columns: source)", style="bold"))
        blocks.append(Columns(panels, padding=(1, 3)))
    return Group(*blocks)


def heatmap_text(weights: torch.Tensor, rows: list[str], cols: list[str], title: str):
    """(rows, cols) weights -> a Text block: a title, column labels written downwards, one line per row."""
    from rich.text import Text

    width = max(len(label) for label in rows)
    depth = max(len(label) for label in cols)
    text = Text(no_wrap=True)
    text.append(title + "\n", style="italic")
    for d in range(depth):  # the source tokens, one character per line, two cells per column
        text.append(" " * (width + 1) + "".join(f"{label[d] if d < len(label) else ' ':<2}" for label in cols) + "\n")
    for r, label in enumerate(rows):
        text.append(f"{label:>{width}} ")
        for w in weights[r].tolist():
            level = min(len(SHADES) - 1, int(w * len(SHADES)))
            shade = int(255 * (1 - w))
            text.append(SHADES[level] * 2, style=f"rgb({shade},{shade},255)")
        if r < len(rows) - 1:
            text.append("\n")
    return text


def show_attention(checkpoint: Path, source: str, config: DecodeConfig, options: Optional[SearchOptions] = None, *,
                   target: Optional[str] = None,
                   output: Optional[Path] = None, layer: int = 0, all_layers: bool = False, terminal: bool = False,
                   console=None, tgt_lang: str = ""):
    """The `seqtool attention` command. Returns (SentenceAttention, the matplotlib Figure or None)."""
    if output is None and not terminal:
        raise ConfigError("give --output FILE (.png, .svg or .pdf), --terminal, or both")
    if output is not None:
        if output.suffix.lower() not in FORMATS:
            raise ConfigError(f"{output}: the picture's name must end in {', '.join(FORMATS)}")
        require_matplotlib()  # before the model is loaded: fail fast
    translator = Translator.load(checkpoint, config, options, tgt_lang=tgt_lang, need_target=True)  # (a multilingual model: the tag that leads the source)
    layers = selected_layers(translator.model.config, layer, all_layers)  # before the work
    att = sentence_attention(translator, source, target)
    log.info(f"{'target' if target is not None else 'translation'}: {att.translation}")
    fig = None
    if output is not None:
        fig = draw_figure(att, layers)
        save_figure(fig, output)
    if terminal:
        from rich.console import Console

        (console or Console(highlight=False)).print(render_terminal(att, layers["cross"]))
    return att, fig

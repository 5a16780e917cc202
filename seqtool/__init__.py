"""seqtool: train Transformer translation models on parallel text, translate, and score."""

__version__ = "0.1.0"

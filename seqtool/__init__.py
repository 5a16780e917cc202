"""seqtool: train Transformer translation models on parallel text, translate, and score.

For programs that embed seqtool: ``from seqtool import Translator`` (see translate.py). The
import is lazy, so ``import seqtool`` (and ``seqtool --help``) does not load torch.
"""

__version__ = "0.1.0"

__all__ = ["DecodeConfig", "Translator"]


def __getattr__(name: str):
    if name == "Translator":
        from .translate import Translator

        return Translator
    if name == "DecodeConfig":
        from .config import DecodeConfig

        return DecodeConfig
    raise AttributeError(f"module 'seqtool' has no attribute {name!r}")

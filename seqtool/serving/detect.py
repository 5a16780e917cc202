"""Which of the model's source languages a text is in: LibreTranslate's `source: "auto"` and /detect.

The detector is lingua's (`pip install 'seqtool[serve]'` has it), restricted to the languages the
model translates from: a choice among two or three languages is what the server has to make, and
restricting the candidates is what keeps short texts right (LibreTranslate #508 took Italian for
English at 96% among all languages). Chosen by measurement against py3langid on the bundled
languages' test lines, short (at most 5 words) and long (bench/detect.py, bench/results.md). Its
models ship inside the wheel: nothing is downloaded, ever. Loaded once, when the server loads
its model (a few seconds per language), not at the first request.

Confidence is LibreTranslate's: a percentage, the best candidate first.
"""

from __future__ import annotations

from typing import Sequence

from ..errors import ConfigError


class Detector:
    def __init__(self, codes: Sequence[str]):
        try:
            from lingua import IsoCode639_1, IsoCode639_3, Language, LanguageDetectorBuilder
        except ImportError:
            raise ConfigError("source \"auto\" needs the lingua package: pip install 'seqtool[serve]'") from None
        self.codes = tuple(codes)
        languages = {}
        for code in self.codes:
            base = code.split("_")[0].upper()
            try:
                iso = getattr(IsoCode639_1, base) if len(base) == 2 else getattr(IsoCode639_3, base)
                languages[Language.from_iso_code_639_1(iso) if len(base) == 2 else Language.from_iso_code_639_3(iso)] = code
            except (AttributeError, ValueError):
                continue  # a code the detector does not know is never detected
        self.by_language = languages
        self.detector = None
        if len(languages) >= 2:
            self.detector = LanguageDetectorBuilder.from_languages(*languages).with_preloaded_language_models().build()

    def detect(self, text: str) -> list[dict]:
        """[{"language": code, "confidence": percent}, ...], best first; one language: it, at 100."""
        if self.detector is None:
            only = next(iter(self.by_language.values()), self.codes[0] if self.codes else "")
            return [{"language": only, "confidence": 100.0}]
        values = self.detector.compute_language_confidence_values(text)
        out = [{"language": self.by_language[v.language], "confidence": round(100.0 * v.value, 1)} for v in values
               if v.language in self.by_language]
        if not out or out[0]["confidence"] == 0:  # nothing to go by (digits, punctuation): the first source
            return [{"language": self.codes[0], "confidence": 0.0}]
        return out

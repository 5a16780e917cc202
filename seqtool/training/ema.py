"""An exponential moving average of the weights, offered as best.pt at the end of a run.

    shadow <- d x shadow + (1 - d) x weights      after every update, d = min(decay, (1 + n) / (10 + n))

(the warm-up of d, n the updates averaged so far, keeps the first updates' random weights from
dominating a short run's average; as in TensorFlow's ExponentialMovingAverage). The average is
float32 whatever the training precision, lives beside the optimizer state in last.pt (so a
resumed run continues it exactly) and costs one fused lerp over the parameters per update. At the
end of a run the trainer validates it; it becomes best.pt only when validation says it is better.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Sequence

import torch
from torch import Tensor


class EMA:
    def __init__(self, params: Sequence[Tensor], decay: float):
        self.params = list(params)
        self._values = [p.detach() for p in self.params]  # views of the live weights, made once
        self.decay = decay
        self.updates = 0
        self.shadow = [p.detach().float().clone() for p in self.params]

    @torch.no_grad()
    def update(self) -> None:
        self.updates += 1
        d = min(self.decay, (1 + self.updates) / (10 + self.updates))
        torch._foreach_lerp_(self.shadow, self._values, 1.0 - d)

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        """The model's parameters hold the average inside the block, their own values after it."""
        saved = [p.detach().clone() for p in self.params]
        with torch.no_grad():
            for p, s in zip(self.params, self.shadow):
                p.copy_(s)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, s in zip(self.params, saved):
                    p.copy_(s)

    def state_dict(self) -> dict[str, Any]:
        return {"decay": self.decay, "updates": self.updates, "shadow": [s.clone() for s in self.shadow]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if len(state["shadow"]) != len(self.shadow):
            raise ValueError(f"the saved average has {len(state['shadow'])} tensors, the model {len(self.shadow)}")
        self.updates = int(state["updates"])
        for s, saved in zip(self.shadow, state["shadow"]):
            s.copy_(saved)

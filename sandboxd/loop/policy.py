"""The policy: next-token logits = A[task, position] + C[previous token,
position] (a factorised table, small enough to learn in CPU minutes), trained
with GRPO (group-normalised advantages from the queue) and a truncated
importance weight for off-policy samples. Two implementations of the same
model and update: PyTorch (GPU when present) and numpy (when torch is absent).
Generators sample from exported numpy weights of a published version."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from sandboxd.loop.tasks import BOS, EOS, MAX_TOKENS, TARGETS, VOCAB

V = len(VOCAB)
MAX_IMPORTANCE_WEIGHT = 2.0


@dataclass(frozen=True)
class Sample:
    """One trajectory for the update: task index, tokens, behaviour log-probs, advantage."""

    task: int
    tokens: list[int]
    logprobs: list[float]
    advantage: float


@dataclass(frozen=True)
class Weights:
    """One policy version's parameters as plain numpy arrays: all a generator needs, no torch."""

    a: np.ndarray[Any, np.dtype[np.float64]]
    c: np.ndarray[Any, np.dtype[np.float64]]

    def logits(self, task: int, pos: int, prev: int) -> np.ndarray[Any, np.dtype[np.float64]]:
        """Next-token logits for ``task`` at ``pos``, after token ``prev`` (BOS at the start)."""
        out: np.ndarray[Any, np.dtype[np.float64]] = self.a[task, pos] + self.c[prev, pos]
        return out

    def sample(self, task: int, rng: np.random.Generator) -> tuple[list[int], list[float]]:
        """One completion (to EOS, included, or MAX_TOKENS) with each token's log-prob under these weights."""
        tokens: list[int] = []
        logprobs: list[float] = []
        prev = BOS
        for pos in range(MAX_TOKENS):
            z = self.logits(task, pos, prev)
            p = np.exp(z - z.max())
            p /= p.sum()
            tok = int(rng.choice(V, p=p))
            tokens.append(tok)
            logprobs.append(float(math.log(p[tok] + 1e-12)))
            if tok == EOS:
                break
            prev = tok
        return tokens, logprobs


class Policy(Protocol):
    """What the trainer needs of a policy: weights to publish and an update step."""

    implementation: str

    def export(self) -> Weights:
        """A copy of the current weights; later updates do not change it."""
        ...

    def update(self, samples: list[Sample]) -> float:
        """One optimiser step on the samples; returns the loss."""
        ...


def _shapes() -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    return (len(TARGETS), MAX_TOKENS, V), (V + 1, MAX_TOKENS, V)


class NumpyPolicy:
    """The policy in numpy with a hand-written Adam, for hosts without torch."""

    implementation = "numpy"

    def __init__(self, lr: float = 0.1, seed: int = 0) -> None:
        sa, sc = _shapes()
        rng = np.random.default_rng(seed)
        self.params = [rng.normal(0, 0.01, sa), rng.normal(0, 0.01, sc)]
        self.m = [np.zeros(sa), np.zeros(sc)]
        self.v = [np.zeros(sa), np.zeros(sc)]
        self.t = 0
        self.lr = lr

    def export(self) -> Weights:
        """A copy of the parameters; later updates do not change it."""
        return Weights(self.params[0].copy(), self.params[1].copy())

    def update(self, samples: list[Sample]) -> float:
        """One Adam step on -mean(w * A * log p); returns the loss."""
        a, c = self.params
        ga, gc = np.zeros_like(a), np.zeros_like(c)
        n = max(1, sum(len(s.tokens) for s in samples))
        loss = 0.0
        for s in samples:
            prev = BOS
            for pos, (tok, old) in enumerate(zip(s.tokens, s.logprobs, strict=True)):
                z = a[s.task, pos] + c[prev, pos]
                p = np.exp(z - z.max())
                p /= p.sum()
                logp = math.log(p[tok] + 1e-12)
                w = min(MAX_IMPORTANCE_WEIGHT, math.exp(logp - old))
                grad = -p * (w * s.advantage / n)
                grad[tok] += w * s.advantage / n
                ga[s.task, pos] -= grad
                gc[prev, pos] -= grad
                loss -= w * s.advantage * logp / n
                prev = tok
        self.t += 1
        for i, g in enumerate((ga, gc)):
            self.m[i] = 0.9 * self.m[i] + 0.1 * g
            self.v[i] = 0.999 * self.v[i] + 0.001 * g * g
            mh = self.m[i] / (1 - 0.9**self.t)
            vh = self.v[i] / (1 - 0.999**self.t)
            self.params[i] -= self.lr * mh / (np.sqrt(vh) + 1e-8)
        return loss


class TorchPolicy:
    """The same model and update in PyTorch, on the GPU when one is present."""

    implementation = "torch"

    def __init__(self, lr: float = 0.1, seed: int = 0, device: str | None = None) -> None:
        import torch

        self.torch = torch
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.implementation = f"torch ({self.device})"
        sa, sc = _shapes()
        g = torch.Generator().manual_seed(seed)
        self.a = torch.nn.Parameter((torch.randn(sa, generator=g) * 0.01).to(self.device))
        self.c = torch.nn.Parameter((torch.randn(sc, generator=g) * 0.01).to(self.device))
        self.opt = torch.optim.Adam([self.a, self.c], lr=lr)

    def export(self) -> Weights:
        """The parameters copied to the host as float64 numpy; later updates do not change them."""
        return Weights(
            self.a.detach().cpu().double().numpy().copy(), self.c.detach().cpu().double().numpy().copy()
        )

    def update(self, samples: list[Sample]) -> float:
        """One Adam step on NumpyPolicy's loss, every token in one batch; returns it (0, no step, if none)."""
        torch = self.torch
        tasks, positions, prevs, toks, olds, advs = [], [], [], [], [], []
        for s in samples:
            prev = BOS
            for pos, (tok, old) in enumerate(zip(s.tokens, s.logprobs, strict=True)):
                tasks.append(s.task)
                positions.append(pos)
                prevs.append(prev)
                toks.append(tok)
                olds.append(old)
                advs.append(s.advantage)
                prev = tok
        if not toks:
            return 0.0

        def t(x: list[Any], dtype: Any) -> Any:
            return torch.tensor(x, dtype=dtype, device=self.device)

        ti, pi, vi, ki = (t(x, torch.long) for x in (tasks, positions, prevs, toks))
        old, adv = t(olds, torch.float32), t(advs, torch.float32)
        logits = self.a[ti, pi] + self.c[vi, pi]
        logp = torch.log_softmax(logits, dim=-1).gather(1, ki[:, None])[:, 0]
        w = torch.exp(logp.detach() - old).clamp(max=MAX_IMPORTANCE_WEIGHT)
        loss = -(w * adv * logp).sum() / len(toks)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return float(loss.item())


def torch_available() -> bool:
    """Whether torch imports here; a broken install (a bad CUDA one, say) counts as absent."""
    try:
        import torch  # noqa: F401
    except Exception:  # ImportError, or a broken CUDA install
        return False
    return True


def make_policy(kind: str = "auto", *, lr: float = 0.1, seed: int = 0) -> Policy:
    """``kind``: "torch", "numpy", or "auto" (torch when it imports)."""
    if kind == "torch" or (kind == "auto" and torch_available()):
        return TorchPolicy(lr=lr, seed=seed)
    if kind not in ("auto", "numpy"):
        raise ValueError(f"unknown policy implementation {kind!r} (torch, numpy or auto)")
    return NumpyPolicy(lr=lr, seed=seed)

"""Speculative decoding on the roofline: the verify step, the draft's steps and rejection sampling, timed per
batch (``roofline explain --spec K --acceptance A``, ``roofline.explain.spec_curve``).

One round of speculation, per batch of B sequences at context C:

* the draft proposes K tokens per sequence (``draft``): a draft model's K decode steps (``"model"``), the
  model's own multi-token-prediction layer run K times (``"mtp"``: DeepSeek-V3's and GLM-4.5's
  ``num_nextn_predict_layers``), or nothing costed (``"none"``: an n-gram / prompt-lookup draft);
* one verify step of the target (``verify_step``): every sequence brings K + 1 query tokens over its context,
  a continuous-batching step (``workload.mixed``) of B chunks of K + 1 tokens after C cached ones, so every
  linear runs on (K + 1) x B rows (its weights read once) and attention is each chunk's K + 1 queries over its
  prefix, causal among themselves (``formulas.prefill_attention``); logits at all K + 1 positions;
* rejection sampling over the vocabulary (``formulas.rejection_sampling``).

The round yields ``formulas.expected_tokens(a, K)`` tokens per sequence. Every step is timed at its roof,
max(FLOPs / peak, bytes / bandwidth) per op, summed (``roofline.bounds.analyze_phase``, as ``explain`` times a
step). Assumed: the draft's i-th step is at context C + i (one new token per sequence; the catch-up on
accepted tokens an engine folds into its first draft step is NB: not counted), and every step of a round sits at
the round's context C (the cache grows by the accepted tokens between rounds, not within one).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from . import formulas as F
from . import workload as W
from .bounds import analyze_phase, roof_for
from .cost import ZERO, Cost
from .errors import RooflineError
from .models import ModelConfig

DRAFTS = ("none", "model", "mtp")


@dataclass(frozen=True)
class Speculation:
    """K drafts per verify step, each accepted with probability ``acceptance`` (independently), from ``draft``
    (one of ``DRAFTS``; ``draft_model`` for "model")."""

    k: int
    acceptance: float
    draft: str = "none"
    draft_model: ModelConfig | None = None

    def __post_init__(self):
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise RooflineError(f"--spec (draft tokens per verify step) must be a whole number of at least 1, not "
                                f"{self.k!r}: e.g. --spec 3.")
        a = self.acceptance
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0 <= a < 1:
            raise RooflineError(f"--acceptance must be a number from 0 up to (not including) 1, not {a!r}: the "
                                "probability that the target accepts one draft token, e.g. --acceptance 0.8.")
        if self.draft not in DRAFTS:
            raise RooflineError(f"the draft must be one of {', '.join(DRAFTS)}, not {self.draft!r}.")
        if (self.draft == "model") != (self.draft_model is not None):
            raise RooflineError("a draft model goes with draft \"model\" only: give --draft MODEL, or --mtp, or "
                                "neither.")

    @property
    def tokens_per_step(self) -> float:
        """Expected tokens per sequence per verify step (``formulas.expected_tokens``)."""
        return F.expected_tokens(self.acceptance, self.k)

    @property
    def said(self) -> str:
        """The draft in words."""
        if self.draft == "model":
            return (f"a draft model ({self.draft_model.name}: {self.k} decode steps per round, at its checkpoint's "
                    "precision, else bf16)")
        if self.draft == "mtp":
            return f"the model's multi-token-prediction layer ({self.k} steps per round)"
        return "a draft not costed (an n-gram or prompt-lookup draft)"


def verify_step(model: ModelConfig, batch: int, context: int, k: int, **options) -> W.Phase:
    """The target's verify step: ``batch`` sequences, each K + 1 query tokens after ``context`` cached ones
    (``workload.mixed`` with ``batch`` chunks of (K + 1, context)), logits at every position; ``options`` as
    ``workload.mixed``'s (dtypes, precision, tp)."""
    return W.mixed(model, chunks=((k + 1, context),) * batch, logits=(k + 1) * batch, **options)


def verify_notes(model: ModelConfig) -> tuple:
    """What the verify step's cost assumes for ``model`` beyond the module docstring, in sentences."""
    out = []
    if model.mla:
        out.append("latent attention's verify step is costed as a prefill chunk (the cached latents up-projected "
                   "per sequence, formulas.mla_prefill_attention), not as an absorbed multi-query decode (FlashMLA): "
                   "an upper bound on its attention")
    if model.n_experts:
        out.append("a verify step routes (K + 1) x batch tokens, so it touches more distinct experts than a decode "
                   "step of the batch (uniform routing unless --expert-load): below the batch from which every "
                   "expert is loaded, its expert bytes grow with K")
    return tuple(out)


def mtp_layer(model: ModelConfig) -> ModelConfig:
    """The multi-token-prediction module's decoder layer as a one-layer model: the same attention and, in a
    mixture of experts, the same MoE block as the main layers (DeepSeek-V3's and GLM-4.5's MTP layer is a routed
    layer), with the shared embedding and output head around it. Refused for a model without MTP layers."""
    if not model.mtp_layers:
        raise RooflineError(f"--mtp needs multi-token-prediction layers, but {model.name} has none "
                            "(num_nextn_predict_layers = 0): give --draft MODEL instead, or neither for a draft "
                            "that is not costed.")
    one = model.with_layers(1)
    return replace(one, dense_layers=(), mtp_layers=0, name=f"{model.name} MTP layer")


def mtp_projections(batch: int, hidden: int, act_dtype: str = "bf16") -> tuple:
    """The MTP module's own ops around its decoder layer, per draft step: RMSNorm of the token's embedding
    (enorm) and of the previous hidden state (hnorm), and eh_proj, a linear [2H -> H] on their concatenation
    (its weight taken in the activation dtype). ((name, Cost, compute dtype), ...)."""
    norm = F.rmsnorm(batch, hidden, act_dtype=act_dtype, weight_dtype=act_dtype)
    return (("mtp_enorm", norm, "fp32"), ("mtp_hnorm", norm, "fp32"),
            ("mtp_eh_proj", F.linear(batch, 2 * hidden, hidden, act_dtype=act_dtype), act_dtype))


def seconds(phase, device, link=None) -> float:
    """A step at its roof: every op's max(FLOPs / peak, bytes / bandwidth), summed, plus its collectives."""
    return analyze_phase(phase, device, link).step_time_s


def _extra_seconds(extra, device, act: str) -> float:
    return sum(roof_for(device, cdt, act).predicted_s(c) for _, c, cdt in extra)


@dataclass(frozen=True)
class Round:
    """One batch's plain decode step against one speculation round, at the roof."""

    batch: int
    decode_s: float            # one plain decode step
    verify_s: float            # the verify step
    draft_s: float             # the draft's K steps
    reject_s: float            # rejection sampling
    verify_intensity: float    # the verify step's FLOPs / bytes
    ridge: float               # of the activation dtype
    tokens_per_step: float     # expected tokens per sequence per round
    draft_cost: Cost = ZERO    # the draft's K steps, summed

    @property
    def round_s(self) -> float:
        return self.verify_s + self.draft_s + self.reject_s

    @property
    def speedup(self) -> float:
        """Tokens per second with speculation over without: E x decode / round."""
        return self.tokens_per_step * self.decode_s / self.round_s

    @property
    def verify_bound(self) -> str:
        return "compute" if self.verify_intensity >= self.ridge else "memory"

    def to_dict(self) -> dict:
        b = self.batch
        return {"batch": b, "decode_s": self.decode_s, "verify_s": self.verify_s, "draft_s": self.draft_s,
                "reject_s": self.reject_s, "round_s": self.round_s, "tokens_per_step": self.tokens_per_step,
                "plain_tokens_per_s_user": 1 / self.decode_s, "plain_tokens_per_s_device": b / self.decode_s,
                "spec_tokens_per_s_user": self.tokens_per_step / self.round_s,
                "spec_tokens_per_s_device": b * self.tokens_per_step / self.round_s, "speedup": self.speedup,
                "verify_intensity": self.verify_intensity, "verify_bound": self.verify_bound,
                "draft_flops": self.draft_cost.flops, "draft_bytes": self.draft_cost.bytes}


def speculation_round(spec: Speculation, model: ModelConfig, device, batch: int, context: int, options: dict,
                      draft_options: dict | None = None, link=None) -> Round:
    """``batch``'s plain decode step and one round of ``spec`` (``options``: the target's step options, as
    ``workload.decode``'s; ``draft_options``: the draft model's or the MTP layer's, default the target's)."""
    dec = W.decode(model, batch, context, **options)
    ver = verify_step(model, batch, context, spec.k, **options)
    act = dec.dtypes.act
    draft_s, draft = 0.0, ZERO
    dopts = options if draft_options is None else draft_options
    if spec.draft != "none":
        dm = spec.draft_model if spec.draft == "model" else mtp_layer(model)
        extra = mtp_projections(batch, model.hidden, act) if spec.draft == "mtp" else ()
        for i in range(spec.k):
            ph = W.decode(dm, batch, context + i, **dopts)
            draft_s += seconds(ph, device, link) + _extra_seconds(extra, device, act)
            draft = draft + ph.total + sum((c for _, c, _ in extra), ZERO)
    reject = roof_for(device, "fp32", act).predicted_s(F.rejection_sampling(batch, spec.k, model.vocab))
    return Round(batch, seconds(dec, device, link), seconds(ver, device, link), draft_s, reject,
                 ver.total.intensity, device.ridge(act), spec.tokens_per_step, draft)

"""Independent PyTorch reference for meshtrain's mixture-of-experts GPT (issue 16), written from the issue's
text alone: the judge of the C++ MoE block and trainer in the parity tests.

What lives here: meshtrain's counter-based generator (`counter_uniform`), top-1/top-2 routing with group
capacity and GShard admission order (`route`), the MoE block as a differentiable function of its input
(`moe_block`), the MoE GPT (`moe_gpt_forward`, `moe_gpt_loss`), its safetensors names and loading, and
`train_moe`, the conformance run (batches, AdamW, clipping and the schedule come from gpt_reference.py).

What does not live here: anything fast or parallel. Routing is plain integer bookkeeping on the float32
probabilities; every expert runs on the rows admitted to it. tests/parity/test_moe_reference_selfcheck.py
checks it against a second writing (loop admission, scalar forward, finite differences, the dense GPT).

The semantics, as the reference implements them (each is a line of the issue made explicit):
  - p = softmax(x W_router) in the run's dtype (float32 for parity). Top-1: expert argmax p (ties to
    the lower index), gate p_top1. Top-2: the two largest (ties to the lower index), gates g = p/(p1+p2).
  - second policy `all` keeps every second choice; `random` keeps it iff 2*g2 > u (compared in double),
    u = counter_uniform(seed, "moe.second.{step}.{layer}", first_token + row).
  - capacity per expert per group = ceil(F * k * group_tokens / E), evaluated as a Python float (double)
    left to right; F = 0 is dropless (capacity = group_tokens); capacity never exceeds group_tokens.
  - groups are consecutive runs of group_tokens rows (N must be a multiple). Per group, first choices are
    admitted in token order, then the kept second choices in token order; an expert's slot is its count
    of admitted choices so far, so a second choice's slot follows all admitted first choices of that
    expert. A choice that finds its expert full is dropped: it contributes nothing and nothing flows back
    through its expert; the token's other choice keeps the gate computed before capacity.
  - out = residual + sum over admitted choices of gate * expert(x), expert(x) = c_proj(gelu_tanh(c_fc(x))).
  - aux_sum = sum over groups of E * sum_i f_i P_i (f_i: share of the group's tokens whose first choice
    is i, before capacity, no gradient; P_i: the group's mean p_i); z_sum = sum over rows of lse(logits)^2.
  - MoE GPT: blocks K-1, 2K-1, ... (K = moe_every) use the MoE block on ln_2(h) with residual h; routing
    groups are G = group_windows consecutive windows of the global batch (group_tokens = G*T); a token's
    global index is its row in the flattened batch, j*T + t for window j, position t; the random draw of
    step s in block i uses stream "moe.second.{s}.{i}". The loss whose gradient is taken is
    CE + alpha * sum_layers aux_sum/groups + beta * sum_layers z_sum/(B*T); the metrics report CE as
    `loss`, the two sums over layers (before the coefficients) as `aux_loss` and `z_loss`.

Legend: N rows (tokens) of a block call, C n_embd, Hx expert hidden width, E experts, K top-k (1 or 2),
F capacity factor, G windows per routing group, B windows per global batch, T sequence length, g global
token index, s step (0-based), l layer (block index).
"""
from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, asdict
from typing import Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_reference as ref  # noqa: E402

# ----------------------------------------------------------------------------------------------------------
# meshtrain's counter-based generator: every value is a pure function of (seed, stream name, index), so a
# draw does not depend on which rank makes it or in which order.

_M64 = (1 << 64) - 1


def mix64(z: int) -> int:
    """The SplitMix64 finalizer, mod 2^64."""
    z &= _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def fnv1a64(s: str) -> int:
    """FNV-1a over the UTF-8 bytes, mod 2^64."""
    h = 0xCBF29CE484222325
    for b in s.encode("utf-8"):
        h = ((h ^ b) * 0x100000001B3) & _M64
    return h


def counter_bits(seed: int, stream: str, index: int) -> int:
    key = mix64(mix64(seed) ^ fnv1a64(stream))
    return mix64((key + (index + 1) * 0x9E3779B97F4A7C15) & _M64)


def counter_uniform(seed: int, stream: str, index: int) -> float:
    """Uniform in [0, 1) with 53 random bits: (bits >> 11) * 2^-53 (exact in double)."""
    return (counter_bits(seed, stream, index) >> 11) * 2.0 ** -53


def second_stream(step: int, layer: int) -> str:
    return f"moe.second.{step}.{layer}"


# ----------------------------------------------------------------------------------------------------------
# Routing: which expert each choice goes to and its slot there. Discrete, so it is computed once on the
# probabilities (no gradient) and can be handed back in to hold it fixed (finite differences, float64 runs
# that must take the float32 decisions).

@dataclass
class Routing:
    choice: torch.Tensor    # [N, K] int64: the top-k experts, largest first (set even when not kept)
    kept: torch.Tensor      # [N, K] bool: False only for second choices the random policy leaves out
    slot: torch.Tensor      # [N, K] int64: slot in its expert within the group; -1 dropped or not kept
    capacity: int           # per expert per group

    @property
    def expert(self) -> torch.Tensor:
        """[N, K] int64 as meshtrain dumps it: the expert, or -1 for a second choice not kept."""
        return torch.where(self.kept, self.choice, torch.full_like(self.choice, -1))

    @property
    def admitted(self) -> torch.Tensor:
        return self.slot >= 0

    @property
    def choices(self) -> int:
        return int(self.kept.sum())

    @property
    def dropped(self) -> int:
        return int((self.kept & (self.slot < 0)).sum())


def capacity(capacity_factor: float, top_k: int, group_tokens: int, experts: int) -> int:
    """ceil(F * k * group_tokens / E) in double, left to right; F = 0: dropless; never > group_tokens."""
    if capacity_factor < 0 or not math.isfinite(capacity_factor):
        raise ValueError(f"capacity factor {capacity_factor} must be finite and >= 0")
    if capacity_factor == 0:
        return group_tokens
    return min(group_tokens, math.ceil(capacity_factor * top_k * group_tokens / experts))


def top_k_choices(p: torch.Tensor, top_k: int) -> torch.Tensor:
    """p [N, E] -> [N, K] int64, the K largest per row, largest first, ties to the lower index. A stable
    descending sort keeps equal values in index order."""
    if not 1 <= top_k <= min(2, p.shape[1]):
        raise ValueError(f"top-k {top_k} must be 1 or 2 and at most the expert count {p.shape[1]}")
    return torch.sort(p.detach(), dim=1, descending=True, stable=True).indices[:, :top_k].contiguous()


def gates_of(p: torch.Tensor, choice: torch.Tensor) -> torch.Tensor:
    """[N, K] gates before capacity, differentiable in p: top-1 p_top1; top-2 p_k / (p_1 + p_2)."""
    sel = p.gather(1, choice)
    return sel if choice.shape[1] == 1 else sel / sel.sum(dim=1, keepdim=True)


def route(p: torch.Tensor, top_k: int, capacity_factor: float, group_tokens: int, second_policy: str = "all",
          seed: int = 0, step: int = 0, layer: int = 0, first_token: int = 0) -> Routing:
    """Routing of N = p.shape[0] rows in groups of group_tokens rows. Slots are found as GShard's reference
    gating does: the position of a first choice is the running count (cumsum) of first choices of its
    expert in the group; a second choice's is the running count of kept second choices of its expert
    plus the number of first choices that expert admitted."""
    N, E = p.shape
    if group_tokens <= 0 or N % group_tokens:
        raise ValueError(f"{N} rows do not split into routing groups of {group_tokens} tokens")
    if second_policy not in ("all", "random"):
        raise ValueError(f"second policy {second_policy!r} must be 'all' or 'random'")
    choice = top_k_choices(p, top_k)
    kept = torch.ones(N, top_k, dtype=torch.bool)
    if top_k == 2 and second_policy == "random":
        g2 = gates_of(p.detach(), choice)[:, 1].tolist()
        stream = second_stream(step, layer)
        for n in range(N):
            kept[n, 1] = 2.0 * g2[n] > counter_uniform(seed, stream, first_token + n)
    cap = capacity(capacity_factor, top_k, group_tokens, E)
    slot = torch.full((N, top_k), -1, dtype=torch.int64)
    for g0 in range(0, N, group_tokens):
        rows = slice(g0, g0 + group_tokens)
        admitted_first = torch.zeros(E, dtype=torch.int64)
        for k in range(top_k):
            onehot = torch.nn.functional.one_hot(choice[rows, k], E) * kept[rows, k, None]   # [n, E]
            pos = (onehot.cumsum(dim=0) - 1).gather(1, choice[rows, k, None]).squeeze(1)      # [n]
            pos = pos + admitted_first[choice[rows, k]]
            ok = kept[rows, k] & (pos < cap)
            slot[rows, k] = torch.where(ok, pos, torch.full_like(pos, -1))
            if k == 0:
                admitted_first = onehot.sum(dim=0).clamp(max=cap)
    return Routing(choice=choice, kept=kept, slot=slot, capacity=cap)


# ----------------------------------------------------------------------------------------------------------
# The block.

@dataclass
class MoEBlockResult:
    out: torch.Tensor       # [N, C] residual + the experts' gated outputs
    routing: Routing
    gate: torch.Tensor      # [N, K] gates of the admitted choices (differentiable), 0 where not admitted
    aux_sum: torch.Tensor   # scalar: sum over groups of E * sum_i f_i P_i
    z_sum: torch.Tensor     # scalar: sum over rows of logsumexp(logits)^2
    n_groups: int
    probs: torch.Tensor     # [N, E] router probabilities (differentiable)

    @property
    def choices(self) -> int:
        return self.routing.choices

    @property
    def dropped(self) -> int:
        return self.routing.dropped


def expert_names(experts: int) -> List[Tuple[str, str]]:
    """(suffix, kind) of the block's tensors after its prefix, in a fixed order."""
    out = [("router.weight", "router")]
    for e in range(experts):
        out += [(f"experts.{e}.c_fc.weight", "fc_w"), (f"experts.{e}.c_fc.bias", "fc_b"),
                (f"experts.{e}.c_proj.weight", "proj_w"), (f"experts.{e}.c_proj.bias", "proj_b")]
    return out


def block_shapes(C: int, hidden: int, experts: int) -> List[Tuple[str, Tuple[int, ...]]]:
    shape = {"router": (C, experts), "fc_w": (C, hidden), "fc_b": (hidden,), "proj_w": (hidden, C),
             "proj_b": (C,)}
    return [(name, shape[kind]) for name, kind in expert_names(experts)]


def logsumexp_rows(z: torch.Tensor) -> torch.Tensor:
    m = z.max(dim=1, keepdim=True).values.detach()
    return (m + torch.log(torch.exp(z - m).sum(dim=1, keepdim=True))).squeeze(1)


def aux_sum_of(p: torch.Tensor, first: torch.Tensor, group_tokens: int) -> torch.Tensor:
    """p [N, E], first [N] first-choice experts -> sum over groups of E * sum_i f_i P_i (f constant)."""
    N, E = p.shape
    total = p.new_zeros(())
    for g0 in range(0, N, group_tokens):
        f = torch.bincount(first[g0:g0 + group_tokens], minlength=E).to(p.dtype) / group_tokens
        P = p[g0:g0 + group_tokens].mean(dim=0)
        total = total + E * (f * P).sum()
    return total


def moe_block(x: torch.Tensor, residual: torch.Tensor, p: Mapping[str, torch.Tensor], prefix: str = "", *,
              top_k: int, capacity_factor: float, group_tokens: int, second_policy: str = "all",
              seed: int = 0, step: int = 0, layer: int = 0, first_token: int = 0,
              routing: Optional[Routing] = None) -> MoEBlockResult:
    """x, residual [N, C] -> MoEBlockResult. Tensors are p[prefix + "router.weight"] [C, E] and
    p[prefix + "experts.{e}.c_fc.weight"] [C, Hx], ".c_fc.bias" [Hx], ".c_proj.weight" [Hx, C],
    ".c_proj.bias" [C]. With `routing` given, its decisions are used instead of being recomputed (gates
    still follow p). Cost: N*C*E for the router plus 2*C*Hx per admitted choice."""
    N, C = x.shape
    w_router = p[prefix + "router.weight"]
    E = w_router.shape[1]
    logits = x @ w_router                                                         # [N, E]
    probs = ref.softmax_last(logits)
    if routing is None:
        routing = route(probs, top_k, capacity_factor, group_tokens, second_policy, seed, step, layer,
                        first_token)
    if routing.choice.shape != (N, top_k):
        raise ValueError(f"routing of shape {tuple(routing.choice.shape)} for {N} rows and top-k {top_k}")
    gate = gates_of(probs, routing.choice) * routing.admitted.to(x.dtype)          # [N, K]
    out = residual
    for e in range(E):
        tok, k = torch.nonzero((routing.choice == e) & routing.admitted, as_tuple=True)
        if tok.numel() == 0:
            continue
        order = torch.argsort(routing.slot[tok, k])                               # the expert's buffer order
        tok, k = tok[order], k[order]
        y = ref.mlp(x[tok], p, prefix + f"experts.{e}.")                           # [n_e, C]
        out = out.index_add(0, tok, gate[tok, k].unsqueeze(1) * y)
    lse = logsumexp_rows(logits)
    return MoEBlockResult(out=out, routing=routing, gate=gate,
                          aux_sum=aux_sum_of(probs, routing.choice[:, 0], group_tokens),
                          z_sum=(lse * lse).sum(), n_groups=N // group_tokens, probs=probs)


# ----------------------------------------------------------------------------------------------------------
# The MoE GPT: the dense reference GPT with MoE blocks every moe_every blocks.

@dataclass(frozen=True)
class MoEConfig:
    """The architecture (saved in the safetensors __metadata__)."""
    moe_every: int
    experts: int
    moe_top_k: int
    expert_hidden: int

    def metadata(self) -> Dict[str, str]:
        return {k: str(v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class MoEOptions:
    """Routing and loss settings of a run (flags, not part of the model): --capacity-factor,
    --moe-second-policy, --moe-group-windows, --moe-aux-loss, --moe-z-loss, --seed."""
    capacity_factor: float
    second_policy: str = "all"
    group_windows: int = 1
    aux_loss: float = 0.01
    z_loss: float = 0.0
    seed: int = 0


def moe_layers(cfg: ref.GPTConfig, moe: MoEConfig) -> List[int]:
    """Blocks K-1, 2K-1, ... (K = moe_every)."""
    return [i for i in range(cfg.n_layer) if (i + 1) % moe.moe_every == 0]


def moe_param_shapes(cfg: ref.GPTConfig, moe: MoEConfig) -> List[Tuple[str, Tuple[int, ...]]]:
    """The dense names and shapes with each MoE block's mlp.* replaced by its router and experts."""
    out = []
    layers = set(moe_layers(cfg, moe))
    for name, shape in ref.param_shapes(cfg):
        parts = name.split(".")
        if parts[0] == "h" and int(parts[1]) in layers and parts[2] == "mlp":
            if name.endswith("mlp.c_fc.weight"):  # once per block, where the dense MLP began
                prefix = f"h.{parts[1]}.mlp."
                out += [(prefix + n, s) for n, s in block_shapes(cfg.n_embd, moe.expert_hidden, moe.experts)]
            continue
        out.append((name, shape))
    return out


def moe_metadata(cfg: ref.GPTConfig, moe: MoEConfig) -> Dict[str, str]:
    return {**cfg.metadata(), **moe.metadata()}


def moe_config_from_weights(tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str],
                            n_head: Optional[int] = None) -> Tuple[ref.GPTConfig, MoEConfig]:
    """GPT shapes as gpt_reference reads them; moe_every and moe_top_k from the metadata (no shape shows
    them), experts and expert_hidden from the first router and c_fc, checked against the metadata. Every
    expected tensor must be present with its shape and none extra."""
    for key in ("moe_every", "moe_top_k"):
        if key not in metadata:
            raise ref.FormatError(f"{key} is not in the file's __metadata__")
    if n_head is None:
        if "n_head" not in metadata:
            raise ref.FormatError("n_head is neither in the file's __metadata__ nor given")
        n_head = int(metadata["n_head"])
    V, C = tensors["wte.weight"].shape
    n_layer = 0
    while f"h.{n_layer}.ln_1.weight" in tensors:
        n_layer += 1
    cfg = ref.GPTConfig(n_layer=n_layer, n_head=n_head, n_embd=C, vocab_size=V,
                        n_positions=tensors["wpe.weight"].shape[0])
    K = int(metadata["moe_every"])
    if not 1 <= K <= n_layer:
        raise ref.FormatError(f"moe_every {K} must be in 1..n_layer {n_layer}")
    first = f"h.{K - 1}.mlp."
    if first + "router.weight" not in tensors or first + "experts.0.c_fc.weight" not in tensors:
        raise ref.FormatError(f"block {K - 1} has no {first}router.weight / experts.0.c_fc.weight")
    moe = MoEConfig(moe_every=K, experts=tensors[first + "router.weight"].shape[1],
                    moe_top_k=int(metadata["moe_top_k"]),
                    expert_hidden=tensors[first + "experts.0.c_fc.weight"].shape[1])
    for key in ("experts", "expert_hidden"):
        if key in metadata and int(metadata[key]) != getattr(moe, key):
            raise ref.FormatError(f"metadata {key}={metadata[key]} but the tensors say {getattr(moe, key)}")
    if not 1 <= moe.moe_top_k <= min(2, moe.experts):
        raise ref.FormatError(f"moe_top_k {moe.moe_top_k} must be 1 or 2 and at most experts {moe.experts}")
    want = dict(moe_param_shapes(cfg, moe))
    for name, shape in want.items():
        if name not in tensors or tuple(tensors[name].shape) != shape:
            got = tuple(tensors[name].shape) if name in tensors else "missing"
            raise ref.FormatError(f"tensor {name}: expected shape {shape}, got {got}")
    extra = sorted(set(tensors) - set(want))
    if extra:
        raise ref.FormatError(f"unexpected tensors: {extra[:5]}")
    return cfg, moe


def load_moe_model(path: str, n_head: Optional[int] = None, dtype=torch.float32
                   ) -> Tuple[ref.GPTConfig, MoEConfig, Dict[str, torch.Tensor]]:
    raw, metadata = ref.read_safetensors(path)
    arrays = ref.normalize_names(raw)
    cfg, moe = moe_config_from_weights(arrays, metadata, n_head)
    params = {n: torch.tensor(np.asarray(arrays[n]), dtype=dtype) for n, _ in moe_param_shapes(cfg, moe)}
    return cfg, moe, params


def save_moe_model(path: str, cfg: ref.GPTConfig, moe: MoEConfig, params: Mapping[str, torch.Tensor]) -> None:
    ref.write_safetensors(path, {n: params[n].detach().to(torch.float32).numpy()
                                 for n, _ in moe_param_shapes(cfg, moe)}, moe_metadata(cfg, moe))


def moe_random_init(cfg: ref.GPTConfig, moe: MoEConfig, seed: int, std: float = 0.02, ln_noise: float = 0.1,
                    bias_std: float = 0.02, std_by_suffix: Optional[Mapping[str, float]] = None
                    ) -> Dict[str, np.ndarray]:
    """As gpt_reference.random_init, over the MoE names (suffix overrides apply, e.g. "router.weight")."""
    return ref.random_init_shapes(moe_param_shapes(cfg, moe), seed, std, ln_noise, bias_std, std_by_suffix)


def moe_gpt_forward(p: Mapping[str, torch.Tensor], idx: torch.Tensor, cfg: ref.GPTConfig, moe: MoEConfig,
                    opts: MoEOptions, step: int = 0) -> Tuple[torch.Tensor, Dict[int, MoEBlockResult]]:
    """idx [B, T] (the whole global batch: groups span windows) -> (logits [B, T, V], {block: result})."""
    B, T = idx.shape
    if T > cfg.n_positions:
        raise ValueError(f"sequence length {T} exceeds n_positions {cfg.n_positions}")
    if opts.group_windows <= 0 or B % opts.group_windows:
        raise ValueError(f"batch of {B} windows does not split into groups of {opts.group_windows} windows")
    layers = set(moe_layers(cfg, moe))
    x = p["wte.weight"][idx] + p["wpe.weight"][:T]                                # [B, T, C]
    results = {}
    for i in range(cfg.n_layer):
        h = f"h.{i}."
        x = x + ref.causal_self_attention(ref.layer_norm(x, p[h + "ln_1.weight"], p[h + "ln_1.bias"]), p,
                                          h + "attn.", cfg.n_head)
        ln2 = ref.layer_norm(x, p[h + "ln_2.weight"], p[h + "ln_2.bias"])
        if i in layers:
            C = cfg.n_embd
            r = moe_block(ln2.reshape(B * T, C), x.reshape(B * T, C), p, h + "mlp.", top_k=moe.moe_top_k,
                          capacity_factor=opts.capacity_factor, group_tokens=opts.group_windows * T,
                          second_policy=opts.second_policy, seed=opts.seed, step=step, layer=i, first_token=0)
            results[i] = r
            x = r.out.reshape(B, T, C)
        else:
            x = x + ref.mlp(ln2, p, h + "mlp.")
    x = ref.layer_norm(x, p["ln_f.weight"], p["ln_f.bias"])
    return x @ p["wte.weight"].t(), results


def moe_gpt_loss(p: Mapping[str, torch.Tensor], idx: torch.Tensor, targets: torch.Tensor, cfg: ref.GPTConfig,
                 moe: MoEConfig, opts: MoEOptions, step: int = 0) -> Tuple[torch.Tensor, Dict[str, float]]:
    """(the loss whose gradient is taken, metrics). The loss is CE + alpha * aux_loss + beta * z_loss with
    aux_loss = sum over MoE layers of aux_sum / groups and z_loss = sum over layers of z_sum / (B*T).
    metrics: loss (CE alone), aux_loss, z_loss, choices, dropped (over all layers), dropped_frac, and
    per layer tokens_{i} (admitted choices per expert) and dropped_{i}."""
    logits, results = moe_gpt_forward(p, idx, cfg, moe, opts, step)
    ce = ref.cross_entropy(logits, targets)
    n_tokens = idx.numel()
    aux = sum((r.aux_sum / r.n_groups for r in results.values()), ce.new_zeros(()))
    z = sum((r.z_sum / n_tokens for r in results.values()), ce.new_zeros(()))
    total = ce + opts.aux_loss * aux + opts.z_loss * z
    choices = sum(r.choices for r in results.values())
    dropped = sum(r.dropped for r in results.values())
    metrics = {"loss": float(ce), "aux_loss": float(aux), "z_loss": float(z), "choices": choices,
               "dropped": dropped, "dropped_frac": dropped / choices if choices else 0.0}
    for i, r in results.items():
        adm = r.routing.admitted
        metrics[f"tokens_{i}"] = [int((adm & (r.routing.choice == e)).sum()) for e in range(moe.experts)]
        metrics[f"dropped_{i}"] = r.dropped
    return total, metrics


def train_moe(init_path: str, data_path: str, B: int, T: int, steps: int, hyperparams, opts: MoEOptions,
              n_head: Optional[int] = None, dtype=torch.float32
              ) -> Tuple[List[Dict[str, float]], Dict[str, np.ndarray]]:
    """The MoE conformance run: as gpt_reference.train (same batches, AdamW over every tensor including
    routers and experts, clipping over all of them, same schedule) with the MoE loss. History rows:
    {step, loss, aux_loss, z_loss, choices, dropped, dropped_frac, tokens_i, dropped_i, lr, grad_norm,
    clipped}; loss is the cross-entropy before the update, grad_norm that of the total loss."""
    hp = hyperparams if isinstance(hyperparams, ref.HParams) else ref.HParams(**hyperparams)
    cfg, moe, params = load_moe_model(init_path, n_head=n_head, dtype=dtype)

    def step_loss(prm, x, y, s):
        return moe_gpt_loss(prm, x, y, cfg, moe, opts, step=s)
    return ref.optimize(params, ref.read_shard(data_path), B, T, steps, hp, step_loss)

"""Fused kernels for the elementwise work of the drafter and of the frozen target, from liger-kernel where it runs
(a CUDA device and Triton), each model's own torch code everywhere else.

The drafter (trainer/model/modeling_dflash.py) and the target's HF modules stay as they are, so the drafter can be
shipped and read as it is and the target can be run plain; `install` swaps the forward of their RMSNorm and
SwiGLU MLP modules in place for liger's fused Triton kernels (RMSNorm in one pass, SiLU(gate) * up in one pass),
each computing in fp32 and returning the input's dtype as the torch code does. On a hybrid target the Gated
DeltaNet's gated RMSNorm goes to flash-linear-attention's fused kernel when fla is installed. Rotary embeddings:
liger's fused kernel in the target (bind_rope), the drafter's own code torch.compile'd (bind_drafter_rope).
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import functools
import sys
import types
from typing import TYPE_CHECKING, Callable, Iterable, Literal

from trainer.errors import TrainerError

if TYPE_CHECKING:   # torch is imported where a module is swapped: `train --plan` resolves kernels without it
    import torch
    from torch import nn

KernelChoice = Literal["auto", "torch", "liger"]

# RMSNorm classes liger can stand in for, by how they round: (offset added to the weight, liger's casting mode).
# "llama": normalise in fp32, round to the input's dtype, then scale; "gemma": all in fp32, round once at the end
# (Qwen3.5's norms also scale by 1 + weight). A class not named here keeps its own forward.
NORM_STYLES = {
    "RMSNorm": (0.0, "llama"),   # the drafter's (trainer/model/modeling_dflash.py)
    **{name: (0.0, "llama") for name in ("Qwen3RMSNorm", "Qwen3MoeRMSNorm", "Qwen2RMSNorm", "LlamaRMSNorm",
                                         "MistralRMSNorm")},
    **{name: (1.0, "gemma") for name in ("Qwen3_5RMSNorm", "Qwen3_5MoeRMSNorm")},
}
GATED_NORMS = ("Qwen3_5RMSNormGated", "Qwen3_5MoeRMSNormGated")   # norm(x) * weight * silu(gate), fp32 inside


def importable(name: str) -> bool:
    """Whether `import name` would find the module (a module blocked or half-imported counts as absent)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def liger_version() -> str | None:
    """The installed liger-kernel's version, None when it is absent or cannot be imported."""
    if not (importable("liger_kernel") and importable("triton")):
        return None
    try:
        return importlib.metadata.version("liger-kernel")
    except importlib.metadata.PackageNotFoundError:
        return None


def resolve(choice: KernelChoice, device: torch.device) -> str:
    """"liger" or "torch" for a run on `device`: auto takes liger where it can run; an explicit liger that cannot
    is refused in one line before anything loads."""
    usable = device.type == "cuda" and liger_version() is not None
    if choice == "liger" and not usable:
        reason = "it is not installed (pip install 'dflashctl[fast]')" if liger_version() is None else \
            f"its Triton kernels need a CUDA device, not {device.type}"
        raise TrainerError(f"kernels: liger was asked for, but {reason}; use kernels: auto or torch")
    if choice == "torch":
        return "torch"
    return "liger" if usable else "torch"


def on_a_gpu(choice: KernelChoice) -> str:
    """What `resolve` would answer on a CUDA machine with this machine's packages (for `train --plan`, which
    may run where no GPU is): auto takes liger when liger-kernel is installed, an explicit choice stands."""
    if choice == "auto":
        return "liger" if liger_version() is not None else "torch"
    return choice


def _liger_rms_norm(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction

    offset, casting = NORM_STYLES[type(module).__name__]
    eps = getattr(module, "variance_epsilon", None) or module.eps
    # under autocast the drafter's master weight is fp32 and x bf16: the kernel normalises in fp32 and writes x's
    # dtype
    return LigerRMSNormFunction.apply(x, module.weight, eps, offset, casting, False)


def _liger_mlp(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction

    return module.down_proj(LigerSiLUMulFunction.apply(module.gate_proj(x), module.up_proj(x)))


def _fla_gated_norm(module: nn.Module, hidden_states: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    from fla.modules.fused_norm_gate import rms_norm_gated

    return rms_norm_gated(hidden_states, gate, module.weight, None, activation="swish",
                          eps=module.variance_epsilon)


def _is_swiglu(module: nn.Module, silu: bool) -> bool:
    """An MLP of gate, up and down projections whose activation is SiLU (`silu`: the model's config says so)."""
    from torch import nn

    # an FP8 target's projections (trainer/model/fp8.py) are linear layers too
    return silu and all(isinstance(getattr(module, name, None), nn.Linear)
                        or type(getattr(module, name, None)).__name__ == "Fp8Linear"
                        for name in ("gate_proj", "up_proj", "down_proj"))


OURS = (_liger_rms_norm, _liger_mlp, _fla_gated_norm)   # the forwards `install` binds (and "torch" takes back)


def install(model: nn.Module, kernels: str, *, what: str = "drafter", silu: bool = True) -> str:
    """Bind the chosen kernels to `model`'s RMSNorm and SwiGLU modules (and gated norms, with fla); "torch" puts
    the modules' own forward back. Returns what the start-up line says of them, e.g. `drafter RMSNorm and
    SwiGLU: liger-kernel 0.8.5`. `silu`: the MLPs' activation is SiLU (a target's config.hidden_act)."""
    fla, gated = importable("fla"), False
    for module in model.modules():
        name = type(module).__name__
        if kernels == "torch":
            if getattr(module.__dict__.get("forward"), "__func__", None) in OURS:   # only what install put there
                del module.forward
        elif name in NORM_STYLES:
            module.forward = types.MethodType(_liger_rms_norm, module)
        elif _is_swiglu(module, silu):
            module.forward = types.MethodType(_liger_mlp, module)
        elif name in GATED_NORMS and fla:
            module.forward = types.MethodType(_fla_gated_norm, module)
            gated = True
    if kernels == "torch":
        return f"{what} RMSNorm and SwiGLU: torch"
    return f"{what} RMSNorm and SwiGLU: liger-kernel {liger_version()}" + (" (gated RMSNorm: fla)" if gated else "")


def install_drafter(drafter: nn.Module, kernels: str) -> str:
    """`install` for the drafter, and with liger's kernels (a GPU) its rotary embedding compiled too
    (bind_drafter_rope); the start-up line's words for both."""
    line = install(drafter, kernels)
    if bind_drafter_rope(kernels == "liger"):
        line += "; drafter RoPE: torch.compile"
    return line


def bind_drafter_rope(on: bool, *, devices: tuple[str, ...] = ("cuda",), compile_fn: Callable | None = None) -> bool:
    """The drafter's rotary embedding (modeling_dflash.apply_rope, which its attention layers call for q and for
    k) as one torch.compile'd function with dynamic shapes while training on `devices`, or (on=False) its own torch
    code again; returns `on`. Eager it is five elementwise passes each way over q [blocks' tokens, 32 heads] and
    k [context and blocks' tokens, 8 heads] per layer (a rotated copy, its concatenation, two products, a sum, and
    their backward), where liger's fused kernel, which the target uses, needs q and k of one length. Without
    autograd (evaluation, decoding) it stays eager: no graph is compiled mid-run for another grad mode.
    `compile_fn` (tests) stands in for torch.compile(fn, dynamic=True)."""
    from trainer.model import modeling_dflash

    own = getattr(modeling_dflash.apply_rope, "_dflash_own", modeling_dflash.apply_rope)
    modeling_dflash.apply_rope = _compiled_rope(own, devices, compile_fn) if on else own
    return on


@functools.lru_cache(maxsize=None)
def _compiled_rope(own: Callable, devices: tuple[str, ...], compile_fn: Callable | None) -> Callable:
    """One wrapper (and one compiled function) for each way of binding: binding again reuses its graph."""
    import torch

    compiled = None

    def apply_rope(x, cos, sin):
        nonlocal compiled
        if x.device.type not in devices or not torch.is_grad_enabled():
            return own(x, cos, sin)
        if compiled is None:
            compiled = (compile_fn or functools.partial(torch.compile, dynamic=True))(own)
        return compiled(x, cos, sin)

    apply_rope._dflash_own = own
    return apply_rope


def compile_block_convs(model: nn.Module, device: torch.device, *, on: bool = True,
                        shapes: Iterable[tuple[int, int]] | None = None) -> str | None:
    """On a GPU, bind every DFlash2 BlockConv of `model` to a torch.compile'd convolution: eager it is a dozen
    elementwise kernels per convolution over [tokens, hidden] tensors, each saving its inputs for the backward;
    compiled, one fused kernel each way that recomputes what it needs.

    `shapes`: the (batch, block tokens) inputs the trainer's buckets give; each is compiled for its own static
    shape (one graph per shape, both sides and every layer share it) and any other shape runs eager. Measured
    alone at 8B, a static graph is five times faster than eager, and one graph with dynamic shapes (`shapes`
    None, the way before) no faster than eager. Returns the start-up line's words for it, or None for a model
    without convolutions (or off a GPU, where the torch code runs as it is). `on=False` puts the modules' own
    forward back."""
    convs = [module for module in model.modules() if type(module).__name__ == "BlockConv"]
    if not on:
        for module in convs:
            module.__dict__.pop("forward", None)
    if not on or not convs or device.type != "cuda":
        return None
    conv = DynamicShapeConv() if shapes is None else StaticShapeConv(shapes)
    for module in convs:
        module.forward = types.MethodType(conv.forward, module)
    return f"block convolution: {conv.describe()}"


class DynamicShapeConv:
    """One torch.compile'd graph with dynamic shapes for every input shape."""

    def __init__(self) -> None:
        self.compiled = None

    def describe(self) -> str:
        return "torch.compile (dynamic shapes)"

    def forward(self, module: nn.Module, y: torch.Tensor, kernels: torch.Tensor, side: int) -> torch.Tensor:
        if self.compiled is None:
            import torch

            from trainer.model.modeling_dflash import side_conv

            self.compiled = torch.compile(side_conv, dynamic=True)
        with graph_room(1):
            return self.compiled(y, kernels[:, :, :, side], module.base_kernel[side], block_size=module.block_size)


class StaticShapeConv:
    """torch.compile'd once per declared (batch, block tokens) input shape with static shapes; eager for any
    other shape and without autograd (evaluation, decoding): the compiled graphs stay bounded by the shapes.
    `compile_fn` (tests) stands in for torch.compile(fn, dynamic=False)."""

    def __init__(self, shapes: Iterable[tuple[int, int]], compile_fn: Callable | None = None) -> None:
        self.shapes = frozenset((int(batch), int(tokens)) for batch, tokens in shapes)
        self.compile_fn = compile_fn
        self.compiled = None

    def describe(self) -> str:
        return f"torch.compile per bucket shape ({len(self.shapes)} shapes)"

    def forward(self, module: nn.Module, y: torch.Tensor, kernels: torch.Tensor, side: int) -> torch.Tensor:
        import torch

        from trainer.model.modeling_dflash import side_conv

        args = (y, kernels[:, :, :, side], module.base_kernel[side])
        if tuple(y.shape[:2]) not in self.shapes or not torch.is_grad_enabled():
            return side_conv(*args, block_size=module.block_size)
        if self.compiled is None:
            self.compiled = (self.compile_fn or functools.partial(torch.compile, dynamic=False))(side_conv)
        with graph_room(len(self.shapes)):
            return self.compiled(*args, block_size=module.block_size)


def graph_room(graphs: int):
    """Dynamo keeps one graph per shape of a function, up to its recompile limit (8 by default, counted over every
    torch.compile of that function): room for `graphs` more during the calls, so no bucket is left to eager by it
    (bench_train switches between the two ways in one process)."""
    import torch._dynamo

    return torch._dynamo.config.patch(recompile_limit=max(8, graphs + 8))


def install_target(hf_model: nn.Module, kernels: str) -> str:
    """`install` for the frozen target's decoder (its own HF modules; a SiLU MLP only where its config says), and
    liger's rotary embedding in its attention layers (bind_rope)."""
    silu = getattr(hf_model.config, "hidden_act", None) in ("silu", "swish")
    line = install(hf_model, kernels, what="target", silu=silu)
    if bind_rope(hf_model, kernels == "liger"):
        line = line.replace("RMSNorm and SwiGLU", "RMSNorm, SwiGLU and RoPE")
    return line


ROPE = "apply_rotary_pos_emb"   # the function a transformers attention layer calls from its modeling module


def bind_rope(model: nn.Module, on: bool) -> bool:
    """liger's fused rotary embedding in `model`'s attention layers, or (on=False) their own again; whether any was
    bound. Transformers' layers call their modeling module's `apply_rotary_pos_emb`, a module-level function, so
    that function is what gets wrapped, for every model of that family in this process: CUDA tensors take liger's
    kernel (one pass, in place, a partial rotary width included) and anything else the function itself. Its torch
    code is five elementwise passes over q and over k (two products, a half rotation, its concatenation, a sum),
    a few percent of an 8B target's feature pass."""
    bound = False
    families = {sys.modules.get(type(m).__module__) for m in model.modules() if type(m).__name__.endswith("Attention")}
    for family in families:
        current = getattr(family, ROPE, None)
        if current is None:
            continue
        own = getattr(current, "_dflash_own", current)
        setattr(family, ROPE, _liger_rope(own) if on else own)
        bound = bound or on
    return bound


def _liger_rope(own: Callable) -> Callable:
    def apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs):
        if q.is_cuda and not args and not kwargs:
            from liger_kernel.ops.rope import LigerRopeFunction

            return LigerRopeFunction.apply(q, k, cos, sin)
        return own(q, k, cos, sin, *args, **kwargs)

    apply_rotary_pos_emb._dflash_own = own
    return apply_rotary_pos_emb

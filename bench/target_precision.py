"""bench_train --target-precision bf16,fp8: the target's feature pass (the step's target phase) timed in each
precision on the same batches in one process, and the tapped hidden states' relative error against the first
precision's. fp8 converts the target in place (trainer/model/fp8.py), so bf16 is measured first.

`+compiled` (bf16+compiled, fp8+compiled): the same precision with the decoder layers torch.compile'd
(TargetModel.compile_layers) and the target's own torch modules inside them, against liger's kernels without;
`+compiled+separate`: compiled, each of q, k, v (gate, up) its own product again, as before they were merged
(trainer/model/siblings.py). With --profile, the last precision's pass is profiled: its top operators on stderr."""
from __future__ import annotations

import time

import torch

PRECISIONS = ("bf16", "bf16+compiled", "bf16+compiled+separate", "fp8", "fp8+compiled", "fp8+compiled+separate")


def parse_precisions(text: str) -> list[str]:
    """The --target-precision list; a ValueError naming what is wrong."""
    names = [name for name in text.split(",") if name]
    if not names or any(name not in PRECISIONS for name in names) or len(set(names)) != len(names):
        raise ValueError(f"--target-precision: a list of distinct {', '.join(PRECISIONS)}, got {text!r}")
    bases = [name.split("+")[0] for name in names]
    if "fp8" in bases and "bf16" in bases[bases.index("fp8"):]:
        raise ValueError("--target-precision: bf16 comes before fp8 (fp8 converts the target in place)")
    return names


def _features_pass(target, batches, autocast, device) -> float:
    """Seconds of one feature pass over every batch (already on the device)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    began = time.perf_counter()
    with torch.no_grad(), autocast:
        for input_ids, attention_mask in batches:
            target.features(input_ids, attention_mask)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - began


def tap_errors(got, reference, hidden: int) -> tuple[float, list[float]]:
    """Relative error of tapped features [..., taps * hidden] against a reference: all taps together, each tap."""
    def error(a, b) -> float:
        return float((a - b).norm() / b.norm())

    taps = reference.shape[-1] // hidden
    return error(got, reference), [error(got[..., i * hidden:(i + 1) * hidden],
                                         reference[..., i * hidden:(i + 1) * hidden]) for i in range(taps)]


def compare(target, stream, args, device, autocast, precisions: list[str], say) -> list[dict]:
    """One row per precision: ms per batch of the feature pass (after an untimed pass over the same batches: Triton
    kernels and the fp8 quantizer compile per shape on first sight), tok/s, speed-up against the first row, and
    the relative error of the first batch's tapped states (each tap apart, and all together) against it."""
    batches, tokens = [], 0
    for _ in range(args.steps):
        batch = next(stream)
        batches.append((batch.input_ids.to(device), batch.attention_mask))
        tokens += int(batch.attention_mask.sum())
    hidden = target.config.hidden_size
    from trainer.model import kernels, siblings

    rows, reference = [], None
    for precision in precisions:
        base, compiled = precision.split("+")[0], "+compiled" in precision
        if base == "fp8" and target.precision == "bf16":   # off a GPU the products are emulated in fp32: a smoke
            target.to_fp8(emulate=device.type != "cuda")   # run of this script only
        target.compile_layers(False)   # the projections of a compiled row split again before liger is bound
        if compiled:
            # each compiled row compiles afresh: the rows' module types (Linear, Fp8Linear, the merged parts)
            # would otherwise pile up as recompiles of the same frames, and past dynamo's limit a frame runs eager
            torch._dynamo.reset()
            target.compile_layers()   # around the target's own torch modules
            if precision.endswith("+separate"):
                siblings.split_siblings(target.decoder.layers)
        else:
            kernels.install_target(target.hf_model, kernels.resolve("auto", device))
        say(f"target phase in {precision}: {target.describe()}")
        _features_pass(target, batches, autocast, device)
        seconds = min(_features_pass(target, batches, autocast, device) for _ in range(2))
        with torch.no_grad(), autocast:
            first = target.features(*batches[0]).float()
        row = {"precision": precision + (" (emulated)" if base == "fp8" and device.type != "cuda" else ""),
               "target_ms_per_batch": 1000 * seconds / len(batches),
               "tok_per_s": tokens / seconds, "batches": len(batches), "tokens": tokens}
        if reference is None:
            reference = first
        else:
            row["speedup_vs_first"] = rows[0]["target_ms_per_batch"] / row["target_ms_per_batch"]
            row["features_relative_error"], row["per_tap_relative_error"] = tap_errors(first, reference, hidden)
        del first
        rows.append(row)
    if getattr(args, "profile", None):
        say(profile_table(target, batches[:2], autocast, device))
    return rows


def profile_table(target, batches, autocast, device) -> str:
    """The top operators of a feature pass over `batches`, by their own device time."""
    from torch.profiler import ProfilerActivity, profile

    on_gpu = device.type == "cuda"
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])) as prof:
        _features_pass(target, batches, autocast, device)
    sort_by = "self_cuda_time_total" if on_gpu else "self_cpu_time_total"
    return "the target's feature pass, last precision\n" + prof.key_averages().table(sort_by=sort_by, row_limit=30)

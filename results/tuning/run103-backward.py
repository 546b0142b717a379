"""Run 103 (prepared 2026-12-04): the two backward switches that landed off after run 100, timed. With run
100's four switches on, KDA's forward + backward at (1, 8192, 96, 128), bf16, is 22.6 ms against fla's 14.3
(the backward/latency record of run 102). ``switches``: KDA forward + backward with the defaults, with
``SCORES_FROM_FORWARD`` (chunk_pair_pieces without the scores; the forward's A_qk read instead),
``PAIR_KERNEL_TWO_BLOCKS`` (chunk_pair_gradients at two blocks per SM), ``PAIR_KERNEL_BY_CHANNELS`` (it split by
channels), ``PAIR_PIECES_FROM_FORWARD`` (no chunk_pair_pieces: the forward's chunk_intra writes G, T and K K^T E),
``PAIR_SUMS_BY_PRODUCTS`` (the pairs inside a sub-chunk by running products) and all, and GDN with ``GRADS_IN_INPUT_DTYPE``, ``INVERSE_FROM_FORWARD`` (its chunk kernel reading the
forward's T, K K^T E and scores) and both: time, peak memory, every gradient against the
defaults'. ``profile``: one step of kda's KDA and GDN with the defaults by
``torch.profiler`` (``$OUT/run103-<name>.txt``, every launch of the last step in order), the split of the 22.6
and 7.4 ms that the next kernels start from. ``levels``: levels 1, 2 and 3 with a gate per head at (1, 8192,
96, 128), forward + backward, with ``LEVEL_PIECES`` off and on and with ``LEVEL_PASSES_FROM_INPUTS``, beside
their fla peers (run 100 had time for
level 1 alone: 13.3 ms). Rows to ``$OUT/run103.jsonl``.

``packed``: KDA and GDN forward + backward on 96 packed sequences with ``PACKED_STATE_KERNELS`` off and on.
``l2norm``: the forward with ``use_qk_l2norm_in_kernel``, the norm by torch or in ``chunk_intra``
(``L2NORM_IN_KERNEL``). ``steep``: the forward with a layer's initial gates, ``PAIRWISE_BY_PRODUCTS`` off and on.

    FLA_FLASH_QLA=0 python results/tuning/run103-backward.py [switches] [levels] [profile] [packed] [l2norm]
    [steep]
"""
import importlib.util
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402
from harness import OUT, log  # noqa: E402

RUN = "run103"
spec = importlib.util.spec_from_file_location("run91_backward", os.path.join(HERE, "run91-backward.py"))
run91 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run91)
SHAPE = (1, 8192, 96, 128)
NEW = ("SCORES_FROM_FORWARD", "PAIR_KERNEL_TWO_BLOCKS", "PAIR_KERNEL_BY_CHANNELS", "GRADS_IN_INPUT_DTYPE",
       "PAIR_PIECES_FROM_FORWARD", "PAIR_SUMS_BY_PRODUCTS")
NEW_GDN = ("GRADS_IN_INPUT_DTYPE", "INVERSE_FROM_FORWARD")


def timed(row, run, describe=None, peak=False, warmup_ms=100, rep_ms=500):
    """``row`` logged with ``run``'s median time, its peak memory (``peak``) and what ``describe(its output)``
    adds, or with the error that stopped it."""
    from kda.bench import median_ms

    try:
        got = run()
        row["ms"] = round(median_ms(run, warmup_ms=warmup_ms, rep_ms=rep_ms), 3)
        row.update({"peak_MB": run91.peak_mb(run)} if peak else {}, **(describe(got) if describe else {}))
    except Exception as e:
        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    log(RUN, row)


def finite(outputs):
    return {"finite": all(bool(torch.isfinite(x).all()) for x in outputs)}


def switches():
    """KDA forward + backward with each new switch and all of them, GDN with its one, against the defaults."""
    import kda
    from kda import cuda_autograd

    cuda_autograd.DEVICE_BACKWARD = True
    for op, fn, names in (("KDA", kda.chunk_kda, NEW), ("GDN", kda.chunk_gated_delta_rule, NEW_GDN)):
        cases = ((), *((name,) for name in names), *((names,) if len(names) > 1 else ()))
        time_switches(op, fn, names, cases)


def time_switches(op, fn, names, cases):
    """One row per case (the switches of ``names`` that it turns on): time, peak memory, finiteness and every
    gradient against the first case's; every switch of ``names`` off at the end."""
    from kda import backward
    from kda.metrics import rel_l2

    leaves, do = run91.inputs(*SHAPE, op == "KDA")
    first = []                                   # the defaults' gradients, what the others are held to

    def against_defaults(got):
        first.append(got)
        return {**finite(got), "rel_l2_vs_defaults": {n: float(f"{rel_l2(a.float(), b.float()):.2e}")
                                                      for n, a, b in zip("q k v g beta".split(), got, first[0])}}

    for on in cases:
        for name in names:
            setattr(backward, name, name in on)
        timed({"stage": "switches", "op": op, "on": list(on)}, run91.step(fn, leaves, do), against_defaults,
              peak=True, warmup_ms=200, rep_ms=1000)
    for name in names:
        setattr(backward, name, False)
    del leaves, do
    torch.cuda.empty_cache()


def levels():
    """Levels 1-3 (a gate per head or none) with neither, with ``LEVEL_PIECES`` and with
    ``LEVEL_PASSES_FROM_INPUTS`` (no pieces), and fla's peers."""
    from kda import backward, cuda_autograd

    spec = importlib.util.spec_from_file_location("run100_levels", os.path.join(HERE, "run100-levels.py"))
    run100 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run100)
    cuda_autograd.DEVICE_BACKWARD = True
    B, T, H, D = SHAPE
    x = run100.inputs(B, T, H, D)
    for level, (own, impls) in run100.levels(x, D ** -0.5).items():
        if not level.startswith(("1", "2", "3 gated, per head")):
            continue
        leaves = [t.detach().clone().requires_grad_() for t in [x["q"], x["k"], x["v"]] + [x[n] for n in own]]
        for name, fn in impls.items():
            for how in (("", "level_pieces", "passes_from_inputs") if name == "kda" else ("",)):
                backward.LEVEL_PIECES = how == "level_pieces"
                backward.LEVEL_PASSES_FROM_INPUTS = how == "passes_from_inputs"
                timed({"stage": "levels", "level": level, "impl": " ".join([name, how]).strip()},
                      lambda: torch.autograd.grad(fn(*leaves), leaves, x["do"]), finite, peak=True, warmup_ms=200,
                      rep_ms=1000)
        backward.LEVEL_PIECES = backward.LEVEL_PASSES_FROM_INPUTS = False
    torch.cuda.empty_cache()


def profile():
    import kda
    from kda import cuda_autograd

    cuda_autograd.DEVICE_BACKWARD = True
    for op, fn in (("kda", kda.chunk_kda), ("gdn", kda.chunk_gated_delta_rule)):
        leaves, do = run91.inputs(*SHAPE, op == "kda")
        ms = harness.profile(run91.step(fn, leaves, do), os.path.join(OUT, f"{RUN}-{op}.txt"),
                             title=f"{op}: shape {SHAPE}, bf16, ")
        log(RUN, {"profile": op, "cuda_ms_per_step": round(ms, 3)})
        del leaves, do
        torch.cuda.empty_cache()


def l2norm():
    """Issue 41's row: chunk_kda and chunk_gated_delta_rule forward at (1, 8192, 96, 128), plain and with
    ``use_qk_l2norm_in_kernel`` on raw keys, the norm by torch first (``L2NORM_IN_KERNEL`` off) and in
    ``chunk_intra`` (on; GDN then takes level 5's path, whose ``chunk_intra`` normalizes, at 96 heads too)."""
    import kda
    from kda import gated_delta

    for op, fn in (("KDA", kda.chunk_kda), ("GDN", kda.chunk_gated_delta_rule)):
        leaves, _ = run91.inputs(*SHAPE, op == "KDA")
        q, k, v, g, beta = (x.detach() for x in leaves)
        for name, norm, fused, kernel in (("plain", False, False, False), ("l2norm, torch", True, False, False),
                                          ("l2norm, in chunk_intra", True, True, False),
                                          ("l2norm, its own kernel", True, False, True),
                                          ("l2norm, in chunk_intra or its own kernel", True, True, True)):
            gated_delta.L2NORM_IN_KERNEL, gated_delta.L2NORM_KERNEL = fused, kernel
            timed({"stage": "l2norm", "op": op, "call": name},
                  lambda: fn(q * 3, k * 3, v, g, beta, use_qk_l2norm_in_kernel=norm))
        gated_delta.L2NORM_IN_KERNEL = gated_delta.L2NORM_KERNEL = False
        leaves = None
        torch.cuda.empty_cache()


def steep():
    """Issue 41's steep gates: chunk_kda's forward at (1, 8192, 96, 128) with mild gates (logsigmoid) and with a
    layer's initial gates (``-exp(A_log) softplus(x + dt_bias)``, ``A_log = log U(1, 16)``: most chunks steep),
    ``PAIRWISE_BY_PRODUCTS`` off and on, outputs of on against off; then as the layer calls it (a raw gate with
    ``A_log`` and ``dt_bias``, beta's logits, the L2 norm in the op), every switch of issue 41 off and all on."""
    import kda
    from kda import gated_delta
    from kda.metrics import rel_l2

    leaves, _ = run91.inputs(*SHAPE, True)
    q, k, v, g, beta = (x.detach() for x in leaves)
    gen = torch.Generator(device="cuda").manual_seed(41)
    A = torch.empty(SHAPE[2], device="cuda").uniform_(1, 16, generator=gen)
    x = torch.randn(g.shape, generator=gen, device="cuda") + 0.1 * torch.randn(g.shape[2:], generator=gen,
                                                                               device="cuda")
    for gate_name, gate in (("logsigmoid", g), ("layer", -A[:, None] * torch.nn.functional.softplus(x))):
        off = []                                 # the output with the switch off, what on is held to

        def against_off(got):
            off.append(got)
            return {"rel_l2_vs_off": float(f"{rel_l2(got.float(), off[0].float()):.2e}")}

        for on in (False, True):
            gated_delta.PAIRWISE_BY_PRODUCTS = on
            timed({"stage": "steep", "gates": gate_name, "PAIRWISE_BY_PRODUCTS": on},
                  lambda: kda.chunk_kda(q, k, v, gate, beta)[0], against_off)
    raw, logits = x, torch.randn(beta.shape, generator=gen, device="cuda")
    A_log, dt_bias = A.log(), 0.1 * torch.randn(SHAPE[2] * SHAPE[3], generator=gen, device="cuda")
    for on in (False, True):
        for name in ("PAIRWISE_BY_PRODUCTS", "L2NORM_IN_KERNEL", "ACTIVATIONS_IN_KERNEL"):
            setattr(gated_delta, name, on)
        timed({"stage": "steep", "gates": "the layer's call", "issue 41's switches": on},
              lambda: kda.chunk_kda(q * 3, k * 3, v, raw, logits, A_log=A_log, dt_bias=dt_bias, use_gate_in_kernel=True,
                                    use_beta_sigmoid_in_kernel=True, use_qk_l2norm_in_kernel=True)[0])
    for name in ("PAIRWISE_BY_PRODUCTS", "L2NORM_IN_KERNEL", "ACTIVATIONS_IN_KERNEL"):
        setattr(gated_delta, name, False)
    torch.cuda.empty_cache()


def packed():
    """KDA and GDN forward + backward on 32768 tokens packed from 96 sequences of random length (H = 32, D = 128),
    with ``PACKED_STATE_KERNELS`` off (the torch passes, sequence by sequence) and on (one launch each)."""
    import kda
    from kda import backward, cuda_autograd

    cuda_autograd.DEVICE_BACKWARD = True
    gen = torch.Generator().manual_seed(3)
    cuts = torch.randperm(32767, generator=gen)[:95].add(1).sort().values.tolist()
    cu = torch.tensor([0, *cuts, 32768], dtype=torch.int32, device="cuda")
    for op, fn in (("KDA", kda.chunk_kda), ("GDN", kda.chunk_gated_delta_rule)):
        leaves, do = run91.inputs(1, 32768, 32, 128, op == "KDA")
        for on in (False, True):
            backward.PACKED_STATE_KERNELS = on
            timed({"stage": "packed", "op": op, "PACKED_STATE_KERNELS": on},
                  lambda: torch.autograd.grad(fn(*leaves, cu_seqlens=cu)[0], leaves, do), finite, peak=True)
        backward.PACKED_STATE_KERNELS = False
        leaves = do = None                     # freed before the next op's inputs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    stages = sys.argv[1:] or ["switches", "levels", "profile"]
    if "l2norm" in stages:
        l2norm()
    if "steep" in stages:
        steep()
    if "packed" in stages:
        packed()
    if "switches" in stages:
        switches()
    if "levels" in stages:
        levels()
    if "profile" in stages:
        profile()

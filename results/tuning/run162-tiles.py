"""Run 162 (prepared 2026-12-07): GDN's short packed sequences with the tiles packed by best fit and read through a row
map (``PACKED_TILE_CONFIG``'s ``gathered``), against the tiles filled in order; each with the least shared memory live
at once (``compact``: five blocks per SM gathered, four in order, against three); then with the value checks in a
kernel of their own queued first (``TILE_CHECKS_FIRST``).

Run 157 (H100) had the tile kernel at 1.014 ms on run 140's 1024 sequences of 1 to 64 tokens, 696 tiles filled to 75%;
by best fit the same sequences take 532 tiles (526 chunks as one sequence). Run 160 had the op at 1.420 ms there with
0.54 ms of each call outside the kernel, the host's: the tile kernel sets the value flags, so the host waits for the
whole kernel before it returns, and the next call's host work is not hidden behind any kernel. For each short case:
the op in order and gathered (outputs compared), its stages, the host's time per call (queued back to back, and from
an idle GPU), the same call unchecked, a cProfile of 20 calls (the 25 largest by cumulative time), one sequence of the
same tokens and FlashQLA's packed call. Rows to ``$OUT/run162.jsonl``, the profiles to ``$OUT/run162-profile.txt``.

    FLA_FLASH_QLA=0 python results/tuning/run162-tiles.py
"""
import cProfile
import io
import os
import pstats
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import host_times, log, script, stage_times, time_stages, timed  # noqa: E402

run140 = script("run140-gdn.py")
RUN = "run162"
# packed_tile_output's arrangement, and whether the values are checked first by a kernel of their own
FORMS = {"in order": (dict(early_scores=True), False), "gathered": (dict(early_scores=True, gathered=True), False),
         "in order, compact": (dict(compact=True), False), "gathered, compact": (dict(gathered=True, compact=True), False),
         "gathered, compact, checks first": (dict(gathered=True, compact=True), True)}


def host_profile(title, fn):
    prof = cProfile.Profile()
    fn()
    torch.cuda.synchronize()
    prof.enable()
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(25)
    with open(os.path.join(os.environ.get("OUT", "."), f"{RUN}-profile.txt"), "a") as f:
        f.write(f"==== {title} (20 calls)\n{text.getvalue()}\n")


if __name__ == "__main__":
    import flash_qla

    from kda import gated_delta
    from kda.kernels import scalar_gate

    time_stages()
    for case, lens in run140.short_cases().items():
        cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), device="cuda")
        cu_cpu = cu.cpu()
        inputs = run140.dense_inputs(1, int(cu[-1]), 32, 128)
        outs = []
        for form, (config, checks_first) in FORMS.items():
            scalar_gate.PACKED_TILE_CONFIG, scalar_gate.TILE_CHECKS_FIRST = config, checks_first
            for checked in (True, False) if form == "in order" else (True,):
                fn = lambda: gated_delta.chunk_gated_delta_rule(*inputs, cu_seqlens=cu, cu_seqlens_cpu=cu_cpu,
                                                                check_values=checked)[0]
                row = {"case": case, "impl": f"kda tiles {form}", "check_values": checked}
                timed(RUN, row, fn, describe=lambda o: outs.append(o) or {})
                if checked:
                    stage_times(RUN, {**row, "what": "stages"}, fn)
                    log(RUN, {**row, "what": "host", **host_times(fn)})
                    host_profile(f"{case}, {form}", fn)
        for form, out in zip([f for f in FORMS if f != "in order"], outs[2:]):
            a, b = outs[0].float(), out.float()
            log(RUN, {"case": case, "form": form, "vs_in_order_rel_l2": float(f"{float((a - b).norm() / a.norm()):.2e}"),
                      "finite": bool(torch.isfinite(b).all())})
        scalar_gate.PACKED_TILE_CONFIG, scalar_gate.TILE_CHECKS_FIRST = dict(early_scores=True), False
        timed(RUN, {"case": case, "impl": "FlashQLA 0.1.3"},
              lambda: flash_qla.chunk_gated_delta_rule(*inputs, scale=128 ** -0.5, cu_seqlens=cu)[0])
        one = lambda: gated_delta.chunk_gated_delta_rule(*inputs)[0]
        timed(RUN, {"case": case, "impl": f"kda, the same tokens as one sequence (T = {int(cu[-1])})"}, one)
        torch.cuda.empty_cache()

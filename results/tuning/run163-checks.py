"""Run 163 (prepared 2026-12-08): the packed tiles' value checks on a stream of their own beside the tile kernel
(``scalar_gate.TILE_CHECKS_BESIDE``, ``validate.check_beside``) against the same checks in line before it
(``TILE_CHECKS_FIRST`` alone, on by default since run 162).

Run 162 (H100) had, on run 140's 1024 sequences of 1 to 64 tokens, the checks' kernel 0.138 ms and the tile kernel
0.778 ms one after the other; the call 0.867 ms against 0.744 for the same tokens as one sequence (issue 15's goal:
1.15x). The tile kernel is bound by its blocks' latency (about 40% of the bandwidth its bytes need), so the checks may
run beside it for little. For each short case and for grouped value heads (16 query and key heads, 32 value heads, on
the 1024 short sequences): in line, beside, in line again (the card's drift), unchecked, each with its host time from
idle; the outputs of beside against in line; one sequence of the same tokens. Rows to ``$OUT/run163.jsonl``.

    FLA_FLASH_QLA=0 python results/tuning/run163-checks.py
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import host_times, log, script, stage_times, time_stages, timed  # noqa: E402

run140 = script("run140-gdn.py")
RUN = "run163"
FORMS = {"checks in line": (False, True), "checks beside": (True, True), "checks in line again": (False, True),
         "unchecked": (False, False)}


if __name__ == "__main__":
    from kda import gated_delta
    from kda.kernels import scalar_gate

    time_stages()
    cases = dict(run140.short_cases())
    cases["1024 sequences of 1 to 64 tokens, 16 query and key heads for 32 value heads"] = cases[
        "1024 sequences of 1 to 64 tokens"]
    for case, lens in cases.items():
        cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), device="cuda")
        cu_cpu = cu.cpu()
        q, k, v, g, beta = run140.dense_inputs(1, int(cu[-1]), 32, 128)
        if "value heads" in case:
            q, k = q[:, :, ::2].contiguous(), k[:, :, ::2].contiguous()
        outs = {}
        for form, (beside, checked) in FORMS.items():
            scalar_gate.TILE_CHECKS_BESIDE = beside
            fn = lambda: gated_delta.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, cu_seqlens_cpu=cu_cpu,
                                                            check_values=checked)[0]
            row = {"case": case, "impl": f"kda tiles, {form}"}
            timed(RUN, row, fn, describe=lambda o, form=form: outs.setdefault(form, o) is None or {})
            log(RUN, {**row, "what": "host", **host_times(fn)})
            if form in ("checks in line", "checks beside"):
                stage_times(RUN, {**row, "what": "stages"}, fn)
        scalar_gate.TILE_CHECKS_BESIDE = False
        a, b = outs["checks in line"].float(), outs["checks beside"].float()
        log(RUN, {"case": case, "beside_vs_in_line_equal": bool(torch.equal(a, b)), "finite": bool(torch.isfinite(b).all())})
        timed(RUN, {"case": case, "impl": f"kda, the same tokens as one sequence (T = {int(cu[-1])})"},
              lambda: gated_delta.chunk_gated_delta_rule(q, k, v, g, beta)[0])
        torch.cuda.empty_cache()

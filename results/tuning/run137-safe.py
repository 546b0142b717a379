"""Run 137 (prepared 2026-12-06): safe_gate's call by the capped steps. Run 135 timed safe_gate's form 15% over the
plain call on mild gates (the middles' compile, with halvings, runs for chunks that need neither), where the
capped compile costs 3% (the softplus form); on a layer's gates run 133 had the capped steps 2% behind the middles.
This times safe_gate's layer call (raw gate, beta's logits, raw keys; ``lower_bound=-5``) with ``CAPPED_STEPS_FOR``
without and with ``"sigmoid"``, mild gates (``A_log = 0``) and a layer's, at the three level-5 shapes, fla beside.
Rows to ``$OUT/run137.jsonl``.

    FLA_FLASH_QLA=0 python results/tuning/run137-safe.py --warm
"""
import importlib.util
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402

RUN = "run137"
FORMS = {"middles": (None, "softplus"), "capped": (None, "softplus", "sigmoid")}       # CAPPED_STEPS_FOR


def run135():
    spec = importlib.util.spec_from_file_location("run135_options", os.path.join(HERE, "run135-options.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def safe_call(module, shape, gates):
    return [c for c in module.calls(*shape, gates) if c[0] == "layer call, safe_gate"][0]


def warm_one(i):
    """The call's kernels with the ``i``-th of ``FORMS`` compiled (``harness.compile_in_processes``)."""
    import kda
    from kda.kernels import chunk_intra

    form = list(FORMS)[i]
    chunk_intra.CAPPED_STEPS_FOR = FORMS[form]
    _, args, kw = safe_call(run135(), (1, 512, 96, 128), "layer")
    kda.chunk_kda(*args, **kw)
    torch.cuda.synchronize()
    return {"what": "warm", "form": form}


def main():
    from fla.ops.kda import chunk_kda as fla_kda

    import kda
    from kda.kernels import chunk_intra

    module = run135()
    for shape in module.SHAPES:
        for gates in module.GATES:
            call, args, kw = safe_call(module, shape, gates)
            first, row = [], {"shape": list(shape), "gates": gates, "call": call}
            for form, forms in FORMS.items():
                chunk_intra.CAPPED_STEPS_FOR = forms
                harness.timed(RUN, {**row, "impl": f"kda {form}"}, lambda: kda.chunk_kda(*args, **kw)[0],
                              harness.against(first))
            harness.timed(RUN, {**row, "impl": "fla"}, lambda: fla_kda(*args, scale=shape[-1] ** -0.5, **kw)[0],
                          harness.against(first))
            first.clear()
            torch.cuda.empty_cache()


if __name__ == "__main__":
    if "--warm" in sys.argv:
        harness.compile_in_processes(RUN, len(FORMS), warm_one)
    main()

"""Every TileLang kernel lowers and compiles for sm_90a on a machine without a GPU (nvcc only)."""

import pytest

pytestmark = pytest.mark.tilelang

# (module, kernel, parameters): both dtypes, both head sizes, with and without state
CASES = [
    ("level1", "seq_in_grid", dict(DK=64, DV=64, dtype="float16")),
    ("level1", "seq_in_grid", dict(DK=128, DV=64, dtype="bfloat16")),
    ("level1", "seq_in_loop", dict(DK=128, DV=128, dtype="bfloat16")),
    ("level1", "seq_in_loop", dict(DK=64, DV=128, dtype="float16", initial_state=True, final_state=True)),
    ("level1", "seq_in_loop", dict(DK=128, DV=128, dtype="bfloat16", overlap_gemms=False)),
    ("level2", "seq_in_loop", dict(DK=128, DV=128, dtype="bfloat16")),
    ("level2", "seq_in_loop", dict(DK=128, DV=64, dtype="float16", initial_state=True, final_state=True)),
    ("level2", "seq_in_loop", dict(DK=128, DV=128, dtype="bfloat16", overlap_gemms=False)),
    ("level2", "seq_in_loop", dict(DK=128, DV=128, dtype="bfloat16", weight_tables=True)),
    ("level3", "chunk_cumsum", dict(D=1)),
    ("level3", "chunk_cumsum", dict(D=128, gate_dtype="bfloat16")),
    ("level3", "seq_in_loop_scalar", dict(DK=128, DV=128, dtype="bfloat16")),
    ("level3", "seq_in_loop_scalar", dict(DK=64, DV=128, dtype="float16", initial_state=True, final_state=True)),
    ("level3", "seq_in_loop_scalar", dict(DK=128, DV=128, dtype="bfloat16", slots=3, out_groups=2)),
    ("level3", "seq_in_loop_per_channel", dict(DK=128, DV=128, dtype="bfloat16")),
    ("level3", "seq_in_loop_per_channel", dict(DK=128, DV=64, dtype="float16", initial_state=True, final_state=True)),
    ("level4", "chunk_wy", dict(DK=128, DV=128, dtype="bfloat16")),
    ("level4", "chunk_wy", dict(DK=64, DV=128, dtype="float16", merge="substitution", write_inverse=True)),
    ("level4", "state_output_pass", dict(DK=128, DV=128, dtype="bfloat16")),
    ("level4", "state_output_pass", dict(DK=64, DV=128, dtype="float16", initial_state=True, final_state=True)),
    ("level4", "state_pass", dict(DK=128, DV=128, dtype="bfloat16")),
    ("level4", "chunk_output", dict(DK=128, DV=64, dtype="float16")),
    ("level5", "chunk_intra", dict(DK=128, DV=128, dtype="bfloat16", spill_budget=400)),
    ("level5", "chunk_intra", dict(DK=64, DV=128, dtype="float16")),
    ("level5", "chunk_intra", dict(DK=128, dtype="bfloat16", gate_dtype="bfloat16", delta=False)),
    ("level5", "chunk_intra", dict(DK=64, dtype="float16", gate_dtype="float16", delta=False)),
    ("level5", "gated_state_output_pass", dict(DK=128, DV=128, dtype="bfloat16", initial_state=True, final_state=True)),
    ("level5", "gated_state_output_pass", dict(DK=128, DV=64, dtype="float16", initial_state=True, final_state=True)),
    ("level5", "gated_state_output_pass", dict(DK=64, DV=128, dtype="bfloat16", block_dv=64, initial_state=True,
                                               final_state=True)),
    ("level5", "chunk_intra", dict(DK=128, DV=64, dtype="bfloat16", varlen=True, spill_budget=400)),
    ("level5", "chunk_intra", dict(DK=128, DV=128, dtype="bfloat16", value_groups=2, spill_budget=400)),
    ("level5", "chunk_intra", dict(DK=128, DV=128, dtype="bfloat16", scalar_gate=True)),
    ("level5", "chunk_intra", dict(DK=64, DV=128, dtype="float16", scalar_gate=True, varlen=True)),
    ("level5", "gated_state_output_pass", dict(DK=128, DV=128, dtype="bfloat16", block_dv=64, varlen=True,
                                               initial_state=True, final_state=True)),
    ("level5", "gated_state_output_pass", dict(DK=128, DV=128, dtype="bfloat16")),
    ("level5", "gated_state_output_pass", dict(DK=128, DV=64, dtype="float16", varlen=True, final_state=True)),
    ("decode", "fused_recurrent", dict(DK=128, DV=128, dtype="bfloat16")),
    ("decode", "fused_recurrent", dict(DK=64, DV=128, dtype="float16", scalar_gate=True, varlen=True, pooled=True)),
    ("decode", "fused_recurrent", dict(DK=128, DV=64, dtype="bfloat16", value_groups=2, with_initial=False,
                                       store_final=False)),
    ("decode", "fused_recurrent", dict(DK=128, DV=128, dtype="bfloat16", gate_act="softplus", beta_act="sigmoid")),
    ("decode", "fused_recurrent", dict(DK=128, DV=128, dtype="bfloat16", scalar_gate=True, gate_act="sigmoid",
                                       beta_act="2sigmoid", pooled=True)),
]


@pytest.mark.parametrize("module,name,params", CASES, ids=[f"{m}.{n}-{i}" for i, (m, n, _) in enumerate(CASES)])
def test_compiles_without_spills(module, name, params):
    import importlib

    from kda.kernels.build import SM90A, compile_program, ptxas_report

    params = dict(params)
    budget = params.pop("spill_budget", 0)    # bytes ptxas may spill (a register cap for 2 blocks/SM)
    fn = getattr(importlib.import_module(f"kda.kernels.{module}"), name)
    report = ptxas_report(compile_program(fn, (), target=SM90A, **params))
    assert report["spill_store_bytes"] <= budget and report["spill_load_bytes"] <= budget, report
    assert 0 < report["registers"] <= 255


def test_article_seq_in_grid_as_written():
    """Article 000 section 4 as written (the own chunk loaded back into the pipelined buffers):
    tilelang 0.1.15 rejects it with two stages and accepts it with one."""
    from kda.kernels import level1
    from kda.kernels.build import SM90A, compile_program

    with pytest.raises(Exception, match="Versioned buffer load escaped pipeline stage context"):
        compile_program(level1.seq_in_grid, (), target=SM90A, DK=64, DV=64, num_stages=2, own_chunk_buffers=False)
    compile_program(level1.seq_in_grid, (), target=SM90A, DK=64, DV=64, num_stages=1, own_chunk_buffers=False)


def test_register_budget_bisection_matches_a_scan_from_the_top():
    """``registers.report`` bisects the consumer's register budget; a scan from the declared
    budget down, one ptxas run per step of 8, stops at the same smallest budget."""
    from kda.kernels import level1, registers
    from kda.kernels.build import SM90A, compile_program, ptxas_of

    kernel = compile_program(level1.seq_in_loop, (), target=SM90A, DK=128, DV=128, dtype="bfloat16")
    found = registers.report(kernel)
    ptx = kernel._get_ptx()
    smallest = None
    for budget in range(found["declared"], 23, -8):
        patched = registers.INC.sub(f"setmaxnreg.inc.sync.aligned.u32 {budget};", ptx)
        if ptxas_of(patched, "sm_90a")["spill_store_bytes"]:
            break
        smallest = budget
    assert found["smallest_without_spills"] == smallest == 120

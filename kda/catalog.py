"""Every public op in one table: where it is defined, the float64 recurrence it is checked against, its CPU path,
the kernels its CUDA path compiles, their launchers, its tests and its chapter.

``kda.export`` cuts an op out by its row, ``tests/test_catalog.py`` holds every row to the tree (each name
resolves, each file exists) and the API page prints the table (``snippets/api/ops.py``). Names are dotted
paths in the package, files are paths from the repository's root.
"""

from __future__ import annotations

from dataclasses import dataclass

BF16_128 = dict(DK=128, DV=128, dtype="bfloat16")
STATES = dict(BF16_128, initial_state=True, final_state=True)      # the calls below pass h0 and want ht
STATE_PASS = ("gated_state_pass", "gated_state_output_pass", STATES)


@dataclass(frozen=True)
class Op:
    module: str        # the kda module that defines the public function
    reference: str     # the kda.reference module whose ``recurrent`` is the float64 check
    cpu_path: str      # what the op runs on CPU tensors
    kernels: tuple     # (kernels module, factory, parameters) that the CUDA path compiles
    launchers: tuple   # the functions that allocate a kernel's outputs and launch it, beside the kernel
    tests: tuple       # the test files that check it (CPU, then GPU)
    chapter: str       # the page that teaches it (docs/<language>/<chapter>.md)
    call: str          # the op on the export test's inputs
    ref_call: str      # the recurrence on the same inputs (q already scaled)


OPS = {
    "linear_attention": Op(
        "ops", "level1", "kda.reference.level1.chunked",
        (("linear_pass", "seq_in_loop_scalar", dict(STATES, gate="none")),),
        ("kda.kernels.linear_pass.pass_launch",),
        ("tests/test_api.py", "tests/test_backward.py", "tests/test_gpu_level12.py", "tests/test_gpu_backward.py"),
        "level1",
        "linear_attention(q, k, v, scale=scale, initial_state=h0, output_final_state=True)",
        "recurrent(q * scale, k, v, h0, True)"),
    "decay_attention": Op(
        "ops", "level2", "kda.reference.level2.chunked",
        (("linear_pass", "seq_in_loop_scalar", dict(STATES, gate="constant")),),
        ("kda.kernels.linear_pass.pass_launch",),
        ("tests/test_api.py", "tests/test_backward.py", "tests/test_gpu_level12.py", "tests/test_gpu_backward.py"),
        "level2",
        "decay_attention(q, k, v, alpha, scale=scale, initial_state=h0, output_final_state=True)",
        "recurrent(q * scale, k, v, alpha, h0, True)"),
    "gated_attention": Op(
        "gated", "level3", "kda.reference.level3.chunked",
        (("linear_pass", "chunk_cumsum", dict(D=1)),
         ("linear_pass", "seq_in_loop_scalar", STATES),
         ("chunk_intra", "chunk_intra", dict(DK=128, dtype="bfloat16", gate_dtype="float32", delta=False)),
         ("per_channel_pass", "seq_in_loop_per_channel", STATES)),
        ("kda.kernels.linear_pass.gate_cumsum", "kda.kernels.linear_pass.pass_launch",
         "kda.kernels.chunk_intra.prepare_chunks", "kda.kernels.per_channel_pass.pass_launch"),
        ("tests/test_api.py", "tests/test_backward.py", "tests/test_gpu_level3.py", "tests/test_gpu_backward.py"),
        "level3",
        "gated_attention(q, k, v, g, scale=scale, initial_state=h0, output_final_state=True)",
        "recurrent(q * scale, k, v, g, h0, True)"),
    "delta_rule": Op(
        "delta", "level4", "kda.reference.level4.chunked",
        (("wy_solve", "chunk_wy", BF16_128), ("linear_pass", "state_output_pass", STATES)),
        ("kda.kernels.wy_solve.run_chunk_wy", "kda.kernels.linear_pass.pass_launch"),
        ("tests/test_api.py", "tests/test_backward.py", "tests/test_gpu_level4.py", "tests/test_gpu_backward.py"),
        "level4",
        "delta_rule(q, k, v, beta, scale=scale, initial_state=h0, output_final_state=True)",
        "recurrent(q * scale, k, v, beta, h0, True)"),
    "chunk_kda": Op(
        "gated_delta", "level0", "kda.reference.level0.chunked",
        (("chunk_intra", "chunk_intra", dict(BF16_128, gate_dtype="float32")), STATE_PASS),
        ("kda.kernels.chunk_intra.prepare_chunks", "kda.kernels.gated_state_pass.state_pass_launch"),
        ("tests/test_gated_delta.py", "tests/test_backward.py", "tests/test_gpu_level5.py",
         "tests/test_gpu_backward.py"), "level5",
        "chunk_kda(q, k, v, g, beta, scale=scale, initial_state=h0, output_final_state=True)",
        "recurrent(q * scale, k, v, g, beta, h0, True)"),
    "chunk_gated_delta_rule": Op(
        "gated_delta", "level0", "kda.reference.level0.chunked",
        # level 5's path, and where its blocks fill the SMs the scalar-gate path (gated_delta.SCALAR_GATE_PATH)
        (("chunk_intra", "chunk_intra", dict(BF16_128, gate_dtype="float32", scalar_gate=True)), STATE_PASS,
         ("scalar_gate", "chunk_gated_inverse", dict(DK=128, dtype="bfloat16")),
         ("scalar_gate", "inverse_state_output_pass", STATES)),
        ("kda.kernels.chunk_intra.prepare_chunks", "kda.kernels.gated_state_pass.state_pass_launch",
         "kda.kernels.scalar_gate.scalar_gate_inverse", "kda.kernels.scalar_gate.scalar_gate_pass_launch"),
        ("tests/test_gated_delta.py", "tests/test_backward.py", "tests/test_gpu_level5.py",
         "tests/test_gpu_scalar_gate.py", "tests/test_gpu_backward.py"), "level5",
        "chunk_gated_delta_rule(q, k, v, g_head, beta, scale=scale, initial_state=h0, output_final_state=True)",
        "recurrent(q * scale, k, v, g_head, beta, h0, True)"),
    "fused_recurrent_kda": Op(
        "decode", "level0", "kda.reference.level0.recurrent",
        (("decode", "value_checks", dict()),
         ("decode", "fused_recurrent", dict(BF16_128, gate_dtype="float32", guarded=True))),
        ("kda.kernels.decode.run_fused_recurrent",),
        ("tests/test_decode.py", "tests/test_gpu_decode.py"), "inference",
        "fused_recurrent_kda(q, k, v, g, beta, scale=scale, initial_state=h0, output_final_state=True)",
        "recurrent(q * scale, k, v, g, beta, h0, True)"),
    "fused_recurrent_gated_delta_rule": Op(
        "decode", "level0", "kda.reference.level0.recurrent",
        (("decode", "value_checks", dict()),
         ("decode", "fused_recurrent", dict(BF16_128, gate_dtype="float32", scalar_gate=True, guarded=True))),
        ("kda.kernels.decode.run_fused_recurrent",),
        ("tests/test_decode.py", "tests/test_gpu_decode.py"), "inference",
        "fused_recurrent_gated_delta_rule(q, k, v, g=g_head, beta=beta, scale=scale, initial_state=h0, "
        "output_final_state=True)",
        "recurrent(q * scale, k, v, g_head, beta, h0, True)"),
}

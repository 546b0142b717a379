"""Every TileLang kernel lowers and compiles for sm_90a on a machine without a GPU (nvcc only)."""

import pytest

pytestmark = pytest.mark.tilelang

# (module, kernel, parameters): both dtypes, both head sizes, with and without state
CASES = [
    ("chapters.linear_attention", "seq_in_grid", dict(DK=64, DV=64, dtype="float16")),
    ("chapters.linear_attention", "seq_in_grid", dict(DK=128, DV=64, dtype="bfloat16")),
    ("chapters.linear_attention", "seq_in_loop", dict(DK=128, DV=128, dtype="bfloat16")),
    ("chapters.linear_attention", "seq_in_loop", dict(DK=64, DV=128, dtype="float16", initial_state=True,
                                                      final_state=True)),
    ("chapters.linear_attention", "seq_in_loop", dict(DK=128, DV=128, dtype="bfloat16", overlap_gemms=False)),
    ("chapters.constant_decay", "seq_in_loop", dict(DK=128, DV=128, dtype="bfloat16")),
    ("chapters.constant_decay", "seq_in_loop", dict(DK=128, DV=64, dtype="float16", initial_state=True,
                                                    final_state=True)),
    ("chapters.constant_decay", "seq_in_loop", dict(DK=128, DV=128, dtype="bfloat16", overlap_gemms=False)),
    ("chapters.constant_decay", "seq_in_loop", dict(DK=128, DV=128, dtype="bfloat16", weight_tables=True)),
    ("linear_pass", "chunk_cumsum", dict(D=1)),
    ("linear_pass", "chunk_cumsum", dict(D=128, gate_dtype="bfloat16")),
    ("linear_pass", "seq_in_loop_scalar", dict(DK=128, DV=128, dtype="bfloat16")),
    ("linear_pass", "seq_in_loop_scalar", dict(DK=64, DV=128, dtype="float16", initial_state=True, final_state=True)),
    ("linear_pass", "seq_in_loop_scalar", dict(DK=128, DV=128, dtype="bfloat16", slots=3, out_groups=2)),
    ("linear_pass", "seq_in_loop_scalar", dict(DK=128, DV=128, dtype="bfloat16", gate="constant")),
    ("linear_pass", "seq_in_loop_scalar", dict(DK=64, DV=64, dtype="float16", gate="constant", initial_state=True,
                                               final_state=True)),
    ("per_channel_pass", "seq_in_loop_per_channel", dict(DK=128, DV=128, dtype="bfloat16")),
    ("per_channel_pass", "seq_in_loop_per_channel", dict(DK=128, DV=64, dtype="float16", initial_state=True,
                                                         final_state=True)),
    ("wy_solve", "chunk_wy", dict(DK=128, DV=128, dtype="bfloat16")),
    ("wy_solve", "chunk_wy", dict(DK=64, DV=128, dtype="float16", merge="substitution", write_inverse=True)),
    ("linear_pass", "state_output_pass", dict(DK=128, DV=128, dtype="bfloat16")),
    ("linear_pass", "state_output_pass", dict(DK=64, DV=128, dtype="float16", initial_state=True, final_state=True)),
    ("linear_pass", "state_output_pass", dict(DK=128, DV=128, dtype="bfloat16", slots=2, out_groups=1)),
    ("chapters.delta_split", "state_pass", dict(DK=128, DV=128, dtype="bfloat16")),
    ("chapters.delta_split", "chunk_output", dict(DK=128, DV=64, dtype="float16")),
    ("chunk_intra", "chunk_intra", dict(DK=128, DV=128, dtype="bfloat16", spill_budget=400)),
    ("chunk_intra", "chunk_intra", dict(DK=64, DV=128, dtype="float16")),
    ("chunk_intra", "chunk_intra", dict(DK=128, dtype="bfloat16", gate_dtype="bfloat16", delta=False)),
    ("chunk_intra", "chunk_intra", dict(DK=64, dtype="float16", gate_dtype="float16", delta=False)),
    ("gated_state_pass", "gated_state_output_pass", dict(DK=128, DV=128, dtype="bfloat16", initial_state=True,
                                                         final_state=True)),
    ("gated_state_pass", "gated_state_output_pass", dict(DK=128, DV=64, dtype="float16", initial_state=True,
                                                         final_state=True)),
    ("gated_state_pass", "gated_state_output_pass", dict(DK=64, DV=128, dtype="bfloat16", block_dv=64,
                                                         initial_state=True, final_state=True)),
    ("chunk_intra", "chunk_intra", dict(DK=128, DV=64, dtype="bfloat16", varlen=True, spill_budget=400)),
    ("chunk_intra", "chunk_intra", dict(DK=128, DV=128, dtype="bfloat16", value_groups=2, spill_budget=400)),
    ("chunk_intra", "chunk_intra", dict(DK=128, DV=128, dtype="bfloat16", scalar_gate=True)),
    ("chunk_intra", "chunk_intra", dict(DK=64, DV=128, dtype="float16", scalar_gate=True, varlen=True)),
    # steep chunks by running products of the token decays (PAIRWISE_BY_PRODUCTS): 164 bytes spilled (200 without)
    ("chunk_intra", "chunk_intra", dict(DK=128, DV=128, dtype="bfloat16", pairwise="products", spill_budget=400)),
    ("chunk_intra", "chunk_intra", dict(DK=64, DV=128, dtype="float16", pairwise="products")),
    ("chunk_intra", "chunk_intra", dict(DK=128, dtype="bfloat16", gate_dtype="bfloat16", delta=False,
                                        pairwise="products")),
    ("chunk_intra", "chunk_intra", dict(DK=128, DV=128, dtype="bfloat16", pairwise="products", backward_outputs=True,
                                        qk_l2norm=True, spill_budget=400)),
    # steep chunks' diagonal blocks by halvings (PAIRWISE_BY_HALVINGS): 244 bytes spilled (200 without)
    ("chunk_intra", "chunk_intra", dict(DK=128, DV=128, dtype="bfloat16", pairwise="halvings", spill_budget=400)),
    ("chunk_intra", "chunk_intra", dict(DK=64, DV=128, dtype="float16", pairwise="halvings")),
    ("chunk_intra", "chunk_intra", dict(DK=128, dtype="bfloat16", gate_dtype="bfloat16", delta=False,
                                        pairwise="halvings")),
    ("chunk_intra", "chunk_intra", dict(DK=128, DV=128, dtype="bfloat16", pairwise="halvings", backward_outputs=True,
                                        qk_l2norm=True, spill_budget=400)),
    ("chunk_intra", "chunk_intra", dict(DK=128, DV=64, dtype="bfloat16", gate_act="softplus", beta_act="sigmoid",
                                        varlen=True, pairwise="halvings", qk_l2norm=True, spill_budget=400)),
    # steep chunks' diagonal blocks about each sub-chunk's middle row where its halves allow (DIAGONAL_ABOUT_MIDDLES)
    ("chunk_intra", "chunk_intra", dict(DK=128, DV=128, dtype="bfloat16", middles=True, spill_budget=400)),
    ("chunk_intra", "chunk_intra", dict(DK=128, dtype="bfloat16", gate_dtype="bfloat16", delta=False, middles=True)),
    ("chunk_intra", "chunk_intra", dict(DK=128, DV=128, dtype="bfloat16", middles=True, pairwise="halvings",
                                        backward_outputs=True, qk_l2norm=True, spill_budget=400)),
    ("chunk_intra", "chunk_intra", dict(DK=128, DV=64, dtype="bfloat16", gate_act="sigmoid", beta_act="sigmoid",
                                        varlen=True, middles=True, qk_l2norm=True, spill_budget=400)),
    # a layer's call with STEEP_FOR_ACTIVATED_GATES (safe_gate's form: the middles and the halvings), the defaults too
    ("chunk_intra", "chunk_intra", dict(DK=128, DV=128, dtype="bfloat16", gate_act="sigmoid", beta_act="sigmoid",
                                        middles=True, pairwise="halvings", qk_l2norm=True, merge="halves",
                                        spill_budget=400)),
    ("chunk_intra", "chunk_intra", dict(DK=128, DV=128, dtype="bfloat16", gate_act="softplus", beta_act="sigmoid",
                                        pairwise="halvings", qk_l2norm=True, merge="halves", spill_budget=400)),
    # the middles' diagonal as two GEMMs of C rows (MIDDLES_BY_ROWS): 228 bytes spilled with safe_gate's whole form
    ("chunk_intra", "chunk_intra", dict(DK=128, DV=128, dtype="bfloat16", gate_act="sigmoid", beta_act="sigmoid",
                                        middles=True, middles_by_rows=True, pairwise="halvings", qk_l2norm=True,
                                        merge="halves", spill_budget=400)),
    ("chunk_intra", "chunk_intra", dict(DK=128, dtype="bfloat16", gate_dtype="bfloat16", delta=False, middles=True,
                                        middles_by_rows=True)),
    # the steep reload from the parked gate and the kept inverse norms (RELOAD_FROM_KEPT), with the activations by
    # ex2 and lg2 (FAST_ACTIVATIONS): 44 bytes spilled with a layer's whole call (184 without the two)
    ("chunk_intra", "chunk_intra", dict(DK=128, DV=128, dtype="bfloat16", gate_act="softplus", beta_act="sigmoid",
                                        gate_dtype="bfloat16", pairwise="halvings", qk_l2norm=True, merge="halves",
                                        keep_loaded=True, fast_activations=True, spill_budget=120)),
    ("chunk_intra", "chunk_intra", dict(DK=128, DV=64, dtype="bfloat16", varlen=True, middles=True, middles_by_rows=True,
                                        pairwise="halvings", keep_loaded=True, spill_budget=400)),
    ("chunk_intra", "chunk_intra", dict(DK=128, dtype="bfloat16", delta=False, pairwise="halvings", keep_loaded=True)),
    ("chunk_intra", "chunk_intra", dict(DK=64, DV=128, dtype="float16", gate_act="sigmoid", beta_act="sigmoid",
                                        keep_loaded=True, fast_activations=True)),
    # the keys against the delta rule's bound as they are loaded (KEY_CHECK_IN_KERNEL): 204 bytes spilled
    ("chunk_intra", "chunk_intra", dict(DK=128, DV=128, dtype="bfloat16", check_keys=True, spill_budget=400)),
    ("chunk_intra", "chunk_intra", dict(DK=128, DV=128, dtype="bfloat16", scalar_gate=True, check_keys=True)),
    ("chunk_intra", "chunk_intra", dict(DK=64, DV=128, dtype="float16", check_keys=True, varlen=True)),
    ("chunk_intra", "chunk_intra", dict(DK=128, DV=128, dtype="bfloat16", gate_act="softplus", beta_act="sigmoid",
                                        check_keys=True, pairwise="halvings", spill_budget=400)),
    # steep chunks by the capped steps (CAPPED_STEPS), plain and as a layer calls it, level 3 too
    ("chunk_intra", "chunk_intra", dict(DK=128, DV=128, dtype="bfloat16", pairwise="capped", merge="halves",
                                        check_keys=True, keep_loaded=True, spill_budget=400)),
    ("chunk_intra", "chunk_intra", dict(DK=128, DV=128, dtype="bfloat16", gate_act="softplus", beta_act="sigmoid",
                                        gate_dtype="bfloat16", qk_l2norm=True, pairwise="capped", keep_loaded=True,
                                        fast_activations=True, merge="halves", varlen=True, spill_budget=400)),
    ("chunk_intra", "chunk_intra", dict(DK=128, dtype="bfloat16", delta=False, pairwise="capped", keep_loaded=True,
                                        spill_budget=400)),
    # the gate and beta activated as they are loaded (ACTIVATIONS_IN_KERNEL): 216 bytes spilled with both
    ("chunk_intra", "chunk_intra", dict(DK=128, DV=128, dtype="bfloat16", gate_act="softplus", beta_act="sigmoid",
                                        spill_budget=400)),
    ("chunk_intra", "chunk_intra", dict(DK=128, DV=64, dtype="bfloat16", gate_act="sigmoid", gate_dtype="bfloat16",
                                        varlen=True, pairwise="products", qk_l2norm=True, spill_budget=400)),
    ("chunk_intra", "chunk_intra", dict(DK=64, DV=128, dtype="float16", gate_act="softplus", beta_act="sigmoid")),
    # q and k L2-normalized as they are loaded (L2NORM_IN_KERNEL): 216 bytes spilled (200 without)
    ("chunk_intra", "chunk_intra", dict(DK=128, DV=128, dtype="bfloat16", qk_l2norm=True, spill_budget=400)),
    ("chunk_intra", "chunk_intra", dict(DK=64, DV=128, dtype="float16", qk_l2norm=True)),
    ("chunk_intra", "chunk_intra", dict(DK=128, DV=64, dtype="bfloat16", scalar_gate=True, varlen=True,
                                        qk_l2norm=True)),
    # the backward's outputs (PAIR_PIECES_FROM_FORWARD): G, T and K K^T E written besides; 184 bytes spilled
    ("chunk_intra", "chunk_intra", dict(DK=128, DV=128, dtype="bfloat16", backward_outputs=True, spill_budget=400)),
    ("chunk_intra", "chunk_intra", dict(DK=128, DV=128, dtype="float16", backward_outputs=True)),
    ("chunk_intra", "chunk_intra", dict(DK=128, DV=128, dtype="bfloat16", scalar_gate=True, backward_outputs=True)),
    # packed sequences with whole_stores (gated_state_pass.WHOLE_STORES); their masked stores, off, keep a barrier in
    # every step of the V_new loop
    ("gated_state_pass", "gated_state_output_pass", dict(DK=128, DV=128, dtype="bfloat16", block_dv=64, varlen=True,
                                                         initial_state=True, final_state=True, whole_stores=True)),
    ("gated_state_pass", "gated_state_output_pass", dict(DK=128, DV=128, dtype="bfloat16")),
    ("gated_state_pass", "gated_state_output_pass", dict(DK=128, DV=64, dtype="float16", varlen=True,
                                                         final_state=True, whole_stores=True)),
    ("scalar_gate", "chunk_gated_inverse", dict(DK=128, dtype="bfloat16")),
    # the output's GEMMs after the chain's (gated_state_pass.CHAIN_FIRST)
    ("gated_state_pass", "gated_state_output_pass", dict(DK=128, DV=128, dtype="bfloat16", block_dv=64, chain_first=1)),
    ("gated_state_pass", "gated_state_output_pass", dict(DK=128, DV=128, dtype="bfloat16", block_dv=64, varlen=True,
                                                         initial_state=True, final_state=True, whole_stores=True,
                                                         chain_first=2)),
    # packed sequences of at most one chunk each (gated_state_pass.SINGLE_CHUNK_OUTPUT)
    ("gated_state_pass", "single_chunk_gated_output", dict(DK=128, DV=128)),
    ("gated_state_pass", "single_chunk_gated_output", dict(DK=128, DV=128, initial_state=True, final_state=True)),
    ("gated_state_pass", "single_chunk_gated_output", dict(DK=64, DV=64, dtype="float16", final_state=True)),
    ("gated_state_pass", "single_chunk_gated_output", dict(DK=128, DV=128, initial_state=True)),
    # packed sequences of at most one chunk each (scalar_gate.SINGLE_CHUNK_OUTPUT)
    ("scalar_gate", "single_chunk_output", dict(DK=128, DV=128)),
    ("scalar_gate", "single_chunk_output", dict(DK=128, DV=128, initial_state=True, final_state=True)),
    ("scalar_gate", "single_chunk_output", dict(DK=64, DV=128, dtype="float16", initial_state=True, value_groups=2)),
    ("scalar_gate", "single_chunk_output", dict(DK=128, DV=64, final_state=True)),
    ("scalar_gate", "chunk_gated_inverse", dict(DK=64, dtype="float16", gate_dtype="bfloat16", value_groups=2)),
    # the lower-left half by tf32 GEMMs (SOLVE_BY_HALVES), the cumsum by a shuffle scan (run 110)
    ("chunk_intra", "chunk_intra", dict(DK=128, DV=128, dtype="bfloat16", merge="halves", spill_budget=400)),
    ("chunk_intra", "chunk_intra", dict(DK=64, DV=128, dtype="float16", merge="halves", scalar_gate=True, varlen=True)),
    ("scalar_gate", "chunk_gated_inverse", dict(DK=128, dtype="bfloat16", merge="halves", cumsum="scan", varlen=True,
                                                heads_first=True)),
    ("scalar_gate", "inverse_state_output_pass", dict(DK=128, DV=128, dtype="bfloat16")),
    ("scalar_gate", "inverse_state_output_pass", dict(DK=128, DV=128, dtype="bfloat16", whole_stores=True)),
    # the output's GEMMs after the chain's (scalar_gate.CHAIN_FIRST)
    ("scalar_gate", "inverse_state_output_pass", dict(DK=128, DV=128, dtype="bfloat16", chain_first=1)),
    # the inverse without the gate, gated by the pass and the single-chunk kernel (GATE_FREE_INVERSE)
    ("scalar_gate", "chunk_gated_inverse", dict(DK=128, dtype="bfloat16", merge="halves", cumsum="scan", compact=True,
                                                min_blocks=4, gate_free=True)),
    ("scalar_gate", "inverse_state_output_pass", dict(DK=128, DV=128, dtype="bfloat16", gates_inverse=True,
                                                      varlen=True, initial_state=True, final_state=True)),
    ("scalar_gate", "single_chunk_output", dict(DK=128, DV=128, dtype="float16", gates_inverse=True, final_state=True)),
    # packed sequences of one chunk each without states, in one kernel over tiles of whole sequences (PACKED_TILES)
    # level 5's chunks as tiles of whole short sequences (TILES_OF_SHORT_SEQUENCES)
    ("chunk_intra", "chunk_intra", dict(DK=128, DV=128, dtype="bfloat16", varlen=True, tile_sequences=True,
                                        spill_budget=400)),
    # ... and as one stream of chunks, the state reset where a sequence starts (STREAM_OF_CHUNKS)
    ("chunk_intra", "chunk_intra", dict(DK=128, DV=128, dtype="bfloat16", varlen=True, tile_sequences=True,
                                        stream=True, merge="halves", spill_budget=400)),
    ("chunk_intra", "chunk_intra", dict(DK=128, DV=128, dtype="bfloat16", varlen=True, tile_sequences=True,
                                        stream=True, scalar_gate=True, merge="halves", spill_budget=400)),
    ("scalar_gate", "packed_tile_output", dict(DK=128, DV=128)),
    ("scalar_gate", "packed_tile_output", dict(DK=128, DV=128, early_scores=True)),
    ("scalar_gate", "packed_tile_output", dict(DK=128, DV=128, early_scores=True, value_groups=2, check_keys=True)),
    ("scalar_gate", "packed_tile_output", dict(DK=64, DV=128, dtype="float16", beta_dtype="float16", value_groups=2,
                                               check_keys=True)),
    # ... their value checks in a kernel of their own, queued first (TILE_CHECKS_FIRST)
    ("scalar_gate", "token_value_checks", dict(DK=128, value_groups=2, check_keys=True)),
    ("scalar_gate", "token_value_checks", dict(DK=64, dtype="float16", beta_dtype="float16")),
    # ... their rows gathered through a row map, tiles packed by best fit (PACKED_TILE_CONFIG's gathered)
    ("scalar_gate", "packed_tile_output", dict(DK=128, DV=128, early_scores=True, gathered=True, value_groups=2,
                                               check_keys=True)),
    # ... and with the least shared memory live at once (compact: 41 KB gathered, five blocks per SM; 49 KB in order)
    ("scalar_gate", "packed_tile_output", dict(DK=128, DV=128, compact=True, gathered=True, value_groups=2)),
    ("scalar_gate", "packed_tile_output", dict(DK=128, DV=128, compact=True, check_keys=True)),
    ("scalar_gate", "packed_tile_output", dict(DK=64, DV=128, dtype="float16", beta_dtype="float16", compact=True,
                                               gathered=True)),
    # the first kernel's clocks into G (a tuning instrument, results/tuning/run154-inverse-trace.py)
    ("scalar_gate", "chunk_gated_inverse", dict(DK=128, dtype="bfloat16", merge="halves", cumsum="scan", compact=True,
                                                min_blocks=4, beta_dtype="bfloat16", trace=True)),
    # the warpgroups' clocks into ht (a tuning instrument, results/tuning/run147-trace.py)
    ("scalar_gate", "inverse_state_output_pass", dict(DK=128, DV=128, dtype="bfloat16", trace=True, chain_first=2)),
    ("scalar_gate", "inverse_state_output_pass", dict(DK=128, DV=128, dtype="bfloat16", chain_first=2, varlen=True,
                                                      initial_state=True, final_state=True)),
    ("scalar_gate", "inverse_state_output_pass", dict(DK=64, DV=128, dtype="float16", chain_first=2, whole_stores=True)),
    ("scalar_gate", "inverse_state_output_pass", dict(DK=128, DV=128, dtype="bfloat16", varlen=True, initial_state=True,
                                                      final_state=True, whole_stores=True)),
    ("scalar_gate", "inverse_state_output_pass", dict(DK=128, DV=128, block_dv=64, dtype="float16", value_groups=2,
                                                      initial_state=True, final_state=True)),
    ("scalar_gate", "inverse_state_output_pass", dict(DK=64, DV=64, block_dv=64, dtype="bfloat16",
                                                      initial_state=True, final_state=True)),
    ("scalar_gate", "chunk_gated_inverse", dict(DK=128, dtype="bfloat16", varlen=True, value_groups=2)),
    # P gated in registers for P V_new; V read into registers from swizzled slots (P_IN_REGISTERS, V_IN_REGISTERS)
    ("scalar_gate", "inverse_state_output_pass", dict(DK=128, DV=128, dtype="bfloat16", p_in_registers=True)),
    # traced (a tuning instrument), warpgroup 1 holds V, K S and the stamps' base: 24 bytes spilled (none untraced)
    ("scalar_gate", "inverse_state_output_pass", dict(DK=128, DV=128, dtype="bfloat16", p_in_registers=True,
                                                      whole_stores=True, v_in_registers=True, trace=True,
                                                      spill_budget=64)),
    ("scalar_gate", "inverse_state_output_pass", dict(DK=128, DV=128, dtype="bfloat16", p_in_registers=True,
                                                      whole_stores=True, v_in_registers=True)),
    # the default since runs 149 and 150 in fp16 and with heads of 64
    ("scalar_gate", "inverse_state_output_pass", dict(DK=128, DV=128, dtype="float16", p_in_registers=True,
                                                      whole_stores=True, v_in_registers=True, chain_scales_keys=True,
                                                      varlen=True, initial_state=True, final_state=True)),
    ("scalar_gate", "inverse_state_output_pass", dict(DK=64, DV=64, block_dv=64, dtype="bfloat16", p_in_registers=True,
                                                      whole_stores=True, v_in_registers=True, chain_scales_keys=True,
                                                      initial_state=True, final_state=True)),
    # the default since run 149 beside the gate-free inverse (its gating in warpgroup 1)
    ("scalar_gate", "inverse_state_output_pass", dict(DK=128, DV=128, dtype="bfloat16", p_in_registers=True,
                                                      whole_stores=True, v_in_registers=True, gates_inverse=True,
                                                      varlen=True, initial_state=True)),
    # KDA's state pass with U's slots swizzled (gated_state_pass.SWIZZLED_U)
    ("gated_state_pass", "gated_state_output_pass", dict(DK=128, DV=128, dtype="bfloat16", swizzled_u=True)),
    ("gated_state_pass", "gated_state_output_pass", dict(DK=64, DV=128, dtype="float16", swizzled_u=True, varlen=True,
                                                         whole_stores=True, initial_state=True, final_state=True)),
    # the chain scales the keys and reads V_new (CHAIN_SCALES_KEYS)
    ("scalar_gate", "inverse_state_output_pass", dict(DK=128, DV=128, dtype="bfloat16", p_in_registers=True,
                                                      whole_stores=True, v_in_registers=True, chain_scales_keys=True)),
    ("scalar_gate", "inverse_state_output_pass", dict(DK=64, DV=128, dtype="float16", whole_stores=True, varlen=True,
                                                      chain_scales_keys=True, chain_first=1, final_state=True)),
    ("scalar_gate", "inverse_state_output_pass", dict(DK=64, DV=128, block_dv=64, dtype="float16", value_groups=2,
                                                      p_in_registers=True, whole_stores=True, v_in_registers=True,
                                                      varlen=True, final_state=True)),
    ("scalar_gate", "chunk_gated_inverse", dict(DK=128, dtype="bfloat16", merge="products", min_blocks=1)),
    ("scalar_gate", "chunk_gated_inverse", dict(DK=128, dtype="bfloat16", heads_first=True, chunks_per_block=1)),
    # the keys against the delta rule's bound from K K^T's diagonal (KEY_CHECK_IN_KERNEL)
    ("scalar_gate", "chunk_gated_inverse", dict(DK=128, dtype="bfloat16", check_keys=True)),
    ("scalar_gate", "chunk_gated_inverse", dict(DK=64, dtype="float16", varlen=True, value_groups=2, check_keys=True)),
    ("scalar_gate", "inverse_state_output_pass", dict(DK=128, DV=128, dtype="bfloat16", varlen=True,
                                                      value_groups=2, initial_state=True, final_state=True)),
    ("backward_states", "forward_states_pass", dict(DK=128, DV=128)),
    # packed sequences, one block per sequence (PACKED_STATE_KERNELS)
    ("backward_states", "forward_states_pass", dict(DK=128, DV=128, token_major=True, state_dtype="bfloat16",
                                                    varlen=True)),
    ("backward_states", "reverse_state_pass", dict(DK=128, DV=128, token_major=True, state_dtype="bfloat16",
                                                   chunk_decay_terms=True, varlen=True)),
    ("backward_states", "reverse_state_pass", dict(DK=64, DV=128, dtype="float16", state_dtype="float16",
                                                   chunk_decay_terms=True, varlen=True)),
    # the level passes reading the op's inputs (LEVEL_PASSES_FROM_INPUTS)
    ("backward_states", "forward_states_pass", dict(DK=128, DV=128, token_major=True, delta_rule=False, gate_in=True,
                                                    state_dtype="bfloat16")),
    ("backward_states", "reverse_state_pass", dict(DK=128, DV=128, token_major=True, delta_rule=False, gate_in=True,
                                                   state_dtype="bfloat16", chunk_decay_terms=True)),
    ("backward_states", "reverse_state_pass", dict(DK=64, DV=128, dtype="float16", token_major=True, delta_rule=False,
                                                   gate_in=True, chunk_decay_terms=True)),
    ("backward_states", "reverse_state_pass", dict(DK=128, DV=128)),
    ("backward_states", "reverse_state_pass", dict(DK=64, DV=128, dtype="float16")),
    ("backward_states", "forward_states_pass", dict(DK=128, DV=128, dtype="float32", num_stages=1)),
    ("backward_states", "reverse_state_pass", dict(DK=128, DV=128, dtype="float32", num_stages=1)),
    # the states written as the chunk kernels read them, the chunk decays' gate terms in the reverse pass
    ("backward_states", "forward_states_pass", dict(DK=128, DV=128, state_dtype="bfloat16")),
    ("backward_states", "reverse_state_pass", dict(DK=128, DV=128, state_dtype="bfloat16", chunk_decay_terms=True)),
    ("backward_states", "reverse_state_pass", dict(DK=64, DV=128, dtype="float16", state_dtype="float16",
                                                   chunk_decay_terms=True)),
    ("backward_states", "forward_states_pass", dict(DK=128, DV=128, token_major=True)),              # [B, T, H, D]
    # levels 1-3 (LEVEL_PIECES): without the delta rule's GEMMs
    ("backward_states", "forward_states_pass", dict(DK=128, DV=128, token_major=True, state_dtype="bfloat16",
                                                    delta_rule=False)),
    ("backward_states", "reverse_state_pass", dict(DK=128, DV=128, token_major=True, state_dtype="bfloat16",
                                                   chunk_decay_terms=True, delta_rule=False)),
    ("backward_states", "reverse_state_pass", dict(DK=128, DV=128, token_major=True, state_dtype="bfloat16",
                                                   chunk_decay_terms=True)),
    ("backward_chunks", "chunk_gradients", dict(DK=128, DV=128)),
    ("backward_chunks", "chunk_gradients", dict(DK=64, DV=128, dtype="float16")),
    ("backward_chunks", "chunk_gradients", dict(DK=128, DV=64)),
    # fp16 at 128 x 128: ptxas keeps one 4-byte value in local memory (bf16: none)
    ("backward_chunks", "chunk_gradients", dict(DK=128, DV=128, dtype="float16", spill_budget=8)),
    ("backward_chunks", "chunk_gradients", dict(DK=128, DV=128, delta_rule=False)),          # levels 1-3
    ("backward_chunks", "chunk_gradients", dict(DK=128, DV=128, grad_dtype="bfloat16")),     # GRADS_IN_INPUT_DTYPE
    ("backward_chunks", "chunk_gradients", dict(DK=64, DV=64, dtype="float16", delta_rule=False)),
    # reading the forward's T, K K^T E and scores (INVERSE_FROM_FORWARD)
    ("backward_chunks", "chunk_gradients", dict(DK=128, DV=128, pieces_in=True, grad_dtype="bfloat16")),
    ("backward_chunks", "chunk_gradients", dict(DK=64, DV=128, dtype="float16", pieces_in=True)),
    # the reverse walk's identities (WALK_IDENTITIES): 15 GEMMs a chunk instead of 20
    ("backward_chunks", "chunk_gradients", dict(DK=128, DV=128, pieces_in=True, grad_dtype="bfloat16",
                                                identities=True)),
    ("backward_chunks", "chunk_gradients", dict(DK=128, DV=128, dtype="float16", identities=True)),
    ("backward_chunks", "chunk_gradients", dict(DK=64, DV=128, pieces_in=True, identities=True)),
    ("backward_chunks", "chunk_pair_pieces", dict(DK=128)),
    ("backward_chunks", "chunk_pair_pieces", dict(DK=64, dtype="float16")),
    ("backward_chunks", "chunk_state_gradients", dict(DK=128, DV=128, spill_budget=24)),
    ("backward_chunks", "chunk_state_gradients", dict(DK=128, DV=128, grad_dtype="bfloat16", spill_budget=24)),
    ("backward_chunks", "chunk_state_gradients", dict(DK=64, DV=128, dtype="float16")),
    # the reverse walk's identities (WALK_IDENTITIES): 9 GEMMs a chunk instead of 14
    ("backward_chunks", "chunk_state_gradients", dict(DK=128, DV=128, grad_dtype="bfloat16", identities=True,
                                                      spill_budget=24)),
    ("backward_chunks", "chunk_state_gradients", dict(DK=64, DV=128, dtype="float16", identities=True)),
    ("backward_chunks", "chunk_pair_gradients", dict(DK=128)),
    ("backward_chunks", "chunk_pair_gradients", dict(DK=64, dtype="float16")),
    # the pair sums sharing their decays: 255 registers, 8 bytes in local memory
    ("backward_chunks", "chunk_pair_gradients", dict(DK=128, shared_pairs=True, spill_budget=8)),
    ("backward_chunks", "chunk_pair_gradients", dict(DK=64, dtype="float16", shared_pairs=True, spill_budget=8)),
    ("backward_chunks", "chunk_pair_gradients", dict(DK=128, finish_gate=True)),
    ("backward_chunks", "chunk_pair_gradients", dict(DK=128, shared_pairs=True, finish_gate=True, spill_budget=16)),
    # split by channels (PAIR_KERNEL_BY_CHANNELS): 16 per block of 128 threads, 117 registers
    ("backward_chunks", "chunk_pair_gradients", dict(DK=128, shared_pairs=True, finish_gate=True, block_dk=16,
                                                     threads=128)),
    ("backward_chunks", "chunk_pair_gradients", dict(DK=64, dtype="float16", block_dk=16, threads=128)),
    ("backward_chunks", "chunk_pair_gradients", dict(DK=128, delta_rule=False, block_dk=16, threads=128)),
    # the default since run 103 (kda.backward.PAIR_KERNEL_CHANNELS): 32 per block, 4 blocks per SM, 128 registers
    ("backward_chunks", "chunk_pair_gradients", dict(DK=128, shared_pairs=True, finish_gate=True, block_dk=32,
                                                     threads=128, min_blocks=4, spill_budget=96)),
    ("backward_chunks", "chunk_pair_gradients", dict(DK=64, dtype="float16", shared_pairs=True, finish_gate=True,
                                                     block_dk=32, threads=128, min_blocks=4, spill_budget=32)),
    ("backward_chunks", "chunk_pair_gradients", dict(DK=128, delta_rule=False, finish_gate=True, block_dk=32,
                                                     threads=128, min_blocks=4)),
    # the pairs inside a sub-chunk by running products (PAIR_SUMS_BY_PRODUCTS): 255 registers, 205 by 16 channels
    ("backward_chunks", "chunk_pair_gradients", dict(DK=128, shared_pairs=True, finish_gate=True, products=True)),
    ("backward_chunks", "chunk_pair_gradients", dict(DK=128, shared_pairs=True, finish_gate=True, block_dk=16,
                                                     threads=128, products=True)),
    ("backward_chunks", "chunk_pair_gradients", dict(DK=128, delta_rule=False, products=True, spill_budget=64)),
    # the pairs of different blocks of 4 (PAIR_SUMS_BY_HALVINGS' default), 16 or 1 rows by halvings, with the
    # defaults' split by channels: 128 registers, no spill for 4 and 1 (76 bytes for 16)
    ("backward_chunks", "chunk_pair_gradients", dict(DK=128, shared_pairs=True, finish_gate=True, block_dk=32,
                                                     threads=128, min_blocks=4, halve_to=4)),
    ("backward_chunks", "chunk_pair_gradients", dict(DK=128, shared_pairs=True, finish_gate=True, block_dk=32,
                                                     threads=128, min_blocks=4, halve_to=16, spill_budget=120)),
    ("backward_chunks", "chunk_pair_gradients", dict(DK=128, shared_pairs=True, finish_gate=True, block_dk=32,
                                                     threads=128, min_blocks=4, halve_to=1)),
    ("backward_chunks", "chunk_pair_gradients", dict(DK=64, dtype="float16", shared_pairs=True, finish_gate=True,
                                                     block_dk=32, threads=128, min_blocks=4, halve_to=4)),
    # two blocks per SM (PAIR_KERNEL_TWO_BLOCKS): registers capped at 128, 688 bytes spilled
    ("backward_chunks", "chunk_pair_gradients", dict(DK=128, shared_pairs=True, finish_gate=True, min_blocks=2,
                                                     spill_budget=720)),
    ("backward_chunks", "chunk_pair_pieces", dict(DK=128, scores=False)),                    # the forward's A_qk
    ("backward_chunks", "chunk_pair_pieces", dict(DK=128, delta_rule=False)),                # level 3
    ("backward_chunks", "chunk_state_gradients", dict(DK=128, DV=128, delta_rule=False)),
    ("backward_chunks", "chunk_pair_gradients", dict(DK=128, delta_rule=False)),
    ("backward_chunks", "chunk_state_gradients", dict(DK=64, DV=64, dtype="float16", delta_rule=False)),
    ("norms", "l2_normalize_rows", dict(D=128)),                                         # L2NORM_KERNEL
    ("norms", "l2_normalize_rows", dict(D=64, dtype="float16")),
    ("decode", "fused_recurrent", dict(DK=128, DV=128, dtype="bfloat16")),
    ("decode", "fused_recurrent", dict(DK=64, DV=128, dtype="float16", scalar_gate=True, varlen=True, pooled=True)),
    ("decode", "fused_recurrent", dict(DK=128, DV=64, dtype="bfloat16", value_groups=2, with_initial=False,
                                       store_final=False)),
    ("decode", "fused_recurrent", dict(DK=128, DV=128, dtype="bfloat16", gate_act="softplus", beta_act="sigmoid")),
    # speculative decoding: the state after every token to its pool slot, the start at the accepted token's
    ("decode", "fused_recurrent", dict(DK=128, DV=128, dtype="bfloat16", varlen=True, pooled=True, token_slots=True,
                                       accepted=True, guarded=True)),
    ("decode", "fused_recurrent", dict(DK=128, DV=128, dtype="float16", scalar_gate=True, pooled=True,
                                       token_slots=True)),
    ("decode", "fused_recurrent", dict(DK=128, DV=128, dtype="bfloat16", scalar_gate=True, gate_act="sigmoid",
                                       beta_act="2sigmoid", pooled=True)),
    ("decode", "fused_recurrent", dict(DK=128, DV=128, dtype="bfloat16", guarded=True)),
    ("decode", "fused_recurrent", dict(DK=64, DV=128, dtype="float16", scalar_gate=True, varlen=True, pooled=True,
                                       guarded=True)),
    ("decode", "value_checks", dict()),
    ("decode", "value_checks", dict(gate_dtype="bfloat16", pooled=True)),
    ("decode", "value_checks", dict(gate_finite_only=True, beta_finite_only=True, pooled=True)),
    ("decode", "value_checks", dict(pooled=True, index_dtype="int64")),
    # the merge's scratch and Tb's tile in A_s's spent bytes (compact): four blocks per SM
    ("scalar_gate", "chunk_gated_inverse", dict(DK=128, dtype="bfloat16", merge="halves", cumsum="scan", compact=True,
                                                min_blocks=4)),
    ("scalar_gate", "chunk_gated_inverse", dict(DK=64, dtype="float16", merge="halves", cumsum="scan", compact=True,
                                                varlen=True, value_groups=2, check_keys=True)),
    # a layer's short convolution and gated output norm (kda.layer.LAYER_KERNELS)
    ("causal_conv", "causal_conv_silu", dict(C=4096)),
    ("causal_conv", "causal_conv_silu", dict(C=96, W=3, dtype="float16", block_c=32)),
    ("norms", "gated_rms_norm_rows", dict(D=128)),
    ("norms", "gated_rms_norm_rows", dict(D=64, dtype="float16")),
    # GDN's split over the runs where they lie, the last one short (kda.distributed.RAGGED_RUNS)
    ("scalar_gate", "inverse_state_output_pass", dict(DK=128, DV=128, dtype="bfloat16", p_in_registers=True,
                                                      whole_stores=True, v_in_registers=True, gates_inverse=True,
                                                      initial_state=True, final_state=True, runs=True)),
    ("scalar_gate", "inverse_state_output_pass", dict(DK=64, DV=128, dtype="float16", p_in_registers=True,
                                                      whole_stores=True, v_in_registers=True, gates_inverse=True,
                                                      value_groups=2, runs=True)),
]


@pytest.mark.parametrize("module,name,params", CASES, ids=[f"{m}.{n}-{i}" for i, (m, n, _) in enumerate(CASES)])
def test_compiles_without_spills(module, name, params):
    import importlib

    from kda.kernels.build import SM90A, compile_program, ptxas_report

    params = dict(params)
    budget = params.pop("spill_budget", 0)    # bytes ptxas may spill (a register cap for 2 blocks/SM)
    fn = getattr(importlib.import_module(f"kda.kernels.{module}"), name)
    kernel = compile_program(fn, (), target=SM90A, **params)
    report = ptxas_report(kernel)
    assert report["spill_store_bytes"] <= budget and report["spill_load_bytes"] <= budget, report
    assert 0 < report["registers"] <= 255
    source = kernel.get_kernel_source()
    assert divergent_barriers(source) == []
    assert barriers_in_elementwise_loops(source) == [] or kept_barriers(fn, params), \
        barriers_in_elementwise_loops(source)


# kernels (name, the parameters that select them) whose elementwise loops keep a barrier in each step, and why
ELEMENTWISE_BARRIERS_KEPT = [
    ("chunk_intra", {}, "a steep chunk's keys weighted by 2^G in place (8 steps, steep chunks only): a tile of its "
                        "own would cost the shared memory or registers that fit two blocks per SM"),
    ("inverse_state_output_pass", {"whole_stores": False},
     "X over V's slot and V' element by element (64 a chunk on the chain): whole_stores, which has none, gave the "
     "same bits and no speed (runs 141 and 143)"),
    ("chunk_gradients", {}, "the rows past a tail chunk's end selected in place (16 a chunk): written only where "
                            "needed, the kernel passed its GPU tests (run 140) but spilled 4 bytes at 255 registers"),
    ("chunk_gated_inverse", {"merge": "products"}, "the merge by products (not the default) writes its operands in "
                                                   "place"),
    ("forward_states_pass", {"dtype": "float32"}, "float32 inputs (not a default): V' = U - W S element by element"),
    ("gated_rms_norm_rows", {}, "the layer's output norm scales its rows in place (16 steps a block, no chain): found by "
                                "this check, not yet removed"),
]


def kept_barriers(fn, params) -> bool:
    """Whether ``fn(**params)`` is one of ``ELEMENTWISE_BARRIERS_KEPT`` (parameters not given take their defaults)."""
    import inspect

    given = {**{k: p.default for k, p in inspect.signature(fn).parameters.items()}, **params}
    return any(name == fn.__name__ and all(given.get(k) == v for k, v in where.items())
               for name, where, _ in ELEMENTWISE_BARRIERS_KEPT)


def barriers_in_elementwise_loops(source: str) -> list:
    """The unrolled loops of a generated kernel with no loop, GEMM or reduction inside that hold a block or warpgroup
    barrier: one barrier in every step. tilelang 0.1.15's barrier planner puts them into a ``T.Parallel`` loop that
    reads and writes the same shared addresses (it cannot tell each thread keeps to its own elements), and into some
    stores element by element: run 139 found 64 a chunk on the chain of GDN's pass, which costs a chain its time."""
    import re

    found = []
    for loop in re.finditer(r"#pragma unroll\s*for \((?:int|int64_t) (\w+) = [^{]*\{", source):
        depth, end = 1, loop.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(source[end], 0)
            end += 1
        body = source[loop.end():end]
        if re.search(r"__syncthreads\(\)|__sync_thread_partial", body) and not re.search(
                r"for \(|wgmma|gemm|AllReduce|mma", body):
            found.append(loop.group(0).split("for")[1].strip())
    return found


def test_barriers_in_elementwise_loops_are_found():
    """The check above on the loop of GDN's pass that run 139 found, without the barrier, and on a reduction's."""
    bad = ("#pragma unroll\n    for (int i_4 = 0; i_4 < 32; ++i_4) {\n  x = v_s[i_4];\n  tl::__sync_thread_partial(4, 128);"
           "\n  v_s[i_4] = x - 1;\n}\n")
    assert barriers_in_elementwise_loops(bad) == ["(int i_4 = 0; i_4 < 32; ++i_4) {"]
    assert barriers_in_elementwise_loops(bad.replace("tl::__sync_thread_partial(4, 128);", "")) == []
    assert barriers_in_elementwise_loops(bad.replace("x - 1", "tl::AllReduce<tl::SumOp, 128>::run(x)")) == []


def divergent_barriers(source: str) -> list:
    """The loops of a generated kernel whose trip count depends on the thread and whose body holds a block barrier:
    threads that leave early never reach the barriers the others wait at. tilelang's barrier planner put one into
    ``chunk_intra``'s table loop (``for J < s + 1``) for fp16 with a gate in fp16 (its own shared buffer, another
    plan): run 127 saw every output of that kernel not finite."""
    import re

    found = []
    for loop in re.finditer(r"for \((?:int|int64_t) (\w+) = [^;]*; \1 < ([^;]*); [^{]*\{", source):
        if "threadIdx" not in loop.group(2):
            continue
        depth, end = 1, loop.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(source[end], 0)
            end += 1
        if "__syncthreads" in source[loop.end():end]:
            found.append(loop.group(0))
    return found


def test_divergent_barriers_are_found():
    """The check above on the loop run 127 found, and on the same loop without the barrier."""
    bad = "for (int J = 0; J < ((((int)threadIdx.x) >> 7) + 1); ++J) {\n  __syncthreads();\n  if (J) { x = 1; }\n}\n"
    assert divergent_barriers(bad) == ["for (int J = 0; J < ((((int)threadIdx.x) >> 7) + 1); ++J) {"]
    assert divergent_barriers(bad.replace("__syncthreads();", "")) == []
    assert divergent_barriers(bad.replace("threadIdx.x", "blockIdx.x")) == []


def test_article_seq_in_grid_as_written():
    """Article 000 section 4 as written (the own chunk loaded back into the pipelined buffers):
    tilelang 0.1.15 rejects it with two stages and accepts it with one."""
    from kda.kernels.chapters.linear_attention import seq_in_grid
    from kda.kernels.build import SM90A, compile_program

    with pytest.raises(Exception, match="Versioned buffer load escaped pipeline stage context"):
        compile_program(seq_in_grid, (), target=SM90A, DK=64, DV=64, num_stages=2, own_chunk_buffers=False)
    compile_program(seq_in_grid, (), target=SM90A, DK=64, DV=64, num_stages=1, own_chunk_buffers=False)


def test_register_budget_bisection_matches_a_scan_from_the_top():
    """``registers.report`` bisects the consumer's register budget; a scan from the declared
    budget down, one ptxas run per step of 8, stops at the same smallest budget."""
    from kda.kernels import registers
    from kda.kernels.chapters.linear_attention import seq_in_loop
    from kda.kernels.build import SM90A, compile_program, ptxas_of

    kernel = compile_program(seq_in_loop, (), target=SM90A, DK=128, DV=128, dtype="bfloat16")
    found = registers.report(kernel)
    ptx = kernel._get_ptx()
    smallest = None
    for budget in range(found["declared"], 23, -8):
        patched = registers.INC.sub(f"setmaxnreg.inc.sync.aligned.u32 {budget};", ptx)
        if ptxas_of(patched, "sm_90a")["spill_store_bytes"]:
            break
        smallest = budget
    assert found["smallest_without_spills"] == smallest == 120


def shared_regions(fn, pass_configs=None, unlisted=None, **params):
    """``{buffer: (first byte, end)}`` of a kernel's dynamic shared memory: the offsets from its
    generated CUDA, the sizes from the buffers its program allocates (``unlisted``: the size of the buffers
    tilelang adds itself, such as a scan's, which the program does not list; without it they fail)."""
    import re

    import numpy as np
    import tilelang  # noqa: F401  (puts tilelang's tvm on the path)
    import tvm
    from tvm import tirx

    from kda.kernels.build import SM90A, compile_program

    source = compile_program(fn, (), target=SM90A, pass_configs=pass_configs, **params).get_kernel_source()
    offsets = {name: int(at) for name, at in re.findall(r"void\* (\w+) = \(\(void\*\)\(\(char\*\)buf_dyn_shmem \+ (\d+)\)\)",
                                                         source)}
    sizes = {}

    def visit(node):
        for b in getattr(node, "alloc_buffers", ()):
            if b.scope() == "shared.dyn":
                sizes[b.name] = int(np.prod([int(x) for x in b.shape])) * tvm.DataType(str(b.dtype)).bits // 8

    tirx.stmt_functor.post_order_visit(fn(**params).body, visit)
    if unlisted is not None:
        sizes.update({name: unlisted for name in offsets if name not in sizes})
    assert offsets and set(offsets) <= set(sizes), (offsets, sizes)     # a buffer a variant never uses is dropped
    return {name: (offsets[name], offsets[name] + sizes[name]) for name in offsets}


def overlapping(regions):
    spans = sorted((first, end, name) for name, (first, end) in regions.items())
    return [(a[2], b[2]) for a, b in zip(spans, spans[1:]) if b[0] < a[1]]


WARP_SPECIALISED = [
    ("linear_pass", "seq_in_loop_scalar", dict(DK=128, DV=128, dtype="bfloat16", slots=2, out_groups=1)),
    ("linear_pass", "seq_in_loop_scalar", dict(DK=128, DV=128, dtype="bfloat16", initial_state=True, final_state=True)),
    ("linear_pass", "seq_in_loop_scalar", dict(DK=128, DV=128, dtype="bfloat16", gate="constant")),
    ("linear_pass", "state_output_pass", dict(DK=128, DV=128, dtype="bfloat16")),
    ("linear_pass", "state_output_pass", dict(DK=64, DV=128, dtype="float16", slots=2, out_groups=1, initial_state=True,
                                              final_state=True)),
    ("gated_state_pass", "gated_state_output_pass", dict(DK=128, DV=128, dtype="bfloat16")),
    ("gated_state_pass", "gated_state_output_pass", dict(DK=128, DV=64, dtype="float16", varlen=True,
                                                         initial_state=True, final_state=True)),
    ("scalar_gate", "inverse_state_output_pass", dict(DK=128, DV=128, dtype="bfloat16", initial_state=True,
                                                      final_state=True)),
]


# chunk_intra in bf16, 128 channels: a mild chunk's kernel and every steep variant that should fit as it does
TWO_BLOCKS_PER_SM = {
    "mild": dict(merge="halves", check_keys=True),
    "stream of chunks": dict(merge="halves", check_keys=True, varlen=True, tile_sequences=True, stream=True),
    "halvings": dict(pairwise="halvings", merge="halves", check_keys=True),
    "layer's softplus form": dict(pairwise="halvings", merge="halves", gate_act="softplus", beta_act="sigmoid",
                                  qk_l2norm=True),
    "middles by rows": dict(middles=True, middles_by_rows=True, merge="halves", check_keys=True),
    "a layer's call, bf16 gate, kept": dict(pairwise="halvings", merge="halves", gate_act="softplus",
                                            beta_act="sigmoid", gate_dtype="bfloat16", qk_l2norm=True,
                                            keep_loaded=True, fast_activations=True),
    "safe_gate's form by rows": dict(middles=True, middles_by_rows=True, pairwise="halvings", merge="halves",
                                     gate_act="sigmoid", beta_act="sigmoid", qk_l2norm=True),
    "capped steps, plain call": dict(pairwise="capped", merge="halves", check_keys=True, keep_loaded=True),
    "tiles of short sequences": dict(merge="halves", varlen=True, tile_sequences=True, check_keys=True),
    "capped steps, a layer's call": dict(pairwise="capped", merge="halves", gate_act="softplus", beta_act="sigmoid",
                                         gate_dtype="bfloat16", qk_l2norm=True, keep_loaded=True,
                                         fast_activations=True),
}


@pytest.mark.parametrize("variant", list(TWO_BLOCKS_PER_SM))
def test_chunk_intra_fits_two_blocks_per_sm(variant):
    """An H100's or H200's SM grants 228 KB of shared memory, 1 KB of it reserved per block: two blocks of ``chunk_intra``
    need at most 113 KB each (run 123: the halvings' stacked operand took 121 KB, one block per SM, and a layer's
    steep call paid for it). The bytes are tilelang's plan, read from the generated CUDA."""
    from kda.kernels.chunk_intra import chunk_intra

    regions = shared_regions(chunk_intra, DK=128, DV=128, dtype="bfloat16", **TWO_BLOCKS_PER_SM[variant])
    assert max(end for _, end in regions.values()) <= (228 * 1024) // 2 - 1024, regions


@pytest.mark.parametrize("module,name,params", WARP_SPECIALISED,
                         ids=[f"{m}.{n}-{i}" for i, (m, n, _) in enumerate(WARP_SPECIALISED)])
def test_warp_specialised_kernels_give_each_shared_buffer_its_own_bytes(module, name, params):
    """Warpgroups run their branches at the same time, so no two shared buffers may share bytes
    (``build.WARP_SPECIALISED``)."""
    import importlib

    fn = getattr(importlib.import_module(f"kda.kernels.{module}"), name)
    assert overlapping(shared_regions(fn, **params)) == []


def test_shared_memory_reuse_aliases_buffers_across_warpgroups():
    """Without ``build.WARP_SPECIALISED``, tilelang 0.1.15 puts the chain's weighted values and the
    output's staging tile of level 3's scalar pass (one output warpgroup) at one address: run 61's
    wrong outputs. The check above sees it."""
    from kda.kernels.linear_pass import seq_in_loop_scalar

    regions = shared_regions(seq_in_loop_scalar, {"tl.disable_shared_memory_reuse": False}, DK=128, DV=128,
                             dtype="bfloat16", slots=2, out_groups=1)
    assert ("O_s", "Vw_s") in overlapping(regions) or ("Vw_s", "O_s") in overlapping(regions)


def test_compact_inverse_fits_four_blocks_per_sm():
    """``chunk_gated_inverse(compact=True)``: the merge's scratch and ``Tb``'s tile over ``A_s`` take the block from
    72.7 KB of shared memory to under 56 KB, so that four blocks fit an SM's 228 KB (1 KB reserved per block); the
    default keeps its own buffers. The scan's scratch, which tilelang adds, takes 256 bytes."""
    from kda.kernels.scalar_gate import chunk_gated_inverse

    end = lambda **params: max(e for _, e in shared_regions(chunk_gated_inverse, unlisted=256, DK=128,
                                                            dtype="bfloat16", merge="halves", cumsum="scan",
                                                            **params).values())
    assert end(compact=True, min_blocks=4) <= 56 * 1024 < end()


def test_compact_tiles_fit_more_blocks_per_sm():
    """``packed_tile_output(compact=True)``: the scores first, ``v``'s tile loaded after the solve and the merge's
    scratch in ``A_s`` leave at most 40 KB live at once; gathered through the row map the block takes under 44.6 KB
    of shared memory, five blocks per SM's 228 KB (1 KB reserved per block), in order under 56 KB (four), where
    ``early_scores`` takes 70 KB (three)."""
    from kda.kernels.scalar_gate import packed_tile_output

    end = lambda **params: max(e for _, e in shared_regions(packed_tile_output, unlisted=256, DK=128, DV=128,
                                                            **params).values())
    assert end(compact=True, gathered=True) <= 228 * 1024 // 5 - 1024
    assert end(compact=True) <= 228 * 1024 // 4 - 1024 < end(early_scores=True)

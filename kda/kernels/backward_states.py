"""The two sequential passes of the backward (``kda.reference.backward.forward_states`` and
``reverse_state_pass``) as TileLang kernels, one launch each instead of a few torch launches per chunk.

Both read the pieces ``kda.backward`` keeps for every chunk, in its head-major chunk layout
(``[B, H, NC * C, D]``: a free view of ``[B, H, NC, C, D]``) and in the inputs' dtype, and keep the
state, or its gradient, in float32 registers, one block per (batch row, head, ``block_dv`` value
columns). Per chunk, the state as the GEMMs read it is rounded to the inputs' dtype, as the
forward's state pass does.

* ``forward_states_pass``: for each chunk, the state entering it out to ``S_in [B, H, NC, DK, DV]``,
  then ``S <- diag(decay) S + Kd^T (U - W S)``.
* ``reverse_state_pass``: from the last chunk to the first, the gradient of the state leaving it out
  to ``dS_out``, then ``dV' = P^T dO + Kd dS`` and ``dS <- diag(decay) dS + Qg^T dO - W^T dV'``; the
  gradient entering the first chunk (that of the initial state) to ``dh0``.

Dense batches only (one sequence per batch row); GEMM reads of pipelined buffers follow level 3's
rule (tilelang 0.1.15 hands a stage's buffers back to the producer once their last GEMM is issued:
nothing of a stage is read after it). Their GPU tests passed on the H200 (run 91); ``kda.backward`` calls
them with its switch ``STATE_KERNELS`` on, through the launchers at the end of this module (``run_state_passes``,
``run_state_passes_from_inputs``).
"""

# No `from __future__ import annotations` here: T.prim_func reads the annotations.
import math

import tilelang.language as T
import torch

from kda import launch
from kda.chunking import CHUNK_SIZE, ceildiv
from kda.kernels.stages import ACCUM


def layout(C, token_major):
    """The sizes and the chunk reads of the pieces' layout: head-major ``[B, H, NC C, D]`` (``kda.backward``'s
    chunks, a free view of ``[B, H, NC, C, D]``), or token-major ``[B, T, H, D]`` (as the forward's kernels
    write them; ``NC = ceil(T / C)``). Returns ``B, H, NC``, the shape of a piece of width ``D``, and the
    region of chunk ``c``, columns ``lo:hi``."""
    B, H = T.dynamic("B"), T.dynamic("H")
    if token_major:
        S = T.dynamic("T")
        return (B, H, T.ceildiv(S, C), lambda D: [B, S, H, D],
                lambda X, bb, bh, c, lo, hi: X[bb, c * C:(c + 1) * C, bh, lo:hi])
    NC = T.dynamic("NC")
    return B, H, NC, lambda D: [B, H, NC * C, D], lambda X, bb, bh, c, lo, hi: X[bb, bh, c * C:(c + 1) * C, lo:hi]


# --8<-- [start:forward_states_pass]
def forward_states_pass(DK, DV, chunk_size=64, block_dv=64, num_stages=2, threads=128, dtype="bfloat16",
                        state_dtype=ACCUM, token_major=False, delta_rule=True, gate_in=False, varlen=False):
    """Arguments at run time: ``W, Kd [B, H, NC C, DK]``, ``U [B, H, NC C, DV]`` (dtype), ``decay [B, H,
    NC, DK]``, ``h0 [B, H, DK, DV]`` (float32), then the output ``S_in [B, H, NC, DK, DV]`` (``state_dtype``:
    float32, or the inputs' dtype, as the chunk kernels read it). ``token_major``: ``W, Kd, U`` ``[B, T, H,
    D]`` as the forward's ``chunk_intra`` writes them (``NC = ceil(T / C)``; the rows past ``T`` load as zeros).
    ``delta_rule=False`` (levels 1-3, ``W = 0``, ``V' = U``): ``W`` is not read, ``S <- decay S + Kd^T U``.
    ``gate_in`` (levels 1-3 with a gate per head or none: ``delta_rule=False``, ``token_major``; ``kda.backward``'s
    ``LEVEL_PASSES_FROM_INPUTS``): the pass reads the op's own inputs instead of pieces, ``K [B, T, H, DK]``,
    ``V [B, T, H, DV]`` and ``G [B, T, H, 1]`` (float32, each chunk's cumulative gate in log2 units), then ``h0`` and
    ``S_in``, and makes ``Kd = K 2^(G_last - G)`` and the decay ``2^G_last`` per chunk itself.
    ``varlen`` (packed sequences laid out from chunk boundaries, ``B = 1``; ``kda.backward``'s
    ``PACKED_STATE_KERNELS``): ``h0 [N, H, DK, DV]``, one initial state per sequence, and a last argument
    ``chunk_offsets [N + 1]`` (int32: sequence ``n`` holds chunks ``chunk_offsets[n]`` to ``chunk_offsets[n + 1]``);
    one block per sequence, head and ``block_dv`` value columns."""
    assert not gate_in or (token_major and not delta_rule), "the inputs' gate: token-major, no delta rule"
    assert not (gate_in and varlen), "packed sequences take the pieces"
    B, H, NC, rows, chunk_of = layout(chunk_size, token_major)
    C = chunk_size
    N = T.dynamic("N")

    @T.macro
    def walk(W, Kd, U, decay, h0, S_in, G, offsets=None):
        with T.Kernel(T.ceildiv(DV, block_dv), H, N if varlen else B, threads=threads) as (bv, bh, lane):
            # a dense batch row walks all its chunks; a packed sequence (batch row 0) its own
            bb, c0 = (0, offsets[lane]) if varlen else (lane, 0)
            dv0 = bv * block_dv
            W_s = T.alloc_shared([C, DK], dtype)
            Kd_s = T.alloc_shared([C, DK], dtype)
            U_s = T.alloc_shared([C, block_dv], dtype)
            decay_s = T.alloc_shared([DK], ACCUM)
            S_s = T.alloc_shared([DK, block_dv], dtype)
            new_s = T.alloc_shared([C, block_dv], dtype)
            S_f = T.alloc_fragment([DK, block_dv], ACCUM)
            new_f = T.alloc_fragment([C, block_dv], ACCUM)
            if gate_in:
                G_s = T.alloc_shared([C], ACCUM)
                K_s = T.alloc_shared([C, DK], dtype)                     # K 2^(G_last - G), made here
            T.copy(h0[lane, bh, :, dv0:dv0 + block_dv], S_f)
            for r in T.Pipelined(offsets[lane + 1] - c0 if varlen else NC, num_stages=num_stages):
                c = c0 + r
                if delta_rule:
                    T.copy(chunk_of(W, bb, bh, c, 0, DK), W_s)
                T.copy(chunk_of(Kd, bb, bh, c, 0, DK), Kd_s)
                T.copy(chunk_of(U, bb, bh, c, dv0, dv0 + block_dv), U_s)
                if gate_in:                # the chunk's gate; its last row's for the rows past the end
                    L = T.min(C, G.shape[1] - c * C)
                    for i in T.Parallel(C):
                        G_s[i] = G[bb, c * C + T.min(i, L - 1), bh, 0]
                    for d in T.Parallel(DK):
                        decay_s[d] = T.exp2(G_s[C - 1])
                    for i, d in T.Parallel(C, DK):
                        K_s[i, d] = Kd_s[i, d] * T.exp2(G_s[C - 1] - G_s[i])
                else:
                    T.copy(decay[bb, bh, c, :], decay_s)
                T.copy(S_f, S_in[bb, bh, c, :, dv0:dv0 + block_dv])     # the state entering chunk c
                if delta_rule:
                    T.copy(S_f, S_s)
                    T.gemm(W_s, S_s, new_f, clear_accum=True)            # W S
                    for i, j in T.Parallel(C, block_dv):
                        new_s[i, j] = U_s[i, j] - new_f[i, j]            # V' = U - W S
                for i, j in T.Parallel(DK, block_dv):
                    S_f[i, j] = S_f[i, j] * decay_s[i]
                T.gemm(K_s if gate_in else Kd_s, new_s if delta_rule else U_s, S_f, transpose_A=True)   # + Kd^T V'

    if gate_in:
        @T.prim_func
        def from_inputs(
            K: T.Tensor(rows(DK), dtype),
            V: T.Tensor(rows(DV), dtype),
            G: T.Tensor(rows(1), ACCUM),
            h0: T.Tensor([B, H, DK, DV], ACCUM),
            S_in: T.Tensor([B, H, NC, DK, DV], state_dtype),
        ):
            walk(None, K, V, None, h0, S_in, G)

        return from_inputs

    if varlen:
        @T.prim_func
        def packed(
            W: T.Tensor(rows(DK), dtype),
            Kd: T.Tensor(rows(DK), dtype),
            U: T.Tensor(rows(DV), dtype),
            decay: T.Tensor([B, H, NC, DK], ACCUM),
            h0: T.Tensor([N, H, DK, DV], ACCUM),
            S_in: T.Tensor([B, H, NC, DK, DV], state_dtype),
            chunk_offsets: T.Tensor([N + 1], "int32"),
        ):
            walk(W, Kd, U, decay, h0, S_in, None, chunk_offsets)

        return packed

    @T.prim_func
    def main(
        W: T.Tensor(rows(DK), dtype),
        Kd: T.Tensor(rows(DK), dtype),
        U: T.Tensor(rows(DV), dtype),
        decay: T.Tensor([B, H, NC, DK], ACCUM),
        h0: T.Tensor([B, H, DK, DV], ACCUM),
        S_in: T.Tensor([B, H, NC, DK, DV], state_dtype),
    ):
        walk(W, Kd, U, decay, h0, S_in, None)

    return main
# --8<-- [end:forward_states_pass]


# --8<-- [start:reverse_state_pass]
def reverse_state_pass(DK, DV, chunk_size=64, block_dv=64, num_stages=2, threads=128, dtype="bfloat16",
                       state_dtype=ACCUM, chunk_decay_terms=False, token_major=False, delta_rule=True, gate_in=False,
                       varlen=False):
    """Arguments at run time: ``P [B, H, NC C, C]``, ``Kd, Qg, W [B, H, NC C, DK]``, ``dO [B, H, NC C,
    DV]`` (dtype), ``decay [B, H, NC, DK]``, ``dht [B, H, DK, DV]`` (float32), then the outputs
    ``dS_out [B, H, NC, DK, DV]`` (``state_dtype``) and ``dh0 [B, H, DK, DV]`` (float32).
    ``chunk_decay_terms=True`` adds the input ``S_in [B, H, NC, DK, DV]`` (``state_dtype``: the forward pass's
    output) and the output ``dG_last [B, H, NC, ceil(DV / block_dv), DK]`` (float32): each chunk decay's
    gradient term ``decay_k sum_v S_in[k, v] dS_out[k, v]`` over this block's value columns, from ``dS`` as
    the registers hold it (float32), so that no one reads the two states back from HBM for it.
    ``token_major``: ``P, Kd, Qg, W, dO`` ``[B, T, H, *]``, as for ``forward_states_pass``.
    ``delta_rule=False`` (levels 1-3, ``W = 0``): ``dS <- decay dS + Qg^T dO``; ``P``, ``Kd`` and ``W`` are
    not read (``dV'`` feeds only ``W^T dV'``). ``gate_in`` (as ``forward_states_pass``'s, with
    ``chunk_decay_terms``): the arguments ``Q [B, T, H, DK]``, ``dO``, ``G [B, T, H, 1]`` (float32, log2, each
    chunk's cumulative gate), ``scale``, ``dht``, ``S_in``, then the outputs; ``Qg = scale Q 2^G`` and the decay
    made here. ``varlen`` (with ``chunk_decay_terms``; as ``forward_states_pass``'s): ``dht`` and ``dh0`` ``[N, H,
    DK, DV]``, one per sequence, and the last argument ``chunk_offsets [N + 1]`` (int32)."""
    assert not gate_in or (token_major and not delta_rule and chunk_decay_terms), \
        "the inputs' gate: token-major, no delta rule, with the decay terms"
    assert not varlen or (chunk_decay_terms and not gate_in), "packed sequences: the pieces, with the decay terms"
    B, H, NC, rows, chunk_of = layout(chunk_size, token_major)
    N = T.dynamic("N")
    C = chunk_size
    NBV = T.ceildiv(DV, block_dv)

    @T.macro
    def walk(P, Kd, Qg, W, dO, decay, dht, dS_out, dh0, S_in, dG_last, G=None, scale=None, offsets=None):
        with T.Kernel(NBV, H, N if varlen else B, threads=threads) as (bv, bh, lane):
            # a dense batch row walks all its chunks; a packed sequence (batch row 0) its own, from the last
            bb = 0 if varlen else lane
            dv0 = bv * block_dv
            P_s = T.alloc_shared([C, C], dtype)
            Kd_s = T.alloc_shared([C, DK], dtype)
            Qg_s = T.alloc_shared([C, DK], dtype)
            W_s = T.alloc_shared([C, DK], dtype)
            dO_s = T.alloc_shared([C, block_dv], dtype)
            decay_s = T.alloc_shared([DK], ACCUM)
            dS_s = T.alloc_shared([DK, block_dv], dtype)
            dnew_s = T.alloc_shared([C, block_dv], dtype)
            dS_f = T.alloc_fragment([DK, block_dv], ACCUM)
            dnew_f = T.alloc_fragment([C, block_dv], ACCUM)
            if chunk_decay_terms:
                S_s = T.alloc_shared([DK, block_dv], state_dtype)
                product_f = T.alloc_fragment([DK, block_dv], ACCUM)
                row_f = T.alloc_fragment([DK], ACCUM)
            if gate_in:
                G_s = T.alloc_shared([C], ACCUM)
                Q_s = T.alloc_shared([C, DK], dtype)                     # scale Q 2^G, made here
            T.copy(dht[lane, bh, :, dv0:dv0 + block_dv], dS_f)
            for r in T.Pipelined(offsets[lane + 1] - offsets[lane] if varlen else NC, num_stages=num_stages):
                c = (offsets[lane + 1] if varlen else NC) - 1 - r        # the last chunk first
                if delta_rule:
                    T.copy(chunk_of(P, bb, bh, c, 0, C), P_s)
                    T.copy(chunk_of(Kd, bb, bh, c, 0, DK), Kd_s)
                T.copy(chunk_of(Qg, bb, bh, c, 0, DK), Qg_s)
                if delta_rule:
                    T.copy(chunk_of(W, bb, bh, c, 0, DK), W_s)
                T.copy(chunk_of(dO, bb, bh, c, dv0, dv0 + block_dv), dO_s)
                if gate_in:                # the chunk's gate; its last row's for the rows past the end
                    L = T.min(C, G.shape[1] - c * C)
                    for i in T.Parallel(C):
                        G_s[i] = G[bb, c * C + T.min(i, L - 1), bh, 0]
                    for d in T.Parallel(DK):
                        decay_s[d] = T.exp2(G_s[C - 1])
                    for i, d in T.Parallel(C, DK):
                        Q_s[i, d] = Qg_s[i, d] * (T.exp2(G_s[i]) * scale)
                else:
                    T.copy(decay[bb, bh, c, :], decay_s)
                T.copy(dS_f, dS_out[bb, bh, c, :, dv0:dv0 + block_dv])  # the gradient of the state leaving c
                if chunk_decay_terms:     # read before the stage's first GEMM (the pipelined buffers' rule)
                    T.copy(S_in[bb, bh, c, :, dv0:dv0 + block_dv], S_s)
                    for i, j in T.Parallel(DK, block_dv):
                        product_f[i, j] = dS_f[i, j] * S_s[i, j]
                    T.reduce_sum(product_f, row_f, dim=1)
                    for i in T.Parallel(DK):
                        dG_last[bb, bh, c, bv, i] = row_f[i] * decay_s[i]
                if delta_rule:
                    T.copy(dS_f, dS_s)
                    T.gemm(P_s, dO_s, dnew_f, transpose_A=True, clear_accum=True)   # P^T dO
                    T.gemm(Kd_s, dS_s, dnew_f)                                     # + Kd dS
                    for i, j in T.Parallel(C, block_dv):
                        dnew_s[i, j] = -dnew_f[i, j]                     # -dV', so that the last GEMM adds
                for i, j in T.Parallel(DK, block_dv):
                    dS_f[i, j] = dS_f[i, j] * decay_s[i]
                T.gemm(Q_s if gate_in else Qg_s, dO_s, dS_f, transpose_A=True)   # + Qg^T dO
                if delta_rule:
                    T.gemm(W_s, dnew_s, dS_f, transpose_A=True)          # - W^T dV'
            T.copy(dS_f, dh0[lane, bh, :, dv0:dv0 + block_dv])

    if gate_in:
        @T.prim_func
        def from_inputs(
            Q: T.Tensor(rows(DK), dtype),
            dO: T.Tensor(rows(DV), dtype),
            G: T.Tensor(rows(1), ACCUM),
            scale: T.float32,
            dht: T.Tensor([B, H, DK, DV], ACCUM),
            S_in: T.Tensor([B, H, NC, DK, DV], state_dtype),
            dS_out: T.Tensor([B, H, NC, DK, DV], state_dtype),
            dh0: T.Tensor([B, H, DK, DV], ACCUM),
            dG_last: T.Tensor([B, H, NC, NBV, DK], ACCUM),
        ):
            walk(None, None, Q, None, dO, None, dht, dS_out, dh0, S_in, dG_last, G, scale)

        return from_inputs

    if varlen:
        @T.prim_func
        def packed(
            P: T.Tensor(rows(C), dtype),
            Kd: T.Tensor(rows(DK), dtype),
            Qg: T.Tensor(rows(DK), dtype),
            W: T.Tensor(rows(DK), dtype),
            dO: T.Tensor(rows(DV), dtype),
            decay: T.Tensor([B, H, NC, DK], ACCUM),
            dht: T.Tensor([N, H, DK, DV], ACCUM),
            S_in: T.Tensor([B, H, NC, DK, DV], state_dtype),
            dS_out: T.Tensor([B, H, NC, DK, DV], state_dtype),
            dh0: T.Tensor([N, H, DK, DV], ACCUM),
            dG_last: T.Tensor([B, H, NC, NBV, DK], ACCUM),
            chunk_offsets: T.Tensor([N + 1], "int32"),
        ):
            walk(P, Kd, Qg, W, dO, decay, dht, dS_out, dh0, S_in, dG_last, offsets=chunk_offsets)

        return packed

    if chunk_decay_terms:
        @T.prim_func
        def with_decay_terms(
            P: T.Tensor(rows(C), dtype),
            Kd: T.Tensor(rows(DK), dtype),
            Qg: T.Tensor(rows(DK), dtype),
            W: T.Tensor(rows(DK), dtype),
            dO: T.Tensor(rows(DV), dtype),
            decay: T.Tensor([B, H, NC, DK], ACCUM),
            dht: T.Tensor([B, H, DK, DV], ACCUM),
            S_in: T.Tensor([B, H, NC, DK, DV], state_dtype),
            dS_out: T.Tensor([B, H, NC, DK, DV], state_dtype),
            dh0: T.Tensor([B, H, DK, DV], ACCUM),
            dG_last: T.Tensor([B, H, NC, NBV, DK], ACCUM),
        ):
            walk(P, Kd, Qg, W, dO, decay, dht, dS_out, dh0, S_in, dG_last)

        return with_decay_terms

    @T.prim_func
    def main(
        P: T.Tensor(rows(C), dtype),
        Kd: T.Tensor(rows(DK), dtype),
        Qg: T.Tensor(rows(DK), dtype),
        W: T.Tensor(rows(DK), dtype),
        dO: T.Tensor(rows(DV), dtype),
        decay: T.Tensor([B, H, NC, DK], ACCUM),
        dht: T.Tensor([B, H, DK, DV], ACCUM),
        dS_out: T.Tensor([B, H, NC, DK, DV], state_dtype),
        dh0: T.Tensor([B, H, DK, DV], ACCUM),
    ):
        walk(P, Kd, Qg, W, dO, decay, dht, dS_out, dh0, None, None)     # no decay terms: never read

    return main
# --8<-- [end:reverse_state_pass]


# ---- the launchers ----

def run_state_passes(whole, S0, dO, dS_final, operands, as_operands=False, token_major=False, delta_rule=True,
                     segments=None):
    """``forward_states`` and ``reverse_state_pass`` by this module's two kernels: the states entering every chunk,
    the gradients of those leaving it and that of the initial state (float32), from the pieces rounded to
    ``operands`` (a torch dtype); and ``None``. With ``as_operands`` (``STATES_AS_OPERANDS``, the operands bf16 or
    fp16) the two states come in the operands' dtype and the fourth value is each chunk decay's gate term ``decay_k
    sum_v S dS``, ``[B, H, NC, DK]``. ``token_major`` (``TOKEN_MAJOR_STATES``): the pieces and ``dO`` ``[B, T, H,
    *]``, as ``forward_pieces`` gives them with it, read so by the kernels. ``delta_rule=False`` (``W = 0``,
    ``level_pieces``): the kernels compiled without the delta rule's GEMMs (the reverse pass then reads neither
    ``P`` nor ``Kd``). ``segments``: packed sequences' chunk ranges (``B = 1``; ``S0`` and ``dS_final`` ``[N, H, DK,
    DV]``; with ``as_operands``): the kernels compiled with ``varlen``, one block per sequence
    (``PACKED_STATE_KERNELS``)."""
    from kda.kernels.build import compile_program

    B, H, NC, DK = whole["decay"].shape[:3] + whole["W"].shape[-1:]
    C, DV = CHUNK_SIZE if token_major else whole["W"].shape[3], whole["U"].shape[-1]
    halves = (torch.bfloat16, torch.float16)
    flat = (lambda x: x.to(operands).contiguous()) if token_major else \
        lambda x: x.reshape(B, H, NC * C, x.shape[-1]).to(operands).contiguous()
    decay = whole["decay"].expand(B, H, NC, DK).float().contiguous()      # a gate per head: width 1
    name = str(operands).removeprefix("torch.")
    as_operands = as_operands and operands in halves
    states = operands if as_operands else torch.float32
    # float32 operands (tf32 products) take twice the shared memory: one pipeline stage
    shapes = dict(DK=DK, DV=DV, chunk_size=C, block_dv=64, dtype=name, num_stages=1 if name == "float32" else 2)
    shapes.update({"state_dtype": name} if as_operands else {}, **({"token_major": True} if token_major else {}),
                  **({} if delta_rule else {"delta_rule": False}), **({"varlen": True} if segments else {}))
    assert not segments or as_operands, "packed sequences: the kernels with the decay terms"
    # where each packed sequence's chunks start and end (sequence n: chunk_offsets[n] to chunk_offsets[n + 1])
    offsets = [torch.tensor([0] + [e for _, e in segments], dtype=torch.int32, device=S0.device)] if segments else []
    with torch.cuda.device(S0.device):
        forward = compile_program(forward_states_pass, (), **shapes)
        reverse = compile_program(reverse_state_pass, (), **shapes,
                                  **({"chunk_decay_terms": True} if as_operands else {}))
        S, dS = (launch.new_output((B, H, NC, DK, DV), states, S0.device) for _ in range(2))
        dh0 = launch.new_output(S0.shape, torch.float32, S0.device)
        W, Kd = flat(whole["W"]), flat(whole["Kd"])
        forward(W, Kd, flat(whole["U"]), decay, S0.float().contiguous(), S, *offsets)
        pieces = (flat(whole["P"]), Kd, flat(whole["Qg"]), W, flat(dO), decay, dS_final.float().contiguous())
        if not as_operands:
            reverse(*pieces, dS, dh0)
            return S.to(S0.dtype), dS.to(S0.dtype), dh0.to(S0.dtype), None
        terms = launch.new_output((B, H, NC, ceildiv(DV, 64), DK), torch.float32, S0.device)   # per 64 value columns
        reverse(*pieces, S, dS, dh0, terms, *offsets)
    return S, dS, dh0.to(S0.dtype), terms.sum(3)


def run_state_passes_from_inputs(q, k, v, g, do, S0, dS_final, scale, as_operands=False):
    """``forward_states`` and ``reverse_state_pass`` without the delta rule (levels 1-3, a gate per head ``g [B, T,
    H]``, natural log, or ``None``) by the state kernels compiled with ``gate_in``: they read ``q, k, v, do`` as
    they are (``[B, T, H, *]``, bf16 or fp16) and each chunk's cumulative gate in log2 units. Returns the states
    entering every chunk, the gradients of those leaving it (float32, or with ``as_operands`` the inputs' dtype,
    as the chunk kernel reads them), that of the initial state (float32) and each chunk decay's gate term
    ``[B, H, NC, DK]``, as ``run_state_passes`` with ``as_operands``."""
    from kda.kernels.build import compile_program

    B, T, H, DK = q.shape
    DV, C = v.shape[-1], CHUNK_SIZE
    NC = ceildiv(T, C)
    gate = torch.zeros(B, T, H, device=q.device) if g is None else g.float()
    G = torch.nn.functional.pad(gate, (0, 0, 0, NC * C - T)).view(B, NC, C, H).cumsum(2) / math.log(2.0)
    G = G.view(B, NC * C, H, 1)[:, :T].contiguous()
    name = launch.dtype_name(q.dtype)
    states = q.dtype if as_operands else torch.float32
    shapes = dict(DK=DK, DV=DV, chunk_size=C, block_dv=64, dtype=name, token_major=True, delta_rule=False,
                  gate_in=True, **({"state_dtype": name} if as_operands else {}))
    with torch.cuda.device(q.device):
        forward = compile_program(forward_states_pass, (), **shapes)
        reverse = compile_program(reverse_state_pass, (), **shapes, chunk_decay_terms=True)
        S, dS = (launch.new_output((B, H, NC, DK, DV), states, q.device) for _ in range(2))
        dh0 = launch.new_output(S0.shape, torch.float32, q.device)
        terms = launch.new_output((B, H, NC, ceildiv(DV, 64), DK), torch.float32, q.device)    # per 64 value columns
        forward(k.contiguous(), v.contiguous(), G, S0.float().contiguous(), S)
        reverse(q.contiguous(), do.to(q.dtype).contiguous(), G, float(scale), dS_final.float().contiguous(), S, dS,
                dh0, terms)
    return S, dS, dh0.to(S0.dtype), terms.sum(3)

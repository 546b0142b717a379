"""What every launcher does before a kernel runs: the kernels' configuration, their dtype names, the
buffers they write (poisoned with NaN in tests), stand-ins for the arguments a variant never touches, the
state arguments of the sequential passes, and a launch held back to run later."""

from __future__ import annotations

import functools

import torch

from kda.chunking import CHUNK_SIZE


# Measured on the H200 (results/tuning): a 32-wide value stripe gives B*H*DV/32 blocks for the
# 132 SMs and 32 state registers per thread, at the price of reading Q and K once per stripe;
# 16 re-computes Q K^T too often, 64 leaves SMs idle at B*H = 32. Three pipeline stages
# beat two by 1-3%.
KERNEL_CONFIG = {"chunk_size": CHUNK_SIZE, "block_dv": 32, "num_stages": 3, "threads": 128}

# The scalar pass's chunk slots and output warpgroups (kernels.linear_pass.seq_in_loop_scalar): run 61 in
# results/tuning, pass at (1, 32768, 32, 128): 0.561 ms with 4 slots and two output warpgroups taking
# alternate chunks, 0.566 with 2 slots, 0.693 before the split (one output group: 0.59 to 0.61, its
# outputs wrong then through shared bytes aliased across warpgroups, see build.WARP_SPECIALISED).
# Level 2 runs it too, with its constant decay (run 67: 0.421 ms with 4 slots, 0.536 with 2, 0.517 for level 2's
# own pipelined kernel, kernels.chapters.constant_decay.seq_in_loop), and level 1 without a gate (run 70: 0.402 ms
# against 0.469 for level 1's own pipelined kernel, kernels.chapters.linear_attention.seq_in_loop).
SCALAR_PASS_CONFIG = {"slots": 4, "out_groups": 2}


def dtype_name(dtype: torch.dtype) -> str:
    """The kernels' name of a half-precision torch dtype (their factories take strings)."""
    return {torch.float16: "float16", torch.bfloat16: "bfloat16"}[dtype]


# Tests set this to fill every output with NaN before a launch, so that an element the
# kernel fails to write shows up as NaN instead of as stale memory.
poison_outputs = False


def new_output(shape, dtype, device):
    """An output buffer for a kernel to fill: uninitialised, or NaN under ``poison_outputs``."""
    if poison_outputs:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


@functools.lru_cache(maxsize=64)
def stand_in(rank: int, dtype, device) -> torch.Tensor:
    """A ``[1] * rank`` tensor for a kernel argument that the compiled variant never reads or writes
    (one signature for every variant of a kernel): one per rank, dtype and device, shared, so that
    a call allocates none."""
    return torch.empty((1,) * rank, dtype=dtype, device=device)


def state_arguments(h0, output_final_state, N, H, DK, DV, device):
    """The ``h0`` and ``ht`` a sequential pass takes (``kda.kernels.stages.state_shape``): ``h0`` in
    float32 or a stand-in, and a new ``[N, H, DK, DV]`` float32 buffer for the final state or a
    stand-in. A pass compiled without the state reads and writes no stand-in."""
    h0 = h0.to(torch.float32).contiguous() if h0 is not None else stand_in(4, torch.float32, device)
    ht = new_output((N, H, DK, DV), torch.float32, device) if output_final_state else stand_in(4, torch.float32, device)
    return h0, ht


def queued(kernel, args, device):
    """``kernel(*args)`` on ``device`` as a function to call later (``validate.launch_then_check``)."""
    def launch():
        with torch.cuda.device(device):
            kernel(*args)

    return launch


def pass_held(kernel, inputs, h0, output_final_state, states, out_shape, out_dtype, device, tables=(), out=None,
              final=None):
    """A sequential pass ready to launch, ``kernel(*inputs, h0, o, ht, *tables)``: ``h0`` and ``ht`` as
    ``state_arguments`` makes them for ``states = (N, H, DK, DV)``, ``o`` a new output of ``out_shape``, or the
    caller's buffers ``out`` and ``final`` (float32 ``[N, H, DK, DV]``, contiguous: a view into a larger buffer
    may be one). Returns ``(launch, o, final state or None)``; nothing runs until ``launch()``."""
    h0, ht = state_arguments(h0, output_final_state and final is None, *states, device)
    if output_final_state and final is not None:
        if final.shape != tuple(states) or final.dtype != torch.float32 or not final.is_contiguous():
            raise ValueError(f"final must be a contiguous float32 {tuple(states)}, got {final.dtype} "
                             f"{tuple(final.shape)}")
        ht = final
    if out is not None and (out.shape != tuple(out_shape) or out.dtype != out_dtype or not out.is_contiguous()):
        raise ValueError(f"out must be a contiguous {out_dtype} {tuple(out_shape)}, got {out.dtype} {tuple(out.shape)}")
    o = new_output(out_shape, out_dtype, device) if out is None else out
    return queued(kernel, (*inputs, h0, o, ht, *tables), device), o, (ht if output_final_state else None)


def launched(prepared):
    """A launcher's ``(launch, o, final state)`` run now: returns ``(o, final state)``."""
    start, o, final = prepared
    start()
    return o, final


def keys_checked(flags) -> dict:
    """The first kernel's compile flag for the keys' check: on where the caller hands it three value flags."""
    return {"check_keys": True} if flags is not None and flags.numel() == 3 else {}

# snippet: cpu
"""Context parallel on the CPU with gloo: 2 and 4 processes (spawned here), each with a contiguous
slice of uneven length; the output and final state against the single-process forward (gates in
[-0.02, 0]: each slice passes a large part of its state on)."""
import os
import socket
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from kda.distributed import context_parallel, map_bytes
from kda.gated_delta import chunk_kda
from kda.metrics import rel_l2
from kda.reference.level4 import l2_normalize
from kda.site.runtime import text
from kda.tables import Table, sci

B, T, H, K, V = 1, 300, 2, 32, 16


def inputs():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(B, T, H, K, dtype=torch.float64, generator=gen)
    k = l2_normalize(torch.randn(B, T, H, K, dtype=torch.float64, generator=gen))
    v = torch.randn(B, T, H, V, dtype=torch.float64, generator=gen)
    g = -0.02 * torch.rand(B, T, H, K, dtype=torch.float64, generator=gen)   # mild: a slice passes its state on
    beta = torch.rand(B, T, H, dtype=torch.float64, generator=gen)
    return q, k, v, g, beta, torch.randn(B, H, K, V, dtype=torch.float64, generator=gen)


def rank_main(rank, world, port, bounds, out_dir):
    # --8<-- [start:usage]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    q, k, v, g, beta, h0 = inputs()
    s, e = bounds[rank], bounds[rank + 1]                    # this rank's slice of the sequence
    o, final = context_parallel(q[:, s:e], k[:, s:e], v[:, s:e], g[:, s:e], beta[:, s:e],
                                initial_state=h0, output_final_state=True)
    # --8<-- [end:usage]
    torch.save({"o": o, "final": final}, os.path.join(out_dir, f"{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":                # the ranks are spawned: they import this file
    q, k, v, g, beta, h0 = inputs()
    o_ref, final_ref = chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    table = Table([text(zh="rank 数", en="ranks"), text(zh="各段长度", en="slice lengths"), "rel L2 o",
                   text(zh="rel L2 末状态", en="rel L2 final state"),
                   text(zh="每个 rank 的映射字节数（float64）", en="map bytes per rank (float64)")],
                  formats=[None, None, sci, sci, "{:,}"])
    for bounds in ([0, 100, 300], [0, 7, 100, 229, 300]):
        world = len(bounds) - 1
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        with tempfile.TemporaryDirectory() as out_dir:
            mp.spawn(rank_main, args=(world, port, bounds, out_dir), nprocs=world)
            parts = [torch.load(os.path.join(out_dir, f"{r}.pt")) for r in range(world)]
        o = torch.cat([p["o"] for p in parts], dim=1)
        table.rows.append([world, " + ".join(str(b - a) for a, b in zip(bounds, bounds[1:])),
                           rel_l2(o, o_ref), rel_l2(parts[-1]["final"], final_ref),
                           map_bytes(B, H, K, V)])
    print(f"B, T, H, K, V = {B}, {T}, {H}, {K}, {V}"
          + text(zh="；CPU 上用 float64；末状态为 float32",
                 en="; float64 on the CPU; final states are float32") + "\n")
    print(table)

# snippet: cpu uses=snippets/level1/latency.py uses=snippets/level2/latency.py uses=snippets/level3/latency.py
#   uses=snippets/level4/latency.py uses=snippets/level5/latency.py uses=snippets/level5/gdn_latency.py
#   uses=snippets/bench/sdpa.py uses=snippets/cp/split_latency.py
"""Every kernel of the package against its fla peer on the H200 (bf16, B = 1, H = 32, D = 128;
levels 3 to 5 at T = 32768 only; float32 gates, unit keys),
from the recorded GPU results: milliseconds, ratio, and the fraction of the hardware floor
(HBM bytes / 4.3 TB/s, FLOPs / 686 TFLOP/s); causal softmax attention (SDPA) for context. Then
the long-context shape of the intra-card split (B = 1, H = 4, T = 131072)."""
import matplotlib.pyplot as plt
from matplotlib.ticker import NullFormatter

from kda.site.runtime import figure, recorded_data
from kda.tables import Table

level1 = recorded_data("snippets/level1/latency.py")["rows"]
level2 = recorded_data("snippets/level2/latency.py")["rows"]
level3 = recorded_data("snippets/level3/latency.py")["rows"]
level4 = recorded_data("snippets/level4/latency.py")["rows"]
level5 = recorded_data("snippets/level5/latency.py")["rows"] + recorded_data("snippets/level5/gdn_latency.py")["rows"]
sdpa = {r["T"]: r["sdpa"] for r in recorded_data("snippets/bench/sdpa.py")["rows"]}

table = Table(["level", "kda kernel", "fla peer", "T", "kda (ms)", "fla (ms)", "fla / kda", "kda at % of floor",
               "SDPA causal (ms)", "SDPA / kda"],
              formats=[None, None, None, None, "{:.3f}", "{:.3f}", "{:.2f}x", "{:.0%}", "{:.3f}", "{:.1f}x"])
for level, name, peer, rows in [(1, "linear_attention", "chunk_linear_attn", level1),
                                (2, "decay_attention", "chunk_simple_gla(g_gamma)", level2)]:
    for r in rows:
        table.rows.append([level, name, peer, r["T"], r["kda"], r["fla"], r["fla"] / r["kda"], r["floor"] / r["kda"],
                           sdpa[r["T"]], sdpa[r["T"]] / r["kda"]])
def peer_of(row):
    """The fla column of a row in the uniform schema."""
    return next(name for name in row["ms"] if name.startswith("fla "))


for r in level3:                                  # one length, both gate forms (uniform rows)
    ms, peer = r["ms"], peer_of(r)
    table.rows.append([3, f"gated_attention, {r['op'].removeprefix('gated, ')}", peer.removeprefix("fla "), r["T"],
                       ms["kda"], ms[peer], ms[peer] / ms["kda"], r["floor"] / ms["kda"], sdpa[r["T"]],
                       sdpa[r["T"]] / ms["kda"]])
for r in level4:
    table.rows.append([4, "delta_rule", "chunk_delta_rule", r["T"], r["kda"], r["fla"], r["fla"] / r["kda"],
                       r["floor"] / r["kda"], sdpa[r["T"]], sdpa[r["T"]] / r["kda"]])
LEVEL5 = {"KDA": ("chunk_kda", [("fla chunk_kda", "chunk_kda")]),
          "GDN": ("chunk_gated_delta_rule", [("fla chunk_gated_delta_rule (Triton)", "chunk_gated_delta_rule, Triton"),
                                             ("FlashQLA 0.1.3", "FlashQLA chunk_gated_delta_rule")])}
level5 = [r for r in level5 if (r["B"], r["H"]) == (1, 32)]      # the shape of the other levels
for r in level5:                                                    # rows in the uniform schema
    name, peers = LEVEL5[r["op"]]
    for key, peer in peers:
        ms = r["ms"]
        table.rows.append([5, name, peer, r["T"], ms["kda"], ms[key], ms[key] / ms["kda"], r["floor"] / ms["kda"],
                           sdpa[r["T"]], sdpa[r["T"]] / ms["kda"]])
print(table)

T = [r["T"] for r in level1]
fig, ax = plt.subplots(figsize=(6.4, 4.2))
ax.loglog(T, [sdpa[t] for t in T], "o:", label="causal softmax attention (SDPA)")
for rows, level, style in [(level1, 1, "-"), (level2, 2, "--")]:
    ax.loglog(T, [r["fla"] for r in rows], "s" + style, label=f"fla, level {level}")
    ax.loglog(T, [r["kda"] for r in rows], "^" + style, label=f"kda, level {level}")
ax.loglog(T, [r["floor"] for r in level1], "k:", label="floor of the linear kernels")
for r, marker in zip(level3, ("D", "P")):
    ax.loglog([r["T"]], [r["ms"]["kda"]], marker, label=f"kda, level 3 ({r['op'].removeprefix('gated, ')})")
    ax.loglog([r["T"]], [r["ms"][peer_of(r)]], marker, mfc="none", label=peer_of(r))
for r in level4:
    ax.loglog([r["T"]], [r["kda"]], "X", label="kda, level 4 (delta rule)")
    ax.loglog([r["T"]], [r["fla"]], "X", mfc="none", label="fla chunk_delta_rule")
for r, marker in zip(level5, ("v", "<")):
    ax.loglog([r["T"]], [r["ms"]["kda"]], marker, label=f"kda, level 5 ({r['op']})")
ax.set_xticks(T, [str(t) for t in T])             # the measured lengths; matplotlib's minor
ax.xaxis.set_minor_formatter(NullFormatter())     # labels would overlap
ax.set_xlabel("T (B = 1, H = 32, D = 128, bf16)")
ax.set_ylabel("latency (ms)")
ax.grid(True, which="both", alpha=0.3)
ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)   # beside the data
figure(fig, "latency-all", "latency of every kernel against T on the H200")

split = recorded_data("snippets/cp/split_latency.py")["rows"]
long = Table(["op", "implementation", "ms", "at % of floor"], formats=[None, None, "{:.3f}", "{:.0%}"])
for r in split:
    for name, ms in r.items():
        if isinstance(ms, float) and name != "floor":
            long.rows.append([r["op"], name, ms, r["floor"] / ms])
print(f"\nB = {split[0]['B']}, T = {split[0]['T']}, H = {split[0]['H']}, D = 128, bf16 "
      "(the intra-card split, Context parallelism, Section 4):\n")
print(long)

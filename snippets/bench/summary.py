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

from kda.site.runtime import figure, recorded_data, text
from kda.tables import Table

level1 = recorded_data("snippets/level1/latency.py")["rows"]
level2 = recorded_data("snippets/level2/latency.py")["rows"]
level3 = recorded_data("snippets/level3/latency.py")["rows"]
level4 = recorded_data("snippets/level4/latency.py")["rows"]
level5 = recorded_data("snippets/level5/latency.py")["rows"] + recorded_data("snippets/level5/gdn_latency.py")["rows"]
sdpa = {r["T"]: r["sdpa"] for r in recorded_data("snippets/bench/sdpa.py")["rows"]}

table = Table([text(zh="级", en="level"), text(zh="kda 的 kernel", en="kda kernel"),
               text(zh="fla 对应算子", en="fla peer"), "T", "kda (ms)", "fla (ms)", "fla / kda",
               text(zh="kda 达到下限的比例", en="kda at % of floor"),
               text(zh="SDPA 因果（ms）", en="SDPA causal (ms)"),
               "SDPA / kda"],
              formats=[None, None, None, None, "{:.3f}", "{:.3f}", "{:.2f}x", "{:.0%}", "{:.3f}", "{:.1f}x"])
for level, name, peer, rows in [(1, "linear_attention", "chunk_linear_attn", level1),
                                (2, "decay_attention", "chunk_simple_gla(g_gamma)", level2)]:
    for r in rows:
        table.rows.append([level, name, peer, r["T"], r["kda"], r["fla"], r["fla"] / r["kda"], r["floor"] / r["kda"],
                           sdpa[r["T"]], sdpa[r["T"]] / r["kda"]])
def peer_of(row):
    """The fla column of a row in the uniform schema."""
    return next(name for name in row["ms"] if name.startswith("fla "))


GATES = {"scalar g": "标量 g", "per-channel g": "逐通道 g"}      # the gate forms of level 3, in Chinese
for r in level3:                                  # one length, both gate forms (uniform rows)
    ms, peer, gate = r["ms"], peer_of(r), r["op"].removeprefix("gated, ")
    table.rows.append([3, text(zh=f"gated_attention，{GATES[gate]}", en=f"gated_attention, {gate}"),
                       peer.removeprefix("fla "), r["T"], ms["kda"], ms[peer], ms[peer] / ms["kda"],
                       r["floor"] / ms["kda"], sdpa[r["T"]], sdpa[r["T"]] / ms["kda"]])
for r in level4:
    table.rows.append([4, "delta_rule", "chunk_delta_rule", r["T"], r["kda"], r["fla"], r["fla"] / r["kda"],
                       r["floor"] / r["kda"], sdpa[r["T"]], sdpa[r["T"]] / r["kda"]])
LEVEL5 = {"KDA": ("chunk_kda", [("fla chunk_kda", "chunk_kda")]),
          "GDN": ("chunk_gated_delta_rule", [("fla chunk_gated_delta_rule (Triton)",
                                              "chunk_gated_delta_rule, Triton"),
                                             ("FlashQLA 0.1.3", "FlashQLA chunk_gated_delta_rule")])}
level5 = [r for r in level5 if (r["B"], r["H"]) == (1, 32)]      # the shape of the other levels
for r in level5:                                                    # rows in the uniform schema
    name, peers = LEVEL5[r["op"]]
    for key, peer in peers:
        ms = r["ms"]
        table.rows.append([5, name, peer, r["T"], ms["kda"], ms[key], ms[key] / ms["kda"], r["floor"] / ms["kda"],
                           sdpa[r["T"]], sdpa[r["T"]] / ms["kda"]])
print(table)

# one panel per level: levels 1 and 2 against T, levels 3 to 5 at their one length as bars
COLOR = {"kda": "C0", "fla": "C1", "FlashQLA": "C2", "floor": "0.5", "SDPA": "C3"}
LABEL = {"kda": "kda", "fla": "fla", "FlashQLA": "FlashQLA", "floor": text(zh="下限", en="floor")}
fig = plt.figure(figsize=(10, 7), layout="constrained")
grid = fig.add_gridspec(2, 1, height_ratios=[1, 1.1])
sweeps = grid[0].subgridspec(1, 2).subplots(sharey=True)
T = [r["T"] for r in level1]
for ax, measured, title in [(sweeps[0], level1, text(zh="第一级：linear_attention", en="level 1: linear_attention")),
                            (sweeps[1], level2, text(zh="第二级：decay_attention", en="level 2: decay_attention"))]:
    ax.loglog(T, [r["kda"] for r in measured], "^-", color=COLOR["kda"], label="kda")
    ax.loglog(T, [r["fla"] for r in measured], "s-", color=COLOR["fla"],
              label=text(zh="fla 对应算子", en="fla peer"))
    ax.loglog(T, [r["floor"] for r in measured], ":", color=COLOR["floor"], linewidth=2,
              label=text(zh="硬件下限", en="hardware floor"))
    ax.loglog(T, [sdpa[t] for t in T], "o:", color=COLOR["SDPA"], mfc="none", markersize=8,   # open: fla is close
              label=text(zh="因果 softmax 注意力（SDPA）", en="causal softmax attention (SDPA)"))
    ax.set_xticks(T, [str(t) for t in T])         # the measured lengths; matplotlib's minor
    ax.xaxis.set_minor_formatter(NullFormatter())  # labels would overlap
    ax.set_xlabel("T (B = 1, H = 32, D = 128, bf16)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
sweeps[0].set_ylabel(text(zh="延迟（ms）", en="latency (ms)"))


def bars(ax, groups, title):
    """Bars at T = 32768, one group per operation: kda, its peers and the floor, each value written on top."""
    x = 0
    for group, values in groups:                   # names under the bars are annotations, not tick labels:
        first = x                                  # figure() puts annotations in each language
        for kind, ms in values:
            ax.bar_label(ax.bar(x, ms, color=COLOR[kind]), fmt="%.2f", fontsize=7)
            ax.annotate(LABEL[kind], (x, 0), xycoords=("data", "axes fraction"), xytext=(0, -4),
                        textcoords="offset points", ha="center", va="top", fontsize=8)
            x += 1
        if group:
            ax.annotate(group, ((first + x - 1) / 2, 0), xycoords=("data", "axes fraction"), xytext=(0, -20),
                        textcoords="offset points", ha="center", va="top", fontsize=9)
        x += 0.6                                   # a gap between groups
    ax.set_xticks([])
    ax.margins(y=0.08)                             # room for the value on the tallest bar
    ax.set_title(title, fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)


def level5_bars(r):
    """kda, then the peers in LEVEL5's order (fla's Triton path, FlashQLA), then the floor."""
    peers = [("FlashQLA" if key.startswith("FlashQLA") else "fla", r["ms"][key]) for key, _ in LEVEL5[r["op"]][1]]
    return [("kda", r["ms"]["kda"])] + peers + [("floor", r["floor"])]


gate_of = lambda r: r["op"].removeprefix("gated, ")               # "scalar g" or "per-channel g"
levels = grid[1].subgridspec(1, 3, width_ratios=[6.6, 3, 7.6]).subplots(sharey=True)
bars(levels[0], [(text(zh=GATES[gate_of(r)], en=gate_of(r)),
                  [("kda", r["ms"]["kda"]), ("fla", r["ms"][peer_of(r)]), ("floor", r["floor"])]) for r in level3],
     text(zh="第三级：gated_attention", en="level 3: gated_attention"))
bars(levels[1], [(None, [("kda", r["kda"]), ("fla", r["fla"]), ("floor", r["floor"])]) for r in level4],
     text(zh="第四级：delta_rule", en="level 4: delta_rule"))
bars(levels[2], [(r["op"], level5_bars(r)) for r in level5],
     text(zh="第五级：chunk_kda、chunk_gated_delta_rule", en="level 5: chunk_kda, chunk_gated_delta_rule"))
levels[0].set_ylabel(text(zh="T = 32768 时的延迟（ms）", en="latency at T = 32768 (ms)"))
handles, labels = sweeps[0].get_legend_handles_labels()
handles.insert(2, plt.Rectangle((0, 0), 1, 1, color=COLOR["FlashQLA"]))      # a level 5 peer only
labels.insert(2, "FlashQLA 0.1.3")
fig.legend(handles, labels, loc="outside upper center", ncol=5, fontsize=8)
figure(fig, "latency-all", text(zh="H200 上每个 kernel 的延迟：第一、二级随 T 变化，第三至五级在 T = 32768",
                                en="latency of every kernel on the H200: levels 1 and 2 against T, "
                                   "levels 3 to 5 at T = 32768"))

split = recorded_data("snippets/cp/split_latency.py")["rows"]
long = Table(["op", text(zh="实现", en="implementation"), "ms", text(zh="达到下限的比例", en="at % of floor")],
             formats=[None, None, "{:.3f}", "{:.0%}"])
for r in split:
    in_chinese = {"kda, no split": "kda，不切分",
                  f"kda, split into {r['pieces']} (auto)": f"kda，切成 {r['pieces']} 段（自动）"}
    for name, ms in r.items():
        if isinstance(ms, float) and name != "floor":
            label = text(zh=in_chinese[name], en=name) if name in in_chinese else name
            long.rows.append([r["op"], label, ms, r["floor"] / ms])
print(f"\nB = {split[0]['B']}, T = {split[0]['T']}, H = {split[0]['H']}, D = 128, bf16"
      + text(zh="（卡内切分，上下文并行第 4 节）：",
             en=" (the intra-card split, Context parallelism, Section 4):") + "\n")
print(long)

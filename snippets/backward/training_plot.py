# snippet: cpu uses=snippets/backward/training.py
"""The two loss curves of the training check recorded on the H200 by training.py."""
import matplotlib.pyplot as plt

from kda.site.runtime import figure, recorded_data, text

data = recorded_data("snippets/backward/training.py")
fig, ax = plt.subplots(figsize=(6, 3.4))
for name, style in (("kda", "-"), ("fla", "--")):
    ax.plot(range(data["steps"]), data["loss"][name], style, lw=0.9, label=name)
ax.set_xlabel(text(zh="训练步", en="training step"))
ax.set_ylabel(text(zh="交叉熵损失（字节）", en="cross-entropy loss (bytes)"))
ax.set_yscale("log")
ax.grid(True, which="both", alpha=0.3)
ax.legend()
figure(fig, "training-curves",
       text(zh="同一随机种子下，kda 与 fla 的 chunk_kda 训练同一个模型的损失曲线",
            en="loss curves of one model trained from one seed with kda's and with fla's chunk_kda"))

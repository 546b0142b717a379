# snippet: cpu
"""The table of public ops (``kda.catalog``): where each is defined, what it is checked against, what it runs on
each device, and where its tests and its chapter are."""
from kda.catalog import OPS
from kda.site.runtime import text

headers = [text(zh="算子", en="op"), text(zh="定义于", en="defined in"), text(zh="float64 对照", en="float64 check"),
           text(zh="CPU 路径", en="CPU path"), text(zh="CUDA kernel（kda/kernels/）", en="CUDA kernels (kda/kernels/)"),
           text(zh="启动函数", en="launchers"), text(zh="测试", en="tests"), text(zh="章节", en="chapter")]
print("| " + " | ".join(headers) + " |")
print("|" + "---|" * len(headers))
code = lambda names: "<br>".join(f"`{n}`" for n in names)
for name, op in OPS.items():
    kernels = dict.fromkeys(f"{module}.{factory}" for module, factory, _ in op.kernels)    # once each, in order
    launchers = [launcher.removeprefix("kda.kernels.") for launcher in op.launchers]
    print("| " + " | ".join([f"`{name}`", f"`kda/{op.module}.py`", f"`kda.reference.{op.reference}.recurrent`",
                             f"`{op.cpu_path}`", code(kernels), code(launchers),
                             code(t.removeprefix("tests/") for t in op.tests),
                             f"[{op.chapter}]({op.chapter}.md)"]) + " |")

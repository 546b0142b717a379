# snippet: cpu
"""The CUDA paths that landed before their GPU tests: each is off by default behind its switch."""
from kda import cuda_paths
from kda.site.runtime import text

waiting = cuda_paths.unverified()
if not waiting:
    print(text(zh="目前没有：包里的每条 CUDA 路径都已在 H200 上通过 GPU 测试，默认开启。",
               en="None at present: every CUDA path of the package has passed its GPU tests on the H200 "
                  "and is on by default."))
else:
    print("| " + text(zh="路径", en="path") + " | " + text(zh="开关（默认关）", en="switch (off by default)")
          + " | " + text(zh="做什么", en="what it does") + " |")
    print("|---|---|---|")
    for path in waiting:
        print(f"| `{path.name}` | `{path.module}.{path.switch}` | {text(zh=path.what['zh'], en=path.what['en'])} |")

# snippet: cpu
"""The CUDA paths that landed before their GPU tests (each off by default behind its switch), and
those that passed them but stay off by default (slower than the path they would replace, or not timed
yet)."""
from kda import cuda_paths
from kda.site.runtime import text


def print_paths(paths, switch_header, with_log):
    """One table row per path: its name, switch, GPU test log (``with_log``) and what it does."""
    log_header = [text(zh="GPU 测试记录", en="GPU test log")] if with_log else []
    headers = [text(zh="路径", en="path"), switch_header, *log_header, text(zh="做什么", en="what it does")]
    print("| " + " | ".join(headers) + " |")
    print("|" + "---|" * len(headers))
    for path in paths:
        log = [f"`{path.gpu_log}`"] if with_log else []
        print("| " + " | ".join([f"`{path.name}`", f"`{path.module}.{path.switch}`", *log,
                                 text(zh=path.what["zh"], en=path.what["en"])]) + " |")


waiting = cuda_paths.unverified()
if not waiting:
    print(text(zh="尚未在 GPU 上运行过的路径：目前没有，包里的每条 CUDA 路径都已在 H200 上通过 GPU 测试。",
               en="Paths not yet run on a GPU: none at present; every CUDA path of the package has passed its "
                  "GPU tests on the H200."))
else:
    print_paths(waiting, text(zh="开关（默认关）", en="switch (off by default)"), with_log=False)
off = cuda_paths.tested_but_off()
if off:
    print(text(zh="\n通过了 GPU 测试、但默认关闭的路径（比它要替代的路径慢，或还没有计时；开关旁的注释写明原因）：\n",
               en="\nPaths that passed their GPU tests but stay off by default (slower than the path they would "
                  "replace, or not timed yet; the comment beside the switch says which):\n"))
    print_paths(off, text(zh="开关", en="switch"), with_log=True)

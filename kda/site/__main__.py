"""``python -m kda.site``: run snippets and write GPU records, or show their status.

    python -m kda.site run --gpu              run every GPU snippet, write results/gpu/*.json
    python -m kda.site run --gpu --stale      only the GPU snippets whose record is missing or stale
    python -m kda.site run --cpu              run the CPU snippets into the build cache
    python -m kda.site status                 every snippet: where it runs, hash, record state;
                                              exit 1 on a missing GPU record
    python -m kda.site status --fresh         exit 1 on a stale GPU record too (before publishing)
    python -m kda.site rerecord --out $OUT    the stale GPU records in one device call (kda.site.rerecord):
                                              compiles in parallel, times one at a time, returns
                                              records.tar and the caches for the next call
    python -m kda.site restamp                fresh records of an older scheme whose inputs are byte for
                                              byte those of their commit: hashed again under the current one
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from kda.site import snippets as sn
from kda.site.toolkit import cuda_tools_on_path

ROOT = Path(__file__).resolve().parents[2]


def _status(args) -> int:
    """Every snippet and the state of its record; the exit code is 1 on a missing GPU record, and
    with ``--fresh`` (what a GPU runner checks before it publishes) on a stale one too."""
    count = {"ok": 0, "stale": 0, "missing": 0}
    for s in sn.discover(ROOT):
        if s.where == "gpu":
            state, record, digest = sn.record_status(s, device=args.device)
            count[state] += 1
            line = f"gpu  {state:8s} {digest}  {s.path}"
            if state == "stale":
                line += f"  ({sn.stale_description(record, sn.changed_since(s, record, device=args.device))})"
            print(line)
        else:
            print(f"cpu  {'-':8s} {sn.source_hash(s)}  {s.path}")
    total = sum(count.values())
    print(f"GPU records: {count['ok']} of {total} fresh, {count['stale']} stale, {count['missing']} missing")
    return 1 if count["missing"] or (args.fresh and count["stale"]) else 0


def _select(where: str, only: str | None, device: str, stale: bool) -> list:
    """The snippets that run ``where``, those whose path contains ``only``; with ``stale`` only the
    GPU snippets whose record is missing or stale."""
    todo = [s for s in sn.discover(ROOT) if s.where == where and (not only or only in s.path)]
    return [s for s in todo if sn.record_status(s, device=device)[0] != "ok"] if stale else todo


def _gpu_provenance(commit: str | None) -> dict | None:
    """The provenance of records made here, or ``None`` (said on stderr) without a CUDA device."""
    info = sn.provenance(commit)
    if info["device"] == "cpu":
        print("no CUDA device: GPU snippets need one", file=sys.stderr)
        return None
    return info


def _run(args) -> int:
    where = "gpu" if args.gpu else "cpu"
    todo = _select(where, args.only, args.device, stale=where == "gpu" and args.stale)
    info = _gpu_provenance(args.commit) if where == "gpu" else None
    if where == "gpu" and info is None:
        return 2
    failures = 0
    start = time.time()
    print(f"{len(todo)} {where.upper()} snippet(s)" + (f" on {info['device']}" if info else ""), flush=True)
    for i, s in enumerate(todo, 1):
        print(f"[{i}/{len(todo)}] {s.path} ...", end=" ", flush=True)
        try:
            if where == "gpu":
                result = sn.run(s, timeout=args.timeout)
                path = sn.write_record(s, result, info)
                print(f"{result.seconds:.1f} s -> {path.relative_to(ROOT)}", flush=True)
            else:
                result, hit = sn.cached_run(s, ROOT / ".cache" / "kda-site")
                print("cached" if hit else f"{result.seconds:.1f} s", flush=True)
        except sn.SnippetError as e:
            failures += 1
            print("FAILED", flush=True)
            print("    " + str(e).replace("\n", "\n    "), flush=True)
    print(f"done in {time.time() - start:.0f} s, {failures} failed", flush=True)
    return 1 if failures else 0


def _rerecord(args) -> int:
    import tarfile

    from kda.site import rerecord as rr

    if args.carry and rr.unpack_caches(Path(args.carry)):
        print(f"caches put back from {args.carry}", flush=True)
    todo = _select("gpu", args.only, args.device, stale=True)
    info = _gpu_provenance(args.commit)
    if info is None:
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def pack_records():
        with tarfile.open(out / "records.tar", "w") as tar:
            tar.add(ROOT / "results" / "gpu", arcname=".")
        rr.pack_choices(out)

    print(f"{len(todo)} stale GPU snippet(s) on {info['device']}, {args.budget:.0f} s", flush=True)
    log = lambda line: print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)
    outcome = rr.rerecord(todo, rr.Recorder(info, log), args.budget - rr.PACK_RESERVE_S, args.warm,
                          after_record=pack_records)
    files = rr.pack_caches(out)
    log(f"caches: {', '.join(f.name for f in files) or 'nothing'} in {out}")
    for path, state in outcome.items():
        print(f"{state:9s} {path}")
    return 0 if all(state == "recorded" for state in outcome.values()) else 1


def _restamp(args) -> int:
    for s in _select("gpu", args.only, args.device, stale=False):
        state = sn.record_status(s, device=args.device)[0]
        done = sn.restamp(s, device=args.device)
        print(f"{'restamped' if done else state:9s} {s.path}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kda.site", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run snippets")
    kind = run.add_mutually_exclusive_group(required=True)
    kind.add_argument("--gpu", action="store_true", help="GPU snippets: write records with provenance")
    kind.add_argument("--cpu", action="store_true", help="CPU snippets: fill the build cache")
    run.add_argument("--stale", action="store_true", help="GPU: only missing or stale records")
    run.add_argument("--only", help="only snippets whose path contains this text")
    run.add_argument("--commit", help="git commit to record (when the GPU machine has no .git)")
    run.add_argument("--timeout", type=float, default=900, help="seconds per snippet")
    run.add_argument("--device", default=sn.DEFAULT_DEVICE)
    again = sub.add_parser("rerecord", help="re-record the stale GPU snippets within one device call")
    again.add_argument("--out", required=True, help="folder the call returns: records.tar, cache parts")
    again.add_argument("--carry", help="folder holding the cache parts of an earlier call")
    again.add_argument("--budget", type=float, default=560, help="seconds this call may spend, packing included")
    again.add_argument("--warm", type=float, default=180, help="seconds of the parallel phase")
    again.add_argument("--only", help="only snippets whose path contains this text")
    again.add_argument("--commit", help="git commit to record (when the GPU machine has no .git)")
    again.add_argument("--device", default=sn.DEFAULT_DEVICE)
    stamp = sub.add_parser("restamp", help="hash fresh records of an older scheme again under the current one")
    stamp.add_argument("--only", help="only snippets whose path contains this text")
    stamp.add_argument("--device", default=sn.DEFAULT_DEVICE)
    status = sub.add_parser("status", help="list snippets and the state of their GPU records")
    status.add_argument("--device", default=sn.DEFAULT_DEVICE)
    status.add_argument("--fresh", action="store_true",
                        help="exit non-zero on a stale record too (the check before publishing)")
    args = parser.parse_args(argv)
    cuda_tools_on_path()
    return {"status": _status, "run": _run, "rerecord": _rerecord, "restamp": _restamp}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())

"""W1A16 peers (issue 10): bitcompile's binary_weight_linear against fp16 cuBLAS, gemlite and humming.

On the GPU machine, from the repository root, with `.whl` carried (the humming-kernels wheel and
gemlite's source, benchmarks/NOTES.md "Peers" says how it is made):

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      && export PYTHONPATH=/tmp/site:$PWD/.whl/gemlite_src:$PYTHONPATH \
      && TORCH_EXTENSIONS_DIR=/tmp/bitcompile_extensions python3 benchmarks/peers.py --results $OUT/RESULTS.md
    python benchmarks/peers.py --dry-run     # no GPU needed: builds the inputs, checks imports, prints the plan
    python benchmarks/bench_ops.py --peers    # the same tables after bench_ops' own rows, in its process

All methods multiply the same fp16 x by the same weight sign(w) * alpha (alpha = mean|w| per row, fp16):
  fp16        F.linear on that weight as dense fp16 (cuBLAS): the baseline, and the reference of the errors
  bitcompile  torch.ops.bitcompile.binary_weight_linear(x, pack_signs(w), K, alpha)
  gemlite 1b  GemLiteLinear(1, group_size=128), HQQ form: W_q = (w >= 0), scales 2*alpha, zeros 0.5
  gemlite 4b  the same W_q, scales and zeros in GemLiteLinear(4, group_size=128): its 4-bit kernel, same values
  humming 1b  HummingLayer uint1, fp16 scale 2*alpha per row, floating zero point 0.5 ((q - 0.5) * 2 alpha);
              tuning config from humming.tune.get_heuristics_config for that M
Times (us) are "L2 flushed / graph": bench_ops.time_cuda (do_bench median, L2 flushed), then one CUDA graph
of >= 100 calls cycling over distinct copies of the method's weight totalling >= 192 MiB (the copies used
are listed). Ratios are fp16 time / method time (> 1: faster than cuBLAS). A peer that cannot be imported
or run is reported as "not run: reason". The tables are printed and appended to --results.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # bitcompile from this checkout, bench_ops beside this file

import bitcompile  # noqa: E402
from bitcompile import ops, reference  # noqa: E402
from bench_ops import cycling, time_cuda, time_cuda_graph  # noqa: E402  (us: L2-flushed do_bench median; per call in a graph)

SHAPES = [(1, 8192), (16, 8192), (128, 8192), (1, 16384)]  # (M, N = K)
ROTATE_BYTES = 192 << 20
METHODS = ["fp16", "bitcompile", "gemlite 1b", "gemlite 4b g128", "humming 1b"]


def time_graph(fns, replays: int) -> float:
    """bench_ops.time_cuda_graph of one graph cycling over `fns` (one call a distinct weight), each called once
    before the capture, at least one call of each in the graph."""
    for fn in fns:
        fn()
    return time_cuda_graph(cycling(lambda fn: fn(), fns), max(replays, len(fns)))


def make_problem(m: int, n: int, device: str) -> dict:
    torch.manual_seed(m * 131 + n)
    w = torch.randn(n, n, device=device)
    signs = w >= 0
    alpha = w.abs().mean(1).half()
    packed = ops.pack_signs(w) if device == "cuda" else reference.pack_signs(w)
    del w
    w16 = torch.where(signs, alpha[:, None], -alpha[:, None])  # exactly +-alpha in fp16
    x = torch.randn(m, n, device=device, dtype=torch.float16)
    return dict(m=m, n=n, k=n, x=x, signs=signs, alpha=alpha, packed=packed, w16=w16)


# Builders: one weight copy each call; return (callable, bytes of that copy's weight tensors).
def build_fp16(p):
    w = p["w16"].clone()
    return (lambda: F.linear(p["x"], w)), w.nbytes


def build_bitcompile(p):
    packed, scale = p["packed"].clone(), p["alpha"].float()
    return (lambda: torch.ops.bitcompile.binary_weight_linear(p["x"], packed, p["k"], scale)), packed.nbytes


def build_gemlite(p, bits: int):
    import gemlite

    n, k = p["n"], p["k"]
    layer = gemlite.GemLiteLinear(bits, group_size=128, in_features=k, out_features=n,
                                  input_dtype=gemlite.DType.FP16, output_dtype=gemlite.DType.FP16)
    scales = (2 * p["alpha"]).view(n, 1).expand(n, k // 128).contiguous()  # fp16, one per group of 128
    layer.pack(p["signs"].to(torch.uint8), scales, torch.full_like(scales, 0.5), None)  # W = (W_q - 0.5) * 2 alpha
    return (lambda: layer(p["x"])), sum(t.nbytes for t in (layer.W_q, layer.scales, layer.zeros))


def build_humming(p):
    from humming import ops as hops
    from humming.layer import HummingLayer
    from humming.tune import get_heuristics_config

    n, k = p["n"], p["k"]
    layer = HummingLayer(shape_n=n, shape_k=k, torch_dtype=torch.float16,
                         weight_config={"dtype": "uint1", "has_zero_point": True, "is_fp_zero_point": True}).cuda()
    layer.load_from_tensors({
        "weight": hops.pack_weight(p["signs"].to(torch.int32).contiguous(), 1),  # (N, K / 32) int32
        "weight_scale": (2 * p["alpha"]).view(n, 1),
        "zero_point": torch.full((n, 1), 0.5, dtype=torch.float16, device="cuda"),
    })
    layer.transform()
    tuning = get_heuristics_config(layer.humming_config, shape_m=p["m"], device=p["x"].device)
    try:
        layer(p["x"], tuning_config=tuning)
    except Exception as error:  # keep the peer in the table: its own per-M default configs instead
        print(f"  humming: heuristics config for M={p['m']} failed ({type(error).__name__}: {error}); default configs")
        tuning = None
    nbytes = sum(t.nbytes for name, t in layer.named_parameters())
    return (lambda: layer(p["x"], tuning_config=tuning)), nbytes


BUILDERS = {"fp16": build_fp16, "bitcompile": build_bitcompile, "gemlite 1b": lambda p: build_gemlite(p, 1),
            "gemlite 4b g128": lambda p: build_gemlite(p, 4), "humming 1b": build_humming}


def import_peers() -> dict:
    """Import gemlite and humming; returns {method: reason} for those that cannot run, and their versions."""
    skip, versions = {}, {}
    try:
        import gemlite

        h100 = os.path.join(os.path.dirname(gemlite.__file__), "configs", "h100.json")
        loaded = gemlite.load_config(h100)  # gemlite picks a config by device name only; none is named H200
        versions["gemlite"] = f"{gemlite.__version__} (h100.json {'loaded' if loaded else 'NOT loaded'})"
    except Exception as error:
        skip["gemlite 1b"] = skip["gemlite 4b g128"] = f"import gemlite: {type(error).__name__}: {error}"
    try:
        import humming
        from humming.layer import HummingLayer  # noqa: F401
        from humming.tune import get_heuristics_config  # noqa: F401

        versions["humming"] = humming.__version__
    except Exception as error:
        skip["humming 1b"] = f"import humming: {type(error).__name__}: {error}"
    return skip, versions


def run_shape(p, skip, quick: bool) -> dict:
    """{method: (eager us, graph us as text, copies, relative error) or a 'not run: ...' string}."""
    cells, ref = {}, None
    for method in METHODS:
        if method in skip:
            cells[method] = f"not run: {skip[method]}"[:140]
            continue
        fns = []
        try:
            fn, nbytes = BUILDERS[method](p)
            y = fn().float()
            torch.cuda.synchronize()
            if method == "fp16":
                ref = y  # fp16 runs first: the reference of the others
            ok = ref is not None and y.shape == ref.shape
            err = ((y - ref).norm() / ref.norm()).item() if ok else float("nan")
            fns = [fn] + [BUILDERS[method](p)[0] for _ in range(math.ceil(ROTATE_BYTES / nbytes) - 1)]
            eager = time_cuda(fn, 50 if quick else 200)
            try:
                graph = f"{time_graph(fns, 20 if quick else 100):.1f}"
            except Exception as error:  # the eager time still counts
                graph = f"graph failed: {type(error).__name__}: {error}".replace("\n", " ").replace("|", "/")[:100]
            cells[method] = (eager, graph, len(fns), err)
            print(f"  {method}: {eager:.1f} / {graph} us, {len(fns)} copies, rel err {err:.1e}", flush=True)
        except Exception as error:  # reported in the table, the other methods still run
            cells[method] = f"not run: {type(error).__name__}: {error}".replace("\n", " ").replace("|", "/")[:140]
            print(f"  {method}: {cells[method]}", flush=True)
        del fns
        torch.cuda.empty_cache()
    return cells


def graph_ratio(base: str, ours: str) -> str:
    try:
        return f"{float(base) / float(ours):.2f}x"
    except ValueError:
        return "-"


def tables(rows) -> str:
    timed = METHODS[1:]
    head = "| M | N=K | " + " | ".join(f"{m} us" for m in METHODS) + " | " + " | ".join(f"{m} ratio" for m in timed) + " |"
    lines = [head, "|" + "---|" * (2 + len(METHODS) + len(timed))]
    errors = ["| M | N=K | " + " | ".join(f"{m} rel err" for m in timed) + " | graph weight copies |",
              "|" + "---|" * (3 + len(timed))]
    for (m, n), cells in rows:
        base = cells["fp16"]
        us = [f"{c[0]:.1f} / {c[1]}" if isinstance(c, tuple) else c for c in (cells[x] for x in METHODS)]
        ratio = [f"{base[0] / c[0]:.2f}x / {graph_ratio(base[1], c[1])}" if isinstance(c, tuple) and isinstance(base, tuple)
                 else "" for c in (cells[x] for x in timed)]
        lines.append(f"| {m} | {n} | " + " | ".join(us + ratio) + " |")
        errs = [f"{cells[x][3]:.1e}" if isinstance(cells[x], tuple) else "not run" for x in timed]
        copies = ", ".join(f"{x} {cells[x][2]}" for x in METHODS if isinstance(cells[x], tuple))
        errors.append(f"| {m} | {n} | " + " | ".join(errs) + f" | {copies} |")
    legend = ("us: L2 flushed (do_bench median) / CUDA graph cycling over the listed number of distinct weight "
              "copies, >= 192 MiB in all (1: one weight of >= 192 MiB, past the 60 MB L2, or the graph replays one weight). "
              "ratio: fp16 / method. "
              "rel err: |y - y_fp16| / |y_fp16| on the same +-alpha weight.")
    return "\n".join(lines) + "\n\n" + "\n".join(errors) + "\n\n" + legend


def dry_run(skip) -> None:
    print("dry run: no timing. methods:", ", ".join(METHODS))
    for method, reason in skip.items():
        print(f"  {method}: would be reported as not run: {reason[:160]}")
    for m, n in SHAPES:
        p = make_problem(m, n, "cpu")
        rows = min(64, n)
        assert torch.equal(reference.unpack_signs(p["packed"][:rows], n) > 0, p["signs"][:rows]), "pack_signs"
        print(f"M={m} N=K={n}: x {tuple(p['x'].shape)} fp16, packed {tuple(p['packed'].shape)} int32, "
              f"fp16 weight {p['w16'].nbytes >> 20} MiB -> {math.ceil(ROTATE_BYTES / p['w16'].nbytes)} graph copies, "
              f"bitcompile {p['packed'].nbytes >> 20} MiB -> {math.ceil(ROTATE_BYTES / p['packed'].nbytes)}")
    if "humming 1b" not in skip:  # the layout the humming builder loads, against the schema's own (CPU-checkable)
        from humming.schema import BaseWeightSchema

        n = k = 8192
        schema = BaseWeightSchema.from_config({"quant_method": "humming", "dtype": "uint1", "has_zero_point": True,
                                               "is_fp_zero_point": True})
        attrs = {name: (a["shape"], a["dtype"]) for name, a in schema.get_tensors_attrs(n, k, torch.float16).items()}
        want = {"weight": ((n, k // 32), torch.int32), "weight_scale": ((n, 1), torch.float16),
                "zero_point": ((n, 1), torch.float16)}
        assert attrs == want, attrs
        print(f"humming uint1 schema: {schema.b_dtype}, tensors {attrs}: matches the builder")


def run(quick: bool, results: str) -> str:
    """Time every method at every shape on the GPU; print the tables, append them to `results`, return them."""
    skip, versions = import_peers()
    try:
        ops.load_kernels("cuda")
    except Exception as error:
        skip["bitcompile"] = f"kernel build: {type(error).__name__}: {error}"
    rows = []
    for m, n in SHAPES:
        print(f"M={m} N=K={n}", flush=True)
        rows.append(((m, n), run_shape(make_problem(m, n, "cuda"), skip, quick)))
    import triton

    peers = ", ".join(f"{name} {v}" for name, v in versions.items()) or "no peers imported"
    header = (f"## W1A16 peers (benchmarks/peers.py): {datetime.date.today().isoformat()}, {torch.cuda.get_device_name()}, "
              f"torch {torch.__version__}, CUDA {torch.version.cuda}, triton {triton.__version__}, "
              f"bitcompile {bitcompile.__version__}, {peers}")
    text = f"{header}\n\n{tables(rows)}\n"
    print(text)
    with open(results, "a") as out:
        out.write("\n" + text)
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--dry-run", action="store_true", help="no GPU: build the inputs, check imports, print the plan")
    parser.add_argument("--results", default=str(HERE / "RESULTS.md"), help="file the tables are appended to")
    args = parser.parse_args()
    if args.dry_run or not torch.cuda.is_available():
        dry_run(import_peers()[0])
    else:
        run(args.quick, args.results)


if __name__ == "__main__":
    main()

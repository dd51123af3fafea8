"""Which kernels of one CUDA source compile to the same PTX in two checkouts (an offline check that a change leaves
kernels that ran on the GPU as they were).

    python3 benchmarks/kernels/ptx_compare.py OLD_CHECKOUT NEW_CHECKOUT csrc/cuda/binary_conv2d_wgmma.cu

compiles the file in both (nvcc -ptx, sm_90a, the build's flags), normalizes what differs between any two builds
(the file-hash in internal and anonymous-namespace names, basic-block label numbers, parameter numbering), and prints
per kernel: `same`, `same but parameters` (only .param declarations differ: an added, unused argument), `differs`,
`new` or `gone`. Kernels are matched by their template arguments (the mangled name up to the parameter list).
"""

from __future__ import annotations

import argparse
import difflib
import pathlib
import re
import subprocess
import tempfile

FLAGS = ["-std=c++17", "-O3", "-arch=sm_90a", "-DBITCOMPILE_SM90A=1"]


def kernels(checkout: pathlib.Path, source: str) -> dict[str, list[str]]:
    with tempfile.TemporaryDirectory() as tmp:
        ptx = pathlib.Path(tmp) / "out.ptx"
        subprocess.run(["nvcc", *FLAGS, "-I", str(checkout / "csrc"), "-ptx", str(checkout / source), "-o", str(ptx)],
                       check=True, capture_output=True)
        text = ptx.read_text()
    text = re.sub(r"_INTERNAL_\w{8}_\d+_\w+?_cu_\w{8}", "INTERNAL", text)
    text = re.sub(r"_GLOBAL__N__\w+?_cu_\w{8}", "NS", text)
    out = {}
    for part in re.split(r"\n(?=(?:\.visible |\.weak )?\.entry )", text):
        match = re.match(r"(?:\.visible |\.weak )?\.entry (\w+)", part)
        if match:
            name = match.group(1)
            body = part.replace(name[2:], "KERNEL")  # also in the names of its static shared arrays (_ZZ...)
            body = re.sub(r"\$L__BB\d+_", "$L__BB_", re.sub(r"_param_\d+", "_param_N", body))
            out[name.split("EEv")[0]] = body.splitlines()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=pathlib.Path)
    parser.add_argument("new", type=pathlib.Path)
    parser.add_argument("source", help="path of the .cu file inside both checkouts")
    args = parser.parse_args()
    old, new = kernels(args.old, args.source), kernels(args.new, args.source)
    counts: dict[str, int] = {}
    for key in sorted(old.keys() | new.keys()):
        if key not in new:
            verdict = "gone"
        elif key not in old:
            verdict = "new"
        else:
            changed = [line for line in difflib.unified_diff(old[key], new[key], lineterm="", n=0)
                       if line[:1] in "+-" and not line.startswith(("+++", "---"))]
            if not changed:
                verdict = "same"
            elif all(".param" in line for line in changed):
                verdict = "same but parameters"
            else:
                verdict = "differs"
        counts[verdict] = counts.get(verdict, 0) + 1
        print(f"{verdict:20s} {key}")
    print(", ".join(f"{n} {verdict}" for verdict, n in sorted(counts.items())))


if __name__ == "__main__":
    main()

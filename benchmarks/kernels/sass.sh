#!/usr/bin/env bash
# SASS of one kernel, here (no GPU): compiles a csrc/cuda source to a cubin for sm_90a with line info and prints the
# kernel's instructions with their source lines, then the instruction count of each source line (the busiest first).
#   bash benchmarks/kernels/sass.sh binary_conv2d_wgmma 'binary_conv2d_wgmma_kernelI6__half' [FIRST_LINE LAST_LINE]
# FIRST_LINE / LAST_LINE keep the count to that range of the source file (e.g. one loop). Output under
# benchmarks/kernels/build/sass/ (NAME.sass: the whole kernel, NAME.lines: the counts). Needs nvdisasm: on PATH, or
# `pip install nvidia-cuda-nvdisasm` (found in that wheel's bin folder).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
source_name="$1" kernel="$2" first="${3:-0}" last="${4:-999999}"
nvdisasm_bin="$(command -v nvdisasm || true)"
if [ -z "$nvdisasm_bin" ]; then
  nvdisasm_bin="$(python3 -c 'import nvidia, os; [print(os.path.join(p, "cu13", "bin", "nvdisasm")) for p in nvidia.__path__]' 2>/dev/null | head -1 || true)"
fi
if [ -z "$nvdisasm_bin" ] || [ ! -x "$nvdisasm_bin" ]; then
  echo "sass.sh: nvdisasm not found (pip install nvidia-cuda-nvdisasm)" >&2
  exit 1
fi
out="$here/build/sass"
mkdir -p "$out"
cubin="$out/$source_name.cubin"
nvcc -std=c++17 -O3 -lineinfo -gencode=arch=compute_90a,code=sm_90a -DBITCOMPILE_SM90A=1 -I "$root/csrc" -cubin \
  "$root/csrc/cuda/$source_name.cu" -o "$cubin"
"$nvdisasm_bin" -gi -c "$cubin" > "$out/$source_name.all.sass"
name="$(echo "$kernel" | tr -c 'A-Za-z0-9_\n' '_')"
# the kernel's section: from its .text header to the next one
awk -v k="$kernel" '/^\/\/-+ \.text\./ { on = index($0, k) > 0 } on' "$out/$source_name.all.sass" > "$out/$name.sass"
if [ ! -s "$out/$name.sass" ]; then
  echo "sass.sh: no kernel matching '$kernel' in $source_name.cu; kernels:" >&2
  grep -o '^//-* \.text\.[^ ]*' "$out/$source_name.all.sass" | sed 's|.*\.text\.||' >&2
  exit 1
fi
# each instruction counted against the innermost source line of $source_name.cu that precedes it (ncu_lines.py's
# sass_lines over the whole file, then kept to FIRST..LAST)
python3 - "$here" "$out/$name.sass" "$source_name.cu" "$first" "$last" > "$out/$name.lines" <<'PY'
import collections, sys
sys.path.insert(0, sys.argv[1])
from ncu_lines import sass_lines
path, source, first, last = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
counts = collections.Counter(l for l in sass_lines(path, source, 0, 1 << 62).values()
                             if l is not None and first <= l <= last)
print(f"{sum(counts.values())} instructions on lines {first}..{last} of {source}")
for l, c in counts.most_common(40):
    print(f"{l:6d} {c:6d}")
PY
echo "$out/$name.sass ($(grep -c '/\*[0-9a-f]*\*/' "$out/$name.sass") instructions)"
cat "$out/$name.lines"

#!/usr/bin/env bash
# A/B of kernel variants in one process each, interleaved, on the GPU machine (what the twenty-ninth session did by
# hand four times). Here (builds; nvcc, no GPU):
#   bash benchmarks/kernels/ab.sh build NAME PATCH|REV [EXTRA_NVCC_FLAGS]   a variant: main's tree with PATCH applied
#                                              (or the tree of git revision REV) -> benchmarks/kernels/build/ab/NAME.gz
# On the device (carry benchmarks/kernels/build; main's harness is benchmarks/kernels/build/harness):
#   bash benchmarks/kernels/ab.sh run SWEEP [PASSES]       every variant in build/ab and main, interleaved, PASSES
#                                              (default 2) times; prints graph us a row (best of the passes) side by
#                                              side, and whether every row's check passed; raw output in $OUT/ab_raw,
#                                              written row by row (a run cut short still brings back its rows)
#   AB_MAIN=0: the variants only (a sweep whose rows main refuses); AB_TIMEOUT (s, default 300): one binary's pass;
#   AB_ONLY="NAME ...": these variants of build/ab only (default all)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
ab="$here/build/ab"
case "${1:-}" in
  build)
    name="$2" source="$3" flags="${4:-}"
    mkdir -p "$ab"
    tree="$(mktemp -d)/tree"
    if [ -f "$source" ]; then
      git -C "$root" worktree add -q --detach "$tree" HEAD
      git -C "$tree" apply "$(cd "$(dirname "$source")" && pwd)/$(basename "$source")"
    else
      git -C "$root" worktree add -q --detach "$tree" "$source"
    fi
    EXTRA_NVCC_FLAGS="$flags" BUILD_DIR="$tree/build" bash "$tree/benchmarks/kernels/build.sh"
    gzip -c "$tree/build/harness" > "$ab/$name.gz"
    git -C "$root" worktree remove --force "$tree"
    echo "variant $name -> $ab/$name.gz" ;;
  run)
    sweep="$2" passes="${3:-2}" out="${OUT:-.out}" work="$(mktemp -d)"
    raw="$out/ab_raw"
    mkdir -p "$raw"
    names=()
    if [ "${AB_MAIN:-1}" != 0 ]; then
      names=(main)
      cp "$here/build/harness" "$work/main"
    fi
    for gz in "$ab"/*.gz; do
      [ -e "$gz" ] || continue
      name="$(basename "$gz" .gz)"
      case " ${AB_ONLY:-$name} " in *" $name "*) ;; *) continue ;; esac
      gunzip -c "$gz" > "$work/$name" && chmod +x "$work/$name" && names+=("$name")
    done
    for pass in $(seq "$passes"); do
      # AB_TIMEOUT (s, default 300): a hung variant costs one pass of its sweep, not the call
      for name in "${names[@]}"; do
        timeout "${AB_TIMEOUT:-300}" "$work/$name" --sweep "$sweep" > "$raw/$name.$pass.txt" 2>&1 || true
      done
    done
    python3 - "$sweep" "$raw" "$passes" "${names[@]}" <<'PY'
import sys
sweep, work, passes, names = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
try:  # a row's label: its sweep line (every binary runs the same lines, so the index says which)
    lines = [l.split("#")[0].strip() for l in open(sweep)]
    lines = [l for l in lines if l]
except OSError:
    lines = []
table, order = {}, []
for name in names:
    for p in range(1, passes + 1):
        index = 0
        try:
            lines_of_pass = open(f"{work}/{name}.{p}.txt").readlines()
        except OSError:
            continue
        for line in lines_of_pass:
            if line.startswith("#") or line.startswith("family") or not line.strip():
                continue
            fields = line.split()
            ok = [i for i, f in enumerate(fields) if f in ("yes", "NO")]
            if not ok:
                continue
            i = ok[0]
            key = (index, lines[index] if index < len(lines) else " ".join(fields[:i]))
            index += 1
            if key not in table:
                table[key] = {}
                order.append(key)
            graph = float(fields[i + 2]) if float(fields[i + 2]) > 0 else float(fields[i + 1])
            best, good = table[key].get(name, (float("inf"), True))
            table[key][name] = (min(best, graph), good and fields[i] == "yes")
print("graph us (best of %d passes; ! = a failed check)" % passes)
print("%-72s" % "row" + "".join("%12s" % n for n in names))
for key in order:
    cells = ""
    for n in names:
        value = table[key].get(n)
        cells += "%12s" % ("-" if value is None else "%.2f%s" % (value[0], "" if value[1] else "!"))
    print("%-72s" % key[1][:72] + cells)
PY
    rm -rf "$work" ;;
  *) sed -n 2,10p "$0"; exit 2 ;;
esac

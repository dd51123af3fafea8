"""Where a kernel's time goes, instruction by instruction, from an ncu source page in CSV:

    ncu --section SourceCounters --page source --print-source sass --csv -k regex:NAME \
        --launch-skip 1 --launch-count 1 harness ROW graph=0 reps=1 > src.csv
    python3 benchmarks/kernels/ncu_source_top.py src.csv [TOP]

prints the TOP (default 25) SASS lines by warp stall samples (all samples), each with its share of the samples and
its executed instructions, and the totals: what the sixth-to-twelfth sessions did by hand with a spreadsheet.
gpu_session.sh's ncu stage runs it with NCU_SOURCE=1. A short kernel gets few samples a launch (the forty-second
session's 9 us W1A16 M = 1 kernel: 26): profile several launches (--launch-count N, reps=N) and the lines of every
launch's table are summed by address."""
import csv
import sys


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main(path, top=25):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header_at = next((i for i, r in enumerate(rows) if "Source" in r and any("Warp Stall Sampling" in c for c in r)),
                     None)
    if header_at is None:
        sys.exit(f"{path}: no source table (a header with Source and Warp Stall Sampling columns)")
    header = rows[header_at]

    def column(*words):
        return next((i for i, c in enumerate(header) if all(w in c for w in words)), None)

    source, samples = header.index("Source"), column("Warp Stall Sampling", "All")
    executed, address = column("Instructions Executed"), column("Address")
    if samples is None:
        samples = column("Warp Stall Sampling")
    # every launch's table (the header repeats before each): one line an address (or a source text), summed
    lines = {}
    for r in rows[header_at + 1:]:
        if len(r) != len(header) or r == header:
            continue
        key = r[address] if address is not None else r[source]
        line = lines.setdefault(key, [r[source].strip(), 0.0, 0.0])
        line[1] += number(r[samples])
        line[2] += number(r[executed]) if executed is not None else 0.0
    total = sum(line[1] for line in lines.values()) or 1.0
    total_executed = sum(line[2] for line in lines.values())
    print(f"{len(lines)} SASS lines, {total:.0f} stall samples, {total_executed:.0f} instructions executed")
    for key, (text, count, runs) in sorted(lines.items(), key=lambda item: -item[1][1])[:top]:
        where = key if address is not None else ""
        runs_text = f"{runs:>12.0f}" if executed is not None else ""
        print(f"{100 * count / total:6.2f}%  {runs_text}  {where:>6}  {text[:110]}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 25)

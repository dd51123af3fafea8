"""benchmarks/kernels/ncu_lines.py on a made-up kernel: an ncu source page of two launches joined to nvdisasm's line
info by instruction offset, samples summed over the launches, inlined helpers counted at their call site."""
import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def load_tool():
    spec = importlib.util.spec_from_file_location("ncu_lines", ROOT / "benchmarks" / "kernels" / "ncu_lines.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SASS = """//--------------------- .text.kernel --------------------------
\t//## File "/src/k.cu", line 10
        /*0000*/                   LDC R1, c[0x0][0x28] ;
\t//## File "/src/k.cu", line 5 inlined at "/src/k.cu", line 20
\t//## File "/src/k.cu", line 20
        /*0010*/                   POPC R2, R3 ;
\t//## File "/src/k.cu", line 30
        /*0020*/                   EXIT ;
"""

HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)",'
          '"Instructions Executed","stall_barrier","stall_long_sb","stall_barrier (Not Issued)"')


def launch(base, samples):
    rows = [HEADER]
    for i, (total, barrier, long_sb) in enumerate(samples):
        rows.append(f'"0x{base + 16 * i:x}","X","{total}","0","100","{barrier}","{long_sb}","0"')
    return rows


def test_phases_and_lines(tmp_path, capsys):
    sass = tmp_path / "k.sass"
    sass.write_text(SASS)
    page = tmp_path / "src.csv"
    # two launches at different load addresses: summed by offset
    lines = ['"Kernel Name","kernel"'] + launch(0x7000, [(4, 4, 0), (6, 0, 6), (0, 0, 0)])
    lines += ['"Kernel Name","kernel"'] + launch(0x9000, [(2, 2, 0), (8, 0, 8), (0, 0, 0)])
    page.write_text("\n".join(lines) + "\n")
    tool = load_tool()
    assert tool.main([str(page), str(sass), "k.cu", "10", "30", "setup:10-19,body:20-30"]) == 0
    out = capsys.readouterr().out
    # 20 samples: setup (line 10) 6 = 30%, all barrier; body (line 20, the inlined POPC counted there) 14 = 70%
    assert "2 launches, 20 samples, 3 instructions" in out
    body = next(l for l in out.splitlines() if l.split()[0] == "body")
    setup = next(l for l in out.splitlines() if l.split()[0] == "setup")
    assert "70.00%" in body and "long_sb 70.0" in body
    assert "30.00%" in setup and "barrier 30.0" in setup


def test_refuses_another_compilation(tmp_path, capsys):
    sass = tmp_path / "k.sass"
    sass.write_text(SASS)
    page = tmp_path / "src.csv"
    page.write_text("\n".join(['"Kernel Name","kernel"'] + launch(0x7000, [(1, 1, 0)])) + "\n")
    assert load_tool().main([str(page), str(sass), "k.cu", "10", "30"]) == 1
    assert "not the same compilation" in capsys.readouterr().out

"""Packaging and build: `import bitcompile` compiles nothing, an installed wheel works, stale
build locks are cleared, and the entry point is declared."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(code, env=None, cwd=None, timeout=900):
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=cwd,
                            timeout=timeout)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result.stdout


def test_import_compiles_nothing(tmp_path):
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(tmp_path / "extensions"))
    out = _run(
        "import time; t = time.perf_counter(); import bitcompile, bitcompile.nn, bitcompile.passes; "
        "print(time.perf_counter() - t)",
        env=env,
    )
    assert not (tmp_path / "extensions").exists() or not any((tmp_path / "extensions").iterdir())
    print(f"import bitcompile took {float(out):.2f} s")


def test_stale_build_lock_is_cleared(tmp_path, monkeypatch):
    from bitcompile import _build

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    name = "bitcompile_lock_probe"
    lock = _build._build_directory(name) / "lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text("")
    _build._clear_stale_lock(name)
    assert lock.exists(), "a fresh lock (a build in progress) must be left alone"
    old = time.time() - _build.STALE_LOCK_SECONDS - 60
    os.utime(lock, (old, old))
    _build._clear_stale_lock(name)
    assert not lock.exists(), "a lock older than STALE_LOCK_SECONDS is stale and must be removed"


def test_entry_point_declared():
    text = (REPO / "pyproject.toml").read_text()
    assert "[project.entry-points.torch_dynamo_backends]" in text
    assert 'bitcompile = "bitcompile.backend:bitcompile_backend"' in text


def _can_build_wheels():
    import importlib.util

    if importlib.util.find_spec("wheel") is not None:
        return True
    try:
        return importlib.util.find_spec("setuptools.command.bdist_wheel") is not None  # setuptools >= 70.1
    except ModuleNotFoundError:
        return False


@pytest.mark.slow
def test_installed_wheel_works(tmp_path):
    """Build a wheel, install it into an empty folder, and run an op from there (not from the checkout)."""
    if not _can_build_wheels():
        pytest.skip("pyproject's build requirements (setuptools>=64 with bdist_wheel, or wheel) are not installed, "
                    "and --no-build-isolation builds with what is")
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(REPO)],
        check=True, capture_output=True, timeout=600,
    )
    (wheel,) = wheels.glob("bitcompile-*.whl")
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        check=True, capture_output=True, timeout=600,
    )
    env = dict(os.environ, PYTHONPATH=str(site))
    code = (
        "import torch, bitcompile, bitcompile.passes\n"
        "from bitcompile import reference, _build\n"
        f"assert bitcompile.__file__.startswith({str(site)!r}), bitcompile.__file__\n"
        f"assert str(_build.source_dir()).startswith({str(site)!r}), _build.source_dir()\n"
        "x = torch.randn(5, 77); w = torch.randn(9, 77)\n"
        "packed = bitcompile.ops.pack_signs(w)\n"
        "assert torch.equal(packed, reference.pack_signs(w))\n"
        "y = bitcompile.ops.binary_linear(x, packed, 77)\n"
        "assert torch.equal(y, reference.binary_linear(x, packed, 77).float())\n"
        "print('wheel ok', bitcompile.__file__)\n"
    )
    out = _run(code, env=env, cwd=str(tmp_path))
    assert "wheel ok" in out


def _bitcompile_imports(path: Path) -> set:
    """The bitcompile modules a source file imports, at any depth (function-level imports too)."""
    import ast

    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("bitcompile"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("bitcompile"):
            found.update(f"{node.module}.{alias.name}" if node.module == "bitcompile" else node.module
                         for alias in node.names)
    return found


def test_op_catalogue_is_the_bottom_layer():
    """ops.py builds on _build only; quantize.py uses the catalogue, never the other way round."""
    assert _bitcompile_imports(REPO / "bitcompile" / "ops.py") <= {"bitcompile._build"}
    assert "bitcompile.weight_ops" not in _bitcompile_imports(REPO / "bitcompile" / "quantize.py")

"""The tests need nothing outside the checkout: a clone in an empty folder runs them.

A user's `git clone` has no `../shared` beside it (issue 12, finding 1: test_apot.py read its
conformance vectors from there). This clones the repository (its committed HEAD) into an empty
temporary folder and runs tests/test_apot.py there, with the clone first on sys.path, under an
audit hook that records every file opened: the run must pass and open nothing in the folder
around the original checkout (its parent, where ../shared was) except through the clone, the
Python installation and the kernel cache.
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Runs pytest in the clone and writes every path opened (audit event "open") to a file.
_RUNNER = r"""
import os, sys
opened = set()
def hook(event, args):
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        opened.add(os.path.abspath(os.fsdecode(args[0])))
sys.addaudithook(hook)
import pytest
code = pytest.main(["-q", "-p", "no:cacheprovider", "tests/test_apot.py"])
with open(sys.argv[1], "w") as f:
    f.write("\n".join(sorted(opened)))
import bitcompile
print("bitcompile imported from", bitcompile.__file__)
sys.exit(int(code))
"""


def _git(*args, cwd=None):
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def _inside(path: str, folder) -> bool:
    folder = os.path.realpath(folder)
    return os.path.realpath(path) == folder or os.path.realpath(path).startswith(folder + os.sep)


@pytest.mark.slow
def test_fresh_clone_runs_the_tests_with_nothing_outside_it(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    top = _git("rev-parse", "--show-toplevel", cwd=REPO)
    if top.returncode != 0 or Path(top.stdout.strip()).resolve() != REPO:
        pytest.skip(f"{REPO} is not the top of a git checkout")
    clone = tmp_path / "empty" / "bitcompile"
    clone.parent.mkdir()
    cloned = _git("clone", "--quiet", "--no-hardlinks", str(REPO), str(clone))
    assert cloned.returncode == 0, cloned.stderr

    opened_file = tmp_path / "opened.txt"
    env = {k: v for k, v in os.environ.items() if k not in ("BITCOMPILE_TESTDATA", "PYTHONPATH")}
    env["PYTHONPATH"] = str(clone)
    # A cache of its own: the clone's sources have other paths, and a rebuild into the shared cache
    # would replace libraries that this process (and later runs) load from there.
    env["TORCH_EXTENSIONS_DIR"] = str(tmp_path / "extensions")
    result = subprocess.run([sys.executable, "-c", _RUNNER, str(opened_file)], cwd=clone, env=env,
                            capture_output=True, text=True, timeout=900)
    summary = (result.stdout.strip().splitlines() or [""])[-2:]
    assert result.returncode == 0, f"pytest in a fresh clone failed:\n{result.stdout[-4000:]}\n{result.stderr[-2000:]}"
    assert f"imported from {clone}" in result.stdout, summary

    allowed = [clone, tmp_path, sys.prefix, sys.base_prefix, tempfile.gettempdir()]
    around = REPO.parent  # the original checkout and whatever sits beside it (../shared)
    outside = [p for p in opened_file.read_text().splitlines()
               if _inside(p, around) and not any(_inside(p, a) for a in allowed)]
    assert not outside, f"the clone's tests opened files outside the clone: {outside[:10]}"

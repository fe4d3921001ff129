"""The notebooks' archive (book/_ext/d2lattn_downloads.py) runs the README's test command alone.

The README says: unzip it, install the requirements, and check a chapter as CI does with
``python -m pytest book/ch3_masked_softmax.ipynb``. Here the archive is written from this
checkout (no site build), unpacked into an empty folder, and the command run there with the
packages already installed; the checkout's own d2lattn is kept out of the way, so the archive's
copy is what the chapter imports.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _downloads():
    ext = str(ROOT / "book" / "_ext")
    if ext not in sys.path:  # the extension imports its neighbour d2lattn_common
        sys.path.insert(0, ext)
    spec = importlib.util.spec_from_file_location(
        "d2lattn_downloads", ROOT / "book" / "_ext" / "d2lattn_downloads.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_test_command_runs_from_the_archive_alone(tmp_path):
    downloads = _downloads()
    chapters = sorted((ROOT / "book").glob("ch*.ipynb"))
    archive = downloads.write_archive(ROOT, tmp_path, chapters, "en")
    with zipfile.ZipFile(archive) as zf:
        zf.extractall(tmp_path / "unpacked")
    top = tmp_path / "unpacked" / downloads.ARCHIVE_ROOT
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "D2LATTN_RECORD_TIMES")}
    env["PYTHONPATH"] = str(top)  # the archive's d2lattn, not the checkout's editable install
    check = subprocess.run(
        [sys.executable, "-c", "import d2lattn; print(d2lattn.__file__)"], cwd=top, env=env,
        capture_output=True, text=True, timeout=120)
    assert Path(check.stdout.strip()).resolve().is_relative_to(top.resolve()), check
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "book/ch3_masked_softmax.ipynb", "-q"], cwd=top, env=env,
        capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert " passed" in run.stdout and " failed" not in run.stdout

"""A test run leaves the checkout alone: chapter times are recorded only when asked for."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class _Reporter:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def section(self, title: str) -> None:
        self.lines.append(title)

    def write_line(self, line: str) -> None:
        self.lines.append(line)


def _conftest(tmp_path: Path):
    spec = importlib.util.spec_from_file_location("d2lattn_conftest", ROOT / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.TIMES_CSV = tmp_path / "chapter_times.csv"  # never the tracked file
    module.__file__ = str(tmp_path / "conftest.py")
    module._seconds.update({"book/ch1_attention_cues.ipynb": 3.0})
    return module


def test_times_not_written_unless_asked(tmp_path, monkeypatch):
    monkeypatch.delenv("D2LATTN_RECORD_TIMES", raising=False)
    conftest = _conftest(tmp_path)
    reporter = _Reporter()
    conftest.pytest_terminal_summary(reporter)
    assert not conftest.TIMES_CSV.exists()
    assert any("not recorded" in line for line in reporter.lines)


def test_times_written_when_asked(tmp_path, monkeypatch):
    monkeypatch.setenv("D2LATTN_RECORD_TIMES", "1")
    monkeypatch.delenv("D2LATTN_LOAD", raising=False)
    conftest = _conftest(tmp_path)
    conftest.pytest_terminal_summary(_Reporter())
    text = conftest.TIMES_CSV.read_text()
    assert "ch1_attention_cues,3.0," in text

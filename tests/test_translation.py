"""The Chinese edition's catalogues are complete and current (locale/zh_CN/LC_MESSAGES).

The English pages are the source: ``tools/book.py`` extracts their messages with Sphinx's
gettext builder and compares them with the catalogues. A change to the English prose that the
translation has not followed fails here (``python tools/book.py update-po`` brings the change
into the catalogues, marked for translation).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("d2lattn_book_tool", ROOT / "tools" / "book.py")
book = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(book)


def test_markup_tokens():
    message = ("The {term}`queries <query>` of $\\mathbf Q$ are `queries`; see {cite:p}`vaswani2017`, "
               "{doc}`ch7_seq2seq_attention` and [nbval](https://github.com/x/nbval).")
    tokens = book.markup(message)
    assert tokens == {("term", ""): 1, ("math", "\\mathbf Q"): 1, ("code", "queries"): 1,
                      ("cite:p", "vaswani2017"): 1, ("doc", "ch7_seq2seq_attention"): 1,
                      ("link", "https://github.com/x/nbval"): 1}
    # a translation may name the Chinese glossary entry, and move or retitle roles ...
    assert book.markup(
        "见 {doc}`第 7 章 <ch7_seq2seq_attention>`、{cite:p}`vaswani2017` 与 "
        "[nbval](https://github.com/x/nbval)：$\\mathbf Q$ 的{term}`查询`是 `queries`。") == tokens
    # ... but not lose or change math, code, citations or links
    assert book.markup("$\\mathbf K$ 的{term}`查询`是 `queries`。") != tokens


def test_every_message_translated_none_fuzzy_none_stale():
    problems = book.check_po()
    assert problems == [], "\n".join(problems[:20])


def test_catalogue_statistics():
    stats = book.statistics()
    pages = {Path(p).stem for p in stats}
    toc = (ROOT / "_toc.yml").read_text(encoding="utf-8")
    files = {line.split("file:", 1)[1].strip().rsplit("/", 1)[-1]
             for line in toc.splitlines() if "file:" in line}
    files.add(toc.split("root:", 1)[1].split()[0].rsplit("/", 1)[-1])
    assert pages == files
    translated = sum(done for done, _, _ in stats.values())
    assert translated > 1000
    assert all(fuzzy == 0 and todo == 0 for _, fuzzy, todo in stats.values()), stats


@pytest.mark.parametrize("language", ["en", "zh"])
def test_generated_config(tmp_path, language):
    """The Chinese build's configuration is _config.yml with the language set, and its local
    extensions found from where the copy is written."""
    import yaml

    path = book._config(language=book.LANGUAGE if language == "zh" else None,
                        config_dir=tmp_path / "cfg")
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    original = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    for name, rel in config["sphinx"]["local_extensions"].items():
        assert (path.parent / rel / f"{name}.py").is_file()
    assert config["execute"] == original["execute"]
    assert config["sphinx"]["config"]["extensions"] == original["sphinx"]["config"]["extensions"]
    if language == "zh":
        assert config["sphinx"]["config"]["language"] == "zh_CN"
        assert config["title"] != original["title"]
    else:
        assert "language" not in config["sphinx"]["config"]
        assert config["title"] == original["title"]


def test_table_of_contents_captions_translated(tmp_path):
    toc = book._toc_zh(tmp_path)
    import yaml

    captions = [part["caption"] for part in yaml.safe_load(toc.read_text(encoding="utf-8"))["parts"]]
    assert captions and all(book.CJK.search(caption) for caption in captions)


# One voice (locale/README.md "Conventions"): check-po enforces the terminology and typography
# rules message by message; each bad example below must be caught, each good one pass.

@pytest.mark.parametrize("msgid, msgstr", [
    ("on a held-out batch", "在留出批次上"),                      # batch is 批量
    ("the cell above", "上面的代码单元"),                          # cell is 单元格
    ("the class token", "类别标记"),                               # the class token is a token
    ("a running max and a running sum", "一个运行最大值和一个运行和"),
    ("this is {term}`teacher forcing`", "这就是“{term}`教师强制`”"),  # no quotes around a term
    ('what should "it" attend to?', '"it" 应该关注什么？'),          # Chinese quotation marks
    ("Check numerically that the blocks match", "证明两个块相等"),  # a check is 验证
    ("see {doc}`ch7_seq2seq_attention`", "见 {doc}`ch7_seq2seq_attention`"),
    ("Solution to Exercise 1.1", "解答 练习 1.1"),
    ("Print to PDF", "列印成 PDF"),
    ("a “quote", "一个“引号"),
])
def test_style_rules_catch_violations(msgid, msgstr):
    assert book.style_problems(msgid, msgstr), (msgid, msgstr)


@pytest.mark.parametrize("msgid, msgstr", [
    ("on a held-out batch", "在留出批量上"),
    ("Show that the score depends on $n - m$", "证明分数只依赖于 $n - m$"),
    ("see {doc}`ch7_seq2seq_attention`", "见第 7 章（{doc}`ch7_seq2seq_attention`）"),
    ("see {doc}`chapter 4 <ch4_scoring_functions>`", "见 {doc}`第 4 章 <ch4_scoring_functions>`"),
    ('call `f("x")`', '调用 `f("x")`'),                             # code keeps its quotes
    ("class token", "class token"),                                 # a glossary name line
    ("with this run and five seeds", "使用本次运行和五个种子"),
    ('what should "it" attend to?', "“it”应该关注什么？"),
])
def test_style_rules_pass_good_translations(msgid, msgstr):
    assert book.style_problems(msgid, msgstr) == []


def test_page_rules():
    assert book.page_style_problems("book/ch1_attention_cues", [("cues", "线索")])
    assert book.page_style_problems(
        "book/ch1_attention_cues", [("cues", "即“自主性提示”和“非自主性提示”")]) == []
    first_use = [("Patches", "补丁"), ("{term}`patches <patch>`", "{term}`补丁 <patch>`")]
    assert book.page_style_problems("book/ch10_vision_transformer", first_use)
    first_use[1] = ("{term}`patches <patch>`", "{term}`补丁 <patch>`（patch，即图像块）")
    assert book.page_style_problems("book/ch10_vision_transformer", first_use) == []

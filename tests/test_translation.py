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


def test_words_inside_text_in_math_may_be_translated_symbols_may_not():
    """Issue 38's leftover: ``\\text{...}`` holds words; the symbols around it are compared."""
    msgid = "The cache holds $2 \\times 4 \\text{ layers} \\times 128 \\times 4 \\text{ bytes}$."
    # the words inside \text translated: the markup is kept (this failed before the masking)
    assert book.markup(msgid) == book.markup(
        "缓存保存 $2 \\times 4 \\text{ 层} \\times 128 \\times 4 \\text{ 字节}$。")
    # a symbol outside \text changed, a \text dropped, or \text turned into \mathrm: still caught
    for wrong in ("$2 \\times 8 \\text{ 层} \\times 128 \\times 4 \\text{ 字节}$",
                  "$2 \\times 4 \\text{ 层} \\times 128 \\times 4$",
                  "$2 \\times 4 \\mathrm{ 层} \\times 128 \\times 4 \\text{ 字节}$"):
        assert book.markup(wrong) != book.markup(msgid), wrong
    # \mathrm and \operatorname name symbols: their arguments are compared
    assert book.markup("$\\mathrm{pos}$") != book.markup("$\\mathrm{位置}$")
    assert book.markup("$\\operatorname{softmax}$") != book.markup("$\\operatorname{软}$")
    # nested and escaped braces stay inside the masked argument
    assert book.mask_prose_in_math("a \\text{b {c} \\} d} e") == "a \\text{…} e"
    # display math: the block is compared whole, words in \text aside
    block = "\n m_{ij} = \\begin{cases} 1 & j < \\ell_i \\\\ 0 & \\text{otherwise,} \\end{cases}\n"
    assert book.is_display_math(block) and not book.is_display_math("A paragraph $x$.")
    assert not book.display_math_changed(block, block.replace("otherwise,", "其他情况，"))
    assert book.display_math_changed(block, block.replace("j < \\ell_i", "j \\le \\ell_i"))
    assert book.display_math_changed(block, block.replace("\\text{otherwise,}", "otherwise,"))
    assert not book.display_math_changed("A paragraph $x$.", "一段 $y$。")  # inline: markup()


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
    # the terms of chapters 12-15 that once differed from the rest of the book (issue 38)
    ("The KV cache: the same logits", "KV 缓存：相同的 logits"),     # 键值缓存
    ("no attention sink formed", "没有形成注意力汇"),               # 注意力汇点
    ("What we learned", "本章小结"),                               # 小结
    ("What we learned", "我们学到了什么"),
    ("a decoder-only Transformer", "一个只有解码器的 Transformer"),  # 仅解码器
    ("This weight tying saves parameters", "这种权重共享省下参数"),  # 权重绑定
    ("The plain additive state has none", "朴素的加法状态没有"),      # 加性
    ("score, normalise, pool", "评分 → 规范化 → 汇聚"),              # 归一化
    ("the cell below retrains", "下面的单元现场重新训练"),             # 单元格
    ("in the notebook it shows a table", "在笔记本中它显示表格"),      # notebook
    ("the quadratic form", "二次形式"),                             # reads as 二次型
    ("62 times fewer multiply-adds", "少 62 倍的乘加"),             # ambiguous
    ("10 times smaller", "小 10 倍"),                               # as ambiguous (issue 54)
    ("3 times larger", "大 3 倍"),
    ("the issue tracker", "议题追踪器"),
    # English left inside \text{} of a formula (ch16's display formula, issue 54)
    ("\nf(PX) = P f(X) \\quad \\text{(permutation-equivariant)}\n",
     "\nf(PX) = P f(X) \\quad \\text{(permutation-equivariant)}\n"),
    ("$y = 1 \\text{ if } x > 0$", "$y = 1 \\text{ if } x > 0$ 时"),
    # "k of n seeds": one house style, N 个种子中的 k 个 (issue 54)
    ("on 9 of 10 seeds", "十个种子中的 9 个"),
    ("on 10 of 10 seeds", "10 个种子中 10 个如此"),
    ("on 7 of 10 seeds", "10 个种子中有 7 个"),
    ("on 7 of 10 seeds", "7/10 个种子"),
    ("on two of five fresh seeds", "五个新种子中的两个"),
    ("on 9 of 10 seeds", "10 个种子中的九个"),
    # CPU time and what the book ships (issue 54)
    ("three to seven CPU-minutes", "三到七个 CPU 分钟"),
    ("a fifth of its CPU time", "CPU时间只有它的五分之一"),
    ("the shipped model", "随书模型"),
    ("the checkpoint the chapter ships", "本章发布的检查点"),
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
    ("The KV cache: the same logits", "键值缓存：相同的 logits"),
    ("no attention sink formed", "没有形成注意力汇点"),
    ("attention pooling", "注意力汇聚"),
    ("it gathers the image's information through attention", "它通过注意力汇集信息"),
    ("What we learned", "小结"),
    ("This weight tying saves parameters", "这种权重绑定省下参数"),
    ("The plain additive state has none", "朴素的加性状态没有"),
    ("the cell below retrains; unit tests; hidden units", "下面的单元格；单元测试；隐藏单元"),
    ("a desk with papers, a notebook and a laptop", "纸张、笔记本和笔记本电脑"),
    ("62 times fewer multiply-adds", "乘加次数只有原来的 1/62"),
    ("10 times smaller", "只有原来的 1/10"),
    ("\nf(PX) = P f(X) \\quad \\text{(permutation-equivariant)}\n",
     "\nf(PX) = P f(X) \\quad \\text{（置换等变）}\n"),
    ("$d_\\text{model}$ and $\\text{max\\_len}$", "$d_\\text{model}$ 与 $\\text{max\\_len}$"),
    ("on 9 of 10 seeds", "在 10 个种子中的 9 个上"),
    ("on every one of the ten seeds", "在 10 个种子中的每一个上"),
    ("with five seeds", "用五个种子"),
    ("three to seven CPU-minutes", "三到七分钟 CPU 时间"),
    ("the shipped model", "随书提供的模型"),
    ("the digits that ship with scikit-learn", "scikit-learn 自带的手写数字"),
])
def test_style_rules_pass_good_translations(msgid, msgstr):
    assert book.style_problems(msgid, msgstr) == []


def test_build_strings_follow_chinese_typography():
    """The Chinese the build writes itself (plot descriptions, figure fallback tables) passes
    check-po's rules, and the rules catch what the review found there (issue 54)."""
    assert book.check_build_strings() == []
    bad = "图, 标题: 损失, 由上面的代码单元绘制."
    found = book.chinese_typography_problems(bad)
    assert any("half-width" in p for p in found) and any("代码单元" in p for p in found)
    assert book.chinese_typography_problems("邻居 (0.500)")
    assert book.chinese_typography_problems("邻居（0.500）") == []
    assert book.chinese_typography_problems("loss (0.500), step: 3.") == []


def test_page_rules():
    assert book.page_style_problems("book/ch1_attention_cues", [("cues", "线索")])
    assert book.page_style_problems(
        "book/ch1_attention_cues", [("cues", "即“自主性提示”和“非自主性提示”")]) == []
    first_use = [("Patches", "补丁"), ("{term}`patches <patch>`", "{term}`补丁 <patch>`")]
    assert book.page_style_problems("book/ch10_vision_transformer", first_use)
    first_use[1] = ("{term}`patches <patch>`", "{term}`补丁 <patch>`（patch，即图像块）")
    assert book.page_style_problems("book/ch10_vision_transformer", first_use) == []


# Beyond the prose: interactive figures, notebooks and diagrams in Chinese -------------------

_translate_spec = importlib.util.spec_from_file_location(
    "d2lattn_translate", ROOT / "book" / "_ext" / "d2lattn_translate.py")
translate = importlib.util.module_from_spec(_translate_spec)
_translate_spec.loader.exec_module(translate)
CHAPTERS = sorted((ROOT / "book").glob("ch*.ipynb"))
MESSAGES = ROOT / "locale" / "zh_CN" / "LC_MESSAGES"


def test_interactive_figure_strings_all_translated():
    """Every figure's title, hint, control label, panel title, readout and line name has a
    Chinese entry in interactive.po, and the entries keep the English's numbers and symbols."""
    assert book.check_viz_po() == []
    found = translate.notebook_viz_strings(CHAPTERS)
    assert sum(len(req) for req, _ in found.values()) >= 60 and len(found) >= 6


def test_translated_figure_keeps_its_numbers():
    import json

    table = translate.load_catalogue(MESSAGES / "interactive.po")
    figures = 0
    for path in CHAPTERS:
        notebook = json.loads(path.read_text(encoding="utf-8"))
        for text in translate._html_outputs(notebook):
            for spec in translate.viz_specs(text):
                zh = next(translate.viz_specs(translate.translate_viz_html(text, table)))
                figures += 1
                assert book.CJK.search(zh["title"]) and book.CJK.search(zh["caption"])
                assert all(book.CJK.search(c["label"]) for c in zh["controls"])
                assert zh["frames"].keys() == spec["frames"].keys()
                types = {panel["name"]: panel["type"] for panel in spec["panels"]}
                for key, frame in spec["frames"].items():  # same numbers, names translated
                    for name, values in frame.items():
                        other = zh["frames"][key][name]
                        if types[name] in ("readout", "lines"):  # {name: numbers}
                            assert other == {table.get(k, k): v for k, v in values.items()}
                        else:
                            assert other == values
                # the static fallback (what JupyterLab shows) is translated too
                assert spec["title"] not in translate.translate_viz_html(text, table)
                assert translate.translate_viz_html(text, {}) == text  # English untouched
    assert figures >= 7


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chinese_notebook(path):
    """The Chinese notebook: every Markdown paragraph from the catalogue (none left in
    English), every catalogue message used, code and outputs identical, valid nbformat."""
    import json

    import nbformat

    notebook = json.loads(path.read_text(encoding="utf-8"))
    table = translate.load_catalogue(MESSAGES / "book" / f"{path.stem}.po")
    viz = translate.load_catalogue(MESSAGES / "interactive.po")
    missed = []
    zh = translate.translate_notebook(notebook, table, viz, missed=missed)
    assert missed == []
    markdown = "".join("".join(c["source"]) for c in zh["cells"] if c["cell_type"] == "markdown")
    unused = [m for m, s in table.items() if s not in markdown]
    assert unused == [], unused[:3]
    assert len(zh["cells"]) == len(notebook["cells"])
    for a, b in zip(notebook["cells"], zh["cells"]):
        assert a["cell_type"] == b["cell_type"]
        if a["cell_type"] == "code":
            assert a["source"] == b["source"]
            html_a = [o for o in a.get("outputs", []) if "d2lattn-viz" not in json.dumps(o)]
            html_b = [o for o in b.get("outputs", []) if "d2lattn-viz" not in json.dumps(o)]
            assert html_a == html_b
    nbformat.validate(nbformat.from_dict(zh))


def test_markdown_translation_keeps_structure():
    table = {"A heading": "标题", "First item": "第一项", "second item, continued": "第二项",
             "A paragraph that runs over two lines.": "一个段落。", "Solution": "解答",
             "Cell": "单元格"}
    source = ("# A heading\n\nA paragraph that runs\nover two lines.\n\n- First item\n"
              "- second item,\n  continued\n\n```python\nx = 1  # A heading\n```\n\n"
              ":::{dropdown} Solution\nA paragraph that runs over two lines.\n:::\n\n| Cell |\n|---|\n")
    assert translate.translate_markdown(source, table) == (
        "# 标题\n\n一个段落。\n\n- 第一项\n- 第二项\n\n```python\nx = 1  # A heading\n```\n\n"
        ":::{dropdown} 解答\n一个段落。\n:::\n\n| 单元格 |\n|---|\n")


def test_every_diagram_has_a_chinese_version():
    """make_diagrams.py writes NAME.zh_CN.svg beside each NAME.svg; the Chinese build shows it
    (Sphinx's figure_language_filename, "{root}.{language}{ext}")."""
    figures = ROOT / "book" / "figures"
    english = sorted(p for p in figures.glob("*.svg") if ".zh_CN." not in p.name)
    assert english
    for path in english:
        zh = path.with_name(path.stem + ".zh_CN.svg")
        assert zh.is_file(), f"{zh.name} missing: run python book/figures/make_diagrams.py"
        assert zh.read_bytes() != path.read_bytes()
    source = (figures / "make_diagrams.py").read_text(encoding="utf-8")
    assert "ZH_CN = {" in source


def test_translated_nodes_forget_their_message_documents():
    """Sphinx parses each translated message as a little document of its own; a node moved
    into the page kept a pointer to it, and the pickled Chinese doctrees carried every one of
    them (ch12's 985 kB instead of 230 kB; reading them back was most of the Chinese build's
    writing time). The transform drops the pointer; the node still finds the page's document
    through its parents."""
    import sys
    from types import SimpleNamespace

    from docutils import nodes
    from docutils.frontend import get_default_settings
    from docutils.parsers.rst import Parser
    from docutils.utils import new_document

    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    import d2lattn_i18n

    page = new_document("page", get_default_settings(Parser))
    message = new_document("message", get_default_settings(Parser))
    paragraph = nodes.paragraph("", "译文")
    paragraph.document = message  # as Sphinx's publish_msgstr leaves it
    section = nodes.section()
    section += paragraph
    page += section
    assert paragraph.document is message
    d2lattn_i18n.DropMessageDocuments.apply(SimpleNamespace(document=page))
    assert paragraph.document is page and getattr(paragraph, "_document", None) is None


def test_downloaded_notebook_translates_the_words_of_display_formulas():
    """A display formula's message is the text between its ``$$`` (check-po lets the words in
    ``\\text{}`` be translated); the Chinese notebook carries the translated formula, label kept."""
    table = {"\nx \\text{ bytes}\n": "\nx \\text{ 字节}\n"}
    source = "$$\nx \\text{ bytes}\n$$ (eq-b)\n\n$$\ny \\text{ kept}\n$$"
    assert translate.translate_markdown(source, table) == (
        "$$\nx \\text{ 字节}\n$$ (eq-b)\n\n$$\ny \\text{ kept}\n$$")

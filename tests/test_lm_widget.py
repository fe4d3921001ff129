"""Chapter 12's GPT in the page (book/assets/static/d2lattn-lm.js, book/_ext/d2lattn_lm.py).

- The weights the build exports are the checkpoint's float16 values, the vocabulary is the one
  chapter 12 builds, and the export fails on a checkpoint the script cannot run.
- In headless Chromium, ``d2lattnLM.nextLogits(corpus, text)`` equals PyTorch's
  ``GPT(tokens)[0, -1]`` from the same float16 weights (max abs difference <= 1e-3) for prompts
  of both corpora, from one character to the full context; its sampling distribution equals
  ``d2lattn.gpt.next_token_probs``; the page fetches the weights only when asked, and no request
  leaves the machine. These run on a stub page served from a temporary folder (no site build).
- On the built site, chapter 12's page in both languages: a prompt typed and Generate pressed
  gives text of the model's vocabulary, the widget speaks the page's language and the page's
  ``nextLogits`` equals PyTorch. Skipped while chapter 12 has no ``{d2lattn-lm}`` directive.

Chromium and playwright as in tests/test_site.py (Debian's chromium, no browser download).
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import importlib.util
import re
import shutil
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

import pytest
import torch

from d2lattn.gpt import GPT, GPTConfig, next_token_probs
from d2lattn.text import CharTokenizer, load_split

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "book" / "data"
STATIC = ROOT / "book" / "assets" / "static"
SCRIPT = STATIC / "d2lattn-lm.js"
TOLERANCE = 1e-3  # the bound on |logits_js - logits_torch|


def _extension():
    spec = importlib.util.spec_from_file_location("d2lattn_lm", ROOT / "book" / "_ext" / "d2lattn_lm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.lru_cache(maxsize=None)
def _torch_model(corpus: str):
    """The chapter's way: the float16 checkpoint's values in a float32 GPT, and its tokenizer."""
    ckpt = torch.load(DATA / f"ch12_gpt_{corpus}.pt", weights_only=True)
    model = GPT(GPTConfig(**ckpt["config"]))
    model.load_state_dict({k: v.float() for k, v in ckpt["state_dict"].items()})
    return model.eval(), CharTokenizer(load_split(corpus).text)


def _torch_logits(corpus: str, text: str) -> torch.Tensor:
    model, tok = _torch_model(corpus)
    with torch.no_grad():
        return model(tok.encode(text)[None])[0, -1]  # (V,)


def _prompts(corpus: str):
    """From one character to the whole context, taken from the held-out text."""
    model, _ = _torch_model(corpus)
    held = load_split(corpus).held_out
    T = model.config.block_size
    if corpus == "shakespeare":
        return ["\n", "ROMEO:\nI will not s", "First Citizen:\nWe are a", held[1000:1000 + T]]
    return ["\n", "\n" + held[:5], held[100:100 + T // 2], held[300:300 + T]]


# --- without a browser ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A stub site: index.html with one widget, the script, and the weights exported now."""
    site = tmp_path_factory.mktemp("lm-site")
    static = site / "_static"
    static.mkdir()
    shutil.copy(SCRIPT, static / SCRIPT.name)
    shutil.copy(STATIC / "d2lattn-lm.css", static / "d2lattn-lm.css")
    info = _extension().export_all(static / "d2lattn-lm")
    page = ('<!DOCTYPE html><html lang="{lang}"><head><meta charset="utf-8"><link rel="icon" href="data:,">'
            '<link rel="stylesheet" href="_static/d2lattn-lm.css">'
            '<script defer src="_static/d2lattn-lm.js"></script></head>'
            '<body><div class="d2lattn-lm" data-corpus="shakespeare"></div></body></html>')
    (site / "index.html").write_text(page.format(lang="en"), encoding="utf-8")
    (site / "zh.html").write_text(page.format(lang="zh-CN"), encoding="utf-8")
    return SimpleNamespace(site=site, info=info)


def test_export_is_the_checkpoint(exported):
    import numpy as np

    for corpus, info in exported.info.items():
        model, tok = _torch_model(corpus)
        assert info["vocab"] == tok.itos
        assert info["config"]["vocab_size"] == len(tok.itos)
        name, manifest, blob = _extension().read_export(
            exported.site / "_static" / "d2lattn-lm" / f"{corpus}.js")
        assert name == corpus and manifest["tensors"] == info["tensors"]
        assert len(blob) == manifest["weights_bytes"] == info["bin_bytes"]
        values = np.frombuffer(blob, dtype="<f2")
        state = torch.load(DATA / f"ch12_gpt_{corpus}.pt", weights_only=True)["state_dict"]
        names = [t["name"] for t in info["tensors"]]
        assert "head.weight" not in names  # tied: the embedding is stored once
        assert set(names) == set(state) - {"head.weight"}
        for t in info["tensors"]:
            n = int(np.prod(t["shape"]))
            got = values[t["offset"]:t["offset"] + n].reshape(t["shape"])
            assert np.array_equal(got, state[t["name"]].numpy()), t["name"]
        assert info["layer_norm_eps"] == [1e-5, 1e-5, 1e-5]
        # about the checkpoint's size (1.6 and 3.2 MB)
        assert info["bin_bytes"] <= (DATA / f"ch12_gpt_{corpus}.pt").stat().st_size


def test_export_refuses_what_the_script_cannot_run(tmp_path):
    ext = _extension()
    ckpt = torch.load(DATA / "ch12_gpt_shakespeare.pt", weights_only=True)
    ckpt["config"] = {**ckpt["config"], "causal": False}
    torch.save(ckpt, tmp_path / "ch12_gpt_shakespeare.pt")
    with pytest.raises(ValueError, match="causal"):
        ext.export_model("shakespeare", tmp_path / "out", data_dir=tmp_path)
    with pytest.raises(ValueError, match="corpus"):
        ext.export_model("wikipedia", tmp_path / "out")


def test_chinese_strings_have_glyphs_in_the_shipped_font():
    """The widget's Chinese strings (in the script, not in any page) are drawn with the site's
    subset font, like the rest of the Chinese site."""
    from book_helpers import book_tool
    from fontTools.ttLib import TTFont

    text = SCRIPT.read_text(encoding="utf-8")
    zh = text[text.index("    zh: {"):text.index("var DEFAULTS")]
    chars = set(re.findall(r"[\u2e80-\u9fff\uf900-\ufaff\ufe30-\ufe4f\uff00-\uffef]", zh))
    assert len(chars) > 50
    cmap = TTFont(str(book_tool().FONT_FILE)).getBestCmap()
    assert sorted(c for c in chars if ord(c) not in cmap) == []


def test_the_tang_vocabulary_has_glyphs_in_a_shipped_font():
    """Every CJK character the Tang model can write is in the Tang cut (87% are in no page's
    text, so the site's own cut lacks them), and every font stack of the widget names that cut
    last, after the page's monospace stack (no bare `monospace`, which drew Chinese with
    whatever the reader's system had)."""
    from book_helpers import book_tool
    from fontTools.ttLib import TTFont

    tool = book_tool()
    _, tok = _torch_model("tang")
    cjk = {c for c in tok.itos if tool.CJK.fullmatch(c)}
    assert len(cjk) > 6000
    cmap = TTFont(str(tool.FONT_TANG_FILE)).getBestCmap()
    assert sorted(c for c in cjk if ord(c) not in cmap) == []
    css = (STATIC / "d2lattn-lm.css").read_text(encoding="utf-8")
    assert f'url("fonts/{tool.FONT_TANG_FILE.name}")' in css
    stacks = re.findall(r"font-family:\s*([^;]+);", css)
    assert stacks and all(f in ('"D2lattn CJK Tang"', "var(--d2lattn-lm-mono)") for f in stacks), stacks
    assert '--d2lattn-lm-mono: var(--pst-font-family-monospace), "D2lattn CJK Tang"' in css


def test_simplified_characters_map_to_the_tang_vocabulary():
    """OpenCC's table maps a simplified character the Tang model lacks to its traditional form
    in the vocabulary, and nothing else."""
    _, tok = _torch_model("tang")
    table = _extension().from_simplified(tok.itos)
    known = set(tok.itos)
    assert table["觉"] == "覺" and table["处"] == "處" and table["闻"] == "聞"
    assert all(s not in known and t in known for s, t in table.items())
    assert len(table) > 1000
    assert _extension().from_simplified(_torch_model("shakespeare")[1].itos) == {}


# --- in the browser ---------------------------------------------------------------------------

def _serve(directory: Path):
    from test_site import LOCAL_HOST, _QuietHandler

    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer((LOCAL_HOST, 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, thread, f"http://{LOCAL_HOST}:{server.server_address[1]}/"


@pytest.fixture(scope="module")
def chromium(tmp_path_factory) -> Iterator[SimpleNamespace]:
    from test_site import CHROMIUM_ARGS, DESKTOP, _chromium, _missing

    executable = _chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("the `playwright` Python package is not installed")
    profile = tmp_path_factory.mktemp("chromium-profile-lm")
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile), executable_path=_chromium(), headless=True, args=CHROMIUM_ARGS,
            viewport=DESKTOP, service_workers="block", accept_downloads=False)
        try:
            yield SimpleNamespace(context=context, executable=executable)
        finally:
            context.close()


def _recorder(context, base_url: str):
    from test_site import Recorder

    recorder = Recorder(base_url)
    recorder.attach(context)
    return recorder


@contextlib.contextmanager
def _served_page(directory: Path, context) -> Iterator[SimpleNamespace]:
    """A new page of ``context`` with ``directory`` served at a local address (``base``) and
    a recorder of what the browser does from now on; afterwards the page closes and the server
    stops."""
    server, thread, base = _serve(directory)
    recorder = _recorder(context, base)
    page = context.new_page()
    try:
        yield SimpleNamespace(page=page, base=base, recorder=recorder)
    finally:
        page.close()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _wait_until_ready(page) -> None:
    page.wait_for_function("document.querySelector('.d2lattn-lm').dataset.ready === '1'")


def _assert_nothing_fetched_yet(recorder) -> None:
    assert not [u for u in recorder.requests if "/d2lattn-lm/" in u], \
        "the weights were fetched before anyone asked"


def _assert_local_and_clean(recorder) -> None:
    """No request left the machine, nothing failed to load, nothing was logged as an error."""
    assert recorder.foreign_hosts() == set()
    assert recorder.failures == [] and recorder.console_errors == []


NEXT_LOGITS = """async ([corpus, texts]) => {
  const out = [];
  for (const text of texts) out.push(Array.from(await d2lattnLM.nextLogits(corpus, text)));
  return out;
}"""

REJECTS = """async ([corpus, text]) => {
  try { await d2lattnLM.nextLogits(corpus, text); return 'resolved'; }
  catch (e) { return e.name + ': ' + e.message; }
}"""


def _largest_difference(page, corpus: str, prompts) -> float:
    got = page.evaluate(NEXT_LOGITS, [corpus, prompts])
    worst = 0.0
    for text, js in zip(prompts, got):
        ref = _torch_logits(corpus, text)
        assert len(js) == ref.numel(), (corpus, text)
        worst = max(worst, float((torch.tensor(js, dtype=torch.float64) - ref.double()).abs().max()))
    return worst


def test_js_forward_equals_pytorch(exported, chromium):
    with _served_page(exported.site, chromium.context) as served:
        page, recorder = served.page, served.recorder
        page.goto(served.base + "index.html", wait_until="load")
        _wait_until_ready(page)
        page.wait_for_timeout(300)
        _assert_nothing_fetched_yet(recorder)
        worst = {c: _largest_difference(page, c, _prompts(c)) for c in ("shakespeare", "tang")}
        print("largest |JS - PyTorch| logit difference:", worst)
        assert max(worst.values()) <= TOLERANCE, worst
        # bad input is refused, with the reason
        assert page.evaluate(REJECTS, ["tang", "ROMEO"]).startswith("RangeError: characters")
        assert page.evaluate(REJECTS, ["shakespeare", ""]).startswith("RangeError")
        assert page.evaluate(REJECTS, ["shakespeare", "a" * 129]).startswith(
            "RangeError: text of 129")
        assert page.evaluate(REJECTS, ["latin", "a"]).startswith("RangeError: corpus")
        fetched = {u.rsplit("/", 1)[1] for u in recorder.requests if "/d2lattn-lm/" in u}
        assert fetched == {"shakespeare.js", "tang.js"}
        _assert_local_and_clean(recorder)


def test_sampling_distribution_equals_next_token_probs(exported, chromium):
    with _served_page(exported.site, chromium.context) as served:
        page = served.page
        page.goto(served.base + "index.html", wait_until="load")
        page.wait_for_function("window.d2lattnLM !== undefined")
        logits = _torch_logits("shakespeare", "ROMEO:\nI will not s")
        for kw in ({"temperature": 1.0}, {"temperature": 0.5, "top_k": 5},
                   {"temperature": 1.5, "top_p": 0.9}, {"temperature": 0.8, "top_k": 20, "top_p": 0.6},
                   {"temperature": 2.0, "top_k": 1}):
            want = next_token_probs(logits, **kw)
            got = page.evaluate("([z, t, k, p]) => Array.from(d2lattnLM.nextTokenProbs(z, t, k, p))",
                                [logits.tolist(), kw["temperature"], kw.get("top_k"), kw.get("top_p")])
            got = torch.tensor(got, dtype=torch.float64)
            assert torch.equal(got > 0, want > 0), kw  # the same characters kept
            assert torch.allclose(got, want.double(), atol=1e-6), kw


def test_temperature_zero_is_greedy_and_top_p_zero_an_error_in_both(exported, chromium):
    """Temperature 0 puts all the mass on the argmax (ties: the lower index) in Python and in
    the page alike; top-p 0 is refused by both, never read as 'off'."""
    logits = _torch_logits("shakespeare", "ROMEO:\nI will not s")
    tied = torch.tensor([0.5, 2.0, -1.0, 2.0])
    for z in (logits, tied):
        for kw in ({"temperature": 0}, {"temperature": 0, "top_k": 3},
                   {"temperature": 0, "top_p": 0.5}):
            want = next_token_probs(z, **kw)
            assert want.sum() == 1 and want[z.argmax()] == 1, kw
    assert next_token_probs(tied, temperature=0).tolist() == [0, 1, 0, 0]
    with pytest.raises(ValueError, match="top_p"):
        next_token_probs(logits, temperature=1.0, top_p=0)
    with pytest.raises(ValueError, match="temperature"):
        next_token_probs(logits, temperature=-0.5)
    with _served_page(exported.site, chromium.context) as served:
        page = served.page
        page.goto(served.base + "index.html", wait_until="load")
        page.wait_for_function("window.d2lattnLM !== undefined")
        for z in (logits, tied):
            for kw in ({"temperature": 0}, {"temperature": 0, "top_k": 3},
                       {"temperature": 0, "top_p": 0.5}):
                got = page.evaluate(
                    "([z, t, k, p]) => Array.from(d2lattnLM.nextTokenProbs(z, t, k, p))",
                    [z.tolist(), 0, kw.get("top_k"), kw.get("top_p")])
                assert got == next_token_probs(z, **kw).tolist(), kw
        throws = "([z, t, p]) => { try { d2lattnLM.nextTokenProbs(z, t, null, p); return 'no'; } " \
                 "catch (e) { return e.message; } }"
        assert "top_p" in page.evaluate(throws, [logits.tolist(), 1.0, 0])
        assert "temperature" in page.evaluate(throws, [logits.tolist(), -0.5, None])
        # the widget: temperature 0 writes what GPT.generate(temperature=0) writes; a top-p of 0
        # is reported beside the controls, not switched off
        model, tok = _torch_model("shakespeare")
        root = page.locator(".d2lattn-lm").first
        root.locator("input.d2lattn-lm-temperature").fill("0")
        got = _type_and_generate(page, "ROMEO:\n", 60)
        want = model.generate(tok.encode("ROMEO:\n")[None], 60, temperature=0)[0, 7:]
        assert got["text"] == tok.decode(want), (got["text"], tok.decode(want))
        assert got["bars"] == [1.0]
        root.locator("input.d2lattn-lm-topp").fill("0")
        message = root.locator(".d2lattn-lm-error").text_content()
        assert "Top-p" in message, message
        assert root.locator("tr.d2lattn-lm-prob").count() == 0


def test_writing_past_the_context_costs_the_same_per_character(exported, chromium):
    """Past block_size the widget's cache rolls: each character is one more position, so 400
    characters take about 4x the time of 100 (at most 6x), not 100x; the page says what the
    model reads from then on."""
    import time

    with _served_page(exported.site, chromium.context) as served:
        page = served.page
        page.goto(served.base + "index.html", wait_until="load")
        _wait_until_ready(page)
        root = page.locator(".d2lattn-lm").first
        root.locator("input.d2lattn-lm-temperature").fill("0")
        _type_and_generate(page, "ROMEO:\n", 5)  # loads the model
        times = {100: [], 400: []}
        for _ in range(3):  # interleaved repeats; the minimum is what load cannot inflate
            for n in (100, 400):
                start = time.perf_counter()
                got = _type_and_generate(page, "ROMEO:\n", n)
                times[n].append(time.perf_counter() - start)
                assert len(got["text"]) == n
        ratio = min(times[400]) / min(times[100])
        print(f"400 characters / 100 characters: {ratio:.1f}x the time")
        assert ratio <= 6, times
        assert "rolling cache" in root.locator(".d2lattn-lm-note").text_content()
        # the work per character is flat: past the context, one position reads block_size keys
        dots = int(root.locator(".d2lattn-lm-output").get_attribute("data-dots"))
        model, _ = _torch_model("shakespeare")
        c = model.config
        T, n_pos = c.block_size, 7 + 400
        per_key = c.num_heads * c.num_layers
        assert dots == per_key * (T * (T + 1) // 2 + (n_pos - T) * T)


def _type_and_generate(page, prompt: str, n: int, timeout: int = 60000) -> dict:
    root = page.locator(".d2lattn-lm").first
    root.locator("textarea").fill(prompt)
    root.locator("input.d2lattn-lm-length").fill(str(n))
    root.locator("button.d2lattn-lm-generate").focus()
    page.keyboard.press("Enter")  # the keyboard works
    page.wait_for_function(
        "document.querySelector('.d2lattn-lm-output').dataset.done === '1'", timeout=timeout)
    return page.evaluate("""() => {
      const root = document.querySelector('.d2lattn-lm');
      return {text: root.querySelector('.d2lattn-lm-output-new').textContent,
              status: root.querySelector('.d2lattn-lm-status').textContent,
              title: root.querySelector('.d2lattn-lm-title').textContent,
              bars: [...root.querySelectorAll('tr.d2lattn-lm-prob')].map(r => Number(r.dataset.value)),
              att: [...root.querySelectorAll('.d2lattn-lm-att')].map(s => Number(s.dataset.value)),
              unlabelled: [...root.querySelectorAll('input, select, textarea')].filter(
                e => !(e.labels && e.labels.length)).length};
    }""")


def _check_widget(page, corpus_prompt: str, lang: str) -> dict:
    model, tok = _torch_model("shakespeare")
    got = _type_and_generate(page, corpus_prompt, 40)
    assert len(got["text"]) == 40 and set(got["text"]) <= set(tok.itos), got
    assert got["unlabelled"] == 0
    assert 1 <= len(got["bars"]) <= 8 and all(0 < b <= 1 for b in got["bars"])
    assert got["bars"] == sorted(got["bars"], reverse=True)
    assert len(got["att"]) == min(len(corpus_prompt) + 40, model.config.block_size)
    assert abs(sum(got["att"]) - 1) < 1e-3
    has_cjk = re.search(r"[\u4e00-\u9fff]", got["title"] + got["status"]) is not None
    assert has_cjk == (lang == "zh"), got
    return got


def test_simplified_input_is_read_as_traditional_and_said(exported, chromium):
    with _served_page(exported.site, chromium.context) as served:
        page = served.page
        page.goto(served.base + "zh.html", wait_until="load")
        _wait_until_ready(page)
        got = page.evaluate(NEXT_LOGITS, ["tang", ["春眠不觉晓"]])[0]
        want = _torch_logits("tang", "春眠不覺曉")
        assert float((torch.tensor(got, dtype=torch.float64) - want.double()).abs().max()) <= TOLERANCE
        root = page.locator(".d2lattn-lm").first
        root.locator("select.d2lattn-lm-corpus").select_option("tang")
        out = _type_and_generate(page, "春眠不觉晓，处处", 10)
        assert len(out["text"]) == 10
        note = root.locator(".d2lattn-lm-note").text_content()
        assert "觉→覺" in note and "处→處" in note, note
        root.locator("textarea").fill("ROMEO")  # not Chinese at all: refused, with the hint
        page.wait_for_function(
            "document.querySelector('.d2lattn-lm-status').textContent.includes('繁体')")
        _assert_local_and_clean(served.recorder)


def test_stub_page_generates_in_both_languages(exported, chromium):
    with _served_page(exported.site, chromium.context) as served:
        for name, lang in (("index.html", "en"), ("zh.html", "zh")):
            served.page.goto(served.base + name, wait_until="load")
            _wait_until_ready(served.page)
            _check_widget(served.page, "ROMEO:\n", lang)
        _assert_local_and_clean(served.recorder)


# --- on the built site: chapter 12 in both languages ------------------------------------------

CHAPTER = "book/ch12_gpt.html"


@pytest.mark.parametrize("prefix, lang", [("", "en"), ("zh/", "zh")])
def test_chapter12_writes_in_the_page(chromium, prefix, lang):
    from test_site import SITE

    page_file = SITE / prefix / CHAPTER
    if not page_file.is_file():
        pytest.skip(f"no built {prefix}{CHAPTER}: python tools/book.py build --no-pdf")
    assert 'class="d2lattn-lm"' in page_file.read_text(encoding="utf-8"), \
        f"{prefix}{CHAPTER} has lost its {{d2lattn-lm}} widget"
    with _served_page(SITE, chromium.context) as served:
        page, recorder = served.page, served.recorder
        page.goto(served.base + prefix + CHAPTER, wait_until="load")
        _wait_until_ready(page)
        _assert_nothing_fetched_yet(recorder)
        # a Chinese reader starts with the Tang poems, an English one with Shakespeare
        first = page.locator("select.d2lattn-lm-corpus").first.input_value()
        assert first == ("tang" if lang == "zh" else "shakespeare")
        page.locator("select.d2lattn-lm-corpus").first.select_option("shakespeare")
        _check_widget(page, "ROMEO:\n", lang)
        worst = {c: _largest_difference(page, c, _prompts(c)[:2]) for c in ("shakespeare", "tang")}
        assert max(worst.values()) <= TOLERANCE, worst
        _assert_local_and_clean(recorder)


def test_a_finished_run_keeps_its_output_when_the_typing_settles(exported, chromium):
    """Typing schedules a re-analysis 150 ms later; a Generate pressed sooner cancels it, so a
    short run that ends first keeps its output (the failure CI once met: 0 characters shown)."""
    with _served_page(exported.site, chromium.context) as served:
        page = served.page
        page.goto(served.base + "index.html", wait_until="load")
        _wait_until_ready(page)
        _type_and_generate(page, "ROMEO:\n", 2)  # loads the model: typing is analysed from now on
        got = _type_and_generate(page, "JULIET:\n", 3)
        page.wait_for_timeout(400)  # well past the typing's 150 ms
        text = page.locator(".d2lattn-lm-output-new").first.text_content()
        assert len(got["text"]) == 3 and text == got["text"], (got, text)
        _assert_local_and_clean(served.recorder)


def test_from_a_file_url_the_model_loads(exported, chromium):
    """Opened from disk (as the README says to open the site), the model loads from its script
    and equals PyTorch; nothing is logged as an error."""
    errors = []
    page = chromium.context.new_page()
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto((exported.site / "index.html").as_uri(), wait_until="load")
        _wait_until_ready(page)
        worst = _largest_difference(page, "shakespeare", _prompts("shakespeare")[:2])
        assert worst <= TOLERANCE, worst
        got = _type_and_generate(page, "ROMEO:\n", 20)
        assert len(got["text"]) == 20
        assert errors == []
    finally:
        page.close()

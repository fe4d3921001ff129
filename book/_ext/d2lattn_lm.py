"""Sphinx extension: chapter 12's GPT, run by the reader's browser (``{d2lattn-lm}``).

The directive ``{d2lattn-lm}`` writes an empty ``<div class="d2lattn-lm">``; the script
``d2lattn-lm.js`` (``book/assets/static``, added only to pages with such a div, with its
stylesheet ``d2lattn-lm.css``) builds the widget in it: a prompt box, Generate, temperature,
top-k and top-p, the next-character probabilities and one head's attention over the text. The
forward pass is the script's own (no library, no server, no network), and the page exposes it as
``window.d2lattnLM.nextLogits(corpus, text)``.

The weights are exported here, **at build time, from whatever checkpoint the book ships**
(``book/data/ch12_gpt_<corpus>.pt``, float16), never committed as a copy: when a page uses the
directive, the build writes ``_static/d2lattn-lm/<corpus>.js``, one script that calls
``d2lattnLM._register(corpus, manifest, weights)`` with

- the manifest: the model's configuration, the numbers of the forward pass that are not in the
  configuration (LayerNorm epsilon, rotary base, activation), the tokenizer's vocabulary
  (``CharTokenizer(load_split(corpus).text).itos``, as chapter 12 builds it), and the name,
  shape and offset of every tensor in
- the weights: the checkpoint's float16 tensors, little-endian, one after the other (the tied
  read-out is the embedding, stored once), as base64 text.

A script, not a fetched file: a page opened from disk (``file://``) may load a script but may not
fetch a file, and the README tells readers to open ``_build/html/index.html``. Manifest and
weights in one file can never be mixed across builds. The page loads a model's script only when
the reader asks (a button, or a call of the API), never when the page loads.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Dict, Iterable, List

from docutils import nodes
from docutils.parsers.rst import Directive, directives

SCRIPT = "d2lattn-lm.js"
STYLE = "d2lattn-lm.css"
#: Where the exported files go, under the site's ``_static``.
EXPORT_DIR = "d2lattn-lm"
CORPORA = ("shakespeare", "tang")
#: The model a page shows first when the directive names none, by the page's language.
DEFAULT_CORPUS = {"en": "shakespeare", "zh": "tang"}
DATA_DIR = Path(__file__).resolve().parents[1] / "data"
FORMAT = 2
#: An exported model is this call: d2lattnLM._register(corpus, manifest, base64 weights).
SCRIPT_PREFIX = "window.d2lattnLM._register("
SCRIPT_SUFFIX = ");\n"
#: What the printed book (the PDF) shows in the widget's place: what it is and where to run it.
PRINT_ALTERNATIVE = {
    "en": "In the printed book, a live element stands here: chapter 12's GPT, running in the web "
          "page of this chapter. Type a prompt, set the temperature, top-k and top-p, and watch "
          "it write, with the next-character probabilities and one head's attention. Open this "
          "chapter on the book's website (book/ch12_gpt.html), or run GPT.generate in the "
          "chapter's notebook.",
    "zh": "印刷版此处是一个交互元素：在本章网页中运行的第 12 章 GPT。输入提示，设置温度、top-k 和 "
          "top-p，看它写作，并看下一个字符的概率和一个头的注意力。请在本书网站上打开本章"
          "（book/ch12_gpt.html），或在本章的笔记本中运行 GPT.generate。",
}
_NOSCRIPT = {
    "en": "This part of the page runs chapter 12's GPT in your browser; it needs JavaScript.",
    "zh": "页面的这一部分在浏览器中运行第 12 章的 GPT，需要 JavaScript。",
}


# ---------------------------------------------------------------------------------------------
# the export


def export_model(corpus: str, out_dir: Path, data_dir: Path = DATA_DIR) -> Dict[str, object]:
    """Write ``<corpus>.js`` (manifest and float16 weights) for ``data_dir/ch12_gpt_<corpus>.pt``.

    The checkpoint is loaded into :class:`d2lattn.gpt.GPT` first, so a state dict that does not
    fit its configuration fails here, at build time, and the LayerNorm epsilons are read from the
    model that was built. Only what the script implements is accepted: softmax attention, causal,
    rotary or learned positions, GELU (exact, erf-based) feed-forward networks.

    Returns:
        the manifest written (a dict), with ``"bin_bytes"`` (the weights) and ``"js_bytes"``
        (the script) added.

    Raises:
        ValueError: an unknown corpus, a checkpoint the script cannot run, or a vocabulary whose
            size differs from the checkpoint's ``vocab_size``.
    """
    import numpy as np
    import torch
    import torch.nn.functional as F

    from d2lattn.gpt import GPT, GPTConfig
    from d2lattn.text import CharTokenizer, load_split

    if corpus not in CORPORA:
        raise ValueError(f"corpus must be one of {CORPORA}, got {corpus!r}")
    ckpt = torch.load(Path(data_dir) / f"ch12_gpt_{corpus}.pt", map_location="cpu",
                      weights_only=True)
    config = GPTConfig(**ckpt["config"])
    if config.attention != "softmax" or not config.causal:
        raise ValueError(f"{corpus}: the script runs causal softmax attention only, got "
                         f"attention={config.attention!r}, causal={config.causal}")
    state = ckpt["state_dict"]
    model = GPT(config)
    model.load_state_dict({k: v.float() for k, v in state.items()})  # checks names and shapes
    block = model.blocks[0]
    if block.ffn.activation is not F.gelu or not block.norm_first:
        raise ValueError(f"{corpus}: the script runs pre-norm blocks with GELU only")
    itos = CharTokenizer(load_split(corpus).text).itos
    if len(itos) != config.vocab_size:
        raise ValueError(f"{corpus}: the tokenizer has {len(itos)} characters, the checkpoint "
                         f"vocab_size = {config.vocab_size}")
    tensors: List[Dict[str, object]] = []
    chunks: List[bytes] = []
    offset = 0  # in float16 elements
    for name, value in state.items():
        if name == "head.weight" and config.tie_weights:
            continue  # the embedding, read again
        data = value.detach().to(torch.float16).contiguous().numpy().astype("<f2")
        tensors.append({"name": name, "shape": list(value.shape), "offset": offset})
        chunks.append(data.tobytes())
        offset += data.size
    blob = b"".join(chunks)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in [*out_dir.glob(f"{corpus}.*.bin"), out_dir / f"{corpus}.json"]:
        if old.exists():  # the files of the format before the scripts
            old.unlink()
    c = config
    manifest: Dict[str, object] = {
        "format": FORMAT,
        "corpus": corpus,
        "config": {"vocab_size": c.vocab_size, "block_size": c.block_size,
                   "num_hiddens": c.num_hiddens, "num_heads": c.num_heads,
                   "num_layers": c.num_layers, "ffn_num_hiddens": c.ffn_num_hiddens,
                   "positions": c.positions, "tie_weights": c.tie_weights},
        "layer_norm_eps": [block.norm1.eps, block.norm2.eps, model.norm.eps],
        "rotary_base": 10000.0,  # d2lattn.positional.rotary_embedding's default, as used
        "activation": "gelu_erf",
        "weights_bytes": len(blob),
        "sha256": hashlib.sha256(blob).hexdigest(),
        "tensors": tensors,
        "vocab": itos,
        "from_simplified": from_simplified(itos),
    }
    text = (SCRIPT_PREFIX + json.dumps(corpus) + ","
            + json.dumps(manifest, ensure_ascii=False, separators=(",", ":")) + ","
            + json.dumps(base64.b64encode(blob).decode("ascii")) + SCRIPT_SUFFIX)
    (out_dir / f"{corpus}.js").write_text(text, encoding="utf-8")
    assert np.frombuffer(blob, dtype="<f2").size == offset
    return {**manifest, "bin_bytes": len(blob), "js_bytes": len(text.encode("utf-8"))}


def read_export(path: Path) -> tuple:
    """The ``(corpus, manifest, weights bytes)`` that an exported ``<corpus>.js`` registers."""
    text = Path(path).read_text(encoding="utf-8")
    if not (text.startswith(SCRIPT_PREFIX) and text.endswith(SCRIPT_SUFFIX)):
        raise ValueError(f"{path}: not a script written by export_model")
    corpus, manifest, weights = json.loads("[" + text[len(SCRIPT_PREFIX):-len(SCRIPT_SUFFIX)] + "]")
    return corpus, manifest, base64.b64decode(weights)


def from_simplified(vocab: List[str]) -> Dict[str, str]:
    """Simplified Chinese characters outside ``vocab`` mapped to their traditional form in it.

    The Tang poems are written in traditional characters; a reader typing simplified ones (觉,
    处) would be refused. OpenCC's simplified-to-traditional table (``s2t``, the data of a
    well-kept converter) gives each CJK character of the basic block its traditional form; a
    character is mapped when it is not in the vocabulary itself, its form is one character, and
    that character is. Empty for a vocabulary without CJK characters, or without OpenCC.
    """
    known = set(vocab)
    if not any("\u4e00" <= c <= "\u9fff" for c in known):
        return {}
    try:
        import opencc
    except ImportError:  # the build still works; the page then refuses simplified input
        return {}
    convert = opencc.OpenCC("s2t").convert
    table = {}
    for code in range(0x4E00, 0xA000):
        c = chr(code)
        if c in known:
            continue
        t = convert(c)
        if len(t) == 1 and t != c and t in known:
            table[c] = t
    return table


def export_all(out_dir: Path, corpora: Iterable[str] = CORPORA,
               data_dir: Path = DATA_DIR) -> Dict[str, Dict[str, object]]:
    """:func:`export_model` for each corpus."""
    return {corpus: export_model(corpus, out_dir, data_dir) for corpus in corpora}


# ---------------------------------------------------------------------------------------------
# the directive and the build


class LMNode(nodes.General, nodes.Element):
    """The widget's container (HTML only; other builders write nothing)."""


def _visit_html(self, node: LMNode) -> None:
    lang = "zh" if (self.builder.config.language or "en").lower().startswith("zh") else "en"
    corpus = node["corpus"] or DEFAULT_CORPUS[lang]  # a Chinese reader starts with Tang poems
    self.body.append(
        f'<div class="d2lattn-lm" data-corpus="{corpus}">'
        f'<noscript><p>{_NOSCRIPT[lang]}</p></noscript></div>\n'
        f'<p class="d2lattn-print-alternative">{PRINT_ALTERNATIVE[lang]}</p>\n')
    raise nodes.SkipNode


def _skip(self, node: LMNode) -> None:
    raise nodes.SkipNode


class LMDirective(Directive):
    """``{d2lattn-lm}`` with an optional ``:corpus:`` (the model shown first; by default
    Shakespeare on an English page, the Tang poems on a Chinese one)."""

    has_content = False
    option_spec = {"corpus": lambda arg: directives.choice(arg, CORPORA)}

    def run(self) -> List[nodes.Node]:
        env = self.state.document.settings.env
        if not hasattr(env, "d2lattn_lm_docs"):
            env.d2lattn_lm_docs = set()
        env.d2lattn_lm_docs.add(env.docname)
        node = LMNode()
        node["corpus"] = self.options.get("corpus")  # None: the page's language chooses
        return [node]


def _purge(app, env, docname) -> None:
    getattr(env, "d2lattn_lm_docs", set()).discard(docname)


def _merge(app, env, docnames, other) -> None:
    if not hasattr(env, "d2lattn_lm_docs"):
        env.d2lattn_lm_docs = set()
    env.d2lattn_lm_docs |= getattr(other, "d2lattn_lm_docs", set()) & set(docnames)


def _add_assets(app, pagename, templatename, context, doctree) -> None:
    if doctree is not None and 'class="d2lattn-lm"' in context.get("body", ""):
        app.add_js_file(SCRIPT, loading_method="defer")
        app.add_css_file(STYLE)


def _export(app, exception) -> None:
    """After an HTML build whose pages use the directive: export the weights next to the
    script (every build, so that a retrained checkpoint is what the site serves)."""
    if exception is not None or app.builder.format != "html":
        return
    if not getattr(app.env, "d2lattn_lm_docs", None):
        return
    out = Path(app.outdir) / "_static" / EXPORT_DIR
    for corpus, info in export_all(out).items():
        print(f"d2lattn_lm: {corpus}: {info['bin_bytes'] / 1e6:.2f} MB of float16 weights, "
              f"a {info['js_bytes'] / 1e6:.2f} MB script")


def setup(app):
    app.add_node(LMNode, html=(_visit_html, None), latex=(_skip, None), text=(_skip, None),
                 man=(_skip, None), texinfo=(_skip, None))
    app.add_directive("d2lattn-lm", LMDirective)
    app.connect("env-purge-doc", _purge)
    app.connect("env-merge-info", _merge)
    app.connect("html-page-context", _add_assets)
    app.connect("build-finished", _export)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}

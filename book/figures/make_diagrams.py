"""Draw the book's five diagrams as SVG files next to this script.

Run from anywhere:  python book/figures/make_diagrams.py

Outputs (committed, referenced by the chapters with ``{figure}`` directives), each in English
and in Chinese (``NAME.zh_CN.svg``, which the Chinese build shows in place of ``NAME.svg``:
Sphinx's ``figure_language_filename``):

- ``attention_pooling.svg``   score -> normalize -> pool, for one query and n key-value pairs;
- ``masking.svg``             a padded batch (valid lengths 2 and 3), masked scores, masked softmax;
- ``multihead.svg``           h heads of projections + scaled dot-product attention, concat, W_o;
- ``positional_encoding.svg`` token embeddings + sinusoidal position table -> self-attention;
- ``transformer_block.svg``   encoder and decoder blocks (residuals, add & norm, memory, x N),
                              with post-norm vs pre-norm for one sublayer;
- ``../assets/root/favicon.ico`` the site's icon (the SVG icon beside it is hand-written).

The output is deterministic (fixed SVG hash salt, no date, text drawn as paths), so re-running
the script changes no file unless the drawing code changed. The Chinese labels come from the
table ``ZH_CN`` below (the glossary's terms), keyed by the English text drawn; a label with no
entry stops the script. Chinese glyphs are drawn from Noto Sans CJK SC when it is installed,
else from the book's own subset of it (``book/assets/static/fonts``); either way they end up as
outlines in the SVG, so no reader needs the font. Colours are the Okabe-Ito palette,
which stays distinguishable under the common forms of colour blindness; no information is carried
by colour alone (every box is labelled, masked cells are also hatched and crossed).
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import matplotlib
import matplotlib.text
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle

HERE = Path(__file__).resolve().parent

# Okabe-Ito colour-blind-safe palette, light tints for fills and full colours for edges.
ORANGE, SKY, GREEN, YELLOW = "#E69F00", "#56B4E9", "#009E73", "#F0E442"
BLUE, VERMILLION, PURPLE, GREY, INK = "#0072B2", "#D55E00", "#CC79A7", "#999999", "#222222"


def tint(hex_colour: str, amount: float = 0.75) -> str:
    """Mix a colour with white (amount = share of white)."""
    rgb = np.array(matplotlib.colors.to_rgb(hex_colour))
    return matplotlib.colors.to_hex(rgb + (1 - rgb) * amount)


QUERY, KEY, VALUE = VERMILLION, BLUE, GREEN  # the three roles, the same in every diagram
SCORE, WEIGHT, OUTPUT = ORANGE, PURPLE, INK

BASE_FONT = 13  # pt at the figure's natural size; the smallest text used is 11 pt


def setup() -> None:
    """Headless backend and deterministic SVG output (called by main, not on import)."""
    matplotlib.use("Agg")
    plt.rcParams.update(
        {
            "svg.hashsalt": "d2lattn",
            "svg.fonttype": "path",
            "font.family": "DejaVu Sans",
            "font.size": BASE_FONT,
            "mathtext.fontset": "dejavusans",
        }
    )


def canvas(width_in: float, height_in: float, xmax: float, ymax: float):
    """A figure with one frameless axes whose data units are 'layout units'."""
    fig = plt.figure(figsize=(width_in, height_in))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, xmax)
    ax.set_ylim(0, ymax)
    ax.set_aspect("equal")
    ax.axis("off")
    return fig, ax


def box(ax, x, y, w, h, text="", colour=GREY, *, fill=None, size=BASE_FONT, weight="normal",
        rotation=0, lw=1.6, style="round,pad=0.02,rounding_size=0.6", text_colour=INK, z=2):
    """A rounded box with its lower-left corner at (x, y) and centred text."""
    patch = FancyBboxPatch((x, y), w, h, boxstyle=style, linewidth=lw, edgecolor=colour,
                           facecolor=tint(colour) if fill is None else fill, zorder=z)
    ax.add_patch(patch)
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size,
                fontweight=weight, rotation=rotation, color=text_colour, zorder=z + 1)
    return patch


def arrow(ax, start, end, colour=INK, *, lw=1.5, style="-|>", ls="-", rad=0.0, shrink=2.0, z=1):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=14, color=colour,
                                 linewidth=lw, linestyle=ls, shrinkA=shrink, shrinkB=shrink,
                                 connectionstyle=f"arc3,rad={rad}", zorder=z))


def step_label(ax, x, y, number, text, colour):
    ax.text(x, y, f"{number}. {text}", ha="center", va="center", fontsize=BASE_FONT + 1,
            fontweight="bold", color=colour)


def save(fig, name: str) -> None:
    """Write the figure in English as NAME, then in Chinese as NAME with ``.zh_CN`` added."""
    fig.savefig(HERE / name, format="svg", metadata={"Date": None})
    print("wrote", HERE / name)
    translate_figure(fig)
    zh_name = name.replace(".svg", ".zh_CN.svg")
    fig.savefig(HERE / zh_name, format="svg", metadata={"Date": None})
    plt.close(fig)
    print("wrote", HERE / zh_name)


# ---------------------------------------------------------------------------------------------
# the Chinese labels

#: Drawn as they are in both languages: the example's tokens, code and names of layers.
KEEP = {"softmax", "Layer\nNorm", "I", "ran", "you", "lent", "me", "<pad>", "100", "X + P"}

#: English label -> Chinese label (terms as in book/glossary.md and the chapters' catalogues).
ZH_CN = {
    # attention_pooling.svg
    "query $\\mathbf{q}$": "查询 $\\mathbf{q}$",
    "keys": "键", "values": "值", "output": "输出",
    "1. score": "1. 评分", "2. normalize": "2. 归一化", "3. pool": "3. 汇聚",
    # masking.svg
    "padded batch": "填充后的批量",
    "scores (queries × keys)": "分数（查询 × 键）",
    "masked softmax": "掩蔽 softmax",
    "sequence b = 0\nvalid_lens[0] = 2": "序列 b = 0\nvalid_lens[0] = 2",
    "sequence b = 1\nvalid_lens[1] = 3": "序列 b = 1\nvalid_lens[1] = 3",
    "softmax over\nvalid keys": "只在有效键上\n做 softmax",
    "masked: the key is padding; its score is ignored and its weight is exactly 0":
        "被掩蔽：该键是填充，它的分数被忽略，权重恰好为 0",
    # multihead.svg
    "queries": "查询",
    "(shared by\nall heads)": "（所有头\n共用）",
    "head 1": "头 1", "head 2": "头 2", "head h": "头 h",
    "scaled\ndot-product\nattention": "缩放点积\n注意力",
    "concat": "拼接",
    # positional_encoding.svg
    "token\nembeddings X": "词元嵌入\nX",
    "positional\nencoding P": "位置编码\nP",
    "position": "位置",
    **{f"{f}, pair {k}": f"{f}，第 {k} 对" for f in ("sin", "cos") for k in range(3)},
    "self-\nattention": "自注意力",
    "order-\naware\noutputs": "感知顺序\n的输出",
    "entry value": "元素的值",
    "positions above": "即上方的位置",
    "sine rows of P (cos rows: same\nfrequency, a quarter turn ahead)":
        "P 的正弦行（余弦行：频率相同，\n相位超前四分之一周期）",
    **{f"pair {k}: $\\sin(\\mathrm{{pos}}\\,/\\,10000^{{{2 * k}/6}})$":
       f"第 {k} 对：sin(pos / 10000^({2 * k}/6))" for k in range(3)},  # mathtext has no CJK
    # transformer_block.svg
    "Encoder block": "编码器块", "Decoder block": "解码器块",
    "embedding\n+ positions": "嵌入\n+ 位置",
    "source tokens": "源词元",
    "target tokens\n(shifted right)": "目标词元\n（右移一位）",
    "multi-head\nself-attention": "多头\n自注意力",
    "add & norm": "相加与规范化",
    "position-wise\nfeed-forward": "逐位\n前馈网络",
    "masked multi-head\nself-attention": "掩蔽多头\n自注意力",
    "cross-attention": "交叉注意力",
    "residual": "残差",
    "memory (encoder output)": "记忆（编码器的输出）",
    "keys,\nvalues": "键、\n值",
    "decoder output (→ linear, softmax)": "解码器输出（→ 线性层、softmax）",
    "One sublayer": "一个子层",
    "post-norm": "后置归一化", "pre-norm": "前置归一化",
    "sublayer": "子层",
    "Pre-norm moves each\nLayerNorm to the start\nof its branch. The blocks\nat left are post-norm.":
        "前置归一化把每个\nLayerNorm 移到其分支\n的开头。左侧的块\n是后置归一化。",
}

_CJK = re.compile(r"[\u2e80-\u9fff\uf900-\ufaff\ufe30-\ufe4f\uff00-\uffef]")
_MATH = re.compile(r"(\$[^$]*\$)")
CJK_FAMILY = "Noto Sans CJK SC"


def _needs_translation(text: str) -> bool:
    return text not in KEEP and re.search(r"[A-Za-z]{2}", _MATH.sub("", text)) is not None


def translate_figure(fig) -> None:
    """Replace every label of the figure by its Chinese one (ZH_CN); stop at a missing one."""
    _cjk_font()
    missing = []
    for artist in fig.findobj(matplotlib.text.Text):
        text = artist.get_text()
        if not text or not _needs_translation(text):
            continue
        if text not in ZH_CN:
            missing.append(text)
            continue
        artist.set_text(ZH_CN[text])
        artist.set_fontfamily(["DejaVu Sans", CJK_FAMILY])
        if "$" in ZH_CN[text]:
            _split_math(fig, artist)
    if missing:
        raise SystemExit("make_diagrams.py: no Chinese label for " + ", ".join(map(repr, missing))
                         + ": add it to ZH_CN")


def _split_math(fig, artist) -> None:
    """Mathtext cannot draw Chinese glyphs, so a label that mixes both ("查询 $q$") is drawn
    as separate texts side by side: the Chinese in the CJK font, the formula as mathtext."""
    parts = [p for p in _MATH.split(artist.get_text()) if p]
    if len(parts) == 1:
        return
    if artist.get_rotation() or "\n" in artist.get_text():
        raise SystemExit(f"cannot split the rotated or multi-line label {artist.get_text()!r}")
    renderer = fig.canvas.get_renderer()
    pieces = []
    for part in parts:
        piece = matplotlib.text.Text(text=part, fontsize=artist.get_fontsize(),
                                     fontweight=artist.get_fontweight(), color=artist.get_color(),
                                     va=artist.get_va(), ha="left", zorder=artist.get_zorder(),
                                     fontfamily=["DejaVu Sans", CJK_FAMILY])
        piece.set_figure(fig)
        pieces.append((piece, piece.get_window_extent(renderer).width))
    transform = artist.get_transform()
    x, y = transform.transform(artist.get_position())
    total = sum(w for _, w in pieces)
    x -= {"center": total / 2, "right": total}.get(artist.get_ha(), 0)
    parent = artist.axes if artist.axes is not None else fig
    for piece, width in pieces:
        piece.set_position(transform.inverted().transform((x, y)))
        piece.set_transform(transform)
        parent._add_text(piece) if hasattr(parent, "_add_text") else fig.texts.append(piece)
        x += width
    artist.set_visible(False)
    artist.set_text("")


def _cjk_font() -> None:
    """Make Noto Sans CJK SC known to matplotlib: the system's, else the book's subset."""
    from matplotlib import font_manager

    if any(f.name == CJK_FAMILY for f in font_manager.fontManager.ttflist):
        return
    system = Path("/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc")
    out = Path(tempfile.gettempdir()) / "d2lattn-diagrams-cjk.otf"
    from fontTools.ttLib import TTCollection, TTFont

    if system.exists():
        font = TTCollection(str(system)).fonts[2]  # the Simplified Chinese face
    else:
        font = TTFont(str(HERE.parent / "assets" / "static" / "fonts" / "d2lattn-cjk-subset.woff2"))
        font.flavor = None
        cmap = font.getBestCmap()
        lacking = sorted({c for label in ZH_CN.values() for c in _CJK.findall(label)
                          if ord(c) not in cmap})
        if lacking:
            raise SystemExit("the subset font lacks " + "".join(lacking) + ": install "
                             "fonts-noto-cjk, or run `python tools/book.py font` first")
    font.save(str(out))
    font_manager.fontManager.addfont(str(out))


# --------------------------------------------------------------------------------------------
def attention_pooling() -> None:
    """Score -> normalize -> pool for one query and K key-value pairs."""
    fig, ax = canvas(10.0, 5.4, 100, 54)
    rows = {"1": 39.0, "2": 27.0, "K": 8.0}  # y of the box centres; a dotted gap before K
    bh = 6.0  # box height

    # the query, carried to every score by a bus that runs in the gaps between the rows
    box(ax, 0.5, 23, 9, bh, r"query $\mathbf{q}$", QUERY, size=12)
    ax.plot([9.5, 11.5], [26, 26], color=QUERY, lw=1.5)
    ax.plot([11.5, 11.5], [rows["K"] + 4.6, rows["1"] + 4.6], color=QUERY, lw=1.5)
    # stored items: keys (left) and values (right), one row per pair
    ax.text(17.5, 48.5, "keys", ha="center", fontsize=BASE_FONT, color=KEY, fontweight="bold")
    ax.text(77.5, 48.5, "values", ha="center", fontsize=BASE_FONT, color=VALUE,
            fontweight="bold")
    for i, y in rows.items():
        # a faint band shows that key i and value i belong to the same stored pair
        ax.add_patch(Rectangle((13.5, y - 4.0), 70, 8.0, facecolor="#f0f0f0", edgecolor="none",
                               zorder=0))
        box(ax, 14, y - bh / 2, 7, bh, rf"$\mathbf{{k}}_{i}$", KEY)
        box(ax, 26, y - bh / 2, 13, bh, rf"$a(\mathbf{{q}}, \mathbf{{k}}_{i})$", SCORE, size=12)
        box(ax, 55, y - bh / 2, 9, bh, rf"$\alpha_{i}$", WEIGHT)
        box(ax, 74, y - bh / 2, 7, bh, rf"$\mathbf{{v}}_{i}$", VALUE)
        arrow(ax, (21, y - 0.8), (26, y - 0.8))  # key into the score
        ax.plot([11.5, 23.0], [y + 4.6, y + 4.6], color=QUERY, lw=1.5)  # query into the score
        arrow(ax, (23.0, y + 4.6), (27.5, y + 3.0), QUERY, shrink=0.5)
        arrow(ax, (39, y), (45, y))  # score into softmax
        arrow(ax, (50, y), (55, y))  # softmax out to weight
        ax.text(69, y, r"$\times$", ha="center", va="center", fontsize=16)
        arrow(ax, (64, y), (67.5, y), WEIGHT, style="-")
        arrow(ax, (81, y), (88.6, 25), rad=0.0)  # weighted value into the sum
    for x in (17.5, 32.5, 59.5, 77.5):
        ax.text(x, 17.6, r"$\vdots$", ha="center", va="center", fontsize=16)

    # softmax spans all rows: the weights of one query are normalized together
    box(ax, 45, 3, 5, 42, "softmax", WEIGHT, rotation=90, size=13)
    ax.text(59.5, 1.0, r"$\alpha_i \geq 0,\ \sum_i \alpha_i = 1$", ha="center", va="center",
            fontsize=12, color=INK)

    # the weighted sum and the output
    ax.add_patch(plt.Circle((91, 25), 2.6, facecolor="white", edgecolor=INK, linewidth=1.6))
    ax.text(91, 25, r"$\Sigma$", ha="center", va="center", fontsize=14)
    arrow(ax, (93.6, 25), (96.5, 25))
    ax.text(97.8, 25, "output", ha="center", va="center", fontsize=12, rotation=90)
    ax.text(91, 17.0, r"$\sum_i \alpha_i \mathbf{v}_i$", ha="center", va="center", fontsize=12)

    step_label(ax, 32.5, 52.0, 1, "score", SCORE)
    step_label(ax, 52.0, 52.0, 2, "normalize", WEIGHT)
    step_label(ax, 86.0, 52.0, 3, "pool", VALUE)
    save(fig, "attention_pooling.svg")


# --------------------------------------------------------------------------------------------
def _softmax_masked(scores: np.ndarray, valid: int) -> np.ndarray:
    """Row softmax over the first `valid` columns; padded columns get exactly zero."""
    out = np.zeros_like(scores)
    e = np.exp(scores[:, :valid] - scores[:, :valid].max(axis=1, keepdims=True))
    out[:, :valid] = e / e.sum(axis=1, keepdims=True)
    return out


def _matrix(ax, x0, y0, values, valid, cell, *, weights: bool, colour):
    """Draw a (Q, K) matrix of numbers; columns >= valid are padding (grey, hatched, crossed)."""
    nq, nk = values.shape
    for r in range(nq):
        for c in range(nk):
            x, y = x0 + c * cell, y0 + (nq - 1 - r) * cell
            masked = c >= valid
            face = "#d9d9d9" if masked else (tint(colour, 1 - 0.55 * values[r, c]) if weights
                                             else tint(colour, 0.8))
            ax.add_patch(Rectangle((x, y), cell, cell, facecolor=face, edgecolor="white",
                                   linewidth=1.5, hatch="///" if masked and not weights else None,
                                   zorder=1))
            if masked and not weights:
                ax.plot([x + 0.8, x + cell - 0.8], [y + 0.8, y + cell - 0.8], color=GREY, lw=1.4)
                ax.plot([x + 0.8, x + cell - 0.8], [y + cell - 0.8, y + 0.8], color=GREY, lw=1.4)
            else:
                text = f"{values[r, c]:.2f}" if weights else f"{values[r, c]:.1f}"
                if weights and masked:
                    text = "0"
                ax.text(x + cell / 2, y + cell / 2, text, ha="center", va="center", fontsize=11,
                        color=INK, zorder=3,
                        bbox=dict(boxstyle="round,pad=0.1", fc="white", ec="none", alpha=0.7)
                        if masked and not weights else None)
    for c in range(nk):
        ax.text(x0 + (c + 0.5) * cell, y0 + nq * cell + 1.0, f"k{c}", ha="center",
                va="bottom", fontsize=11, color=KEY)
    for r in range(nq):
        ax.text(x0 - 0.8, y0 + (nq - 0.5 - r) * cell, f"q{r}", ha="right", va="center",
                fontsize=11, color=QUERY)


def masking() -> None:
    """A padded batch of two sequences and the masked softmax over its scores."""
    fig, ax = canvas(10.0, 5.8, 100, 58)
    cell = 5.5
    valid_lens = (2, 3)
    scores = (np.array([[1.2, 0.3, 2.0, -0.5], [0.1, 0.9, 1.5, 0.4]]),
              np.array([[0.5, 1.4, -0.2, 1.1], [2.1, 0.2, 0.8, 2.5]]))
    tokens = (("I", "ran", "<pad>", "<pad>"), ("you", "lent", "me", "<pad>"))

    ax.text(12, 55, "padded batch", ha="center", fontsize=BASE_FONT, fontweight="bold")
    ax.text(44, 55, "scores (queries × keys)", ha="center", fontsize=BASE_FONT,
            fontweight="bold")
    ax.text(81, 55, "masked softmax", ha="center", fontsize=BASE_FONT, fontweight="bold")

    for b, (y0, valid, sc, toks) in enumerate(zip((30, 5), valid_lens, scores, tokens)):
        # the sequence as key positions; padding greyed
        for t, tok in enumerate(toks):
            pad = t >= valid
            box(ax, 0.5 + t * 6.1, y0 + 8.5, 5.8, 4.2, tok, GREY if pad else KEY,
                fill="#e6e6e6" if pad else None, size=11,
                style="round,pad=0.02,rounding_size=0.4", lw=1.2)
        ax.text(12.6, y0 + 6.4, f"sequence b = {b}\nvalid_lens[{b}] = {valid}", ha="center",
                va="top", fontsize=11, color=INK)
        arrow(ax, (25.0, y0 + 10.6), (30.5, y0 + 10.6), GREY, lw=1.2, ls=(0, (3, 2)))
        # scores and the mask
        _matrix(ax, 33, y0 + 5, sc, valid, cell, weights=False, colour=SCORE)
        arrow(ax, (56.5, y0 + 10.5), (65, y0 + 10.5), lw=1.8)
        ax.text(60.7, y0 + 12.3, "softmax over\nvalid keys", ha="center", va="bottom", fontsize=11)
        # weights: padding columns are exactly zero; each row sums to one
        w = _softmax_masked(sc, valid)
        _matrix(ax, 70, y0 + 5, w, valid, cell, weights=True, colour=WEIGHT)
        for r in range(2):
            ax.text(70 + 4 * cell + 0.8, y0 + 5 + (1.5 - r) * cell, "Σ = 1", ha="left",
                    va="center", fontsize=11)

    # legend, in words and pattern rather than colour alone
    ax.add_patch(Rectangle((33, 0.3), 3, 3, facecolor="#d9d9d9", hatch="///", edgecolor="white"))
    ax.plot([33.3, 35.7], [0.6, 3.0], color=GREY, lw=1.2)
    ax.plot([33.3, 35.7], [3.0, 0.6], color=GREY, lw=1.2)
    ax.text(37, 1.8, "masked: the key is padding; its score is ignored and its weight is exactly 0",
            va="center", fontsize=11)
    save(fig, "masking.svg")


# --------------------------------------------------------------------------------------------
def multihead() -> None:
    """h parallel heads: projections -> scaled dot-product attention; concat; W_o."""
    fig, ax = canvas(10.0, 6.4, 100, 64)
    # inputs
    for (label, y, colour) in (("queries", 40, QUERY), ("keys", 29, KEY), ("values", 18, VALUE)):
        box(ax, 0.5, y, 12, 6, label, colour, size=12)
    ax.text(6.5, 12.5, "(shared by\nall heads)", ha="center", va="top", fontsize=11)

    heads = [("1", 46.0), ("2", 27.5), ("h", 1.5)]
    ph = 16.0  # panel height
    for i, y in heads:
        # a panel per head
        ax.add_patch(FancyBboxPatch((21, y), 50, ph, boxstyle="round,pad=0.2,rounding_size=1.0",
                                    facecolor="#f5f5f5", edgecolor=GREY, linewidth=1.2, zorder=0))
        ax.text(56.5, y + ph - 0.5, f"head {i}", ha="center", va="top", fontsize=12,
                fontweight="bold")
        for j, (w, colour) in enumerate(((rf"$\mathbf{{W}}_{{q,{i}}}$", QUERY),
                                         (rf"$\mathbf{{W}}_{{k,{i}}}$", KEY),
                                         (rf"$\mathbf{{W}}_{{v,{i}}}$", VALUE))):
            yy = y + 9.6 - j * 4.4
            box(ax, 31, yy, 10, 3.6, w, colour, size=12, style="round,pad=0.02,rounding_size=0.4",
                lw=1.3)
            arrow(ax, (41, yy + 1.8), (47, y + ph / 2 - 1), colour, lw=1.2)
            # from the shared inputs into this head's projection
            src_y = {0: 43, 1: 32, 2: 21}[j]
            arrow(ax, (12.5, src_y), (31, yy + 1.8), colour, lw=1.0,
                  ls=("-", (0, (4, 2)), (0, (1, 1.5)))[j], shrink=1.0)
        box(ax, 47, y + 1.5, 19, ph - 5, "scaled\ndot-product\nattention", ORANGE, size=12)
        ax.text(68.8, y + ph / 2 - 0.4, r"$\mathbf{H}_" + i + "$", ha="center", va="bottom",
                fontsize=12)
        arrow(ax, (66, y + ph / 2 - 1), (75, 31.5), INK, lw=1.3)
    for x in (36, 56.5):
        ax.text(x, 21.3, r"$\vdots$", ha="center", va="center", fontsize=16)

    box(ax, 75, 8, 5, 47, "concat", GREY, rotation=90, size=13)
    arrow(ax, (80, 31.5), (83, 31.5))
    box(ax, 83, 27.5, 7, 8, r"$\mathbf{W}_o$", PURPLE, size=13)
    arrow(ax, (90, 31.5), (92.5, 31.5))
    ax.text(96.2, 31.5, "output", ha="center", va="center", fontsize=12, rotation=90)
    ax.text(85, 24.5, r"$(B, Q, d_\mathrm{model})$", ha="center", va="top", fontsize=11)
    ax.text(77.5, 5.5, r"$h \cdot d_h = d_\mathrm{model}$", ha="center", va="top", fontsize=11)
    save(fig, "multihead.svg")


# --------------------------------------------------------------------------------------------
def _table(ax, x0, y0, values, cell, cmap, vmin, vmax, title, labels=None):
    """Columns = positions (tokens), rows = embedding dimensions."""
    d, T = values.shape
    norm = matplotlib.colors.Normalize(vmin, vmax)
    for t in range(T):
        for j in range(d):
            ax.add_patch(Rectangle((x0 + t * cell, y0 + (d - 1 - j) * cell), cell, cell,
                                   facecolor=cmap(norm(values[j, t])), edgecolor="white",
                                   linewidth=1.2))
    ax.text(x0 + T * cell / 2, y0 + d * cell + 1.4, title, ha="center", va="bottom",
            fontsize=12, fontweight="bold")
    if labels is not None:
        for t, lab in enumerate(labels):
            ax.text(x0 + (t + 0.5) * cell, y0 - 1.0, lab, ha="center", va="top", fontsize=11)


def positional_encoding() -> None:
    """Token embeddings + sin/cos position vectors -> sum -> self-attention."""
    fig, ax = canvas(10.0, 5.8, 100, 58)
    tokens = ("you", "lent", "me", "100")
    T, d, cell = len(tokens), 6, 3.6
    rng = np.random.default_rng(7)
    X = rng.uniform(-0.8, 0.8, size=(d, T))  # stand-in embeddings; their values are arbitrary
    pos = np.arange(T)[None, :]
    freq = 1.0 / 10000 ** (np.arange(0, d, 2) / d)  # (d/2,) one frequency per sin/cos pair
    P = np.empty((d, T))
    P[0::2] = np.sin(pos * freq[:, None])
    P[1::2] = np.cos(pos * freq[:, None])
    cmap = plt.get_cmap("PuOr")  # diverging, colour-blind safe

    y0, h = 28, d * cell
    _table(ax, 1, y0, X, cell, cmap, -2, 2, "token\nembeddings X", tokens)
    ax.text(18.2, y0 + h / 2, "+", ha="center", va="center", fontsize=22)
    _table(ax, 29, y0, P, cell, cmap, -2, 2, "positional\nencoding P",
           [str(t) for t in range(T)])
    ax.text(29 + 2 * cell, y0 - 4.2, "position", ha="center", va="top", fontsize=11)
    for j in range(d):  # which row is which
        ax.text(28.4, y0 + (d - 0.5 - j) * cell, ("sin", "cos")[j % 2] + f", pair {j // 2}",
                ha="right", va="center", fontsize=10, color="#444444")
    ax.text(46.5, y0 + h / 2, "=", ha="center", va="center", fontsize=22)
    _table(ax, 49.5, y0, X + P, cell, cmap, -2, 2, "X + P", tokens)
    arrow(ax, (64.5, y0 + h / 2), (69, y0 + h / 2), lw=1.8)
    box(ax, 69, y0 + 3, 13, h - 6, "self-\nattention", ORANGE, size=13)
    arrow(ax, (82, y0 + h / 2), (86, y0 + h / 2), lw=1.8)
    ax.text(86.5, y0 + h / 2, "order-\naware\noutputs", ha="left", va="center", fontsize=12)

    # colour scale of the three tables
    cax = fig.add_axes((0.66, 0.90, 0.25, 0.025))
    cb = fig.colorbar(matplotlib.cm.ScalarMappable(matplotlib.colors.Normalize(-2, 2), cmap),
                      cax=cax, orientation="horizontal")
    cb.ax.tick_params(labelsize=10)
    cb.set_label("entry value", fontsize=10)

    # the waves the rows of P are sampled from: each sin/cos pair has its own frequency
    wave = fig.add_axes((0.07, 0.08, 0.50, 0.27))
    s = np.linspace(0, 12, 600)
    styles = (("-", BLUE), ("--", VERMILLION), (":", GREEN))
    for k, (ls, colour) in enumerate(styles):
        wave.plot(s, np.sin(s * freq[k]), ls=ls, color=colour, lw=1.8,
                  label=rf"pair {k}: $\sin(\mathrm{{pos}}\,/\,10000^{{{2 * k}/{d}}})$")
        wave.plot(np.arange(T), np.sin(np.arange(T) * freq[k]), "o", color=colour, ms=5)
    wave.axvspan(-0.3, T - 0.7, color="#eeeeee", zorder=0)
    wave.text(T / 2 - 0.5, -1.45, "positions above", ha="center", fontsize=10)
    wave.set_xlim(-0.3, 12)
    wave.set_ylim(-1.6, 1.25)
    wave.set_xlabel("position", fontsize=11)
    wave.tick_params(labelsize=10)
    wave.legend(fontsize=10, loc="center left", bbox_to_anchor=(1.02, 0.55), frameon=False,
                title="sine rows of P (cos rows: same\nfrequency, a quarter turn ahead)",
                title_fontsize=10, alignment="left")
    for side in ("top", "right"):
        wave.spines[side].set_visible(False)
    save(fig, "positional_encoding.svg")


# --------------------------------------------------------------------------------------------
def _residual(ax, cx, y_branch, x_side, y_target, box_edge):
    """A residual connection: branch at (cx, y_branch), run beside the sublayer, enter the add."""
    ax.plot([cx], [y_branch], "o", color=INK, ms=5, zorder=3)
    ax.plot([cx, x_side, x_side], [y_branch, y_branch, y_target], color=INK, lw=1.5, zorder=1)
    arrow(ax, (x_side, y_target), (box_edge, y_target), shrink=0.5)


def _block_stack(ax, cx, w, sublayers, y0, x_side):
    """Sublayers bottom to top, each followed by 'add & norm' with a residual around both."""
    ah, nh, gap = 5.0, 3.5, 2.5  # sublayer height, add & norm height, arrow gap
    y = y0
    for label, colour in sublayers:
        y_branch = y - 1.75
        ax.plot([cx, cx], [y - 3.5, y_branch], color=INK, lw=1.5, zorder=1)
        arrow(ax, (cx, y_branch), (cx, y), shrink=0.5)
        box(ax, cx - w / 2, y, w, ah, label, colour, size=12)
        arrow(ax, (cx, y + ah), (cx, y + ah + gap), shrink=0.5)
        y_norm = y + ah + gap
        box(ax, cx - w / 2, y_norm, w, nh, "add & norm", YELLOW, size=12)
        _residual(ax, cx, y_branch, x_side, y_norm + nh / 2, cx + w / 2)
        y = y_norm + nh + 3.5
    return y - 3.5  # top of the last add & norm


def transformer_block() -> None:
    """Encoder and decoder blocks side by side (post-norm, as in the paper); norm placements."""
    fig, ax = canvas(10.0, 7.2, 100, 72)
    w = 19.0
    ex, dx = 17.0, 52.0  # column centres
    attn_colour, ffn_colour = ORANGE, SKY

    for cx, x_left, x_right, title, tokens, nlabel_x in (
            (ex, 4.5, 30.5, "Encoder block", "source tokens", 2.2),
            (dx, 39.5, 65.5, "Decoder block", "target tokens\n(shifted right)", 68.2)):
        ax.add_patch(FancyBboxPatch((x_left, 14), x_right - x_left, 44.5 if cx == dx else 30,
                                    boxstyle="round,pad=0.2,rounding_size=1.0",
                                    facecolor="#f5f5f5", edgecolor=GREY, linewidth=1.2, zorder=0))
        ax.text(nlabel_x, 14 + (44.5 if cx == dx else 30) / 2, "× N", ha="center",
                va="center", fontsize=BASE_FONT, fontweight="bold")
        ax.text(cx, 69.5, title, ha="center", va="center", fontsize=BASE_FONT + 1,
                fontweight="bold")
        box(ax, cx - w / 2, 5, w, 5, "embedding\n+ positions", GREY, size=12)
        ax.text(cx, 3.8, tokens, ha="center", va="top", fontsize=11)
        arrow(ax, (cx, 10), (cx, 13.75), shrink=0.5)

    # encoder: self-attention, feed-forward; residuals on the right of the column
    top = _block_stack(ax, ex, w, [("multi-head\nself-attention", attn_colour),
                                   ("position-wise\nfeed-forward", ffn_colour)], 17.0, 28.8)
    # decoder: masked self-attention, cross-attention, feed-forward
    dtop = _block_stack(ax, dx, w, [("masked multi-head\nself-attention", attn_colour),
                                    ("cross-attention", attn_colour),
                                    ("position-wise\nfeed-forward", ffn_colour)], 17.0, 63.8)
    ax.text(dx + w / 2 + 2.2, 21.0, "residual", ha="left", va="center", fontsize=11,
            rotation=90)
    # the encoder's output is the memory: keys and values of every decoder's cross-attention
    ax.plot([ex, ex, 37.0, 37.0], [top, 48.5, 48.5, 34.0], color=BLUE, lw=2.0, zorder=1)
    arrow(ax, (37.0, 34.0), (dx - w / 2, 34.0), BLUE, lw=2.0, shrink=0.5)
    ax.text((ex + 37.0) / 2, 49.2, "memory (encoder output)", ha="center", va="bottom",
            fontsize=11, color=INK)
    ax.text(36.2, 40.5, "keys,\nvalues", ha="right", va="center", fontsize=11)
    ax.text(dx - 0.8, 30.0, "queries", ha="right", va="center", fontsize=11)
    arrow(ax, (dx, dtop), (dx, 62.5), shrink=0.5)
    ax.text(dx, 63.0, "decoder output (→ linear, softmax)", ha="center", va="bottom",
            fontsize=11)

    # one sublayer, two placements of the LayerNorm
    ax.add_patch(FancyBboxPatch((74.0, 14), 25.6, 44.5, boxstyle="round,pad=0.2,rounding_size=1.0",
                                facecolor="white", edgecolor=GREY, linewidth=1.2, zorder=0))
    ax.text(86.8, 69.5, "One sublayer", ha="center", va="center", fontsize=BASE_FONT + 1,
            fontweight="bold")
    bw = 9.0
    for cx, title, order in ((79.5, "post-norm", ("sublayer", "add", "LayerNorm")),
                             (92.0, "pre-norm", ("LayerNorm", "sublayer", "add"))):
        ax.text(cx + 1.0, 55.5, title, ha="center", va="center", fontsize=12, fontweight="bold")
        ax.text(cx, 20.0, "x", ha="center", va="center", fontsize=12, style="italic")
        y, y_branch = 24.5, 23.0
        ax.plot([cx, cx], [21.2, y_branch], color=INK, lw=1.5)
        for k, name in enumerate(order):
            if name == "add":
                y_add = y + 1.4
                ax.add_patch(plt.Circle((cx, y_add), 1.4, facecolor="white", edgecolor=INK,
                                        linewidth=1.5, zorder=2))
                ax.text(cx, y_add, "+", ha="center", va="center", fontsize=14, zorder=3)
                arrow(ax, (cx, y_branch if k == 0 else y - 2.5), (cx, y), shrink=0.5)
                top_k = y + 2.8
            else:
                colour = YELLOW if name == "LayerNorm" else attn_colour
                arrow(ax, (cx, y_branch if k == 0 else y - 2.5), (cx, y), shrink=0.5)
                box(ax, cx - bw / 2, y, bw, 5.0, name.replace("Layer", "Layer\n"), colour,
                    size=11, style="round,pad=0.02,rounding_size=0.4", lw=1.3)
                top_k = y + 5.0
            y = top_k + 2.5
        arrow(ax, (cx, y - 2.5), (cx, y), shrink=0.5)
        ax.plot([cx], [y_branch], "o", color=INK, ms=5, zorder=3)
        ax.plot([cx, cx + bw / 2 + 1.3, cx + bw / 2 + 1.3], [y_branch, y_branch, y_add],
                color=INK, lw=1.5, zorder=1)
        arrow(ax, (cx + bw / 2 + 1.3, y_add), (cx + 1.4, y_add), shrink=0.5)
    ax.text(86.8, 12.6, "Pre-norm moves each\nLayerNorm to the start\nof its branch. The blocks\n"
            "at left are post-norm.", ha="center", va="top", fontsize=11)
    save(fig, "transformer_block.svg")


def favicon() -> None:
    """The site's icon: three bars for score, normalize, pool (same as ../assets/favicon.svg).

    Written as ``../assets/root/favicon.ico``, which the build copies to the site root, where
    browsers look for it on pages that name no icon (such as the redirecting index.html).
    """
    from PIL import Image, ImageDraw

    size = 64
    image = Image.new("RGBA", (size, size), (0, 0, 0, 0))
    draw = ImageDraw.Draw(image)
    for x, top, colour in ((2, 8, ORANGE), (24, 20, PURPLE), (46, 32, GREEN)):
        draw.rounded_rectangle((x, top, x + 16, 56), radius=4, fill=colour)
    out = HERE.parent / "assets" / "root" / "favicon.ico"
    out.parent.mkdir(parents=True, exist_ok=True)
    image.save(out, format="ICO", sizes=[(16, 16), (32, 32), (48, 48)])
    print("wrote", out)


def main() -> None:
    setup()
    attention_pooling()
    masking()
    multihead()
    positional_encoding()
    transformer_block()
    favicon()


if __name__ == "__main__":
    main()

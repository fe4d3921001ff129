/* Figures a reader can move (d2lattn.interactive.InteractiveFigure).
 *
 * Each <div class="d2lattn-viz"> holds a JSON description: controls, panels, and the numbers of
 * every panel for every combination of control choices, all computed by the chapter's Python
 * code. This script draws the figure from those numbers and redraws it, synchronously, when a
 * control moves: a table lookup, nothing recomputed. Every drawn number carries its value in a
 * data-value attribute, which the site's browser test compares with the JSON.
 * No libraries, no network. Loaded only on pages with such a figure (see _config.yml).
 *
 * The same file is the notebook's live figure (d2lattn.interactive wraps it as an anywidget
 * ES module, which defines D2LATTN_VIZ_EXPORTS before this code runs): then it builds nothing
 * on its own and hands over `render({model, el})`, which draws the figure from the widget's
 * `spec` and, for a figure that recomputes, adds a text box whose text goes to Python.
 */
(function (exports) {
  "use strict";
  var SVG = "http://www.w3.org/2000/svg";
  var COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"];
  // A grid's groups (the requests that own a cache's blocks): one colour each, matplotlib's
  // tab10 without its grey, which would read as "no group".
  var GROUP_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                      "#e377c2", "#bcbd22", "#17becf"];

  function el(tag, attrs, parent, ns) {
    var node = ns ? document.createElementNS(SVG, tag) : document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) {
      if (k === "text") node.textContent = attrs[k];
      else node.setAttribute(k, attrs[k]);
    });
    if (parent) parent.appendChild(node);
    return node;
  }
  function svg(tag, attrs, parent) { return el(tag, attrs, parent, true); }
  function fmt(v, digits) { return Number(v).toFixed(digits); }
  // A grid's entry in a frame: rows of numbers, or {values, labels, groups} (d2lattn.interactive).
  function gridParts(v) {
    return Array.isArray(v) ? { values: v, labels: null, groups: null }
      : { values: v.values, labels: v.labels || null, groups: v.groups || null };
  }

  // The words the script writes itself, in the page's language (a figure's own strings come
  // translated in its data: book/_ext/d2lattn_translate.py).
  var WORDS = {
    en: { colon: ": ", comma: ", ", tableNote: " (its numbers are in the table that follows the figure)",
          points: function (n, lo, hi) { return n + " points, from " + lo + " to " + hi; },
          yourInput: "your own input", recompute: "Recompute", computing: "computing…" },
    zh: { colon: "：", comma: "，", tableNote: "（数值见图后的表格）",
          points: function (n, lo, hi) { return n + " 个点，从 " + lo + " 到 " + hi; },
          yourInput: "你自己的输入", recompute: "重新计算", computing: "正在计算…" }
  };
  function words(spec) {
    var code = String(spec.lang || document.documentElement.lang || "en").slice(0, 2).toLowerCase();
    return WORDS[code] || WORDS.en;
  }

  // Counts are integers in every setting (characters kept, requests running): shown as such,
  // not with the figure's decimals. For a readout, per name; for bars, grids and lines, per
  // panel (d2lattn.interactive.integer_parts decides alike for the static table).
  function integerParts(spec) {
    var out = {};
    var keys = Object.keys(spec.frames);
    var isInt = function (v) {
      return (typeof v === "number" && Math.floor(v) === v) || typeof v === "boolean"; };
    spec.panels.forEach(function (panel) {
      if (panel.type === "readout") {
        var names = {};
        Object.keys(spec.frames[keys[0]][panel.name]).forEach(function (name) {
          names[name] = keys.every(function (k) { return isInt(spec.frames[k][panel.name][name]); });
        });
        out[panel.name] = names;
      } else if (panel.type === "bars" || panel.type === "grid") {
        out[panel.name] = keys.every(function (k) {
          var v = spec.frames[k][panel.name];
          if (panel.type === "grid") v = gridParts(v).values;
          return [].concat.apply([], [v]).every(function (row) {
            return Array.isArray(row) ? row.every(isInt) : isInt(row);
          });
        });
      } else if (panel.type === "scatter") {
        out[panel.name] = keys.every(function (k) {
          return spec.frames[k][panel.name].values.every(isInt);
        });
      } else if (panel.type === "lines") {
        out[panel.name] = keys.every(function (k) {
          var v = spec.frames[k][panel.name];
          return Object.keys(v).every(function (name) { return v[name].every(isInt); });
        });
      }
    });
    return out;
  }
  function fmtAs(v, digits, integer) { return integer ? String(Math.round(v)) : fmt(v, digits); }
  // An axis's end labels: whole numbers without decimals when both ends are whole ("0" to
  // "40" tokens), else both with two ("0.00" to "0.88").
  function axisLabels(ends) {
    var whole = ends.every(function (v) { return Math.floor(v) === v; });
    return ends.map(function (v) { return whole ? String(v) : fmt(v, 2); });
  }

  function drawBars(box, panel, values, digits, integer) {
    var n = values.length, W = Math.max(260, Math.min(640, 34 * n + 50)), H = 170;
    var left = 40, top = 18, bottom = 34, w = (W - left - 10) / n, h = H - top - bottom;
    var lo = panel.ymin !== undefined ? panel.ymin : Math.min(0, Math.min.apply(null, values));
    var hi = panel.ymax !== undefined ? panel.ymax
      : Math.max(integer ? 1 : 1e-9, Math.max.apply(null, values));
    var y = function (v) { return top + h * (hi - v) / (hi - lo); };
    var s = svg("svg", { width: W, height: H, viewBox: "0 0 " + W + " " + H, role: "img" }, box);
    var ends = axisLabels([lo, hi]);
    svg("line", { x1: left, x2: W - 10, y1: y(0), y2: y(0), stroke: "#888" }, s);
    svg("text", { x: left - 4, y: y(hi) + 4, "text-anchor": "end", "font-size": 10,
                  "class": "d2lattn-viz-axis", text: ends[1] }, s);
    svg("text", { x: left - 4, y: y(lo) + 4, "text-anchor": "end", "font-size": 10,
                  "class": "d2lattn-viz-axis", text: ends[0] }, s);
    values.forEach(function (v, i) {
      var x = left + i * w, y0 = y(Math.max(v, 0)), y1 = y(Math.min(v, 0));
      // a bar of a group (a request) in the colour of that group's cells in a grid
      var g = panel.groups ? panel.groups[i] : null, grouped = g !== null && g !== undefined;
      var attrs = { x: x + 2, width: Math.max(1, w - 4), y: y0, height: Math.max(0, y1 - y0),
                    fill: v === 0 ? "#ccc" : grouped ? GROUP_COLORS[g % GROUP_COLORS.length] : COLORS[0],
                    "class": "d2lattn-viz-bar", "data-value": v };
      if (panel.groups) attrs["data-group"] = grouped ? g : "";
      svg("rect", attrs, s);
      if (n <= 24) {
        svg("text", { x: x + w / 2, y: y0 - 3, "text-anchor": "middle", "font-size": 9,
                      "class": "d2lattn-viz-num", "data-value": v, text: fmtAs(v, digits, integer) }, s);
      }
      if (n <= 24 || i % Math.ceil(n / 12) === 0) {
        svg("text", { x: x + w / 2, y: H - bottom + 14, "text-anchor": "middle", "font-size": 10,
                      text: String(panel.labels[i]) }, s);
      }
    });
  }

  // A grid's legend, under it: one swatch per group, then the cells of no group.
  function legendItems(panel) {
    var items = (panel.groups || []).map(function (name, g) {
      return { name: String(name), fill: GROUP_COLORS[g % GROUP_COLORS.length], free: false };
    });
    if (panel.groups && panel.ungrouped) items.push({ name: panel.ungrouped, fill: "#fff", free: true });
    return items;
  }
  function layoutLegend(items, width) {
    var x = 0, y = 0, placed = [];
    items.forEach(function (it) {
      var w = 18 + 7 * Array.from(it.name).reduce(function (n, ch) {  // CJK characters are wide
        return n + (ch.charCodeAt(0) > 0x2e80 ? 1.6 : 1); }, 0) + 10;
      if (x > 0 && x + w > width) { x = 0; y += 16; }
      placed.push({ item: it, x: x, y: y });
      x += w;
    });
    return { placed: placed, height: items.length ? y + 16 : 0 };
  }

  function drawGrid(box, panel, value, digits, integer) {
    var parts = gridParts(value), rows = parts.values, labels = parts.labels, groups = parts.groups;
    var nr = rows.length, nc = rows[0].length, cell = Math.max(18, Math.min(40, 360 / nc));
    var left = 8 + 7 * Math.max.apply(null, panel.rows.map(function (r) { return String(r).length; }));
    var legend = layoutLegend(legendItems(panel), nc * cell);
    var top = 22, W = left + nc * cell + 8, H = top + nr * cell + 8 + (legend.height ? legend.height + 6 : 0);
    var vmax = panel.vmax || Math.max(1e-9, Math.max.apply(null, rows.map(function (r) {
      return Math.max.apply(null, r.map(Math.abs)); })));
    var s = svg("svg", { width: W, height: H, viewBox: "0 0 " + W + " " + H, role: "img" }, box);
    panel.cols.slice(0, nc).forEach(function (c, j) {
      svg("text", { x: left + (j + 0.5) * cell, y: top - 6, "text-anchor": "middle",
                    "font-size": 10, text: String(c) }, s);
    });
    rows.forEach(function (row, i) {
      svg("text", { x: left - 4, y: top + (i + 0.6) * cell, "text-anchor": "end",
                    "font-size": 10, text: String(panel.rows[i]) }, s);
      row.forEach(function (v, j) {
        var on = panel.boolean ? (v ? 1 : 0) : Math.abs(v) / vmax;
        var color = COLORS[0], opacity = 0.08 + 0.92 * on, g = groups ? groups[i][j] : null;
        var label = labels ? labels[i][j] : null;
        var attrs = { x: left + j * cell, y: top + i * cell, width: cell - 1, height: cell - 1,
                      fill: color, "fill-opacity": opacity, stroke: "#ddd",
                      "class": "d2lattn-viz-cell", "data-value": v };
        if (groups) {
          // a group's cells in its colour (shaded by the value, never too faint to name the
          // colour); a cell of no group white, with a dashed edge
          attrs["data-group"] = g === null ? "" : g;
          if (g === null) {
            color = "#fff"; opacity = 1;
            attrs.fill = color; attrs["fill-opacity"] = 1; attrs.stroke = "#999";
            attrs["stroke-dasharray"] = "3 2";
          } else {
            color = GROUP_COLORS[g % GROUP_COLORS.length]; opacity = 0.3 + 0.7 * on;
            attrs.fill = color; attrs["fill-opacity"] = opacity;
          }
        }
        if (labels) attrs["data-label"] = label;
        svg("rect", attrs, s);
        if (labels) {
          if (label) {
            svg("text", { x: left + (j + 0.5) * cell, y: top + (i + 0.62) * cell,
                          "text-anchor": "middle", "font-size": cell >= 26 ? 10 : 9,
                          fill: textOn(color, opacity), "class": "d2lattn-viz-cell-label",
                          "data-label": label, text: label }, s);
          }
        } else if (!panel.boolean && cell >= 26) {
          svg("text", { x: left + (j + 0.5) * cell, y: top + (i + 0.62) * cell,
                        "text-anchor": "middle", "font-size": 9,
                        fill: textOn(COLORS[0], panel.boolean ? (v ? 1 : 0.08) : 0.08 + 0.92 * on),
                        "class": "d2lattn-viz-num", "data-value": v,
                        text: fmtAs(v, Math.min(digits, 2), integer) }, s);
        }
      });
    });
    var ly = top + nr * cell + 12;
    legend.placed.forEach(function (p) {
      var x = left + p.x, y = ly + p.y;
      var sw = { x: x, y: y, width: 12, height: 12, fill: p.item.fill, stroke: p.item.free ? "#999" : "none",
                 "class": "d2lattn-viz-legend" };
      if (p.item.free) sw["stroke-dasharray"] = "3 2";
      svg("rect", sw, s);
      svg("text", { x: x + 16, y: y + 10, "font-size": 10, fill: "#222", text: p.item.name }, s);
    });
  }

  function drawLines(box, panel, series) {
    var W = 470, H = 210, left = 40, right = 120, top = 10, bottom = 26;
    var xs = panel.x, all = [];
    var stat = panel.static || [], pts = panel.points;
    stat.forEach(function (sr) { all = all.concat(sr.y); });
    Object.keys(series).forEach(function (k) { all = all.concat(series[k]); });
    if (pts) all = all.concat(pts.y);
    var lo = panel.ymin !== undefined ? panel.ymin : Math.min.apply(null, all);
    var hi = panel.ymax !== undefined ? panel.ymax : Math.max.apply(null, all);
    if (hi - lo < 1e-9) { hi = lo + 1; }
    var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs);
    var X = function (v) { return left + (W - left - right) * (v - x0) / (x1 - x0 || 1); };
    var Y = function (v) { return top + (H - top - bottom) * (hi - v) / (hi - lo); };
    var s = svg("svg", { width: W, height: H, viewBox: "0 0 " + W + " " + H, role: "img" }, box);
    svg("rect", { x: left, y: top, width: W - left - right, height: H - top - bottom, fill: "none", stroke: "#bbb" }, s);
    var ends = axisLabels([lo, hi]);
    [lo, hi].forEach(function (v, i) {
      svg("text", { x: left - 4, y: Y(v) + 4, "text-anchor": "end", "font-size": 10,
                    "class": "d2lattn-viz-axis", text: ends[i] }, s);
    });
    [x0, x1].forEach(function (v) {
      svg("text", { x: X(v), y: H - 8, "text-anchor": "middle", "font-size": 10, text: String(+v.toFixed(2)) }, s);
    });
    if (pts) {
      pts.x.forEach(function (px, i) {
        svg("circle", { cx: X(px), cy: Y(pts.y[i]), r: 2, fill: "#999" }, s);
      });
    }
    var legend = 0;
    function line(label, ys, color, dash, dynamic) {
      var d = ys.map(function (v, i) { return (i ? "L" : "M") + X(xs[i]).toFixed(1) + "," + Y(v).toFixed(1); }).join("");
      var p = svg("path", { d: d, fill: "none", stroke: color, "stroke-width": 1.8 }, s);
      if (dash) p.setAttribute("stroke-dasharray", "4 3");
      if (dynamic) { p.setAttribute("class", "d2lattn-viz-line"); p.setAttribute("data-label", label);
                     p.setAttribute("data-value", JSON.stringify(ys)); }
      var ly = top + 12 + 14 * legend++;
      var swatch = svg("line", { x1: W - right + 4, x2: W - right + 16, y1: ly - 4, y2: ly - 4,
                                 stroke: color, "stroke-width": 2.5 }, s);
      if (dash) swatch.setAttribute("stroke-dasharray", "4 3");
      svg("text", { x: W - right + 20, y: ly, "font-size": 10, fill: "#222", text: label }, s);
    }
    stat.forEach(function (sr) { line(sr.label, sr.y, "#555", true, false); });
    Object.keys(series).forEach(function (k, i) { line(k, series[k], COLORS[i % COLORS.length], false, true); });
  }

  // A picture of points (a point cloud seen from one side): every point small and grey; the
  // frame's focus point a black cross; each of the frame's points joined to it and filled in
  // the first colour, from pale (0) to full (vmax), with its value in data-value.
  function drawScatter(box, panel, value, digits, integer) {
    var W = 300, H = 300, pad = 12, legendH = 30;
    var xs = panel.x, ys = panel.y;
    var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs);
    var y0 = Math.min.apply(null, ys), y1 = Math.max.apply(null, ys);
    var scale = Math.min((W - 2 * pad) / (x1 - x0 || 1), (H - legendH - 2 * pad) / (y1 - y0 || 1));
    var cx = (W - scale * (x1 - x0)) / 2, cy = (H - legendH - scale * (y1 - y0)) / 2;
    var X = function (i) { return cx + scale * (xs[i] - x0); };
    var Y = function (i) { return cy + scale * (y1 - ys[i]); };  // y up, as in a plot
    var vmax = panel.vmax || Math.max(1e-9, Math.max.apply(null, value.values.map(Math.abs)));
    var s = svg("svg", { width: W, height: H, viewBox: "0 0 " + W + " " + H, role: "img" }, box);
    var coloured = {};
    value.points.forEach(function (j) { coloured[j] = true; });
    xs.forEach(function (_, i) {
      if (!coloured[i]) svg("circle", { cx: X(i), cy: Y(i), r: 2.2, fill: "#aaa", "class": "d2lattn-viz-point" }, s);
    });
    var f = value.focus;
    value.points.forEach(function (j) {
      if (j !== f) svg("line", { x1: X(f), y1: Y(f), x2: X(j), y2: Y(j), stroke: "#999", "stroke-width": 0.8 }, s);
    });
    value.points.forEach(function (j, k) {
      var v = value.values[k], on = Math.min(1, Math.abs(v) / vmax);
      svg("circle", { cx: X(j), cy: Y(j), r: 5.5, fill: COLORS[0], "fill-opacity": 0.08 + 0.92 * on,
                      stroke: "#123", "stroke-width": 0.8, "class": "d2lattn-viz-dot",
                      "data-index": j, "data-value": v }, s);
    });
    var d = 6, fx = X(f), fy = Y(f);
    var cross = svg("g", { "class": "d2lattn-viz-focus", "data-index": f }, s);
    svg("line", { x1: fx - d, y1: fy - d, x2: fx + d, y2: fy + d, stroke: "#000", "stroke-width": 2.2 }, cross);
    svg("line", { x1: fx - d, y1: fy + d, x2: fx + d, y2: fy - d, stroke: "#000", "stroke-width": 2.2 }, cross);
    // the colour scale: 0 to vmax
    var ly = H - legendH + 8, lx = 40, lw = W - 80, steps = 10;
    for (var t = 0; t < steps; t++) {
      svg("rect", { x: lx + t * lw / steps, y: ly, width: lw / steps, height: 8, fill: COLORS[0],
                    "fill-opacity": 0.08 + 0.92 * (t + 0.5) / steps }, s);
    }
    var ends = axisLabels([0, vmax]);
    svg("text", { x: lx - 4, y: ly + 8, "text-anchor": "end", "font-size": 10, "class": "d2lattn-viz-axis", text: ends[0] }, s);
    svg("text", { x: lx + lw + 4, y: ly + 8, "font-size": 10, "class": "d2lattn-viz-axis", text: ends[1] }, s);
  }

  function drawReadout(box, values, digits, integers) {
    var t = el("table", { "class": "d2lattn-viz-readout" }, box);
    Object.keys(values).forEach(function (k) {
      var tr = el("tr", {}, t);
      el("td", { text: k }, tr);
      el("td", { "class": "d2lattn-viz-num", "data-value": values[k],
                 text: fmtAs(values[k], digits, integers && integers[k]) }, tr);
    });
  }

  /* Accessibility and legibility (kept apart from the drawing code) --------------------------- */

  // WCAG relative luminance of "#rrggbb", and the text colour (black or white) with the higher
  // contrast on that colour laid over white with the given opacity: at least 4.5:1 for COLORS[0].
  function luminance(rgb) {
    return rgb.reduce(function (acc, c, i) {
      c /= 255;
      c = c <= 0.03928 ? c / 12.92 : Math.pow((c + 0.055) / 1.055, 2.4);
      return acc + [0.2126, 0.7152, 0.0722][i] * c;
    }, 0);
  }
  function textOn(hex, opacity) {
    var rgb = [1, 3, 5].map(function (i) {
      return 255 + (parseInt(hex.substr(i, 2), 16) - 255) * opacity;
    });
    var L = luminance(rgb);
    return (1.05 / (L + 0.05)) > ((L + 0.05) / 0.05) ? "#fff" : "#000";
  }

  // Hidden from sight, present for screen readers (the usual "visually hidden" rules).
  function hideVisually(node) {
    node.classList.add("d2lattn-visually-hidden");
  }

  function settingText(spec, choice) {
    return spec.controls.map(function (c, k) { return c.label + " = " + c.values[choice[k]]; })
      .join(words(spec).comma);
  }

  // A slider announces the value it stands for ("β = 1.0"), not its position ("2").
  function sliderValueText(input, c, i) {
    input.setAttribute("aria-valuetext", c.label + " = " + c.values[i]);
  }

  // Each chart is an image with a name: the figure, the panel and the setting drawn.
  function labelCharts(root, spec, choice) {
    var setting = settingText(spec, choice);
    root.setAttribute("role", "figure");
    root.setAttribute("aria-label", spec.title);
    Array.prototype.forEach.call(root.querySelectorAll(".d2lattn-viz-panel"), function (box) {
      var title = box.querySelector(".d2lattn-viz-panel-title");
      var chart = box.querySelector("svg");
      if (!chart) return;
      var w = words(spec);
      chart.setAttribute("aria-label", spec.title + w.colon + (title ? title.textContent + w.comma : "")
                         + setting + w.tableNote);
    });
  }

  // The numbers of the setting drawn, as tables, in the visually hidden fallback.
  function describe(root, spec, choice, frame, box, integers) {
    var w = words(spec);
    var f = function (v, integer) { return fmtAs(v, spec.digits, integer); };
    box.textContent = "";
    el("p", { text: spec.title + " (" + settingText(spec, choice) + ")" }, box);
    spec.panels.forEach(function (panel) {
      var v = frame[panel.name];
      var t = el("table", {}, box);
      el("caption", { text: panel.title || panel.name }, t);
      if (panel.type === "bars") {
        v.forEach(function (x, i) {
          var tr = el("tr", {}, t);
          el("th", { scope: "row", text: String(panel.labels[i]) }, tr);
          el("td", { text: f(x, integers[panel.name]) }, tr);
        });
      } else if (panel.type === "grid") {
        var parts = gridParts(v), head = el("tr", {}, t);
        el("td", {}, head);
        panel.cols.slice(0, parts.values[0].length).forEach(function (c) {
          el("th", { scope: "col", text: String(c) }, head);
        });
        parts.values.forEach(function (row, i) {
          var tr = el("tr", {}, t);
          el("th", { scope: "row", text: String(panel.rows[i]) }, tr);
          row.forEach(function (x, j) {
            // as the static table (d2lattn.interactive): the cell's label, else its group's
            // name, then its number
            var number = panel.boolean ? (x ? "1" : "0") : f(x, integers[panel.name]);
            var name = parts.labels ? parts.labels[i][j] : "";
            if (!name && parts.groups) {
              var g = parts.groups[i][j];
              name = g === null ? (panel.ungrouped || "") : panel.groups[g];
            }
            el("td", { text: name ? name + " (" + number + ")" : number }, tr);
          });
        });
      } else if (panel.type === "scatter") {
        // as the static table (d2lattn.interactive): the marked point, then each coloured one
        var first = el("tr", {}, t);
        el("th", { scope: "row", text: "×" }, first);
        el("td", { text: String(v.focus) }, first);
        v.points.forEach(function (j, k) {
          var tr = el("tr", {}, t);
          el("th", { scope: "row", text: String(j) }, tr);
          el("td", { text: f(v.values[k], integers[panel.name]) }, tr);
        });
      } else if (panel.type === "lines") {
        Object.keys(v).forEach(function (name) {
          var ys = v[name], tr = el("tr", {}, t);
          el("th", { scope: "row", text: name }, tr);
          el("td", { text: w.points(ys.length, f(Math.min.apply(null, ys), integers[panel.name]),
                                    f(Math.max.apply(null, ys), integers[panel.name])) }, tr);
        });
      } else {
        Object.keys(v).forEach(function (name) {
          var tr = el("tr", {}, t);
          el("th", { scope: "row", text: name }, tr);
          el("td", { text: f(v[name], (integers[panel.name] || {})[name]) }, tr);
        });
      }
    });
  }

  // Tokens to choose from: a radio group. Click or tap a token, or focus the group (Tab) and
  // move with the arrow keys, Home and End; hovering or tabbing past changes nothing.
  function tokenRadioGroup(wrap, c, initial, onPick) {
    var group = el("span", { role: "radiogroup", "aria-label": c.label,
                             "class": "d2lattn-viz-tokens" }, wrap);
    var chips = [], current = initial;
    function pick(i, focus) {
      current = i;
      chips.forEach(function (ch, j) {
        ch.classList.toggle("d2lattn-viz-active", j === i);
        ch.setAttribute("aria-checked", j === i ? "true" : "false");
        ch.setAttribute("tabindex", j === i ? "0" : "-1");
      });
      if (focus) chips[i].focus();
      onPick(i);
    }
    c.values.forEach(function (v, i) {
      var chip = el("span", { "class": "d2lattn-viz-token", role: "radio", "data-index": i,
                              "aria-checked": i === initial ? "true" : "false",
                              tabindex: i === initial ? 0 : -1, text: v }, group);
      chips.push(chip);
      chip.addEventListener("click", function () { pick(i, false); });
    });
    chips[initial].classList.add("d2lattn-viz-active");
    group.addEventListener("keydown", function (e) {
      var n = chips.length, next = null;
      if (e.key === "ArrowRight" || e.key === "ArrowDown") next = (current + 1) % n;
      else if (e.key === "ArrowLeft" || e.key === "ArrowUp") next = (current + n - 1) % n;
      else if (e.key === "Home") next = 0;
      else if (e.key === "End") next = n - 1;
      else if (e.key === " " || e.key === "Enter") next = current;
      if (next === null) return;
      e.preventDefault();
      pick(next, true);
    });
  }

  // root: a .d2lattn-viz element; spec: its data, read from the JSON inside it when not given.
  function build(root, spec) {
    if (!spec) {
      var dataNode = root.querySelector("script.d2lattn-viz-data");
      if (!dataNode || root.getAttribute("data-ready")) return;
      spec = JSON.parse(dataNode.textContent);
    }
    var fallback = root.querySelector(".d2lattn-viz-fallback");
    if (fallback) hideVisually(fallback);
    var choice = spec.controls.map(function (c) { return c.initial || 0; });
    var integers = integerParts(spec);
    el("div", { "class": "d2lattn-viz-title", text: spec.title }, root);
    var controls = el("div", { "class": "d2lattn-viz-controls" }, root);
    var panels = el("div", { "class": "d2lattn-viz-panels" }, root);
    if (spec.caption) el("div", { "class": "d2lattn-viz-caption", text: spec.caption }, root);

    function redraw() {
      var frame = spec.frames[choice.join(",")];
      if (fallback) describe(root, spec, choice, frame, fallback, integers);
      root.setAttribute("data-frame", choice.join(","));
      panels.textContent = "";
      spec.panels.forEach(function (panel) {
        var box = el("div", { "class": "d2lattn-viz-panel", "data-panel": panel.name }, panels);
        if (panel.title) el("div", { "class": "d2lattn-viz-panel-title", text: panel.title }, box);
        var v = frame[panel.name];
        if (panel.type === "bars") drawBars(box, panel, v, spec.digits, integers[panel.name]);
        else if (panel.type === "grid") drawGrid(box, panel, v, spec.digits, integers[panel.name]);
        else if (panel.type === "lines") drawLines(box, panel, v);
        else if (panel.type === "scatter") drawScatter(box, panel, v, spec.digits, integers[panel.name]);
        else drawReadout(box, v, spec.digits, integers[panel.name]);
      });
      labelCharts(root, spec, choice);
    }

    spec.controls.forEach(function (c, k) {
      var wrap = el("label", { "class": "d2lattn-viz-control", "data-control": c.name }, controls);
      el("span", { text: c.label + words(spec).colon }, wrap);
      if (c.type === "tokens") {
        tokenRadioGroup(wrap, c, choice[k], function (i) { choice[k] = i; redraw(); });
      } else if (c.type === "select") {
        var sel = el("select", { "aria-label": c.label }, wrap);
        c.values.forEach(function (v, i) { el("option", { value: i, text: v }, sel); });
        sel.value = String(choice[k]);
        sel.addEventListener("change", function () { choice[k] = Number(sel.value); redraw(); });
      } else {
        var input = el("input", { type: "range", min: 0, max: c.values.length - 1, step: 1,
                                  value: choice[k], "aria-label": c.label }, wrap);
        var shown = el("output", { text: c.values[choice[k]], "aria-hidden": "true" }, wrap);
        sliderValueText(input, c, choice[k]);
        input.addEventListener("input", function () {
          choice[k] = Number(input.value);
          shown.textContent = c.values[choice[k]];
          sliderValueText(input, c, choice[k]);
          redraw();
        });
      }
    });
    redraw();
    root.setAttribute("data-ready", "1");
  }

  /* The notebook's widget (anywidget): the figure from the model's `spec`, drawn again when
     Python sends a new one; for a figure that recomputes (`input` has a value), a text box and
     a button send the reader's text as `query`, and `message` says what went wrong. */
  function render(ctx) {
    var model = ctx.model, host = ctx.el, input = model.get("input") || {}, status = null;
    var w = words(model.get("spec"));
    host.classList.add("d2lattn-viz-widget");
    // The figure's controls keep their keys: JupyterLab's shortcuts (arrows move between
    // cells in command mode, A/B add cells...) are suppressed inside the figure (Lumino reads
    // data-lm-suppress-shortcuts), and a key pressed on a control goes no further than it.
    host.setAttribute("data-lm-suppress-shortcuts", "true");
    host.addEventListener("keydown", function (e) {
      if (e.target !== host && e.target.closest &&
          e.target.closest("input, select, textarea, button, [role=radio], [role=radiogroup]")) {
        e.stopPropagation();
      }
    });
    if (typeof input.value === "string") {
      // data-lm-suppress-shortcuts: JupyterLab's keys (Enter, A, Shift+Enter...) stay out
      var form = el("form", { "class": "d2lattn-viz-input", "data-lm-suppress-shortcuts": "true" }, host);
      var id = "d2lattn-viz-input-" + Math.random().toString(36).slice(2);
      el("label", { "for": id, text: w.yourInput + w.colon }, form);
      var box = el("textarea", { id: id, rows: 2, spellcheck: "false" }, form);
      box.value = input.value || "";
      el("button", { type: "submit", text: w.recompute }, form);
      status = el("p", { "class": "d2lattn-viz-message", role: "status", "aria-live": "polite" }, host);
      form.addEventListener("submit", function (e) {
        e.preventDefault();
        status.textContent = w.computing;
        model.set("query", box.value);
        model.save_changes();
      });
      // Enter starts a new line (written here: JupyterLab takes a plain Enter for itself);
      // Shift+Enter or Ctrl+Enter (Cmd+Enter) sends, as it runs a cell
      box.addEventListener("keydown", function (e) {
        if (e.key !== "Enter" || e.altKey || e.isComposing) return;
        e.preventDefault();
        e.stopPropagation();
        if (e.shiftKey || e.ctrlKey || e.metaKey) {
          form.requestSubmit ? form.requestSubmit() : form.dispatchEvent(new Event("submit"));
        } else {
          box.setRangeText("\n", box.selectionStart, box.selectionEnd, "end");
        }
      });
    }
    var holder = el("div", {}, host);
    function draw() {
      holder.textContent = "";
      var root = el("div", { "class": "d2lattn-viz" }, holder);
      el("div", { "class": "d2lattn-viz-fallback" }, root);
      build(root, model.get("spec"));
    }
    function answered() { if (status) status.textContent = model.get("message"); }
    draw();
    answered();
    model.on("change:spec", draw);
    model.on("change:revision", answered);
    return function () {
      model.off("change:spec", draw);
      model.off("change:revision", answered);
    };
  }

  if (exports) {  // the notebook's widget: build on request only
    exports.render = render;
    return;
  }
  function buildAll() {
    Array.prototype.forEach.call(document.querySelectorAll(".d2lattn-viz"),
                                 function (root) { build(root); });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", buildAll);
  else buildAll();
})(typeof D2LATTN_VIZ_EXPORTS === "undefined" ? null : D2LATTN_VIZ_EXPORTS);

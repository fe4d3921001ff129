/* Chapter 12's GPT in the page: a forward pass of d2lattn.gpt.GPT, in plain JavaScript.
 *
 * The model is the one chapter 12 trains and ships (book/data/ch12_gpt_<corpus>.pt, float16);
 * the site's build exports it to _static/d2lattn-lm/<corpus>.js (book/_ext/d2lattn_lm.py), a
 * script that registers the configuration, vocabulary, tensor offsets and the float16 tensors.
 * Nothing is loaded with the page: the script comes when the reader presses Generate (or calls
 * the API below), from the site itself, served or opened from disk. No library, no network.
 *
 * The forward pass (d2lattn/gpt.py, transformer.py, multihead.py, positional.py):
 *   x = E[token]                                   (+ P[position] for learned positions)
 *   per block (pre-norm): x += W_o MHA(LN1 x),   x += W_2 GELU(W_1 LN2 x + b_1) + b_2
 *   MHA: per head of size d_h, q and k rotated by RoPE, pairs (2i, 2i+1) of the head turned by
 *        the angle pos * base^(-2i/d_h); softmax(q k^T / sqrt(d_h)) over the keys <= the query
 *   logits = LN(x) E^T                             (the read-out tied to the embedding)
 * GELU is the exact one, x * (1 + erf(x / sqrt 2)) / 2; LayerNorm's epsilon comes from the
 * manifest. Weights are the float16 values, activations are float64: the logits equal
 * PyTorch's float32 ones to about 1e-5 (tests/test_lm_widget.py checks <= 1e-3).
 * Writing, the widget keeps a KV cache of block_size positions: one position costs the same
 * however long the text. Past block_size the cache rolls (the oldest position is dropped and the
 * rotary positions run on), which is not the same as re-running the last block_size characters:
 * the kept keys were computed with older text in view (chapter 15); the page says so.
 *
 * API (for the browser's console and for tests):
 *   d2lattnLM.nextLogits(corpus, text) -> Promise<Float32Array>   the V next-character logits
 *       after `text`, for corpus "shakespeare" or "tang": GPT(tokens)[0, -1] in PyTorch. The
 *       promise rejects (RangeError) for an unknown corpus, an empty text, a text longer than
 *       the model's context (block_size) or a character not in the vocabulary.
 *   d2lattnLM.load(corpus) -> Promise<{config, vocab}>   load (once) and describe a model.
 *   d2lattnLM.attention(corpus, text) -> Promise<Array>  [layer][head] -> Float32Array(T), the
 *       attention weights of the last position over the text.
 *   d2lattnLM.nextTokenProbs(logits, temperature, topK, topP) -> Float64Array   the sampling
 *       distribution of d2lattn.gpt.next_token_probs: logits / temperature, then top-k (null:
 *       off; ties at the k-th value go to the lower index), then top-p (null: off), softmax.
 *       Temperature 0 is greedy: all the mass on the argmax (ties: the lower index). A
 *       temperature below 0, a top-k outside [1, V] or a top-p outside (0, 1] throws.
 *       The widget samples from it; its bars show its largest entries.
 */
(function () {
  "use strict";
  var CORPORA = ["shakespeare", "tang"];
  var script = document.currentScript;
  var BASE = (script && script.src ? script.src.replace(/[^\/]*$/, "") : "_static/") + "d2lattn-lm/";

  // --- strings, by the page's language -----------------------------------------------------
  var STRINGS = {
    en: {
      title: "Write with the chapter's GPT",
      intro: "The model trained in this chapter runs in your browser: type a prompt and press " +
             "Generate. The weights are downloaded from this site when you first press it; " +
             "nothing is sent anywhere.",
      model: "Model", shakespeare: "Shakespeare (65 characters)", tang: "Tang poems (traditional characters)",
      prompt: "Prompt", temperature: "Temperature (0: greedy)", topk: "Top-k (0: off)",
      topp: "Top-p (1: off)", length: "Characters to write", generate: "Generate", stop: "Stop",
      output: "Text (prompt, then the model's characters)",
      probs: "Next character, with these settings", attention: "Attention of the last position",
      layer: "Layer", head: "Head",
      loading: "Loading the model…", loaded: "Model loaded: {mb} MB in {s} s.",
      failed: "The model could not be loaded: {e}",
      writing: "Writing…", done: "Wrote {n} characters.", stopped: "Stopped after {n} characters.",
      unknown: "Not in the model's vocabulary: {c}", empty: "Type a prompt first.",
      cropped: "Only the last {n} characters are read (the model's context).",
      most: "Most attended: {list}.", press: "Press Generate to load the model.",
      missing: "The model's file {f} is not on this site. The site's build writes it " +
               "(python tools/book.py build).",
      badTemperature: "Temperature: a number from 0 (always the most likely character) up.",
      badTopk: "Top-k: a whole number, 0 to switch the filter off.",
      badTopp: "Top-p: a number above 0 and at most 1 (1 switches the filter off).",
      traditional: "The Tang model knows traditional characters; simplified ones it knows in " +
                   "their traditional form are converted.",
      mapped: "Simplified characters read in their traditional form: {list}.",
      rolling: "The context is full ({n} characters): from now on the model keeps its cache and " +
               "drops the oldest position, so each new character reads the last {n} positions, " +
               "whose keys were computed while older text was still in view (a rolling cache, " +
               "chapter 15), not a fresh run over the last {n} characters.",
      api: "From the browser's console: await d2lattnLM.nextLogits(\"shakespeare\", \"ROMEO:\") " +
           "gives the next-character logits (see the chapter)."
    },
    zh: {
      title: "用本章的 GPT 写作",
      intro: "本章训练的模型在你的浏览器中运行：输入提示，按“生成”。第一次按下时从本站下载权重；" +
             "不向任何地方发送数据。",
      model: "模型", shakespeare: "莎士比亚（65 个字符）", tang: "唐诗（繁体字）",
      prompt: "提示", temperature: "温度（0 表示贪心）", topk: "top-k（0 表示不用）",
      topp: "top-p（1 表示不用）", length: "生成的字符数", generate: "生成", stop: "停止",
      output: "文本（提示，然后是模型写的字符）",
      probs: "下一个字符（按当前设置）", attention: "最后一个位置的注意力",
      layer: "层", head: "头",
      loading: "正在加载模型…", loaded: "模型已加载：{mb} MB，用时 {s} 秒。",
      failed: "无法加载模型：{e}",
      writing: "正在生成…", done: "生成了 {n} 个字符。", stopped: "已停止，生成了 {n} 个字符。",
      unknown: "不在模型的词表中：{c}", empty: "请先输入提示。",
      cropped: "只读入最后 {n} 个字符（模型的上下文）。",
      most: "注意力最大的位置：{list}。", press: "按“生成”加载模型。",
      missing: "本站没有模型文件 {f}。它由网站的构建写出（python tools/book.py build）。",
      badTemperature: "温度：从 0（总是取最可能的字符）起的数。",
      badTopk: "top-k：整数，0 表示不用这个过滤。",
      badTopp: "top-p：大于 0、不大于 1 的数（1 表示不用这个过滤）。",
      traditional: "唐诗模型认识的是繁体字；它认识其繁体形式的简体字会被自动转换。",
      mapped: "以下简体字按繁体字读入：{list}。",
      rolling: "上下文已满（{n} 个字符）：此后模型保留它的缓存，丢掉最早的位置，所以每个新字符读的是" +
               "最近的 {n} 个位置，而这些位置的键是在更早的文本仍在视野内时算出的（滚动缓存，见第 15 章），" +
               "并不等于对最后 {n} 个字符重新运行一遍。",
      api: "在浏览器的控制台中：await d2lattnLM.nextLogits(\"shakespeare\", \"ROMEO:\") " +
           "给出下一个字符的 logits（见本章）。"
    }
  };
  var DEFAULTS = {
    shakespeare: { prompt: "ROMEO:\n", length: 120 },
    tang: { prompt: "\n\u6625", length: 40 }
  };
  function lang() {
    return (document.documentElement.lang || "en").toLowerCase().indexOf("zh") === 0 ? "zh" : "en";
  }
  function t(key, args) {
    var s = STRINGS[lang()][key];
    Object.keys(args || {}).forEach(function (k) { s = s.split("{" + k + "}").join(String(args[k])); });
    return s;
  }

  // --- float16 and erf -------------------------------------------------------------------
  var F16 = null;
  function f16table() {
    if (F16) return F16;
    F16 = new Float32Array(65536);
    for (var h = 0; h < 65536; h++) {
      var s = h & 0x8000 ? -1 : 1, e = (h >> 10) & 0x1f, m = h & 0x3ff;
      F16[h] = e === 0 ? s * m * Math.pow(2, -24)
        : e === 31 ? (m ? NaN : s * Infinity) : s * (1 + m / 1024) * Math.pow(2, e - 15);
    }
    return F16;
  }
  // erf to double precision: its Taylor series for |z| < 3, erfc's continued fraction above
  function erf(z) {
    var a = Math.abs(z), r;
    if (a < 3) {
      var term = a, sum = a, z2 = a * a;
      for (var n = 1; n < 80; n++) {
        term *= -z2 / n;
        var add = term / (2 * n + 1);
        sum += add;
        if (Math.abs(add) < 1e-17 * Math.abs(sum)) break;
      }
      r = 2 / Math.sqrt(Math.PI) * sum;
    } else {
      var f = a;
      for (var k = 60; k >= 1; k--) f = a + (k / 2) / f;
      r = 1 - Math.exp(-a * a) / (Math.sqrt(Math.PI) * f);
    }
    return z < 0 ? -r : r;
  }
  function gelu(x) { return 0.5 * x * (1 + erf(x / Math.SQRT2)); }

  // --- the model -------------------------------------------------------------------------
  function Model(manifest, buffer) {
    var c = manifest.config, table = f16table(), raw = new Uint16Array(buffer);
    this.manifest = manifest;
    this.config = c;
    this.vocab = manifest.vocab;
    this.fromSimplified = manifest.from_simplified || {};
    this.stoi = new Map();
    for (var i = 0; i < this.vocab.length; i++) this.stoi.set(this.vocab[i], i);
    this.d = c.num_hiddens; this.h = c.num_heads; this.dh = c.num_hiddens / c.num_heads;
    this.L = c.num_layers; this.F = c.ffn_num_hiddens; this.V = c.vocab_size; this.T = c.block_size;
    this.eps = manifest.layer_norm_eps;
    this.rotaryBase = manifest.rotary_base;
    var W = {};
    manifest.tensors.forEach(function (tt) {
      var n = tt.shape.reduce(function (a, b) { return a * b; }, 1), out = new Float32Array(n);
      for (var j = 0; j < n; j++) out[j] = table[raw[tt.offset + j]];
      W[tt.name] = out;
    });
    this.W = W;
    this.head = c.tie_weights ? W["embedding.weight"] : W["head.weight"];
    // RoPE angles in float64, cos and sin rounded to float32 as rotary_embedding does
    var half = this.dh / 2;
    this.cos = new Float64Array(this.T * half); this.sin = new Float64Array(this.T * half);
    for (var p = 0; p < this.T; p++) {
      for (var q = 0; q < half; q++) {
        var angle = p * Math.pow(manifest.rotary_base, -(2 * q) / this.dh);
        this.cos[p * half + q] = Math.fround(Math.cos(angle));
        this.sin[p * half + q] = Math.fround(Math.sin(angle));
      }
    }
  }
  // Characters to ids. A simplified Chinese character that the model knows only in its
  // traditional form (the Tang poems) is read as that form (manifest.from_simplified, OpenCC's
  // table): `mapped` lists the pairs.
  Model.prototype.encode = function (text) {
    var chars = Array.from(text), ids = [], bad = [], mapped = [], simple = this.fromSimplified;
    for (var i = 0; i < chars.length; i++) {
      var id = this.stoi.get(chars[i]);
      if (id === undefined && simple[chars[i]] !== undefined) {
        id = this.stoi.get(simple[chars[i]]);
        if (mapped.indexOf(chars[i] + simple[chars[i]]) < 0) mapped.push(chars[i] + simple[chars[i]]);
      }
      if (id === undefined) { if (bad.indexOf(chars[i]) < 0) bad.push(chars[i]); } else ids.push(id);
    }
    return { ids: ids, bad: bad, mapped: mapped };
  };
  // The KV cache: block_size slots per layer, position p in slot p mod block_size. Once p
  // reaches block_size the oldest position is overwritten: a rolling cache (chapter 15).
  Model.prototype.newState = function () {
    var s = { len: 0, K: [], Vv: [], dots: 0 };
    for (var l = 0; l < this.L; l++) {
      s.K.push(new Float64Array(this.T * this.d)); s.Vv.push(new Float64Array(this.T * this.d));
    }
    return s;
  };
  function linear(Wt, b, x, nOut, nIn, out) {  // out = W x + b, W (nOut, nIn) row-major
    for (var o = 0; o < nOut; o++) {
      var acc = b ? b[o] : 0, row = o * nIn;
      for (var i = 0; i < nIn; i++) acc += Wt[row + i] * x[i];
      out[o] = acc;
    }
    return out;
  }
  function layerNorm(x, w, b, eps, out) {
    var n = x.length, mean = 0, v = 0, i;
    for (i = 0; i < n; i++) mean += x[i];
    mean /= n;
    for (i = 0; i < n; i++) v += (x[i] - mean) * (x[i] - mean);
    var inv = 1 / Math.sqrt(v / n + eps);
    for (i = 0; i < n; i++) out[i] = (x[i] - mean) * inv * w[i] + (b ? b[i] : 0);
    return out;
  }
  // cos and sin of the rotary angles at position p (float32-rounded, as rotary_embedding): from
  // the table below block_size, computed past it (a rolling cache runs on; the angles between a
  // query and its keys stay below block_size, the distances the model was trained on)
  Model.prototype.angles = function (p) {
    var half = this.dh / 2, c = new Float64Array(half), s = new Float64Array(half), q;
    for (q = 0; q < half; q++) {
      if (p < this.T) { c[q] = this.cos[p * half + q]; s[q] = this.sin[p * half + q]; continue; }
      var angle = p * Math.pow(this.rotaryBase, -(2 * q) / this.dh);
      c[q] = Math.fround(Math.cos(angle)); s[q] = Math.fround(Math.sin(angle));
    }
    return { cos: c, sin: s };
  };
  // One more position: token `id` at position state.len. It attends to the positions
  // max(0, p - block_size + 1) .. p held by the cache. Returns the attention weights of this
  // position ([layer][head] -> Float32Array(number of positions read)) and, if `readout`, the
  // logits. Below block_size this is exactly GPT's forward pass over the text; past it, the
  // keys and values of the positions kept were computed when the older text was still in view.
  Model.prototype.step = function (state, id, readout) {
    var d = this.d, dh = this.dh, h = this.h, W = this.W, p = state.len, half = dh / 2, T = this.T;
    var first = Math.max(0, p - T + 1), n = p - first + 1, rot = this.angles(p);
    if (this.config.positions !== "rotary" && p >= T) {
      throw new RangeError("the context is full (block_size = " + T + ")");
    }
    var x = new Float64Array(d), a = new Float64Array(d), q = new Float64Array(d),
        k = new Float64Array(d), v = new Float64Array(d), o = new Float64Array(d),
        y = new Float64Array(d), hid = new Float64Array(this.F), i, j, l, hh;
    var E = W["embedding.weight"];
    for (i = 0; i < d; i++) x[i] = E[id * d + i];
    if (this.config.positions === "learned") {
      var P = W["positions.weight"];
      for (i = 0; i < d; i++) x[i] += P[p * d + i];
    }
    var weights = [], scale = 1 / Math.sqrt(dh);
    for (l = 0; l < this.L; l++) {
      var pre = "blocks." + l + ".", att = pre + "self_attention.";
      layerNorm(x, W[pre + "norm1.weight"], W[pre + "norm1.bias"], this.eps[0], a);
      linear(W[att + "W_q.weight"], W[att + "W_q.bias"], a, d, d, q);
      linear(W[att + "W_k.weight"], W[att + "W_k.bias"], a, d, d, k);
      linear(W[att + "W_v.weight"], W[att + "W_v.bias"], a, d, d, v);
      if (this.config.positions === "rotary") {
        for (hh = 0; hh < h; hh++) {
          for (j = 0; j < half; j++) {
            var c = rot.cos[j], s = rot.sin[j], e = hh * dh + 2 * j;
            var q0 = q[e], q1 = q[e + 1], k0 = k[e], k1 = k[e + 1];
            q[e] = q0 * c - q1 * s; q[e + 1] = q0 * s + q1 * c;
            k[e] = k0 * c - k1 * s; k[e + 1] = k0 * s + k1 * c;
          }
        }
      }
      var K = state.K[l], Vc = state.Vv[l];
      K.set(k, (p % T) * d); Vc.set(v, (p % T) * d);
      var layerWeights = [];
      for (hh = 0; hh < h; hh++) {
        var off = hh * dh, sc = new Float64Array(n), mx = -Infinity, row;
        for (j = 0; j < n; j++) {  // sc[j]: the key at position first + j
          var dot = 0;
          row = ((first + j) % T) * d + off;
          for (i = 0; i < dh; i++) dot += q[off + i] * K[row + i];
          sc[j] = dot * scale;
          if (sc[j] > mx) mx = sc[j];
        }
        var z = 0;
        for (j = 0; j < n; j++) { sc[j] = Math.exp(sc[j] - mx); z += sc[j]; }
        for (i = 0; i < dh; i++) o[off + i] = 0;
        for (j = 0; j < n; j++) {
          sc[j] /= z;
          row = ((first + j) % T) * d + off;
          for (i = 0; i < dh; i++) o[off + i] += sc[j] * Vc[row + i];
        }
        layerWeights.push(Float32Array.from(sc));
      }
      weights.push(layerWeights);
      linear(W[att + "W_o.weight"], W[att + "W_o.bias"], o, d, d, y);
      for (i = 0; i < d; i++) x[i] += y[i];
      layerNorm(x, W[pre + "norm2.weight"], W[pre + "norm2.bias"], this.eps[1], a);
      linear(W[pre + "ffn.dense1.weight"], W[pre + "ffn.dense1.bias"], a, this.F, d, hid);
      for (i = 0; i < this.F; i++) hid[i] = gelu(hid[i]);
      linear(W[pre + "ffn.dense2.weight"], W[pre + "ffn.dense2.bias"], hid, d, this.F, y);
      for (i = 0; i < d; i++) x[i] += y[i];
    }
    state.len = p + 1;
    state.dots += n * h * this.L;  // query-key scores computed, for the tests
    var result = { weights: weights, logits: null };
    if (readout) {
      layerNorm(x, W["norm.weight"], W["norm.bias"], this.eps[2], a);
      var logits = new Float64Array(this.V);
      linear(this.head, null, a, this.V, d, logits);
      result.logits = logits;
    }
    return result;
  };
  // The whole text (ids, 1 <= length <= block_size) from position 0: the last position's result.
  Model.prototype.run = function (ids) {
    var state = this.newState(), r = null;
    for (var i = 0; i < ids.length; i++) r = this.step(state, ids[i], i === ids.length - 1);
    r.state = state;
    return r;
  };

  // --- loading (once per corpus, on demand) ---------------------------------------------
  // Each model is a script, <corpus>.js, that calls d2lattnLM._register(corpus, manifest,
  // base64 of the float16 weights): a script element loads from a web server and from file://
  // alike (a fetch() of a file is refused by the browser).
  var models = {}, waiting = {};
  function register(corpus, manifest, base64) {
    var done = waiting[corpus];
    if (!done) return;
    delete waiting[corpus];
    try {
      var bytes = atob(base64), n = bytes.length, raw = new Uint8Array(n);
      for (var i = 0; i < n; i++) raw[i] = bytes.charCodeAt(i);
      if (n !== manifest.weights_bytes) {
        throw new Error(corpus + ".js: " + n + " bytes of weights, expected " + manifest.weights_bytes);
      }
      done.resolve(new Model(manifest, raw.buffer));
    } catch (err) { done.reject(err); }
  }
  function load(corpus) {
    if (CORPORA.indexOf(corpus) < 0) {
      return Promise.reject(new RangeError("corpus must be \"shakespeare\" or \"tang\", got " +
                                           JSON.stringify(corpus)));
    }
    if (!models[corpus]) {
      models[corpus] = new Promise(function (resolve, reject) {
        waiting[corpus] = { resolve: resolve, reject: reject };
        var tag = document.createElement("script");
        tag.src = BASE + corpus + ".js";
        tag.async = true;
        tag.onerror = function () {
          delete waiting[corpus];
          reject(new Error(t("missing", { f: corpus + ".js" })));
        };
        tag.onload = function () {
          if (waiting[corpus]) { delete waiting[corpus]; reject(new Error(corpus + ".js registered no model")); }
          tag.remove();
        };
        document.head.appendChild(tag);
      });
      models[corpus].catch(function () { delete models[corpus]; });  // a later try may work
    }
    return models[corpus];
  }
  function checkedIds(model, text) {
    if (typeof text !== "string" || text.length === 0) {
      throw new RangeError("text must be a non-empty string");
    }
    var enc = model.encode(text);
    if (enc.bad.length) {
      throw new RangeError("characters not in the vocabulary: " + JSON.stringify(enc.bad.join("")));
    }
    if (enc.ids.length > model.T) {
      throw new RangeError("text of " + enc.ids.length + " characters exceeds block_size = " + model.T);
    }
    return enc.ids;
  }
  var api = {
    corpora: CORPORA.slice(),
    _register: register,
    load: function (corpus) {
      return load(corpus).then(function (m) {
        return { config: Object.assign({}, m.config), vocab: m.vocab.slice() };
      });
    },
    nextLogits: function (corpus, text) {
      return load(corpus).then(function (m) {
        return Float32Array.from(m.run(checkedIds(m, text)).logits);
      });
    },
    attention: function (corpus, text) {
      return load(corpus).then(function (m) { return m.run(checkedIds(m, text)).weights; });
    },
    // d2lattn.gpt.next_token_probs: logits / temperature, then top-k, then top-p; a softmax
    nextTokenProbs: nextTokenProbs
  };
  window.d2lattnLM = api;

  // --- sampling: d2lattn.gpt.next_token_probs --------------------------------------------
  function softmax(z) {
    var mx = -Infinity, i, out = new Float64Array(z.length), s = 0;
    for (i = 0; i < z.length; i++) if (z[i] > mx) mx = z[i];
    for (i = 0; i < z.length; i++) { out[i] = z[i] === -Infinity ? 0 : Math.exp(z[i] - mx); s += out[i]; }
    for (i = 0; i < z.length; i++) out[i] /= s;
    return out;
  }
  function nextTokenProbs(logits, temperature, topK, topP) {
    if (!(temperature >= 0 && isFinite(temperature))) {
      throw new RangeError("temperature must be a finite number >= 0, got " + temperature);
    }
    var V = logits.length, z = new Float64Array(V), i;
    if (topK !== null && topK !== undefined && !(Number.isInteger(topK) && topK >= 1 && topK <= V)) {
      throw new RangeError("top_k must be an integer in [1, " + V + "], got " + topK);
    }
    if (topP !== null && topP !== undefined && !(topP > 0 && topP <= 1)) {
      throw new RangeError("top_p must lie in (0, 1], got " + topP);
    }
    if (temperature === 0) {  // the limit of a vanishing temperature: all on the argmax
      var best = 0;           // (ties: the lowest index, as torch.argmax); filters keep it
      for (i = 1; i < V; i++) if (logits[i] > logits[best]) best = i;
      z[best] = 1;
      return z;
    }
    for (i = 0; i < V; i++) z[i] = logits[i] / temperature;
    var order = Array.from({ length: V }, function (_, j) { return j; });
    if (topK !== null && topK !== undefined) {
      if (!(Number.isInteger(topK) && topK >= 1 && topK <= V)) {
        throw new RangeError("top_k must be an integer in [1, " + V + "], got " + topK);
      }
      // the k largest; ties at the k-th value go to the lower index
      order.sort(function (a, b) { return z[b] - z[a] || a - b; });
      for (i = topK; i < V; i++) z[order[i]] = -Infinity;
    }
    if (topP !== null && topP !== undefined) {
      if (!(topP > 0 && topP <= 1)) throw new RangeError("top_p must lie in (0, 1], got " + topP);
      var p = softmax(z);
      order.sort(function (a, b) { return p[b] - p[a] || a - b; });
      var before = 0;
      for (i = 0; i < V; i++) {
        var keep = i === 0 || before < topP;
        before += p[order[i]];
        if (!keep) z[order[i]] = -Infinity;
      }
    }
    return softmax(z);
  }
  function sample(probs) {
    var u = Math.random(), acc = 0, last = 0;
    for (var i = 0; i < probs.length; i++) {
      if (probs[i] > 0) { acc += probs[i]; last = i; if (u < acc) return i; }
    }
    return last;
  }

  // --- the widget ------------------------------------------------------------------------
  var counter = 0;
  function el(tag, attrs, parent) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (key) {
      if (key === "text") node.textContent = attrs[key];
      else node.setAttribute(key, attrs[key]);
    });
    if (parent) parent.appendChild(node);
    return node;
  }
  function show(ch) { return ch === " " ? "\u2423" : ch === "\n" ? "\u23ce" : ch; }
  function field(parent, label, input, id) {
    var wrap = el("div", { "class": "d2lattn-lm-field" }, parent);
    el("label", { "for": id, text: label }, wrap);
    wrap.appendChild(input);
    return wrap;
  }

  function build(root) {
    var n = ++counter, id = function (s) { return "d2lattn-lm-" + n + "-" + s; };
    root.textContent = "";
    root.setAttribute("role", "group");
    root.setAttribute("aria-labelledby", id("title"));
    el("div", { "class": "d2lattn-lm-title", id: id("title"), text: t("title") }, root);
    el("p", { "class": "d2lattn-lm-intro", text: t("intro") }, root);
    var controls = el("div", { "class": "d2lattn-lm-controls" }, root);
    var corpusSel = el("select", { id: id("corpus"), "class": "d2lattn-lm-corpus" });
    CORPORA.forEach(function (c) { el("option", { value: c, text: t(c) }, corpusSel); });
    corpusSel.value = CORPORA.indexOf(root.dataset.corpus) >= 0 ? root.dataset.corpus : CORPORA[0];
    field(controls, t("model"), corpusSel, id("corpus"));
    var temp = el("input", { id: id("temp"), type: "number", min: "0", max: "5", step: "0.05",
                             value: "0.8", "class": "d2lattn-lm-temperature" });
    field(controls, t("temperature"), temp, id("temp"));
    var topk = el("input", { id: id("topk"), type: "number", min: "0", step: "1", value: "0",
                             "class": "d2lattn-lm-topk" });
    field(controls, t("topk"), topk, id("topk"));
    var topp = el("input", { id: id("topp"), type: "number", min: "0.01", max: "1", step: "0.05",
                             value: "0.95", "class": "d2lattn-lm-topp" });
    field(controls, t("topp"), topp, id("topp"));
    var length = el("input", { id: id("len"), type: "number", min: "1", max: "1000", step: "1",
                               "class": "d2lattn-lm-length" });
    field(controls, t("length"), length, id("len"));
    var promptWrap = el("div", { "class": "d2lattn-lm-field d2lattn-lm-prompt-field" }, root);
    el("label", { "for": id("prompt"), text: t("prompt") }, promptWrap);
    var prompt = el("textarea", { id: id("prompt"), rows: "3", spellcheck: "false",
                                  "class": "d2lattn-lm-prompt" }, promptWrap);
    var buttons = el("div", { "class": "d2lattn-lm-buttons" }, root);
    var go = el("button", { type: "button", "class": "d2lattn-lm-generate", text: t("generate") }, buttons);
    var stop = el("button", { type: "button", "class": "d2lattn-lm-stop", text: t("stop"),
                              disabled: "" }, buttons);
    var settingsError = el("div", { "class": "d2lattn-lm-error", role: "alert" }, root);
    var status = el("div", { "class": "d2lattn-lm-status", role: "status", "aria-live": "polite",
                             text: t("press") }, root);
    var note = el("p", { "class": "d2lattn-lm-note" }, root);  // what the model reads, once the cache rolls
    el("div", { "class": "d2lattn-lm-heading", id: id("out"), text: t("output") }, root);
    var output = el("pre", { "class": "d2lattn-lm-output", "aria-labelledby": id("out"),
                             tabindex: "0" }, root);
    var outPrompt = el("span", { "class": "d2lattn-lm-output-prompt" }, output);
    var outNew = el("span", { "class": "d2lattn-lm-output-new" }, output);
    var panels = el("div", { "class": "d2lattn-lm-panels" }, root);
    var probBox = el("div", { "class": "d2lattn-lm-panel" }, panels);
    el("div", { "class": "d2lattn-lm-heading", id: id("probs"), text: t("probs") }, probBox);
    var probTable = el("table", { "class": "d2lattn-lm-probs", "aria-labelledby": id("probs") }, probBox);
    var attBox = el("div", { "class": "d2lattn-lm-panel" }, panels);
    el("div", { "class": "d2lattn-lm-heading", id: id("att"), text: t("attention") }, attBox);
    var attControls = el("div", { "class": "d2lattn-lm-controls" }, attBox);
    var layerSel = el("select", { id: id("layer"), "class": "d2lattn-lm-layer" });
    var headSel = el("select", { id: id("head"), "class": "d2lattn-lm-head" });
    field(attControls, t("layer"), layerSel, id("layer"));
    field(attControls, t("head"), headSel, id("head"));
    var attText = el("div", { "class": "d2lattn-lm-attention", "aria-hidden": "true" }, attBox);
    var attSummary = el("p", { "class": "d2lattn-visually-hidden d2lattn-lm-attention-summary" }, attBox);
    el("p", { "class": "d2lattn-lm-api", text: t("api") }, root);

    var running = null, last = null, generated = "", pending = null, edits = 0;
    function setDefaults() {
      var dflt = DEFAULTS[corpusSel.value];
      prompt.value = dflt.prompt;
      length.value = String(dflt.length);
      outPrompt.textContent = ""; outNew.textContent = ""; generated = "";
      probTable.textContent = ""; attText.textContent = ""; attSummary.textContent = "";
    }
    setDefaults();
    // The controls' values as nextTokenProbs takes them: temperature 0 is greedy, top-k 0 and
    // top-p 1 switch their filter off. A value outside a control's range is reported (and
    // null returned), never replaced by another.
    function settings(model) {
      var tau = temp.value.trim() === "" ? NaN : Number(temp.value);
      var k = topk.value.trim() === "" ? 0 : Number(topk.value);
      var p = topp.value.trim() === "" ? 1 : Number(topp.value);
      var bad = !(tau >= 0 && isFinite(tau)) ? t("badTemperature")
        : !(Number.isInteger(k) && k >= 0) ? t("badTopk")
        : !(p > 0 && p <= 1) ? t("badTopp") : null;
      settingsError.textContent = bad || "";
      if (bad) return null;
      return { temperature: tau, topK: k >= 1 ? Math.min(k, model.V) : null, topP: p < 1 ? p : null };
    }
    function fillHeads(model) {
      if (layerSel.options.length === model.L && headSel.options.length === model.h) return;
      layerSel.textContent = ""; headSel.textContent = "";
      for (var l = 0; l < model.L; l++) el("option", { value: String(l), text: String(l) }, layerSel);
      for (var hh = 0; hh < model.h; hh++) el("option", { value: String(hh), text: String(hh) }, headSel);
    }
    // Redraw the bars and the attention for the current context (last = a step's result).
    function draw(model) {
      if (!last) return;
      var s = settings(model);
      if (!s) { probTable.textContent = ""; return; }
      var probs = nextTokenProbs(last.logits, s.temperature, s.topK, s.topP);
      var order = Array.from({ length: probs.length }, function (_, j) { return j; })
        .sort(function (a, b) { return probs[b] - probs[a] || a - b; }).slice(0, 8)
        .filter(function (j) { return probs[j] > 0; });  // the candidates: what a filter removed is gone
      probTable.textContent = "";
      var top = order.length ? probs[order[0]] : 1;  // the longest bar spans the column
      order.forEach(function (j) {
        var tr = el("tr", { "class": "d2lattn-lm-prob", "data-index": String(j),
                            "data-value": String(probs[j]) }, probTable);
        el("th", { scope: "row", text: show(model.vocab[j]) }, tr);
        var bar = el("td", { "class": "d2lattn-lm-bar-cell" }, tr);
        el("span", { "class": "d2lattn-lm-bar", style: "width:" + (100 * probs[j] / top).toFixed(1) + "%" }, bar);
        el("td", { "class": "d2lattn-lm-pct", text: (100 * probs[j]).toFixed(1) + "%" }, tr);
      });
      fillHeads(model);
      var w = last.weights[Number(layerSel.value) || 0][Number(headSel.value) || 0];
      var chars = last.chars, mx = Math.max.apply(null, Array.from(w));
      attText.textContent = "";
      for (var i = 0; i < chars.length; i++) {
        var span = el("span", { "class": "d2lattn-lm-att", "data-value": String(w[i]),
                                title: (100 * w[i]).toFixed(1) + "%", text: show(chars[i]) }, attText);
        span.style.backgroundColor = "rgba(31, 119, 180, " + (0.9 * w[i] / mx).toFixed(3) + ")";
        if (w[i] / mx > 0.55) span.style.color = "#fff";
      }
      var most = Array.from(w).map(function (v, j) { return [v, j]; })
        .sort(function (a, b) { return b[0] - a[0]; }).slice(0, 3)
        .map(function (e) { return "\u201c" + show(chars[e[1]]) + "\u201d (" + e[1] + ") " +
                                   (100 * e[0]).toFixed(0) + "%"; });
      attSummary.textContent = t("most", { list: most.join(", ") });
    }
    // Run the model over the text (its last block_size characters), keep the result in `last`.
    function analyse(model, text) {
      var enc = model.encode(text);
      if (enc.bad.length) {
        status.textContent = t("unknown", { c: enc.bad.join(" ") }) +
          (Object.keys(model.fromSimplified).length ? " " + t("traditional") : "");
        return null;
      }
      note.textContent = enc.mapped.length ? t("mapped", { list: enc.mapped.map(function (m) {
        var c = Array.from(m); return c[0] + "\u2192" + c[1]; }).join(" ") }) : "";
      if (!enc.ids.length) { status.textContent = t("empty"); return null; }
      var chars = Array.from(text).slice(-model.T), ids = enc.ids.slice(-model.T);
      last = model.run(ids);
      last.chars = chars; last.ids = ids;
      draw(model);
      return last;
    }
    function mb(bytes) { return (bytes / 1e6).toFixed(1); }
    function withModel() {
      var corpus = corpusSel.value, started = performance.now(), fresh = !models[corpus];
      if (fresh) status.textContent = t("loading");
      return load(corpus).then(function (model) {
        if (fresh) {
          status.textContent = t("loaded", { mb: mb(model.manifest.weights_bytes),
                                             s: ((performance.now() - started) / 1000).toFixed(1) });
        }
        return model;
      }, function (err) { status.textContent = t("failed", { e: err.message }); throw err; });
    }
    function generate() {
      if (running) return;
      // a re-analysis of the typing still pending would clear this run's output once it ends
      clearTimeout(pending); edits++;
      var token = { stop: false };
      running = token;
      go.disabled = true; stop.disabled = false;
      output.dataset.done = "0";  // at once: a test (or a reader's script) waits for "1"
      note.textContent = "";
      withModel().then(function (model) {
        var text = prompt.value;
        if (!analyse(model, text)) { finish(); return; }
        if (Array.from(text).length > model.T) status.textContent = t("cropped", { n: model.T });
        else status.textContent = t("writing");
        outPrompt.textContent = text; outNew.textContent = ""; generated = "";
        var want = Math.max(1, Math.min(1000, Math.round(Number(length.value)) || 1)), count = 0;
        var state = last.state, ids = last.ids.slice(), chars = last.chars.slice(), rolled = false;
        function tick() {
          if (token.stop || count >= want) {
            status.textContent = t(token.stop ? "stopped" : "done", { n: count });
            output.dataset.done = "1";
            finish();
            return;
          }
          var t0 = performance.now();
          while (count < want && !token.stop && performance.now() - t0 < 30) {
            var s = settings(model);
            if (!s) { token.stop = true; break; }  // the message is shown beside the controls
            var next = sample(nextTokenProbs(last.logits, s.temperature, s.topK, s.topP));
            var ch = model.vocab[next];
            generated += ch; count++;
            ids.push(next); chars.push(ch);
            if (state.len < model.T || model.config.positions === "rotary") {
              // one more position; past block_size the cache rolls (the oldest position goes)
              if (state.len >= model.T && !rolled) { rolled = true; note.textContent = (note.textContent ? note.textContent + " " : "") + t("rolling", { n: model.T }); }
              var r = model.step(state, next, true);
              last.logits = r.logits; last.weights = r.weights;
              chars = chars.slice(-model.T);
            } else {  // learned positions stop at block_size: the last block_size characters again
              ids = ids.slice(-model.T); chars = chars.slice(-model.T);
              var full = model.run(ids);
              state = full.state; last.logits = full.logits; last.weights = full.weights;
            }
            last.chars = chars;
            output.dataset.dots = String(state.dots);
          }
          outNew.textContent = generated;
          output.dataset.count = String(count);
          draw(model);
          setTimeout(tick, 0);
        }
        output.dataset.done = "0";
        tick();
      }).catch(function () { finish(); });
    }
    function finish() { running = null; go.disabled = false; stop.disabled = true; }
    go.addEventListener("click", generate);
    stop.addEventListener("click", function () { if (running) running.stop = true; });
    prompt.addEventListener("keydown", function (e) {
      if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); generate(); }
    });
    corpusSel.addEventListener("change", function () {
      if (running) running.stop = true;
      last = null; setDefaults();
      status.textContent = models[corpusSel.value] ? "" : t("press");
      layerSel.textContent = ""; headSel.textContent = "";
      if (models[corpusSel.value]) {
        models[corpusSel.value].then(function (m) { fillHeads(m); analyse(m, prompt.value); });
      }
    });
    prompt.addEventListener("input", function () {  // a loaded model follows the typing
      var corpus = corpusSel.value;
      if (running || !models[corpus]) return;
      clearTimeout(pending);
      var seen = ++edits;
      pending = setTimeout(function () {
        models[corpus].then(function (m) {
          // Generate was pressed meanwhile (running, or already finished): its run owns the output
          if (running || edits !== seen) return;
          outPrompt.textContent = ""; outNew.textContent = ""; generated = "";
          if (analyse(m, prompt.value)) status.textContent = "";
        });
      }, 150);
    });
    [temp, topk, topp, layerSel, headSel].forEach(function (input) {
      input.addEventListener(input.tagName === "SELECT" ? "change" : "input", function () {
        var corpus = corpusSel.value;
        if (models[corpus] && last) models[corpus].then(draw);
      });
    });
    root.dataset.ready = "1";
  }

  function init() {
    document.querySelectorAll(".d2lattn-lm").forEach(build);
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();

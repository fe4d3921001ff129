/* The search page (loaded there only, by book/_ext/d2lattn_reader.py).
 *
 * 1. Snippets from the article: Sphinx takes a result's snippet from the page's [role=main],
 *    which in this theme also holds the navigation and the download menu, so snippets read
 *    "... .ipynb .pdf" or table-of-contents text. Here they come from the article alone.
 * 2. Opened from file://, the browser refuses to fetch the result pages that the snippets are
 *    cut from (one console error per result). There the results are listed without snippets,
 *    and a note says how to get them: serve the site (see the README).
 * 3. Ranking by use: Sphinx scores a page 15 when a query word is in its headings and 5 when
 *    it is in its text, however often, and breaks ties by title. The build counts how often
 *    each page uses each word (D2LATTN_SEARCH_COUNTS, from d2lattn-search-counts.js, written
 *    by book/_ext/d2lattn_reader.py; counts of 1 are left out), and each result gets a bonus
 *    that grows with n, the number of uses of the query's words: 9.9 (1 - 1/n), so 0 for one
 *    use, 5 for two, 9 for ten, always below 10, so that pages rank by their number of uses
 *    and a word in a heading (15 against 5) still outranks any number of uses in the text.
 */
(function () {
  "use strict";
  if (typeof Search === "undefined") return;
  var NOISE = ".headerlink, script, style, .d2lattn-lang-switch, .d2lattn-page-links, " +
              ".d2lattn-viz-fallback, .cell_output";
  Search.htmlToText = function (htmlString, anchor) {
    var doc = new DOMParser().parseFromString(htmlString, "text/html");
    doc.querySelectorAll(NOISE).forEach(function (el) { el.remove(); });
    var article = doc.querySelector("article.bd-article") || doc.querySelector('[role="main"]');
    if (!article) return "";
    if (anchor) {
      var part = article.querySelector(anchor);
      if (part) return part.textContent;
    }
    return article.textContent;
  };
  // 3. ranking by use: the query's words as Sphinx looks them up (split, stemmed)
  var queryWords = [];
  if (typeof Search._parseQuery === "function") {
    var parseQuery = Search._parseQuery;
    Search._parseQuery = function () {
      var parsed = parseQuery.apply(this, arguments);
      queryWords = Array.from(parsed[1] || []);
      return parsed;
    };
  }
  var table = typeof D2LATTN_SEARCH_COUNTS === "undefined" ? null : D2LATTN_SEARCH_COUNTS;
  var uses = function (index, word, doc) {
    var counts = table[word];
    if (counts && counts[doc]) return counts[doc];
    var inDoc = function (pages) {
      return pages === doc || (Array.isArray(pages) && pages.indexOf(doc) >= 0);
    };
    return inDoc(index.terms[word]) || inDoc(index.titleterms[word]) ? 1 : 0;
  };
  var previousScore = Scorer.score;
  Scorer.score = function (result) {
    var score = previousScore ? previousScore(result) : result[4];
    var index = Search._index;
    if (!index || !table || !queryWords.length) return score;
    var doc = index.docnames.indexOf(result[0]);
    if (doc < 0) return score;
    var n = 0;
    queryWords.forEach(function (word) { n += uses(index, word, doc); });
    return n > 1 ? score + 9.9 * (1 - 1 / n) : score;
  };

  if (window.location.protocol === "file:") {
    DOCUMENTATION_OPTIONS.SHOW_SEARCH_SUMMARY = false;
    var note = function () {
      var box = document.getElementById("search-results") || document.querySelector("article");
      if (!box || document.querySelector(".d2lattn-search-note")) return;
      var p = document.createElement("p");
      p.className = "d2lattn-search-note";
      p.textContent = document.documentElement.lang.indexOf("zh") === 0
        ? "从本地文件（file://）打开时，搜索结果不显示摘要。要看到摘要，请用本地服务器打开网站：python -m http.server -d _build/html，然后访问 http://localhost:8000/。"
        : "Opened from a file (file://), search lists the pages without snippets. For snippets, " +
          "serve the site: python -m http.server -d _build/html, then open http://localhost:8000/.";
      box.parentNode.insertBefore(p, box);
    };
    if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", note);
    else note();
  }
})();

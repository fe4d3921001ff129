/* The search page (loaded there only, by book/_ext/d2lattn_reader.py).
 *
 * 1. Snippets from the article: Sphinx takes a result's snippet from the page's [role=main],
 *    which in this theme also holds the navigation and the download menu, so snippets read
 *    "... .ipynb .pdf" or table-of-contents text. Here they come from the article alone.
 * 2. Opened from file://, the browser refuses to fetch the result pages that the snippets are
 *    cut from (one console error per result). There the results are listed without snippets,
 *    and a note says how to get them: serve the site (see the README).
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

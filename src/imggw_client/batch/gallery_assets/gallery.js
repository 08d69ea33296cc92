
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("gallery-data").textContent);
  var FILTERS = ["all", "succeeded", "failed", "expired", "unfinished"];
  var LABELS = {all: "All", succeeded: "Succeeded", failed: "Failed", expired: "Expired",
                unfinished: "Unfinished"};
  var ICONS = {succeeded: "\u2713", failed: "\u2715", expired: "\u25F7", unfinished: "\u2026"};
  var KEEP = 12;
  // Shown as their codes, never as they are: controls (tab and line feed aside), the bidi
  // controls (an RLO in a prompt would make "evil" read "live", and reorder what follows) and
  // the invisible ones (zero-width, fillers, tags), which would hide text. The tags of a flag
  // (England's, Scotland's: the first group) draw the flag and are left alone.
  var HIDDEN = new RegExp(
    "(\\u{1F3F4}[\\u{E0020}-\\u{E007E}]+\\u{E007F})|" +
    "[\\0-\\x08\\x0B-\\x1F\\x7F-\\x9F\\xAD\\u061C\\u115F\\u1160\\u17B4\\u17B5\\u180E" +
    "\\u200B\\u200E\\u200F\\u2028-\\u202E\\u2060-\\u206F\\u3164\\uFEFF\\uFFA0\\uFFF9-\\uFFFB" +
    "\\u{1BCA0}-\\u{1BCA3}\\u{1D173}-\\u{1D17A}\\u{E0000}-\\u{E007F}]", "gu");
  var cache = new Map();
  var seq = 0;
  var current = {filter: "all", page: 1};
  var number = new Intl.NumberFormat("en-US", {maximumFractionDigits: 4});

  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }
  function fmt(value) { return typeof value === "number" ? number.format(value) : "\u2014"; }
  function codeOf(ch) {
    var hex = ch.codePointAt(0).toString(16);
    return hex.length > 4 ? "\\u{" + hex + "}" : "\\u" + ("000" + hex).slice(-4);
  }
  // Text for an attribute or the tab's title: hidden characters as their codes.
  function shown(text) {
    return String(text).replace(HIDDEN, function (found, flag) { return flag || codeOf(found); });
  }
  // Text from the data into an element of its own: isolated from what is around it, in its
  // own direction (dir=auto: from its first strong character), hidden characters as marked
  // codes that read left to right wherever they stand.
  function put(node, text) {
    var value = String(text), last = 0, found;
    node.setAttribute("dir", "auto");
    HIDDEN.lastIndex = 0;
    while ((found = HIDDEN.exec(value)) !== null) {
      if (found[1]) continue;
      if (found.index > last) {
        node.appendChild(document.createTextNode(value.slice(last, found.index)));
      }
      var mark = el("span", "invisible", codeOf(found[0]));
      mark.setAttribute("dir", "ltr");
      mark.setAttribute("title", "an invisible or control character, shown as its code");
      node.appendChild(mark);
      last = HIDDEN.lastIndex;
    }
    if (last < value.length) node.appendChild(document.createTextNode(value.slice(last)));
    return node;
  }
  // The one way a cut prompt is described, on the card and in its tooltip.
  function cutText(length) {
    return "first " + fmt(data.promptChars) + " of " + fmt(length) + " characters";
  }
  function safeSrc(src) {
    // The writer already refused anything else; checked again so a page file edited by hand
    // cannot link outside the folder or to a script URL.
    if (typeof src !== "string" || !src || src.charAt(0) === "/" || src.indexOf("\\") >= 0 ||
        /^[a-z][a-z0-9+.\-]*:/i.test(src)) return null;
    var parts = src.split("/");
    for (var i = 0; i < parts.length; i++) {
      if (parts[i] === "" || parts[i] === "..") return null;
    }
    return src;
  }

  window.imggwPage = function (filter, page, rows) {
    if (FILTERS.indexOf(filter) < 0 || !Array.isArray(rows)) return;
    cache.set(filter + "/" + page, rows);
    while (cache.size > KEEP) cache.delete(cache.keys().next().value);
  };

  function load(filter, page) {
    var key = filter + "/" + page;
    if (cache.has(key)) return Promise.resolve(cache.get(key));
    return new Promise(function (resolve, reject) {
      var script = document.createElement("script");
      script.src = "gallery/" + data.generation + "/" + filter + "/" + page + ".js";
      script.onload = function () {
        script.remove();
        if (cache.has(key)) resolve(cache.get(key)); else reject(new Error(key));
      };
      script.onerror = function () { script.remove(); reject(new Error(key)); };
      document.head.appendChild(script);
    });
  }

  function readHash() {
    var match = /^#([a-z]+)(?:\/([0-9]+))?$/.exec(location.hash);
    var filter = match && FILTERS.indexOf(match[1]) >= 0 ? match[1] : "all";
    var pages = Math.max(1, data.pages[filter] || 0);
    var page = match && match[2] ? parseInt(match[2], 10) : 1;
    return {filter: filter, page: Math.min(Math.max(page, 1), pages)};
  }
  function go(filter, page) {
    var hash = "#" + filter + "/" + page;
    if (location.hash === hash) render(); else location.hash = hash;
  }

  function header() {
    document.title = shown(data.title);
    put(document.getElementById("title"), data.title);
    var totals = document.getElementById("totals");
    [[fmt(data.counts.all), data.counts.all === 1 ? " line" : " lines"],
     [fmt(data.credits), " credits"], [fmt(data.cost), " cost"]].forEach(function (part) {
      totals.appendChild(el("b", "", part[0]));
      totals.appendChild(document.createTextNode(part[1] + " \u00B7 "));
    });
    totals.appendChild(document.createTextNode("written " + data.written));
    var nav = document.getElementById("filters");
    FILTERS.forEach(function (name) {
      var button = el("button");
      button.type = "button";
      button.setAttribute("data-filter", name);
      if (name !== "all") button.appendChild(el("span", "dot " + name));
      button.appendChild(el("span", "label", LABELS[name]));
      button.appendChild(el("span", "count", fmt(data.counts[name] || 0)));
      button.addEventListener("click", function () { go(name, 1); });
      nav.appendChild(button);
    });
  }

  function pager(box, state) {
    var pages = data.pages[state.filter] || 0;
    box.replaceChildren();
    if (pages <= 1) return;
    var prev = el("button", "prev", "\u2039 Prev");
    var next = el("button", "next", "Next \u203A");
    prev.type = next.type = "button";
    prev.disabled = state.page <= 1;
    next.disabled = state.page >= pages;
    prev.addEventListener("click", function () { go(state.filter, state.page - 1); });
    next.addEventListener("click", function () { go(state.filter, state.page + 1); });
    var input = el("input");
    input.type = "number"; input.min = "1"; input.max = String(pages);
    input.value = String(state.page);
    input.setAttribute("aria-label", "Page");
    input.addEventListener("change", function () {
      var page = parseInt(input.value, 10);
      if (page >= 1 && page <= pages) go(state.filter, page); else input.value = state.page;
    });
    var first = (state.page - 1) * data.pageSize + 1;
    var last = Math.min(state.page * data.pageSize, data.counts[state.filter] || 0);
    var where = el("span", "where");
    where.appendChild(document.createTextNode("Page "));
    where.appendChild(input);
    where.appendChild(document.createTextNode(" of " + fmt(pages)));
    var range = el("span", "range", "cards " + fmt(first) + "\u2013" + fmt(last));
    box.append(prev, where, next, range);
  }

  function meta(list, name, value, mono) {
    if (value === null || value === undefined || value === "") return;
    list.appendChild(el("dt", "", name));
    var dd = put(el("dd", mono ? "mono" : ""), value);
    dd.setAttribute("title", shown(value));
    list.appendChild(dd);
  }

  function note(kind, code, message) {
    var box = el("div", "frame note " + kind);
    box.appendChild(put(el("span", "code"), code));
    if (message) box.appendChild(put(el("p", "message"), message));
    return box;
  }

  function card(row) {
    var line = row[0], id = row[1], taskId = row[2], status = row[3], cat = row[4];
    var prompt = row[5], promptLength = row[6], aspect = row[7], resolution = row[8];
    var cost = row[9], credits = row[10], files = row[11] || [], width = row[12];
    var height = row[13], code = row[14], message = row[15], expires = row[16];
    var surface = row[17];
    var skipped = code === "invalid_line";  // a bad input line: never sent, nothing to show
    if (!LABELS[cat] || cat === "all") cat = "unfinished";
    var article = el("article", "card " + cat);
    article.setAttribute("data-status", cat);
    if (line !== null) article.setAttribute("data-line", String(line));
    var src = files.length ? safeSrc(files[0][0]) : null;
    if (skipped) {
      article.appendChild(note(cat, code, "Skipped: this input line was never sent."));
    } else if (cat === "failed" || cat === "expired") {
      article.appendChild(note(cat, code || "failed", message));
    } else if (src) {
      var link = el("a", "frame");
      link.setAttribute("href", src);
      link.setAttribute("target", "_blank");
      link.setAttribute("rel", "noopener noreferrer");
      link.setAttribute("title", "Open the full image");
      var img = el("img");
      img.setAttribute("loading", "lazy");
      img.setAttribute("decoding", "async");
      img.setAttribute("width", String(width));
      img.setAttribute("height", String(height));
      img.setAttribute("alt", prompt ? shown(prompt) : "line " + line);
      img.addEventListener("error", function () {
        link.replaceWith(note("missing", "file not found", files[0][0]));
      });
      img.setAttribute("src", src);
      link.appendChild(img);
      article.appendChild(link);
    } else if (cat === "succeeded") {
      article.appendChild(note("missing", "no viewable file", "Its path is outside this folder."));
    } else {
      var waiting = status === "succeeded" ? "Not downloaded yet." : "Not finished yet.";
      article.appendChild(note("unfinished", status, waiting));
    }

    var body = el("div", "body");
    var top = el("div", "top");
    var badge = el("span", "badge " + cat, ICONS[cat] + " ");
    if (cat === "unfinished") badge.appendChild(put(el("bdi"), status));
    else badge.appendChild(document.createTextNode(LABELS[cat]));
    top.appendChild(badge);
    top.appendChild(el("span", "line", line === null ? "line \u2014" : "line " + line));
    body.appendChild(top);
    var text;
    if (prompt) {
      text = put(el("p", "prompt"), prompt);
      text.setAttribute("title", "Click to show the " +
                        (promptLength ? cutText(promptLength) : "whole prompt"));
      text.addEventListener("click", function () { text.classList.toggle("open"); });
    } else if (skipped) {  // what was wrong with the line, in the prompt's place
      text = put(el("p", "prompt reason"), message || "no reason recorded");
    } else {
      text = el("p", "prompt none", "no prompt recorded");
    }
    body.appendChild(text);
    if (prompt && promptLength) {
      body.appendChild(el("span", "cut", cutText(promptLength) + "; the manifest has them all"));
    }
    var list = el("dl", "meta");
    meta(list, "ratio", [aspect, resolution].filter(Boolean).join(" \u00B7 "));
    meta(list, "credits", credits === null ? null : fmt(credits));
    meta(list, "cost", cost === null ? null : fmt(cost));
    meta(list, "id", id, true);
    meta(list, "task", taskId, true);
    if (taskId) meta(list, "surface", surface, true);  // where the task lives (it may be collected)
    if (!src || cat !== "succeeded") meta(list, "expires", expires);
    body.appendChild(list);
    if (files.length > 1) {
      var more = el("div", "files");
      files.forEach(function (file, i) {
        var href = safeSrc(file[0]);
        if (!href) return;
        var a = el("a", "", "image " + (i + 1));
        a.setAttribute("href", href);
        a.setAttribute("target", "_blank");
        a.setAttribute("rel", "noopener noreferrer");
        more.appendChild(a);
      });
      body.appendChild(more);
    }
    article.appendChild(body);
    return article;
  }

  function render() {
    var state = readHash();
    current = state;
    var mine = ++seq;
    document.querySelectorAll("#filters button").forEach(function (button) {
      button.setAttribute("aria-pressed",
                          String(button.getAttribute("data-filter") === state.filter));
    });
    pager(document.getElementById("pager-top"), state);
    pager(document.getElementById("pager-bottom"), state);
    var grid = document.getElementById("grid");
    var empty = document.getElementById("empty");
    if (!data.pages[state.filter]) {
      grid.replaceChildren();
      empty.hidden = false;
      document.body.setAttribute("data-shown", state.filter + "/" + state.page);
      return;
    }
    empty.hidden = true;
    load(state.filter, state.page).then(function (rows) {
      if (mine !== seq) return;
      grid.replaceChildren.apply(grid, rows.map(card));
      window.scrollTo(0, 0);
      document.body.setAttribute("data-shown", state.filter + "/" + state.page);
      if (state.page < data.pages[state.filter]) {
        load(state.filter, state.page + 1).catch(function () {});
      }
    }, function () {
      if (mine !== seq) return;
      var notice = document.getElementById("notice");
      notice.replaceChildren(document.createTextNode(
        "This gallery was rewritten since the page was opened."));
      var again = el("button", "", "Reload");
      again.type = "button";
      again.addEventListener("click", function () { location.reload(); });
      notice.appendChild(again);
      notice.hidden = false;
      document.body.setAttribute("data-shown", "stale");
    });
  }

  document.addEventListener("keydown", function (event) {
    if (event.target instanceof HTMLInputElement || event.altKey || event.ctrlKey ||
        event.metaKey) return;
    var pages = data.pages[current.filter] || 0;
    if (event.key === "ArrowLeft" && current.page > 1) go(current.filter, current.page - 1);
    if (event.key === "ArrowRight" && current.page < pages) go(current.filter, current.page + 1);
  });
  window.addEventListener("hashchange", render);
  header();
  render();
})();

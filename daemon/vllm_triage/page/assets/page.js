/* vllm-triage's page: the post-mortem report (its document inlined below the markup) and
 * the live status page (the same document fetched from the daemon's API, again and again).
 * Charts are uPlot's; incident bands and transition markers are elements laid over each
 * chart's plotting area, placed from the chart's own scale on every redraw.
 * Every text from the document goes in as text (textContent), never as markup. */
(function () {
  "use strict";

  // renderedAt: ms from navigation to the first complete drawing; scriptAt: when this
  // script started (so renderedAt - scriptAt is the page's own work).
  var page = (window.vtPage = { errors: [], rendered: false, renderedAt: null, scriptAt: performance.now(), renders: 0 });
  var errorBox = document.getElementById("vt-errors");

  function reportError(message) {
    page.errors.push(message);
    errorBox.hidden = false;
    errorBox.textContent = "This page hit an error, some of it may be missing:\n" + page.errors.join("\n");
  }
  window.addEventListener("error", function (e) { reportError(String(e.message || e)); });
  window.addEventListener("unhandledrejection", function (e) { reportError(String(e.reason)); });

  // ---- formatting -------------------------------------------------------------------

  // "1 evaluation", "2 evaluations": a count with its noun, plural unless it is one.
  function counted(n, noun) { return n + " " + (n === 1 ? noun : noun + "s"); }

  function num(v, digits) {
    if (Math.abs(v) >= 1000) return Math.round(v).toLocaleString("en-US");
    return String(Number(v.toPrecision(digits || 3)));  // 0.0500 -> "0.05"
  }

  function fmt(v, unit) {
    if (v === null || v === undefined || Number.isNaN(v)) return "–";
    switch (unit) {
      case "s": return Math.abs(v) < 1 ? num(v * 1000) + " ms" : num(v) + " s";
      case "ratio": return num(v * 100) + " %";
      case "requests": return num(v) + (Math.abs(v - 1) < 1e-9 ? " request" : " requests");
      case "per_s": return num(v) + " /s";
      case "tokens": return Math.round(v).toLocaleString("en-US") + " tokens";
      case "tok_s": return num(v) + " tok/s";
      default: return num(v);
    }
  }

  function fmtAxis(v, unit) {
    if (v === null) return "";
    switch (unit) {
      case "s": return Math.abs(v) < 1 && v !== 0 ? num(v * 1000) + " ms" : num(v) + " s";
      case "ratio": return num(v * 100) + "%";
      case "per_s": return num(v) + "/s";
      default: return num(v);
    }
  }

  function fmtTime(t) {
    if (t === null || t === undefined) return "–";
    return new Date(t * 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
  }

  function fmtClock(t) { return new Date(t * 1000).toISOString().slice(11, 19); }

  function timeTick(t, span) {
    var iso = new Date(t * 1000).toISOString();
    if (span > 2 * 86400) return iso.slice(5, 10) + " " + iso.slice(11, 16);
    return Math.round(t) % 60 === 0 ? iso.slice(11, 16) : iso.slice(11, 19);
  }

  function fmtDuration(s) {
    s = Math.max(0, Math.round(s));
    if (s < 60) return s + " s";
    var m = Math.floor(s / 60), r = s % 60;
    if (m < 60) return m + " min" + (r ? " " + r + " s" : "");
    var h = Math.floor(m / 60);
    m = m % 60;
    return h + " h" + (m ? " " + m + " min" : "");
  }

  // ---- DOM ----------------------------------------------------------------------------

  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    if (attrs) {
      Object.keys(attrs).forEach(function (k) {
        var v = attrs[k];
        if (v === null || v === undefined || v === false) return;
        if (k === "text") node.textContent = v;
        else if (k === "style") Object.keys(v).forEach(function (p) { node.style.setProperty(p, v[p]); });
        else node.setAttribute(k, v === true ? "" : v);
      });
    }
    (children || []).forEach(function (c) {
      if (c === null || c === undefined) return;
      node.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
    });
    return node;
  }

  var tip = null;
  function showTip(e, text) {
    if (!tip) { tip = el("div", { id: "vt-tip" }); document.body.appendChild(tip); }
    tip.textContent = text;
    tip.hidden = false;
    var x = Math.min(e.clientX + 12, window.innerWidth - 470);
    tip.style.left = Math.max(4, x) + "px";
    tip.style.top = (e.clientY + 14) + "px";
  }
  function hideTip() { if (tip) tip.hidden = true; }

  // ---- the document ------------------------------------------------------------------

  function causeOf(doc, cause) {
    return doc.causes[cause] || { label: cause, color: "#7f7f7f" };
  }

  function header(doc) {
    var parts = [el("h1", { text: doc.title })];
    if (doc.subtitle) parts.push(el("div", { class: "vt-sub", text: doc.subtitle }));
    if (doc.links && doc.links.length) {
      parts.push(el("nav", { class: "vt-links" }, doc.links.map(function (l) {
        return el("a", { href: l[1], text: l[0] });
      })));
    }
    if (doc.mode === "live") parts.push(el("div", { id: "vt-status", class: "vt-status", text: "updated " + fmtTime(doc.generated_at_unix) }));
    var facts = el("dl", { class: "vt-facts" });
    (doc.facts || []).forEach(function (f) {
      facts.appendChild(el("dt", { text: f[0] }));
      facts.appendChild(el("dd", { text: f[1] }));
    });
    parts.push(facts);
    if (doc.settings && doc.settings.length) {
      parts.push(el("details", { class: "vt-settings" }, [
        el("summary", { text: "Settings in force (" + doc.settings.length + ")" }),
        el("table", null, doc.settings.map(function (s) {
          return el("tr", null, [el("td", { text: s[0] }), el("td", { text: s[1] })]);
        })),
      ]));
    }
    if (doc.skipped && doc.skipped.length) {
      var count = doc.skipped_count || doc.skipped.length;
      parts.push(el("details", null, [
        el("summary", { text: count + " scrape files could not be used" + (count > doc.skipped.length ? " (the first " + doc.skipped.length + " below)" : "") }),
        el("ul", null, doc.skipped.map(function (s) { return el("li", { text: s[0] + ": " + s[1] }); })),
      ]));
    }
    return el("header", null, parts);
  }

  function glance(doc) {
    var all = [];
    doc.sections.forEach(function (s) {
      s.incidents.forEach(function (i) { all.push([s, i]); });
    });
    all.sort(function (a, b) { return a[1].start - b[1].start; });
    var out = [el("h2", { text: doc.mode === "live" ? "Incidents in the last hour" : "What happened" })];
    if (!all.length) {
      out.push(el("p", { class: "vt-none", text: doc.mode === "live" ? "No incident in the last hour." : "No incident: no SLO breach lasted long enough to fire." }));
      return el("section", { class: "vt-glance-section" }, out);
    }
    out.push(el("ol", { class: "vt-glance" }, all.map(function (pair) {
      var s = pair[0], i = pair[1], c = causeOf(doc, i.cause);
      var end = i.end === null ? "still firing" : fmtClock(i.end) + " (" + fmtDuration(i.end - i.start) + ")";
      var changed = (i.changes || []).map(function (ch) {
        return ", " + causeOf(doc, ch.to).label + " from " + fmtClock(ch.at);
      }).join("");
      var opened = changed ? " (opened as " + causeOf(doc, i.opened_as).label + changed + ")" : "";
      return el("li", null, [
        el("span", { class: "vt-swatch", style: { background: c.color } }),
        el("a", { href: "#" + i.id, text: c.label }),
        opened + " " + fmtClock(i.start) + " → " + end + (doc.sections.length > 1 ? " on " + s.title : "") + ": " + i.summary,
      ]);
    })));
    var causes = {};
    all.forEach(function (p) {
      causes[p[1].cause] = true;
      (p[1].segments || []).forEach(function (g) { causes[g.cause] = true; });
    });
    out.push(el("div", { class: "vt-legend" }, Object.keys(causes).map(function (k) {
      var c = causeOf(doc, k);
      return el("span", null, [el("span", { class: "vt-swatch", style: { background: c.color } }), c.label]);
    }).concat([el("span", { class: "vt-muted", text: "lighter: breached, not yet fired; darker: firing" })])));
    return el("section", { class: "vt-glance-section" }, out);
  }

  function evidenceTable(doc, section, incident) {
    var rows = [];
    var deciding = doc.deciding[incident.cause];
    var shown = {};
    (deciding || []).forEach(function (d) {
      if (!(d.key in incident.evidence)) return;
      shown[d.key] = true;
      var v = incident.evidence[d.key];
      var vs = d.vs && section.settings_values[d.vs] !== undefined ? "threshold " + fmt(section.settings_values[d.vs], d.unit) : "";
      rows.push(el("tr", null, [el("th", { text: d.label }), el("td", { text: typeof v === "number" ? fmt(v, d.unit) : String(v) }), el("td", { class: "vt-muted", text: vs })]));
    });
    var rest = Object.keys(incident.evidence).filter(function (k) { return !shown[k]; }).sort();
    var restTable = el("table", { class: "vt-kv" }, rest.map(function (k) {
      var v = incident.evidence[k];
      return el("tr", null, [el("th", { text: k }), el("td", { text: typeof v === "number" ? num(v, 4) : String(v) })]);
    }));
    return [
      rows.length ? el("table", { class: "vt-kv" }, rows) : null,
      rest.length ? el("details", null, [el("summary", { text: (rows.length ? "All evidence" : "Evidence") + " (" + rest.length + (rows.length ? " more" : "") + ")" }), restTable]) : null,
    ];
  }

  function incidentCard(doc, section, i) {
    var c = causeOf(doc, i.cause);
    var when = "started " + fmtTime(i.start);
    when += i.end === null ? ", still firing" : ", ended " + fmtTime(i.end) + " after " + fmtDuration(i.end - i.start);
    if (i.closed_because === "cause_changed") when += " (the cause changed)";
    if (i.breach_began !== null && i.breach_began < i.start) when += "; breached from " + fmtClock(i.breach_began) + ", fired after " + fmtDuration(i.start - i.breach_began);
    var head = [c.label, i.end === null ? el("span", { class: "vt-open", text: "  FIRING" }) : null, "  · confidence " + i.confidence.toFixed(2)];
    if (i.opened_because === "cause_changed") head.push("  · took over from the previous cause");
    var changes = i.changes || [];
    if (changes.length) head.push("  · opened as " + causeOf(doc, i.opened_as).label);
    var parts = [
      el("h3", null, head),
      el("div", { class: "vt-when", text: when }),
    ];
    if (changes.length) {
      parts.push(el("ul", { class: "vt-changes" }, changes.map(function (ch) {
        return el("li", { "data-change": String(ch.at), text: fmtClock(ch.at) + "  cause changed from " + causeOf(doc, ch.from).label + " to " + causeOf(doc, ch.to).label + ": " + ch.why });
      })));
    }
    parts = parts.concat([
      el("div", { class: "vt-summary", text: i.summary || "(resolved before its evidence was kept)" }),
    ]).concat(evidenceTable(doc, section, i));
    if (i.breaches.length) parts.push(el("div", { class: "vt-muted", text: "SLOs breached: " + i.breaches.join(", ") }));
    var contributing = i.contributing || [];
    if (contributing.length) {
      parts.push(el("div", null, [el("strong", { text: "Contributing:" })]));
      parts.push(el("ul", { class: "vt-contributing" }, contributing.map(function (k) {
        return el("li", { "data-cause": k.cause, text: causeOf(doc, k.cause).label + " (" + Math.round(k.share * 100) + " % of the evidence): " + k.evidence });
      })));
    } else {
      parts.push(el("div", null, [el("strong", { text: "Contributing: " }), i.secondary.length ? i.secondary.map(function (k) { return causeOf(doc, k).label; }).join(", ") : "none"]));
    }
    if (i.remediation.length) {
      parts.push(el("div", null, [el("strong", { text: "What to change:" })]));
      var effects = i.remediation_effects || [];
      parts.push(el("ol", null, i.remediation.map(function (r, n) {
        // The fix, and under it its predicted before -> after (or why there is none).
        var e = effects[n];
        var shown = e && e.predicted !== null ? el("div", { class: "vt-effect", text: "Predicted: " + e.text }) : null;
        return el("li", null, [r, shown]);
      })));
    }
    return el("article", { class: "vt-incident", id: i.id, "data-incident": i.id, "data-cause": i.cause, style: { "--cause": c.color } }, parts);
  }

  // ---- charts -------------------------------------------------------------------------

  function hasData(arr) {
    for (var k = 0; k < arr.length; k++) if (arr[k] !== null) return true;
    return false;
  }

  function panelData(section, panel) {
    var data = [section.t];
    panel.series.forEach(function (s) {
      var col = section.values[s.key];
      if (!col) {
        var v = section.settings_values[s.key];
        col = section.t.map(function () { return v === undefined ? null : v; });
      }
      data.push(col);
    });
    return data;
  }

  function isSetting(key) { return /^(slo|thresholds|ceiling)\./.test(key); }

  function placeOverlays(u, doc, section, overlay) {
    overlay.textContent = "";
    var width = u.over.clientWidth;
    var xmax = u.scales.x.max;
    function x(t) { return u.valToPos(t, "x"); }
    section.incidents.forEach(function (i) {
      // One band per stretch of one cause: an episode that changed cause is shaded by
      // each cause in turn (the lead-up before it fired in the cause it opened with).
      var segments = i.segments && i.segments.length ? i.segments : [{ start: i.start, end: i.end, cause: i.cause }];
      var pieces = [];
      if (i.breach_began !== null && i.breach_began < i.start) pieces.push([i.breach_began, i.start, " vt-pending", segments[0].cause]);
      segments.forEach(function (g) { pieces.push([g.start, g.end === null ? xmax : g.end, "", g.cause]); });
      pieces.forEach(function (p) {
        var left = Math.max(0, x(p[0])), right = Math.min(width, x(p[1]));
        if (right < 0 || left > width) return;
        overlay.appendChild(el("div", {
          class: "vt-band" + p[2], "data-incident": i.id, "data-cause": p[3],
          style: { left: left + "px", width: Math.max(2, right - left) + "px", background: causeOf(doc, p[3]).color },
        }));
      });
    });
    section.transitions.forEach(function (t) {
      var left = x(t.at);
      if (left < -4 || left > width + 4) return;
      var c = causeOf(doc, t.cause);
      var text = fmtTime(t.at) + "  " + t.event.toUpperCase() + " " + c.label + (t.reason === "cause_changed" ? " (cause changed)" : "") + "\n" + t.text;
      var m = el("div", {
        class: "vt-marker vt-" + t.event, "data-at": String(t.at), "data-cause": t.cause, "data-summary": text,
        "aria-label": text, style: { left: left + "px", "--cause": c.color },
      });
      m.addEventListener("mousemove", function (e) { showTip(e, text); });
      m.addEventListener("mouseleave", hideTip);
      overlay.appendChild(m);
    });
  }

  function yRange(unit) {
    return function (u, min, max) {
      if (max === null || max === undefined || !isFinite(max)) return [0, unit === "ratio" ? 1 : 1];
      if (unit === "ratio") return [0, Math.max(1, max * 1.05)];
      return [0, max > 0 ? max * 1.12 : 1];
    };
  }

  function makeChart(doc, section, panel, host, group) {
    var data = panelData(section, panel);
    var empty = !panel.series.some(function (s, k) { return !isSetting(s.key) && hasData(data[k + 1]); });
    var series = [{ label: "time (UTC)", value: function (u, v) { return v === null ? "–" : fmtTime(v); } }];
    panel.series.forEach(function (s, k) {
      var unit = s.axis === "right" ? panel.right_unit : panel.unit;
      var setting = isSetting(s.key);
      series.push({
        label: s.label + (!setting && !hasData(data[k + 1]) ? " (no data)" : ""),
        stroke: s.color, width: setting ? 1 : 1.6, dash: setting ? [6, 4] : undefined,
        scale: s.axis === "right" ? "r" : "y", spanGaps: false, points: { show: false },
        value: function (u, v) { return fmt(v, unit); },
      });
    });
    var axes = [
      { values: function (u, splits) { return splits.map(function (t) { return timeTick(t, u.scales.x.max - u.scales.x.min); }); } },
      { scale: "y", size: 64, values: function (u, vals) { return vals.map(function (v) { return fmtAxis(v, panel.unit); }); } },
    ];
    var scales = { x: { time: true }, y: { range: yRange(panel.unit) } };
    if (panel.right_unit) {
      scales.r = { range: yRange(panel.right_unit) };
      axes.push({ scale: "r", side: 1, size: 64, grid: { show: false }, values: function (u, vals) { return vals.map(function (v) { return fmtAxis(v, panel.right_unit); }); } });
    } else {
      // An empty right axis of the same width, so every panel's time axis lines up.
      axes.push({ scale: "y", side: 1, size: 64, grid: { show: false }, ticks: { show: false }, values: function (u, vals) { return vals.map(function () { return ""; }); } });
    }
    var overlay = el("div", { class: "vt-overlay" });
    var opts = {
      width: Math.max(320, host.clientWidth - 18), height: 150,
      tzDate: function (ts) { return uPlot.tzDate(new Date(ts * 1000), "Etc/UTC"); },
      series: series, axes: axes, scales: scales,
      cursor: {
        sync: { key: group.key }, drag: { x: true, y: false },
        // Double-click shows the whole span again (the recording, or the last hour).
        bind: { dblclick: function (self, target, handler) {
          return function (e) { if (group.doc.range) fullRange(group); else handler(e); return null; };
        } },
      },
      legend: { live: true },
      hooks: {
        ready: [function (u) { u.over.appendChild(overlay); }],
        draw: [function (u) { placeOverlays(u, group.doc, group.section, overlay); }],
        setScale: [function (u, key) {
          if (key !== "x" || group.syncing) return;
          if (!group.programmatic && group.doc.range) {
            var full = group.doc.range[1] - group.doc.range[0];
            group.zoomed = u.scales.x.max - u.scales.x.min < 0.98 * full;
          }
          group.syncing = true;
          group.charts.forEach(function (o) {
            if (o !== u) o.setScale("x", { min: u.scales.x.min, max: u.scales.x.max });
          });
          group.syncing = false;
        }],
      },
    };
    var title = el("div", { class: "vt-panel-title" }, [panel.title, empty ? el("span", { class: "vt-panel-note", text: panel.empty }) : null]);
    var box = el("div", { class: "vt-panel" + (empty ? " vt-empty" : ""), "data-panel": panel.id, "data-section": section.id }, [title]);
    host.appendChild(box);
    var u = new uPlot(opts, data, box);
    u.vtPanel = panel;
    return u;
  }

  // ---- the page -----------------------------------------------------------------------

  var groups = [];
  var shape = null;

  function sectionNode(doc, s) {
    var parts = [el("h2", { text: s.title })];
    if (s.state_text) parts.push(el("div", { class: s.firing ? "vt-open" : "vt-muted", text: s.state_text }));
    if (s.note) parts.push(el("div", { class: "vt-muted", text: s.note }));
    var info = counted(s.evaluations, "evaluation");
    if (s.thinned) info += ", drawn as " + counted(s.t.length, "point") + " (the minimum and maximum of each time slice; incidents exact)";
    parts.push(el("div", { class: "vt-muted", text: info + ". Drag across a chart to zoom, double-click to zoom out; hover a marker for its transition." }));
    var charts = el("div", { class: "vt-charts" });
    parts.push(charts);
    if (s.incidents.length) {
      parts.push(el("h3", { class: "vt-incidents-title", text: "Incidents, the evidence that decided them, and what to change" }));
      parts.push(el("div", { class: "vt-incidents" }, s.incidents.map(function (i) { return incidentCard(doc, s, i); })));
    }
    return { node: el("section", { class: "vt-section", "data-section": s.id, "data-target": s.target || "" }, parts), charts: charts };
  }

  function signature(doc) {
    return doc.sections.map(function (s) { return s.id; }).join("|") + "#" + doc.panels.map(function (p) { return p.id; }).join("|");
  }

  function render(doc) {
    page.doc = doc;
    var app = document.getElementById("vt-app");
    if (doc.mode === "live" && shape === signature(doc) && groups.length) {
      update(doc);
      return;
    }
    groups.forEach(function (g) { g.charts.forEach(function (u) { u.destroy(); }); });
    groups = [];
    app.textContent = "";
    document.title = doc.title;
    app.appendChild(header(doc));
    app.appendChild(el("div", { id: "vt-glance" }, [glance(doc)]));
    if (!doc.sections.length) app.appendChild(el("p", { class: "vt-none", text: doc.empty || "Nothing to show yet." }));
    doc.sections.forEach(function (s) {
      var made = sectionNode(doc, s);
      app.appendChild(made.node);
      var group = { key: "vt-" + s.id, charts: [], syncing: false, programmatic: false, zoomed: false, doc: doc, section: s, node: made.node };
      doc.panels.forEach(function (p) { group.charts.push(makeChart(doc, s, p, made.charts, group)); });
      fullRange(group);
      groups.push(group);
    });
    shape = signature(doc);
    showTarget();
    done();
  }

  // An alert's link opens the page at its target (?target=NAME): scroll to it, once.
  var targetShown = false;
  function showTarget() {
    if (targetShown) return;
    var want = new URLSearchParams(window.location.search).get("target");
    if (!want) return;
    var found = Array.prototype.find.call(document.querySelectorAll(".vt-section"), function (n) {
      return n.getAttribute("data-target") === want;
    });
    if (!found) return;
    targetShown = true;
    found.classList.add("vt-wanted");
    found.scrollIntoView();
  }

  function fullRange(group) {
    var range = group.doc.range;
    if (!range) return;
    group.programmatic = true;
    group.zoomed = false;
    group.charts[0].setScale("x", { min: range[0], max: range[1] });
    group.programmatic = false;
  }

  function update(doc) {
    var status = document.getElementById("vt-status");
    if (status) { status.className = "vt-status"; status.textContent = "updated " + fmtTime(doc.generated_at_unix); }
    var glanceBox = document.getElementById("vt-glance");
    glanceBox.textContent = "";
    glanceBox.appendChild(glance(doc));
    doc.sections.forEach(function (s, k) {
      var g = groups[k];
      var fresh = sectionNode(doc, s);
      // Keep the charts (and the reader's zoom); replace the words around them.
      var old = g.node;
      var keep = old.querySelector(".vt-charts");
      fresh.node.replaceChild(keep, fresh.charts);
      old.parentNode.replaceChild(fresh.node, old);
      g.node = fresh.node;
      g.section = s;
      g.doc = doc;
      g.charts.forEach(function (u) { u.setData(panelData(s, u.vtPanel), false); });
      // Follow the last hour, unless the reader zoomed in to look at something.
      if (!g.zoomed) fullRange(g);
      else g.charts.forEach(function (u) { u.redraw(false, false); });
    });
    done();
  }

  function done() {
    requestAnimationFrame(function () {
      page.renders += 1;
      page.rendered = true;
      if (page.renderedAt === null) page.renderedAt = performance.now();
    });
  }

  window.addEventListener("resize", function () {
    groups.forEach(function (g) {
      g.charts.forEach(function (u) {
        var w = Math.max(320, u.root.parentNode.clientWidth - 18);
        u.setSize({ width: w, height: 150 });
      });
    });
  });

  var boot = JSON.parse(document.getElementById("vt-data").textContent);

  function poll() {
    fetch(boot.source, { cache: "no-store", headers: { Accept: "application/json" } })
      .then(function (r) {
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.json();
      })
      .then(function (doc) {
        // A section's placeOverlays reads its doc through the closure: rebuild on change.
        render(doc);
      }, function (err) {
        var status = document.getElementById("vt-status");
        var text = "cannot reach the daemon (" + err.message + "); retrying every " + boot.refresh_seconds + " s";
        if (status) { status.className = "vt-status vt-bad"; status.textContent = text; }
        else document.getElementById("vt-app").textContent = text;
      })
      .then(function () { setTimeout(poll, boot.refresh_seconds * 1000); });
  }

  if (boot.mode === "live" && boot.source) poll();
  else render(boot);
})();

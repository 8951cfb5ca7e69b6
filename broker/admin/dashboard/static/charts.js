// fencepost dashboard: line charts drawn as SVG by this script, over the last 15 minutes.
// Nothing is fetched from elsewhere; every label goes into the chart as text (textContent).
"use strict";
// eslint-disable-next-line no-unused-vars
const FencepostCharts = (function () {
  const WIDTH = 640;
  const HEIGHT = 180;
  const MARGIN = { left: 52, right: 10, top: 10, bottom: 22 };
  const SERIES_CLASSES = 8;

  // The SVG namespace of the chart's own element: the page declares it, this script names no address.
  function make(svg, name, attributes, text) {
    const el = document.createElementNS(svg.namespaceURI, name);
    Object.entries(attributes || {}).forEach(([k, v]) => el.setAttribute(k, String(v)));
    if (text !== undefined) el.textContent = text;
    return el;
  }

  // A round top for the value axis: 1, 2 or 5 times a power of ten, at least the largest value.
  function niceTop(max) {
    if (!(max > 0)) return 1;
    const power = Math.pow(10, Math.floor(Math.log10(max)));
    for (const step of [1, 2, 5, 10]) {
      if (step * power >= max) return step * power;
    }
    return 10 * power;
  }

  function label(value, unit) {
    const shown = value >= 100 ? value.toFixed(0) : value >= 10 ? value.toFixed(1) : value.toFixed(2);
    return shown.replace(/\.0+$/, "").replace(/(\.\d*?)0+$/, "$1") + (unit ? " " + unit : "");
  }

  // The points of one series as path pieces: a gap (null) starts a new piece.
  function pieces(times, values, x, y) {
    const out = [];
    let current = [];
    values.forEach((v, i) => {
      if (v === null || v === undefined) {
        if (current.length) out.push(current);
        current = [];
        return;
      }
      current.push([x(times[i]), y(v)]);
    });
    if (current.length) out.push(current);
    return out;
  }

  // Draw `spec` into `svg`: {times, end, windowS, unit, series: [{name, values}], markers: [{t, text}]}.
  // The svg's data-points says how many points were drawn (0: no data yet).
  function draw(svg, legend, spec) {
    svg.setAttribute("viewBox", "0 0 " + WIDTH + " " + HEIGHT);
    const plotW = WIDTH - MARGIN.left - MARGIN.right;
    const plotH = HEIGHT - MARGIN.top - MARGIN.bottom;
    const start = spec.end - spec.windowS;
    const x = (t) => MARGIN.left + ((t - start) / spec.windowS) * plotW;
    let max = 0;
    spec.series.forEach((s) => s.values.forEach((v) => { if (typeof v === "number" && v > max) max = v; }));
    const top = niceTop(max);
    const y = (v) => MARGIN.top + plotH - (v / top) * plotH;
    const children = [];
    [0, 0.5, 1].forEach((f) => {
      const at = y(top * f);
      children.push(make(svg, "line", { class: "grid", x1: MARGIN.left, x2: WIDTH - MARGIN.right, y1: at, y2: at }));
      children.push(make(svg, "text", { class: "axis", x: MARGIN.left - 4, y: at + 4, "text-anchor": "end" },
        label(top * f, spec.unit)));
    });
    [15, 10, 5, 0].forEach((minutes) => {
      const at = x(spec.end - minutes * 60);
      children.push(make(svg, "text", { class: "axis", x: at, y: HEIGHT - 6, "text-anchor": "middle" },
        minutes ? "-" + minutes + " min" : "now"));
    });
    (spec.markers || []).forEach((m) => {
      if (m.t < start) return;
      const line = make(svg, "line", {
        class: "leader-change", x1: x(m.t), x2: x(m.t), y1: MARGIN.top, y2: MARGIN.top + plotH,
      });
      line.appendChild(make(svg, "title", {}, m.text));
      children.push(line);
    });
    let points = 0;
    spec.series.forEach((s, index) => {
      const cls = "series s" + (index % SERIES_CLASSES);
      pieces(spec.times, s.values, x, y).forEach((piece) => {
        points += piece.length;
        if (piece.length === 1) {
          children.push(make(svg, "circle", { class: cls, cx: piece[0][0], cy: piece[0][1], r: 2 }));
          return;
        }
        const d = piece.map((p, i) => (i ? "L" : "M") + p[0].toFixed(1) + " " + p[1].toFixed(1)).join(" ");
        children.push(make(svg, "path", { class: cls, d: d }));
      });
    });
    if (!points) {
      children.push(make(svg, "text", { class: "axis", x: WIDTH / 2, y: HEIGHT / 2, "text-anchor": "middle" },
        "no data yet"));
    }
    svg.replaceChildren(...children);
    svg.dataset.points = String(points);
    legend.replaceChildren(...spec.series.map((s, index) => {
      const li = document.createElement("li");
      li.className = "s" + (index % SERIES_CLASSES);
      li.textContent = s.name;
      return li;
    }));
  }

  return { draw: draw };
})();

// The decode explorer's browser side (anywidget ES module of ggviz/viz/widgets/explorer.py: ExplorerPane).
// The kernel sends the three pictures and a per-node table once; a selection is then applied here, in the browser,
// by rewriting one <style> element, so a click costs no round trip and no re-layout of the 2,000-vertex graph.
// The values pane shows `values_html`, which whoever holds the values sets when `selected` changes: the kernel in a
// live notebook, the recorded table in the static book (book_model.js), synchronously.
// Its stylesheet is explorer.css (anywidget's _css).
function render({ model, el }) {
  const P = model.get("prefix"), GP = model.get("gprefix");
  const nodes = JSON.parse(model.get("nodes"));
  const phases = JSON.parse(model.get("phases"));
  el.classList.add("ggv-explorer-live");
  el.innerHTML = `
  <style class="ggv-x-sel"></style>
  <div class="ggv-x-spine"></div>
  <div class="ggv-x-timing-note" style="font:11px sans-serif;color:#546e7a;margin:1px 0 2px 4px"></div>
  <div class="ggv-x-phase-text" style="font:12px sans-serif;margin:2px 0 6px 4px;color:#37474f"></div>
  <div class="ggv-x-phase-detail" style="display:none;margin:2px 0 6px 4px"></div>
  <div style="margin:4px 0">
    <input class="ggv-x-search" list="${P}names" placeholder="search a node or tensor by name, Enter"
           style="width:320px;font-size:12px"/>
    <datalist id="${P}names"></datalist>
    <button class="ggv-x-prev" title="the node before, in execution order">◀ node</button>
    <button class="ggv-x-next" title="the next node, in execution order">node ▶</button>
    <button class="ggv-x-fit">whole graph</button>
    <span style="font:11px sans-serif;color:#546e7a">red: the selection, blue: what it reads (src[])</span>
    <span class="ggv-x-info" style="font:12px sans-serif;margin-left:8px"></span>
  </div>
  <div class="ggv-x-row">
    <div class="ggv-x-pane" style="flex:1 1 55%;min-width:0"><div class="ggv-x-title">graph (drag: pan, wheel: zoom)</div>
      <div class="ggv-x-graph"><div class="ggv-x-gin"></div></div></div>
    <div style="flex:1 1 45%;min-width:0">
      <div class="ggv-x-pane"><div class="ggv-x-title">scheduler: backend and cause</div><div class="ggv-x-cause"></div></div>
      <div class="ggv-x-pane"><div class="ggv-x-title">bytes</div><div class="ggv-x-bytes"></div></div>
      <div class="ggv-x-pane"><div class="ggv-x-title">thread lanes</div><div class="ggv-x-lanes-text"></div></div>
    </div>
  </div>
  <div class="ggv-x-pane"><div class="ggv-x-title">the compute buffer (ggml_gallocr's plan): red = the selection's
    bytes, orange = other tensors in those bytes</div><div class="ggv-x-plan-note"
    style="font:11px sans-serif;color:#546e7a"></div><div class="ggv-x-mem"></div></div>
  <div class="ggv-x-pane"><div class="ggv-x-title">the same, zoomed on the selection: <span class="ggv-x-memz-range">80 nodes
    around it</span></div>
    <div class="ggv-x-memz"></div></div>
  <div class="ggv-x-pane"><div class="ggv-x-title">thread lanes of ggml_graph_compute (zoomed on the selection; grey:
    ggml_barrier)</div><div class="ggv-x-lanes-note" style="font:11px sans-serif;color:#546e7a;margin-bottom:2px">
    </div><div class="ggv-x-lanes" style="display:flex"><div class="ggv-x-lanes-lab"
    style="font:11px sans-serif;width:60px"></div><div style="flex:1"><div class="ggv-x-lanes-svg"></div>
    <div class="ggv-x-lanes-axis" style="position:relative;height:16px;font:10px sans-serif;color:#455a64;
    border-top:1px solid #90a4ae"></div></div></div></div>
  <div class="ggv-x-pane"><div class="ggv-x-title">values (copied by cb_eval)</div>
    <div class="ggv-explorer-values" style="min-height:60px"></div></div>`;
  const q = (s) => el.querySelector(s);
  const gbox = q(".ggv-x-graph"), gin = q(".ggv-x-gin");
  gbox.style.height = model.get("max_height");
  gin.innerHTML = model.get("graph_svg");
  q(".ggv-x-mem").innerHTML = model.get("mem_svg");
  q(".ggv-x-memz").innerHTML = model.get("memz_svg");
  const zsvg = q(".ggv-x-memz svg");
  if (zsvg) zsvg.setAttribute("width", "100%");
  const zre = new RegExp("#" + P + "([mbx]\\d+)", "g");
  q(".ggv-x-lanes-svg").innerHTML = model.get("lanes_svg");
  q(".ggv-x-lanes-note").textContent = model.get("lanes_note");
  q(".ggv-x-plan-note").textContent = model.get("plan_note");
  const nth = model.get("n_threads");
  q(".ggv-x-lanes-lab").innerHTML = [...Array(nth).keys()].map(i => `<div style="height:26px">thread ${i}</div>`).join("");
  const lsvg = q(".ggv-x-lanes-svg svg");
  if (lsvg) { lsvg.setAttribute("width", "100%"); }
  const tEnd = lsvg ? parseFloat(lsvg.getAttribute("data-t-end")) : 0;
  requestAnimationFrame(() => timeAxis());      // (defined below; the lanes open on the whole compute)
  const dl = q("datalist");
  const byName = {};
  for (const [k, d] of Object.entries(nodes)) { if (d.name && !(d.name in byName)) byName[d.name] = k; }
  dl.innerHTML = Object.keys(byName).map(n => `<option value="${n.replace(/"/g, "&quot;")}"></option>`).join("");
  // ---- pan and zoom of the graph: a CSS transform on the SVG's wrapper
  let s = 1, tx = 0, ty = 0;
  const apply = () => { gin.style.transform = `translate(${tx}px, ${ty}px) scale(${s})`; };
  const fit = () => {
    const svg = gin.querySelector("svg"); if (!svg) return;
    const w = svg.getBoundingClientRect().width / s, h = svg.getBoundingClientRect().height / s;
    s = Math.min(gbox.clientWidth / w, gbox.clientHeight / h, 1); tx = 0; ty = 0; apply();
  };
  gbox.addEventListener("wheel", (e) => {
    e.preventDefault();
    const r = gbox.getBoundingClientRect(), mx = e.clientX - r.left, my = e.clientY - r.top;
    const f = Math.exp(-e.deltaY * 0.0015), ns = Math.min(Math.max(s * f, 0.02), 4);
    tx = mx - (mx - tx) * ns / s; ty = my - (my - ty) * ns / s; s = ns; apply();
  }, { passive: false });
  let drag = null, moved = false;
  gbox.addEventListener("mousedown", (e) => { drag = [e.clientX, e.clientY, tx, ty]; moved = false; });
  window.addEventListener("mousemove", (e) => {
    if (!drag) return;
    const dx = e.clientX - drag[0], dy = e.clientY - drag[1];
    if (Math.abs(dx) + Math.abs(dy) > 3) moved = true;
    tx = drag[2] + dx; ty = drag[3] + dy; apply();
  });
  window.addEventListener("mouseup", () => { drag = null; });
  // vertex centres in the SVG's own pixels, measured once (a selection then moves the picture without a layout)
  let centres = null, boxW = 0, boxH = 0;
  const measure = () => {
    const svg = gin.querySelector("svg"); if (!svg) return;
    const vb = svg.viewBox.baseVal, k = vb && vb.width ? svg.width.baseVal.value / vb.width : 1;
    const m = (svg.querySelector("g.graph") || svg).getCTM();
    centres = {};
    for (const g of svg.querySelectorAll("g.node")) {
      const b = g.getBBox(), c = g.getCTM();
      const x = b.x + b.width / 2, y = b.y + b.height / 2;
      centres[g.id] = [(c.a * x + c.c * y + c.e - (m ? 0 : 0)) , (c.b * x + c.d * y + c.f)];
    }
    const r = svg.getBoundingClientRect(), g0 = gbox.getBoundingClientRect();
    const probe = svg.querySelector("g.node");
    if (probe) {          // the CTM is relative to the viewport of the <svg>: check its scale against the screen once
      const pr = probe.getBoundingClientRect(), c = centres[probe.id];
      centres.__k = (pr.left + pr.width / 2 - r.left) / s / (c[0] || 1);
    }
    boxW = gbox.clientWidth; boxH = gbox.clientHeight;
  };
  const center = (vid) => {
    if (!centres) measure();
    const c = centres && centres[GP + vid]; if (!c) return;
    if (s < 0.5) s = 0.9;     // 8 pt labels at 9.6 px: the frame as it opens (and prints) stays readable (#21)
    const k = centres.__k || 1;
    tx = boxW / 2 - c[0] * k * s; ty = boxH / 2 - c[1] * k * s;
    apply();
  };
  // ---- the selection: applied here, in the browser, from the table sent once
  const selStyle = q("style.ggv-x-sel");
  // the CSS of a selection (DecodeExplorer.css_for writes the same rules in Python, for the static rendering)
  const cssOf = (key, d) => {
    const out = [];
    if (d.src.length) out.push(d.src.map(v => `#${GP}${v} path, #${GP}${v} polygon, #${GP}${v} ellipse`).join(", ") +
                               ` { stroke: #1565c0 !important; stroke-width: 4px !important; }`);
    if (d.v) out.push(`#${GP}${d.v} path, #${GP}${d.v} polygon, #${GP}${d.v} ellipse ` +
                      `{ stroke: #d50000 !important; stroke-width: 5px !important; }`);
    if (d.item !== null) {
      out.push(`#${P}m${d.item} { stroke: #d50000 !important; stroke-width: 2.5px !important; }`);
      out.push(`#${P}b${d.item} { display: inline !important; }`);
      if (d.sh.length) out.push(d.sh.map(o => `#${P}m${o}`).join(", ") +
                                ` { stroke: #ef6c00 !important; stroke-width: 1.5px !important; }`);
    }
    if (key[0] === "n") {
      const i = key.slice(1);
      out.push(`#${P}x${i} { display: inline !important; }`);
      out.push(`.${P}s${i} { fill: #d50000 !important; stroke: #d50000 !important; stroke-width: 3px !important; }`);
    }
    return out.join("\n");
  };
  // the lanes' time axis (µs since the compute started), for the part of the compute the lanes show now
  const timeAxis = () => {
    const ax = q(".ggv-x-lanes-axis"), vb = lsvg && lsvg.viewBox.baseVal;
    if (!ax || !vb || !vb.width) return;
    const raw = vb.width / 5, mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((m) => m * mag).find((x) => x >= raw);
    const ticks = [];
    for (let t = Math.ceil(vb.x / step) * step; t <= vb.x + vb.width; t += step) {
      const pct = (100 * (t - vb.x) / vb.width).toFixed(2);
      ticks.push(`<span style="position:absolute;left:${pct}%;top:0;border-left:1px solid #90a4ae;height:4px"></span>` +
                 `<span style="position:absolute;left:${pct}%;top:3px;transform:translateX(-50%)">${+t.toFixed(1)}</span>`);
    }
    ax.innerHTML = ticks.join("") + `<span style="position:absolute;right:0;top:3px;background:#fff">µs</span>`;
  };
  const select = (key, fromUser) => {
    const t0 = performance.now();
    const d = nodes[key];
    if (!d) { selStyle.textContent = ""; el.setAttribute("data-ggv-selected", ""); return; }
    const css = cssOf(key, d);
    selStyle.textContent = css + "\n" + css.replace(zre, "#" + P + "z$1");
    q(".ggv-x-info").innerHTML = d.info;
    q(".ggv-x-cause").innerHTML = d.cause;
    q(".ggv-x-bytes").innerHTML = d.bytes;
    q(".ggv-x-lanes-text").innerHTML = d.lanes;
    if (lsvg) {
      const n = nth * 26;
      // explorer.py's lanes_window: the node with 3x its length each side, kept inside the compute
      if (d.t) { const pad = Math.max(3 * (d.t[1] - d.t[0]), 150);
                 const w = tEnd > 0 ? Math.min(d.t[1] - d.t[0] + 2 * pad, tEnd) : d.t[1] - d.t[0] + 2 * pad;
                 const x = Math.min(Math.max(d.t[0] - pad, 0), Math.max(tEnd - w, 0));
                 lsvg.setAttribute("viewBox", `${x} 0 ${w} ${n}`); }
      else lsvg.setAttribute("viewBox", `0 0 ${tEnd} ${n}`);
      timeAxis();
    }
    if (d.v) center(d.v);
    if (zsvg) {
      const h = zsvg.viewBox.baseVal.height, n = parseFloat(zsvg.getAttribute("data-n"));
      const i = key[0] === "n" ? parseInt(key.slice(1)) + 1 : 0;
      const a = Math.min(Math.max(i - 40, 0), n - 80);
      zsvg.setAttribute("viewBox", `${a} 0 80 ${h}`);
      q(".ggv-x-memz-range").textContent = `nodes ${a - 1} .. ${a + 78} (x: node index, y: offset as above)`;
    }
    el.setAttribute("data-ggv-selected", key);
    if (fromUser && model.get("selected") !== key) { model.set("selected", key); model.save_changes(); }
    el.setAttribute("data-ggv-sel-ms", (performance.now() - t0).toFixed(2));
  };
  const setPhase = (key, fromUser) => {
    const ph = phases.find(p => p.key === key);
    el.querySelectorAll(".ggv-x-phase").forEach(b => b.classList.toggle("on", b.dataset.key === key));
    q(".ggv-x-phase-text").textContent = ph ? ph.text : "";
    // a phase with a pane of its own (the sampler chain of "sample"): shown under its text while it is selected
    const det = q(".ggv-x-phase-detail");
    det.innerHTML = ph && ph.html ? ph.html : "";
    det.style.display = ph && ph.html ? "" : "none";
    if (fromUser) { model.set("phase", key); model.save_changes(); }
    if (ph && ph.select) select(ph.select, fromUser);
  };
  q(".ggv-x-spine").innerHTML = phases.map((p, i) =>
    `<span class="ggv-x-phase" data-key="${p.key}" title="${p.text.replace(/"/g, "&quot;")}">${p.fn}` +
    (p.ms ? ` <small>${p.ms.toFixed(1)} ms</small>` : "") +
    (p.ms_next !== null && p.ms_next !== undefined ? ` <small style="color:#2e7d32">· next ${p.ms_next.toFixed(1)}</small>` : "") +
    `</span>` + (i < phases.length - 1 ? " → " : "")).join("");
  q(".ggv-x-timing-note").textContent = model.get("timing_note") || "";
  el.querySelectorAll(".ggv-x-phase").forEach(b => b.addEventListener("click", () => setPhase(b.dataset.key, true)));
  // clicks in the pictures: a graph vertex (id GP + n12 / l3), a buffer slot (P + m7), a lane span (class P + s12)
  const slotNode = {};
  for (const [k, d] of Object.entries(nodes)) {
    if (d.item !== null && k[0] === "n" && !(d.item in slotNode)) slotNode[d.item] = k;
  }
  el.addEventListener("click", (e) => {
    if (moved) { moved = false; return; }
    let n = e.target;
    while (n && n !== el) {
      if (n.id && n.id.startsWith(GP)) {
        const v = n.id.slice(GP.length);
        if (/^[nl]\d+$/.test(v)) { select(v, true); return; }
      }
      if (n.id && n.id.startsWith(P + "m")) { const k = slotNode[n.id.slice(P.length + 1)]; if (k) { select(k, true); return; } }
      const c = n.getAttribute && n.getAttribute("class");
      if (c) { const m = c.match(new RegExp(P + "s(\\d+)")); if (m) { select("n" + m[1], true); return; } }
      n = n.parentNode;
    }
  });
  const search = q(".ggv-x-search");
  const doSearch = () => { const k = byName[search.value.trim()]; if (k) select(k, true);
                           search.style.background = k ? "" : "#ffebee"; };
  search.addEventListener("keydown", (e) => { if (e.key === "Enter") doSearch(); });
  search.addEventListener("change", doSearch);
  q(".ggv-x-fit").addEventListener("click", fit);
  const stepNode = (k) => {
    const cur = el.getAttribute("data-ggv-selected") || "n-1";
    const i = cur[0] === "n" ? parseInt(cur.slice(1)) + k : 0;
    if (("n" + i) in nodes) select("n" + i, true);
  };
  q(".ggv-x-prev").addEventListener("click", () => stepNode(-1));
  q(".ggv-x-next").addEventListener("click", () => stepNode(1));
  const values = q(".ggv-explorer-values");
  const showValues = () => { values.innerHTML = model.get("values_html") || "<i>select a node</i>"; };
  model.on("change:values_html", showValues);
  showValues();
  model.on("change:selected", () => select(model.get("selected"), false));
  model.on("change:phase", () => setPhase(model.get("phase"), false));
  requestAnimationFrame(() => { fit(); measure(); if (model.get("phase")) setPhase(model.get("phase"), false);
                                if (model.get("selected")) select(model.get("selected"), false); });
}
export default { render };

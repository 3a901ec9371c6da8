// StepperPane (anywidget ES module of ggviz/viz/widgets/_base.py): a recording stepped through like a debugger --
// DecodeStepper (one decode, node by node) and VisitAnimation (ggml_visit_parents, event by event).
// The view sets `pos` (buttons, slider, arrow keys, play, a click on a graph vertex, a name typed in the search);
// whoever holds the recording answers with `frame` (JSON: {css, focus, panel, mem}) and, when the picture changes
// (another layer open), `svg`: the kernel in a live notebook, the recorded table in the static book (book_model.js).
// `nodes` (JSON, optional): the node table of a decode -- name, buffer, offset, bytes -- from which the memory bar
// and "same bytes also used by" of frame.mem are drawn here, once per step, instead of being recorded per step.
function render({ model, el }) {
  const J = (k, d) => { const v = model.get(k); return v ? JSON.parse(v) : d; };
  const n = model.get("n"), names = J("names", []), clicks = J("clicks", {}), table = J("nodes", null);
  const label = model.get("label") || "step";
  el.innerHTML = `<div class="ggv-st" tabindex="0" style="outline:none">
  <div class="ggv-st-head" style="font:13px sans-serif;margin:2px 0 4px 0"></div>
  <div class="ggv-st-bar" style="display:flex;gap:6px;align-items:center;flex-wrap:wrap;font:12px sans-serif;margin-bottom:4px">
    <button class="ggv-st-play" title="play / pause">▶ play</button>
    <button class="ggv-st-prev" title="the ${label} before (←)">◀ step back</button>
    <button class="ggv-st-next" title="the next ${label} (→)">step ▶</button>
    <input class="ggv-st-range" type="range" min="0" max="${n - 1}" value="0" style="width:420px"/>
    <span class="ggv-st-pos" style="min-width:110px"></span>
    <input class="ggv-st-find" placeholder="go to ${label} name, Enter" list="ggv-st-names-${Math.random().toString(36).slice(2)}"
           style="width:200px;font-size:12px"/><datalist></datalist>
  </div>
  <div style="display:flex;gap:14px;align-items:flex-start">
    <div><style class="ggv-st-style"></style>
      <div class="ggv-st-box" style="overflow:auto;border:1px solid #ddd;cursor:pointer"></div></div>
    <div class="ggv-st-panel" style="min-width:0"></div></div></div>`;
  const q = (s) => el.querySelector(s);
  const root = q(".ggv-st"), box = q(".ggv-st-box"), range = q(".ggv-st-range"), find = q(".ggv-st-find");
  const dl = q("datalist");
  dl.id = find.getAttribute("list");
  q(".ggv-st-head").innerHTML = model.get("header") || "";
  if (!model.get("play")) q(".ggv-st-play").style.display = "none";
  const byName = {};
  names.forEach((nm, i) => { if (nm && !(nm in byName)) byName[nm] = i; });
  if (names.length) dl.innerHTML = Object.keys(byName).map((s) => `<option value="${s.replace(/"/g, "&quot;")}"></option>`).join("");
  else find.style.display = "none";
  box.style.maxHeight = model.get("max_height");
  box.style.maxWidth = model.get("max_width");
  const P = model.get("prefix");
  // ---- what a step shows
  const scroll = (f) => {
    const e = f ? box.querySelector('[id="' + f + '"]') : null; if (!e) return;
    const b = box.getBoundingClientRect(), r = e.getBoundingClientRect();
    if (r.top < b.top || r.bottom > b.bottom) box.scrollTop += (r.top + r.bottom) / 2 - (b.top + b.bottom) / 2;
    if (r.left < b.left || r.right > b.right) box.scrollLeft += (r.left + r.right) / 2 - (b.left + b.right) / 2;
  };
  const drawSvg = () => {
    box.innerHTML = model.get("svg");
    box.style.display = model.get("svg") ? "" : "none";     // a stepper without a picture: the panel alone
    const svg = box.querySelector("svg");
    if (svg) svg.style.maxWidth = "none";          // its own size: a page's `svg {max-width:100%}` would shrink the text
  };
  const fmtB = (b) => b >= 1048576 ? (b / 1048576).toFixed(2) + " MiB" : b >= 1024 ? (b / 1024).toFixed(1) + " KiB" : b + " B";
  const esc = (s) => String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  // the buffer holding node i as a bar: its bytes red, the other nodes' spans in that buffer grey (what
  // DecodeStepper.memory_svg draws for the static picture), and the nodes whose bytes overlap its bytes
  const memory = (i) => {
    const rows = table.nodes, r = rows[i], W = 640;
    if (r[1] === null) return "<i>not in a registered buffer</i>";
    const buf = table.buffers[r[1]], sx = W / buf.size, spans = [], share = [];
    const a = r[2], b = r[2] + r[3];
    rows.forEach((o, k) => {
      if (k === i || o[1] !== r[1]) return;
      spans.push(`<rect x="${(o[2] * sx).toFixed(2)}" y="4" width="${Math.max(o[3] * sx, 0.5).toFixed(2)}" height="22" fill="#b0bec5" fill-opacity="0.35"/>`);
      if (o[2] < b && a < o[2] + o[3]) share.push(`#${k} ${esc(o[0])}`);
    });
    const x = r[2] * sx, w = Math.max(r[3] * sx, 1.5);
    // the bar stretches to the panel's width; its words stay HTML, at the page's size
    return `<b>memory</b>: ${esc(buf.label)}: ${buf.size} bytes (${fmtB(buf.size)})<br/>
      <svg class="ggv-st-mem" viewBox="0 0 ${W} 30" preserveAspectRatio="none" width="100%" height="30"
      xmlns="http://www.w3.org/2000/svg" style="max-width:${W}px;display:block"><rect x="0" y="4" width="${W}"
      height="22" fill="#f5f5f5" stroke="#616161" vector-effect="non-scaling-stroke"/>${spans.join("")}<rect
      class="ggv-st-this" x="${x.toFixed(2)}" y="0" width="${w.toFixed(2)}" height="30" fill="#e53935"
      stroke="#b71c1c" vector-effect="non-scaling-stroke"/></svg>
      <span style="font-size:12px">this node: bytes ${a}..${b} (${r[3]} bytes); grey: other nodes of this graph in
      the same buffer</span><br/>` +
      (share.length ? `<b>same bytes also used by</b>: ${share.slice(0, 10).join(", ")}${share.length > 10 ? " …" : ""}` : "");
  };
  const drawFrame = () => {
    const f = J("frame", null); if (!f) return;
    q(".ggv-st-style").textContent = f.css || "";
    const k = model.get("pos");
    q(".ggv-st-panel").innerHTML = (f.panel || "") + (f.mem && table ? memory(k) : "");
    range.value = k;
    q(".ggv-st-pos").textContent = `${label} ${k} / ${n - 1}` + (names[k] ? ": " + names[k] : "");
    root.setAttribute("data-ggv-pos", k);
    requestAnimationFrame(() => scroll(f.focus));
  };
  // ---- moving
  const go = (i) => {
    i = Math.min(Math.max(i | 0, 0), n - 1);
    if (i === model.get("pos")) return;
    range.value = i;
    model.set("pos", i);
    model.save_changes();
  };
  q(".ggv-st-prev").addEventListener("click", () => go(model.get("pos") - 1));
  q(".ggv-st-next").addEventListener("click", () => go(model.get("pos") + 1));
  range.addEventListener("input", () => go(parseInt(range.value, 10)));
  root.addEventListener("keydown", (e) => {
    if (e.target === find) return;
    if (e.key === "ArrowRight") { go(model.get("pos") + 1); e.preventDefault(); }
    if (e.key === "ArrowLeft") { go(model.get("pos") - 1); e.preventDefault(); }
  });
  const doFind = () => { const i = byName[find.value.trim()]; find.style.background = i === undefined ? "#ffebee" : "";
                         if (i !== undefined) go(i); };
  find.addEventListener("keydown", (e) => { if (e.key === "Enter") doFind(); });
  find.addEventListener("change", doFind);
  let timer = null;
  const play = q(".ggv-st-play");
  play.addEventListener("click", () => {
    if (timer) { clearInterval(timer); timer = null; play.textContent = "▶ play"; return; }
    if (model.get("pos") >= n - 1) go(0);
    play.textContent = "❚❚ pause";
    timer = setInterval(() => { if (model.get("pos") >= n - 1) { play.click(); return; } go(model.get("pos") + 1); }, 600);
  });
  box.addEventListener("click", (e) => {
    let t = e.target;
    while (t && t !== box) {
      if (t.id && P && t.id.startsWith(P)) {
        const key = t.id.slice(P.length);
        const i = key in clicks ? clicks[key] : (/^n\d+$/.test(key) ? parseInt(key.slice(1), 10) : undefined);
        if (i !== undefined) { go(i); return; }
      }
      t = t.parentNode;
    }
  });
  model.on("change:svg", drawSvg);
  model.on("change:frame", drawFrame);
  model.on("change:pos", () => { range.value = model.get("pos"); });
  drawSvg();
  drawFrame();
}
export default { render };

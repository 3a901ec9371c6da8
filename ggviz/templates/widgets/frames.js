// FramesPane (anywidget ES module of ggviz/viz/widgets/_base.py): a view whose controls (sliders, lists, toggles)
// pick one frame of a recording -- TensorExplorer's index, QuantBlockExplorer's block, AllocatorView's node,
// ThreadTimeline's node, SchedulerView's pass and split, AttnGraphsView's graph.
// Traits: `controls` (JSON: [{name, label, kind: "range" | "select" | "toggle", min, max, options: [[label, value]],
// value, dep}] -- a range's `max` may be {value of control `dep`: max}, e.g. a slider over the current tensor's
// ne[0]); `key` (the controls' values joined by ","), which the view sets and saves; whoever holds the recording
// answers with `picture` (HTML: the figure), `cursor` (JSON: [{l, t, w, h}] boxes in % of the picture, drawn over
// it: the selected node's column of a chart that is drawn once), `css` (restyles the picture: a highlight),
// `info` (HTML under it), `detail` (a second part under it), `foot` (over the info: what one control alone decides, e.g. the
// recording picked); `header` and `note` (what this recording does not cover and why) stay. A click on an
// element of the picture whose id is `prefix` + s, with s in `clickmap` (JSON {s: value}), sets the first control
// to that value (an arena object clicked in its map). The kernel in a live notebook, the recorded tables in the
// static book (book_model.js).
function render({ model, el }) {
  const ctrls = JSON.parse(model.get("controls") || "[]");
  el.innerHTML = `<div class="ggv-fr" tabindex="0" style="outline:none;font:12px sans-serif">
  <div class="ggv-fr-head" style="font-size:13px;margin:2px 0 4px 0"></div>
  <div class="ggv-fr-bar" style="display:flex;gap:14px;align-items:center;flex-wrap:wrap;margin-bottom:4px"></div>
  <div class="ggv-fr-note" style="color:#5d4037;margin:2px 0 4px 0"></div>
  <style class="ggv-fr-style"></style>
  <div class="ggv-fr-pic" style="position:relative;display:inline-block;max-width:100%"></div>
  <div class="ggv-fr-foot"></div>
  <div class="ggv-fr-info" style="min-width:0;margin-top:4px"></div>
  <div class="ggv-fr-detail" style="min-width:0"></div></div>`;
  const q = (s) => el.querySelector(s);
  const root = q(".ggv-fr"), bar = q(".ggv-fr-bar"), pic = q(".ggv-fr-pic");
  q(".ggv-fr-head").innerHTML = model.get("header") || "";
  q(".ggv-fr-foot").innerHTML = model.get("foot") || "";
  const note = model.get("note") || "";
  q(".ggv-fr-note").innerHTML = note;
  if (!note) q(".ggv-fr-note").style.display = "none";
  const vals = {}, inputs = {}, shows = {};
  const esc = (s) => String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/"/g, "&quot;");
  const maxOf = (c) => (typeof c.max === "object" ? c.max[String(vals[c.dep])] : c.max);
  const push = () => {
    const key = ctrls.map((c) => vals[c.name]).join(",");
    root.setAttribute("data-ggv-key", key);
    model.set("key", key);
    model.save_changes();
  };
  const sync = () => {           // the controls show `vals` (a range's bounds follow the control it depends on)
    for (const c of ctrls) {
      const inp = inputs[c.name];
      if (c.kind === "range") {
        const mx = maxOf(c);
        inp.max = mx;
        if (vals[c.name] > mx) vals[c.name] = mx;
        inp.value = vals[c.name];
        shows[c.name].textContent = `${vals[c.name]} / ${mx}`;
      } else if (c.kind === "select") {
        inp.value = String(vals[c.name]);
      } else {
        inp.querySelectorAll("button").forEach((b) => {
          const on = b.getAttribute("data-v") === String(vals[c.name]);
          b.style.fontWeight = on ? "bold" : "normal";
          b.style.background = on ? "#e3f2fd" : "";
          b.setAttribute("aria-pressed", on ? "true" : "false");
        });
      }
    }
  };
  const setv = (name, v) => { vals[name] = v; sync(); push(); };
  for (const c of ctrls) {
    vals[c.name] = c.value;
    const span = document.createElement("span");
    span.className = "ggv-fr-c";
    span.setAttribute("data-name", c.name);
    span.style.cssText = "display:inline-flex;gap:4px;align-items:center";
    const lab = `<span>${esc(c.label || c.name)}</span>`;
    const num = (x) => (typeof c.value === "number" ? Number(x) : x);
    if (c.kind === "range") {
      span.innerHTML = `${lab}<button class="ggv-fr-dec" title="one less">◀</button><input type="range" class="ggv-fr-range"
        min="${c.min}" max="${maxOf(c)}" step="1" style="width:${c.width || 240}px"/><button class="ggv-fr-inc"
        title="one more">▶</button><span class="ggv-fr-show" style="min-width:60px;font-family:monospace"></span>`;
      const r = span.querySelector("input");
      r.addEventListener("input", () => setv(c.name, parseInt(r.value, 10)));
      span.querySelector(".ggv-fr-dec").addEventListener("click", () => setv(c.name, Math.max(c.min, vals[c.name] - 1)));
      span.querySelector(".ggv-fr-inc").addEventListener("click", () => setv(c.name, Math.min(maxOf(c), vals[c.name] + 1)));
      inputs[c.name] = r;
      shows[c.name] = span.querySelector(".ggv-fr-show");
    } else if (c.kind === "select") {
      span.innerHTML = `${lab}<select class="ggv-fr-select">${c.options.map(([l, v]) =>
        `<option value="${esc(v)}">${esc(l)}</option>`).join("")}</select>`;
      const s = span.querySelector("select");
      s.addEventListener("change", () => setv(c.name, num(s.value)));
      inputs[c.name] = s;
    } else {
      span.innerHTML = `${lab}${c.options.map(([l, v]) => `<button class="ggv-fr-opt" data-v="${esc(v)}">${esc(l)}</button>`).join("")}`;
      span.querySelectorAll("button").forEach((b) => b.addEventListener("click", () => setv(c.name, num(b.getAttribute("data-v")))));
      inputs[c.name] = span;
    }
    bar.appendChild(span);
  }
  // the arrow keys step the first slider (the view has the focus after a click in it)
  const first = ctrls.find((c) => c.kind === "range");
  root.addEventListener("keydown", (e) => {
    if (!first || e.target.tagName === "SELECT" || e.target.tagName === "INPUT" && e.target.type !== "range") return;
    const d = e.key === "ArrowRight" ? 1 : e.key === "ArrowLeft" ? -1 : 0;
    if (!d) return;
    e.preventDefault();
    setv(first.name, Math.min(maxOf(first), Math.max(first.min, vals[first.name] + d)));
  });
  const drawCursor = () => {
    pic.querySelectorAll(".ggv-fr-cur").forEach((d) => d.remove());
    const cur = model.get("cursor") ? JSON.parse(model.get("cursor")) : [];
    for (const b of cur) {
      const d = document.createElement("div");
      d.className = "ggv-fr-cur";
      d.style.cssText = `position:absolute;left:${b.l}%;top:${b.t}%;width:${b.w}%;height:${b.h}%;pointer-events:none;` +
        "background:rgba(255,241,118,0.35);outline:1.5px solid #f9a825";
      pic.appendChild(d);
    }
  };
  let shown = null;
  const drawPic = () => {
    const html = model.get("picture") || "";
    if (shown !== html) {                  // the same picture for another key (a chart drawn once): left in place
      pic.innerHTML = html;
      shown = html;
    }
    drawCursor();
  };
  const drawInfo = () => { q(".ggv-fr-info").innerHTML = model.get("info") || ""; };
  const drawDetail = () => { q(".ggv-fr-detail").innerHTML = model.get("detail") || ""; };
  const restyle = () => { q(".ggv-fr-style").textContent = model.get("css") || ""; };
  const P = model.get("prefix") || "", clickmap = JSON.parse(model.get("clickmap") || "{}");
  if (P && ctrls.length) {
    pic.style.cursor = "pointer";
    pic.addEventListener("click", (e) => {
      for (let n = e.target; n && n !== pic; n = n.parentNode) {
        if (n.id && n.id.startsWith(P) && n.id.slice(P.length) in clickmap) {
          setv(ctrls[0].name, clickmap[n.id.slice(P.length)]);
          return;
        }
      }
    });
  }
  model.on("change:picture", drawPic);
  model.on("change:cursor", drawCursor);
  model.on("change:info", drawInfo);
  model.on("change:css", restyle);
  model.on("change:detail", drawDetail);
  model.on("change:foot", () => { q(".ggv-fr-foot").innerHTML = model.get("foot") || ""; });
  sync();
  root.setAttribute("data-ggv-key", ctrls.map((c) => vals[c.name]).join(","));
  drawPic();
  drawInfo();
  drawDetail();
  restyle();
}
export default { render };

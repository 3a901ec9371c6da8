// SVGCanvas (anywidget ES module of ggviz/viz/widgets/_base.py): shows an SVG, restyles it with a CSS string
// (a highlight moves without re-sending or re-laying-out the picture) and reports clicks on elements whose id
// starts with the canvas prefix (matplotlib gids, Graphviz ids). The picture pans (drag, or the scroll bars) and
// zooms (the - / 100 % / + / fit buttons, or Ctrl + wheel); it opens at 100 %, on the `focus` element, so a big
// graph's text keeps its size (Graphviz's 8 pt = 10.7 px) instead of being squeezed to the page width. `info`
// (HTML) is shown beside the picture. The same module runs in the static book, on the book's model
// (book_model.js), where a click looks its answer up in the recorded table instead of asking a kernel.
function render({ model, el }) {
  el.innerHTML = `<style class="ggv-c-style"></style>
  <div class="ggv-c-bar" style="font:11px sans-serif;margin:2px 0">
    <button class="ggv-c-out" title="zoom out">−</button><button class="ggv-c-one">100 %</button
    ><button class="ggv-c-in" title="zoom in">+</button><button class="ggv-c-fit">fit</button>
    <span class="ggv-c-zoom" style="color:#546e7a;margin-left:4px"></span>
    <span style="color:#546e7a;margin-left:6px">drag: pan · Ctrl+wheel: zoom · click: select</span></div>
  <div style="display:flex;gap:12px;align-items:flex-start">
    <div class="ggv-c-box" style="overflow:auto;border:1px solid #ddd;cursor:grab;flex:0 1 auto"></div>
    <div class="ggv-c-info" style="font:12px sans-serif;flex:0 1 auto;min-width:0"></div></div>`;
  const style = el.querySelector(".ggv-c-style"), box = el.querySelector(".ggv-c-box");
  const info = el.querySelector(".ggv-c-info"), zl = el.querySelector(".ggv-c-zoom");
  const bar = el.querySelector(".ggv-c-bar");
  let s = 1, natW = 0, natH = 0;
  const svgOf = () => box.querySelector("svg");
  // the box is a flex item beside the info: at a zoom the user picked it may shrink (scroll bars) to leave the
  // info room; fitted, it keeps the picture's width and the info takes what is left (else, with a wide info, flex
  // shrank the fitted box again and cut off the picture's right side)
  const pin = (on) => { box.style.flexShrink = on ? "0" : "1"; };
  const zoom = (ns, cx, cy) => {
    const svg = svgOf(); if (!svg || !natW) return;
    // keep the point under (cx, cy) of the box where it is
    const r = box.getBoundingClientRect();
    const px = cx === undefined ? box.clientWidth / 2 : cx - r.left, py = cy === undefined ? box.clientHeight / 2 : cy - r.top;
    const ux = (box.scrollLeft + px) / s, uy = (box.scrollTop + py) / s;
    s = Math.min(Math.max(ns, 0.05), 4);
    svg.style.width = natW * s + "px"; svg.style.height = natH * s + "px";
    box.scrollLeft = ux * s - px; box.scrollTop = uy * s - py;
    zl.textContent = Math.round(s * 100) + " %";
    el.setAttribute("data-ggv-zoom", s.toFixed(3));
  };
  const scroll = () => {
    const f = model.get("focus");
    if (!f) return;
    const n = box.querySelector('[id="' + f + '"]');
    if (!n) return;
    const b = box.getBoundingClientRect(), r = n.getBoundingClientRect();
    if (r.top < b.top || r.bottom > b.bottom) box.scrollTop += (r.top + r.bottom) / 2 - (b.top + b.bottom) / 2;
    if (r.left < b.left || r.right > b.right) box.scrollLeft += (r.left + r.right) / 2 - (b.left + b.right) / 2;
  };
  const draw = () => {
    box.innerHTML = model.get("svg");
    box.style.maxHeight = model.get("max_height");
    box.style.maxWidth = model.get("max_width");
    const svg = svgOf();
    natW = natH = 0;
    if (svg && model.get("fit_width")) {        // a small picture (a matplotlib figure): the page's width
      svg.style.maxWidth = "100%"; svg.style.height = "auto"; bar.style.display = "none";
    } else if (svg) {
      // the picture's own size in CSS px (Graphviz writes pt): no stylesheet may squeeze it (a notebook page's
      // `svg {max-width: 100%}` would shrink a big graph's text under 9 px)
      svg.style.maxWidth = "none";
      svg.style.display = "block";              // (inline, its baseline gap would overflow the box by a few px)
      const w = svg.width.baseVal, h = svg.height.baseVal;
      w.convertToSpecifiedUnits(SVGLength.SVG_LENGTHTYPE_PX); h.convertToSpecifiedUnits(SVGLength.SVG_LENGTHTYPE_PX);
      natW = w.valueInSpecifiedUnits; natH = h.valueInSpecifiedUnits;
      zoom(s);
    }
    requestAnimationFrame(scroll);
  };
  const restyle = () => { style.textContent = model.get("css"); requestAnimationFrame(scroll); };
  const showInfo = () => { info.innerHTML = model.get("info") || ""; };
  let drag = null, moved = false;
  box.addEventListener("mousedown", (e) => { drag = [e.clientX, e.clientY, box.scrollLeft, box.scrollTop]; moved = false; });
  window.addEventListener("mousemove", (e) => {
    if (!drag) return;
    const dx = e.clientX - drag[0], dy = e.clientY - drag[1];
    if (Math.abs(dx) + Math.abs(dy) > 3) { moved = true; box.style.cursor = "grabbing"; }
    box.scrollLeft = drag[2] - dx; box.scrollTop = drag[3] - dy;
  });
  window.addEventListener("mouseup", () => { drag = null; box.style.cursor = "grab"; });
  box.addEventListener("wheel", (e) => {
    if (!e.ctrlKey || !natW) return;            // a plain wheel scrolls the page and the box, as usual
    e.preventDefault(); pin(false); zoom(s * Math.exp(-e.deltaY * 0.002), e.clientX, e.clientY);
  }, { passive: false });
  el.querySelector(".ggv-c-in").addEventListener("click", () => { pin(false); zoom(s * 1.25); });
  el.querySelector(".ggv-c-out").addEventListener("click", () => { pin(false); zoom(s / 1.25); });
  el.querySelector(".ggv-c-one").addEventListener("click", () => { pin(false); zoom(1); scroll(); });
  el.querySelector(".ggv-c-fit").addEventListener("click", () => {
    if (!natW) return;
    // the whole row's width (not the box's: flex may have shrunk it for the info), less the box's own frame
    // (border, scroll bar), and the box's height as max_height lets it be
    const frameW = box.offsetWidth - box.clientWidth;
    const availW = Math.max(box.parentNode.clientWidth - frameW, 1);
    const availH = box.clientHeight || natH;
    pin(true);
    zoom(Math.min(availW / natW, availH / natH, 1));
  });
  box.addEventListener("click", (e) => {
    if (moved) { moved = false; return; }      // the end of a drag is not a click
    const p = model.get("prefix");
    let n = e.target;
    while (n && n !== box) {
      if (n.id && p && n.id.startsWith(p)) {
        model.set("clicked", n.id.slice(p.length));
        model.set("n_clicks", model.get("n_clicks") + 1);
        model.save_changes();
        return;
      }
      n = n.parentNode;
    }
  });
  model.on("change:svg", draw);
  model.on("change:max_height", draw);
  model.on("change:max_width", draw);
  model.on("change:css", restyle);
  model.on("change:focus", scroll);
  model.on("change:info", showInfo);
  draw();
  restyle();
  showInfo();
}
export default { render };

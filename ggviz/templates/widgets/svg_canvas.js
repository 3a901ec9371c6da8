// SVGCanvas (anywidget ES module of ggviz/viz/widgets/_base.py): shows an SVG, restyles it with a CSS string
// (a highlight moves without re-sending or re-laying-out the picture) and reports clicks on elements whose id
// starts with the canvas prefix (matplotlib gids, Graphviz ids).
function render({ model, el }) {
  const style = document.createElement("style");
  const box = document.createElement("div");
  box.style.overflow = "auto";
  box.style.border = "1px solid #ddd";
  el.appendChild(style);
  el.appendChild(box);
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
    const svg = box.querySelector("svg");
    if (svg && model.get("fit_width")) { svg.style.maxWidth = "100%"; svg.style.height = "auto"; }
    requestAnimationFrame(scroll);
  };
  const restyle = () => { style.textContent = model.get("css"); requestAnimationFrame(scroll); };
  box.addEventListener("click", (e) => {
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
  box.style.cursor = "pointer";
  model.on("change:svg", draw);
  model.on("change:max_height", draw);
  model.on("change:max_width", draw);
  model.on("change:css", restyle);
  model.on("change:focus", scroll);
  draw();
  restyle();
}
export default { render };

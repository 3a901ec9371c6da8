// The static book's stand-in for a kernel (ggviz/tools/book.py puts this script once in every page that has a
// view). Each view of a page is a <div class="ggv-view"> holding its static picture (what a page without scripts,
// or a print, shows) and a <script type="application/json" class="ggv-payload"> with the view's recording:
//   {"esm": "stepper.js", "css": "explorer.css" | null,
//    "state": {trait: value, ...},                       the widget's traits, as the live widget would sync them
//    "tables": [{"on": "pos", "set": "frame",            when the view sets `on` and saves, `set` becomes
//                "pick": [..] | null, "values": [..] | {..}}]}   values[pick ? pick[v] : v] (v: the new `on` value)
// (base64 of its gzip when data-encoding="gzip+base64"). The widget's own ES module (the one copy, in
// ggviz/templates/widgets/, embedded once per page in <script type="text/plain" data-ggv-esm="name">) then runs
// on a small model with anywidget's interface (get / set / on / off / save_changes): what a kernel would have
// answered is looked up in the recorded tables, so every state the recording covers is reachable offline.
(() => {
  const makeModel = (state, tables) => {
    const data = Object.assign({}, state), handlers = {}, dirty = new Set();
    const fire = (k) => (handlers["change:" + k] || []).slice().forEach((f) => f());
    const m = {
      get: (k) => data[k],
      set: (k, v) => { if (data[k] === v) return; data[k] = v; dirty.add(k); fire(k); },
      on: (ev, f) => { (handlers[ev] = handlers[ev] || []).push(f); },
      off: (ev, f) => { if (handlers[ev]) handlers[ev] = f ? handlers[ev].filter((g) => g !== f) : []; },
      save_changes: () => {
        // the kernel's side of the round trip: each saved trait that a table answers sets the traits it drives
        const keys = [...dirty]; dirty.clear();
        for (const k of keys) {
          for (const t of tables) {
            if (t.on !== k) continue;
            const v = data[k], i = t.pick ? t.pick[v] : v;
            const got = i === undefined || i === null ? undefined : t.values[i];
            if (got !== undefined) m.set(t.set, got);
            else if (t.missing !== undefined) m.set(t.set, t.missing);
          }
        }
        dirty.clear();
      },
      send: () => {},
      widget_manager: null,
    };
    return m;
  };
  const gunzip = async (b64) => {
    const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
    const s = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return await new Response(s).text();
  };
  const modules = {};
  const esm = (name) => {
    if (!modules[name]) {
      const src = document.querySelector(`script[data-ggv-esm="${name}"]`);
      if (!src) throw new Error(`the page holds no module ${name}`);
      // a data: URL: the module is imported from the page itself (no file, no request), also under file://
      modules[name] = import("data:text/javascript;charset=utf-8," + encodeURIComponent(src.textContent));
    }
    return modules[name];
  };
  const boot = async () => {
    const t0 = performance.now();
    const views = [...document.querySelectorAll("div.ggv-view")];
    for (const v of views) {
      try {
        const s = v.querySelector("script.ggv-payload");
        const p = JSON.parse(s.getAttribute("data-encoding") === "gzip+base64" ? await gunzip(s.textContent.trim())
                                                                               : s.textContent);
        const mod = (await esm(p.esm)).default;
        const host = document.createElement("div");
        host.className = "ggv-live";
        const model = makeModel(p.state, p.tables || []);
        // out of the notebook page's rendered-HTML styles (`svg {max-width: 100%; height: auto}` would squeeze a
        // big graph's text and stretch the bars): a live widget is not inside them either
        const out = v.closest(".jp-RenderedHTMLCommon");
        if (out) out.classList.remove("jp-RenderedHTMLCommon");
        const still = v.querySelector(".ggv-static");
        still.replaceWith(host);              // in the page before render: a view measures its pictures
        try { mod.render({ model, el: host }); } catch (e) { host.replaceWith(still); throw e; }
        v.setAttribute("data-ggv-ready", "1");
      } catch (e) {
        v.setAttribute("data-ggv-ready", "error");
        v.insertAdjacentHTML("afterbegin", "<div style='color:#b71c1c;font:12px sans-serif'>this view could not " +
                             "start (the static picture below stays): " + String(e).replace(/</g, "&lt;") + "</div>");
        console.error(e);
      }
    }
    // how long the views took to start, and when the page could first answer (ms since the navigation began)
    document.body.setAttribute("data-ggv-boot-ms", (performance.now() - t0).toFixed(1));
    document.body.setAttribute("data-ggv-ready-at", performance.now().toFixed(1));
    document.body.setAttribute("data-ggv-ready", "1");
  };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", boot);
  else boot();
})();

"""The views in a real browser: headless Chromium (Debian's package) driven by Selenium.

(a) the standalone HTML report (``ggviz report``): the figures rendered (SVGs with a size, images decoded), the
    step sliders step (the highlighted graph node moves, the frame changes);
(b) live widgets: a small notebook served by Voilà on 127.0.0.1, whose ipywidgets Button computes the next node of
    a real ggml graph; clicking it must change what the page shows;
(c) the book (``ggviz book``), opened from file:// with the network off: no JavaScript error, no request outside its
    folder, and every recorded view answers (steppers step, graphs zoom and select, the explorer's panes follow).

Screenshots go to tests/_artifacts/browser/ (git-ignored). ``./dev setup`` installs chromium and chromium-driver
with apt-get when they are missing; without them this test fails under CI (CI=true) and is skipped elsewhere.
Selenium is pointed at the system driver (no Selenium Manager download). Override the paths with GGVIZ_CHROMIUM /
GGVIZ_CHROMEDRIVER.
"""
from __future__ import annotations

import base64
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "tests" / "_artifacts" / "browser"
IN_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
HAVE_DOT = shutil.which("dot") is not None
RED = "rgb(213, 0, 0)"          # #d50000: the highlight colour of the graph views


def _unavailable(msg: str):
    if IN_CI:
        pytest.fail(f"{msg}. The browser test must run in CI: `./dev setup` installs it with apt-get "
                    f"(apt-get install -y chromium chromium-driver; pip install selenium voila)", pytrace=False)
    pytest.skip(msg + " (CI is not set: skipped)")


def _find(env: str, *candidates: str):
    p = os.environ.get(env)
    if p:
        return p if os.path.isfile(p) and os.access(p, os.X_OK) else None
    for c in candidates:
        q = c if os.path.isabs(c) else shutil.which(c)
        if q and os.path.isfile(q) and os.access(q, os.X_OK):
            return q
    return None


@pytest.fixture(scope="module")
def browser():
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _unavailable("the Python package selenium is not installed")
    chromium = _find("GGVIZ_CHROMIUM", "/usr/bin/chromium", "chromium", "chromium-browser")
    driver_path = _find("GGVIZ_CHROMEDRIVER", "/usr/bin/chromedriver", "chromedriver")
    if chromium is None or driver_path is None:
        _unavailable(f"Chromium is not installed (browser: {chromium or 'missing'}, driver: "
                     f"{driver_path or 'missing'})")
    os.environ.setdefault("SE_OFFLINE", "true")          # Selenium Manager must never download a driver
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--window-size=1280,2000", "--hide-scrollbars", "--no-first-run", "--disable-extensions"):
        opts.add_argument(a)
    try:
        drv = webdriver.Chrome(service=Service(executable_path=driver_path), options=opts)
    except Exception as e:  # noqa: BLE001
        _unavailable(f"Chromium did not start ({type(e).__name__}: {e})")
    drv.set_page_load_timeout(90)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        yield drv
    finally:
        drv.quit()


def _wait(drv, cond, timeout: float, what: str):
    from selenium.webdriver.support.ui import WebDriverWait
    try:
        return WebDriverWait(drv, timeout, poll_frequency=0.1).until(lambda d: cond(d))
    except Exception as e:  # noqa: BLE001 - a timeout, or the condition raised
        shot = ARTIFACTS / f"timeout_{what.replace(' ', '_')}.png"
        drv.save_screenshot(str(shot))
        raise AssertionError(f"timed out after {timeout} s waiting for {what} (screenshot: {shot})") from e


def _click(drv, el) -> None:
    drv.execute_script("arguments[0].scrollIntoView({block: 'center'})", el)
    el.click()


def _shot(drv, el, name: str) -> pathlib.Path:
    drv.execute_script("arguments[0].scrollIntoView({block: 'start'})", el)
    path = ARTIFACTS / name
    el.screenshot(str(path))
    assert path.stat().st_size > 5000, f"{name}: an empty screenshot"
    return path


# ================================================================================================ the graph canvas

def test_canvas_fit_shows_the_whole_picture(browser, tmp_path):
    """The graph canvas's "fit" beside a wide info panel (the book's GraphView: its legend): the whole picture fits
    in its box, no part scrolled off (flex used to shrink the fitted box again for the info, cutting off the
    picture's right side). A recorded canvas in a page as the book writes it, a tall synthetic picture."""
    from ggviz.tools.book import _scripts, _view_html
    from ggviz.viz.widgets._base import book_payload

    svg = ("<svg xmlns='http://www.w3.org/2000/svg' width='1600pt' height='3000pt' viewBox='0 0 1600 3000'>"
           "<rect id='pfx-n0' x='0' y='0' width='1600' height='3000' fill='#90caf9'/>"
           "<text x='1500' y='1500' font-size='40'>right edge</text></svg>")
    rec = book_payload("svg_canvas.js", dict(svg=svg, css="", prefix="pfx-", focus="", clicked="", n_clicks=0,
                                             info="<div style='width:1000px'>a wide legend</div>",
                                             max_height="650px", max_width="none", fit_width=False))
    page = tmp_path / "canvas.html"
    page.write_text("<!doctype html><html><head><meta charset='utf-8'></head><body><div style='width:1100px'>"
                    + _view_html(rec, "") + "</div>" + _scripts({"svg_canvas.js"}) + "</body></html>")
    browser.get(page.as_uri())
    _wait(browser, lambda d: d.execute_script("return !!document.querySelector('.ggv-c-box svg')"), 30, "the canvas")
    got = browser.execute_script("""
        const box = document.querySelector('.ggv-c-box');
        document.querySelector('.ggv-c-fit').click();
        const v = document.querySelector('.ggv-view [data-ggv-zoom]') || document.querySelector('[data-ggv-zoom]');
        return {zoom: parseFloat(v.getAttribute('data-ggv-zoom')), cw: box.clientWidth, sw: box.scrollWidth,
                ch: box.clientHeight, sh: box.scrollHeight};""")
    assert got["zoom"] < 0.3, got
    assert got["sw"] <= got["cw"] and got["sh"] <= got["ch"], got      # nothing of the picture scrolled off
    _shot(browser, browser.find_element("css selector", ".ggv-view"), "canvas_fit.png")


# ================================================================================================= (a) the report

JS_STEPPER = """
const st = document.getElementById(arguments[0]);
const frames = st.querySelectorAll('.ggv-frames > .ggv-frame');
const vis = [...frames].map((f, i) => [i, getComputedStyle(f).display !== 'none']).filter(x => x[1]).map(x => x[0]);
const k = parseInt(st.getAttribute('data-step'), 10);
const focus = frames[k].getAttribute('data-focus');
const el = focus ? document.getElementById(focus) : null;
const shape = el ? el.querySelector('path, polygon, ellipse') : null;
const r = el ? el.getBoundingClientRect() : null;
return {step: k, n: frames.length, visible: vis, label: st.querySelector('.ggv-label').textContent,
        range: st.querySelector('.ggv-range').value, focus: focus,
        stroke: shape ? getComputedStyle(shape).stroke : null, css: st.querySelector('style.ggv-style').textContent,
        focus_in_box: r ? (() => { const b = st.querySelector('.ggv-scroll').getBoundingClientRect();
                                   return r.top >= b.top - 1 && r.bottom <= b.bottom + 1; })() : null};
"""


def test_report_renders_and_steps(browser, tmp_path):
    from selenium.webdriver.common.by import By

    from ggviz.tools import report

    t0 = time.perf_counter()
    path = report.write_report(tmp_path / "report.html")          # the recording is shared with test_report.py
    drv = browser
    drv.get(path.as_uri())
    _wait(drv, lambda d: d.execute_script("return document.body.getAttribute('data-ggv-ready')") == "1", 30,
          "the report's script")
    # every image decoded, every top-level SVG laid out with a size
    imgs = drv.execute_script("return [...document.images].map(i => [i.complete, i.naturalWidth, i.naturalHeight,"
                              " i.alt])")
    assert len(imgs) >= 8, imgs
    bad = [i for i in imgs if not (i[0] and i[1] > 0 and i[2] > 0)]
    assert not bad, f"images that did not load: {bad}"
    svgs = drv.execute_script("return [...document.querySelectorAll('svg')].filter(s => !s.parentElement.closest("
                              "'svg')).map(s => {const r = s.getBoundingClientRect(); return [r.width, r.height,"
                              " s.querySelectorAll('g.node').length]})")
    graphs = [s for s in svgs if s[2] > 0]
    assert len(graphs) >= 2, svgs
    assert all(w > 50 and h > 50 for w, h, _ in graphs), graphs
    assert sum(n for *_, n in graphs) > 60                        # the boxes and the expanded layer's nodes
    sections = drv.execute_script("return [...document.querySelectorAll('section')].map(s => [s.id,"
                                  " s.getBoundingClientRect().height])")
    assert len(sections) >= 11 and all(h > 80 for _, h in sections), sections
    assert "this view failed" not in drv.page_source

    # ---- the layer-0 stepper: the highlighted node and the frame follow the button and the slider
    st = drv.find_element(By.ID, "layer0-stepper")
    s0 = drv.execute_script(JS_STEPPER, "layer0-stepper")
    assert s0["step"] == 0 and s0["visible"] == [0] and s0["n"] > 30
    assert s0["stroke"] == RED and s0["focus_in_box"], s0
    _shot(drv, st, "report_layer0_step0.png")
    _click(drv, st.find_element(By.CSS_SELECTOR, ".ggv-next"))
    _wait(drv, lambda d: d.execute_script(JS_STEPPER, "layer0-stepper")["step"] == 1, 5, "step 1")
    s1 = drv.execute_script(JS_STEPPER, "layer0-stepper")
    assert s1["visible"] == [1] and s1["label"] != s0["label"] and s1["focus"] != s0["focus"]
    assert s1["stroke"] == RED and s1["focus_in_box"], s1
    old = drv.execute_script("const e = document.getElementById(arguments[0]).querySelector('path, polygon');"
                             " return getComputedStyle(e).stroke", s0["focus"])
    assert old != RED                                             # the previous node is no longer highlighted
    k = min(12, s0["n"] - 1)
    drv.execute_script("const r = document.querySelector('#layer0-stepper .ggv-range'); r.value = arguments[0];"
                       " r.dispatchEvent(new Event('input'))", k)
    s2 = drv.execute_script(JS_STEPPER, "layer0-stepper")
    assert s2["step"] == k and s2["visible"] == [k] and s2["stroke"] == RED and s2["focus_in_box"], s2
    _shot(drv, st, f"report_layer0_step{k}.png")
    _click(drv, st.find_element(By.CSS_SELECTOR, ".ggv-prev"))
    assert drv.execute_script(JS_STEPPER, "layer0-stepper")["step"] == k - 1

    # ---- the BPE stepper: merges, one by one
    bpe = drv.find_element(By.ID, "bpe-stepper")
    b0 = drv.execute_script(JS_STEPPER, "bpe-stepper")
    for _ in range(3):
        _click(drv, bpe.find_element(By.CSS_SELECTOR, ".ggv-next"))
    b3 = drv.execute_script(JS_STEPPER, "bpe-stepper")
    assert b3["step"] == 3 and b3["visible"] == [3] and b3["label"] != b0["label"]
    assert drv.execute_script("return document.querySelectorAll('#bpe-stepper .ggv-frame[data-k=\"3\"] .sym')"
                              ".length") > 0
    _shot(drv, bpe, "report_bpe_step3.png")
    for sid in ("overview", "memory", "timeline", "attention", "logits"):
        _shot(drv, drv.find_element(By.ID, sid), f"report_{sid}.png")
    print(f"report in the browser: {time.perf_counter() - t0:.1f} s")


# ================================================================================================= (b) live widgets

NOTEBOOK_CELLS = [
    '''\
# A real ggml graph, computed one node at a time by a button (ggml_graph_view + ggml_graph_compute)
import html
import numpy as np
import ipywidgets as W
from ggviz import ggml
from ggviz.viz import graph_dot as G

ctx = ggml.init(8 * 1024 * 1024)
rng = np.random.default_rng(0)
x = ggml.set_name(ggml.new_tensor_1d(ctx, ggml.GGML_TYPE_F32, 8), "x")
w = ggml.set_name(ggml.new_tensor_2d(ctx, ggml.GGML_TYPE_F32, 8, 4), "W")
b = ggml.set_name(ggml.new_tensor_1d(ctx, ggml.GGML_TYPE_F32, 4), "b")
for t in (x, w, b):
    ggml.set_data(t, rng.standard_normal(ggml.nelements(t)).astype(np.float32))
h = ggml.set_name(ggml.mul_mat(ctx, w, x), "Wx")
h = ggml.set_name(ggml.add(ctx, h, b), "Wx_b")
h = ggml.set_name(ggml.rms_norm(ctx, h, 1e-6), "norm")
p = ggml.set_name(ggml.soft_max(ctx, h), "probs")
gf = ggml.new_graph(ctx)
ggml.build_forward_expand(gf, p)
for t in gf.nodes:
    ggml.get_data(t)[...] = 0.0''',
    '''\
state = {"done": 0}
status = W.HTML()
graph = W.HTML()
button = W.Button(description="step", tooltip="compute the next node")
node = W.IntSlider(value=0, min=0, max=gf.n_nodes, description="computed", disabled=True)

def render():
    k = state["done"]
    rows = "".join(
        f"<tr><td>#{i}</td><td>{html.escape(t.name)}</td><td>{ggml.op_desc(t)}</td>"
        f"<td class='vals'>{np.array2string(ggml.get_data(t).reshape(-1), precision=3) if i < k else '(not yet)'}"
        f"</td></tr>" for i, t in enumerate(gf.nodes))
    cur = f"last: #{k - 1} {gf.nodes[k - 1].name}" if k else "nothing computed yet"
    status.value = (f"<div class='ggv-status'>{k} / {gf.n_nodes} nodes computed; {cur}</div>"
                    f"<table class='ggv-values'>{rows}</table>")
    try:
        dot, _ = G.graph_to_dot_grouped(gf, highlight=k - 1 if k else None, id_prefix="nb-")
        svg = dot.pipe(format="svg").decode()
        graph.value = "<div class='ggv-graph'>" + svg[svg.index("<svg"):] + "</div>"
    except Exception as e:  # graphviz's dot missing
        graph.value = f"<div class='ggv-graph'>(no graph picture: {e})</div>"
    node.value = k
    button.disabled = k >= gf.n_nodes

def step(_):
    k = state["done"]
    if k < gf.n_nodes:
        ggml.graph_compute_with_ctx(ctx, ggml.graph_view(gf, k, k + 1), 1)
        state["done"] = k + 1
    render()

button.on_click(step)
render()
W.VBox([W.HBox([button, node]), status, graph])''',
]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, proc, timeout: float) -> None:
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        if proc.poll() is not None:
            raise AssertionError(f"Voilà exited early with status {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"Voilà did not listen on 127.0.0.1:{port} within {timeout} s")


def _stop(proc) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)       # the group: Voilà and the kernel it started
    except ProcessLookupError:
        return
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


def test_voila_widgets_step(browser, tmp_path):
    from selenium.webdriver.common.by import By

    try:
        import nbformat
        import voila  # noqa: F401
    except ImportError as e:
        _unavailable(f"{e.name} is not installed")
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}}
    nb.cells = [nbformat.v4.new_code_cell(c) for c in NOTEBOOK_CELLS]
    nb_path = tmp_path / "stepper.ipynb"
    nbformat.write(nb, nb_path)
    # kernel "python3" = this interpreter; Jupyter's per-user dirs inside tmp_path
    spec = tmp_path / "jupyter" / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({"argv": [sys.executable, "-m", "ipykernel_launcher", "-f",
                                                           "{connection_file}"],
                                                  "display_name": "Python 3 (ggviz tests)", "language": "python"}))
    env = dict(os.environ, JUPYTER_PATH=str(tmp_path / "jupyter"), JUPYTER_DATA_DIR=str(tmp_path / "data"),
               JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
               JUPYTER_PLATFORM_DIRS="1", IPYTHONDIR=str(tmp_path / "ipython"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    port = _free_port()
    log = open(tmp_path / "voila.log", "w")
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "voila", str(nb_path), "--no-browser", f"--port={port}",
                             "--Voila.ip=127.0.0.1", "--show_tracebacks=True"],
                            cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    drv = browser
    try:
        _wait_port(port, proc, 45)
        drv.get(f"http://127.0.0.1:{port}/")
        button = _wait(drv, lambda d: next(iter(d.find_elements(By.XPATH, "//button[normalize-space()='step']")),
                                            None), 60, "the widget button")

        def status(d):                  # read by script: the widget replaces its HTML (no stale elements)
            return d.execute_script("const e = document.querySelector('.ggv-status'); return e ? e.textContent"
                                    " : null")

        _wait(drv, lambda d: (status(d) or "").startswith("0 / 4"), 30, "the first render")
        page = drv.find_element(By.CSS_SELECTOR, ".widget-vbox")
        _shot(drv, page, "voila_step0.png")

        def highlighted(d):
            return d.execute_script("return [...document.querySelectorAll('.ggv-graph g.node')].filter(g => "
                                    "g.querySelector('[stroke=\"#d50000\"]')).map(g => g.id)")

        assert highlighted(drv) == []
        for k in (1, 2):
            _click(drv, button)
            _wait(drv, lambda d, k=k: (status(d) or "").startswith(f"{k} / 4"), 30, f"step {k}")
            vals = drv.execute_script("return [...document.querySelectorAll('.ggv-values td.vals')]"
                                      ".map(td => td.textContent)")
            assert [v != "(not yet)" for v in vals] == [i < k for i in range(4)], vals
            if HAVE_DOT:
                _wait(drv, lambda d, k=k: highlighted(d) == [f"nb-n{k - 1}"], 10, f"the highlight of node {k - 1}")
                size = drv.execute_script("const r = document.querySelector('.ggv-graph svg')"
                                          ".getBoundingClientRect(); return [r.width, r.height]")
                assert size[0] > 50 and size[1] > 50, size
        assert "Wx" in status(drv) and "last: #1 Wx_b" in status(drv)
        _shot(drv, drv.find_element(By.CSS_SELECTOR, ".widget-vbox"), "voila_step2.png")
        elapsed = time.perf_counter() - t0
        print(f"voila: {elapsed:.1f} s")
    except Exception:
        log.flush()
        print((tmp_path / "voila.log").read_text()[-4000:])
        raise
    finally:
        t_stop = time.perf_counter()
        _stop(proc)
        log.close()
        print(f"voila stopped in {time.perf_counter() - t_stop:.1f} s")


# A4 landscape inside print.css's 8 mm margins: 281 mm x 194 mm in CSS px (96 per inch)
PRINT_PAGE_PX = (1062, 733)

# as a page prints: each displayed chart of fig_to_png (its smallest text, which it keeps in a text chunk of the PNG,
# times the scale it is shown at), the smallest HTML text and SVG text laid out (their rendered size), each with what it
# is, and the notebooks' own matplotlib outputs (image/png) that carry no such size (unmeasured: book_figures missed them)
JS_PRINT_SIZES = """
const seen = el => { const r = el.getBoundingClientRect(); return r.width > 0 && r.height > 0
                     && el.checkVisibility({visibilityProperty: true}); };
const key = 'ggviz:min-font-px\\0';             // fig_to_png's text chunk, before the pixels of the PNG
const fontPx = im => { const m = /^data:image\\/png;base64,/.exec(im.src); if (!m) return null;
                       const head = atob(im.src.slice(m[0].length, m[0].length + 4000)), i = head.indexOf(key);
                       return i < 0 ? null : parseFloat(head.slice(i + key.length, i + key.length + 12)); };
const charts = [...document.images].filter(seen).filter(im => fontPx(im) !== null).map(im =>
    [fontPx(im) * im.getBoundingClientRect().width / im.naturalWidth, im.getBoundingClientRect().width,
     im.naturalWidth]);
const html = [], svg = [];
const walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
for (let n = walk.nextNode(); n; n = walk.nextNode()) {
  const el = n.parentElement;
  if (!n.textContent.trim() || !el || !seen(el)) continue;
  if (el.closest('svg')) {
    const t = el.closest('text') || el, fs = parseFloat(getComputedStyle(t).fontSize);
    const m = t.getScreenCTM();
    if (m) svg.push([fs * Math.hypot(m.a, m.b), n.textContent.trim().slice(0, 30)]);
  } else {
    html.push([parseFloat(getComputedStyle(el).fontSize), n.textContent.trim().slice(0, 30)]);
  }
}
const plain = [...document.querySelectorAll('.jp-RenderedImage img')].filter(seen).filter(im => fontPx(im) === null)
    .map(im => [im.getBoundingClientRect().width, im.naturalWidth]);
return {charts: charts, html: html, svg: svg, plain: plain};
"""


def print_sizes(drv) -> dict:
    """The text sizes of the page loaded in ``drv`` as it prints (print media, the A4 landscape width of print.css):
    ``charts``: [size px, shown width, PNG width] per chart; ``html``, ``svg``: [size px, text] per text; ``plain``:
    [shown width, PNG width] per matplotlib output of the notebook with no recorded text size."""
    drv.execute_cdp_cmd("Emulation.setEmulatedMedia", {"media": "print"})
    drv.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {"width": PRINT_PAGE_PX[0], "height": PRINT_PAGE_PX[1],
                                                               "deviceScaleFactor": 1, "mobile": False})
    try:
        return drv.execute_script(JS_PRINT_SIZES)
    finally:
        drv.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
        drv.execute_cdp_cmd("Emulation.setEmulatedMedia", {"media": ""})


def test_print_keeps_charts_readable(browser, tmp_path):
    """A book page printed (print media, A4 landscape: print.css): a chart of ``fig_to_png`` wider than the page's
    column, whose smallest text is 7 pt, prints that text at 9 px or more; the same chart saved as it was before
    (plain ``savefig``) prints it under 9 px, and a narrow chart keeps its 7 pt. A notebook's own figure (an image/png
    output) drawn by the book kernels' formatter (``_book_png``, see ``book_figures``) prints at 9 px too; one saved
    plainly is reported unmeasured. The page is made by ``build_book`` from a notebook whose outputs are given (no
    kernel)."""
    import matplotlib
    matplotlib.use("agg")
    import matplotlib.pyplot as plt
    import nbformat

    from ggviz.tools import book
    from ggviz.viz.widgets._base import FONT_PX_KEY, _book_png, fig_to_png, png_img

    def chart(width_in):
        fig, ax = plt.subplots(figsize=(width_in, 3))
        ax.plot(range(40), [i % 7 for i in range(40)])
        ax.set_xticks(range(0, 40, 2))
        ax.tick_params(labelsize=7)
        ax.set_title("a title at 10 pt", fontsize=10)
        ax.text(3, 5, "a note at 6.5 pt", fontsize=6.5)
        return fig

    import io
    buf = io.BytesIO()
    chart(14).savefig(buf, format="png", dpi=110, bbox_inches="tight", metadata={FONT_PX_KEY: f"{6.5 * 110 / 72:.2f}"})
    plt.close("all")
    old = ("<img src='data:image/png;base64,%s'/>"          # the text chunk says 6.5 pt in pixels of the PNG
           % base64.b64encode(buf.getvalue()).decode())
    cells = {"wide": png_img(fig_to_png(chart(14)), "max-width:100%"), "narrow": png_img(fig_to_png(chart(5))),
             "old": old}
    nb = nbformat.v4.new_notebook()
    for name, html_ in cells.items():
        c = nbformat.v4.new_code_cell(f"# {name}", execution_count=1)
        c.outputs = [nbformat.v4.new_output("display_data", {"text/html": f"<div id='{name}'>{html_}</div>"})]
        nb.cells.append(c)
    plain = io.BytesIO()
    chart(5).savefig(plain, format="png", dpi=110, bbox_inches="tight")
    for name, png64 in (("figure", _book_png(chart(12))), ("plain", base64.b64encode(plain.getvalue()).decode())):
        c = nbformat.v4.new_code_cell(f"# {name}", execution_count=1)
        c.outputs = [nbformat.v4.new_output("display_data", {"image/png": png64})]
        nb.cells.append(c)
    plt.close("all")
    folder = tmp_path / "nb"
    folder.mkdir()
    nbformat.write(nb, folder / "print.ipynb")
    pages = book.build_book(tmp_path / "book", folder=folder, disable_progress=True, executed=lambda p: nb)
    browser.get(pages[1].as_uri())
    _wait(browser, lambda d: d.execute_script("return [...document.images].every(i => i.complete)"), 30, "charts")
    printed = print_sizes(browser)
    got = printed["charts"]
    assert len(got) == 4 and len(printed["plain"]) == 1, printed
    by_width = {png: px for px, shown, png in got}
    sizes = browser.execute_script("return ['wide', 'narrow', 'old'].map(k => document.querySelector('#' + k + "
                                   "' img').naturalWidth)")
    wide, narrow, old_px = (by_width[w] for w in sizes)
    figure = next(px for px, shown, png in got if png not in sizes)
    print(f"\nprinted smallest chart text (px): 14 in chart {wide:.2f} (before: {old_px:.2f}), 5 in chart {narrow:.2f}"
          f", a notebook's 12 in figure {figure:.2f}")
    assert old_px < 9 <= wide and figure >= 9, (wide, old_px, figure)   # without the raise it prints too small
    assert narrow == pytest.approx(6.5 * 110 / 72, abs=0.01)      # one that fits the column keeps its sizes


# ================================================================================================= (c) the book

# the state of the recorded views of a page (book_model.js starts them; see ggviz/tools/book.py)
JS_VIEWS = """
return [...document.querySelectorAll('div.ggv-view')].map((v, k) => {
  const st = v.querySelector('.ggv-st'), svg = v.querySelector('.ggv-c-box svg');
  return {k, esm: v.getAttribute('data-ggv-esm'), ready: v.getAttribute('data-ggv-ready'),
          stepper: st ? {pos: parseInt(st.getAttribute('data-ggv-pos'), 10),
                         n: parseInt(st.querySelector('.ggv-st-range').max, 10) + 1,
                         panel: st.querySelector('.ggv-st-panel').textContent,
                         css: st.querySelector('.ggv-st-style').textContent,
                         verts: [...st.querySelectorAll('.ggv-st-box g.node')].map(g => g.id)} : null,
          canvas: svg ? {zoom: v.querySelector('[data-ggv-zoom]').getAttribute('data-ggv-zoom'),
                         info: v.querySelector('.ggv-c-info').textContent,
                         verts: [...svg.querySelectorAll('g.node')].map(g => g.id)} : null,
          explorer: !!v.querySelector('.ggv-explorer-live'),
          frames: v.querySelector('.ggv-fr') ? frames(v.querySelector('.ggv-fr')) : null};
});
function frames(f) {
  return {key: f.getAttribute('data-ggv-key'), info: f.querySelector('.ggv-fr-info').textContent,
          detail: f.querySelector('.ggv-fr-detail').textContent,
          cursor: [...f.querySelectorAll('.ggv-fr-cur')].map(d => d.style.cssText).join('|'),
          picture: f.querySelector('.ggv-fr-pic').innerHTML.length + ':' + f.querySelector('.ggv-fr-style').textContent,
          controls: [...f.querySelectorAll('.ggv-fr-c')].map(c => c.getAttribute('data-name'))};
}
"""

# move control k of a frames.js view (frames.js: a slider steps, a list or a toggle takes another option); returns
# what the control now shows
JS_FRAMES_MOVE = """
const f = document.querySelectorAll('div.ggv-view')[arguments[0]].querySelector('.ggv-fr');
const c = f.querySelectorAll('.ggv-fr-c')[arguments[1]];
const r = c.querySelector('input[type=range]'), s = c.querySelector('select');
if (r) {
  if (r.min === r.max) return null;
  (parseInt(r.value, 10) < parseInt(r.max, 10) ? c.querySelector('.ggv-fr-inc') : c.querySelector('.ggv-fr-dec')).click();
  return r.value;
}
if (s) {
  if (s.options.length < 2) return null;
  s.selectedIndex = (s.selectedIndex + 1) % s.options.length; s.dispatchEvent(new Event('change')); return s.value;
}
const bs = [...c.querySelectorAll('button')];
const k = bs.findIndex(b => b.getAttribute('aria-pressed') === 'true');
if (bs.length < 2) return null;
const b = bs[(k + 1) % bs.length]; b.click(); return b.getAttribute('data-v');
"""
# the smallest SVG text of a frames.js view's picture, in CSS px as drawn: each <text>'s font size (matplotlib writes
# it in the SVG's user units) times the scale from user units to the screen (getScreenCTM: the picture's width fitted
# to the page); null when the picture has no SVG text
JS_FRAMES_SVG_TEXT = """
const f = document.querySelectorAll('div.ggv-view')[arguments[0]].querySelector('.ggv-fr');
const px = [...f.querySelectorAll('.ggv-fr-pic svg text')].filter(t => t.textContent.trim()
  && t.getBoundingClientRect().height > 0).map(t => { const m = t.getScreenCTM();
  return parseFloat(getComputedStyle(t).fontSize) * Math.hypot(m.a, m.b); });
return px.length ? Math.min(...px) : null;
"""
# one frames.js view's state (JS_VIEWS's frames(), for view k alone)
JS_FRAMES_STATE = ("return frames(document.querySelectorAll('div.ggv-view')[arguments[0]].querySelector('.ggv-fr'));\n"
                   "function frames" + JS_VIEWS.split("function frames", 1)[1])

# the smallest text of a picture at its current zoom, in CSS px (the height of each <text>'s box), and whether the
# element it opened on is inside the visible part of its box
JS_CANVAS_LOOK = """
const v = document.querySelectorAll('div.ggv-view')[arguments[0]];
const box = v.querySelector('.ggv-c-box'), b = box.getBoundingClientRect();
const hs = [...box.querySelectorAll('svg text')].map(t => t.getBoundingClientRect().height).filter(h => h > 0);
const f = v.querySelector('.ggv-c-style') && box.querySelector('svg');
return {minText: Math.min(...hs), nText: hs.length, boxW: b.width, boxH: b.height};
"""

# select a node of the book's explorer (a click on its vertex, or its name typed into the search), then wait, one
# animation frame at a time, until every pane shows it: the vertex outlined, its column in the buffer map, its spans
# in the thread lanes red, the scheduler and bytes text and the values pane naming it
JS_BOOK_SELECT = r"""
const [how, target, name, done] = arguments;
const root = document.querySelector('.ggv-explorer-live');
const RED = 'rgb(213, 0, 0)';
const t0 = performance.now();
if (how === 'click') {
  const g = root.querySelector('.ggv-x-gin g.node[id$="-' + target + '"]');
  if (!g) { done({error: 'no vertex ' + target}); return; }
  g.querySelector('polygon, path, ellipse').dispatchEvent(new MouseEvent('click', {bubbles: true}));
} else {
  const s = root.querySelector('.ggv-x-search');
  s.value = name;
  s.dispatchEvent(new KeyboardEvent('keydown', {key: 'Enter', bubbles: true}));
}
const check = () => {
  const key = root.getAttribute('data-ggv-selected');
  const vert = key ? root.querySelector('.ggv-x-gin g.node[id$="-' + key + '"]') : null;
  const shape = vert ? vert.querySelector('polygon, path, ellipse') : null;
  const spans = key ? root.querySelectorAll('.ggv-x-lanes-svg rect[class*="s' + key.slice(1) + ' "]') : [];
  const col = key ? root.querySelector('.ggv-x-mem line[id$="x' + key.slice(1) + '"]') : null;
  return {key, graph: !!shape && getComputedStyle(shape).stroke === RED,
          lanes: spans.length > 0 && [...spans].every(r => getComputedStyle(r).fill === RED),
          bytes: !!col && getComputedStyle(col).display !== 'none',
          cause: root.querySelector('.ggv-x-cause').textContent.length > 0,
          values: root.querySelector('.ggv-explorer-values').textContent.includes(name),
          info: root.querySelector('.ggv-x-info').textContent.includes(name)};
};
const poll = () => {
  const st = check();
  if ((how === 'search' || st.key === target) && st.graph && st.lanes && st.bytes && st.cause && st.values
      && st.info) {
    st.ms = performance.now() - t0; done(st); return; }
  if (performance.now() - t0 > 3000) { st.ms = null; done(st); return; }
  requestAnimationFrame(poll);
};
poll();
"""


def _views(drv):
    return drv.execute_script(JS_VIEWS)


def _check_stepper(drv, page, k: int, n_moves: list) -> None:
    """A recorded stepper of the book: the next button, an arrow key, the slider, a click on a vertex of its graph
    and the name search each move it, and the panel and the graph's highlight follow."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    view = drv.find_elements(By.CSS_SELECTOR, "div.ggv-view")[k]
    root = view.find_element(By.CSS_SELECTOR, ".ggv-st")
    st = lambda: _views(drv)[k]["stepper"]                      # noqa: E731
    slide = "const r = arguments[0].querySelector('.ggv-st-range'); r.value = arguments[1];" \
            " r.dispatchEvent(new Event('input'))"
    start = st()
    drv.execute_script(slide, root, 0)                          # (the page may open on any step)
    s0 = st()
    assert s0["pos"] == 0 and (start["pos"] == 0 or s0["panel"] != start["panel"]), (page, start, s0)
    _click(drv, root.find_element(By.CSS_SELECTOR, ".ggv-st-next"))
    s1 = st()
    assert s1["pos"] == s0["pos"] + 1 and s1["panel"] != s0["panel"], (page, s0, s1)
    assert s1["css"] != s0["css"] or not s0["verts"], (page, "the picture's highlight did not move")
    root.send_keys(Keys.ARROW_RIGHT)
    assert st()["pos"] == min(2, s0["n"] - 1), page
    last = s0["n"] - 1
    drv.execute_script(slide, root, last)
    s2 = st()
    assert s2["pos"] == last and s2["panel"] != s1["panel"], (page, s2)
    # a click on a node of the picture goes to that node (a decode's vertex n<i> is node i)
    vert = next((v for v in s2["verts"] if v.rsplit("-", 1)[-1][:1] == "n" and v.rsplit("-", 1)[-1][1:].isdigit()),
                None)
    if vert is not None and "node #" in s2["panel"]:
        i = int(vert.rsplit("-", 1)[-1][1:])
        drv.execute_script("document.getElementById(arguments[0]).querySelector('polygon, path, ellipse')"
                           ".dispatchEvent(new MouseEvent('click', {bubbles: true}))", vert)
        s3 = st()
        assert s3["pos"] == i and f"node #{i} /" in s3["panel"], (page, vert, s3)
        # the memory bar: this node's bytes drawn in its buffer
        assert drv.execute_script("return arguments[0].querySelectorAll('.ggv-st-mem rect').length", root) > 2
        # the name search
        find = root.find_element(By.CSS_SELECTOR, ".ggv-st-find")
        find.send_keys("kq_soft_max-0", Keys.ENTER)
        s4 = st()
        assert "kq_soft_max-0" in s4["panel"] and s4["pos"] != s3["pos"], (page, s4)
    n_moves.append(s0["n"])


def _check_canvas(drv, page, k: int) -> None:
    """A recorded graph picture: opens at 100 % with no text under 9 px, on its focus; the zoom buttons zoom; a
    click on a node shows that node's table."""
    from selenium.webdriver.common.by import By

    view = drv.find_elements(By.CSS_SELECTOR, "div.ggv-view")[k]
    c0 = _views(drv)[k]["canvas"]
    look = drv.execute_script(JS_CANVAS_LOOK, k)
    assert c0["zoom"] == "1.000" and look["nText"] > 0 and look["minText"] >= 9, (page, c0["zoom"], look)
    _click(drv, view.find_element(By.CSS_SELECTOR, ".ggv-c-in"))
    assert _views(drv)[k]["canvas"]["zoom"] == "1.250", page
    _click(drv, view.find_element(By.CSS_SELECTOR, ".ggv-c-one"))
    vert = next(v for v in c0["verts"] if v.rsplit("-", 1)[-1][:1] == "n" and v.rsplit("-", 1)[-1][1:].isdigit())
    i = int(vert.rsplit("-", 1)[-1][1:])
    drv.execute_script("document.getElementById(arguments[0]).querySelector('polygon, path, ellipse')"
                       ".dispatchEvent(new MouseEvent('click', {bubbles: true}))", vert)
    c1 = _views(drv)[k]["canvas"]
    assert f"node {i}" in c1["info"] and c1["info"] != c0["info"], (page, vert, c1["info"][:200])
    stroke = drv.execute_script("return getComputedStyle(document.getElementById(arguments[0])"
                                ".querySelector('polygon, path, ellipse')).stroke", vert)
    assert stroke == RED, (page, vert, stroke)


def _check_frames(drv, page, k: int):
    """A recorded frames.js view (tensor / quant / arena explorers, allocator, scheduler, thread timeline, attention
    graphs, PowerInfer's views, the vec_dot lanes): each control moved changes the key and what the view shows (its
    table, marks or picture), from the recording (never "not recorded"). Returns the smallest SVG text of its
    picture as the page opened (px, JS_FRAMES_SVG_TEXT; None: no SVG text)."""
    small = drv.execute_script(JS_FRAMES_SVG_TEXT, k)
    f0 = drv.execute_script(JS_FRAMES_STATE, k)
    assert f0["controls"], (page, k, "a frames view with no control")
    for c in range(len(f0["controls"])):
        before = drv.execute_script(JS_FRAMES_STATE, k)
        shown = drv.execute_script(JS_FRAMES_MOVE, k, c)
        if shown is None:                                  # a list of one (one buffer, one tensor), one block a row
            continue
        after = drv.execute_script(JS_FRAMES_STATE, k)
        what = (page, k, f0["controls"][c], before["key"], after["key"])
        assert after["key"] != before["key"], what
        assert (after["info"], after["detail"], after["cursor"], after["picture"]) != \
               (before["info"], before["detail"], before["cursor"], before["picture"]), what
        assert "was not recorded" not in after["info"], what
    return small


def _check_explorer(drv, page) -> dict:
    """The book's explorer: a click on a vertex and a search by name each update all five panes within 200 ms."""
    out = {}
    # node 131's name (a MUL_MAT: it has thread spans), from its vertex's label ("#131", its name, its op)
    name = drv.execute_script("const g = document.querySelector('.ggv-x-gin g.node[id$=\"-n131\"]');"
                              " return g ? [...g.querySelectorAll('text')].map(t => t.textContent.trim())"
                              ".filter(Boolean)[1] : null")
    for how, key, nm in (("click", "n131", name), ("search", "", "ffn_out-7")):
        st = drv.execute_async_script(JS_BOOK_SELECT, how, key, nm)
        assert st.get("ms") is not None, f"{page}: {how} {nm}: not every pane followed within 3 s: {st}"
        assert st["ms"] < 200, f"{page}: {how} {nm}: the panes followed after {st['ms']:.0f} ms"
        out[f"{how} {nm}"] = st["ms"]
    return out


def test_book_pages_load_without_errors(browser, tmp_path, notebook_runner):
    """``ggviz book``: every notebook executed into a static page; each loads in Chromium with the network off and
    no kernel, with no JavaScript error, requests nothing outside the book's folder, shows its figures (every image
    decoded), and every recorded view answers its interactions (steppers step, graphs zoom and select, the explorer's
    five panes follow a click and a search within 200 ms), and prints (A4 landscape, print.css) with no text under 9 px:
    HTML, SVG and every chart, the notebooks' own matplotlib figures included. The notebooks are executed by the
    session's runner (``book.execute``, once: tests/test_notebooks.py checks the same runs)."""
    from ggviz.tools import book

    pages = book.build_book(tmp_path / "book", disable_progress=True, executed=notebook_runner)
    from tests.test_notebooks import gemma_fetched
    gemma_here = gemma_fetched()
    assert [p.name for p in pages[1:]] == [p.stem + ".html" for p in book.notebooks()]
    from tests.test_concepts import book_problems       # docs/concepts.md: each ● row's view, in its section
    assert not book_problems(pages), "\n".join(book_problems(pages))
    print("\nbook page weights:\n" + book.weights(pages))
    folder = (tmp_path / "book").as_uri() + "/"
    drv = browser
    drv.get("about:blank")                                       # leave the earlier tests' pages (Voila's shutdown
    time.sleep(0.5)                                              # request on unload logs a refused connection)
    drv.execute_cdp_cmd("Network.enable", {})
    drv.execute_cdp_cmd("Network.emulateNetworkConditions", {"offline": True, "latency": 0,
                                                              "downloadThroughput": -1, "uploadThroughput": -1})
    kinds, moves, timings, svg_text, printed = {}, [], {}, {}, {}
    try:
        for page in pages:
            drv.get_log("browser")                               # drop what earlier pages logged
            drv.get(page.as_uri())
            _wait(drv, lambda d: d.execute_script("return document.readyState") == "complete", 30,
                  f"{page.name} load")
            n_img, n_broken = drv.execute_script(
                "const im = [...document.images]; return [im.length, im.filter(i => !i.complete || i.naturalWidth"
                " == 0).length];")
            assert n_broken == 0, f"{page.name}: {n_broken} of {n_img} images did not load"
            views = _views(drv)
            if views:
                _wait(drv, lambda d: d.execute_script("return document.body.getAttribute('data-ggv-ready')") == "1",
                      30, f"{page.name} views")
                views = _views(drv)
                assert all(v["ready"] == "1" for v in views), f"{page.name}: {views}"
                ready = drv.execute_script("return [document.body.getAttribute('data-ggv-ready-at'),"
                                           " document.body.getAttribute('data-ggv-boot-ms')]")
                timings[page.name] = f"views ready {float(ready[0]):.0f} ms after the navigation " \
                                     f"(their start: {float(ready[1]):.0f} ms)"
            for v in views:
                kinds.setdefault(page.name, []).append(v["esm"])
                if v["stepper"]:
                    _check_stepper(drv, page.name, v["k"], moves)
                elif v["canvas"]:
                    _check_canvas(drv, page.name, v["k"])
                elif v["frames"]:
                    small = _check_frames(drv, page.name, v["k"])
                    if small is not None:
                        svg_text.setdefault(page.name, []).append(round(small, 1))
                elif v["explorer"]:
                    ms = _check_explorer(drv, page.name)
                    timings[page.name] += "; select -> all panes: " + ", ".join(f"{k} {t:.1f} ms"
                                                                                for k, t in ms.items())
                drv.save_screenshot(str(ARTIFACTS / f"book_{page.stem}_view{v['k']}.png"))
            remote = drv.execute_script("return performance.getEntriesByType('resource').map(r => r.name)")
            outside = [n for n in remote if not (n.startswith(folder) or n.startswith("data:"))]
            assert outside == [], f"{page.name} asked for {outside} (outside the book's folder)"
            errors = [e for e in drv.get_log("browser") if e["level"] in ("SEVERE", "ERROR")
                      and "127.0.0.1" not in e["message"]]          # a server of an earlier test, not the book
            assert errors == [], f"{page.name}: {errors}"
            # the exercises' answers: folded (a closed <details> lays out nothing) until the reader opens them
            n_ex, shown = drv.execute_script(
                "const a = [...document.querySelectorAll('.ggv-exercise .ggv-answer')]; return [document."
                "querySelectorAll('.ggv-exercise').length, a.filter(e => e.closest('details') === null || "
                "e.closest('details').open || e.checkVisibility()).length];")
            assert shown == 0, f"{page.name}: {shown} of {n_ex} exercise answers are visible before being asked for"
            assert page.stem == "index" or n_ex >= 3 or (page.stem.startswith("08") and not gemma_here), \
                f"{page.name}: {n_ex} exercises"
            drv.save_screenshot(str(ARTIFACTS / f"book_{page.stem}.png"))
            printed[page.name] = print_sizes(drv)
    finally:
        drv.execute_cdp_cmd("Network.emulateNetworkConditions", {"offline": False, "latency": 0,
                                                                  "downloadThroughput": -1, "uploadThroughput": -1})
    print("recorded views per page: " + "; ".join(f"{p}: {', '.join(k)}" for p, k in kinds.items()))
    print("\n".join(f"{p}: {t}" for p, t in timings.items()))
    print("smallest SVG text of the frames views (px): " + "; ".join(f"{p}: {v}" for p, v in svg_text.items()))
    # printed (A4 landscape, print.css), every page: no text under 9 px (#21) -- the charts by the size fig_to_png
    # records (the views' and the notebooks' own matplotlib figures: book_figures draws those in the book's kernels),
    # the HTML and SVG text as laid out; and no matplotlib output left unmeasured
    def smallest(rows):
        return f"{min(r[0] for r in rows):.1f}" if rows else "-"
    print("printed, smallest text (px): " + "; ".join(
        f"{p}: charts {smallest(s['charts'])} ({len(s['charts'])}), HTML {smallest(s['html'])}, SVG {smallest(s['svg'])}"
        for p, s in printed.items())
        + ("" if gemma_here else " -- 08 without Gemma-3 (not fetched): its Gemma cells skipped, their text unmeasured"))
    small = {p: sorted({(k, round(r[0], 2), str(r[1])[:30]) for k in ("charts", "html", "svg") for r in s[k]
                        if r[0] < 9})[:6] for p, s in printed.items()}
    assert not any(small.values()), {p: v for p, v in small.items() if v}
    plain = {p: s["plain"] for p, s in printed.items() if s["plain"]}
    assert not plain, f"matplotlib outputs with no recorded text size (not drawn by book_figures): {plain}"
    assert len(printed) == len(pages) and sum(len(s["charts"]) for s in printed.values()) >= 15, printed.keys()
    # the landscape page is the one Chromium prints, even asked for portrait (its dialog then offers no choice)
    drv.get(min(pages[1:], key=lambda q: q.stat().st_size).as_uri())
    pdf = base64.b64decode(drv.execute_cdp_cmd("Page.printToPDF", {"landscape": False, "paperWidth": 8.27,
                                                                    "paperHeight": 11.69})["data"])
    boxes = {tuple(float(v) for v in b.split()) for b in re.findall(rb"/MediaBox\s*\[([^\]]*)\]", pdf)}
    assert boxes and all(b[2] > b[3] for b in boxes), boxes
    # the GGUF map (00): its range labels, offsets and layer numbers at 9 px or more as the page draws it (#21)
    assert min(svg_text.get("00_quickstart.html", [0])) >= 9, svg_text
    assert (ARTIFACTS / "book_index.png").stat().st_size > 5000
    # the views the book must carry interactive: the node stepper and the explorer (07), the graph walk and the
    # layer-0 graph (03)
    assert kinds.get("07_decode_walkthrough.html", []).count("stepper.js") >= 1, kinds
    assert "explorer.js" in kinds.get("07_decode_walkthrough.html", []), kinds
    assert {"stepper.js", "svg_canvas.js"} <= set(kinds.get("03_cgraph.html", [])), kinds
    # and the frames views: the GGUF map (00), the tensor and quant-block explorers (01), the arena (02), the allocator
    # (04), the scheduler (05), the thread timeline on 1-4 threads and the vec_dot lanes (06), the attention graphs
    # (07), the predictor's thresholds, hot/cold neurons, skipped rows, two hybrid timelines and the costs (09)
    for p, n in (("00_quickstart", 1), ("01_tensors_and_views", 3), ("02_context_arena", 1), ("04_allocator", 1),
                 ("05_backends_and_scheduler", 2), ("06_threadpool", 2), ("07_decode_walkthrough", 1),
                 ("09_powerinfer", 6)):
        assert kinds.get(p + ".html", []).count("frames.js") >= n, (p, kinds)

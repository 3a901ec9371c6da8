"""The linked decode explorer, live: ``ggviz explore`` (Voilà serving it) driven in headless Chromium (Selenium).

A real decode step of the default model is recorded in Voilà's kernel (``DecodeExplorer.record``); the test then
selects nodes in the page -- a click on a node of the DAG, then a search by name -- and checks, in the browser,
that the node is outlined in the graph, that its slot is outlined in the buffer map (and the byte band shown), and
that its spans in the thread lanes are filled red, one per thread; the time from the event to all three is measured
in the browser (``performance.now()``, polled every animation frame) and must be under 200 ms. The values pane,
drawn by the kernel, must follow too. Screenshots go to tests/_artifacts/browser/explorer_*.png.

Skips (or fails under CI, like tests/test_browser.py) when Chromium, Selenium or Voilà is missing.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from ggviz.viz.widgets.explorer import lanes_window
from tests.test_browser import ARTIFACTS, ROOT, _free_port, _shot, _stop, _unavailable, _wait, _wait_port  # noqa: F401
from tests.test_browser import browser  # noqa: F401  (the Chromium fixture, shared)

# Select by a click on the DAG vertex (or by typing a name into the search box and pressing Enter), then poll once per
# animation frame until the graph outline, the buffer slot and the lane spans all show the selection.
JS_SELECT = r"""
const [how, target, done] = [arguments[0], arguments[1], arguments[arguments.length - 1]];
const root = document.querySelector('.ggv-explorer-live');
const RED = 'rgb(213, 0, 0)';
const t0 = performance.now();
if (how === 'click') {
  const g = root.querySelector('.ggv-x-gin g.node[id$="-' + target + '"]');
  if (!g) { done({error: 'no vertex ' + target}); return; }
  g.querySelector('polygon, path, ellipse').dispatchEvent(new MouseEvent('click', {bubbles: true}));
} else {
  const s = root.querySelector('.ggv-x-search');
  s.value = target;
  s.dispatchEvent(new KeyboardEvent('keydown', {key: 'Enter', bubbles: true}));
}
// while timing, look only at the elements of the selected tensor (found by the page's own attributes)
const check = () => {
  const key = root.getAttribute('data-ggv-selected');
  if (!key) return {key, gOn: false, slotOn: false, spansOn: false};
  const vert = root.querySelector('.ggv-x-gin g.node[id$="-' + key + '"]');
  const shape = vert ? vert.querySelector('polygon, path, ellipse') : null;
  const gOn = !!shape && getComputedStyle(shape).stroke === RED;
  const spans = root.querySelectorAll('.ggv-x-lanes-svg rect[class*="s' + key.slice(1) + ' "]');
  const spansOn = spans.length > 0 && [...spans].every(r => getComputedStyle(r).fill === RED);
  const col = root.querySelector('.ggv-x-mem line[id$="x' + key.slice(1) + '"]');
  const slotOn = !!col && getComputedStyle(col).display !== 'none';
  return {key, gOn, spansOn, slotOn};
};
// afterwards, everything the page shows as selected, for the assertions
const full = (st) => {
  const key = st.key;
  const vert = root.querySelector('.ggv-x-gin g.node[id$="-' + key + '"]');
  const slots = [...root.querySelectorAll('.ggv-x-mem rect[id]')].filter(r => getComputedStyle(r).stroke === RED);
  const zslots = [...root.querySelectorAll('.ggv-x-memz rect[id]')].filter(r => getComputedStyle(r).stroke === RED);
  const bands = [...root.querySelectorAll('.ggv-x-mem rect[id]')].filter(r => getComputedStyle(r).display !== 'none'
                                                                         && r.getAttribute('style'));
  const spans = [...root.querySelectorAll('.ggv-x-lanes-svg rect')].filter(r => getComputedStyle(r).fill === RED);
  const outlined = [...root.querySelectorAll('.ggv-x-gin g.node')].filter(g => {
    const s = g.querySelector('polygon, path, ellipse'); return s && getComputedStyle(s).stroke === RED; });
  const blue = [...root.querySelectorAll('.ggv-x-gin g.node')].filter(g => {
    const s = g.querySelector('polygon, path, ellipse'); return s && getComputedStyle(s).stroke === 'rgb(21, 101, 192)'; });
  const gb = root.querySelector('.ggv-x-graph').getBoundingClientRect(), vr = vert.getBoundingClientRect();
  return Object.assign(st, {vertexName: vert ? vert.textContent : null, outlined: outlined.map(g => g.id),
          sources: blue.map(g => g.querySelector('title').textContent),
          slots: slots.map(r => r.querySelector('title').textContent), nBands: bands.length,
          zslots: zslots.map(r => r.querySelector('title').textContent),
          zoomViewBox: root.querySelector('.ggv-x-memz svg').getAttribute('viewBox'),
          spans: spans.map(r => r.querySelector('title').textContent),
          lanesViewBox: root.querySelector('.ggv-x-lanes-svg svg').getAttribute('viewBox'),
          lanesEnd: parseFloat(root.querySelector('.ggv-x-lanes-svg svg').getAttribute('data-t-end')),
          spanX: spans.map(r => [parseFloat(r.getAttribute('x')), parseFloat(r.getAttribute('x'))
                                                                  + parseFloat(r.getAttribute('width'))]),
          vertexInView: vr.left >= gb.left && vr.right <= gb.right && vr.top >= gb.top && vr.bottom <= gb.bottom,
          info: root.querySelector('.ggv-x-info').textContent, cause: root.querySelector('.ggv-x-cause').textContent,
          bytes: root.querySelector('.ggv-x-bytes').textContent, selMs: root.getAttribute('data-ggv-sel-ms')});
};
const poll = () => {
  const st = check();
  if (st.gOn && st.slotOn && st.spansOn) { st.ms = performance.now() - t0; done(full(st)); return; }
  if (performance.now() - t0 > 3000) { st.ms = null; done(st); return; }
  requestAnimationFrame(poll);
};
poll();
"""


def test_explorer_in_voila(request, tmp_path):
    drv = request.getfixturevalue("browser")
    from selenium.webdriver.common.by import By

    try:
        import anywidget  # noqa: F401
        import nbformat
        import voila  # noqa: F401
    except ImportError as e:
        _unavailable(f"{e.name} is not installed")
    from ggviz.tools import explore
    from ggviz.capture import DEFAULT_PROMPT

    nbformat.validate(nbformat.from_dict(explore.notebook(DEFAULT_PROMPT, 2, None)))   # what it serves
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
    # `ggviz explore` itself: it writes the notebook and runs Voilà (and Voilà the kernel) in this process group
    proc = subprocess.Popen([sys.executable, "-m", "ggviz", "explore", "--no-browser", f"--port={port}"],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_port(port, proc, 45)
        drv.get(f"http://127.0.0.1:{port}/")
        _wait(drv, lambda d: d.execute_script("const r = document.querySelector('.ggv-explorer-live');"
                                              " return !!r && !!r.querySelector('.ggv-x-gin svg g.node') &&"
                                              " !!r.querySelector('.ggv-x-mem svg')"), 60, "the explorer")
        t_page = time.perf_counter() - t0
        n_vertices = drv.execute_script("return document.querySelectorAll('.ggv-x-gin g.node').length")
        assert n_vertices > 1086, n_vertices                          # the full DAG: every node and the leafs
        drv.set_script_timeout(10)
        results = {}
        for how, target in (("click", "n131"), ("search", "kq_soft_max-5"), ("click", "n1085")):
            st = drv.execute_async_script(JS_SELECT, how, target)
            assert "error" not in st, st
            name = target if how == "search" else None
            assert st["ms"] is not None, f"the selection did not show in every pane within 3 s: {st}"
            assert st["ms"] < 200, f"{how} {target}: the panes followed after {st['ms']:.0f} ms (> 200 ms)"
            key = st["key"]
            assert key.startswith("n"), st
            shown = st["info"].split()[2]                               # "node 131 kq-3 MUL_MAT ..."
            if name is not None:
                assert shown == name, st
            else:
                assert key == target, st
            # the vertex, the buffer slot and the lane spans all name the same tensor
            assert shown in st["vertexName"], st
            assert len(st["outlined"]) == 1 and st["outlined"][0].endswith("-" + key) and st["vertexInView"], st
            assert len(st["sources"]) >= 1, st                          # what it reads, outlined in blue
            assert len(st["slots"]) == 1 and st["slots"][0].startswith(shown + ":"), st
            assert st["nBands"] == 1, st
            assert st["zslots"] == st["slots"], st                    # the zoomed copy of the buffer map too
            a = float(st["zoomViewBox"].split()[0])
            assert a <= int(key[1:]) + 1 <= a + 80, st                 # ... around the node
            assert len(st["spans"]) == 2 and all(f" {shown} (thread " in s for s in st["spans"]), st
            assert sorted(s.split("(thread ")[1][0] for s in st["spans"]) == ["0", "1"], st
            # the lanes show the node's spans with 3x their length each side, inside the compute (lanes_window)
            x, _, w, _ = map(float, st["lanesViewBox"].split())
            t0, t1 = min(a for a, _ in st["spanX"]), max(b for _, b in st["spanX"])
            assert 0 <= x <= t0 and t1 <= x + w <= st["lanesEnd"] + 1e-3, st
            assert (x, w) == pytest.approx(lanes_window(t0, t1, st["lanesEnd"]), abs=1e-2), st
            assert "backend CPU" in st["cause"], st
            results[f"{how} {target}"] = st
            # the values pane is drawn by the kernel: it follows after a round trip
            t1 = time.perf_counter()
            _wait(drv, lambda d, shown=shown: shown in (d.execute_script(
                "const v = document.querySelector('.ggv-explorer-values'); return v ? v.textContent : ''") or ""),
                  15, f"the values of {shown}")
            st["values_s"] = time.perf_counter() - t1
            _shot(drv, drv.find_element(By.CSS_SELECTOR, ".ggv-explorer"), f"explorer_{key}.png")
        # ◀ node: the node before, in execution order
        drv.execute_script("document.querySelector('.ggv-x-prev').click()")
        assert drv.execute_script("return document.querySelector('.ggv-explorer-live')"
                                  ".getAttribute('data-ggv-selected')") == "n1084"
        # the spine: a phase selects what it is about (logits -> result_output)
        drv.execute_script("document.querySelector('.ggv-x-phase[data-key=\"logits\"]').click()")
        assert drv.execute_script("return document.querySelector('.ggv-explorer-live')"
                                  ".getAttribute('data-ggv-selected')") == "n1085"
        assert "result_output" in drv.execute_script("return document.querySelector('.ggv-x-phase-text')"
                                                     ".textContent + document.querySelector('.ggv-x-info').textContent")
        # zoom: a wheel event scales the DAG
        before = drv.execute_script("return document.querySelector('.ggv-x-gin').style.transform")
        drv.execute_script("document.querySelector('.ggv-x-graph').dispatchEvent(new WheelEvent('wheel',"
                           " {deltaY: -300, clientX: 100, clientY: 100, bubbles: true, cancelable: true}))")
        after = drv.execute_script("return document.querySelector('.ggv-x-gin').style.transform")
        assert after != before and "scale(" in after, (before, after)
        # Voilà's page asks a CDN for fonts (no network here): those failed loads are not the explorer's errors
        errors = [e for e in drv.get_log("browser") if e["level"] == "SEVERE" and "favicon" not in e["message"]
                  and "cdn.jsdelivr.net" not in e["message"] and "ERR_NAME_NOT_RESOLVED" not in e["message"]
                  # Voilà's loader of JupyterLab extensions (voila.js) logs one for an extension it cannot share
                  and not ("getter for the shared module" in e["message"] and "voila.js" in e["message"])]
        for e in drv.get_log("browser"):
            print("browser log:", e["level"], e["message"][:300])
        assert errors == [], errors
        print(f"explorer page ready after {t_page:.1f} s; "
              + "; ".join(f"{k}: {v['ms']:.1f} ms in the browser (select() {v['selMs']} ms), values pane "
                          f"{v['values_s'] * 1e3:.0f} ms" for k, v in results.items()))
    except Exception:
        log.flush()
        print((tmp_path / "voila.log").read_text()[-4000:])
        raise
    finally:
        _stop(proc)
        log.close()

// ggviz report: the step sliders (.ggv-stepper): prev/next buttons, the range input and the arrow keys show one
// frame at a time, apply its CSS to the shared SVG and scroll its focus element into view. Inlined into
// report.html by ggviz/tools/report.py; sets body[data-ggv-ready] when done (tests/test_browser.py waits for it).
(function(){
  function setup(st){
    var frames = st.querySelectorAll('.ggv-frames > .ggv-frame');
    var range = st.querySelector('.ggv-range'), label = st.querySelector('.ggv-label');
    var style = st.querySelector('style.ggv-style'), box = st.querySelector('.ggv-scroll');
    function show(k){
      k = Math.max(0, Math.min(frames.length - 1, k));
      range.value = k;
      for (var i = 0; i < frames.length; i++) frames[i].style.display = (i === k) ? '' : 'none';
      label.textContent = (k + 1) + ' / ' + frames.length + ': ' + (frames[k].getAttribute('data-label') || '');
      if (style) style.textContent = frames[k].getAttribute('data-css') || '';
      st.setAttribute('data-step', k);
      var f = frames[k].getAttribute('data-focus');
      if (box && f){
        var el = document.getElementById(f);
        if (el){
          var b = el.getBoundingClientRect(), c = box.getBoundingClientRect();
          box.scrollTop += (b.top - c.top) - box.clientHeight / 2 + b.height / 2;
          box.scrollLeft += (b.left - c.left) - box.clientWidth / 2 + b.width / 2;
        }
      }
    }
    range.addEventListener('input', function(){ show(parseInt(range.value, 10)); });
    st.querySelector('.ggv-prev').addEventListener('click', function(){ show(parseInt(range.value, 10) - 1); });
    st.querySelector('.ggv-next').addEventListener('click', function(){ show(parseInt(range.value, 10) + 1); });
    st.addEventListener('keydown', function(e){
      if (e.key === 'ArrowRight') show(parseInt(range.value, 10) + 1);
      if (e.key === 'ArrowLeft') show(parseInt(range.value, 10) - 1);
    });
    show(0);
  }
  var all = document.querySelectorAll('.ggv-stepper');
  for (var i = 0; i < all.length; i++) setup(all[i]);
  document.body.setAttribute('data-ggv-ready', '1');
})();

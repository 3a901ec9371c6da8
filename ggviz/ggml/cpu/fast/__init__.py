"""ggviz's compiled fast path: a graph turned into a program that every thread walks inside one Numba ``nogil`` call.

Not a ggml source file. ggml's CPU executor (``ggml_graph_compute_thread``) is C: it walks the nodes and calls a C
kernel per node with no interpreter in between. ggviz's faithful executor (``cpu/ggml_cpu.py`` with the NumPy
kernels of ``cpu/ops.py``) returns to Python for every node of every thread, which is right for stepping through a
compute and far too slow for a 600-node decode. This package is the same arithmetic, compiled:

* ``program.py``: the layout of the program (one row of named int64/float64 columns per computed node), the sync
  array and the trace log -- NumPy only;
* ``compiler.py``: ``FastGraph`` (a compiled graph: build once, cache while the graph is unchanged, walk, trace);
* ``kernels.py``: the compiled kernels and the compiled ``ggml_graph_compute_thread``;
* ``sgemm.py``: llamafile's tinyBLAS float kernel (``llamafile_sgemm`` for F32 / F16), called by kernels.py's
  MUL_MAT where ggml_compute_forward_mul_mat calls it;
* ``sync.py``: ggml's barrier and chunk counter with real atomics, the error slot, the trace records;
* ``intrinsics.py``: LLVM intrinsics (raw memory, atomics, FMA), SIMD micro-kernels, bit-exact scalar helpers.

It hooks into the mirror at one place, the CPU executor (``ggml_cpu.graph_plan`` asks ``compiler.plan_graph`` for a
program; ``graph_compute`` runs it), and the CPU_REPACK extra buffer type (``cpu/repack.py``) uses its MUL_MAT
kernels. Importing this package raises ImportError when Numba is missing or ``GGVIZ_NO_NUMBA=1``: then nothing here
is loaded, CPU_REPACK is not offered (as when ggml is built without GGML_USE_CPU_REPACK) and every graph runs the
faithful kernels.
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import pathlib
import sys

if os.environ.get("GGVIZ_NO_NUMBA", "") not in ("", "0"):
    raise ImportError("the compiled fast path is disabled by GGVIZ_NO_NUMBA")

import numba  # noqa: E402,F401 - an ImportError here means: no compiled kernels


def _defer_numba_blas_probe() -> None:
    """Let Numba's BLAS probe look for SciPy's BLAS without importing all of ``scipy.linalg`` (until a jitted
    function really calls BLAS).

    When Numba's CPU target is first refreshed (before its first compile; cached kernels load without it, see
    ``cached_without_registries``) it imports ``numba.np.arraymath``, whose import runs ``_HAVE_BLAS =
    _check_blas()``: ``numba.np.linalg.ensure_blas()``, i.e. ``import scipy.linalg.cython_blas``.
    That import runs the whole of ``scipy/linalg/__init__.py`` (its LAPACK wrappers, its array-API layer, which pulls
    in numpy.f2py, numpy.testing and unittest): ~270 ms of a one-shot run's ~700 ms of Numba set-up, about 60 %, for
    ``np.dot`` / ``np.vdot`` / ``@`` inside jitted code (only they read ``_HAVE_BLAS``, and their typing calls
    ``ensure_blas()`` again before it emits a BLAS call) -- which no ggviz kernel uses. So for that one probe, and
    only while ``numba.np.arraymath`` is being imported, the answer comes from whether SciPy ships the
    ``cython_blas`` extension at all (``find_spec`` on ``scipy``: no import of scipy.linalg); every later call, the
    ones that precede a real BLAS call, is Numba's own ``ensure_blas``: it imports scipy.linalg and checks its LAPACK
    integer width then, raising what it always raised. A Numba whose internals differ (no ``ensure_blas``, or
    arraymath already imported) is left alone: the probe then costs what it costs."""
    if "numba.np.arraymath" in sys.modules:
        return
    try:
        from numba.np import linalg as _nb_linalg
    except ImportError:
        return
    real = getattr(_nb_linalg, "ensure_blas", None)
    if real is None or getattr(real, "_ggviz_deferred", False):
        return

    def _shipped() -> bool:
        try:
            spec = importlib.util.find_spec("scipy")
        except (ImportError, ValueError):
            return False
        for d in (spec.submodule_search_locations or []) if spec is not None else []:
            lin = pathlib.Path(d) / "linalg"
            if any((lin / f"cython_blas{sfx}").is_file() for sfx in importlib.machinery.EXTENSION_SUFFIXES):
                return True
        return False

    def ensure_blas():
        am = sys.modules.get("numba.np.arraymath")
        if am is not None and not hasattr(am, "_HAVE_BLAS") and "scipy.linalg.cython_blas" not in sys.modules:
            if not _shipped():                # arraymath's import-time probe: the answer, without the import
                raise ImportError("scipy 0.16+ is required for linear algebra")
            return
        return real()                         # a real BLAS use: Numba's own check

    ensure_blas._ggviz_deferred = True
    ensure_blas.__doc__ = real.__doc__
    _nb_linalg.ensure_blas = ensure_blas


_defer_numba_blas_probe()


def _code_names(fn) -> frozenset:
    """The global and attribute names ``fn``'s code (and the comprehensions inside it) refers to: the guards below
    compare them with the names of the Numba functions this module was written against, so that a Numba whose
    function does anything more takes its own path."""
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    if code is None:
        return frozenset()
    names, todo = set(), [code]
    while todo:
        c = todo.pop()
        names.update(c.co_names)
        todo.extend(k for k in c.co_consts if hasattr(k, "co_names"))
    return frozenset(names)


# What Numba 0.68's functions mirrored or wrapped below refer to (see _cache_format_with_symbols).
_UNSERIALIZE_NAMES = frozenset({
    "ValueError", "_codegen", "_engine", "_final_module", "_finalize_final_module", "_load_defined_symbols",
    "_set_compiled_object", "_shared_module", "create_library", "enable_object_caching", "isinstance", "ll",
    "parse_bitcode"})
_DEFINED_SYMBOLS_NAMES = frozenset({"_defined_symbols", "functions", "global_variables", "name", "is_declaration"})
_REBUILD_NAMES = frozenset({"codegen", "env_name", "get_executable", "set_env", "typing_context",
                            "unserialize_library"})
_LINKING_MODULE_NAMES = frozenset({          # _get_module_for_linking: the cached _shared_module, else built
    "Linkage", "RuntimeError", "_ensure_finalized", "_final_module", "_shared_module", "append", "clone", "external",
    "functions", "get_function", "is_declaration", "linkage", "ll", "name"})
_SERIALIZE_NAMES = frozenset({"_ensure_finalized", "_get_compiled_object", "_get_module_for_linking", "as_bitcode",
                              "name"})

# The serialization kind of a library in ggviz's cache entries (Numba's own are 'object' and 'bitcode'); it is also
# part of their index key, so a Numba-format reader never finds one of them, nor ggviz's reader one of Numba's.
_KIND = "ggviz:object+symbols"


def _cache_format_with_symbols():
    """A ``CompileResultCacheImpl`` that stores a compiled function's library with the names of the symbols it
    defines and loads it without parsing its LLVM bitcode, and Numba's ``CompileResultCacheImpl`` it stands in for --
    or (None, None) where Numba's internals are not the ones this was written against (then entries are Numba's own
    and every load parses).

    Numba caches a function's library as its object code plus its *shared bitcode*: the whole optimized LLVM module
    (linkonce_odr), kept so that a function compiled later that calls this one can link it in and inline it. Its
    loader (``CPUCodeLibrary._unserialize``, kind 'object') parses that bitcode at once, for one thing only: the names
    of the symbols it defines, which the JIT engine's bookkeeping needs (``JitEngine._load_defined_symbols``; a
    library's ``get_pointer_to_function`` answers only for those names). The machine code itself comes from the
    object code. For ``graph_compute_thread`` (a 1 MB entry, every kernel inlined) that parse is ~38 ms of a fresh
    process's first prompt, for a module no one links against: our kernels are entry points called from Python.

    So an entry here holds the same object code and the same bitcode, plus the names Numba would extract from that
    bitcode, extracted once when the entry is written (from the very module serialized). Loading does what Numba's
    loader does -- a library with that object code as its compiled object, finalized, its names registered with the
    engine -- and keeps the bitcode as bytes: ``_LinkOnDemandLibrary`` parses it the first time a later compile
    links against the library (a new function calling a kernel loaded from the cache), so that path still inlines
    the same module."""
    try:
        from llvmlite import binding as ll
        from numba.core import compiler
        from numba.core.caching import CompileResultCacheImpl
        from numba.core.codegen import CPUCodeLibrary, JITCodeLibrary, JitEngine
        from numba.core.compiler_lock import global_compiler_lock
    except ImportError:
        return None, None
    if not (_code_names(CPUCodeLibrary._unserialize) == _UNSERIALIZE_NAMES
            and _code_names(JitEngine._load_defined_symbols) == _DEFINED_SYMBOLS_NAMES
            and _code_names(getattr(compiler.CompileResult, "_rebuild", None)) == _REBUILD_NAMES
            and _code_names(JITCodeLibrary._get_module_for_linking) == _LINKING_MODULE_NAMES
            and _code_names(JITCodeLibrary.serialize_using_object_code) == _SERIALIZE_NAMES):
        return None, None

    class _LinkOnDemandLibrary(JITCodeLibrary):
        """A ``JITCodeLibrary`` loaded from ggviz's cache: its shared bitcode stays bytes until a compile links
        against it (``_get_module_for_linking``, under Numba's compiler lock like every link)."""
        _shared_bitcode = None

        def _get_module_for_linking(self):
            if self._shared_module is None and self._shared_bitcode is not None:
                self._shared_module = ll.parse_bitcode(self._shared_bitcode)
                self._shared_bitcode = None
            return super()._get_module_for_linking()

    def unserialize(codegen, libdata):
        """Numba's ``CPUCodeLibrary._unserialize`` for kind 'object', with the defined names read from the entry
        instead of from the parsed bitcode."""
        name, _, (object_code, shared_bitcode, defined) = libdata
        lib = _LinkOnDemandLibrary(codegen, name)
        lib.enable_object_caching()
        lib._set_compiled_object(object_code)        # the JIT's object cache hook hands it to LLVM at finalize
        lib._shared_bitcode = shared_bitcode
        lib._finalize_final_module()
        codegen._engine._defined_symbols.update(defined)     # what _load_defined_symbols(shared module) adds
        return lib

    class CacheFormatWithSymbols(CompileResultCacheImpl):
        def reduce(self, cres):
            payload = super().reduce(cres)
            libdata = payload[0]
            if not (isinstance(libdata, tuple) and len(libdata) == 3 and libdata[1] == "object"):
                return payload
            name, _, (object_code, shared_bitcode) = libdata
            mod = cres.library._get_module_for_linking()          # the module serialized as shared_bitcode
            defined = tuple(sorted(gv.name for gsets in (mod.functions, mod.global_variables) for gv in gsets
                                   if not gv.is_declaration))
            return ((name, _KIND, (object_code, shared_bitcode, defined)),) + tuple(payload[1:])

        def rebuild(self, target_context, payload):
            libdata = payload[0]
            if libdata[1] != _KIND:
                return super().rebuild(target_context, payload)
            codegen = target_context.codegen()
            if type(codegen)._library_class is not JITCodeLibrary:
                return None                      # not Numba's CPU JIT: compile rather than load
            # Numba's CompileResult._rebuild does the rest (reload_init, the entry point, environments); for this
            # one call its codegen's unserialize_library is ours -- under the compiler lock, where every load and
            # compile runs, so no other thread unserializes meanwhile.
            with global_compiler_lock:
                codegen.unserialize_library = lambda data: unserialize(codegen, data)
                try:
                    return super().rebuild(target_context, payload)
                finally:
                    del codegen.unserialize_library

    return CacheFormatWithSymbols, CompileResultCacheImpl


_CacheFormatWithSymbols, _NumbaCacheImpl = _cache_format_with_symbols()


def _cache_load_without_registries():
    """A ``numba.core.caching.FunctionCache`` whose ``load_overload`` brings machine code back from the on-disk
    cache without first installing Numba's typing and lowering registries -- or None where Numba's internals are
    not the ones this was written against (then every load costs what it costs).

    Numba's ``Cache.load_overload`` starts with ``target_context.refresh()``: the CPU target's
    ``load_additional_registries`` imports ~60 modules of Numba's own implementations (numpy.random's generators,
    polynomials, typed dict/list/set, jitclass, datetime, linalg, arraymath ...) and installs their registries into
    the typing and target contexts: ~100-150 ms of a one-shot run, once per process, for a run whose kernels are all
    cached. Those registries serve the compiler (typing a function body, lowering each call in it); loading cached
    code needs none of them -- it unpickles the function's signature and environment, hands the object code to
    LLVM's JIT and wraps the entry point. What it does need is the C functions of Numba's runtime (NRT:
    NRT_MemInfo_alloc_aligned, NRT_Free, NRT_adapt_ndarray_from_python ...) registered as symbols, which loaded code
    calls: the first half of ``rtsys.initialize`` (the first line of ``load_additional_registries``), done here
    (``_nrt_c_symbols``). Its second half compiles NRT's LLVM helpers (NRT_incref / NRT_decref, the atomic
    add/sub/cas, nrt_unresolved_abort) into a library that a *compile* links into each new function (``post_lowering``
    links ``rtsys.library``), where they are inlined or kept as weak copies: the object code of every cached ggviz
    kernel defines the ones it uses itself (``nm``: NRT_incref / NRT_decref weak in each entry, no undefined symbol
    but NRT's C functions, Python's C API and Numba's helperlib). Loading leaves that compile (~20 ms, NRT's module
    through LLVM's passes and code generation) to ``rtsys.initialize`` when the first compile refreshes the target.
    Nothing is skipped for good: every compile -- a kernel missing from the cache, a new signature -- goes through
    Numba's ``CompilerBase``, which refreshes both contexts before it types anything (initializing the runtime
    first), and a lowering lookup that finds nothing refreshes too (``BaseContext.get_function``).

    Where ``_cache_format_with_symbols`` applies, entries are written and read in its format (the library's defined
    names stored, its bitcode parsed only for linking) and their index key says so."""
    try:
        from numba.core.caching import FunctionCache
        from numba.core.runtime import rtsys
    except ImportError:
        return None
    if not (hasattr(FunctionCache, "_load_overload") and hasattr(FunctionCache, "_guard_against_spurious_io_errors")
            and hasattr(FunctionCache, "_index_key") and hasattr(rtsys, "initialize")):
        return None

    class CacheLoadWithoutRegistries(FunctionCache):
        def load_overload(self, sig, target_context):
            if _nrt_c_symbols is None:
                rtsys.initialize(target_context)
            else:
                _nrt_c_symbols()
            with self._guard_against_spurious_io_errors():
                return self._load_overload(sig, target_context)
            # (None when the guard swallowed an I/O error, as Numba's own load_overload)

        def _index_key(self, sig, codegen):
            key = super()._index_key(sig, codegen)
            if _CacheFormatWithSymbols is not None and type(self._impl) is _CacheFormatWithSymbols:
                key = key + (_KIND,)
            return key

    return CacheLoadWithoutRegistries


# What Numba 0.68's rtsys.initialize refers to: its C symbols, its stats switch and compile_nrt_functions, nothing else.
_NRT_INITIALIZE_NAMES = frozenset({
    "NRT_STATS", "_init", "_library", "_nrt", "add_symbol", "c_helpers", "compile_nrt_functions", "config", "ll",
    "memsys_enable_stats", "nrtdynmod", "startswith"})


def _nrt_c_symbols_registrar():
    """The first half of Numba's ``rtsys.initialize`` -- NRT's C functions registered with LLVM under the names
    compiled code calls them by -- as a function that does it once; or None where ``rtsys.initialize`` does more than
    the Numba this was written against, or NRT statistics are on (switched on by ``rtsys.initialize``): then the
    loader calls ``rtsys.initialize`` itself (see ``_cache_load_without_registries``)."""
    try:
        from llvmlite import binding as ll
        from numba.core import config
        from numba.core.runtime import _nrt_python as _nrt
        from numba.core.runtime import rtsys
    except ImportError:
        return None
    init = getattr(type(rtsys).initialize, "__wrapped__", None)          # under @global_compiler_lock
    if init is None or _code_names(init) != _NRT_INITIALIZE_NAMES or config.NRT_STATS \
            or not isinstance(getattr(_nrt, "c_helpers", None), dict):
        return None
    done = []

    def register() -> None:
        if done or rtsys._init:
            return
        for py_name, address in _nrt.c_helpers.items():
            ll.add_symbol(py_name if py_name.startswith("_") else "NRT_" + py_name, address)
        done.append(True)

    return register


_nrt_c_symbols = _nrt_c_symbols_registrar()
_CacheLoadWithoutRegistries = _cache_load_without_registries()


def cached_without_registries(dispatcher):
    """Let ``dispatcher`` (an ``@njit(cache=True)`` function) load its cached machine code without Numba's
    registries (see ``_cache_load_without_registries``) and, where Numba allows, without parsing its bitcode
    (``_cache_format_with_symbols``); returns it. A dispatcher with another cache, or none, is left as it is."""
    cache = getattr(dispatcher, "_cache", None)
    if _CacheLoadWithoutRegistries is not None and type(cache) is _CacheLoadWithoutRegistries.__base__:
        cache.__class__ = _CacheLoadWithoutRegistries
        if _CacheFormatWithSymbols is not None and type(cache._impl) is _NumbaCacheImpl:
            cache._impl.__class__ = _CacheFormatWithSymbols
    return dispatcher


# Numba's on-disk cache checks only the timestamp of the file that defines a cached function, but the compiled
# ``graph_compute_thread`` inlines kernels of every module here (and libm.py's / vec.py's functions and constants):
# after an edit of kquants.py alone it would silently load the old machine code. So the cache is keyed on the
# sources of all of them together: when their hash changes, every cached kernel of this package is dropped.
_CACHE_SOURCES = ("libm.py", "vec.py")


def _drop_stale_kernel_cache() -> None:
    if os.environ.get("NUMBA_CACHE_DIR"):
        return                                   # a cache elsewhere is the user's to manage
    here = pathlib.Path(__file__).resolve().parent
    h = hashlib.sha256()
    for p in sorted(here.glob("*.py")) + [here.parent / n for n in _CACHE_SOURCES]:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    digest = h.hexdigest()
    cache = here / "__pycache__"
    stamp = cache / "ggviz-kernel-sources.sha256"
    try:
        old = stamp.read_text() if stamp.is_file() else None
        if old == digest:
            return
        for f in list(cache.glob("*.nbi")) + list(cache.glob("*.nbc")):
            f.unlink(missing_ok=True)
        cache.mkdir(exist_ok=True)
        stamp.write_text(digest)
    except OSError:
        pass                                     # a read-only install: Numba then compiles in memory


_drop_stale_kernel_cache()

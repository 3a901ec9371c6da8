"""The ``ggviz`` commands, as llama.cpp's ``tools/``: each module is one command (or two: ``export`` holds ``graph``
and ``trace``) that parses its own options and orchestrates the library -- it runs the engine, records what it
needs through ``ggviz.capture``, and draws it with ``ggviz.viz``. Nothing below this package imports it.

    run      generate text                         report   the standalone HTML walkthrough of one decode step
    bench    what a user waits for, beside llama.cpp  export   ``ggviz graph`` / ``ggviz trace`` files
    demo     the main demo                         book     the notebooks as an offline HTML site
    explore  the linked decode explorer (Voila)

``ggviz.cli`` dispatches ``ggviz <command>`` to ``ggviz.tools.<module>.main``.
"""

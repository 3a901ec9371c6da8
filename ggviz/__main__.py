"""`python -m ggviz ...` is the same as the `ggviz` command."""
import sys

from ggviz.cli import main

sys.exit(main())

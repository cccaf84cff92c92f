"""`python -m gateway serve ...` is the same as `modelyard serve ...`."""
import sys

from .cli import main

sys.exit(main())

"""`python -m gateway serve ...` is the same as `modelyard serve ...`."""
import sys

from gateway.cli import main

sys.exit(main())

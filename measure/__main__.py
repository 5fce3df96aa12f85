"""Entry point of ``python -m measure`` (see measure)."""
import sys

from measure.cli import main

if __name__ == "__main__":
    sys.exit(main())

"""Entry point of ``python -m verify.measure`` (see verify.measure)."""
import sys

from verify.measure.cli import main

if __name__ == "__main__":
    sys.exit(main())

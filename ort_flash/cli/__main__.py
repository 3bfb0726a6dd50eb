"""``python -m ort_flash.cli``: the ``ort-flash`` console script."""
import sys

from ort_flash.cli.main import main

sys.exit(main())

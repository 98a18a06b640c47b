"""`python -m jaxtrain.compare_precision A B`: the short name of jaxtrain/tools/compare_precision.py."""

import sys

from jaxtrain.tools.compare_precision import main

if __name__ == '__main__':
    sys.exit(main())

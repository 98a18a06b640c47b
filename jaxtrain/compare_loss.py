"""`python -m jaxtrain.compare_loss`: the short name of jaxtrain/tools/compare_loss.py, where the
tool lives."""

import sys

from jaxtrain.tools.compare_loss import main

if __name__ == '__main__':
    sys.exit(main())

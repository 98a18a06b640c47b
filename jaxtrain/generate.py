"""`python -m jaxtrain.generate`: the short name of jaxtrain/tools/generate.py, where the tool lives."""

import sys

from jaxtrain.tools.generate import main

if __name__ == '__main__':
    sys.exit(main())

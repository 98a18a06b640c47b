"""`python -m jaxtrain.ckpt`: the short name of jaxtrain/tools/ckpt.py, where the tool lives."""

import sys

from jaxtrain.tools.ckpt import main

if __name__ == '__main__':
    sys.exit(main())

"""`python -m jaxtrain.bench`: the short name of jaxtrain/tools/bench.py, where the tool lives.

It runs that module as __main__, so that --help prints the tool's own text and flags.
"""

import runpy

if __name__ == '__main__':
    runpy.run_module('jaxtrain.tools.bench', run_name='__main__', alter_sys=True)

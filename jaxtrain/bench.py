"""`python -m jaxtrain.bench`: the short name of jaxtrain/tools/bench.py, where the tool lives."""

from jaxtrain.tools.bench import entry_point

if __name__ == '__main__':
    entry_point()

"""Host memory and time of jaxtrain's Orbax save and restore alone, at a model's state size: a
random fp32 state (the parameters and AdamW's two moments) on the device, saved by the run's
Checkpointer, or restored by the run's restore, with the process's resident memory sampled every
10 ms by kind (anonymous, shared: the pinned pool, file-backed).

    python bench/orbax_memory.py save DIR                   # then DIR/checkpoint_step_000001
    python bench/orbax_memory.py restore DIR/checkpoint_step_000001 --restore_gb 2

`save --all_at_once` copies every array off the device before save() returns, as Orbax's default
status callback did (orbax_host.TransferOrder); `restore --restore_gb N` sets
RESTORE_CONCURRENT_GB. The restore drops the step's files from the page cache first.
"""

import argparse
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

KINDS = ('VmRSS', 'RssAnon', 'RssShmem', 'RssFile')


def resident() -> dict:
    """GiB of the process's resident memory, by kind (/proc/self/status)."""
    values = {}
    with open('/proc/self/status') as f:
        for line in f:
            name = line.split(':')[0]
            if name in KINDS:
                values[name] = int(line.split()[1]) / 2**20
    return values


class Peaks:
    """The highest of each kind since the last reset, sampled on a thread of its own."""

    def __init__(self):
        self.peak = dict.fromkeys(KINDS, 0.0)
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self):
        while True:
            for kind, value in resident().items():
                self.peak[kind] = max(self.peak[kind], value)
            time.sleep(0.01)

    def reset(self):
        self.peak = dict(resident())

    def line(self, what: str, seconds: float) -> str:
        now = resident()
        kinds = ' '.join(f'{k} {now.get(k, 0):.2f}/{self.peak.get(k, 0):.2f}' for k in KINDS)
        return f'{what}: {seconds:.2f} s | GiB now/peak {kinds}'


def random_state(variant: str):
    import jax
    import jax.numpy as jnp

    from jaxtrain.checkpoint.formats.infinitrain.trainer import model_header
    from jaxtrain.models import FAMILIES

    family = 'llama3' if variant in FAMILIES['llama3'][2] else 'gpt2'
    shapes = model_header(family, FAMILIES[family][2][variant]).param_shapes()

    def tree(seed):
        keys = jax.random.split(jax.random.key(seed), len(shapes))
        return {
            name: jax.random.normal(key, tuple(dims), jnp.float32)
            for key, (name, dims) in zip(keys, sorted(shapes.items()))
        }

    params, opt_state = tree(0), {'mu': tree(1), 'nu': tree(2)}
    jax.block_until_ready((params, opt_state))
    return params, opt_state


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        'action', choices=('save', 'restore'), help='save a step into PATH, or restore the step PATH'
    )
    parser.add_argument('path', type=Path, help='a checkpoint root (save) or a step directory (restore)')
    parser.add_argument(
        '--model', default='llama3.2-1b', help='a variant of configs/gpt2.py or configs/llama3.py'
    )
    parser.add_argument(
        '--all_at_once', action='store_true', help='save: copy every array before save() returns'
    )
    parser.add_argument('--restore_gb', type=float, default=None, help='restore: RESTORE_CONCURRENT_GB')
    args = parser.parse_args(argv)

    import jax

    peaks = Peaks()
    params, opt_state = random_state(args.model)
    nbytes = 3 * sum(leaf.nbytes for leaf in jax.tree.leaves(params))
    print(f'state: {nbytes / 2**30:.2f} GiB on {jax.devices()[0].device_kind}', flush=True)
    if args.action == 'save':
        from jaxtrain.checkpoint import manager, orbax_host

        if args.all_at_once:
            orbax_host.TransferOrder.key_priority = lambda self, keypath: (
                orbax_host.TransferPriority.SYNCHRONOUS
            )
        checkpointer = manager.Checkpointer(str(args.path), keep_latest=2, keep_every=0)
        rng = jax.random.key_data(jax.random.key(0))
        print(checkpointer.prepare(params, opt_state, rng) or 'saves: nothing pinned', flush=True)
        snapshot = checkpointer.snapshot(params, opt_state, rng)
        jax.block_until_ready(snapshot.items)
        peaks.reset()
        began = time.perf_counter()
        checkpointer.save_snapshot(1, snapshot, {'step': 1})
        del snapshot
        checkpointer._finish_handoff()
        print(peaks.line('handed to Orbax', time.perf_counter() - began), flush=True)
        checkpointer.wait()
        print(peaks.line('committed', time.perf_counter() - began), flush=True)
        checkpointer.close()
        return 0
    from bench.ckpt_io import drop_from_page_cache
    from jaxtrain.checkpoint.formats.orbax import restore as orbax_restore

    if args.restore_gb is not None:
        orbax_restore.RESTORE_CONCURRENT_GB = args.restore_gb
    orbax_restore.check_resumable = lambda *a: None  # the record of a `save` here holds only the step
    drop_from_page_cache(args.path)
    peaks.reset()
    began = time.perf_counter()
    restored = orbax_restore.restore(args.path, params, opt_state)[:2]
    jax.block_until_ready(restored)
    print(
        peaks.line(
            f'restored ({orbax_restore.RESTORE_CONCURRENT_GB} GB at a time)', time.perf_counter() - began
        )
    )
    return 0


if __name__ == '__main__':
    sys.exit(main())

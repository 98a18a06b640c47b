"""The steps around an Orbax save in the real loop, with the save's copy settings changed: what
the step after a save costs, and where the loop's thread was while it ran.

    python bench/orbax_save_levers.py OUT --input_bin TRAIN.bin --host_gb 1 --pin_gb 1
    python bench/orbax_save_levers.py OUT --input_bin TRAIN.bin --pageable --sample_s 1.5

It runs `python -m jaxtrain.main` in this process (--config, B x T as the ckpt_io figure: LLaMA-3.2
1B, B4 x T2048), saving with the optimizer state at --save_step, and prints one JSON line: the
save's figures as ckpt_io.py takes them (the median step before it, the loop blocked by it, when
its step directory appeared: the commit), every step after it over that median, and the peak
resident memory (the pinned pool shows as shared). The settings are the ones manager.py fixes,
changed here on purpose, to measure what it does not offer:
  --host_gb   GB that Orbax copies off the device at a time (manager.HOST_TRANSFER_GB)
  --pin_gb    GB of the largest arrays copied to pinned memory before step 1 (0: none)
  --pageable  Orbax copies into pageable memory instead of pinned (its enable_pinned_host_transfer)
  --pieces_mb MB of an array copied to pinned memory in one device_put (manager.HOST_PIECE_MB,
              for a state with an array over manager.HOST_PIECES_FROM_MB, as this shape's are;
              0: each array whole, as Orbax itself copies)
  --ahead     batches copied ahead of the one Orbax writes (orbax_host.BATCHES_AHEAD; 0: none)
--sample_s S records every thread's innermost frames every 2 ms for S seconds from the save's
start and prints them grouped: a stretch with no samples is one where the sampling thread, like
the loop's, could not get the GIL.
"""

import argparse
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ckpt_io import _rows, save_figures, size_of  # noqa: E402
from figures import _loop_flags  # noqa: E402
from orbax_memory import Peaks  # noqa: E402

# A thread whose innermost frame is one of these is waiting, not working.
IDLE_FRAMES = ('_worker:', 'select:', 'wait:', '_wait_for_tstate_lock', '_sample:', 'poll:')


def parse_args(argv=None):
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument('out', type=Path, help='folder for the run metrics (and the checkpoints, by default)')
    parser.add_argument('--input_bin', required=True, help="training tokens in llm.c's format")
    parser.add_argument('--config', default='configs/llama3.py:llama3.2-1b', help='the model config')
    parser.add_argument('--batch_size', type=int, default=4, help='sequences a step')
    parser.add_argument('--sequence_length', type=int, default=2048, help='tokens a sequence')
    parser.add_argument('--steps', type=int, default=80, help='steps of the run')
    parser.add_argument('--save_step', type=int, default=50, help='the step saved (and the last)')
    parser.add_argument('--checkpoint_dir', type=Path, help='where the steps go (default OUT/ck)')
    parser.add_argument('--host_gb', type=float, default=None, help="GB copied at a time (manager's)")
    parser.add_argument('--pin_gb', type=float, default=None, help='GB pinned before step 1 (host_gb)')
    parser.add_argument('--pageable', action='store_true', help='copy into pageable memory, pin nothing')
    parser.add_argument(
        '--pieces_mb', type=float, default=None, help="MB of an array copied at once (manager's; 0: whole)"
    )
    parser.add_argument(
        '--in_flight', type=int, default=None, help='pieces copied or being joined at a time (orbax_host)'
    )
    parser.add_argument(
        '--ahead', type=int, default=None, help='batches copied while the one before is written (orbax_host)'
    )
    parser.add_argument('--sample_s', type=float, default=0.0, help='seconds sampled from the save')
    return parser.parse_args(argv)


def change_settings(host_gb, pin_gb, pageable, pieces_mb=None, in_flight=None, ahead=None) -> None:
    """Sets the manager's copy settings for the run this process starts."""
    import orbax.checkpoint as ocp

    from jaxtrain.checkpoint import manager, orbax_host, pinned_host

    if in_flight is not None:
        orbax_host.PIECES_IN_FLIGHT = in_flight
    if ahead is not None:
        orbax_host.BATCHES_AHEAD = ahead
    if pieces_mb is not None:
        manager.HOST_PIECE_MB = pieces_mb
    if host_gb is not None:
        manager.HOST_TRANSFER_GB = host_gb
    if pageable:
        pin_gb = 0.0
        handler = ocp.PyTreeCheckpointHandler
        ocp.PyTreeCheckpointHandler = lambda **kw: handler(enable_pinned_host_transfer=False, **kw)
    if pin_gb is None:
        return
    limit = int(pin_gb * 1e9)
    grow = pinned_host.grow_pinned_host_pool
    manager.grow_pinned_host_pool = lambda tree, _: grow(tree, limit) if limit else 0.0
    manager.leaves_to_pin = lambda tree, _: pinned_host.leaves_to_pin(tree, limit)


class ThreadSamples:
    """Every thread's three innermost frames every 2 ms, for `seconds` from start()."""

    def __init__(self, seconds: float):
        self.seconds, self.began, self.rows = seconds, None, []
        threading.Thread(target=self._sample, daemon=True).start()

    def start(self):
        if self.began is None:
            self.began = time.perf_counter()

    def _sample(self):
        while self.began is None or time.perf_counter() < self.began + self.seconds:
            if self.began is not None:
                names = {thread.ident: thread.name for thread in threading.enumerate()}
                row = []
                for ident, frame in sys._current_frames().items():
                    if ident == threading.get_ident():
                        continue
                    stack = reversed(traceback.extract_stack(frame)[-3:])
                    where = ' < '.join(f'{f.name}:{os.path.basename(f.filename)}:{f.lineno}' for f in stack)
                    name = names.get(ident, '?')
                    if name == 'MainThread' or not where.startswith(IDLE_FRAMES):
                        row.append(f'{name}: {where}')
                self.rows.append((1e3 * (time.perf_counter() - self.began), tuple(sorted(row))))
            time.sleep(0.002)

    def grouped(self) -> list[str]:
        """Runs of identical samples, each as its first and last time (ms after the save began)."""
        groups = []
        for ms, row in self.rows:
            if groups and groups[-1][2] == row:
                groups[-1][1], groups[-1][3] = ms, groups[-1][3] + 1
            else:
                groups.append([ms, ms, row, 1])
        return [f'{a:7.1f}-{b:7.1f} ms x{n}: ' + ' | '.join(row) for a, b, row, n in groups]


def watch_for(path: Path, seen: dict) -> None:
    """Records in seen['at'] the epoch time `path` first exists (the step's commit)."""

    def poll():
        while not path.exists():
            time.sleep(0.01)
        seen['at'] = time.time()

    threading.Thread(target=poll, daemon=True).start()


def main(argv=None) -> int:
    args = parse_args(argv)
    change_settings(args.host_gb, args.pin_gb, args.pageable, args.pieces_mb, args.in_flight, args.ahead)
    from jaxtrain import main as jaxtrain_main
    from jaxtrain.checkpoint import manager, orbax_host

    checkpoint_dir = (args.checkpoint_dir or args.out / 'ck').absolute()
    step_dir = checkpoint_dir / f'checkpoint_step_{args.save_step:06d}'
    seen = {}
    watch_for(step_dir, seen)  # when it is committed
    samples = ThreadSamples(args.sample_s) if args.sample_s else None
    if samples:
        save_snapshot = manager.Checkpointer.save_snapshot

        def marked(self, *a, **k):
            samples.start()
            return save_snapshot(self, *a, **k)

        manager.Checkpointer.save_snapshot = marked
    sys.argv = ['jaxtrain.main', *_loop_flags(args.config, args.batch_size, args.sequence_length)]
    sys.argv += ['--input_bin', args.input_bin, '--num_iteration', str(args.steps)]
    sys.argv += ['--metrics_dir', str(args.out / 'metrics'), '--checkpoint_dir', str(checkpoint_dir)]
    sys.argv += ['--save_steps', str(args.save_step), '--max_checkpoint_keep', '2']
    sys.argv += ['--save_optimizer_state', 'true']
    peaks = Peaks()
    try:
        jaxtrain_main.entry_point()
    except SystemExit as e:
        if e.code:
            return int(e.code) if isinstance(e.code, int) else 1
    rows = _rows(args.out / 'metrics')
    result = save_figures(rows, args.save_step, size_of(step_dir), seen.get('at'))
    # Every step after the save over the median, where ckpt_io reports the worse of the first two.
    steps = {r['step']: r['step_ms'] for r in rows if 'loss' in r and r['step'] > args.save_step}
    result['after_save_vs_median'] = [round(steps[s] / result['median_step_ms'], 2) for s in sorted(steps)]
    result['peak GiB'] = {kind: round(value, 2) for kind, value in peaks.peak.items()}
    settings = {'host_gb': manager.HOST_TRANSFER_GB, 'pin_gb': args.pin_gb, 'pageable': args.pageable}
    settings['pieces_mb'] = manager.HOST_PIECE_MB
    settings['in_flight'] = orbax_host.PIECES_IN_FLIGHT
    settings['ahead'] = orbax_host.BATCHES_AHEAD
    print(json.dumps({'settings': settings, **result}), flush=True)
    for line in samples.grouped() if samples else []:
        print(line)
    return 0


if __name__ == '__main__':
    sys.exit(main())

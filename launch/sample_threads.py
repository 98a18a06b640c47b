"""Where each thread of a training run is while a save is in flight: a sampling profiler.

  python launch/sample_threads.py [--every_ms 5] [--window_s 2.5] [--trigger _hand_to_orbax] \
      -- <jaxtrain.main flags>

Runs `python -m jaxtrain.main <flags>` in this process with one more thread, which every
EVERY_MS takes the Python stack of every other thread (sys._current_frames). From the first
sample in which some thread runs the function TRIGGER (by default the checkpointer's hand-off
of a save to Orbax, i.e. the run's first save), for WINDOW_S seconds, it counts each thread's
innermost frames. At exit it prints, per thread, the most
frequent stacks in that window, with how many samples each took.

Made for the first save's stall on a GPU (BENCHMARKS.md round six: the steps after a run's
first save take 0.9-1.1 s more, later saves tens of ms). A thread waiting for the GIL shows the
frame it last ran; one waiting on the device shows the read that blocks.
"""

import argparse
import collections
import runpy
import sys
import threading
import time
import traceback

FRAMES_KEPT = 6  # innermost frames per stack: enough to name the call, few enough to group


def _runs(frame, function: str) -> bool:
    while frame is not None:
        if frame.f_code.co_name == function:
            return True
        frame = frame.f_back
    return False


def _stack_key(frame) -> str:
    stack = traceback.extract_stack(frame)[-FRAMES_KEPT:]
    return ' <- '.join(f'{f.name} ({f.filename.rsplit("/", 1)[-1]}:{f.lineno})' for f in reversed(stack))


class Sampler(threading.Thread):
    def __init__(self, every_s: float, window_s: float, trigger: str):
        super().__init__(name='sampler', daemon=True)
        self.every_s, self.window_s, self.trigger = every_s, window_s, trigger
        self.counts = collections.defaultdict(collections.Counter)  # thread name -> stack -> samples
        self.began = None  # the first sample in which a thread ran the trigger

    def run(self):
        me = threading.get_ident()
        while self.began is None or time.perf_counter() - self.began < self.window_s:
            time.sleep(self.every_s)
            names = {t.ident: t.name for t in threading.enumerate()}
            frames = sys._current_frames()
            if self.began is None:
                if not any(_runs(frame, self.trigger) for ident, frame in frames.items() if ident != me):
                    continue
                self.began = time.perf_counter()
            for ident, frame in frames.items():
                if ident != me:
                    self.counts[names.get(ident, str(ident))][_stack_key(frame)] += 1

    def report(self, top: int = 6):
        if self.began is None:
            print(f'sample_threads: no thread ran {self.trigger} (no save?)')
            return
        print(
            f'sample_threads: {self.window_s} s from the first sample in {self.trigger}, '
            f'a sample every {1e3 * self.every_s:.0f} ms'
        )
        for thread, stacks in sorted(self.counts.items()):
            print(f'== {thread}: {sum(stacks.values())} samples')
            for stack, n in stacks.most_common(top):
                print(f'  {n:5d}  {stack}')


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--every_ms', type=float, default=5.0, help='sampling interval (default %(default)s)')
    parser.add_argument(
        '--window_s', type=float, default=2.5, help='how long to sample from the trigger on (default %(default)s)'
    )
    parser.add_argument(
        '--trigger', default='_hand_to_orbax', help='the function whose first run starts the window (default %(default)s)'
    )
    parser.add_argument('main_flags', nargs=argparse.REMAINDER, help='-- then the flags of jaxtrain.main')
    args = parser.parse_args()
    flags = args.main_flags[1:] if args.main_flags[:1] == ['--'] else args.main_flags
    sampler = Sampler(args.every_ms / 1e3, args.window_s, args.trigger)
    sampler.start()
    sys.argv = ['jaxtrain.main', *flags]
    try:
        runpy.run_module('jaxtrain.main', run_name='__main__')
    except SystemExit:
        pass
    finally:
        sampler.report()


if __name__ == '__main__':
    main()

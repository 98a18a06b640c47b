"""The lines a run prints about its checkpoints as they happen: each save as it starts
(how long the loop was blocked), when it is committed on disk (how long the write took),
and each step rotation deleted (and which keep rule let it go).

Saves are written in the background (checkpoint/manager.py, formats/infinitrain/saver.py),
so commits and deletions are found by looking at the checkpoint root: `poll()` lists it (with
the format's own listing of committed steps), and only while something is still to happen (a
save not yet committed, or more steps on disk than the keep rules keep), so a run that is not
saving never touches the disk for it. A synchronous save (llm.c run folders) is committed when
save() returns, so it is looked for at once.
"""

import time

from jaxtrain.checkpoint.layout import kept_steps
from jaxtrain.checkpoint.layout import committed_steps, step_dir_name


class SaveEvents:
    def __init__(
        self,
        root,
        *,
        keep_latest: int,
        keep_every: int,
        protected=(),
        report=None,
        record=None,
        list_committed=committed_steps,
        synchronous: bool = False,
        step_path=None,
    ):
        """`report` takes the lines; `record` the rows ({'step', 'save_commit_s'}) for metrics;
        `list_committed(root)`: the format's committed steps; `synchronous`: saves are written
        before save() returns; `step_path(step)`: where a step is (default its checkpoint_step_NNNNNN)."""
        self.root = root
        self.step_path = step_path or (lambda step: self.root / step_dir_name(step))
        self.list_committed, self.synchronous = list_committed, synchronous
        self.keep_latest, self.keep_every, self.protected = keep_latest, keep_every, frozenset(protected)
        self.best = frozenset()  # --keep_best's steps, as the saver last ranked them
        self.report = report or (lambda line: None)
        self.record = record or (lambda row: None)
        self._on_disk = set(list_committed(root))
        self._started = {}  # step -> perf_counter when its save began, until it is seen committed
        self.committed = []  # steps this run wrote and saw committed, in order
        self._reported_deleted = set()

    def _kept(self, steps) -> set:
        """What the checkpointer's rotation leaves of `steps` (the same rule, layout.kept_steps)."""
        return kept_steps(steps, self.keep_latest, self.keep_every, self.protected | self.best)

    def started(self, step: int, began: float, blocked_s: float) -> None:
        """A save of `step` began at perf_counter `began` and blocked the loop `blocked_s`."""
        self._started[step] = began
        how = 'written before the loop went on' if self.synchronous else 'writing in the background'
        blocked = f'loop blocked {blocked_s * 1e3:.1f} ms'
        self.report(f'save: step {step} -> {self.step_path(step)} ({blocked}; {how})')
        if self.synchronous:
            self.poll()

    def _pending(self) -> bool:
        return bool(self._started) or self._kept(self._on_disk) != self._on_disk

    def poll(self) -> None:
        """Reports what was committed or deleted since the last look (cheap when nothing is pending)."""
        if not self._pending():
            return
        now = set(self.list_committed(self.root))
        # Saves commit in order, and rotation follows a commit: a step of ours that is not
        # on disk while a later one is was committed and rotated away between two looks.
        newest = max(now, default=-1)
        rotated_unseen = {s for s in self._started if s not in now and s < newest}
        for step in sorted((now - self._on_disk) | rotated_unseen):
            if step in self._started:
                seconds = time.perf_counter() - self._started.pop(step)
                self.committed.append(step)
                line = f'save: step {step} committed ({seconds:.2f} s after the save began)'
                if len(self.committed) == 1:
                    line += self._size_note(step)
                self.report(line)
                self.record({'step': step, 'save_commit_s': seconds})
        for step in sorted((self._on_disk | set(self.committed)) - now - self._reported_deleted):
            self._reported_deleted.add(step)
            self.report(f'rotation: deleted {self.step_path(step).name} ({self._why_deleted(step, now)})')
        self._on_disk = now

    def _size_note(self, step: int) -> str:
        """What one checkpoint costs on disk and how many the keep rule holds, said once, at the
        first commit: a run that saves often can fill a disk long before it ends."""
        step_dir = self.step_path(step)
        size = sum(p.stat().st_size for p in step_dir.rglob('*') if p.is_file()) if step_dir.is_dir() else 0
        if not size:  # already rotated away
            return ''
        if self.keep_latest:
            kept = f'max_checkpoint_keep {self.keep_latest} keeps the newest {self.keep_latest}'
        else:
            kept = 'max_checkpoint_keep 0 keeps every one'
        return f'; a checkpoint takes {_size_text(size)} on disk ({kept})'

    def _why_deleted(self, step: int, now: set) -> str:
        if not self.keep_latest:
            return 'not by this run\'s keep rules: max_checkpoint_keep 0 keeps every step'
        newest = ', '.join(str(s) for s in sorted(now)[-self.keep_latest :])
        reason = f'max_checkpoint_keep {self.keep_latest} keeps the newest: {newest}'
        if self.keep_every > 0:
            reason += f'; {step} is not a multiple of keep_every_steps {self.keep_every}'
        if self.best:
            best = ', '.join(map(str, sorted(self.best)))
            reason += f"; not among keep_best's lowest validation losses (steps {best})"
        return reason


def _size_text(num_bytes: int) -> str:
    for unit, scale, digits in (('GiB', 2**30, 2), ('MiB', 2**20, 1)):
        if num_bytes >= scale:
            return f'{num_bytes / scale:.{digits}f} {unit}'
    return f'{num_bytes / 2**10:.0f} KiB'

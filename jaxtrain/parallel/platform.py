"""What a run settles before JAX starts a backend: which platform it uses, how XLA's kernels
behave there, and the processes it runs in.

`--device cpu|cuda` (InfiniTrain's flag, the config key `device`): `request` runs before JAX
starts a backend (before distributed init); `check` after, so that asking for cuda where JAX
finds no GPU is one clear error instead of a silent CPU run. 'auto' leaves JAX's own choice
(JAX_PLATFORMS, else a GPU when there is one).

XLA's switch for deterministic GPU kernels, DETERMINISTIC_FLAG, is set and read here too. XLA
reads XLA_FLAGS once, when the backend starts (the first jax.devices()), not at `import jax`:
`request_deterministic` must run before that. JAX is imported inside the functions that need
it, so the command-line entry points can import this module and set the flag first.

Joining a run of many processes (many hosts, or one process per GPU) with
`jax.distributed.initialize` (initialize_distributed), before anything touches the JAX
backend. Each value comes from the first of:
  1. the config keys coordinator_address, num_processes, process_id (`--coordinator_address
     host:port --num_processes 2 --process_id 0`);
  2. the environment: JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID;
  3. SLURM, when `srun` started more than one task: JAX's own detection takes the first
     node of the job step as coordinator (port from the job id), SLURM_PROCID as process
     id, and one GPU per task (SLURM_LOCALID picks it).
With none of these, or one process in all, the run is a single process and nothing is
initialized. After initialization every process sees the global device list; only
process 0 prints (run_log.py) and every process takes part in saves and restores.
"""

import dataclasses
import os
import sys

DETERMINISTIC_FLAG = '--xla_gpu_deterministic_ops'


def request(device: str) -> None:
    import jax

    if device == 'cpu' and jax.config.jax_platforms != 'cpu':
        jax.config.update('jax_platforms', 'cpu')


def check(device: str) -> None:
    import jax

    found = jax.default_backend()
    if device == 'cuda' and found != 'gpu':
        raise ValueError(
            f'device: expected a CUDA GPU for --device cuda, found JAX on {found} only; '
            'pass --device cpu (or install jax[cuda12] on a machine with a GPU)'
        )
    if device == 'cpu' and found != 'cpu':
        raise ValueError(f'device: expected the CPU backend for --device cpu, found {found}')


def request_deterministic(deterministic: bool):
    """Adds DETERMINISTIC_FLAG=true to XLA_FLAGS when asked; deterministic ops also pin GEMM
    choices. An inherited setting of the flag is left as it is."""
    if deterministic:
        current = os.environ.get('XLA_FLAGS', '')
        if DETERMINISTIC_FLAG not in current:
            os.environ['XLA_FLAGS'] = (current + f' {DETERMINISTIC_FLAG}=true').strip()


def pinned_to_cpu(device: str) -> bool:
    """Whether a run with config.device `device` can only run on the CPU (--device cpu, or
    JAX_PLATFORMS=cpu). DETERMINISTIC_FLAG changes no CPU kernel (XLA's CPU ops are
    deterministic already), but JAX's compilation cache keys on XLA_FLAGS: such a run leaves it
    out, so that a run that saves reuses the compiled programs of one that does not."""
    return device == 'cpu' or os.environ.get('JAX_PLATFORMS', '').strip().lower() == 'cpu'


def deterministic_in_effect() -> bool:
    """Whether this process's XLA runs deterministic kernels (what XLA_FLAGS says)."""
    return f'{DETERMINISTIC_FLAG}=true' in os.environ.get('XLA_FLAGS', '')


_SLURM_VARIABLES = ('SLURM_JOB_ID', 'SLURM_STEP_NODELIST', 'SLURM_NTASKS', 'SLURM_PROCID', 'SLURM_LOCALID')


@dataclasses.dataclass(frozen=True)
class ProcessGroup:
    """What to pass to jax.distributed.initialize; None lets JAX's SLURM detection fill it."""

    coordinator_address: str | None
    num_processes: int | None
    process_id: int | None
    source: str  # where the values came from, for the start-up log


def _integer(name: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f'{name}: expected an integer, found {text!r}') from None


def slurm_tasks(environ) -> int:
    """Tasks in this SLURM job step (0 when not started by srun)."""
    if not all(v in environ for v in _SLURM_VARIABLES):
        return 0
    return _integer('SLURM_NTASKS', environ['SLURM_NTASKS'])


def process_group(config, environ=os.environ) -> ProcessGroup | None:
    """The processes this run joins, or None for a single process."""
    address = config.coordinator_address or environ.get('JAX_COORDINATOR_ADDRESS') or None
    count = config.num_processes or (
        _integer('JAX_NUM_PROCESSES', environ['JAX_NUM_PROCESSES'])
        if environ.get('JAX_NUM_PROCESSES')
        else None
    )
    index = config.process_id if config.process_id >= 0 else None
    if index is None and environ.get('JAX_PROCESS_ID'):
        index = _integer('JAX_PROCESS_ID', environ['JAX_PROCESS_ID'])
    explicit = [v for v in (address, count, index) if v is not None]
    source = 'flags/environment'

    if slurm_tasks(environ) > 1:
        # Values given explicitly win; JAX's SLURM detection fills the rest.
        return ProcessGroup(address, count, index, 'SLURM' + (' + flags/environment' if explicit else ''))
    if count == 1:
        return None
    if not explicit:
        return None
    missing = [
        name
        for name, value in (
            ('coordinator_address', address),
            ('num_processes', count),
            ('process_id', index),
        )
        if value is None
    ]
    if missing:
        raise ValueError(
            f"{', '.join(missing)}: expected with the other distributed settings "
            f'(coordinator_address {address!r}, num_processes {count}, process_id {index}), found none; '
            'pass all three (flags or JAX_COORDINATOR_ADDRESS/JAX_NUM_PROCESSES/JAX_PROCESS_ID)'
        )
    if not 0 <= index < count:
        raise ValueError(f'process_id: expected 0..{count - 1} for num_processes {count}, found {index}')
    if ':' not in address:
        raise ValueError(f'coordinator_address: expected host:port, found {address!r}')
    return ProcessGroup(address, count, index, source)


def initialize_distributed(config, environ=os.environ) -> str:
    """Joins the process group if there is one; returns a line for the log ('' for one process).

    Must run before the first JAX computation or device query."""
    group = process_group(config, environ)
    if group is None:
        return ''
    import jax

    if not jax.distributed.is_initialized():
        jax.distributed.initialize(
            coordinator_address=group.coordinator_address,
            num_processes=group.num_processes,
            process_id=group.process_id,
        )
    return (
        f'distributed: process {jax.process_index()} of {jax.process_count()} ({group.source}), '
        f'{jax.local_device_count()} local of {jax.device_count()} devices'
    )


def silence_native_stdout() -> None:
    """Sends what C++ writes to stdout to /dev/null, Python's own output staying where it was.

    On CPU, XLA's Gloo collectives print `[Gloo] Rank R is connected to N peer ranks ...` for every
    communicator they open (a dozen lines in a two-process run, torn apart by the threads that write
    them), with std::cout and no switch; nothing else in the trainer writes there. --verbose keeps them."""
    sys.stdout.flush()
    python_stdout = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    sys.stdout = os.fdopen(python_stdout, 'w', buffering=1, encoding=sys.stdout.encoding)


def agree_on_step_end(stop_requested: bool, save_due_by_clock: bool) -> tuple[bool, bool]:
    """(stop, save by clock) as every process must see them after a step: a signal that
    reached any process stops them all, and process 0's clock decides a timed save, so
    all processes save (a collective) and stop at the same step."""
    import jax

    if jax.process_count() == 1:
        return stop_requested, save_due_by_clock
    import numpy as np
    from jax.experimental import multihost_utils

    votes = multihost_utils.process_allgather(np.array([stop_requested, save_due_by_clock], np.int32))
    votes = np.asarray(votes).reshape(jax.process_count(), 2)
    return bool(votes[:, 0].any()), bool(votes[0, 1])

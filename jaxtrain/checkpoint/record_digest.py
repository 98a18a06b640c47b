"""A digest of the trainer-state record, kept in the record itself as `record_sha256`.

The per-tensor checksums cover the arrays; this covers every other field (step, data
position, rng, the configs, the data's identity), so that an edited or damaged record is
refused by resume and reported by `ckpt verify` instead of restoring step 5 from step 4's
arrays. The digest is sha256 over the record's canonical JSON (sorted keys, no spaces)
without its own field, so it does not depend on how Orbax's JsonSave formats the file.
A record without the digest is refused too: every record jaxtrain writes has one, so a
missing one means the field was removed with the others edited. The record's step must also
be the one its directory is named after (a copied or renamed step directory is not that step).
InfiniTrain step directories keep the same digest in their "jaxtrain" object.
"""

import hashlib
import json
from pathlib import Path

from jaxtrain.checkpoint.layout import DAMAGED, TRAINER_STATE_FILE, CheckpointError, step_of

DIGEST_FIELD = 'record_sha256'


def record_digest(record: dict) -> str:
    body = {key: value for key, value in record.items() if key != DIGEST_FIELD}
    canonical = json.dumps(body, sort_keys=True, separators=(',', ':'), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def with_digest(record: dict) -> dict:
    """The record as saved: every field, then its digest (computed last, over all of them)."""
    return {**record, DIGEST_FIELD: record_digest(record)}


def digest_problem(record: dict, step_dir, record_file=None) -> str:
    """'' when the record's digest matches its fields; else one line (also for no digest)."""
    record_file = record_file or Path(step_dir) / TRAINER_STATE_FILE
    recorded = record.get(DIGEST_FIELD)
    if recorded is None:
        return (
            f'{record_file}: {DIGEST_FIELD}: expected the digest jaxtrain writes into every record, found '
            f'none: the field was removed, so the record may have been edited; {DAMAGED}'
        )
    found = record_digest(record)
    if recorded == found:
        return ''
    return (
        f'{record_file}: {DIGEST_FIELD}: expected the digest of the record\'s '
        f'fields, {recorded}, found {found}: the trainer state was edited or damaged after it was saved; '
        f'{DAMAGED}'
    )


def step_name_problem(step, step_dir, record_file=None) -> str:
    """'' when the record's step is the one the directory is named after (or it has no step name)."""
    named = step_of(Path(step_dir))
    is_int = isinstance(step, int) and not isinstance(step, bool)
    if named is None or not is_int or step == named:  # a step that is no integer: record_fields names it
        return ''
    record_file = record_file or Path(step_dir) / TRAINER_STATE_FILE
    return (
        f'{record_file}: step: expected {named}, the step its directory is named after, found {step!r}: '
        f'the directory was renamed or the record edited; {DAMAGED}'
    )


def check_digest(record: dict, step_dir, record_file=None) -> None:
    problem = digest_problem(record, step_dir, record_file) or step_name_problem(
        record.get('step'), step_dir, record_file
    )
    if problem:
        raise CheckpointError(problem)

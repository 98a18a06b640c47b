"""A digest of the trainer-state record, kept in the record itself as `record_sha256`.

The per-tensor checksums cover the arrays; this covers every other field (step, data
position, rng, the configs, the data's identity), so that an edited or damaged record is
refused by resume and reported by `ckpt verify` instead of restoring step 5 from step 4's
arrays. The digest is sha256 over the record's canonical JSON (sorted keys, no spaces)
without its own field, so it does not depend on how Orbax's JsonSave formats the file.
Records written before it existed have no digest and are accepted as they are.
"""

import hashlib
import json
from pathlib import Path

from jaxtrain.checkpoint.layout import DAMAGED, TRAINER_STATE_FILE, CheckpointError

DIGEST_FIELD = 'record_sha256'


def record_digest(record: dict) -> str:
    body = {key: value for key, value in record.items() if key != DIGEST_FIELD}
    canonical = json.dumps(body, sort_keys=True, separators=(',', ':'), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def with_digest(record: dict) -> dict:
    """The record as saved: every field, then its digest (computed last, over all of them)."""
    return {**record, DIGEST_FIELD: record_digest(record)}


def digest_problem(record: dict, step_dir) -> str:
    """'' when the record's digest matches its fields (or it has none); else one line."""
    recorded = record.get(DIGEST_FIELD)
    if recorded is None:
        return ''
    found = record_digest(record)
    if recorded == found:
        return ''
    return (
        f'{Path(step_dir) / TRAINER_STATE_FILE}: {DIGEST_FIELD}: expected the digest of the record\'s '
        f'fields, {recorded}, found {found}: the trainer state was edited or damaged after it was saved; '
        f'{DAMAGED}'
    )


def check_digest(record: dict, step_dir) -> None:
    problem = digest_problem(record, step_dir)
    if problem:
        raise CheckpointError(problem)

"""The types and ranges of a trainer-state record's fields, checked before anything uses them.

A record whose digest is right can still hold values no save writes (a copied record, a
digest recomputed after an edit, a bug): a step of 2**40 (the state keeps it as int32), a
string for an integer, a list where an object belongs, a LoRA rank of a billion. Resume used
them as they were and failed deep inside with Python's own words; `ckpt verify` passed them.
Both now ask this module, which names the file, the field, what was expected and what was found.
"""

import math

INT32 = 2**31  # step and data position live in the training state as int32
MAX_LORA_RANK = 2**16  # far above any useful rank, far below an allocation that cannot succeed


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def _found(record: dict, key: str) -> str:
    return 'none' if key not in record else repr(record[key])[:120]


def field_problems(record: dict, record_file, only_present: bool = False) -> list[str]:
    """One line per field that no jaxtrain save writes (each: the file, the field, expected,
    found). Fields a record may lack are only checked when present; with only_present, every
    field is (an InfiniTrain step's "jaxtrain" object holds fewer when exported from upstream's)."""
    problems = []

    def problem(key: str, expected: str, found=None):
        if only_present and key.split('.')[0] not in record:
            return
        problems.append(f'{record_file}: {key}: expected {expected}, found {found or _found(record, key)}')

    for key in ('step', 'data_position'):
        value = record.get(key)
        if not (_is_int(value) and 0 <= value < INT32):
            problem(key, 'an integer in [0, 2**31)')
    for key in ('epoch', 'tokens_per_step'):
        if key in record and not (_is_int(record[key]) and 0 <= record[key] < 2**62):
            problem(key, 'an integer >= 0')
    rng = record.get('rng')
    if not (isinstance(rng, list) and rng and all(_is_int(x) and 0 <= x < 2**32 for x in rng)):
        problem('rng', 'a list of uint32 key words')
    for key in ('model_config', 'training_config', 'topology', 'versions', 'checksums'):
        if key in record and not isinstance(record[key], dict):
            problem(key, 'an object')
    model_config = record.get('model_config')
    for name, value in (model_config if isinstance(model_config, dict) else {}).items():
        if _is_int(value) and not 0 <= value < INT32 or isinstance(value, float) and not math.isfinite(value):
            problem(f'model_config.{name}', 'a model dimension in [0, 2**31)', repr(value))
        elif not isinstance(value, (int, float, bool)):  # the model config dataclasses hold no other kind
            problem(f'model_config.{name}', 'a number or true/false', repr(value)[:120])
    checksums = record.get('checksums')
    if isinstance(checksums, dict):
        for item, sums in checksums.items():
            if not isinstance(sums, dict):
                problem(f'checksums.{item}', 'an object of per-tensor checksums', repr(sums)[:120])
    if 'data' in record and not isinstance(record['data'], (dict, type(None))):
        problem('data', 'an object (the training data\'s identity) or null')
    if 'has_optimizer_state' in record and not isinstance(record['has_optimizer_state'], bool):
        problem('has_optimizer_state', 'true or false')
    for key in ('model_family', 'llmc_file', 'llmc_sha256', 'dtype'):
        if key in record and not isinstance(record[key], str):
            problem(key, 'text')
    for key in ('loss', 'best_loss', 'val_loss', 'learning_rate'):
        if record.get(key) is not None and not (_is_int(record[key]) or isinstance(record[key], float)):
            problem(key, 'a number')
    problems += _lora_problems(record, record_file)
    return problems


def _lora_problems(record: dict, record_file) -> list[str]:
    lora = record.get('lora')
    if lora is None:
        return []
    if not isinstance(lora, dict):
        found = repr(lora)[:120]
        return [f"{record_file}: lora: expected an object (the adapters' settings) or null, found {found}"]
    problems = []
    rank = lora.get('rank')
    if not (_is_int(rank) and 1 <= rank <= MAX_LORA_RANK):
        expected = f'an integer in [1, {MAX_LORA_RANK}]'
        problems.append(f'{record_file}: lora.rank: expected {expected}, found {repr(rank)[:60]}')
    if not _is_number(lora.get('alpha')):
        found = repr(lora.get('alpha'))[:60]
        problems.append(f'{record_file}: lora.alpha: expected a finite number, found {found}')
    for key in ('targets', 'modules'):
        value = lora.get(key)
        if key in lora and not (isinstance(value, list) and all(isinstance(x, str) for x in value)):
            problems.append(f'{record_file}: lora.{key}: expected a list of names, found {repr(value)[:60]}')
    return problems

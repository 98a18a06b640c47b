"""--help / --helpfull show every config key's default, and the shipped configs' value
where they set another."""

import re

import pytest

from cli_runs import run_cli
from jaxtrain.config.keys import KEYS
from trainer_runs import load_config


def _flag_help(out: str) -> dict[str, str]:
    """{flag: its help text with the line wrapping undone}."""
    entries = re.split(r'\n\s+--(?=[a-z_0-9]+:)', out)
    return {e.split(':', 1)[0]: ' '.join(e.split(':', 1)[1].split()) for e in entries[1:] if ':' in e}


def _shown(value):
    return (
        ('true' if value else 'false')
        if isinstance(value, bool)
        else repr(value)
        if isinstance(value, str)
        else str(value)
    )


@pytest.mark.parametrize('help_flag', ['--help', '--helpfull'])
def test_help_shows_each_keys_default(help_flag):
    result = run_cli(help_flag)
    texts = _flag_help(result.out)
    configs = {family: load_config(family, '').to_dict() for family in ('gpt2', 'llama3')}
    for key, default, _ in KEYS:
        if key == 'model_family':
            continue
        assert key in texts, key
        assert f'(default: {_shown(default)}' in texts[key], (key, texts[key])
        for family, config in configs.items():
            if key not in ('num_devices',) and config[key] != default:
                assert f'configs/{family}.py: {_shown(config[key])}' in texts[key], (key, texts[key])
    assert 'configs/llama3.py: 0.01' in texts['learning_rate']  # tiny's, the plain config's model
    assert "configs/gpt2.py: 'small'" in texts['model']


def test_checkpoint_formats_help_names_every_format_it_accepts():
    from jaxtrain.checkpoint.registry import FORMAT_NAMES

    (text,) = [text for key, _, text in KEYS if key == 'checkpoint_format']
    named = set(re.findall(r'(?:^|\| )([a-z-]+) ', text))
    assert named == set(FORMAT_NAMES)


def test_help_lists_every_flag_once_by_topic_and_helpfull_alphabetically():
    from jaxtrain.config.infinitrain_flags import alias_names

    result = run_cli('--help')
    assert result.code == 0
    sections, heading = {}, None
    for line in result.out.splitlines():
        if line.endswith(':') and not line.startswith(' '):
            heading = line[:-1]
        match = re.match(r'^  --(?:\[no\])?([a-z_0-9]+):', line)
        if match:
            sections.setdefault(heading, []).append(match.group(1))
    listed = [name for names in sections.values() for name in names]
    expected = (
        {key for key, _, _ in KEYS if key != 'model_family'} | set(alias_names()) | {'config', 'verbose'}
    )
    assert sorted(listed) == sorted(expected)  # each flag once, none left out
    assert list(sections)[:4] == ['config file', 'model', 'LoRA', 'data']
    assert (
        'learning_rate' in sections['optimizer and schedule']
        and 'mesh_fsdp' in sections['parallelism and devices']
    )
    assert {'save', 'load', 'tensor_parallel'} <= set(
        sections[next(h for h in sections if "InfiniTrain's names" in h)]
    )
    schedule = next(h for h in sections if "InfiniTrain's schedule" in h)
    assert sections[schedule] == [
        'lr_decay_style',
        'lr_warmup_iters',
        'lr_warmup_init',
        'min_lr',
        'lr_decay_iters',
    ]

    full = run_cli('--helpfull')  # absl's list: by defining module, each alphabetical
    section = full.out.split('\njaxtrain.config.flags:\n')[1].split('\n\n')[0]
    names = re.findall(r'^  --(?:\[no\])?([a-z_0-9]+):', section, re.M)
    assert full.code == 0 and '--verbosity' in full.out
    assert names == sorted(names) and set(names) == {key for key, _, _ in KEYS if key != 'model_family'}

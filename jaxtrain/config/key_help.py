"""The --help line of a config key: its meaning, its default, and the shipped configs'
own value where they set another (configs/gpt2.py makes the model `small`, LLaMA-3's its
learning rate 1e-2 ...), so `--help` / `--helpfull` show what a run would use.

The flags themselves default to None (flags.py: "not given" must stay distinguishable
from "given the default"), which is why absl would show no default of its own.
"""

import importlib.util
from functools import lru_cache
from jaxtrain.config.config_path import shipped_config

SHIPPED = ('gpt2', 'llama3')


def _shown(value) -> str:
    if isinstance(value, bool):
        return 'true' if value else 'false'
    return repr(value) if isinstance(value, str) else str(value)


@lru_cache(maxsize=1)
def shipped_configs() -> dict:
    """{family: its config dict} of configs/*.py (empty where configs/ is not installed)."""
    configs = {}
    for family in SHIPPED:
        path = shipped_config(f'{family}.py')
        if path is None:
            continue
        spec = importlib.util.spec_from_file_location(f'_jaxtrain_help_config_{family}', path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        configs[family] = module.get_config('').to_dict()
    return configs


def help_with_default(key: str, text: str, default) -> str:
    """'TEXT (default: D; configs/llama3.py: V)'."""
    overrides = [
        f'configs/{family}.py: {_shown(config[key])}'
        for family, config in shipped_configs().items()
        if key in config and config[key] != default and key != 'model_family'
    ]
    return f"{text} (default: {'; '.join([_shown(default), *overrides])})"

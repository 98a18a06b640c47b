"""Plain flags for every config key, so InfiniTrain's commands run with only the program
name changed: `--input_bin X`, `--num_iteration 100`, `--save_optimizer_state true`.

They apply after `--config.KEY=VALUE` overrides. Booleans take a value (gflags style:
`--flag true|false|1|0`), because a bare absl boolean would read `--flag false` as true.
"""

from absl import flags

from jaxtrain.config_base import KEYS

_TRUE, _FALSE = ('true', '1', 'yes', 'on'), ('false', '0', 'no', 'off')


def parse_bool(name: str, text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f'--{name}: expected true or false, found {text!r}')


def define_key_flags():
    """One flag per config key (absl's own --log_dir etc. keep their meaning)."""
    defined = []
    for key, default, text in KEYS:
        if key in flags.FLAGS or key == 'model_family':
            continue
        if isinstance(default, bool):
            flags.DEFINE_string(key, None, f'{text} [true|false]')
        elif isinstance(default, int):
            flags.DEFINE_integer(key, None, text)
        elif isinstance(default, float):
            flags.DEFINE_float(key, None, text)
        else:
            flags.DEFINE_string(key, None, text)
        defined.append(key)
    return defined


def apply_key_flags(config, keys, warn) -> None:
    """Copies every flag the user set onto `config` (a ConfigDict)."""
    for key in keys:
        flag = flags.FLAGS[key]
        if not flag.present:
            continue
        value = flag.value
        if isinstance(config[key], bool):
            value = parse_bool(key, value)
        elif isinstance(config[key], float):
            value = float(value)
        config[key] = value

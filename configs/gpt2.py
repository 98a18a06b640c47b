"""GPT-2 (llm.c's model) — the default job.

  python -m jaxtrain.main --config=configs/gpt2.py
trains the `small` GPT-2 (4 layers, 256 channels) offline on a corpus built from the
Python standard library's own source, tokenised byte-level into GPT-2 ids. The loss
starts near ln(50257) ≈ 10.8, and the 10 default steps at InfiniTrain's learning rate
1e-4 bring it to about 9.5. For a run that visibly learns add
`--num_iteration 300 --learning_rate 1e-3 --batch_size 8 --total_batch_size 512`
(loss about 3 by step 150).

Variants: configs/gpt2.py:tiny|small|d12|gpt2|d24|d36|d48|gpt2-medium|gpt2-large|gpt2-xl,
and `infinitrain`: every default of InfiniTrain's gpt2 example (SGD at a constant 1e-4,
one device, keep 3 checkpoints; docs/infinitrain.md's "InfiniTrain's command line" lists the keys whose
default differs from ours), so that an InfiniTrain command line gives InfiniTrain's run:
  python -m jaxtrain.main --config=configs/gpt2.py:infinitrain --input_bin TRAIN.bin \
      --llmc_filepath gpt2_124M.bin --device cuda --num_iteration 100
"""

from jaxtrain.config.keys import base_config


def get_config(variant: str = ''):
    config = base_config('gpt2')
    config.model = variant or 'small'  # GPT-2 variant; an --llmc_filepath header overrides it
    config.learning_rate = 1e-4  # InfiniTrain's GPT-2 example
    if variant == 'infinitrain':
        # example/gpt2/main.cc at InfiniTensor/InfiniTrain b24d92f: its defaults, key by key.
        config.model = 'gpt2'  # --model gpt2 (= d12); --llmc_filepath overrides it
        config.optimizer = 'sgd'  # optimizers::SGD, no momentum or weight decay
        config.lr_schedule = 'constant'  # a fixed --learning_rate
        config.num_devices = 1  # --nthread_per_process 1
        config.max_checkpoint_keep = 3  # --max_checkpoint_keep 3
    return config
